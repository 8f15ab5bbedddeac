"""weald's pytest fixtures, for fault tests of your own agents and tools.

Off unless your project turns it on: ``-p weald`` (command line or
``addopts``), ``weald_fixtures = true`` in the pytest configuration, or
``pytest_plugins = ["weald.runtime.pytest_plugin"]`` in the top conftest.
``docs/faults.md`` has a complete example.

Fixtures (each test gets its own):

- ``weald_daemon``: a real daemon in the test's process, on a temporary
  socket and store, with fault injection on (`DaemonHarness`);
- ``weald_faults``: a `Faults` handle on the injector of ``weald_daemon``
  when the test uses it, else of ``weald_system``;
- ``weald_system``: a started `ActorSystem` with its store in the test's
  temporary directory, for tests that wire sessions themselves;
- ``weald_script``: a `ScriptBuilder` writing a scripted model in the
  test's temporary directory;
- ``weald_recording``: loads a recording (``weald run --record``) as a
  `Recording`, a relative path taken from the test file's directory;
- ``weald_config`` (``{}``) and ``weald_registry`` (the built-in tools and
  those the test's own module and its ``conftest.py`` files define): override
  them to configure ``weald_daemon``. A tool defined in another test file
  does not join: ``weald_share_tools = true`` in the pytest configuration, or
  ``@pytest.mark.weald_shared_tools`` on a test, gives every ``@tool`` of the
  test process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from weald.runtime import ActorSystem
from weald.runtime.faults import FaultInjector
from weald.runtime.testing import DaemonHarness, Faults, Recording, ScriptBuilder
from weald.tools import Tool, ToolRegistry, default_registry

__all__ = [
    "weald_config",
    "weald_daemon",
    "weald_faults",
    "weald_recording",
    "weald_registry",
    "weald_script",
    "weald_system",
]


@pytest.fixture
def weald_config() -> dict[str, Any]:
    """weald.toml settings for ``weald_daemon``, as a mapping; override it to configure the daemon."""
    return {}


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``weald_shared_tools`` marker."""
    config.addinivalue_line("markers", "weald_shared_tools: weald_daemon gets every @tool of the test process")


@pytest.fixture
def weald_registry(request: pytest.FixtureRequest) -> ToolRegistry:
    """The tools ``weald_daemon`` offers: the built-ins, and those of this test's module and its conftest files.

    Every ``@tool`` of the process joins with ``weald_share_tools = true`` or
    ``@pytest.mark.weald_shared_tools``.
    """
    if request.config.getini("weald_share_tools") or request.node.get_closest_marker("weald_shared_tools"):
        return default_registry.copy()
    test_file = Path(str(request.path)).resolve()
    own = {test_file, *(parent / "conftest.py" for parent in test_file.parents)}
    return ToolRegistry(tool for tool in default_registry.select() if _builtin(tool) or _defined_in(tool, own))


def _builtin(tool: Tool) -> bool:
    return str(getattr(tool.fn, "__module__", "")).startswith(("weald.tools", "weald.runtime"))


def _defined_in(tool: Tool, files: set[Path]) -> bool:
    code = getattr(tool.fn, "__code__", None)
    return code is not None and Path(code.co_filename).resolve() in files


@pytest.fixture
def weald_daemon(tmp_path: Path, weald_config: dict[str, Any], weald_registry: ToolRegistry) -> Iterator[DaemonHarness]:
    """A real daemon on a temporary socket and store, fault injection on; stopped after the test."""
    with DaemonHarness(tmp_path / "weald", config=weald_config, registry=weald_registry) as daemon:
        yield daemon


@pytest.fixture
def weald_system(tmp_path: Path) -> Iterator[ActorSystem]:
    """A started actor system, its store in the test's directory; shut down after the test."""
    with ActorSystem(store_path=tmp_path / "weald-store.db") as system:
        yield system


@pytest.fixture
def weald_faults(request: pytest.FixtureRequest) -> Iterator[Faults]:
    """The fault injector of ``weald_daemon`` if the test uses it, else one installed in ``weald_system``."""
    if "weald_daemon" in request.fixturenames:
        daemon: DaemonHarness = request.getfixturevalue("weald_daemon")
        yield daemon.faults
        return
    system: ActorSystem = request.getfixturevalue("weald_system")
    injector = FaultInjector()
    injector.install(system)
    try:
        yield Faults(injector)
    finally:
        injector.uninstall()


@pytest.fixture
def weald_script(tmp_path: Path) -> ScriptBuilder:
    """A scripted model to build turn by turn; ``.model`` writes it and gives its ``scripted:`` spec."""
    return ScriptBuilder(tmp_path)


@pytest.fixture
def weald_recording(request: pytest.FixtureRequest) -> Callable[[str | os.PathLike[str]], Recording]:
    """Load a recording; a relative path is taken from the directory of the test's file."""
    base = Path(request.path).parent

    def load(path: str | os.PathLike[str]) -> Recording:
        return Recording(base / path)

    return load
