"""The frozen attrs classes that ``weald.toml`` is structured into, and their value checks.

Each field that needs more than a type check (a positive number of seconds,
an environment variable's name, an http URL) carries its check in its attrs
metadata under `CHECK`. The converter (``_config_convert``) runs that check
while structuring, so every bad value in a file is reported with its path;
the same check is the field's attrs validator, so a class built by hand
cannot hold a value the file could not.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import attrs
from weald.runtime._checks import (
    CHECK,
    InvalidValue,
    ValueProblem,
    ValueProblems,
    check_bool,
    check_fraction,
    check_nonnegative_int,
    check_nonnegative_seconds,
    check_positive_int,
    check_seconds,
    check_str_table,
    check_str_tuple,
    check_string,
    checked,
    checked_factory,
    optional,
)
from weald.runtime._errors import WealdError
from weald.runtime._store_backend import is_url, mask_url
from weald.runtime.llm import ProviderSettings

if TYPE_CHECKING:
    # For annotations only; the methods that build these import them when called.
    from weald.runtime.agents import context
    from weald.runtime.mcp import ServerConfig
    from weald.tools import SpillLimits, ToolConfig

__all__ = [
    "CHECK",
    "DAEMON_WIDE",
    "DEFAULT_MODEL",
    "TOML_KEY",
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
    "InvalidValue",
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
    "StateConfig",
    "StoreConfig",
    "TelemetryConfig",
    "ToolsConfig",
    "ValueProblem",
    "ValueProblems",
]

#: The model used when ``[models] default`` is not set: None means "the
#: bundled demo script" (the daemon decides what that is).
DEFAULT_MODEL: Final[str | None] = None

Permission = Literal["allow", "ask", "deny"]
#: A tool's permission rule: one permission, or (for tools whose calls have a
#: subject, like shell's command) glob patterns on the subject -> permission.
PermissionRule = Permission | Mapping[str, Permission]

#: The attrs metadata key of a field whose TOML key is not its name (``import``, a Python keyword).
TOML_KEY: Final = "weald.config.toml_key"

# --- Value checks of the configuration's own kinds --------------------------------------------


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_name(value: object, _type: object = None) -> str:
    """The name of an environment variable; never echoes the value, which may be a key put here by mistake."""
    if not isinstance(value, str):
        raise InvalidValue("the name of an environment variable", value)
    if not _ENV_NAME.fullmatch(value):
        raise ValueProblem(
            'expected the name of an environment variable (like "OPENAI_API_KEY"), '
            "not the key itself: put the key in that variable"
        )
    return value


def check_sandbox_mode(value: object, _type: object = None) -> str:
    """``[tools.shell] sandbox``: ``"auto"``, ``"required"`` or ``"off"``."""
    if value not in ("auto", "required", "off"):
        raise InvalidValue('"auto", "required" or "off"', value)
    return str(value)


def check_network(value: object, _type: object = None) -> bool | tuple[str, ...]:
    """``[tools.shell] network``: true, false, or an array of command patterns."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, list | tuple):
        raise InvalidValue("true, false or an array of command patterns", value)
    return check_str_tuple(value)


def check_http_url(value: object, _type: object = None) -> str:
    """An absolute ``http://`` or ``https://`` URL."""
    if not isinstance(value, str):
        raise InvalidValue("an http:// or https:// URL", value)
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise InvalidValue("an http:// or https:// URL", value)
    return value


def check_model_spec(value: object, _type: object = None) -> str:
    """A ``provider:model`` spec, or (with no colon) the name of an alias."""
    if not isinstance(value, str):
        raise InvalidValue('a "provider:model" string or an alias name', value)
    provider, colon, model = value.partition(":")
    if not provider.strip() or (colon and not model.strip()):
        raise InvalidValue('a "provider:model" string (like "openai:gpt-4.1") or an alias name', value)
    return value


def check_full_model_spec(value: object, _type: object = None) -> str:
    """A ``provider:model`` spec (an alias's target)."""
    spec = check_model_spec(value)
    if ":" not in spec:
        raise InvalidValue('a "provider:model" string (like "openai:gpt-4.1")', value)
    return spec


def check_http_address(value: object, _type: object = None) -> str:
    """``HOST:PORT`` for the observer to listen on: an IP address (``[::1]`` for IPv6) or ``localhost``."""
    if not isinstance(value, str):
        raise InvalidValue('"HOST:PORT", like "127.0.0.1:8765"', value)
    host, colon, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidValue('"HOST:PORT", like "127.0.0.1:8765" (port 0 picks a free one)', value)
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InvalidValue('"HOST:PORT" with an IP address or localhost, like "127.0.0.1:8765"', value) from None
    return value


# --- The sections ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AliasLimits:
    """The window of an alias's model, from a ``[models.aliases.NAME]`` table.

    Attributes:
        context_window: The model's context window in tokens; None: known
            for common models, else 128,000.
        output_reserve: Tokens of the window kept free for the answer;
            None: a quarter of the window, at most 16,384.
    """

    context_window: int | None = checked(None, optional(check_positive_int))
    output_reserve: int | None = checked(None, optional(check_nonnegative_int))


