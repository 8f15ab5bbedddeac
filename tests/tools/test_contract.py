"""The tool contract's value types: a call's context and its result cannot be changed once made."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from weald.tools import ToolConfig, ToolContext, ToolResult


def test_a_tool_context_is_frozen(tmp_path: Path) -> None:
    ctx = ToolContext(working_dir=tmp_path, call_id="c1", timeout=30.0)
    for field, value in (("working_dir", Path("/")), ("call_id", "c2"), ("timeout", 600.0), ("config", ToolConfig())):
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(ctx, field, value)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        del ctx.depth
    assert (ctx.working_dir, ctx.call_id, ctx.timeout) == (tmp_path, "c1", 30.0)
    # A changed copy is made with attrs.evolve; the original stays as it was.
    longer = attrs.evolve(ctx, timeout=600.0)
    assert (longer.timeout, ctx.timeout) == (600.0, 30.0)


def test_a_tool_result_is_frozen() -> None:
    result = ToolResult.success("done", data={"n": 1}, hints=["next"])
    for field, value in (("ok", False), ("output", "changed"), ("hints", ()), ("full_output_path", "/tmp/x")):
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(result, field, value)
    assert (result.ok, result.output, result.hints, result.full_output_path) == (True, "done", ("next",), None)
    assert isinstance(result.hints, tuple)  # a list given is stored as a tuple, which cannot be changed either


def test_a_tool_config_is_frozen() -> None:
    config = ToolConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.max_output_lines = 10  # type: ignore[misc]


def _tool_imports(module: str) -> set[str]:
    """The ``weald.tools`` modules ``tools/<module>.py`` imports, at any place in it (type-checking blocks too)."""
    import ast

    source = Path(__file__).resolve().parents[2] / "tools" / f"{module}.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("weald.tools."):
            found.add(node.module.removeprefix("weald.tools."))
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("weald.tools.") for a in node.names if a.name.startswith("weald.tools."))
    return found


def test_the_contract_and_the_modules_beneath_it_import_one_way() -> None:
    # _names <- _errors <- _paths, _protected <- _contract <- _sandbox: no module imports one above it.
    order = ["_names", "_errors", "_paths", "_protected", "_contract", "_sandbox"]
    for index, module in enumerate(order):
        above = set(order[index + 1 :])
        assert not _tool_imports(module) & above, f"{module} imports {_tool_imports(module) & above}"
