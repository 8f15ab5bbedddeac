"""Fixtures for the tool tests: a sandbox with a project directory, and a way to call tools.

``project`` is the working directory; ``outside`` holds ``secret.txt``, a file
no tool may read or change. ``call(tool, **arguments)`` goes through
`weald.tools.invoke`, so argument validation and error translation run as in
the tool runner.

Note for the layout: this directory has no ``__init__.py`` (see tests/mcp):
test modules keep unique basenames instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from weald.tools import SessionServices, Tool, ToolConfig, ToolContext, ToolResult, invoke
from weald.tools._ledger import ReadLedger

SECRET = b"top secret\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.fixture
def secret() -> bytes:
    """The content of ``outside/secret.txt``: finding it anywhere a tool wrote or showed is a leak."""
    return SECRET


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_bytes(SECRET)
    return path


@pytest.fixture
def ledger() -> ReadLedger:
    return ReadLedger()


@pytest.fixture
def make_ctx(project: Path, tmp_path: Path, ledger: ReadLedger) -> Callable[..., ToolContext]:
    """A context in ``project`` with the session's ledger; keywords override fields, ``options`` sets config."""

    def make(*, options: dict[str, dict[str, Any]] | None = None, **fields: Any) -> ToolContext:
        fields.setdefault("working_dir", project)
        fields.setdefault("session", SessionServices(output_dir=tmp_path / "output", ledger=ledger))
        if options is not None:
            fields["config"] = ToolConfig(options=options)
        return ToolContext(**fields)

    return make


@pytest.fixture
def ctx(make_ctx: Callable[..., ToolContext]) -> ToolContext:
    return make_ctx()


@pytest.fixture
def call(ctx: ToolContext) -> Callable[..., ToolResult]:
    """``call(tool, ctx=None, **arguments)``: run a tool through `invoke` (in ``ctx`` unless given)."""
    default = ctx

    def call_(tool: Tool, /, *, ctx: ToolContext | None = None, **arguments: Any) -> ToolResult:
        return trio.run(invoke, tool, ctx or default, arguments)

    return call_