@attrs.frozen(kw_only=True)
class ModelsConfig:
    """``[models]``: which model agents use, and short names for models.

    An alias is a string (``fast = "openai:gpt-4.1-mini"``) or, to state its
    model's window, a table: ``[models.aliases.fast]`` with ``model``,
    ``context_window`` and ``output_reserve``.

    Attributes:
        default: The model for new agents: a ``provider:model`` spec
            (``"anthropic:claude-sonnet-4-5"``, ``"ollama:qwen3"`` with a
            ``[providers.ollama]`` table, ``"scripted:demo.json"``) or an
            alias name. None (`DEFAULT_MODEL`) means the bundled demo script.
        aliases: Names for ``provider:model`` specs (``fast = "openai:gpt-4.1-mini"``);
            usable wherever a model is named.
        limits: The windows given in alias tables, by alias name.
    """

    default: str | None = checked(DEFAULT_MODEL, optional(check_model_spec))
    aliases: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    limits: Mapping[str, AliasLimits] = attrs.field(factory=dict, hash=False)


@attrs.frozen(kw_only=True)
class ProviderConfig:
    """``[providers.NAME]``: how to reach one model server; mirrors `ProviderSettings`.

    The API key is never in the file: ``api_key_env`` names the environment
    variable that holds it.

    Attributes:
        kind: The API the server speaks, ``"openai"`` (Chat Completions, also
            vLLM, llama.cpp, Ollama, LM Studio, OpenRouter...) or
            ``"anthropic"`` (Messages). Defaults to the table's name when
            that is ``openai`` or ``anthropic``, else to ``"openai"``.
        base_url: The API root; None means the public endpoint of ``kind``.
        api_key_env: The environment variable holding the key; None means
            ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``.
        api_key_required: Whether a missing key is an error (false for local
            servers that need none).
        extra_headers: Headers added to every request.
        timeout: Seconds to wait for the server to start answering.
        connect_timeout: Seconds to wait for a connection.
        stall_timeout: Seconds a response stream may stay silent.
        max_retries: Retries of a retryable failure before the first event.
        backoff_base: Seconds before the first retry (doubling each time).
        backoff_cap: The longest wait between retries.
        max_retry_after: The longest ``Retry-After`` honoured, in seconds.
        context_window: The context window of this server's models, in
            tokens; None: known for common models, else 128,000. An alias
            table's ``context_window`` wins over it.
        output_reserve: Tokens of the window kept free for the answer.
    """

    kind: Literal["openai", "anthropic"] = "openai"
    base_url: str | None = checked(None, optional(check_http_url))
    api_key_env: str | None = checked(None, optional(check_env_name))
    api_key_required: bool = checked(True, check_bool)
    extra_headers: Mapping[str, str] = checked_factory(dict, check_str_table)
    timeout: float = checked(60.0, check_seconds)
    connect_timeout: float = checked(10.0, check_seconds)
    stall_timeout: float = checked(60.0, check_seconds)
    max_retries: int = checked(4, check_nonnegative_int)
    backoff_base: float = checked(0.5, check_nonnegative_seconds)
    backoff_cap: float = checked(8.0, check_nonnegative_seconds)
    max_retry_after: float = checked(60.0, check_nonnegative_seconds)
    context_window: int | None = checked(None, optional(check_positive_int))
    output_reserve: int | None = checked(None, optional(check_nonnegative_int))

    def to_settings(self) -> ProviderSettings:
        """The `ProviderSettings` a provider of this ``kind`` is built with."""
        return ProviderSettings(
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            api_key_required=self.api_key_required,
            extra_headers=dict(self.extra_headers),
            timeout=self.timeout,
            connect_timeout=self.connect_timeout,
            stall_timeout=self.stall_timeout,
            max_retries=self.max_retries,
            backoff_base=self.backoff_base,
            backoff_cap=self.backoff_cap,
            max_retry_after=self.max_retry_after,
            context_window=self.context_window,
            output_reserve=self.output_reserve,
        )


