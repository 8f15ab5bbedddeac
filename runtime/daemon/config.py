"""``weald.toml``: the configuration, structured with cattrs into frozen attrs classes.

Where it comes from, lowest precedence first::

    ~/.weald/weald.toml           the user's defaults
    <project>/weald.toml          the project's, merged over them key by key

``$WEALD_CONFIG`` names one file to read instead of both. Tables merge
recursively; any other value (a string, a number, an array) in the project
file replaces the home one. Every key has a default, so no file at all is a
valid configuration::

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
    config_from_dict,
    find_config_files,
    load_config,
    parse_config,
)
from weald.runtime.daemon._config_model import (
    DEFAULT_MODEL,
    AgentConfig,
    AliasLimits,
    Config,
    ConfigError,
    ConfigProblem,
    ContextConfig,
    DaemonConfig,
    FaultsConfig,
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
    StoreConfig,
    ToolsConfig,
)

__all__ = [
    "CONFIG_ENV",
    "CONFIG_FILE_NAME",
    "DEFAULT_MODEL",
    "AgentConfig",
    "AliasLimits",
    "Config",
    "ConfigError",
    "ConfigProblem",
    "ContextConfig",
    "DaemonConfig",
    "FaultsConfig",
    "LimitsConfig",
    "MCPAuthConfig",
    "MCPConfig",
    "MCPServerConfig",
    "ModelChoice",
    "ModelsConfig",
    "Permission",
    "PermissionRule",
    "ProviderConfig",
    "SpillConfig",
    "StoreConfig",
    "ToolsConfig",
    "config_from_dict",
    "config_to_dict",
    "find_config_files",
    "load_config",
    "parse_config",
]
