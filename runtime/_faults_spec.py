"""Fault declarations: the frozen attrs classes a fault file is structured into, and the parser.

A fault file (TOML or JSON) holds an optional ``seed`` and an array of
``faults``; each fault is a table whose ``target`` (``actor``, ``tool``,
``mcp`` or ``provider``) picks its class and whose ``kind`` says what it does.
The one cattrs converter here structures them strictly: a wrong type is an
error, never a coercion, and every problem in a file is reported at once with
its key path (``faults[2].nth: expected a positive integer, got 0``), as
``weald.toml`` problems are. The same checks are the fields' attrs
validators, so a declaration built by hand cannot hold what a file could not.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

import attrs
from cattrs import BaseValidationError
from cattrs.gen import make_dict_structure_fn, override
from cattrs.preconf.msgspec import make_converter
from weald.runtime._checks import (
    CHECK,
    InvalidValue,
    KeyPath,
    ValueProblem,
    ValueProblems,
    check_integer,
    check_nonnegative_int,
    check_nonnegative_seconds,
    check_number,
    check_positive_int,
    check_string,
    describe_value,
    format_path,
    optional,
    walk_problems,
)
from weald.runtime._errors import UnreadableFileError, WealdError
from weald.runtime._files import read_regular_file

__all__ = [
    "KINDS",
    "TARGETS",
    "ActorFault",
    "FaultError",
    "FaultPlan",
    "FaultProblem",
    "FaultSpec",
    "FaultSpecError",
    "InjectedFault",
    "MCPFault",
    "ProviderFault",
    "ToolFault",
    "UnknownFaultError",
    "fault_from_dict",
    "fault_to_dict",
    "parse_plan",
    "read_fault_file",
]

Check = Callable[[object, object], Any]

#: The signals a ``fatal_signal`` actor fault may send (those faulthandler reports).
FATAL_SIGNALS: Final = ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL")

#: The targets, in the order the docs present them.
TARGETS: Final = ("actor", "tool", "mcp", "provider")

#: Each target's kinds.
KINDS: Final[Mapping[str, tuple[str, ...]]] = {
    "actor": ("crash", "delay", "drop", "fatal_signal"),
    "tool": ("hang", "crash", "kill_subprocess", "delay"),
    "mcp": ("kill_server", "hang"),
    "provider": ("http_error", "timeout", "malformed_stream"),
}


# --- Errors ------------------------------------------------------------------------------------


class FaultError(WealdError):
    """Fault injection was used wrongly (a bad declaration, an unknown id, a second hook).

    The tree::

        WealdError
        ├── FaultError
        │   ├── FaultSpecError      a declaration or fault file is invalid (every problem, with its path)
        │   └── UnknownFaultError   no injected fault has that id
        └── InjectedFault           the crash an injected fault causes (not a FaultError:
                                    catching misuse must not swallow the faults themselves)
    """


@attrs.frozen
class FaultProblem:
    """One problem in one fault declaration.

    Attributes:
        source: the file, or ``<fault>`` for a declaration passed to ``inject``.
        path: the key path (``faults[2].nth``), empty for the whole source.
        message: what is wrong and what was expected.
    """

    source: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.message}" if self.path else f"{self.source}: {self.message}"


class FaultSpecError(FaultError, ValueError):
    """Fault declarations are invalid; every problem found is listed, one per line.

    Attributes:
        problems: the problems, in the file's order.
    """

    def __init__(self, problems: list[FaultProblem] | tuple[FaultProblem, ...]) -> None:
        self.problems = tuple(problems)
        count = len(self.problems)
        header = f"invalid fault declarations ({count} problem{'s' if count != 1 else ''}):"
        super().__init__("\n".join([header, *(f"  {problem}" for problem in self.problems)]))


class UnknownFaultError(FaultError, LookupError):
    """No injected fault has the id asked for."""


class InjectedFault(WealdError):
    """The exception an injected fault raises: an actor's crash, or a tool's.

    Its message names the fault's id, so a crash in the logs, in
    ``supervisor.child_crashed`` events or in a tool's error result says it
    was injected, and by which declaration.

    Attributes:
        fault_id: the declaration that fired.
        target: ``actor``, ``tool``, ``mcp`` or ``provider``.
        kind: what it did (``crash``).
        path: where it fired (an actor path), if known.
    """

    def __init__(self, message: str, *, fault_id: str, target: str, kind: str, path: str | None = None) -> None:
        super().__init__(message)
        self.fault_id = fault_id
        self.target = target
        self.kind = kind
        self.path = path


# --- Field checks: structure hooks (value, type) -> value, and, wrapped, attrs validators --------

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}")


def _one_of(choices: tuple[str, ...]) -> str:
    shown = [f'"{choice}"' for choice in choices]
    return ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]


def _literal(choices: tuple[str, ...]) -> Check:
    def check_choice(value: object, _type: object = None) -> str:
        if isinstance(value, str) and value in choices:
            return value
        raise InvalidValue(_one_of(choices), value)

    return check_choice


def check_fault_id(value: object, _type: object = None) -> str:
    """1-64 letters, digits, ``_ . : @ -``, starting with a letter or digit."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise InvalidValue("an id of 1-64 letters, digits, '_', '.', ':', '@' or '-'", value)
    return value