@attrs.frozen(kw_only=True)
class ToolsConfig:
    """``[tools]``: output limits, permissions, timeouts, the tool filter and per-tool options.

    Attributes:
        max_output_lines: Lines of a tool's output that reach the model.
        max_output_bytes: Bytes of a tool's output that reach the model.
        enabled: Which tools agents get, as filter patterns applied in
            order: a name or glob adds, ``!name`` removes
            (``["*", "!fetch"]``).
        permission_timeout: Seconds to wait for an answer to an ``ask``
            before it counts as deny.
        permissions: Per tool name, ``"allow"``, ``"ask"`` or ``"deny"``; or,
            for tools whose calls have a subject (shell's command), a table
            of glob patterns on the subject -> permission, where among the
            patterns that match, deny beats ask beats allow.
        timeouts: Seconds per tool name, overriding the tool's default
            (``[tools.NAME] timeout = N`` is the same thing, written there).
        options: ``[tools.NAME]`` tables, by name, passed to the tools as
            `ToolConfig.options` (``shell.env_keep``, ``files.max_read_bytes``...).
        modules: Python modules the daemon imports when it starts, each
            defining tools with ``@tool`` (``["mypkg.tools"]``); the directory
            of the file naming them is importable. Installed packages offer
            theirs through the ``weald.tools`` entry-point group instead.
    """

    max_output_lines: int = checked(2000, check_positive_int)
    max_output_bytes: int = checked(50 * 1024, check_positive_int)
    enabled: tuple[str, ...] = checked(("*",), check_str_tuple)
    permission_timeout: float = checked(300.0, check_seconds)
    permissions: Mapping[str, PermissionRule] = attrs.field(factory=dict, hash=False)
    timeouts: Mapping[str, float] = attrs.field(factory=dict, hash=False)
    options: Mapping[str, Mapping[str, object]] = attrs.field(factory=dict, hash=False)
    modules: tuple[str, ...] = checked((), check_str_tuple)

    def to_tool_config(self) -> ToolConfig:
        """The `weald.tools.ToolConfig` every tool call receives."""
        # Imported here: weald.tools imports weald.runtime, so a module-level
        # import would tie the runtime package's import to the tools package.
        from weald.tools import ToolConfig

        return ToolConfig(
            max_output_lines=self.max_output_lines,
            max_output_bytes=self.max_output_bytes,
            options={name: dict(options) for name, options in self.options.items()},
        )


@attrs.frozen(kw_only=True)
class MCPAuthConfig:
    """``[mcp.servers.NAME.auth]``: OAuth for an HTTP MCP server; mirrors `weald.runtime.mcp.OAuthConfig`.

    Secrets are never in the file: ``client_secret_env`` and
    ``private_key_env`` name environment variables. Combinations (a grant
    that needs a client id, a browser redirect that must be loopback...)
    are checked by ``OAuthConfig`` and reported under ``mcp.servers.NAME.auth``.

    Attributes:
        grant: ``"authorization_code"`` (a person approves once) or
            ``"client_credentials"`` (a machine client; no person).
        client_id: A pre-registered client's id; without one weald registers itself.
        client_secret_env: The environment variable holding the client's secret.
        private_key_env: The environment variable holding the client's private
            key (PEM), for ``client_credentials`` with ``private_key_jwt``.
        signing_algorithm: The JWT algorithm used with ``private_key_env``.
        token_endpoint_auth_method: ``"client_secret_basic"``,
            ``"client_secret_post"`` or ``"none"``, for a pre-registered client.
        scopes: Scopes to request besides those the server asks for.
        redirect_uri: Where the authorization server sends the code back.
        redirect_mode: ``"browser"`` (weald listens on ``redirect_uri`` and
            announces the URL a person must open, event ``mcp.auth_required``)
            or ``"headless"`` (weald follows the authorization server's
            redirect itself; for servers that approve without a person).
        client_metadata_url: The https URL of this client's metadata document (CIMD).
        client_name: The client's name at registration and consent.
        issuer: The authorization server to trust with client credentials.
        authorization_timeout: Seconds a person has to authorize in the browser.
    """

    grant: Literal["authorization_code", "client_credentials"] = "authorization_code"
    client_id: str | None = checked(None, optional(check_string))
    client_secret_env: str | None = checked(None, optional(check_env_name))
    private_key_env: str | None = checked(None, optional(check_env_name))
    signing_algorithm: str = checked("ES256", check_string)
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post", "none"] | None = None
    scopes: tuple[str, ...] = checked((), check_str_tuple)
    redirect_uri: str = checked("http://127.0.0.1:33418/callback", check_http_url)
    redirect_mode: Literal["browser", "headless"] = "browser"
    client_metadata_url: str | None = checked(None, optional(check_http_url))
    client_name: str = checked("weald", check_string)
    issuer: str | None = checked(None, optional(check_http_url))
    authorization_timeout: float = checked(300.0, check_seconds)


