"""The tool contract: `@tool`, `ToolContext`, `ToolResult`, the registry and filters.

A tool is one decorated function in one file::

    from weald.tools import ToolContext, ToolResult, tool

    @tool(
        name="word_count",
        description="Count the words in a file of the project.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "file to count"}},
            "required": ["path"],
        },
    )
    def word_count(ctx: ToolContext, path: str) -> str:
        return str(len(ctx.resolve_path(path).read_text().split()))

The schema is what models see; arguments are validated against it before
the function runs. A plain function runs in a worker thread (it may block,
and should poll ``ctx.abort.is_set()`` if it can run long); an ``async def``
runs on the trio loop under a cancel scope, so timeouts and aborts cancel it.
Tools never raise into the runner: `invoke` turns any exception into an
error result whose text tells the model what to do next.
"""

from __future__ import annotations

import fnmatch
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import jsonschema
import trio
from weald.tools._errors import ToolError
from weald.tools._names import printable, show, unprintable
from weald.tools._paths import resolve_in_sandbox

__all__ = [
    "AbortSignal",
    "PatternMatcher",
    "Permission",
    "PermissionScope",
    "Tool",
    "ToolConfig",
    "ToolContext",
    "ToolError",
    "ToolImage",
    "ToolRegistry",
    "ToolResult",
    "default_registry",
    "describe_exception",
    "invoke",
    "tool",
    "validate_arguments",
]

Permission = Literal["allow", "ask", "deny"]


@attrs.frozen
class PermissionScope:
    """Where a call would run, for pattern matchers that judge paths (shell redirections).

    Attributes:
        working_dir: the project directory (absolute), or None when unknown.
        allowed_dirs: further directories the call may write into.
    """

    working_dir: Path | None = None
    allowed_dirs: tuple[Path, ...] = ()


PatternMatcher = Callable[
    [Mapping[str, Any], Mapping[str, Permission], Permission, PermissionScope], tuple[Permission, str]
]
"""How a tool decides a call under its pattern table: ``(arguments, patterns, default, scope) -> (permission, why)``."""


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


# The concrete class ``Path(...)`` makes here (PosixPath on POSIX).
_PATH = type(Path())


def _as_path(value: str | Path) -> Path:
    # The runner builds a ToolContext per call from paths it already holds;
    # Path(path) would parse each again. An exact concrete Path is returned as
    # is (paths are immutable, so it is the same value); anything else,
    # subclasses included, is converted as before.
    if value.__class__ is _PATH:
        return value
    return Path(value)


def _path_tuple(values: Iterable[str | Path]) -> tuple[Path, ...]:
    if values.__class__ is tuple and all(v.__class__ is _PATH for v in values):
        return values
    return tuple(Path(v) for v in values)


Truncate = Literal["head", "tail"]


@attrs.frozen
class ToolImage:
    """An image a tool returns for the model to see (an MCP server's screenshot, say).

    Attributes:
        mime_type: ``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp``
            (the types every supported model API takes).
        data: the image, base64-encoded.
    """

    mime_type: str
    data: str = attrs.field(repr=lambda data: f"<{len(data)} base64 chars>")


def _image_tuple(values: Iterable[ToolImage]) -> tuple[ToolImage, ...]:
    return tuple(values)


@attrs.frozen
class ToolResult:
    """What a tool call returns to the model.

    Attributes:
        ok: False for an error result.
        output: the text the model reads.
        data: optional structured data for programs (JSON-encodable).
        hints: optional short suggestions for the model's next step.
        full_output_path: where the untruncated output was saved, if it was cut.
        images: images for the model to see beside ``output`` (each provider
            sends them in its own wire format); the output should mention them.
    """

    ok: bool
    output: str
    data: Any = None
    hints: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    full_output_path: str | None = None
    images: tuple[ToolImage, ...] = attrs.field(default=(), converter=_image_tuple)

    @classmethod
    def success(cls, output: str, *, data: Any = None, hints: Iterable[str] = ()) -> ToolResult:
        """An ok result."""
        return cls(ok=True, output=output, data=data, hints=tuple(hints))

    @classmethod
    def error(cls, message: str, *, data: Any = None, hints: Iterable[str] = ()) -> ToolResult:
        """An error result; ``message`` tells the model what went wrong and how to recover."""
        return cls(ok=False, output=message, data=data, hints=tuple(hints))

    def text(self) -> str:
        """The output as the model sees it, hints appended."""
        if not self.hints:
            return self.output
        return self.output + "\n" + "\n".join(f"Hint: {h}" for h in self.hints)


