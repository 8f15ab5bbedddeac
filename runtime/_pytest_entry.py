"""The ``weald`` pytest entry point: the switch that turns weald's fixtures on.

pytest loads every installed ``pytest11`` entry point, so this module does
nothing but add the switch: weald's fixtures (``weald.runtime.pytest_plugin``)
are registered only when the project asks for them, with ``-p weald`` (on
the command line or in ``addopts``) or ``weald_fixtures = true`` in its
pytest configuration. ``-p no:weald`` keeps even the switch out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

__all__ = ["pytest_addoption", "pytest_configure"]

_FIXTURES = "weald.runtime.pytest_plugin"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``weald_fixtures`` ini option."""
    parser.addini(
        "weald_fixtures",
        type="bool",
        default=False,
        help="register weald's fixtures (weald_daemon, weald_faults, ...); same as -p weald",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the fixtures if ``-p weald`` or ``weald_fixtures = true`` asks for them."""
    asked = "weald" in (config.option.plugins or []) or config.getini("weald_fixtures")
    if asked:
        config.pluginmanager.import_plugin(_FIXTURES)
