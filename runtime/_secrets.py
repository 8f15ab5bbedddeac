"""Keeping secrets out of every output: events, snapshots, histories, logs.

Two nets:

- values stored under secret-looking keys (``api_key``, ``Authorization``,
  ``auth_token``, ``password``...) are replaced by ``[redacted]``;
- known secret values (registered with `register_secret`, and the values of
  environment variables whose names look secret or that are URLs carrying a
  password, read by `refresh_from_env`) are cut out of every string,
  wherever they appear.

A name looks secret when it matches one of the usual spellings
(``api-key``, ``apikey``, ``access_token``...) or when one of its
``_``-separated words (case-insensitive, trailing digits ignored) is a
secret word: ``GITHUB_PAT``, ``GH_TOKEN_2``, ``DB_PASS``, ``CI_JOB_JWT``.
Whole words, never substrings: ``PATH``, ``KEYBOARD`` and ``PASSTHROUGH``
are not secret. Environment variables are judged a little more strictly than
the keys of weald's own data (`is_secret_env_name`).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "is_known_secret",
    "is_secret_env_name",
    "is_secret_env_value",
    "is_secret_name",
    "redact",
    "redact_text",
    "refresh_from_env",
    "register_secret",
    "sanitized_env",
]

REDACTED = "[redacted]"

_SECRET_NAME = re.compile(
    r"(api[-_]?key|apikey|authorization|auth[-_]?token|access[-_]?token|refresh[-_]?token|"
    r"secret|password|passwd|credential|cookie|private[-_]?key|[-_]token$|[-_]key$)",
    re.IGNORECASE,
)
_MIN_SECRET_LEN = 8

# Words that make a compound name secret (``DB_PASS``, ``sentry_dsn``).
_SECRET_WORDS = frozenset(
    {
        "auth",
        "cookie",
        "credential",
        "credentials",
        "dsn",
        "jwt",
        "key",
        "pass",
        "passwd",
        "password",
        "pat",
        "secret",
        "secrets",
        "token",
    },
)
# A name ending in one of these names where a secret lives, not the secret:
# ``SSH_AUTH_SOCK`` is the agent's socket path, which git over ssh needs.
_LOCATION_WORDS = frozenset({"sock", "socket"})

# ``scheme://user:password@host``: a URL that carries a password (user may be empty).
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@")

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def _words(name: str) -> list[str]:
    """The ``_``-separated words of ``name``, lower-cased, trailing digits cut, empty ones dropped."""
    words = (part.lower().rstrip("0123456789") for part in name.split("_"))
    return [word for word in words if word]


def is_secret_name(name: str) -> bool:
    """Return True if a key or variable name looks like it holds a secret.

    A bare word (``key``, ``token``) is not enough on its own: in weald's
    data it names a field (a memory note's key), not a credential.
    """
    if _SECRET_NAME.search(name) is not None:
        return True
    words = _words(name)
    return len(words) > 1 and words[-1] not in _LOCATION_WORDS and not _SECRET_WORDS.isdisjoint(words)


def is_secret_env_name(name: str) -> bool:
    """Return True if an environment variable's name looks like it holds a secret.

    Stricter than `is_secret_name`: a bare ``TOKEN`` or ``PAT`` counts.
    Session ids and bus addresses (``XDG_SESSION_ID``,
    ``DBUS_SESSION_BUS_ADDRESS``) and socket paths (``SSH_AUTH_SOCK``) are
    not secrets and stay.
    """
    words = _words(name)
    return is_secret_name(name) or (len(words) == 1 and words[0] in _SECRET_WORDS)


def is_secret_env_value(value: str) -> bool:
    """Return True if an environment variable's value carries a credential: a URL with a password."""
    return "://" in value and _URL_WITH_PASSWORD.search(value) is not None


def register_secret(value: str) -> None:
    """Make sure ``value`` never appears in any output weald produces."""
    global _pattern
    if len(value) < _MIN_SECRET_LEN:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        # Longest first, so a secret containing another is cut whole.
        alternatives = sorted(_secrets, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(s) for s in alternatives))


def refresh_from_env(environ: Mapping[str, str] | None = None) -> None:
    """Register the values of secret-looking environment variables (by name, or URLs with a password)."""
    env = os.environ if environ is None else environ
    for name, value in env.items():
        if is_secret_env_name(name) or is_secret_env_value(value):
            register_secret(value)


def redact_text(text: str) -> str:
    """Cut every known secret value out of ``text``."""
    pattern = _pattern
    if pattern is None:
        return text
    return pattern.sub(REDACTED, text)


def redact(value: Any) -> Any:
    """Return a copy of plain data with secrets removed (keys and known values)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if isinstance(k, str) and is_secret_name(k) and v else redact(v)) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def is_known_secret(value: str) -> bool:
    """True if ``value`` is a secret registered with `register_secret`."""
    return value in _secrets


def sanitized_env(environ: Mapping[str, str] | None = None, keep: tuple[str, ...] = ()) -> dict[str, str]:
    """Return a copy of the environment without secrets.

    A variable goes if its name looks secret (`is_secret_env_name`), if its
    value is a URL carrying a password (``postgres://u:pw@db/x``), or if its
    value is a known secret (a key in a variable named in config, whatever
    its name).

    Args:
        environ: the environment to clean (``os.environ`` by default).
        keep: names to keep even though they look secret.
    """
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k in keep or not _is_secret_variable(k, v)}


def _is_secret_variable(name: str, value: str) -> bool:
    return is_secret_env_name(name) or is_secret_env_value(value) or value in _secrets


refresh_from_env()
