"""Configuration of one MCP server connection."""

from __future__ import annotations

import math
import os
import re
import urllib.parse
from collections.abc import Mapping
from typing import Final, Literal, Protocol

import attrs
from weald.runtime import environ_value, is_secret_name, register_secret
from weald.runtime._secrets import is_known_secret, is_secret_env_name, is_secret_value

from ._exceptions import MCPConfigError

__all__ = [
    "DEFAULT_AUTHORIZATION_TIMEOUT",
    "DEFAULT_REDIRECT_URI",
    "OAuthConfig",
    "ServerConfig",
    "StdioLaunch",
    "StdioLauncher",
    "expand_variables",
    "referenced_variables",
]

DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 30.0
DEFAULT_PING_TIMEOUT = 5.0
DEFAULT_PING_INTERVAL = 30.0
#: Where the authorization server sends the person's browser back to.
DEFAULT_REDIRECT_URI: Final = "http://127.0.0.1:33418/callback"
#: How long a person has to complete a browser authorization, in seconds.
DEFAULT_AUTHORIZATION_TIMEOUT: Final = 300.0


# ``${NAME}`` or ``${NAME:-default}``; ``$${`` is a literal ``${``.
_VARIABLE: Final = re.compile(r"\$(\$)?\{([^}]*)\}")
_VARIABLE_BODY: Final = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>.*))?", re.DOTALL)


class _Unset(KeyError):
    """A variable a value uses is not set and has no default."""


def referenced_variables(text: str) -> list[str]:
    """The environment variables ``text`` uses (``${NAME}``, ``${NAME:-default}``), in order.

    Raises:
        ValueError: A ``${...}`` is malformed (not a variable name, or not closed).
    """
    names: list[str] = []
    for match in _VARIABLE.finditer(text):
        if match.group(1):
            continue  # $${...}: literal
        body = _VARIABLE_BODY.fullmatch(match.group(2))
        if body is None:
            raise ValueError(f"${{{match.group(2)}}} is not ${{NAME}} or ${{NAME:-default}}")
        names.append(body["name"])
    rest = _VARIABLE.sub("", text)
    if "${" in rest:
        raise ValueError("a ${ is not closed with }")
    return names


def expand_variables(text: str, environ: Mapping[str, str]) -> str:
    """``text`` with each ``${NAME}`` replaced by its value in ``environ`` (``${NAME:-default}``: or the default).

    A variable that is unset, or set but empty, takes its default (as in the
    shell's ``:-``); ``$${`` stands for a literal ``${``.

    Raises:
        KeyError: A variable without a default is not set (its name is the key).
    """

    def one(match: re.Match[str]) -> str:
        if match.group(1):
            return "${" + match.group(2) + "}"
        body = _VARIABLE_BODY.fullmatch(match.group(2))
        assert body is not None  # checked when the config was built
        value = environ.get(body["name"], "")
        if value:
            return value
        if body["default"] is not None:
            return str(body["default"])
        if body["name"] in environ:
            return ""  # set but empty, and no default: empty it is
        raise _Unset(body["name"])

    return _VARIABLE.sub(one, text)


