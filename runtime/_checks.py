"""Checks on plain values (from TOML, JSON or a dict) and the problems they report, each with its key path.

A check is a cattrs structure hook ``(value, type) -> value`` that raises a `ValueProblem`; wrapped by
`checked`, the same check is an attrs validator, so a class built by hand cannot hold a value the file
could not. The configuration (``weald.toml``) and fault specs are both structured through these, and
`walk_problems` turns what cattrs raises into one ``(path, message)`` per bad value.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeVar

import attrs
from cattrs import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from weald.runtime._secrets import redact_text

__all__ = [
    "CHECK",
    "InvalidValue",
    "KeyPath",
    "UnknownKeyMessage",
    "ValueProblem",
    "ValueProblems",
    "check_bool",
    "check_fraction",
    "check_integer",
    "check_nonnegative_int",
    "check_nonnegative_seconds",
    "check_number",
    "check_positive_int",
    "check_seconds",
    "check_str_table",
    "check_str_tuple",
    "check_string",
    "checked",
    "checked_factory",
    "describe_value",
    "format_path",
    "optional",
    "unknown_key_message",
    "walk_problems",
]

_T = TypeVar("_T")

#: A key path into nested tables and arrays: ``("tools", "shell", "timeout")``, ``("args", 1)``.
KeyPath = tuple[str | int, ...]
#: Builds the message for a key a class does not take: (class, path of the table, key) -> message.
UnknownKeyMessage = Callable[[type, KeyPath, str], str]

#: The attrs metadata key under which a field keeps its value check.
CHECK: Final = "weald.config.check"

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


# --- Problems found in a value ------------------------------------------------------------------


class ValueProblem(Exception):
    """One thing wrong with one value; its path is added by whoever walks the tree."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidValue(ValueProblem):
    """A value of the wrong type or out of range: ``expected <expected>, got <value>``."""

    def __init__(self, expected: str, value: object) -> None:
        super().__init__(f"expected {expected}, got {describe_value(value)}")
        self.expected = expected
        self.value = value


class ValueProblems(ValueProblem):
    """Several problems below one value, each at a path relative to it."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], BaseException]]) -> None:
        super().__init__(f"{len(problems)} problem(s)")
        self.problems = problems


_MAX_SHOWN = 60


def describe_value(value: object) -> str:
    """A value as the TOML file spells it, shortened: ``"abc"``, ``true``, ``3.5``, ``a table``."""
    if isinstance(value, str):
        value = redact_text(value)  # a known secret (from the environment) is never echoed
        shown = value if len(value) <= _MAX_SHOWN else value[: _MAX_SHOWN - 3] + "..."
        # A TOML basic string: double quotes, backslash escapes.
        escaped = shown.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        return f'"{escaped}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


# --- Value checks: each is a structure hook (value, type) -> value and, wrapped, a validator ----


def check_number(value: object, _type: object = None) -> float:
    """A TOML integer or float (not a boolean), as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValue("a number", value)
    return float(value)


def check_seconds(value: object, _type: object = None) -> float:
    """A positive, finite number of seconds."""
    number = check_number(value)
    if not math.isfinite(number) or number <= 0:
        raise InvalidValue("a positive number of seconds", value)
    return number


def check_nonnegative_seconds(value: object, _type: object = None) -> float:
    """A finite number of seconds, zero or more."""
    number = check_number(value)
    if not math.isfinite(number) or number < 0:
        raise InvalidValue("a number of seconds, zero or more", value)
    return number


