"""Fixtures for the end-to-end daemon tests."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving

# The loopback model server of tests/llm (`llm._server`) serves daemons here too.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

PERMISSIONS = """
[tools.permissions]
write_file = "ask"
edit_file = "ask"
shell = "ask"
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A running daemon in a subprocess; stopped with SIGTERM (and checked to exit 0) afterwards."""
    with serving(tmp_path, extra_config=PERMISSIONS) as proc:
        yield proc


# -- a real browser, for the observer ------------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")
_APT_TIMEOUT = 900.0


def _apt_install_chromium() -> None:
    """Install Debian's chromium with apt-get; fail, naming what is missing, if that cannot be done."""
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.fail(
            f"the observer's browser tests need Debian's chromium at {CHROMIUM}, and there is no apt-get to install it",
            pytrace=False,
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open("/tmp/weald-test-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions install once
        if CHROMIUM.exists():
            return
        for args in ([apt, "update", "-q"], [apt, "install", "-y", "-q", "--no-install-recommends", "chromium"]):
            done = subprocess.run(args, capture_output=True, text=True, timeout=_APT_TIMEOUT, env=env, check=False)
            if done.returncode != 0:
                pytest.fail(
                    f"installing chromium for the observer's browser tests failed ({' '.join(args)}):\n"
                    f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}",
                    pytrace=False,
                )
    if not CHROMIUM.exists():
        pytest.fail(f"apt-get installed chromium, but {CHROMIUM} is not there", pytrace=False)


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's chromium (installed with apt-get if missing: a failure, never a skip, when it cannot be)."""
    if not CHROMIUM.exists():
        _apt_install_chromium()
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
