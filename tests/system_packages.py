"""Debian packages the tests need, installed by the tests themselves (never a skip when missing).

Fixtures call `apt_install` (bubblewrap for the sandbox tests, chromium for
the observer's browser tests, postgresql for the store tests...). A machine
where a package cannot be installed makes the tests that need it fail,
naming what is missing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

_APT_TIMEOUT = 900.0

# One lock for every package the suite installs (bubblewrap, chromium, postgresql...):
# xdist workers and parallel test runs install one at a time, and apt waits
# for dpkg's own lock too, so nothing fails on "Could not get lock".
APT_LOCK = Path("/tmp/weald-test-apt.lock")


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=600", *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=_APT_TIMEOUT, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"apt-get {' '.join(args)} did not run: {exc}", pytrace=False)


def apt_install(package: str, *, present: Callable[[], bool], needed_for: str) -> None:
    """Install Debian's ``package`` unless ``present()``; fail, naming what is missing, if that cannot be done.

    Tests call it from their fixtures (a missing piece is a failure, never a
    skip). One lock serialises every install of the suite; a fresh machine's
    empty package lists are fetched once, when the first install needs them.
    """
    if present():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.fail(
            f"{needed_for} need Debian's {package}, which is not installed, and this test run cannot install it "
            f"(apt-get needs root on a Debian-like system); install the {package} package",
            pytrace=False,
        )
    with open(APT_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if present():
            return
        done = _apt_get("install", "-y", "--no-install-recommends", package)
        if done.returncode != 0:  # a fresh machine has no package lists yet
            _apt_get("update")
            done = _apt_get("install", "-y", "--no-install-recommends", package)
        if done.returncode != 0 or not present():
            pytest.fail(
                f"apt-get install {package} (for {needed_for}) failed (exit {done.returncode}); is the package "
                f"mirror reachable?\n{done.stdout[-1500:]}\n{done.stderr[-2000:]}",
                pytrace=False,
            )