@attrs.frozen(kw_only=True)
class MCPServerConfig:
    """``[mcp.servers.NAME]``: one MCP server; `to_server_config` makes the `ServerConfig`.

    Give ``command`` (stdio) or ``url`` (Streamable HTTP), not both.

    Attributes:
        command: Executable of a stdio server.
        args: Its arguments.
        env: Extra environment variables for it.
        cwd: Its working directory (relative: to the config file's directory).
        url: Endpoint of a Streamable HTTP server.
        headers: Extra HTTP headers.
        enabled: Whether to connect at all.
        call_timeout: Default deadline of one request, in seconds.
        connect_timeout: Deadline for start-up and the handshake, in seconds.
        ping_timeout: How long the server has to answer a ping before it
            counts as hung (not responding) and is restarted, in seconds.
        ping_interval: Seconds between pings (idle or not) that find a hung server.
        auth: ``[mcp.servers.NAME.auth]``, OAuth for an HTTP server.
        sampling: When the server asks for a completion of the calling
            agent's model: ``ask`` its person each time, ``allow``, or ``deny``.
        log_level: The ``logging/setLevel`` sent to the server after the
            handshake; None leaves the server's default.
    """

    command: str | None = checked(None, optional(check_string))
    args: tuple[str, ...] = checked((), check_str_tuple)
    env: Mapping[str, str] = checked_factory(dict, check_str_table)
    cwd: Path | None = None
    url: str | None = checked(None, optional(check_string))
    headers: Mapping[str, str] = checked_factory(dict, check_str_table)
    enabled: bool = checked(True, check_bool)
    call_timeout: float = checked(60.0, check_seconds)
    connect_timeout: float = checked(30.0, check_seconds)
    ping_timeout: float = checked(5.0, check_seconds)
    ping_interval: float = checked(30.0, check_seconds)
    auth: MCPAuthConfig | None = None
    sampling: Literal["ask", "allow", "deny"] = "ask"
    log_level: Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"] | None = None

    def to_server_config(self, name: str) -> ServerConfig:
        """The `ServerConfig` for the server called ``name``.

        Raises:
            MCPConfigError: The combination is invalid (no transport, both,
                or stdio-only fields on an HTTP server); `load_config`
                reports these with the path ``mcp.servers.NAME``.
        """
        # Imported here: the MCP SDK takes most of a second to import, and a
        # config without MCP servers should not pay for it.
        from weald.runtime.mcp import OAuthConfig, ServerConfig

        auth = None if self.auth is None else OAuthConfig(**attrs.asdict(self.auth, recurse=False))
        return ServerConfig(
            name=name,
            command=self.command,
            args=self.args,
            env=dict(self.env),
            cwd=None if self.cwd is None else str(self.cwd),
            url=self.url,
            headers=dict(self.headers),
            enabled=self.enabled,
            call_timeout=self.call_timeout,
            connect_timeout=self.connect_timeout,
            ping_timeout=self.ping_timeout,
            ping_interval=self.ping_interval,
            auth=auth,
            sampling=self.sampling,
            log_level=self.log_level,
        )


@attrs.frozen(kw_only=True)
class MCPConfig:
    """``[mcp]``: the MCP servers to connect to.

    Attributes:
        servers: ``[mcp.servers.NAME]`` tables, by name.
        imports: ``import = [...]``: other hosts' config files (Claude
            Desktop, Claude Code, OpenCode) whose MCP servers are read at
            every load, under the ones weald.toml names itself (which win a
            name both have). Relative paths are relative to the file that
            gives them.
        network: Whether the project's own stdio servers, which run in the
            shell's OS sandbox, may use the network there.
    """

    servers: Mapping[str, MCPServerConfig] = attrs.field(factory=dict, hash=False)
    imports: tuple[Path, ...] = attrs.field(default=(), metadata={TOML_KEY: "import"})
    network: bool = checked(True, check_bool)


@attrs.frozen(kw_only=True)
class AgentConfig:
    """``[agent]``: how agents run.

    Attributes:
        max_steps: Model calls one turn may make before it stops.
        sub_agent_depth: How deep sub-agents may nest (0: no sub-agents).
        sub_agent_timeout: Seconds a sub-agent may run.
        system_prompt: Replaces the built-in system prompt when set.
        debug_state: Whether agents get the ``debug_state`` introspection tool.
    """

    max_steps: int = checked(50, check_positive_int)
    sub_agent_depth: int = checked(2, check_nonnegative_int)
    sub_agent_timeout: float = checked(600.0, check_seconds)
    system_prompt: str | None = checked(None, optional(check_string))
    debug_state: bool = checked(False, check_bool)


@attrs.frozen(kw_only=True)
class ContextConfig:
    """``[context]``: how agents keep their requests under their model's context window.

    Attributes:
        auto: Prune and compact automatically before a model call that
            would not fit; false leaves ``agent.compact`` and the retry after
            a server's context-length error.
        keep_tool_results: Tool results of the last this many model steps
            are never pruned.
        keep_recent: The share of the input budget the most recent messages
            may fill and still be kept whole by a compaction (0 to 1).
        summary_prompt: Replaces the built-in prompt that asks the model for a summary.
    """

    auto: bool = checked(True, check_bool)
    keep_tool_results: int = checked(3, check_nonnegative_int)
    keep_recent: float = checked(0.3, check_fraction)
    summary_prompt: str | None = checked(None, optional(check_string))

    def to_context_config(self) -> context.ContextConfig:
        """The `weald.runtime.agents.context.ContextConfig` agents are started with."""
        from weald.runtime.agents.context import ContextConfig as AgentContextConfig

        return AgentContextConfig(
            auto=self.auto,
            keep_tool_results=self.keep_tool_results,
            keep_recent=self.keep_recent,
            summary_prompt=self.summary_prompt,
        )


