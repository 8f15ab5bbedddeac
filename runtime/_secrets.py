"""Keeping secrets out of every output: events, snapshots, histories, logs.

Two nets:

- values stored under secret-looking keys (``api_key``, ``Authorization``,
  ``token``, ``password``...) are replaced by ``[redacted]``;
- known secret values (registered with `register_secret`, and the values of
  environment variables whose names look secret, read by `refresh_from_env`)
  are cut out of every string, wherever they appear.
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

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def is_secret_name(name: str) -> bool:
    """Return True if a key or variable name looks like it holds a secret."""
    return _SECRET_NAME.search(name) is not None


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
    """Register the values of secret-looking environment variables."""
    env = os.environ if environ is None else environ
    for name, value in env.items():
        if is_secret_name(name):
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

    A variable goes if its name looks secret, or if its value is a known
    secret (a key in a variable named in config, whatever its name).

    Args:
        environ: the environment to clean (``os.environ`` by default).
        keep: names to keep even though they look secret.
    """
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k in keep or not (is_secret_name(k) or v in _secrets)}


refresh_from_env()