class AbortSignal:
    """Set when a call is aborted or times out; thread tools poll it, async tools are cancelled.

    Created by the tool runner, one per call.
    """

    # A flag, not a threading.Event: nothing waits on it (thread tools poll,
    # async tools are cancelled), and the runner makes one per call. A bool
    # store is atomic under the GIL; `reason` is written before the flag, so
    # a reader that sees the flag set sees the reason.
    __slots__ = ("_set", "reason")

    def __init__(self) -> None:
        self._set = False
        self.reason = ""

    def __repr__(self) -> str:
        return f"<AbortSignal set={self.is_set()} reason={self.reason!r}>"

    def set(self, reason: str = "aborted") -> None:
        """Signal the abort (idempotent; the first reason is kept)."""
        if not self._set:
            self.reason = reason
            self._set = True

    def is_set(self) -> bool:
        """True once the call was aborted or timed out."""
        return self._set

    def raise_if_set(self) -> None:
        """Raise `ToolError` if the call was aborted (for long loops in thread tools)."""
        if self._set:
            raise ToolError(f"the call was {self.reason}")


def _path_strings(paths: Iterable[object]) -> tuple[str, ...]:
    return tuple(str(path) for path in paths)


@attrs.frozen
class ToolConfig:
    """Configuration a tool may read (frozen; from ``weald.toml`` ``[tools]``).

    Attributes:
        max_output_lines: lines of output that reach the model.
        max_output_bytes: bytes of output that reach the model.
        options: per-tool options, by tool name (e.g. ``{"shell": {"env_keep": [...]}}``).
        private_paths: paths no command in the OS sandbox may see, set by
            the runtime: the daemon's state directory, socket and config files.
        protected_paths: files no tool may write, set by the runtime: the
            files weald's configuration reads besides the project's own
            ``weald.toml`` and ``.weald/`` (``[mcp] import`` files, the faults
            file), which are protected always (`weald.tools._protected`).
        editor_files: read_file, write_file and edit_file work on the
            editor's buffers instead of the disk when an editor that offers
            them drives the session (``[acp] files = "editor"``; `weald.tools._editor`).
        editor_terminal: foreground shell commands run in the editor's
            terminals, still in weald's OS sandbox, when an editor that
            offers them drives the session (``[acp] terminal = "editor"``).
    """

    max_output_lines: int = 2000
    max_output_bytes: int = 50 * 1024
    options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    private_paths: tuple[str, ...] = attrs.field(default=(), converter=_path_strings)
    protected_paths: tuple[str, ...] = attrs.field(default=(), converter=_path_strings)
    editor_files: bool = False
    editor_terminal: bool = False

    def option(self, tool_name: str, key: str, default: Any = None) -> Any:
        """Return ``options[tool_name][key]``, or ``default``."""
        return self.options.get(tool_name, {}).get(key, default)


def _emit_nothing(kind: str, data: Mapping[str, Any]) -> None:
    """The default ``emit``: streaming events go nowhere."""