@attrs.frozen(kw_only=True)
class LimitsConfig:
    """``[limits]``: bounds on what the daemon holds.

    Attributes:
        max_agents: Top-level sessions alive at once (``agent.start``);
            sub-agents are not counted.
        max_message_bytes: The largest JSON-RPC message (one line) the
            server accepts; a larger one gets an error and the connection
            carries on.
        max_concurrent_turns: Turns running at once across the daemon;
            further turns wait, first come first served. None means no limit.
        max_connections: Client connections open at once on the socket; one
            more is told so and closed. None means three quarters of the
            daemon's file descriptor limit (``ulimit -n``).
        max_buffered_bytes: Bytes of unfinished lines (messages still being
            received) held across all connections; the connection whose
            line would go over it is told so and closed.
        hibernate_after: Seconds a top-level session may stay idle before
            it hibernates: its actors stop and a stub holds its paths until
            the next message, which restores it from the store. 0: never.
    """

    max_agents: int = checked(20_000, check_positive_int)
    max_message_bytes: int = checked(16 * 1024 * 1024, check_positive_int)
    max_concurrent_turns: int | None = checked(None, optional(check_positive_int))
    max_connections: int | None = checked(None, optional(check_positive_int))
    max_buffered_bytes: int = checked(64 * 1024 * 1024, check_positive_int)
    hibernate_after: float = checked(600.0, check_nonnegative_seconds)


def check_store_url(value: object, _type: object = None) -> str:
    """A ``postgresql://`` (or ``postgres://``) database URL."""
    if not isinstance(value, str) or not is_url(value):
        shown = mask_url(value) if isinstance(value, str) else value
        raise InvalidValue("a postgresql://user:password@host:port/database URL", shown)
    return value


_NODE_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}\Z")


def check_node_id(value: object, _type: object = None) -> str:
    """A node's name: 1-128 letters, digits, ``_ . : @ -``, first a letter or digit."""
    if not isinstance(value, str) or not _NODE_ID.match(value):
        raise InvalidValue("a node name of letters, digits, '_', '.', ':', '@' or '-' (at most 128)", value)
    return value


@attrs.frozen(kw_only=True)
class StoreConfig:
    """``[store]``: the persistent key-value store (daemon-wide).

    Attributes:
        path: The sqlite database file, and the daemon's state directory
            (its parent: the lock, the log, spilled output). Relative paths
            are relative to the config file's directory; ``~`` is the home
            directory.
        durability: sqlite: ``"process"`` survives a crash of the daemon;
            ``"power"`` also survives power loss (an fsync per write).
        warn_bytes: The store's size past which the daemon publishes
            ``store.size_warning`` (once each time it goes past). 0: never.
        gc_interval: Seconds between the daemon's passes applying each
            project's ``[history] retention`` (the first one a minute after it
            starts). 0: none; ``weald gc`` still runs one.
        url: A ``postgresql://user:password@host:port/database`` URL: the
            data lives in that database instead of the file (``weald serve
            --store URL``). Its password is never shown.
        node_id: This daemon's name among the daemons sharing the database
            (``weald serve --node-id``); default: the host name and a hash of
            the state directory.
        lease: Seconds a node's lease lasts; it is renewed every third of
            it, and a node that cannot renew it stops writing its sessions.
        commit_log: PostgreSQL: each fenced commit is also logged in the
            ``weald_commit_log`` table (the node, its epoch, the sessions and
            the epochs it wrote them under), in the same transaction, to
            audit that no session ever had two owners. It grows by a row a
            commit: for tests and audits, not for every day.
    """

    path: Path = Path("~/.weald/store.db")
    durability: Literal["process", "power"] = "process"
    warn_bytes: int = checked(2 * 1024**3, check_nonnegative_int)
    gc_interval: float = checked(3600.0, check_nonnegative_seconds)
    url: str | None = checked(None, optional(check_store_url))
    node_id: str | None = checked(None, optional(check_node_id))
    lease: float = checked(5.0, check_seconds)
    commit_log: bool = False


_RETENTION = re.compile(r"^\s*(?:(all)|(\d+)\s*(days?|d|turns?))\s*$")


def parse_retention(value: str) -> tuple[Literal["all", "days", "turns"], int]:
    """``[history] retention`` as ``(kind, count)``: ``("all", 0)``, ``("days", N)`` or ``("turns", N)``.

    Raises:
        ValueError: it is none of ``"all"``, ``"N days"``, ``"N turns"`` (N >= 1).
    """
    found = _RETENTION.match(value) if isinstance(value, str) else None
    if found is None or (found.group(2) is not None and int(found.group(2)) < 1):
        msg = f'expected "all", "N days" or "N turns" (N at least 1), got {value!r}'
        raise ValueError(msg)
    if found.group(1):
        return "all", 0
    return ("days" if found.group(3).startswith("d") else "turns"), int(found.group(2))


def check_retention(value: object, _type: object = None) -> str:
    """``"all"``, ``"N days"`` or ``"N turns"``."""
    if not isinstance(value, str):
        raise InvalidValue('"all", "N days" or "N turns"', value)
    try:
        parse_retention(value)
    except ValueError:
        raise InvalidValue('"all", "N days" or "N turns" (N at least 1)', value) from None
    return value