def _str_tuple(value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise MCPConfigError(f"args must be a list of strings, not {type(value).__name__}")
    return tuple(value)


def _str_mapping(value: object) -> Mapping[str, str]:
    # A private copy, so a caller mutating its dict cannot change a frozen config.
    if not isinstance(value, Mapping):
        raise MCPConfigError(f"expected a mapping of strings, not {type(value).__name__}")
    return dict(value)


def _optional_path(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, str | os.PathLike):
        return os.fspath(value)
    raise MCPConfigError(f"cwd must be a path, not {type(value).__name__}")


Grant = Literal["authorization_code", "client_credentials"]
RedirectMode = Literal["browser", "headless"]
TokenEndpointAuthMethod = Literal["client_secret_basic", "client_secret_post", "none"]

_GRANTS: Final = ("authorization_code", "client_credentials")
_MODES: Final = ("browser", "headless")
_METHODS: Final = ("client_secret_basic", "client_secret_post", "none")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SAMPLING_POLICIES: Final = ("ask", "allow", "deny")
#: MCP's log levels (RFC 5424's), least severe first.
LOG_LEVELS: Final = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_LOOPBACK: Final = frozenset({"127.0.0.1", "localhost", "::1"})


def _scopes(value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise MCPConfigError(f"auth.scopes must be a list of strings, not {type(value).__name__}")
    return tuple(value)


@attrs.frozen(kw_only=True)
class OAuthConfig:
    """How weald authorizes itself to one HTTP MCP server (``[mcp.servers.NAME.auth]``).

    Secrets are never in the config: ``client_secret_env`` and
    ``private_key_env`` name the environment variables that hold them,
    read when the connection starts.

    Attributes:
        grant: ``authorization_code`` (a person approves, once; tokens are
            then refreshed) or ``client_credentials`` (a machine client with
            its own credentials; no person).
        client_id: A pre-registered client's id. Without one, the client
            registers itself (client ID metadata document or dynamic
            registration). Required for ``client_credentials``.
        client_secret_env: The environment variable holding the
            pre-registered client's secret.
        private_key_env: For ``client_credentials`` with ``private_key_jwt``:
            the environment variable holding the client's private key (PEM).
        signing_algorithm: The JWT algorithm for ``private_key_env``.
        token_endpoint_auth_method: How a pre-registered client authenticates
            at the token endpoint; default ``client_secret_basic`` with a
            secret, ``none`` without.
        scopes: Scopes to request besides those the server asks for (in
            ``WWW-Authenticate`` or its metadata's ``scopes_supported``).
        redirect_uri: Where the authorization server sends the code back.
        redirect_mode: ``browser``: weald listens on ``redirect_uri`` (a
            loopback address with a port) and publishes ``mcp.auth_required``
            with the URL a person must open; ``headless``: weald requests the
            authorization URL itself and reads the code from the redirect,
            for authorization servers that approve without a person.
        client_metadata_url: An https URL of this client's metadata document,
            used as its client id where the server supports that (CIMD).
        client_name: The name shown to the person and sent at registration.
        issuer: The authorization server to trust for ``client_credentials``
            (its issuer identifier); credentials are sent nowhere else.
        authorization_timeout: Seconds a person has to complete a browser
            authorization.
    """

    grant: Grant = "authorization_code"
    client_id: str | None = None
    client_secret_env: str | None = None
    private_key_env: str | None = None
    signing_algorithm: str = "ES256"
    token_endpoint_auth_method: TokenEndpointAuthMethod | None = None
    scopes: tuple[str, ...] = attrs.field(default=(), converter=_scopes)
    redirect_uri: str = DEFAULT_REDIRECT_URI
    redirect_mode: RedirectMode = "browser"
    client_metadata_url: str | None = None
    client_name: str = "weald"
    issuer: str | None = None
    authorization_timeout: float = DEFAULT_AUTHORIZATION_TIMEOUT

    def problems(self) -> list[str]:
        """What is wrong with this config, each as ``field: why``; empty when nothing is."""
        problems: list[str] = []
        if self.grant not in _GRANTS:
            problems.append(f"grant must be one of {', '.join(_GRANTS)}, not {self.grant!r}")
        if self.redirect_mode not in _MODES:
            problems.append(f"redirect_mode must be one of {', '.join(_MODES)}, not {self.redirect_mode!r}")
        if self.token_endpoint_auth_method is not None and self.token_endpoint_auth_method not in _METHODS:
            problems.append(f"token_endpoint_auth_method must be one of {', '.join(_METHODS)}")
        for field in ("client_id", "client_metadata_url", "issuer"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                problems.append(f"{field} must be a non-empty string")
        for field in ("client_secret_env", "private_key_env"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or not _ENV_NAME.fullmatch(value)):
                problems.append(
                    f"{field} must name an environment variable (like MCP_CLIENT_SECRET), not hold the secret itself"
                )
        if self.client_secret_env is not None and self.private_key_env is not None:
            problems.append("give client_secret_env or private_key_env, not both")
        if self.private_key_env is not None and self.grant != "client_credentials":
            problems.append("private_key_env applies to grant = client_credentials only")
        secret = self.client_secret_env is not None
        if self.token_endpoint_auth_method == "none" and secret:  # noqa: S105 - a method's name
            problems.append('token_endpoint_auth_method = "none" sends no secret; drop client_secret_env')
        if self.token_endpoint_auth_method in ("client_secret_basic", "client_secret_post") and not secret:
            problems.append(f"token_endpoint_auth_method = {self.token_endpoint_auth_method!r} needs client_secret_env")
        if (secret or self.private_key_env is not None) and self.client_id is None:
            problems.append("a client secret or key belongs to a pre-registered client: give client_id too")
        if self.grant == "client_credentials":
            if self.client_id is None:
                problems.append("grant = client_credentials needs client_id")
            if not secret and self.private_key_env is None:
                problems.append("grant = client_credentials needs client_secret_env or private_key_env")
            if self.token_endpoint_auth_method == "none":  # noqa: S105 - a method's name
                problems.append('grant = client_credentials cannot use token_endpoint_auth_method = "none"')
        if any(not isinstance(scope, str) or not scope or scope.split() != [scope] for scope in self.scopes):
            problems.append("scopes must be non-empty strings without spaces")
        problems.extend(self._redirect_problems())
        if self.client_metadata_url is not None and not _is_metadata_url(self.client_metadata_url):
            problems.append("client_metadata_url must be an https:// URL with a path (the client's metadata document)")
        if self.issuer is not None and urllib.parse.urlsplit(str(self.issuer)).scheme not in ("http", "https"):
            problems.append("issuer must be the authorization server's http(s) issuer URL")
        if not isinstance(self.client_name, str) or not self.client_name.strip():
            problems.append("client_name must be a non-empty string")
        timeout = self.authorization_timeout
        number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        if not number or not math.isfinite(timeout) or timeout <= 0:
            problems.append("authorization_timeout must be a positive number of seconds")
        return problems

    def _redirect_problems(self) -> list[str]:
        if not isinstance(self.redirect_uri, str):
            return ["redirect_uri must be a string"]
        parts = urllib.parse.urlsplit(self.redirect_uri)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return [f"redirect_uri must be an absolute http:// or https:// URL, not {self.redirect_uri!r}"]
        if self.redirect_mode == "browser" and self.grant == "authorization_code":
            try:
                port = parts.port
            except ValueError:
                port = None
            if parts.scheme != "http" or parts.hostname not in _LOOPBACK or port is None:
                return [
                    "with redirect_mode = browser, redirect_uri must be http:// on a loopback address with a port "
                    f"(like {DEFAULT_REDIRECT_URI}), where weald listens for the authorization code"
                ]
        return []

    def token_auth_method(self) -> TokenEndpointAuthMethod:
        """The token endpoint authentication of a pre-registered client."""
        if self.token_endpoint_auth_method is not None:
            return self.token_endpoint_auth_method
        return "client_secret_basic" if self.client_secret_env is not None else "none"

    def read_env(self, field: Literal["client_secret_env", "private_key_env"], server: str) -> str | None:
        """The secret in the environment variable named by ``field``, registered as a secret.

        Raises:
            MCPConfigError: The variable is not set (or empty).
        """
        name = getattr(self, field)
        if name is None:
            return None
        value = environ_value(name) or ""
        if not value:
            raise MCPConfigError(
                f"MCP server {server!r}: auth.{field} names the environment variable {name}, which is not set",
                server=server,
            )
        register_secret(value)
        return value


def _is_metadata_url(url: object) -> bool:
    # The SDK's rule for a client ID metadata document's URL: https, with a path.
    if not isinstance(url, str):
        return False
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "https" and bool(parts.netloc) and parts.path not in ("", "/")


def _auth(value: object) -> OAuthConfig | None:
    if value is None or isinstance(value, OAuthConfig):
        return value
    if not isinstance(value, Mapping):
        raise MCPConfigError(f"auth must be a table, not {type(value).__name__}")
    try:
        return OAuthConfig(**value)
    except TypeError as exc:
        raise MCPConfigError(f"auth: {exc}") from exc


class StdioLaunch(Protocol):
    """How one stdio server process is started, as a `StdioLauncher` prepared it.

    Attributes:
        argv: the program and its arguments (the wrapper's, then the server's).
        env: the whole environment of the program.
        pass_fds: descriptors the program inherits at the same numbers.
    """

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...]

    def started(self) -> None:
        """The process has been spawned (or could not be): close what only the child needed."""

    def ended(self) -> None:
        """The process and its group are gone: give back what the launch held (blocking, for a worker thread)."""


class StdioLauncher(Protocol):
    """Wraps a stdio server's command line (an OS sandbox, say); set as `ServerConfig.launcher`.

    Implementations are frozen values compared by equality (a changed
    launcher restarts the server, as any changed field does).
    """

    def prepare(self, server: str, argv: list[str], env: dict[str, str], cwd: str | None) -> StdioLaunch | None:
        """The launch of ``argv`` (blocking, for a worker thread); None: run it as it is.

        Raises:
            OSError, ValueError or RuntimeError: it may not run (the message,
                one line, says why).
        """


@attrs.frozen
class ServerConfig:
    """How to reach one MCP server, and how long to wait for it.

    Exactly one transport is given: ``command`` (with optional ``args``,
    ``env`` and ``cwd``) runs the server as a subprocess speaking stdio;
    ``url`` (with optional ``headers``) reaches it over Streamable HTTP.
    Everything is validated on construction and a bad value raises
    `MCPConfigError` naming the server and the field.

    Attributes:
        name: The server's name; it becomes part of every tool's registered
            name (``mcp__<name>__<tool>``) and of every error message.
        command: Executable to run for a stdio server.
        args: Arguments for ``command``.
        env: Extra environment variables for the subprocess, merged over a
            small inherited base (``HOME``, ``PATH``, ``USER`` ...; the
            SDK's safe list), never the whole parent environment.
        cwd: Working directory for the subprocess.
        url: ``http``/``https`` endpoint of a Streamable HTTP server.
        headers: Extra HTTP headers (for example ``Authorization``).
        enabled: Whether the owner should connect at all; `open_connection`
            refuses a disabled config.
        call_timeout: Default deadline of one request (tool call, listing,
            read), in seconds. A server that does not answer in time is
            treated as hung for that request.
        connect_timeout: Deadline for start-up: spawning or connecting, the
            initialize handshake and the first tools/list, in seconds. Time
            spent waiting for a person to authorize (``auth``, browser mode)
            does not count.
        ping_timeout: How long the server has to answer a ``ping``, in
            seconds. It is pinged when a request times out and every
            ``ping_interval`` seconds, idle or not; a server
            that does not answer in time is not responding (hung), and its
            connection is closed so that its owner can restart it. A slow
            tool on a server that answers pings only times out.
        ping_interval: Seconds between pings, idle or not, so that a hung
            server is found (and restarted) before anyone calls it.
        auth: OAuth for an HTTP server that requires it (`OAuthConfig`); a
            mapping is accepted too. None: no OAuth (static ``headers`` only).
        sampling: What to do when the server asks the client's model for a
            completion (``sampling/createMessage``): ``ask`` the person
            driving the calling agent each time, ``allow`` without asking,
            or ``deny`` (the capability is not declared).
        log_level: The ``logging/setLevel`` sent after the handshake to a
            server with the logging capability (``debug``, ``info``,
            ``notice``, ``warning``, ``error``, ``critical``, ``alert``,
            ``emergency``); None leaves the server's default.
        environ: Where the ``${NAME}`` and ``${NAME:-default}`` in
            ``command``, ``args``, ``env``, ``url`` and ``headers`` take their
            values (see `resolved`): the daemon captures the variables a
            config uses when it starts. None: the daemon's environment at connect time
            (`weald.runtime.environ_value`, which still holds scrubbed secrets).
        launcher: Wraps a stdio server's command line when it starts (the
            daemon runs a project's own servers in the shell's OS sandbox
            this way); None runs it as given.

    The values stay as written (``${GITHUB_TOKEN}``, not the token) in the
    config and everything that shows it; they are expanded only to connect.
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_str_mapping, hash=False)
    cwd: str | None = attrs.field(default=None, converter=_optional_path)
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_str_mapping, hash=False)
    enabled: bool = True
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    ping_timeout: float = DEFAULT_PING_TIMEOUT
    ping_interval: float = DEFAULT_PING_INTERVAL
    auth: OAuthConfig | None = attrs.field(default=None, converter=_auth)
    sampling: Literal["ask", "allow", "deny"] = "ask"
    log_level: str | None = None
    environ: Mapping[str, str] | None = attrs.field(default=None, eq=False, hash=False, repr=False)
    launcher: StdioLauncher | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        problems = self._problems()
        if problems:
            label = repr(self.name) if isinstance(self.name, str) and self.name else "<unnamed>"
            raise MCPConfigError(
                f"invalid MCP server config {label}: " + "; ".join(problems),
                server=self.name if isinstance(self.name, str) else None,
            )

    def variables(self) -> list[str]:
        """The environment variables the config's ``${...}`` use, each once, in order."""
        texts = [self.command or "", *self.args, *self.env.values(), self.url or "", *self.headers.values()]
        names: list[str] = []
        for text in texts:
            for name in referenced_variables(text):
                if name not in names:
                    names.append(name)
        return names

    def resolved(self) -> ServerConfig:
        """A copy with every ``${...}`` expanded from `environ` (or the daemon's environment).

        The values of secret-looking variables, and of ``env`` and
        ``headers`` entries with secret-looking names, are registered as
        secrets, so no output shows them.

        Raises:
            MCPConfigError: A variable without a default is not set; the
                message names the field and the variable.
        """
        if not self.variables():
            return self
        # Without a captured environment, read each variable as the daemon started with it:
        # a secret the daemon scrubbed from os.environ is still there (environ_value).
        environ = self.environ
        if environ is None:
            environ = {name: value for name in self.variables() if (value := environ_value(name)) is not None}

        def expand(field: str, text: str) -> str:
            try:
                value = expand_variables(text, environ)
            except _Unset as exc:
                name = exc.args[0]
                raise MCPConfigError(
                    f"MCP server {self.name!r}: {field} uses ${{{name}}}, which is not set in the daemon's "
                    f"environment; set it where the daemon starts, or give a default (${{{name}:-value}})",
                    server=self.name,
                ) from None
            return value

        for name in self.variables():
            if is_secret_env_name(name) and environ.get(name):
                register_secret(environ[name])
        on_command_line = [self.command or "", *self.args]
        for field, text in zip(
            ["command", *(f"args[{n}]" for n in range(len(self.args)))], on_command_line, strict=True
        ):
            for name in referenced_variables(text):
                value = environ.get(name) or ""
                if value and (is_known_secret(value) or is_secret_value(value)):
                    raise MCPConfigError(
                        f"MCP server {self.name!r}: {field} uses ${{{name}}}, whose value is a secret, "
                        f"{_ON_THE_COMMAND_LINE}",
                        server=self.name,
                    )
        env = {key: expand(f"env.{key}", value) for key, value in self.env.items()}
        headers = {key: expand(f"headers.{key}", value) for key, value in self.headers.items()}
        for key, value in [*env.items(), *headers.items()]:
            if is_secret_name(key) and value != (self.env.get(key) or self.headers.get(key)):
                for secret in {value, *value.split()}:
                    register_secret(secret)
        return attrs.evolve(
            self,
            command=None if self.command is None else expand("command", self.command),
            args=[expand(f"args[{n}]", arg) for n, arg in enumerate(self.args)],
            env=env,
            url=None if self.url is None else expand("url", self.url),
            headers=headers,
        )

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """``"stdio"`` when the config has a ``command``, else ``"http"``."""
        return "stdio" if self.command is not None else "http"

    def _problems(self) -> list[str]:
        problems: list[str] = []
        if not isinstance(self.name, str) or not self.name.strip():
            problems.append("name must be a non-empty string")
        if self.command is None and self.url is None:
            problems.append("give either command (stdio) or url (Streamable HTTP)")
        if self.command is not None and self.url is not None:
            problems.append("give either command (stdio) or url (Streamable HTTP), not both")
        if self.command is not None and (not isinstance(self.command, str) or not self.command):
            problems.append("command must be a non-empty string")
        if any(not isinstance(arg, str) for arg in self.args):
            problems.append("args must all be strings")
        problems.extend(_mapping_problems("env", self.env))
        problems.extend(_mapping_problems("headers", self.headers))
        problems.extend(self._variable_problems())
        problems.extend(self._command_line_problems())
        if self.url is not None:
            if "${" not in str(self.url):  # checked once expanded, by `resolved`
                problems.extend(_url_problems(self.url))
            if self.args or self.env or self.cwd is not None:
                problems.append("args, env and cwd apply to stdio servers only")
        if self.command is not None and self.headers:
            problems.append("headers apply to HTTP servers only")
        if self.auth is not None:
            if self.command is not None:
                problems.append("auth applies to HTTP servers only")
            if any(name.lower() == "authorization" for name in self.headers):
                problems.append("give either an Authorization header or auth, not both")
            problems.extend(f"auth.{problem}" for problem in self.auth.problems())
        if not isinstance(self.enabled, bool):
            problems.append("enabled must be true or false")
        if self.sampling not in SAMPLING_POLICIES:
            problems.append(f"sampling must be one of {', '.join(SAMPLING_POLICIES)}, not {self.sampling!r}")
        if self.log_level is not None and self.log_level not in LOG_LEVELS:
            problems.append(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        for field in ("call_timeout", "connect_timeout", "ping_timeout", "ping_interval"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                problems.append(f"{field} must be a positive number of seconds, not {value!r}")
        return problems

    def _command_line_problems(self) -> list[str]:
        """A secret in ``command`` or ``args``, written out or as the ``${VARIABLE}`` of one: refused."""
        texts = {"command": self.command, **{f"args[{n}]": arg for n, arg in enumerate(self.args)}}
        problems: list[str] = []
        for field, text in texts.items():
            if not isinstance(text, str):
                continue
            try:
                secret = [name for name in referenced_variables(text) if is_secret_env_name(name)]
            except ValueError:
                continue  # `_variable_problems` reports it
            if secret:
                problems.append(f"{field} uses ${{{secret[0]}}}, a secret, {_ON_THE_COMMAND_LINE}")
            elif "${" not in text and is_secret_value(text):
                problems.append(f"{field} holds a secret, {_ON_THE_COMMAND_LINE}")
        return problems

    def _variable_problems(self) -> list[str]:
        texts = {"command": self.command, "url": self.url}
        texts.update({f"args[{n}]": arg for n, arg in enumerate(self.args)})
        texts.update({f"env.{k}": v for k, v in self.env.items()})
        texts.update({f"headers.{k}": v for k, v in self.headers.items()})
        problems: list[str] = []
        for field, text in texts.items():
            if isinstance(text, str):
                try:
                    referenced_variables(text)
                except ValueError as exc:
                    problems.append(f"{field}: {exc}")
        return problems


_ON_THE_COMMAND_LINE: Final = (
    "and every user of this machine can read a process's command line (/proc/PID/cmdline): "
    "give it to the server in env instead"
)


def _mapping_problems(field: str, mapping: Mapping[str, str]) -> list[str]:
    bad = [k for k, v in mapping.items() if not isinstance(k, str) or not isinstance(v, str)]
    return [f"{field} keys and values must be strings ({bad[0]!r})"] if bad else []


def _url_problems(url: object) -> list[str]:
    if not isinstance(url, str):
        return ["url must be a string"]
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return [f"url must be an absolute http:// or https:// URL, not {url!r}"]
    return []