@attrs.frozen
class ToolContext:
    """Everything a tool call may use; frozen, one per call.

    Attributes:
        working_dir: the project directory; relative paths resolve here.
        allowed_dirs: further directories file tools may touch.
        session_id: the agent session.
        agent_id: the agent making the call.
        call_id: this call's id (from the model).
        depth: 0 for a top-level agent, 1 for its sub-agent, and so on.
        config: tool configuration.
        snapshot: a frozen snapshot of the agent's state at the moment of the call.
        abort: set when the call is aborted or times out.
        emit: ``emit(kind, data)`` streams an event (e.g. ``"output"``, ``{"text": ...}``).
        session: session-scoped services owned by the tool runner (read ledger,
            background jobs, runtime handles); None outside a runner.
        tool_name: the name the tool was called by.
        timeout: the seconds this call may take, as the tool runner worked
            it out (the call's own ``timeout`` argument, else ``[tools.timeouts]``,
            else the tool's default); None outside a runner. Tools that
            enforce their own deadline (shell, fetch) use it as their default,
            so a configured timeout reaches them; the runner stops the call
            from outside only a grace period after it.
    """

    working_dir: Path = attrs.field(converter=_as_path)
    allowed_dirs: tuple[Path, ...] = attrs.field(default=(), converter=_path_tuple)
    session_id: str = ""
    agent_id: str = ""
    call_id: str = ""
    depth: int = 0
    config: ToolConfig = attrs.field(factory=ToolConfig)
    snapshot: Any = None
    abort: AbortSignal = attrs.field(factory=AbortSignal, eq=False)
    emit: Callable[[str, Mapping[str, Any]], None] = attrs.field(default=_emit_nothing, eq=False)
    session: Any = attrs.field(default=None, eq=False)
    tool_name: str = ""
    timeout: float | None = None

    def resolve_path(self, path: str, *, must_exist: bool = False) -> Path:
        """Resolve ``path`` inside the sandbox (working dir and allowed dirs).

        Raises:
            ToolError: the path leads outside the sandbox (``..``, an
                absolute path elsewhere, or a symlink out), or must exist and does not.
        """
        return resolve_in_sandbox(self, path, must_exist=must_exist)


ToolFunction = Callable[..., "ToolResult | str | Awaitable[ToolResult | str]"]