def check_listen_address(value: object, _type: object = None) -> str:
    """``HOST:PORT`` a node serves fronts on, or the address it tells them: a host name or an IP address."""
    if not isinstance(value, str):
        raise InvalidValue('"HOST:PORT", like "0.0.0.0:7400"', value)
    host, colon, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or int(port) > 65535 or any(c.isspace() for c in host):
        raise InvalidValue('"HOST:PORT", like "0.0.0.0:7400" (port 0 picks a free one)', value)
    return value


def check_secret(value: object, _type: object = None) -> str:
    """The cluster's shared secret: at least 16 characters."""
    if not isinstance(value, str) or len(value) < 16:
        shown = "a shorter string" if isinstance(value, str) else value
        raise InvalidValue("a secret of at least 16 characters (weald cluster secret makes one)", shown)
    return value


_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def check_labels(value: object, _type: object = None) -> dict[str, str]:
    """A node's labels: a table of names (letters, digits, ``_ . -``) to strings."""
    table = check_str_table(value)
    for name in table:
        if not _LABEL.match(name):
            raise InvalidValue("label names of letters, digits, '_', '.' or '-' (at most 63)", name)
    return table


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """``[cluster]``: daemons on several machines behind a front (daemon-wide; docs/deployment.md).

    Attributes:
        listen: ``HOST:PORT`` this node serves fronts on (``weald serve
            --listen``); None: it serves none. Needs ``[store] url`` and a secret.
        advertise: The address fronts connect to; default: ``listen``, with
            this machine's host name for an unspecified host (``0.0.0.0``).
        secret: The secret every node and front of the cluster shares; a
            front and a node each prove they hold it before any request.
            Never printed; keep the file readable by its owner only.
        secret_file: A file holding the secret (its first line), instead of ``secret``.
        tls_cert: A node's certificate (PEM): with ``tls_key``, nodes serve
            fronts over TLS.
        tls_key: The certificate's private key (PEM).
        tls_ca: Certificates a front trusts (PEM): with it, a front talks to
            nodes over TLS and checks their certificates.
        labels: This node's labels; a node labelled ``project = "DIR"`` takes
            the new sessions of the projects under DIR (pinning), others don't.
        placement: ``module:function`` a front calls to place a new session
            (given the start's params and the live nodes; returns a node id,
            or None for the least loaded).
    """

    listen: str | None = checked(None, optional(check_listen_address))
    advertise: str | None = checked(None, optional(check_listen_address))
    secret: str | None = checked(None, optional(check_secret))
    secret_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    labels: Mapping[str, str] = checked_factory(dict, check_labels)
    placement: str | None = checked(None, optional(check_string))


@attrs.frozen(kw_only=True)
class HistoryConfig:
    """``[history]``: how long the store keeps an agent's conversation (per project).

    The daemon applies it in the background (``[store] gc_interval``) and on
    ``weald gc``. It removes only messages older than the context an agent
    would be restored with (those before its last compaction's first kept
    message); compaction summaries and everything a restore needs stay.

    Attributes:
        retention: ``"all"`` (keep everything), ``"N days"`` (remove older
            messages once N days old) or ``"N turns"`` (keep the last N turns
            before the last compaction).
    """

    retention: str = checked("all", check_retention)


@attrs.frozen(kw_only=True)
class SpillConfig:
    """``[spill]``: tool output too long for the model, saved to files it can read.

    The defaults are those of `weald.tools.SpillLimits` (a test keeps them equal).

    Attributes:
        dir: Where each session's spill directory goes. None (the default)
            means ``weald-outputs`` next to the store file. Put it on another
            filesystem to keep a flood of output entirely apart from the store.
        max_call_bytes: The most one call's saved output holds; the model is
            told where the file was cut. 0 saves nothing.
        max_session_bytes: The most one session's saved outputs hold in all.
        min_free_bytes: Free space on the spill directory's device that
            spilling never takes, kept for the store.
        retention: Seconds before the daemon, when it starts, removes a spill
            directory that no stored active session owns.
    """

    dir: Path | None = None
    max_call_bytes: int = checked(8 * 1024 * 1024, check_nonnegative_int)
    max_session_bytes: int = checked(256 * 1024 * 1024, check_nonnegative_int)
    min_free_bytes: int = checked(256 * 1024 * 1024, check_nonnegative_int)
    retention: float = checked(24 * 3600.0, check_nonnegative_seconds)

    def to_limits(self) -> SpillLimits:
        """The bounds, as `weald.tools.SpillLimits`."""
        from weald.tools import SpillLimits

        return SpillLimits(
            max_call_bytes=self.max_call_bytes,
            max_session_bytes=self.max_session_bytes,
            min_free_bytes=self.min_free_bytes,
        )

    def root(self, store_path: Path) -> Path:
        """The directory holding the sessions' spill directories."""
        return self.dir if self.dir is not None else store_path.parent / "weald-outputs"


