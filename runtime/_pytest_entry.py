"""The ``weald`` pytest entry point: the switch that turns weald's fixtures on.

pytest loads every installed ``pytest11`` entry point, so this module does
nothing but add the switch: weald's fixtures (``weald.runtime.pytest_plugin``)
are registered only when the project asks for them, with ``-p weald`` (on
the command line or in ``addopts``) or ``weald_fixtures = true`` in its
pytest configuration. ``-p no:weald`` keeps even the switch out.

Without the switch, a test that asks for one of weald's fixtures fails
saying how to turn them on (instead of pytest's "fixture not found").
"""

from __future__ import annotations

import types
from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_configure"]

_FIXTURES = "weald.runtime.pytest_plugin"
_NAMES = (
    "weald_config",
    "weald_daemon",
    "weald_faults",
    "weald_recording",
    "weald_registry",
    "weald_script",
    "weald_system",
)
_HOW = (
    "weald's pytest fixtures are off in this project: turn them on with -p weald (on the command line or "
    "in addopts), weald_fixtures = true in the pytest configuration, or "
    'pytest_plugins = ["weald.runtime.pytest_plugin"] in the top conftest.py'
)


def _off(name: str) -> Any:
    @pytest.fixture(name=name)
    def fixture() -> None:
        pytest.fail(f"{name}: {_HOW}", pytrace=False)

    return fixture


def _stand_ins() -> types.ModuleType:
    """Stand-ins for weald's fixtures while they are off, as a plugin module: each says how to turn them on."""
    module = types.ModuleType("weald_fixtures_off")
    for name in _NAMES:
        setattr(module, f"_{name}", _off(name))
    return module


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``weald_fixtures`` ini option."""
    parser.addini(
        "weald_fixtures",
        type="bool",
        default=False,
        help="register weald's fixtures (weald_daemon, weald_faults, ...); same as -p weald",
    )
    parser.addini(
        "weald_share_tools",
        type="bool",
        default=False,
        help="every weald_daemon gets every @tool defined in the test process (default: the test's own)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the fixtures if ``-p weald`` or ``weald_fixtures = true`` asks for them."""
    asked = "weald" in (config.option.plugins or []) or config.getini("weald_fixtures")
    if asked:
        config.pluginmanager.import_plugin(_FIXTURES)
    elif not config.pluginmanager.has_plugin(_FIXTURES):  # a conftest's pytest_plugins brings the real ones
        config.pluginmanager.register(_stand_ins(), "weald-fixtures-off")
