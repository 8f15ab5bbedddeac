"""``weald.toml``: the configuration, structured with cattrs into frozen attrs classes.

Where it comes from, lowest precedence first::

    ~/.weald/weald.toml           the user's defaults ($WEALD_HOME/weald.toml, or $WEALD_CONFIG)
    <project>/weald.toml          the project's, merged over them key by key

The project is the nearest directory at or above the one weald runs for
that holds ``weald.toml`` or ``.weald/`` (`find_project_root`). Tables merge
recursively; any other value (a string, a number, an array) in the project
file replaces the user one. Every key has a default, so no file at all is a
valid configuration. A daemon runs each session under its own project's
files (``weald.runtime.daemon._projects``)::

    config = load_config(Path.cwd())
    config.agent.max_steps                   # 50 unless configured
    choice = config.resolve_model()          # None: use the bundled demo script
    settings = config.providers["openai"].to_settings()

Mistakes are reported all at once, each with its file and key path, as one
`ConfigError`::

    invalid configuration (2 problems):
      /work/proj/weald.toml: tools.shell.timeout: expected a number, got "abc"
      /work/proj/weald.toml: providers.openai.api_key: API keys do not belong in weald.toml: ...

API keys never go in the file: ``[providers.NAME] api_key_env`` names the
environment variable that holds one. Every key, its default and an example
file are in ``docs/configuration.md``.
"""

from __future__ import annotations

from weald.runtime.daemon._config_convert import unstructure_config as config_to_dict
from weald.runtime.daemon._config_load import (
    CONFIG_ENV,
    CONFIG_FILE_NAME,
    HOME_ENV,
    PROJECT_DIR_NAME,
    ProjectFiles,
    config_from_dict,
    find_config_files,
    find_project_files,
    find_project_root,
    load_config,
    parse_config,
    weald_home,
)
from weald.runtime.daemon._config_model import (
    DAEMON_WIDE,
    DEFAULT_MODEL,
    AcpConfig,
    AgentConfig,
    AliasLimits,
    ClusterConfig,
    Config,
    ConfigError,
    ConfigFile,
    ConfigProblem,
    ContextConfig,
    DaemonConfig,
    FaultsConfig,
    HistoryConfig,
    LimitsConfig,
    MCPAuthConfig,
    MCPConfig,
    MCPServerConfig,
    ModelChoice,
    ModelsConfig,
    Permission,
    PermissionRule,
    ProviderConfig,
    SpillConfig,
    StateConfig,
    StoreConfig,
    TelemetryConfig,
    ToolsConfig,
)

__all__ = [
    "CONFIG_ENV",
    "CONFIG_FILE_NAME",
    "DAEMON_WIDE",
    "DEFAULT_MODEL",
    "HOME_ENV",
    "PROJECT_DIR_NAME",
    "AcpConfig",
    "AgentConfig",
    "AliasLimits",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "ConfigFile",
    "ConfigProblem",
    "ContextConfig",
    "DaemonConfig",
    "FaultsConfig",
    "HistoryConfig",
    "LimitsConfig",
    "MCPAuthConfig",
    "MCPConfig",
    "MCPServerConfig",
    "ModelChoice",
    "ModelsConfig",
    "Permission",
    "PermissionRule",
    "ProjectFiles",
    "ProviderConfig",
    "SpillConfig",
    "StateConfig",
    "StoreConfig",
    "TelemetryConfig",
    "ToolsConfig",
    "config_from_dict",
    "config_to_dict",
    "find_config_files",
    "find_project_files",
    "find_project_root",
    "load_config",
    "parse_config",
    "weald_home",
]