def check_pattern(value: object, _type: object = None) -> str:
    """A non-empty glob pattern (``*``, ``?``, ``[...]``)."""
    text = check_string(value)
    if not text:
        raise InvalidValue('a non-empty glob pattern (use "*" for any)', value)
    return text


def check_probability(value: object, _type: object = None) -> float:
    """A number greater than 0 and at most 1."""
    number = check_number(value)
    if not (0 < number <= 1):
        raise InvalidValue("a probability greater than 0 and at most 1", value)
    return number


def check_status(value: object, _type: object = None) -> int:
    """An HTTP error status, 400-599."""
    number = check_integer(value)
    if not 400 <= number <= 599:
        raise InvalidValue("an HTTP error status from 400 to 599", value)
    return number


def check_finite_seconds(value: object, _type: object = None) -> float:
    """A finite number of seconds, zero or more."""
    seconds = check_nonnegative_seconds(value)
    if not math.isfinite(seconds):  # pragma: no cover - check_nonnegative_seconds refuses inf already
        raise InvalidValue("a finite number of seconds", value)
    return seconds


def _validator(check: Check) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def validate(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        try:
            check(value, None)
        except ValueProblem as exc:
            raise ValueError(f"{attribute.name}: {exc.message}") from None

    return validate


def _field(check: Check, default: Any = attrs.NOTHING) -> Any:
    """An attrs field checked when structured (the converter reads `CHECK`) and when built by hand."""
    return attrs.field(default=default, validator=_validator(check), metadata={CHECK: check})


class _FieldProblems(ValueProblems, ValueError):
    """Problems that involve several fields of one declaration (raised by ``__attrs_post_init__``)."""

    def __str__(self) -> str:
        return "; ".join(f"{format_path(path)}: {getattr(exc, 'message', exc)}" for path, exc in self.problems)


def _raise_problems(problems: list[tuple[str, str]]) -> None:
    if problems:
        raise _FieldProblems([((name,), ValueProblem(message)) for name, message in problems])


# --- The declarations ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _Schedule:
    """When a fault fires among the events it matches (shared by every target).

    Attributes:
        id: names the fault in events, errors and ``clear``; assigned
            (``<target>-<kind>-<n>``) when left out.
        nth: fire on every nth eligible match (the nth, 2nth, ...); with
            ``count = 1``, only on the nth.
        p: fire on each eligible match with this probability, drawn from the
            injector's seeded generator. Give ``nth`` or ``p``, not both;
            with neither, every eligible match fires.
        count: fire at most this many times (then the fault is exhausted
            and stays listed until cleared); None: no limit.
        after: ignore the first ``after`` matches; counting for ``nth``
            starts after them.
    """

    id: str | None = _field(optional(check_fault_id), None)
    nth: int | None = _field(optional(check_positive_int), None)
    p: float | None = _field(optional(check_probability), None)
    count: int | None = _field(optional(check_positive_int), None)
    after: int = _field(check_nonnegative_int, 0)

    def _schedule_problems(self) -> list[tuple[str, str]]:
        if self.nth is not None and self.p is not None:
            return [("p", "give nth or p, not both")]
        return []


@attrs.frozen(kw_only=True)
class ActorFault(_Schedule):
    """A fault in an actor's receive loop, decided per message before the handler runs.

    Kinds: ``crash`` raises `InjectedFault` as if the handler had raised it
    (for a ``tell`` the actor crashes and its supervisor acts; for an
    ``ask``, proxy calls included, the caller gets the error and the actor
    lives on, as with any handler exception); ``delay`` holds the message
    for ``seconds`` before handling it (the mailbox waits behind it);
    ``drop`` discards it (an ``ask`` is then never answered);
    ``fatal_signal`` sends the whole process ``signal`` (``SIGSEGV`` by
    default), as a crash in C code would: the daemon dies, after its
    faulthandler has written every thread's stack into its log.

    Attributes:
        target: ``"actor"``.
        kind: ``crash``, ``delay``, ``drop`` or ``fatal_signal``.
        path: glob on the actor's path (``/sessions/*/agent``).
        message: glob on the message's class name (``ToolResults``, ``*``);
            a proxy call also matches ``call:<method>`` (``call:prompt``).
        seconds: for ``delay``, how long.
        signal: for ``fatal_signal``, which (``SIGSEGV``, ``SIGBUS``,
            ``SIGABRT``, ``SIGFPE`` or ``SIGILL``; default ``SIGSEGV``).
    """

    target: Literal["actor"] = _field(_literal(("actor",)), "actor")
    kind: Literal["crash", "delay", "drop", "fatal_signal"] = _field(_literal(KINDS["actor"]))
    path: str = _field(check_pattern, "*")
    message: str = _field(check_pattern, "*")
    seconds: float | None = _field(optional(check_finite_seconds), None)
    signal: str | None = _field(optional(_literal(FATAL_SIGNALS)), None)

    def __attrs_post_init__(self) -> None:
        problems = self._schedule_problems()
        if self.kind == "delay" and not self.seconds:
            problems.append(("seconds", "a delay fault needs seconds, a positive number"))
        elif self.kind != "delay" and self.seconds is not None:
            problems.append(("seconds", f"only delay faults take seconds, not {self.kind}"))
        if self.kind != "fatal_signal" and self.signal is not None:
            problems.append(("signal", f"only fatal_signal faults take a signal, not {self.kind}"))
        _raise_problems(problems)


@attrs.frozen(kw_only=True)
class ToolFault(_Schedule):
    """A fault in a tool call, applied through a registry the injector wraps.

    Kinds: ``hang`` never returns until the call is cancelled (the runner's
    timeout or an abort); ``crash`` raises `InjectedFault` in place of the
    tool (the model gets an error result naming the fault); ``kill_subprocess``
    runs the tool and kills the process group of the subprocess it starts,
    ``seconds`` after it appears (the tool sees its command die); ``delay``
    waits ``seconds`` before the tool runs.

    Attributes:
        target: ``"tool"``.
        kind: ``hang``, ``crash``, ``kill_subprocess`` or ``delay``.
        tool: glob on the tool's name (``shell``, ``mcp__*``).
        agent: glob on the calling agent's path (``/sessions/s1/agent``).
        seconds: for ``delay``, how long; for ``kill_subprocess``, how long
            after the subprocess appears (default 0).
    """

    target: Literal["tool"] = _field(_literal(("tool",)), "tool")
    kind: Literal["hang", "crash", "kill_subprocess", "delay"] = _field(_literal(KINDS["tool"]))
    tool: str = _field(check_pattern, "*")
    agent: str = _field(check_pattern, "*")
    seconds: float | None = _field(optional(check_finite_seconds), None)

    def __attrs_post_init__(self) -> None:
        problems = self._schedule_problems()
        if self.kind == "delay" and not self.seconds:
            problems.append(("seconds", "a delay fault needs seconds, a positive number"))
        elif self.kind not in ("delay", "kill_subprocess") and self.seconds is not None:
            problems.append(("seconds", f"only delay and kill_subprocess faults take seconds, not {self.kind}"))
        _raise_problems(problems)


@attrs.frozen(kw_only=True)
class MCPFault(_Schedule):
    """A fault in an MCP server connection (an ``MCPConnection`` actor).

    Kinds: ``kill_server`` SIGKILLs the server's process group (stdio
    servers); the connection is lost, its actor crashes and its supervisor
    restarts it after its backoff. ``hang`` drops calls to the server's
    tools at the connection actor, so they are never answered: each call
    waits until the tool runner's timeout cancels it.

    With ``trigger = "call"`` (the default) a ``kill_server`` fault is decided
    on each call to a matching tool of a matching server, and the server
    dies with that call in flight. With ``trigger = "now"`` it is decided
    once per matching connected server as soon as the fault is injected into
    an installed injector (for ``fault.inject`` over JSON-RPC).

    Attributes:
        target: ``"mcp"``.
        kind: ``kill_server`` or ``hang``.
        server: glob on the configured server name.
        tool: glob on the tool's name on the server (not the registered
            ``mcp__`` name).
        trigger: ``call`` or ``now`` (``kill_server`` only).
    """

    target: Literal["mcp"] = _field(_literal(("mcp",)), "mcp")
    kind: Literal["kill_server", "hang"] = _field(_literal(KINDS["mcp"]))
    server: str = _field(check_pattern, "*")
    tool: str = _field(check_pattern, "*")
    trigger: Literal["call", "now"] = _field(_literal(("call", "now")), "call")

    def __attrs_post_init__(self) -> None:
        problems = self._schedule_problems()
        if self.trigger == "now" and self.kind != "kill_server":
            problems.append(("trigger", 'only kill_server faults take trigger = "now"'))
        if self.trigger == "now" and self.tool != "*":
            problems.append(("tool", 'a trigger = "now" fault matches servers, not tools; leave tool out'))
        _raise_problems(problems)


@attrs.frozen(kw_only=True)
class ProviderFault(_Schedule):
    """A fault in a model provider, decided before each HTTP attempt (retries included).

    Kinds: ``http_error`` acts as if the server answered ``status`` (with
    ``retry_after``, if given); the provider maps and retries it as it would
    a real one. ``timeout`` acts as a server gone silent (``StallTimeout``
    after the provider's ``stall_timeout``). ``malformed_stream`` sends a
    first stream event that is not JSON (``MalformedResponseError``). The
    scripted provider never retries, so there the error reaches the agent
    at once.

    Attributes:
        target: ``"provider"``.
        kind: ``http_error``, ``timeout`` or ``malformed_stream``.
        model: glob on the model: matched against ``provider:model``
            (``openai:gpt-4.1``), the bare model, and the spec the provider
            was built from.
        agent: glob on the calling agent's path, when it is known.
        status: for ``http_error``, the status (default 500).
        retry_after: for ``http_error``, a ``Retry-After`` in seconds.
        error_text: for ``http_error``, the error message the server sends.
    """

    target: Literal["provider"] = _field(_literal(("provider",)), "provider")
    kind: Literal["http_error", "timeout", "malformed_stream"] = _field(_literal(KINDS["provider"]))
    model: str = _field(check_pattern, "*")
    agent: str = _field(check_pattern, "*")
    status: int | None = _field(optional(check_status), None)
    retry_after: float | None = _field(optional(check_finite_seconds), None)
    error_text: str | None = _field(optional(check_string), None)

    def __attrs_post_init__(self) -> None:
        problems = self._schedule_problems()
        if self.kind != "http_error":
            problems.extend(
                (name, f"only http_error faults take {name}, not {self.kind}")
                for name in ("status", "retry_after", "error_text")
                if getattr(self, name) is not None
            )
        _raise_problems(problems)


FaultSpec: TypeAlias = ActorFault | ToolFault | MCPFault | ProviderFault
"""Any fault declaration."""

_CLASSES: Final[Mapping[str, type[FaultSpec]]] = {
    "actor": ActorFault,
    "tool": ToolFault,
    "mcp": MCPFault,
    "provider": ProviderFault,
}


@attrs.frozen
class FaultPlan:
    """A fault file, parsed: the seed it asks for and its declarations, in order.

    Attributes:
        seed: the seed for the injector's random decisions, if the file sets one.
        faults: the declarations.
        source: where they came from (a file path, or ``<data>``).
    """

    seed: int | None
    faults: tuple[FaultSpec, ...]
    source: str = "<data>"


# --- Structuring ----------------------------------------------------------------------------------

_converter: Final = make_converter(forbid_extra_keys=True)


def _register(cls: type) -> None:
    # Every field carries its check, so cattrs' own primitive hooks (which
    # coerce) never run: a wrong type is an error with its key path.
    overrides: dict[str, Any] = {field.name: override(struct_hook=field.metadata[CHECK]) for field in attrs.fields(cls)}
    structure: Callable[[Mapping[str, Any], Any], Any] = make_dict_structure_fn(
        cls, _converter, _cattrs_forbid_extra_keys=True, **overrides
    )

    def structure_fault(value: object, type_: object) -> object:
        if not isinstance(value, Mapping):
            raise InvalidValue("a table", value)
        return structure(value, type_)

    _converter.register_structure_hook(cls, structure_fault)


for _cls in _CLASSES.values():
    _register(_cls)


def _structure(item: object) -> FaultSpec:
    """Structure one declaration; raises `ValueProblem` or a cattrs validation error."""
    if not isinstance(item, Mapping):
        raise InvalidValue("a table", item)
    target = item.get("target")
    if target is None:
        raise ValueProblems([(("target",), ValueProblem(f"missing; expected {_one_of(TARGETS)}"))])
    if not (isinstance(target, str) and target in _CLASSES):
        raise ValueProblems([(("target",), InvalidValue(_one_of(TARGETS), target))])
    cls = _CLASSES[target]
    if "kind" not in item:
        kinds = KINDS[target]
        raise ValueProblems([(("kind",), ValueProblem(f"missing; a {target} fault is one of {_one_of(kinds)}"))])
    spec: FaultSpec = _converter.structure(item, cls)
    return spec


def _problems(exc: BaseException, source: str, path: KeyPath) -> list[FaultProblem]:
    return [FaultProblem(source, format_path(where), message) for where, message in walk_problems(exc, path)]


def fault_from_dict(data: object, *, source: str = "<fault>") -> FaultSpec:
    """Structure one declaration from plain data (a file's ``faults`` entry, or JSON-RPC params).

    Raises:
        FaultSpecError: every problem, each with its key path.
    """
    try:
        return _structure(data)
    except (ValueProblem, BaseValidationError) as exc:
        raise FaultSpecError(_problems(exc, source, ())) from None


def fault_to_dict(spec: FaultSpec) -> dict[str, Any]:
    """A declaration as plain data, shaped as in a fault file (unset keys left out)."""
    data: dict[str, Any] = _converter.unstructure(spec)
    first = {key: data.pop(key) for key in ("id", "target", "kind")}
    return {key: value for key, value in {**first, **data}.items() if value is not None}


def parse_plan(data: object, *, source: str = "<data>") -> FaultPlan:
    """Structure a whole fault file's data: ``{"seed": int, "faults": [...]}``.

    Raises:
        FaultSpecError: every problem in it, each with its key path; ids
            used twice are a problem too.
    """
    if not isinstance(data, Mapping):
        raise FaultSpecError(
            [FaultProblem(source, "", f"expected a table of seed and faults, got {describe_value(data)}")]
        )
    problems: list[FaultProblem] = []
    for key in data:
        if key not in ("seed", "faults"):
            hint = "did you mean faults?" if str(key).rstrip("s") == "fault" else "expected seed or faults"
            problems.append(FaultProblem(source, format_path((str(key),)), f"unknown key; {hint}"))
    seed: int | None = None
    if data.get("seed") is not None:
        try:
            seed = check_integer(data["seed"])
        except ValueProblem as exc:
            problems.append(FaultProblem(source, "seed", exc.message))
    raw = data.get("faults", [])
    faults: list[FaultSpec] = []
    if not isinstance(raw, list | tuple):
        problems.append(FaultProblem(source, "faults", InvalidValue("an array of tables", raw).message))
        raw = []
    first_use: dict[str, int] = {}
    for index, item in enumerate(raw):
        try:
            spec = _structure(item)
        except (ValueProblem, BaseValidationError) as exc:
            problems.extend(_problems(exc, source, ("faults", index)))
            continue
        faults.append(spec)
        if spec.id is not None:
            if spec.id in first_use:
                where = format_path(("faults", first_use[spec.id]))
                problems.append(
                    FaultProblem(
                        source, format_path(("faults", index, "id")), f'"{spec.id}" is already used by {where}'
                    )
                )
            else:
                first_use[spec.id] = index
    if problems:
        raise FaultSpecError(problems)
    return FaultPlan(seed=seed, faults=tuple(faults), source=source)


_MAX_FILE_BYTES = 4 * 1024 * 1024
"""The largest fault file `read_fault_file` reads."""


def read_fault_file(path: str | Path) -> FaultPlan:
    """Read a fault file: TOML (``.toml``) or JSON (``.json``), by its extension.

    Raises:
        FaultSpecError: the file cannot be read or parsed (with the line and
            column of a syntax error), or its declarations are invalid.
    """
    file = Path(path).expanduser()
    source = str(file)
    suffix = file.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise FaultSpecError([FaultProblem(source, "", "a fault file must be .toml or .json")])
    try:
        # A regular file of bounded size only: a FIFO or a device is refused, never waited on.
        text = read_regular_file(file, max_bytes=_MAX_FILE_BYTES, what="the fault file").decode("utf-8")
    except UnreadableFileError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            raise FaultSpecError([FaultProblem(source, "", "no such file")]) from None
        raise FaultSpecError([FaultProblem(source, "", str(exc).replace(f"the fault file {source} ", "", 1))]) from None
    except UnicodeDecodeError as exc:
        raise FaultSpecError([FaultProblem(source, "", f"not UTF-8 text (byte {exc.start})")]) from None
    data: object
    if suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise FaultSpecError([FaultProblem(source, "", f"invalid TOML: {exc}")]) from None
        except RecursionError:
            raise FaultSpecError([FaultProblem(source, "", "invalid TOML: values nest too deeply")]) from None
    else:
        # The standard json module, not msgspec: its errors name the line and column.
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            message = f"invalid JSON: {exc.msg} (at line {exc.lineno}, column {exc.colno})"
            raise FaultSpecError([FaultProblem(source, "", message)]) from None
        except RecursionError:
            raise FaultSpecError([FaultProblem(source, "", "invalid JSON: values nest too deeply")]) from None
    return parse_plan(data, source=source)