@attrs.frozen
class Tool:
    """A registered tool: its schema, its function and its runtime defaults.

    Attributes:
        name: the name models call it by.
        description: what models read about it.
        parameters: its JSON Schema (an object schema).
        fn: the function ``(ctx, **arguments)``.
        is_async: True if ``fn`` is ``async def``.
        permission: default permission (``allow``, ``ask`` or ``deny``).
        timeout: default timeout in seconds.
        max_timeout: the largest timeout a call may ask for (with a ``timeout`` argument).
        truncate: which end of long output reaches the model (``head`` or ``tail``).
        subject: maps arguments to the string permission patterns match
            (e.g. the shell command); None matches by tool name only.
        match_patterns: decides a call under a table of patterns when plain
            glob matching of the subject is not enough (shell reads the
            command line as bash would); None: the strictest pattern that
            matches the subject wins, no match gives the default.
        kind: ``read``, ``write``, ``exec``, ``network`` or ``runtime``; for filters and docs.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFunction = attrs.field(eq=False)
    is_async: bool = False
    permission: Permission = "allow"
    timeout: float = 10.0
    max_timeout: float | None = None
    truncate: Truncate = "head"
    subject: Callable[[Mapping[str, Any]], str | None] | None = attrs.field(default=None, eq=False)
    match_patterns: PatternMatcher | None = attrs.field(default=None, eq=False)
    kind: str = "read"
    _validator: Any = attrs.field(default=None, eq=False, repr=False, alias="_validator")

    def spec(self) -> dict[str, Any]:
        """The definition a model sees: name, description, parameters."""
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


def _check_schema(name: str, parameters: Mapping[str, Any]) -> Any:
    if parameters.get("type") != "object":
        msg = f"tool {name!r}: parameters must be a JSON Schema of type 'object'"
        raise ValueError(msg)
    try:
        jsonschema.Draft202012Validator.check_schema(dict(parameters))
    except jsonschema.SchemaError as exc:
        msg = f"tool {name!r}: invalid parameters schema: {exc.message}"
        raise ValueError(msg) from exc
    return jsonschema.Draft202012Validator(dict(parameters))


def _describe_expected(error: jsonschema.ValidationError) -> str:
    validator = error.validator
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if validator == "type":
        expected = schema.get("type")
        if isinstance(expected, list):
            expected = " or ".join(expected)
        return f"expected {expected}, got {_short(error.instance)}"
    if validator == "required":
        return error.message.replace("'", "").replace(" is a required property", "") + " is required"
    if validator == "additionalProperties":
        return error.message.replace("Additional properties", "unknown argument(s)")
    if validator == "enum":
        options = ", ".join(repr(v) for v in schema.get("enum", []))
        return f"expected one of {options}, got {_short(error.instance)}"
    return error.message


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- a fast check for the schemas tools use ----------------------------------------------
#
# jsonschema walks a schema generically; for read_file's four-property schema
# that cost ~20 us per call, more than many tools take to run. Tool schemas
# use a small subset of JSON Schema, so each is also compiled (once, lazily)
# into a closure that can only *accept*: it returns True only when jsonschema
# would accept the arguments too, and anything it is unsure of (a keyword or
# type outside the subset, a subclass, a float given for an integer) makes it
# say False, and jsonschema decides as before. Error messages always come
# from jsonschema.

_Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$comment"})
_JSON_CLASSES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}
# Classes an instance may have for the check to judge it (exact: bool is
# not an int here, and subclasses are left to jsonschema).
_PLAIN_JSON = frozenset({str, int, float, bool, type(None), dict, list})
_NUMBER = frozenset({int, float})
_SCALAR = frozenset({str, int, float, bool, type(None)})


def _type_check(classes: frozenset[type]) -> _Check:
    return lambda x: x.__class__ in classes


def _bound_check(keyword: str, bound: Any) -> _Check:
    # The comparison jsonschema makes, applied to numbers only.
    if keyword == "minimum":
        return lambda x: x.__class__ not in _NUMBER or not x < bound
    if keyword == "maximum":
        return lambda x: x.__class__ not in _NUMBER or not x > bound
    if keyword == "exclusiveMinimum":
        return lambda x: x.__class__ not in _NUMBER or not x <= bound
    return lambda x: x.__class__ not in _NUMBER or not x >= bound


def _size_check(keyword: str, size: int) -> _Check:
    cls = str if keyword.endswith("Length") else list
    if keyword.startswith("min"):
        return lambda x: x.__class__ is not cls or not len(x) < size
    return lambda x: x.__class__ is not cls or not len(x) > size


def _enum_check(options: tuple[Any, ...]) -> _Check:
    # Only a scalar equal to an option of its own class: jsonschema's
    # equality differs from Python's for 1 vs True and inside containers.
    return lambda x: x.__class__ in _SCALAR and any(o.__class__ is x.__class__ and o == x for o in options)


def _items_check(item: _Check) -> _Check:
    return lambda x: x.__class__ is not list or all(item(e) for e in x)


def _required_check(names: tuple[str, ...]) -> _Check:
    return lambda x: x.__class__ is not dict or all(n in x for n in names)


def _dependent_check(deps: tuple[tuple[str, tuple[str, ...]], ...]) -> _Check:
    return lambda x: x.__class__ is not dict or all(k not in x or all(n in x for n in d) for k, d in deps)


def _properties_check(props: dict[str, _Check]) -> _Check:
    return lambda x: x.__class__ is not dict or all(props[k](v) for k, v in x.items() if k in props)


def _closed_check(allowed: frozenset[str]) -> _Check:
    return lambda x: x.__class__ is not dict or all(k in allowed for k in x)


def _all_check(checks: tuple[_Check, ...]) -> _Check:
    def check(x: Any) -> bool:
        if x.__class__ not in _PLAIN_JSON:
            return False
        return all(c(x) for c in checks)

    return check


def _is_str_list(value: Any) -> bool:
    return value.__class__ is list and all(n.__class__ is str for n in value)


def _compile_check(schema: Any) -> _Check | None:
    """Compile ``schema`` (a Draft 2020-12 schema) into an accept-only check; None if out of the subset."""
    if schema is True:
        return lambda _: True
    if schema is False or schema.__class__ is not dict:
        return None
    checks: list[_Check] = []
    value: Any
    for keyword, value in schema.items():
        if keyword in _ANNOTATIONS or (keyword == "additionalProperties" and value is True):
            continue
        if keyword == "type":
            names = [value] if value.__class__ is str else value
            if names.__class__ is not list or not all(n in _JSON_CLASSES for n in names):
                return None
            checks.append(_type_check(frozenset(c for n in names for c in _JSON_CLASSES[n])))
        elif keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if value.__class__ not in _NUMBER:
                return None
            checks.append(_bound_check(keyword, value))
        elif keyword in ("minLength", "maxLength", "minItems", "maxItems"):
            if value.__class__ is not int:
                return None
            checks.append(_size_check(keyword, value))
        elif keyword == "enum":
            if value.__class__ is not list or not all(e.__class__ in _SCALAR for e in value):
                return None
            checks.append(_enum_check(tuple(value)))
        elif keyword == "items":
            item = _compile_check(value)
            if item is None:
                return None
            checks.append(_items_check(item))
        elif keyword == "required":
            if not _is_str_list(value):
                return None
            checks.append(_required_check(tuple(value)))
        elif keyword == "dependentRequired":
            if value.__class__ is not dict or not all(_is_str_list(d) for d in value.values()):
                return None
            checks.append(_dependent_check(tuple((k, tuple(d)) for k, d in value.items())))
        elif keyword == "properties":
            if value.__class__ is not dict:
                return None
            props: dict[str, _Check] = {}
            for name, sub in value.items():
                compiled = _compile_check(sub)
                if compiled is None:
                    return None
                props[name] = compiled
            checks.append(_properties_check(props))
        elif keyword == "additionalProperties" and value is False:
            properties = schema.get("properties", {})
            if properties.__class__ is not dict:
                return None
            checks.append(_closed_check(frozenset(properties)))
        else:
            return None
    return _all_check(tuple(checks))


# Compiled checks by validator, made on first use: (validator, check or None).
# Keyed by id() because validators are unhashable; the entry holds the
# validator, so the id cannot be reused while it is there.
_CHECKS: dict[int, tuple[Any, _Check | None]] = {}


def _fast_check(validator: Any) -> _Check | None:
    entry = _CHECKS.get(id(validator))
    if entry is not None and entry[0] is validator:
        return entry[1]
    # Other drafts differ in the subset (draft 4's boolean exclusiveMinimum).
    check = _compile_check(validator.schema) if type(validator) is jsonschema.Draft202012Validator else None
    if len(_CHECKS) >= 1024:
        _CHECKS.clear()
    _CHECKS[id(validator)] = (validator, check)
    return check


def validate_arguments(tool_: Tool, arguments: Any) -> str | None:
    """Check ``arguments`` against the tool's schema.

    Returns:
        None when valid, else an error message naming each bad field and
        what was expected, for the model to correct its call.
    """
    if arguments.__class__ is not dict and not isinstance(arguments, Mapping):  # an ABC check costs ~0.5 us
        return f"arguments to {tool_.name} must be a JSON object, got {_short(arguments)}"
    validator = tool_._validator
    if validator is None:
        return None
    instance = dict(arguments)
    check = _fast_check(validator)
    if check is not None and check(instance):
        return None
    # Valid arguments are the common case: stop at the first error instead of
    # collecting and sorting all of them.
    if validator.is_valid(instance):
        return None
    problems = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path)):
        field = ".".join(str(p) for p in error.absolute_path)
        where = f"{field}: " if field else ""
        problems.append(f"{where}{_describe_expected(error)}")
    if not problems:
        return None
    listed = "; ".join(problems)
    return f"invalid arguments for {tool_.name}: {listed}. Check the tool's parameter schema and call it again."


class ToolRegistry:
    """Tools by name; filters select a subset with patterns like ``["*", "!shell"]``."""

    __weald_shared__ = True  # shared by every actor: not in one actor's memory estimate

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._lock = threading.Lock()
        # select() results by filter, valid for `_version` (bumped, and the
        # cache cleared, under the lock on every change). The runner selects
        # once per batch of calls; matching every pattern against every tool
        # name cost more than running a no-op tool.
        self._version = 0
        self._selected: dict[tuple[str, ...] | None, tuple[Tool, ...]] = {}
        for t in tools:
            self.register(t)

    def __repr__(self) -> str:
        return f"<ToolRegistry {sorted(self._tools)}>"

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def register(self, tool_: Tool, *, replace: bool = False) -> Tool:
        """Add a tool.

        Raises:
            ValueError: a different tool already has that name and ``replace`` is False.
        """
        with self._lock:
            existing = self._tools.get(tool_.name)
            if existing is not None and existing.fn is not tool_.fn and not replace:
                msg = f"a tool named {tool_.name!r} is already registered"
                raise ValueError(msg)
            self._tools[tool_.name] = tool_
            self._changed()
        return tool_

    def _changed(self) -> None:
        """Forget cached selections; called with the lock held."""
        self._version += 1
        self._selected = {}

    def unregister(self, name: str) -> bool:
        """Remove a tool; returns whether it was there."""
        with self._lock:
            removed = self._tools.pop(name, None) is not None
            if removed:
                self._changed()
            return removed

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Every tool name, sorted."""
        return sorted(self._tools)

    def select(self, patterns: Iterable[str] | None = None) -> list[Tool]:
        """The tools a filter allows, sorted by name.

        Patterns are applied in order: ``name`` or a glob adds, ``!name`` or
        ``!glob`` removes. None (no filter) means every tool.
        """
        key = None if patterns is None else tuple(patterns)
        version = self._version
        cached = self._selected.get(key)
        if cached is not None:
            return list(cached)
        tools = dict(self._tools)
        if key is None:
            selected = [tools[n] for n in sorted(tools)]
        else:
            chosen: set[str] = set()
            for pattern in key:
                negate = pattern.startswith("!")
                glob = pattern[1:] if negate else pattern
                matched = {n for n in tools if fnmatch.fnmatchcase(n, glob)}
                chosen = chosen - matched if negate else chosen | matched
            selected = [tools[n] for n in sorted(chosen)]
        with self._lock:
            # Only a selection made from the current tools is kept; the cache
            # is bounded (filters come from configuration, a handful at most).
            if self._version == version and len(self._selected) < 256:
                self._selected[key] = tuple(selected)
        return selected

    def copy(self) -> ToolRegistry:
        """An independent registry holding the same tools."""
        return ToolRegistry(self._tools.values())


