"""Keeping secrets out of every output: events, snapshots, histories, logs.

Two nets:

- values stored under secret-looking keys (``api_key``, ``Authorization``,
  ``auth_token``, ``password``...) are replaced by ``[redacted]``;
- known secret values (registered with `register_secret`, and the values of
  environment variables whose names look secret or that are URLs carrying a
  password, read by `refresh_from_env`) are cut out of every string,
  wherever they appear.

And one wall: `scrub_environ` takes every such variable out of the
process's environment, where anything it spawns (or anything that may read
``/proc/<pid>/environ``) would find it, and keeps the values in memory;
`environ_value` is how the code that needs one (a provider's API key, an
MCP server's OAuth secret, a variable ``env_keep`` passes on) reads it.

A name looks secret when it matches one of the usual spellings
(``api-key``, ``apikey``, ``access_token``, ``*webhook*``,
``*credential*``...) or when one of its ``_``-separated words
(case-insensitive, trailing digits ignored) is a secret word:
``GITHUB_PAT``, ``GH_TOKEN_2``, ``DB_PASS``, ``CI_JOB_JWT``, ``STRIPE_SK``,
``SENTRY_DSN``, ``SSHPASS``, ``BEARER``. Whole words, never substrings:
``PATH``, ``KEYBOARD``, ``DISK`` and ``PASSTHROUGH`` are not secret.
Environment variables are judged a little more strictly than the keys of
weald's own data (`is_secret_env_name`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "environ_value",
    "is_known_secret",
    "is_secret_env_name",
    "is_secret_env_value",
    "is_secret_name",
    "is_secret_value",
    "redact",
    "redact_secret_values",
    "redact_text",
    "refresh_from_env",
    "register_secret",
    "restore_environ",
    "sanitized_env",
    "scrub_environ",
]

REDACTED = "[redacted]"

_SECRET_NAME = re.compile(
    r"(api[-_]?key|apikey|authorization|auth[-_]?token|access[-_]?token|refresh[-_]?token|"
    r"secret|password|passwd|credential|cookie|private[-_]?key|webhook|conn(ection)?[-_]?str(ing)?|"
    r"[-_]token$|[-_]key$)",
    re.IGNORECASE,
)
_MIN_SECRET_LEN = 8

# Words that make a compound name secret (``DB_PASS``, ``sentry_dsn``).
_SECRET_WORDS = frozenset(
    {
        "auth",
        "bearer",
        "cookie",
        "credential",
        "credentials",
        "dsn",
        "jwt",
        "key",
        "pass",
        "passphrase",
        "passwd",
        "password",
        "pat",
        "secret",
        "secrets",
        "sk",
        "sshpass",
        "token",
    },
)
# Secret words only inside a compound name: ``MYSQL_PWD`` is a password,
# ``PWD`` alone is the working directory.
_COMPOUND_SECRET_WORDS = frozenset({"pwd"})
# A name ending in one of these names where a secret lives, not the secret:
# ``SSH_AUTH_SOCK`` is the agent's socket path, which git over ssh needs.
_LOCATION_WORDS = frozenset({"sock", "socket"})

# ``scheme://user:password@host``: a URL that carries a password (user may be empty).
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@")
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:)([^/?#@\s]+)(@)")
# Credentials known by their shape: the prefixes providers give their keys and
# tokens (Anthropic and OpenAI ``sk-``, GitHub ``ghp_``/``github_pat_``, GitLab
# ``glpat-``, Slack ``xox*-``, AWS access key ids ``AKIA``/``ASIA``, Google
# ``AIza``, Hugging Face ``hf_``, npm, PyPI, Stripe, SendGrid), and JWTs.
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
    r"glpat-[A-Za-z0-9_-]{16,}|xox[abeoprs]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[A-Z0-9]{16}|"
    r"AIza[0-9A-Za-z_-]{35}|hf_[A-Za-z0-9]{20,}|npm_[A-Za-z0-9]{30,}|pypi-[A-Za-z0-9_-]{40,}|"
    r"[rs]k_(?:live|test)_[A-Za-z0-9]{16,}|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}|"
    r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
    r")"
)

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
    if len(words) < 2 or words[-1] in _LOCATION_WORDS:
        return False
    return not (_SECRET_WORDS.isdisjoint(words) and _COMPOUND_SECRET_WORDS.isdisjoint(words))


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


def is_secret_value(value: str) -> bool:
    """Return True if ``value`` carries a credential by its shape, whatever it is named.

    A URL with a password (``postgres://u:pw@db/x``), or a token with a
    known prefix (``sk-ant-...``, ``ghp_...``, ``xoxb-...``, ``AKIA...``).
    """
    return is_secret_env_value(value) or _TOKEN_SHAPES.search(value) is not None


def redact_secret_values(text: str) -> str:
    """``text`` with every credential known by its shape (`is_secret_value`) cut out, and known secrets too.

    A URL keeps its scheme, user and host (``postgres://u:[redacted]@db/x``);
    a token is replaced whole.
    """
    text = redact_text(text)
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


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
        environ: the environment to clean (``os.environ`` by default, with
            the variables `scrub_environ` took out of it for ``keep``).
        keep: names to keep even though they look secret.
    """
    env = os.environ if environ is None else environ
    clean = {k: v for k, v in env.items() if k in keep or not _is_secret_variable(k, v)}
    if environ is None:
        # A variable kept on purpose may have been scrubbed from os.environ.
        with _lock:
            clean.update({name: _kept[name] for name in keep if name not in clean and name in _kept})
    return clean


def _is_secret_variable(name: str, value: str) -> bool:
    return is_secret_env_name(name) or is_secret_env_value(value) or value in _secrets


# -- the scrubbed environment ------------------------------------------------------------------

# What `scrub_environ` took out of os.environ, by name; restored by `restore_environ`.
# Invariant: a name is in _kept only while it is absent from os.environ
# because of a scrub (a variable set again later wins: `environ_value`
# reads os.environ first).
_kept: dict[str, str] = {}
_scrubs = 0  # scrubs not yet undone by restore_environ

# PR_SET_DUMPABLE: a process that is not dumpable cannot be ptraced or have
# its /proc/<pid>/mem and environ read by other processes of its user.
_PR_SET_DUMPABLE = 4


def environ_value(name: str) -> str | None:
    """The value of environment variable ``name`` as this process started with it.

    ``os.environ`` first, then the secrets `scrub_environ` took out of it.
    Code that reads a secret the configuration names (``api_key_env``, an
    MCP server's ``client_secret_env``) reads it here, never from
    ``os.environ`` directly.

    Returns:
        The value, or None when it is not set.
    """
    value = os.environ.get(name)
    if value is not None:
        return value
    with _lock:
        return _kept.get(name)


def scrub_environ() -> list[str]:
    """Take every secret-looking variable out of this process's environment; keep the values in memory.

    A variable goes when `sanitized_env` would drop it: its name looks
    secret, its value is a URL carrying a password, or its value is a
    registered secret. Each value is registered as a secret (never printed)
    and stays readable through `environ_value`. Then:

    - ``os.environ`` (and so the environment of every process spawned
      without an explicit ``env``) no longer has them;
    - the entries are zeroed in the process's initial environment block,
      which is what ``/proc/<pid>/environ`` shows (unsetting a variable
      does not change that block);
    - the process is made non-dumpable (Linux), so processes of the same
      user can neither ptrace it nor read its memory through ``/proc``.

    Call it once at daemon start, before anything is spawned; undo it with
    `restore_environ` (for a daemon hosted inside another program, such as
    a test). Idempotent apart from that.

    Returns:
        The names removed, sorted.
    """
    global _scrubs
    removed: dict[str, str] = {}
    for name, value in list(os.environ.items()):
        if _is_secret_variable(name, value):
            register_secret(value)
            removed[name] = value
            with contextlib.suppress(KeyError):
                del os.environ[name]
    with _lock:
        _kept.update(removed)
        _scrubs += 1
    _forget_posix_copy(removed)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        _wipe_initial_environ({name.encode("utf-8", "surrogateescape") for name in removed})
    _set_dumpable(False)
    return sorted(removed)


def restore_environ() -> None:
    """Undo `scrub_environ`: put the scrubbed variables back (unless set again meanwhile).

    The process's initial environment block stays wiped. Once every scrub
    has been undone, the process is dumpable again.
    """
    global _scrubs
    with _lock:
        _scrubs = max(0, _scrubs - 1)
        if _scrubs:
            return
        kept = dict(_kept)
        _kept.clear()
    for name, value in kept.items():
        os.environ.setdefault(name, value)
    _set_dumpable(True)


def _forget_posix_copy(removed: Mapping[str, str]) -> None:
    """Drop the copy CPython keeps of the start-up environment (``posix.environ``) too."""
    try:
        import posix
    except ImportError:  # not a POSIX system
        return
    table: dict[bytes, bytes] = posix.environ
    for name in removed:
        table.pop(name.encode("utf-8", "surrogateescape"), None)


def _wipe_initial_environ(names: set[bytes]) -> int:
    """Zero the ``NAME=value`` entries of ``names`` in the environment block the kernel shows as environ.

    The block lies between ``env_start`` and ``env_end`` (fields 50 and 51
    of ``/proc/self/stat``, Linux 3.5+) on the main thread's stack; nothing
    points into a wiped entry any more once the variable is unset.

    Returns:
        How many entries were wiped.
    """
    if not names:
        return 0
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    # After "pid (comm)", the fields start at field 3 (state): field N is index N - 3.
    fields = stat.rpartition(b")")[2].split()
    start, end = int(fields[47]), int(fields[48])
    if not 0 < start < end:
        return 0
    block = ctypes.string_at(start, end - start)
    wiped = 0
    offset = 0
    for entry in block.split(b"\0"):
        if entry.partition(b"=")[0] in names:
            ctypes.memset(start + offset, 0, len(entry))
            wiped += 1
        offset += len(entry) + 1
    return wiped


def _set_dumpable(dumpable: bool) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, int(dumpable), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: nothing to do
        pass


refresh_from_env()
