"""weald.toml: defaults, every section, merging, and errors reported with their paths."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import attrs
import pytest
from weald.runtime import WealdError, register_secret
from weald.runtime.daemon import config as config_module
from weald.runtime.daemon.config import (
    DEFAULT_MODEL,
    Config,
    ConfigError,
    ConfigProblem,
    MCPServerConfig,
    ModelChoice,
    ProviderConfig,
    SpillConfig,
    config_from_dict,
    config_to_dict,
    find_config_files,
    load_config,
    parse_config,
)
from weald.runtime.llm import ProviderSettings
from weald.runtime.mcp import ServerConfig
from weald.tools import SpillLimits

HOME = Path("/home/user")
ENV: dict[str, str] = {}


def parse(text: str, **kwargs) -> Config:
    kwargs.setdefault("home", HOME)
    kwargs.setdefault("environ", ENV)
    return parse_config(textwrap.dedent(text), **kwargs)


def problems(text: str, **kwargs) -> list[str]:
    """The problems in ``text``, each as ``path: message``."""
    with pytest.raises(ConfigError) as info:
        parse(text, **kwargs)
    return [problem.key_message for problem in info.value.problems]


def only_problem(text: str) -> ConfigProblem:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    (problem,) = info.value.problems
    return problem


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# --- Defaults --------------------------------------------------------------------------------------


def test_an_empty_file_gives_every_default() -> None:
    config = parse("")
    assert config.models.default is DEFAULT_MODEL is None
    assert config.models.aliases == {}
    assert config.providers == {}
    assert config.tools.max_output_lines == 2000
    assert config.tools.max_output_bytes == 50 * 1024
    assert config.tools.enabled == ("*",)
    assert config.tools.permission_timeout == 300.0
    assert (config.tools.permissions, config.tools.timeouts, config.tools.options) == ({}, {}, {})
    assert config.mcp.servers == {}
    assert attrs.asdict(config.agent) == {
        "max_steps": 50,
        "sub_agent_depth": 2,
        "sub_agent_timeout": 600.0,
        "system_prompt": None,
        "debug_state": False,
    }
    assert attrs.asdict(config.limits) == {
        "max_agents": 20_000,
        "max_message_bytes": 16 * 1024 * 1024,
        "max_concurrent_turns": None,
        "max_connections": None,
        "max_buffered_bytes": 64 * 1024 * 1024,
        "hibernate_after": 600.0,
    }
    assert config.store.path == HOME / ".weald" / "store.db"
    assert config.store.durability == "process"
    assert config.server.socket == HOME / ".weald" / "weald.sock"
    assert (config.faults.enabled, config.faults.file) == (False, None)


def test_the_socket_defaults_to_the_xdg_runtime_dir_when_it_is_set() -> None:
    assert parse("", environ={"XDG_RUNTIME_DIR": "/run/user/1000"}).server.socket == Path("/run/user/1000/weald.sock")
    configured = parse('[server]\nsocket = "/tmp/w.sock"', environ={"XDG_RUNTIME_DIR": "/run/user/1000"})
    assert configured.server.socket == Path("/tmp/w.sock")


def test_no_config_files_at_all_is_the_default_config(tmp_path: Path) -> None:
    config = load_config(tmp_path / "project", home=tmp_path / "home", environ={})
    assert config == parse("", home=tmp_path / "home")


def test_provider_and_mcp_defaults_mirror_the_classes_they_build() -> None:
    assert ProviderConfig().to_settings() == ProviderSettings()
    built = MCPServerConfig(command="srv").to_server_config("s")
    assert built == ServerConfig(name="s", command="srv")


# --- Every section ---------------------------------------------------------------------------------

FULL = """
[models]
default = "fast"

[models.aliases]
fast = "ollama:qwen3"
smart = "anthropic:claude-sonnet-4-5"

[providers.anthropic]
max_retries = 2

[providers.ollama]
base_url = "http://127.0.0.1:11434/v1"
api_key_required = false
extra_headers = { "X-Team" = "core" }
timeout = 30
stall_timeout = 90.5

[providers.proxy]
kind = "anthropic"
base_url = "https://proxy.example/anthropic"
api_key_env = "PROXY_KEY"

[tools]
max_output_lines = 500
max_output_bytes = 10_000
enabled = ["*", "!fetch"]
permission_timeout = 60

[tools.permissions]
write_file = "ask"
fetch = "deny"

[tools.permissions.shell]
"git status*" = "allow"
"rm -rf *" = "deny"
"*" = "ask"

[tools.timeouts]
shell = 120

[tools.grep]
timeout = 20

[tools.shell]
env_keep = ["GOPATH"]
kill_grace = 2

[tools.files]
max_read_bytes = 1_000_000

