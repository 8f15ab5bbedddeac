"""Your own tools in the daemon: ``[tools] modules`` and the ``weald.tools`` entry-point group.

A module named in ``[tools] modules = ["mypkg.tools"]`` is imported when the
daemon starts (the directories of its configuration files and the one it was
started in are importable); every ``@tool`` it defines joins the daemon's
tools. An installed package offers tools through an entry point of the
``weald.tools`` group, naming a module (``mypkg.tools``) or a tool or list of
tools in one (``mypkg.tools:TOOLS``)::

    [project.entry-points."weald.tools"]
    mypkg = "mypkg.tools"

A module or entry point that cannot be loaded is a configuration error naming
it, with the last line of code it reached; `load_tools` says where each tool
came from (``weald doctor`` and ``weald config show`` list it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

import attrs
from weald.runtime.daemon._config_model import ConfigError, ConfigProblem
from weald.tools import Tool, ToolRegistry, default_registry

__all__ = ["ENTRY_POINT_GROUP", "ToolOrigin", "by_origin", "load_tools"]

ENTRY_POINT_GROUP = "weald.tools"


@attrs.frozen
class ToolOrigin:
    """Where one of the daemon's tools came from.

    Attributes:
        name: the tool's name.
        origin: ``built-in``, ``[tools] modules: mypkg.tools``, ``entry point mypkg (mypkg 1.0)``, or
            ``this process: module`` (a tool the program that started the daemon defined).
    """

    name: str
    origin: str


def _summary(exc: BaseException) -> str:
    """An import's failure in a line: the error, and the last line of code it reached."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [frame for frame in frames if "importlib" not in frame.filename] or frames
    where = f" (at {mine[-1].filename}:{mine[-1].lineno})" if mine else ""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def _defined_in(module: str) -> list[Tool]:
    """The tools of `default_registry` whose functions ``module`` (or a module below it) defines."""
    found = []
    for tool in default_registry.select():
        owner = getattr(tool.fn, "__module__", "") or ""
        if owner == module or owner.startswith(module + "."):
            found.append(tool)
    return found


def _tools_of(value: object, module: str) -> list[Tool]:
    if isinstance(value, ModuleType):
        return _defined_in(value.__name__)
    if isinstance(value, Tool):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        tools = list(value)
        if all(isinstance(tool, Tool) for tool in tools):
            return tools
    msg = f"it names a {type(value).__name__}, not a module, a tool or a list of tools (in {module})"
    raise TypeError(msg)


def load_tools(
    registry: ToolRegistry,
    modules: Sequence[str],
    *,
    import_dirs: Sequence[Path] = (),
    source: str = "weald.toml",
    entry_points: bool = True,
) -> list[ToolOrigin]:
    """Import ``modules`` and the ``weald.tools`` entry points; add their tools to ``registry``.

    Blocking (it imports code): for the thread that starts the daemon.

    Args:
        registry: the daemon's tools (a copy of `default_registry`), added to.
        modules: ``[tools] modules``.
        import_dirs: directories put on ``sys.path`` first (a project's own package).
        source: the file ``modules`` came from, for messages.
        entry_points: look at the ``weald.tools`` entry points too.

    Returns:
        Where each of the registry's tools came from, by name.

    Raises:
        ConfigError: a module or entry point could not be loaded (each problem named).
    """
    for directory in import_dirs:
        if str(directory) not in sys.path:
            sys.path.append(str(directory))
    origins: dict[str, str] = {}
    problems: list[ConfigProblem] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any failure of the user's module is reported, never a traceback
            problems.append(ConfigProblem(source, "tools.modules", f"cannot import {name!r}: {_summary(exc)}"))
            continue
        tools = _defined_in(name)
        if not tools:
            problems.append(ConfigProblem(source, "tools.modules", f"{name!r} defines no tool (no @tool in it)"))
        for tool in tools:
            registry.register(tool, replace=True)
            origins[tool.name] = f"[tools] modules: {name}"
    if entry_points:
        for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = point.dist
            package = f"{dist.name} {dist.version}" if dist is not None else "no package"
            where = f"entry point {point.name} = {point.value} ({package})"
            try:
                tools = _tools_of(point.load(), point.value)
            except Exception as exc:  # an installed package's failure is reported, never a traceback
                problems.append(ConfigProblem(where, "", f"cannot load the tools: {_summary(exc)}"))
                continue
            for tool in tools:
                registry.register(tool, replace=True)
                origins[tool.name] = f"entry point {point.name} ({package})"
    if problems:
        raise ConfigError(problems)
    result = []
    for name in registry.names():
        found = registry.get(name)
        owner = str(getattr(found.fn, "__module__", "")) if found is not None else ""
        if name in origins:
            origin = origins[name]
        elif owner.startswith(("weald.tools", "weald.runtime")):
            origin = "built-in"
        else:
            origin = f"this process: {owner}"
        result.append(ToolOrigin(name, origin))
    return result


def by_origin(origins: Sequence[ToolOrigin]) -> dict[str, list[str]]:
    """The tools' names grouped by where they came from, built-ins first."""
    groups: dict[str, list[str]] = {}
    for entry in sorted(origins, key=lambda o: (o.origin != "built-in", o.origin, o.name)):
        groups.setdefault(entry.origin, []).append(entry.name)
    return groups