@attrs.frozen(kw_only=True)
class DaemonConfig:
    """``[server]``: the daemon's JSON-RPC front, and its web observer.

    Attributes:
        socket: The Unix socket. When not set, `load_config` uses
            ``$XDG_RUNTIME_DIR/weald.sock`` if that variable is set, else
            ``~/.weald/weald.sock``.
        http: ``HOST:PORT`` where the observer (a live web view of the
            daemon) listens; None: no observer. Port 0 picks a free port.
        http_remote: Let ``http`` be an address other than loopback. Off,
            a non-loopback address is refused: anyone who can reach the
            port and holds the token sees and answers everything.
        event_history: Recent events the daemon keeps in memory, newest
            first out: what ``events.query``, ``debug_state`` and the
            observer's event filters search.
    """

    socket: Path = Path("~/.weald/weald.sock")
    http: str | None = checked(None, optional(check_http_address))
    http_remote: bool = checked(False, check_bool)
    event_history: int = checked(10_000, check_positive_int)


@attrs.frozen(kw_only=True)
class StateConfig:
    """``[daemon]``: where the daemon keeps its state.

    Attributes:
        state_dir: The directory the store, the socket and the spill
            directory go in unless ``[store] path``, ``[server] socket`` or
            ``[spill] dir`` say otherwise. None: ``$WEALD_HOME`` when that
            variable is set, else ``~/.weald``. Relative paths are relative to
            the config file's directory; ``~`` is the home directory.
    """

    state_dir: Path | None = None


@attrs.frozen(kw_only=True)
class FaultsConfig:
    """``[faults]``: fault injection (carried here; the feature reads it).

    Attributes:
        enabled: Whether fault injection is on.
        file: A file of fault rules (relative: to the config file's directory).
    """

    enabled: bool = checked(False, check_bool)
    file: Path | None = None


@attrs.frozen
class TelemetryConfig:
    """``[telemetry]``: OpenTelemetry traces and metrics over OTLP (docs/telemetry.md).

    With nothing set here and no ``OTEL_EXPORTER_OTLP_*ENDPOINT`` in the
    daemon's environment, telemetry is off: nothing of OpenTelemetry is
    imported and a turn costs what it costs without it.

    Attributes:
        enabled: True or False to decide; None (the default): on when an
            endpoint is set here or in ``OTEL_EXPORTER_OTLP_ENDPOINT``.
        endpoint: The OTLP endpoint (``http://host:4318`` for HTTP,
            ``http://host:4317`` for gRPC); default: the ``OTEL_EXPORTER_OTLP_*``
            variables, else the protocol's local default.
        metrics_endpoint: Where metrics go, when not to ``endpoint`` (a receiver that takes
            traces only, such as Arize Phoenix); default: ``endpoint``.
        protocol: ``http/protobuf`` or ``grpc``; default: ``OTEL_EXPORTER_OTLP_PROTOCOL``, else http/protobuf.
        service_name: ``service.name``; default: ``OTEL_SERVICE_NAME``, else ``weald``.
        capture_content: Put prompts, answers and tool arguments on spans
            (off by default, as the GenAI conventions advise; secrets are cut).
        metrics_interval: Seconds between metric exports.
    """

    enabled: bool | None = checked(None, optional(check_bool))
    endpoint: str | None = checked(None, optional(check_http_url))
    metrics_endpoint: str | None = checked(None, optional(check_http_url))
    protocol: Literal["http/protobuf", "grpc"] | None = None
    service_name: str | None = checked(None, optional(check_string))
    capture_content: bool = checked(False, check_bool)
    metrics_interval: float = checked(15.0, check_seconds)


@attrs.frozen(kw_only=True)
class AcpConfig:
    """``[acp]``: what a session driven from an editor (``weald acp``) takes from it (per project; docs/acp.md).

    Whatever is chosen, weald's checks stay: the sandbox's paths, the
    protected files, the permission rules and the read ledger judge every
    call before anything reaches the editor, and a command in the editor's
    terminal runs in weald's OS sandbox as it would in weald's own.

    Attributes:
        files: ``"disk"`` (the default): read_file, write_file and edit_file
            work on the files on disk. ``"editor"``: on the editor's buffers,
            unsaved edits included (``fs/read_text_file``,
            ``fs/write_text_file``), when the editor offers both; else the disk.
        terminal: ``"sandbox"`` (the default): shell commands run as weald's
            own processes. ``"editor"``: foreground commands run in the
            editor's terminals (``terminal/*``), where the user sees them,
            when the editor offers them; background jobs stay weald's.
    """

    files: Literal["disk", "editor"] = "disk"
    terminal: Literal["sandbox", "editor"] = "sandbox"


@attrs.frozen
class ModelChoice:
    """A model named in the config, resolved to what `make_provider` takes.

    Attributes:
        spec: ``kind:model`` for `weald.runtime.llm.make_provider`.
        settings: The provider's settings, or None for the kind's defaults.
    """

    spec: str
    settings: ProviderSettings | None = None


