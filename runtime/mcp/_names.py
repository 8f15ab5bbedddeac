"""Registered tool names: ``mcp__<server>__<tool>``, safe for every model API."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable

__all__ = ["sanitize_tool_name"]

# Model APIs accept tool names matching ^[A-Za-z0-9_-]{1,64}$ (Anthropic and
# OpenAI alike), so a registered name is held to that.
MAX_NAME_LENGTH = 64
_PREFIX = "mcp__"
_SEPARATOR = "__"
_DISALLOWED = re.compile(r"[^A-Za-z0-9_-]")
_DIGEST_LENGTH = 8


def _clean(part: str) -> str:
    return _DISALLOWED.sub("_", part) or "_"


def _digest(server: str, tool: str, attempt: int) -> str:
    seed = f"{server}\0{tool}\0{attempt}".encode()
    return hashlib.sha256(seed).hexdigest()[:_DIGEST_LENGTH]


def sanitize_tool_name(server: str, tool: str, *, taken: Collection[str] = ()) -> str:
    """Return the name under which a server's tool is offered to the model.

    The name is ``mcp__<server>__<tool>`` with every character other than an
    ASCII letter, digit, ``_`` or ``-`` replaced by ``_``. When that name is
    longer than 64 characters, or is already in ``taken``, it is cut down and
    given a suffix made from a hash of the *original* server and tool names,
    so the result depends only on the arguments: the same inputs always give
    the same name.

    Args:
        server: The server's configured name.
        tool: The tool's name as the server reports it.
        taken: Registered names already in use (for example by other
            servers' tools); the result is never one of them.

    Returns:
        A name matching ``^[A-Za-z0-9_-]{1,64}$`` and not in ``taken``.
    """
    base = f"{_PREFIX}{_clean(server)}{_SEPARATOR}{_clean(tool)}"
    if len(base) <= MAX_NAME_LENGTH and base not in taken:
        return base
    attempt = 0
    while True:
        suffix = "_" + _digest(server, tool, attempt)
        candidate = base[: MAX_NAME_LENGTH - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        attempt += 1


def register_tool_names(server: str, tools: Iterable[str]) -> dict[str, str]:
    """Map each of one server's tool names to its registered name.

    Deterministic and independent of the order the server lists its tools
    in: names that survive sanitising unchanged are placed first (tool names
    are unique on one server, so they cannot collide with each other), then
    the names sanitising changed, in sorted order, each avoiding every name
    placed before it. So ``a_b`` always keeps ``mcp__s__a_b`` and a sibling
    ``a.b`` gets the hashed suffix.

    Args:
        server: The server's configured name.
        tools: The server's tool names.

    Returns:
        Tool name -> registered name, with distinct values.
    """
    names = sorted(set(tools))
    exact = [name for name in names if _clean(name) == name]
    lossy = [name for name in names if _clean(name) != name]
    registered: dict[str, str] = {}
    taken: set[str] = set()
    for name in exact + lossy:
        registered[name] = sanitize_tool_name(server, name, taken=taken)
        taken.add(registered[name])
    return registered
