"""Fixtures for the end-to-end daemon tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import PERMISSIONS, DaemonProcess, serving
from system_packages import apt_install

# The loopback model server of tests/llm (`llm._server`) serves daemons here too.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.append(_TESTS)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A running daemon in a subprocess; stopped with SIGTERM (and checked to exit 0) afterwards."""
    with serving(tmp_path, extra_config=PERMISSIONS) as proc:
        yield proc


# -- a real browser, for the observer ------------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's chromium (installed with apt-get if missing: a failure, never a skip, when it cannot be)."""
    apt_install("chromium", present=CHROMIUM.exists, needed_for="the observer's browser tests")
    return CHROMIUM


@pytest.fixture
def browser_page(chromium: Path, tmp_path: Path) -> Iterator[Any]:
    """A Playwright page in headless chromium (the system's binary, never a download), with a fresh profile.

    Every request the page makes is recorded in ``page.weald_requests``; errors in its script fail the test.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(chromium),
            headless=True,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
            viewport={"width": 1440, "height": 900},
        )
        page = context.new_page()
        errors: list[str] = []
        requests: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("request", lambda request: requests.append(request.url))
        page.weald_requests = requests  # type: ignore[attr-defined]
        try:
            yield page
        finally:
            context.close()
        assert errors == [], f"the page's script failed: {errors}"
