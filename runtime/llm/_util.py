"""Small helpers shared by the providers."""

from __future__ import annotations

__all__ = ["excerpt", "redact"]

# How much of a bad payload an error message quotes.
_EXCERPT_CHARS = 200


def excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """Return ``text`` as a repr, cut to ``limit`` characters and marked when cut."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f" ... ({len(text)} characters)"


def redact(text: str, secret: str | None) -> str:
    """Return ``text`` with every occurrence of ``secret`` replaced.

    Servers sometimes echo the API key they refused; nothing a server says
    reaches an error message without passing through here first.
    """
    if not secret:
        return text
    return text.replace(secret, "[redacted]")