def check_integer(value: object, _type: object = None) -> int:
    """A TOML integer (not a boolean, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue("an integer", value)
    return value


def check_positive_int(value: object, _type: object = None) -> int:
    """An integer greater than zero."""
    number = check_integer(value)
    if number <= 0:
        raise InvalidValue("a positive integer", value)
    return number


def check_nonnegative_int(value: object, _type: object = None) -> int:
    """An integer, zero or more."""
    number = check_integer(value)
    if number < 0:
        raise InvalidValue("an integer, zero or more", value)
    return number


def check_fraction(value: object, _type: object = None) -> float:
    """A number strictly between 0 and 1."""
    number = check_number(value)
    if not 0 < number < 1:
        raise InvalidValue("a number between 0 and 1", value)
    return number


def check_bool(value: object, _type: object = None) -> bool:
    """``true`` or ``false``."""
    if not isinstance(value, bool):
        raise InvalidValue("true or false", value)
    return value


def check_string(value: object, _type: object = None) -> str:
    """Any string."""
    if not isinstance(value, str):
        raise InvalidValue("a string", value)
    return value


def check_str_tuple(value: object, _type: object = None) -> tuple[str, ...]:
    """An array of strings, as a tuple."""
    if not isinstance(value, list | tuple):
        raise InvalidValue("an array of strings", value)
    problems: list[tuple[tuple[str | int, ...], BaseException]] = [
        ((index,), InvalidValue("a string", item)) for index, item in enumerate(value) if not isinstance(item, str)
    ]
    if problems:
        raise ValueProblems(problems)
    return tuple(value)


def check_str_table(value: object, _type: object = None) -> dict[str, str]:
    """A table of strings."""
    if not isinstance(value, Mapping):
        raise InvalidValue("a table of strings", value)
    problems: list[tuple[tuple[str | int, ...], BaseException]] = [
        ((key,), InvalidValue("a string", item)) for key, item in value.items() if not isinstance(item, str)
    ]
    if problems:
        raise ValueProblems(problems)
    return dict(value)


def optional(check: Callable[[object, object], _T]) -> Callable[[object, object], _T | None]:
    """The check, letting None through (from `config_from_dict`; TOML has no null)."""

    def check_optional(value: object, type_: object = None) -> _T | None:
        return None if value is None else check(value, type_)

    check_optional.__doc__ = check.__doc__
    return check_optional


def _validator(check: Callable[[object, object], object]) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def validate(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        try:
            check(value, None)
        except ValueProblem as exc:
            raise ValueError(f"{attribute.name}: {exc.message}") from None

    return validate


def checked(default: Any, check: Callable[[object, object], object]) -> Any:
    """An attrs field with a default, checked when structured and when built by hand."""
    return attrs.field(default=default, validator=_validator(check), metadata={CHECK: check})


def checked_factory(factory: Callable[[], Any], check: Callable[[object, object], object]) -> Any:
    """Like `checked`, with a default factory (for tables and arrays)."""
    return attrs.field(
        factory=factory,
        validator=_validator(check),
        metadata={CHECK: check},
        hash=False,
    )


# --- Reporting -----------------------------------------------------------------------------------


def format_path(path: KeyPath) -> str:
    """A key path as TOML spells it: ``tools.permissions.shell."git status*"``, ``mcp.servers.x.args[1]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
            continue
        key = part if _BARE_KEY.fullmatch(part) else '"' + part.replace("\\", "\\\\").replace('"', '\\"') + '"'
        text += f".{key}" if text else key
    return text


def unknown_key_message(cls: type, _path: KeyPath, key: str) -> str:
    """The default message for a key that ``cls`` does not take: the closest known key, or all of them."""
    known = sorted(field.name for field in attrs.fields(cls))
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key; did you mean {close[0]}?"
    return f"unknown key; expected one of: {', '.join(known)}"


def walk_problems(
    exc: BaseException, path: KeyPath = (), *, unknown_key: UnknownKeyMessage = unknown_key_message
) -> Iterator[tuple[KeyPath, str]]:
    """Every problem in a cattrs structuring error, as (key path, message), in the input's order.

    Args:
        exc: What structuring raised.
        path: Where the structured value sits.
        unknown_key: The message for a key the class does not take (given the class, its path and the key).
    """
    if isinstance(exc, ClassValidationError):
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            yield from walk_problems(sub, (*path, note.name), unknown_key=unknown_key)
        for sub in without:
            yield from walk_problems(sub, path, unknown_key=unknown_key)
    elif isinstance(exc, IterableValidationError):
        with_index, without_index = exc.group_exceptions()
        for item, index_note in with_index:
            yield from walk_problems(item, (*path, index_note.index), unknown_key=unknown_key)
        for item in without_index:
            yield from walk_problems(item, path, unknown_key=unknown_key)
    elif isinstance(exc, ValueProblems):
        for relative, problem in exc.problems:
            yield from walk_problems(problem, (*path, *relative), unknown_key=unknown_key)
    elif isinstance(exc, ForbiddenExtraKeysError):
        for key in sorted(exc.extra_fields):
            yield (*path, key), unknown_key(exc.cl, path, key)
    elif isinstance(exc, ValueProblem):
        yield path, exc.message
    else:
        # Not one of ours: a bug in a hook or a check; say what it was rather than hide it.
        yield path, f"invalid value ({type(exc).__name__}: {exc})"