@attrs.frozen(kw_only=True)
class Config:
    """Everything ``weald.toml`` configures; every field has a default.

    Build one with `load_config` (the files) or `parse_config` (a string);
    both expand ``~`` in paths and resolve the socket's default, which a
    ``Config()`` built by hand leaves as written.

    Attributes:
        models: ``[models]``.
        providers: ``[providers.NAME]`` tables, by name.
        tools: ``[tools]``.
        mcp: ``[mcp]``.
        agent: ``[agent]``.
        context: ``[context]``.
        history: ``[history]``.
        limits: ``[limits]``.
        store: ``[store]``.
        server: ``[server]``.
        faults: ``[faults]``.
        daemon: ``[daemon]``.
        telemetry: ``[telemetry]``.
        acp: ``[acp]``.
        cluster: ``[cluster]``.
    """

    models: ModelsConfig = attrs.field(factory=ModelsConfig)
    providers: Mapping[str, ProviderConfig] = attrs.field(factory=dict, hash=False)
    tools: ToolsConfig = attrs.field(factory=ToolsConfig)
    mcp: MCPConfig = attrs.field(factory=MCPConfig)
    agent: AgentConfig = attrs.field(factory=AgentConfig)
    context: ContextConfig = attrs.field(factory=ContextConfig)
    history: HistoryConfig = attrs.field(factory=HistoryConfig)
    limits: LimitsConfig = attrs.field(factory=LimitsConfig)
    store: StoreConfig = attrs.field(factory=StoreConfig)
    spill: SpillConfig = attrs.field(factory=SpillConfig)
    server: DaemonConfig = attrs.field(factory=DaemonConfig)
    faults: FaultsConfig = attrs.field(factory=FaultsConfig)
    daemon: StateConfig = attrs.field(factory=StateConfig)
    telemetry: TelemetryConfig = attrs.field(factory=TelemetryConfig)
    acp: AcpConfig = attrs.field(factory=AcpConfig)
    cluster: ClusterConfig = attrs.field(factory=ClusterConfig)

    def resolve_model(self, name: str | None = None) -> ModelChoice | None:
        """Resolve a model name (an alias or a ``provider:model`` spec) to a `ModelChoice`.

        A configured provider's name is replaced by its ``kind`` and its
        settings come along; a built-in kind (``openai``, ``anthropic``,
        ``scripted``) keeps its defaults. An alias table's ``context_window``
        and ``output_reserve`` go into the settings.

        Args:
            name: The model asked for; None means ``[models] default``.

        Returns:
            The choice, or None when no model is named and no default is
            configured: use the bundled demo script.
        """
        spec = self.models.default if name is None else name
        if spec is None:
            return None
        limits = self.models.limits.get(spec)
        spec = self.models.aliases.get(spec, spec)
        provider, colon, model = spec.partition(":")
        configured = self.providers.get(provider.strip()) if colon else None
        settings = configured.to_settings() if configured is not None else None
        if limits is not None and (limits.context_window is not None or limits.output_reserve is not None):
            base = settings if settings is not None else ProviderSettings()
            settings = attrs.evolve(
                base,
                context_window=limits.context_window if limits.context_window is not None else base.context_window,
                output_reserve=limits.output_reserve if limits.output_reserve is not None else base.output_reserve,
            )
        if configured is None:
            return ModelChoice(spec=spec, settings=settings)
        return ModelChoice(spec=f"{configured.kind}:{model.strip()}", settings=settings)


#: The sections (and keys) the daemon reads once for itself, from its own configuration (the files
#: ``weald serve`` found); every other key is read per session, from the session's project. A
#: project file may set these too: its sessions ignore them (``weald config show`` says so).
DAEMON_WIDE: Final = frozenset({"server", "store", "spill", "limits", "faults", "daemon", "cluster"})


@attrs.frozen
class ConfigFile:
    """One file a configuration was read from.

    Attributes:
        path: The file's absolute path.
        digest: ``sha256:`` and the hex digest of its bytes as read.
        layer: ``"user"`` (``~/.weald/weald.toml``, or the file ``$WEALD_CONFIG`` names) or ``"project"``.
    """

    path: str
    digest: str
    layer: Literal["user", "project"]


# --- Errors ---------------------------------------------------------------------------------------


@attrs.frozen
class ConfigProblem:
    """One problem in one config file.

    Attributes:
        source: The file (or ``<string>``); several joined by `` + `` when
            the problem comes from merging them.
        path: The dotted key path (``tools.shell.timeout``), empty for the
            file as a whole.
        message: What is wrong and what was expected.
        line: For a TOML syntax error, its line (1-based).
        column: For a TOML syntax error, its column (1-based).
    """

    source: str
    path: str
    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"

    @property
    def key_message(self) -> str:
        """``path: message``, without the file."""
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(WealdError, ValueError):
    """The configuration is invalid; every problem found is listed, one per line.

    Attributes:
        problems: The problems, in file order.
    """

    def __init__(self, problems: list[ConfigProblem] | tuple[ConfigProblem, ...]) -> None:
        self.problems = tuple(problems)
        count = len(self.problems)
        header = f"invalid configuration ({count} problem{'s' if count != 1 else ''}):"
        super().__init__("\n".join([header, *(f"  {problem}" for problem in self.problems)]))