[mcp.servers.time]
command = "python"
args = ["-m", "mcp_server_time"]
env = { TZ = "UTC" }
call_timeout = 5
ping_timeout = 2
ping_interval = 7

[mcp.servers.remote]
url = "https://mcp.example/mcp"
headers = { "X-Client" = "weald" }
enabled = false
connect_timeout = 3

[agent]
max_steps = 10
sub_agent_depth = 0
sub_agent_timeout = 30
system_prompt = "Be brief."
debug_state = true

[limits]
max_agents = 100
max_message_bytes = 1_048_576
max_concurrent_turns = 8
max_connections = 50
max_buffered_bytes = 33_554_432
hibernate_after = 30

[store]
path = "/var/lib/weald/store.db"
durability = "power"

[server]
socket = "/run/weald.sock"
http = "127.0.0.1:8765"

[faults]
enabled = true
file = "/etc/weald/faults.toml"
"""


def test_every_section_is_structured_into_its_class() -> None:
    config = parse(FULL)
    assert config.models.default == "fast"
    assert config.models.aliases == {"fast": "ollama:qwen3", "smart": "anthropic:claude-sonnet-4-5"}

    assert config.providers["anthropic"].kind == "anthropic"
    assert config.providers["anthropic"].max_retries == 2
    ollama = config.providers["ollama"]
    assert (ollama.kind, ollama.base_url, ollama.api_key_required) == ("openai", "http://127.0.0.1:11434/v1", False)
    assert ollama.extra_headers == {"X-Team": "core"}
    assert (ollama.timeout, ollama.stall_timeout) == (30.0, 90.5)
    assert isinstance(ollama.timeout, float)
    assert config.providers["proxy"].kind == "anthropic"

    tools = config.tools
    assert (tools.max_output_lines, tools.max_output_bytes) == (500, 10_000)
    assert tools.enabled == ("*", "!fetch")
    assert tools.permission_timeout == 60.0
    assert tools.permissions == {
        "write_file": "ask",
        "fetch": "deny",
        "shell": {"git status*": "allow", "rm -rf *": "deny", "*": "ask"},
    }
    assert tools.timeouts == {"shell": 120.0, "grep": 20.0}
    assert tools.options == {
        "grep": {},
        "shell": {"env_keep": ["GOPATH"], "kill_grace": 2},
        "files": {"max_read_bytes": 1_000_000},
    }

    time = config.mcp.servers["time"]
    assert (time.command, time.args, time.env, time.call_timeout, time.ping_timeout, time.ping_interval) == (
        "python",
        ("-m", "mcp_server_time"),
        {"TZ": "UTC"},
        5.0,
        2.0,
        7.0,
    )
    remote = config.mcp.servers["remote"]
    assert (remote.url, remote.headers, remote.enabled, remote.connect_timeout) == (
        "https://mcp.example/mcp",
        {"X-Client": "weald"},
        False,
        3.0,
    )

    assert attrs.astuple(config.agent) == (10, 0, 30.0, "Be brief.", True)
    assert attrs.astuple(config.limits) == (100, 1_048_576, 8, 50, 33_554_432, 30.0)
    assert (config.store.path, config.store.durability) == (Path("/var/lib/weald/store.db"), "power")
    assert config.server.socket == Path("/run/weald.sock")
    assert (config.server.http, config.server.http_remote) == ("127.0.0.1:8765", False)
    assert (config.faults.enabled, config.faults.file) == (True, Path("/etc/weald/faults.toml"))


def test_providers_become_provider_settings() -> None:
    settings = parse(FULL).providers["ollama"].to_settings()
    assert settings == ProviderSettings(
        base_url="http://127.0.0.1:11434/v1",
        api_key_required=False,
        extra_headers={"X-Team": "core"},
        timeout=30.0,
        stall_timeout=90.5,
    )


def test_a_provider_kind_defaults_to_its_name_or_else_openai() -> None:
    config = parse("[providers.openai]\n[providers.anthropic]\n[providers.vllm]\n")
    assert {name: p.kind for name, p in config.providers.items()} == {
        "openai": "openai",
        "anthropic": "anthropic",
        "vllm": "openai",
    }


def test_model_names_resolve_through_aliases_and_configured_providers() -> None:
    config = parse(FULL)
    fast = config.resolve_model()
    assert fast == ModelChoice(spec="openai:qwen3", settings=config.providers["ollama"].to_settings())
    smart = config.resolve_model("smart")
    assert smart is not None
    assert smart.spec == "anthropic:claude-sonnet-4-5"
    assert smart.settings == ProviderSettings(max_retries=2)
    assert config.resolve_model("proxy:claude-x") == ModelChoice(
        spec="anthropic:claude-x", settings=config.providers["proxy"].to_settings()
    )
    assert config.resolve_model("openai:gpt-4.1") == ModelChoice(spec="openai:gpt-4.1")
    assert parse("").resolve_model() is None  # the bundled demo script


def test_an_alias_table_states_its_models_window_and_strings_still_work() -> None:
    config = parse(
        """
        [models]
        default = "local"
        [models.aliases]
        fast = "openai:gpt-4.1-mini"
        [models.aliases.local]
        model = "llama:smol"
        context_window = 2048
        output_reserve = 256
        [models.aliases.big]
        model = "openai:gpt-4.1"
        [providers.llama]
        base_url = "http://127.0.0.1:8080/v1"
        api_key_required = false
        context_window = 4096
        """
    )
    assert config.models.aliases == {"fast": "openai:gpt-4.1-mini", "local": "llama:smol", "big": "openai:gpt-4.1"}
    local = config.resolve_model()
    assert local is not None
    assert local.spec == "openai:smol"
    assert local.settings is not None
    assert (local.settings.context_window, local.settings.output_reserve) == (2048, 256)
    assert local.settings.base_url == "http://127.0.0.1:8080/v1"
    assert config.resolve_model("llama:other").settings.context_window == 4096  # the provider's own
    assert config.resolve_model("big") == ModelChoice(spec="openai:gpt-4.1")
    assert config.resolve_model("fast") == ModelChoice(spec="openai:gpt-4.1-mini")
    # `weald config show` writes an alias with a window back as a table.
    shown = config_to_dict(config)["models"]["aliases"]
    assert shown["local"] == {"model": "llama:smol", "context_window": 2048, "output_reserve": 256}
    assert shown["fast"] == "openai:gpt-4.1-mini"
    assert config_from_dict(config_to_dict(config)) == config


def test_alias_tables_and_the_context_section_report_bad_values_with_their_paths() -> None:
    assert problems(
        """
        [models.aliases.a]
        context_window = 100
        [models.aliases.b]
        model = "openai:x"
        context_window = 0
        colour = "red"
        [models.aliases]
        c = 5
        [context]
        keep_recent = 1.5
        keep_tool_results = -1
        """
    ) == [
        'models.aliases.a.model: missing: the alias\'s "provider:model" spec',
        "models.aliases.b.context_window: expected a positive integer, got 0",
        "models.aliases.b.colour: unknown key; expected one of: context_window, output_reserve",
        'models.aliases.c: expected a "provider:model" string, or a table with model (and context_window, '
        "output_reserve), got 5",
        "context.keep_tool_results: expected an integer, zero or more, got -1",
        "context.keep_recent: expected a number between 0 and 1, got 1.5",
    ]


def test_the_context_section_becomes_the_agents_context_config() -> None:
    config = parse('[context]\nauto = false\nkeep_tool_results = 5\nkeep_recent = 0.5\nsummary_prompt = "Be brief."\n')
    context = config.context.to_context_config()
    assert (context.auto, context.keep_tool_results, context.keep_recent, context.summary_prompt) == (
        False,
        5,
        0.5,
        "Be brief.",
    )
    assert parse("").context.to_context_config().auto


def test_tools_config_becomes_the_tool_config_tools_read() -> None:
    tool_config = parse(FULL).tools.to_tool_config()
    assert (tool_config.max_output_lines, tool_config.max_output_bytes) == (500, 10_000)
    assert tool_config.option("shell", "env_keep") == ["GOPATH"]
    assert tool_config.option("files", "max_read_bytes") == 1_000_000


def test_mcp_servers_become_server_configs() -> None:
    server = parse(FULL).mcp.servers["time"].to_server_config("time")
    assert server == ServerConfig(
        name="time",
        command="python",
        args=["-m", "mcp_server_time"],
        env={"TZ": "UTC"},
        call_timeout=5,
        ping_timeout=2,
        ping_interval=7,
    )
    assert server.transport == "stdio"


def test_to_dict_reads_back_to_an_equal_config_and_hides_secret_header_values() -> None:
    config = parse(FULL + '\n[providers.openrouter]\nextra_headers = { Authorization = "Bearer sk-or-123456789" }\n')
    data = config_to_dict(config)
    assert "system_prompt" in data["agent"]  # type: ignore[operator]
    assert "api_key_env" not in data["providers"]["ollama"]  # type: ignore[index]  # None is left out
    assert data["tools"]["shell"] == {"env_keep": ["GOPATH"], "kill_grace": 2}  # type: ignore[index]
    assert data["providers"]["openrouter"]["extra_headers"] == {"Authorization": "[redacted]"}  # type: ignore[index]
    assert "sk-or-123456789" not in repr(data)
    plain = parse(FULL)
    assert config_from_dict(config_to_dict(plain)) == plain


# --- Files: where they are and how they merge ------------------------------------------------------


def test_project_values_override_home_values_key_by_key(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    write(
        home / ".weald" / "weald.toml",
        """
        [agent]
        max_steps = 10
        debug_state = true
        [providers.openai]
        base_url = "https://home.example/v1"
        timeout = 5
        [tools]
        enabled = ["*", "!fetch"]
        [tools.timeouts]
        shell = 100
        grep = 7
        """,
    )
    write(
        project / "weald.toml",
        """
        [agent]
        max_steps = 20
        [providers.openai]
        timeout = 9
        [tools]
        enabled = ["read_file"]
        [tools.shell]
        timeout = 30
        """,
    )
    config = load_config(project, home=home, environ={})
    assert (config.agent.max_steps, config.agent.debug_state) == (20, True)
    assert (config.providers["openai"].base_url, config.providers["openai"].timeout) == ("https://home.example/v1", 9.0)
    assert config.tools.enabled == ("read_file",)  # arrays are replaced, not joined
    assert config.tools.timeouts == {"shell": 30.0, "grep": 7.0}
    assert find_config_files(project, home=home, environ={}) == (home / ".weald" / "weald.toml", project / "weald.toml")


def test_weald_config_names_the_file_read_instead_of_the_user_file_and_the_project_still_counts(
    tmp_path: Path,
) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    write(home / ".weald" / "weald.toml", "[agent]\nmax_steps = 10\n")
    write(project / "weald.toml", "[agent]\nsub_agent_depth = 5\n")
    explicit = write(tmp_path / "ci" / "weald.toml", '[agent]\nmax_steps = 1\n[store]\npath = "state/store.db"\n')
    environ = {"WEALD_CONFIG": str(explicit)}
    config = load_config(project, home=home, environ=environ)
    # The home file is not read; the project's rules still apply over the named file.
    assert (config.agent.max_steps, config.agent.sub_agent_depth) == (1, 5)
    assert config.store.path == tmp_path / "ci" / "state" / "store.db"
    assert find_config_files(project, home=home, environ=environ) == (explicit, project / "weald.toml")


def test_a_missing_weald_config_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(home=tmp_path, environ={"WEALD_CONFIG": str(missing)})
    assert str(info.value.problems[0]) == f"{missing}: WEALD_CONFIG names this file, which does not exist"


def test_relative_paths_are_relative_to_the_file_that_sets_them(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    write(
        home / ".weald" / "weald.toml",
        '[faults]\nfile = "faults.toml"\n[mcp.servers.s]\ncommand = "srv"\ncwd = "srv-dir"\n',
    )
    write(project / "weald.toml", '[store]\npath = "data/store.db"\n[server]\nsocket = "~/sockets/w.sock"\n')
    config = load_config(project, home=home, environ={})
    assert config.store.path == project / "data" / "store.db"
    assert config.server.socket == home / "sockets" / "w.sock"
    assert config.faults.file == home / ".weald" / "faults.toml"
    assert config.mcp.servers["s"].cwd == home / ".weald" / "srv-dir"


def test_a_string_without_a_base_dir_keeps_relative_paths_relative() -> None:
    assert parse('[store]\npath = "store.db"').store.path == Path("store.db")
    assert parse('[store]\npath = "store.db"', base_dir=Path("/p")).store.path == Path("/p/store.db")


# --- Errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"8765"', '"HOST:PORT", like "127.0.0.1:8765" (port 0 picks a free one), got "8765"'),
        ('"127.0.0.1:99999"', '"HOST:PORT", like "127.0.0.1:8765" (port 0 picks a free one), got "127.0.0.1:99999"'),
        (
            '"observer.example:80"',
            '"HOST:PORT" with an IP address or localhost, like "127.0.0.1:8765", got "observer.example:80"',
        ),
        ("8765", '"HOST:PORT", like "127.0.0.1:8765", got 8765'),
    ],
)
def test_a_bad_observer_address_is_reported_with_its_path(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(f"[server]\nhttp = {value}\n")
    assert str(caught.value).splitlines()[1:] == [f"  <string>: server.http: expected {expected}"]


def test_observer_addresses_on_loopback_and_ipv6_are_taken_as_written() -> None:
    assert parse('[server]\nhttp = "[::1]:0"').server.http == "[::1]:0"
    assert parse('[server]\nhttp = "localhost:8765"').server.http == "localhost:8765"


def test_a_wrong_type_names_its_path_and_what_was_expected() -> None:
    assert problems('[tools.shell]\ntimeout = "abc"\n') == ['tools.shell.timeout: expected a number, got "abc"']
    assert problems("[agent]\nmax_steps = true\nsub_agent_timeout = -1\ndebug_state = 1\n") == [
        "agent.max_steps: expected an integer, got true",
        "agent.sub_agent_timeout: expected a positive number of seconds, got -1",
        "agent.debug_state: expected true or false, got 1",
    ]
    assert problems('[limits]\nmax_agents = "100"\nmax_message_bytes = 1.5\n') == [
        'limits.max_agents: expected an integer, got "100"',
        "limits.max_message_bytes: expected an integer, got 1.5",
    ]
    assert problems('[limits]\nmax_connections = 0\nmax_buffered_bytes = "64 MB"\n') == [
        "limits.max_connections: expected a positive integer, got 0",
        'limits.max_buffered_bytes: expected an integer, got "64 MB"',
    ]
    assert problems("agent = 5\n") == ["agent: expected a table, got 5"]


def test_the_error_line_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = write(tmp_path / "weald.toml", '[tools.shell]\ntimeout = "abc"\n')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, home=tmp_path / "home", environ={})
    assert (
        str(info.value)
        == f'invalid configuration (1 problem):\n  {path}: tools.shell.timeout: expected a number, got "abc"'
    )
    assert isinstance(info.value, WealdError)


def test_unknown_keys_are_reported_with_their_paths_at_every_level() -> None:
    assert problems(
        """
        colour = "blue"
        [modles]
        [models]
        defualt = "openai:gpt-4.1"
        [agent]
        max_step = 3
        [providers.openai]
        retries = 2
        [mcp.servers.s]
        command = "x"
        argz = []
        [tools]
        max_output_line = 10
        """
    ) == [
        "models.defualt: unknown key; did you mean default?",
        "providers.openai.retries: unknown key; did you mean max_retries?",
        "tools.max_output_line: unknown key; did you mean max_output_lines? (a [tools.NAME] table holds a tool's options)",
        "mcp.servers.s.argz: unknown key; did you mean args?",
        "agent.max_step: unknown key; did you mean max_steps?",
        "colour: unknown section; did you mean cluster?",
        "modles: unknown section; did you mean models?",
    ]


def test_an_api_key_in_the_file_is_refused_without_being_repeated() -> None:
    text = '[providers.openai]\napi_key = "sk-live-0123456789"\n[providers.my-proxy]\napikey = "sk-live-0123456789"\n'
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert [p.key_message for p in info.value.problems] == [
        "providers.openai.api_key: API keys do not belong in weald.toml: put the key in an environment variable "
        'and name that variable here with api_key_env = "OPENAI_API_KEY"',
        "providers.my-proxy.apikey: API keys do not belong in weald.toml: put the key in an environment variable "
        'and name that variable here with api_key_env = "MY_PROXY_API_KEY"',
    ]
    assert "sk-live" not in str(info.value)


def test_a_key_written_where_its_variable_name_belongs_is_refused_without_being_repeated() -> None:
    with pytest.raises(ConfigError) as info:
        parse('[providers.openai]\napi_key_env = "sk-live-0123456789"\n')
    assert "providers.openai.api_key_env: expected the name of an environment variable" in str(info.value)
    assert "sk-live" not in str(info.value)


def test_a_known_secret_is_never_echoed_in_an_error() -> None:
    register_secret("sk-known-secret-value")
    assert problems('[providers.x]\nbase_url = "sk-known-secret-value"\n') == [
        'providers.x.base_url: expected an http:// or https:// URL, got "[redacted]"'
    ]


def test_secrets_are_refused_in_tool_options_too() -> None:
    assert problems('[tools.fetch]\nauth_token = "t0k3n-t0k3n"\n') == [
        "tools.fetch.auth_token: secrets do not belong in weald.toml: put the value in an environment variable "
        "and have the tool read it there"
    ]


def test_permissions_take_a_permission_or_a_table_of_patterns() -> None:
    assert problems(
        """
        [tools.permissions]
        read_file = "yes"
        grep = 1
        [tools.permissions.shell]
        "git status*" = "allow"
        "rm -rf *" = "never"
        """
    ) == [
        'tools.permissions.read_file: expected "allow", "ask" or "deny", got "yes"',
        'tools.permissions.grep: expected "allow", "ask" or "deny", or a table of command patterns, got 1',
        'tools.permissions.shell."rm -rf *": expected "allow", "ask" or "deny", got "never"',
    ]


def test_options_of_built_in_tools_are_checked_and_other_tools_options_pass_through() -> None:
    assert problems('[tools.shell]\nenv_keep = "HOME"\nkill_grace = -1\n[tools.files]\nallow_hardlinks = "yes"\n') == [
        'tools.shell.env_keep: expected an array of strings, got "HOME"',
        "tools.shell.kill_grace: expected a number of seconds, zero or more, got -1",
        'tools.files.allow_hardlinks: expected true or false, got "yes"',
    ]
    # A misspelt option of a built-in tool would leave the real one unset: it is reported.
    assert problems("[tools.shell]\ntimout = 5\n[tools.grep]\ncontext = 2\n[tools.files]\nmax_read = 10\n") == [
        "tools.shell.timout: unknown option; did you mean timeout? (known options: env, env_keep, hidden, "
        "kill_grace, network, readable, sandbox, timeout, writable)",
        "tools.grep.context: unknown option; known options: timeout",
        "tools.files.max_read: unknown option; did you mean max_read_bytes? "
        "(known options: allow_hardlinks, max_read_bytes)",
    ]
    # The file tools' shared table has no timeout of its own: those are set per tool.
    assert problems("[tools.files]\ntimeout = 5\n") == [
        "tools.files.timeout: unknown option; known options: allow_hardlinks, max_read_bytes"
    ]
    # Custom and MCP tools take options weald cannot know: they pass through.
    assert parse("[tools.my_tool]\nanything = [1, 2]\n[tools.mcp__time__now]\nzone = 'UTC'\n").tools.options == {
        "my_tool": {"anything": [1, 2]},
        "mcp__time__now": {"zone": "UTC"},
    }


def test_tool_options_written_under_tools_options_are_reported() -> None:
    assert problems("[tools.options.files]\nallow_hardlinks = true\n") == [
        "tools.options: unknown key; a tool's options go in its own table, [tools.NAME] (like [tools.shell]), "
        "not under [tools.options]"
    ]


def test_the_built_in_tool_names_the_config_knows_are_the_registered_ones() -> None:
    from weald.runtime.daemon._config_convert import BUILTIN_TOOLS
    from weald.tools import default_registry

    assert sorted(BUILTIN_TOOLS) == sorted(default_registry.names())


def test_hibernate_after_is_a_positive_number_of_seconds() -> None:
    assert problems('[limits]\nhibernate_after = "soon"\n') == ['limits.hibernate_after: expected a number, got "soon"']


def test_a_tool_timeout_set_in_both_places_in_one_file_is_an_error() -> None:
    assert problems("[tools.timeouts]\nshell = 10\n[tools.shell]\ntimeout = 20\n") == [
        "tools.shell.timeout: also set as tools.timeouts.shell; set it in one place"
    ]


def test_mcp_server_problems_are_reported_under_the_servers_path(tmp_path: Path) -> None:
    assert problems(
        """
        [mcp.servers.both]
        command = "srv"
        url = "https://mcp.example/mcp"
        [mcp.servers.neither]
        enabled = false
        [mcp.servers.bad]
        url = "ftp://mcp.example"
        args = ["-v"]
        [mcp.servers.typed]
        command = "srv"
        args = ["ok", 3]
        call_timeout = 0
        """
    ) == [
        "mcp.servers.typed.args[1]: expected a string, got 3",
        "mcp.servers.typed.call_timeout: expected a positive number of seconds, got 0",
        "mcp.servers.both: give either command (stdio) or url (Streamable HTTP), not both",
        "mcp.servers.neither: give either command (stdio) or url (Streamable HTTP)",
        "mcp.servers.bad: url must be an absolute http:// or https:// URL, not 'ftp://mcp.example'",
        "mcp.servers.bad: args, env and cwd apply to stdio servers only",
    ]

    # A clash made by merging names both files.
    home, project = tmp_path / "home", tmp_path / "project"
    home_file = write(home / ".weald" / "weald.toml", '[mcp.servers.s]\ncommand = "srv"\n')
    project_file = write(project / "weald.toml", '[mcp.servers.s]\nurl = "https://mcp.example/mcp"\n')
    with pytest.raises(ConfigError) as info:
        load_config(project, home=home, environ={})
    assert [str(p) for p in info.value.problems] == [
        f"{home_file} + {project_file}: mcp.servers.s: give either command (stdio) or url (Streamable HTTP), not both"
    ]


def test_a_bad_key_does_not_also_raise_the_problems_it_causes() -> None:
    # x's command is wrong, so "give either command or url" for x would only echo it.
    assert problems("[mcp.servers.x]\ncommand = 5\n[mcp.servers.y]\n") == [
        "mcp.servers.x.command: expected a string, got 5",
        "mcp.servers.y: give either command (stdio) or url (Streamable HTTP)",
    ]
    assert problems('[providers]\nolama = 3\n[models]\ndefault = "olama:x"\n') == [
        "providers.olama: expected a table, got 3"
    ]


def test_a_project_file_may_just_switch_off_a_server_defined_at_home(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    write(home / ".weald" / "weald.toml", '[mcp.servers.s]\ncommand = "srv"\n')
    write(project / "weald.toml", "[mcp.servers.s]\nenabled = false\n")
    server = load_config(project, home=home, environ={}).mcp.servers["s"]
    assert (server.command, server.enabled) == ("srv", False)


def test_model_names_must_refer_to_known_providers_and_aliases(tmp_path: Path) -> None:
    assert problems('[models]\ndefault = "olama:llama3"\n[models.aliases]\nfast = "gpt"\n') == [
        'models.aliases.fast: expected a "provider:model" string (like "openai:gpt-4.1"), got "gpt"'
    ]
    assert problems('[models]\ndefault = "olama:llama3"\n') == [
        'models.default: unknown provider "olama"; use one of anthropic, openai, scripted or add [providers.olama]'
    ]
    assert problems('[models]\ndefault = "quick"\n[agent]\nmax_steps = 0\n') == [
        "agent.max_steps: expected a positive integer, got 0",
        'models.default: "quick" is neither a provider:model spec nor a name in [models.aliases]',
    ]
    script = write(tmp_path / "demo.json", '{"turns": []}')
    assert parse(f'[models]\ndefault = "scripted:{script}"\n').models.default == f"scripted:{script}"


def test_a_script_that_is_missing_or_no_regular_file_is_reported_with_its_key_path(tmp_path: Path) -> None:
    fifo = tmp_path / "script.fifo"
    os.mkfifo(fifo)
    text = f'[models]\ndefault = "scripted:/nonexistent"\n[models.aliases]\nz = "scripted:/dev/zero"\np = "scripted:{fifo}"\n'
    assert problems(text) == [
        "models.aliases.z: the script /dev/zero is a character device, not a regular file; give the path of a file",
        f"models.aliases.p: the script {fifo} is a FIFO (named pipe), not a regular file; give the path of a file",
        "models.default: the script /nonexistent does not exist",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "a." * 3000 + "a = 1\n",
            "a.a.a.a.(...): tables or arrays nest more than 32 levels deep, the most weald reads",
        ),
        ("[" + "a." * 2999 + "a]\nb = 1\n", "a.a.a.a.(...): tables or arrays nest more than 32 levels deep"),
        ("a = " + "[" * 3000 + "]" * 3000 + "\n", "invalid TOML: arrays or inline tables nest too deeply"),
        ("a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n", "invalid TOML: arrays or inline tables nest too deeply"),
    ],
)
def test_thousands_of_nested_tables_are_one_config_error_not_a_recursion_error(text: str, expected: str) -> None:
    (message,) = problems(text)
    assert message.startswith(expected)


def test_a_toml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path / "weald.toml", "[agent]\nmax_steps = = 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, home=tmp_path / "home", environ={})
    (problem,) = info.value.problems
    assert (problem.source, problem.line, problem.column) == (str(path), 2, 13)
    assert str(problem) == f"{path}:2:13: invalid TOML: Invalid value"
    unfinished = only_problem("a = 1\nb = [")
    assert (unfinished.line, unfinished.column) == (2, 6)


def test_every_problem_in_every_file_is_reported_at_once(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home_file = write(home / ".weald" / "weald.toml", "[agent\n")
    project_file = write(project / "weald.toml", '[agent]\nmax_steps = "many"\n[limits]\nmax_agents = 0\nbogus = 1\n')
    with pytest.raises(ConfigError) as info:
        load_config(project, home=home, environ={})
    message = str(info.value)
    assert message.splitlines() == [
        "invalid configuration (4 problems):",
        f"  {home_file}:1:7: invalid TOML: Expected ']' at the end of a table declaration",
        f'  {project_file}: agent.max_steps: expected an integer, got "many"',
        f"  {project_file}: limits.max_agents: expected a positive integer, got 0",
        f"  {project_file}: limits.bogus: unknown key; expected one of: hibernate_after, max_agents, "
        "max_buffered_bytes, max_concurrent_turns, max_connections, max_message_bytes",
    ]


def test_a_section_built_by_hand_checks_its_values() -> None:
    with pytest.raises(ValueError, match="max_steps: expected a positive integer, got 0"):
        config_module.AgentConfig(max_steps=0)
    with pytest.raises(ValueError, match="timeout: expected a positive number of seconds"):
        ProviderConfig(timeout=-1)


def test_the_public_names_are_exactly_these() -> None:
    assert config_module.__all__ == [
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


def test_the_example_files_in_the_docs_load(tmp_path: Path) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", docs, re.DOTALL)
    home_text = next(block for block in blocks if block.startswith("# ~/.weald/weald.toml"))
    project_text = next(block for block in blocks if block.startswith("# <project>/weald.toml"))
    for block in blocks:
        if block is not project_text:  # that one only adds to the home file
            parse(block)
    home, project = tmp_path / "home", tmp_path / "proj"
    write(home / ".weald" / "weald.toml", home_text)
    write(project / "weald.toml", project_text)
    config = load_config(project, home=home, environ={})
    ollama = attrs.evolve(config.providers["ollama"].to_settings(), context_window=32768)  # the alias's window
    assert config.resolve_model() == ModelChoice(spec="openai:qwen3", settings=ollama)
    assert config.tools.timeouts == {"shell": 600.0}
    assert config.mcp.servers["docs"].enabled is False
    assert config.store.path == home / ".weald" / "store.db"


def test_the_spill_defaults_are_the_tools_own() -> None:
    assert SpillConfig().to_limits() == SpillLimits()
    config = parse_config('[spill]\ndir = "out"\nmax_call_bytes = 0\nretention = 60\n', base_dir=Path("/proj"))
    assert config.spill.dir == Path("/proj/out")
    assert config.spill.root(Path("/state/store.db")) == Path("/proj/out")
    assert Config().spill.root(Path("/state/store.db")) == Path("/state/weald-outputs")
    assert config.spill.to_limits().max_call_bytes == 0


# --- where the files are: the project found upward, the state directory ------------------------------


def test_the_project_is_the_nearest_directory_at_or_above_with_weald_toml_or_dot_weald(tmp_path: Path) -> None:
    home = tmp_path / "home"
    project = tmp_path / "work" / "proj"
    write(project / "weald.toml", "[agent]\nmax_steps = 7\n")
    deep = project / "src" / "pkg"
    deep.mkdir(parents=True)
    assert config_module.find_project_root(deep, home=home) == (project, ())
    assert load_config(deep, home=home, environ={}).agent.max_steps == 7
    # A nearer .weald/ makes a nearer project, with no file of its own.
    (project / "src" / ".weald").mkdir()
    assert config_module.find_project_root(deep, home=home) == (project / "src", ())
    assert load_config(deep, home=home, environ={}).agent.max_steps == 50
    assert find_config_files(deep, home=home, environ={}) == ()


def test_the_search_for_the_project_stops_below_home_and_below_a_directory_anyone_may_write(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(home / ".weald" / "weald.toml", "[agent]\nmax_steps = 3\n")
    inside = home / "code" / "x"
    inside.mkdir(parents=True)
    # ~/.weald is the user's directory, not the marker of a project at ~.
    assert config_module.find_project_root(inside, home=home) == (None, ())
    shared = tmp_path / "shared"
    shared.mkdir()
    write(shared / "weald.toml", "[agent]\nmax_steps = 9\n")
    os.chmod(shared, 0o777)
    mine = shared / "mine"
    mine.mkdir()
    assert config_module.find_project_root(mine, home=home) == (None, ())
    assert load_config(mine, home=home, environ={}).agent.max_steps == 3  # the user file only


def test_a_weald_toml_anyone_may_write_is_passed_over_and_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    outer = tmp_path / "outer"
    write(outer / "weald.toml", "[agent]\nmax_steps = 4\n")
    inner = outer / "inner"
    planted = write(inner / "weald.toml", "[agent]\nmax_steps = 5\n")
    os.chmod(planted, 0o666)
    assert config_module.find_project_root(inner, home=home) == (outer, (str(planted),))
    assert load_config(inner, home=home, environ={}).agent.max_steps == 4


def test_weald_home_moves_the_user_file_and_the_state_directory(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "wh"
    write(home / ".weald" / "weald.toml", "[agent]\nmax_steps = 10\n")
    write(elsewhere / "weald.toml", "[agent]\nmax_steps = 11\n")
    environ = {"WEALD_HOME": str(elsewhere), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    config = load_config(None, home=home, environ=environ)
    assert config.agent.max_steps == 11
    assert config.daemon.state_dir == elsewhere
    assert config.store.path == elsewhere / "store.db"
    assert config.server.socket == elsewhere / "weald.sock"  # not $XDG_RUNTIME_DIR: the state directory is set
    assert config_module.weald_home(home=home, environ=environ) == elsewhere
    # Without it: ~/.weald, and the socket in $XDG_RUNTIME_DIR as before.
    plain = load_config(None, home=home, environ={"XDG_RUNTIME_DIR": str(tmp_path / "run")})
    assert (plain.store.path, plain.server.socket) == (home / ".weald" / "store.db", tmp_path / "run" / "weald.sock")


def test_state_dir_moves_the_store_and_the_socket_and_explicit_paths_still_win(tmp_path: Path) -> None:
    config = parse('[daemon]\nstate_dir = "state"\n', base_dir=tmp_path, environ={"XDG_RUNTIME_DIR": "/run/u"})
    assert config.daemon.state_dir == tmp_path / "state"
    assert (config.store.path, config.server.socket) == (
        tmp_path / "state" / "store.db",
        tmp_path / "state" / "weald.sock",
    )
    assert config.spill.root(config.store.path) == tmp_path / "state" / "weald-outputs"
    explicit = parse('[daemon]\nstate_dir = "~/s"\n[store]\npath = "/db/x.db"\n[server]\nsocket = "/run/x.sock"\n')
    assert explicit.daemon.state_dir == HOME / "s"
    assert (explicit.store.path, explicit.server.socket) == (Path("/db/x.db"), Path("/run/x.sock"))