default_registry = ToolRegistry()
"""The registry `@tool` adds to unless given another; holds the built-in tools."""


def tool(
    *,
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    permission: Permission = "allow",
    timeout: float = 10.0,
    max_timeout: float | None = None,
    truncate: Truncate = "head",
    subject: Callable[[Mapping[str, Any]], str | None] | None = None,
    match_patterns: PatternMatcher | None = None,
    kind: str = "read",
    registry: ToolRegistry | None = None,
) -> Callable[[ToolFunction], Tool]:
    """Declare a tool: decorate ``fn(ctx: ToolContext, **arguments) -> ToolResult | str``.

    Args:
        name: the name models call it by (letters, digits, ``_``, ``-``).
        description: what models read about it.
        parameters: a JSON Schema of type object for its arguments.
        permission: default permission: ``allow``, ``ask`` or ``deny``.
        timeout: default timeout in seconds.
        max_timeout: if set, a call may ask for up to this many seconds with
            a ``timeout`` argument.
        truncate: which end of long output the model sees.
        subject: what permission patterns match for a call (e.g. the command).
        match_patterns: how the tool's patterns decide a call, if not by glob
            on the subject (see `Tool.match_patterns`).
        kind: ``read``, ``write``, ``exec``, ``network`` or ``runtime``.
        registry: where to register it (`default_registry` if None).

    Returns:
        The `Tool` (the decorated name now refers to it).
    """
    import re

    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        msg = f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'"
        raise ValueError(msg)
    if permission not in ("allow", "ask", "deny"):
        msg = f"tool {name!r}: permission must be allow, ask or deny, got {permission!r}"
        raise ValueError(msg)
    validator = _check_schema(name, parameters)

    def decorate(fn: ToolFunction) -> Tool:
        t = Tool(
            name=name,
            description=description,
            parameters=parameters,
            fn=fn,
            is_async=inspect.iscoroutinefunction(fn),
            permission=permission,
            timeout=timeout,
            max_timeout=max_timeout,
            truncate=truncate,
            subject=subject,
            match_patterns=match_patterns,
            kind=kind,
            _validator=validator,
        )
        (registry if registry is not None else default_registry).register(t, replace=True)
        return t

    return decorate


