"""Configuration of one MCP server connection."""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Mapping
from typing import Literal

import attrs

from ._exceptions import MCPConfigError

__all__ = ["ServerConfig"]

DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 30.0


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
            initialize handshake and the first tools/list, in seconds.
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

    def __attrs_post_init__(self) -> None:
        problems = self._problems()
        if problems:
            label = repr(self.name) if isinstance(self.name, str) and self.name else "<unnamed>"
            raise MCPConfigError(
                f"invalid MCP server config {label}: " + "; ".join(problems),
                server=self.name if isinstance(self.name, str) else None,
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
        if self.url is not None:
            problems.extend(_url_problems(self.url))
            if self.args or self.env or self.cwd is not None:
                problems.append("args, env and cwd apply to stdio servers only")
        if self.command is not None and self.headers:
            problems.append("headers apply to HTTP servers only")
        if not isinstance(self.enabled, bool):
            problems.append("enabled must be true or false")
        for field in ("call_timeout", "connect_timeout"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                problems.append(f"{field} must be a positive number of seconds, not {value!r}")
        return problems


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