def _as_result(value: Any, tool_name: str) -> ToolResult:
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult.success(value)
    if value is None:
        return ToolResult.success("")
    return ToolResult.error(
        f"tool {tool_name} returned a {type(value).__name__}, not text; this is a bug in the tool",
    )


def describe_exception(tool_name: str, exc: BaseException) -> ToolResult:
    """Turn an exception escaping a tool into an error result the model can act on."""
    if isinstance(exc, ToolError):
        return ToolResult.error(str(exc), hints=exc.hints)
    if isinstance(exc, FileNotFoundError):
        where = f" {exc.filename}" if exc.filename else ""
        return ToolResult.error(f"{tool_name} failed: no such file{where}. Check the path (glob can list files).")
    if isinstance(exc, PermissionError):
        return ToolResult.error(f"{tool_name} failed: permission denied ({exc}). Choose another path.")
    if isinstance(exc, IsADirectoryError):
        return ToolResult.error(f"{tool_name} failed: {exc.filename} is a directory. Use glob to list it.")
    return ToolResult.error(
        f"{tool_name} failed with {type(exc).__name__}: {exc}. "
        "The tool is fine to call again; change the arguments or try another approach.",
    )


def printable_result(result: ToolResult) -> ToolResult:
    """``result`` with nothing in it that UTF-8 cannot encode (output, hints, data, spool path)."""
    if result.data is None and not result.hints and result.full_output_path is None:
        # The common result, text alone: one check of the text.
        output = result.output
        if output.__class__ is str and show(output) is output:
            return result
    if not unprintable((result.output, result.hints, result.data, result.full_output_path)):
        return result
    return attrs.evolve(
        result,
        output=show(result.output),
        hints=tuple(show(h) for h in result.hints),
        data=printable(result.data),
        full_output_path=show(result.full_output_path) if result.full_output_path is not None else None,
    )


async def invoke(tool_: Tool, ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    r"""Validate ``arguments`` and run the tool; never raises for the tool's own errors.

    A plain function runs in a worker thread (abandoned if the caller is
    cancelled: it should poll ``ctx.abort``); an async function runs here.
    trio's ``Cancelled`` propagates, so the caller's timeout or abort works.
    Text UTF-8 cannot encode (an undecodable byte of a file name) comes back
    escaped as ``\xHH``.
    """
    problem = validate_arguments(tool_, arguments)
    if problem is not None:
        return ToolResult.error(problem)
    kwargs = dict(arguments)
    try:
        if tool_.is_async:
            value = await tool_.fn(ctx, **kwargs)  # type: ignore[misc]
        else:
            value = await trio.to_thread.run_sync(
                lambda: tool_.fn(ctx, **kwargs),
                abandon_on_cancel=True,
            )
    except trio.Cancelled:
        raise
    except Exception as exc:
        result = describe_exception(tool_.name, exc)
    else:
        result = _as_result(value, tool_.name)
    # A file name that is not UTF-8 (read with surrogateescape) must not reach
    # the model, the events or the store as it is.
    return printable_result(result)
