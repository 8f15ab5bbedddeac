"""Shared fixtures: a running ActorSystem per test, and a check that it leaves no thread behind.

``bubblewrap``: the OS sandbox's ``bwrap``, installed with apt-get when it is
missing (as tests/mcp/conftest.py installs its npm servers); a machine where
it cannot be installed or cannot sandbox makes the tests that need it
*fail*, naming what is missing, never skip.

``pg_cluster``: a throwaway PostgreSQL cluster (Debian's ``postgresql``,
installed with apt-get when missing; `pg_cluster.PgCluster`), one per test
process (so one per xdist worker), each test module taking a fresh database
of its own (``pg_database`` in the module). fsync is off in it: these tests
kill daemons and cut connections, never the machine under the server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from system_packages import apt_install
from weald.runtime import ActorSystem
from weald.runtime.testing import (
    LOOP_GUARD_ENV,
    install_loop_guard,
    process_alive,
    take_loop_guard_violations,
    wait_until,
)
from weald.tools import SANDBOX_ENABLE_HINT, sandbox_status

# Every trio loop of the suite, in this process and in the daemons it starts
# (they inherit the variable), reports blocking calls made on its thread.
os.environ[LOOP_GUARD_ENV] = "1"
install_loop_guard()


@pytest.fixture(autouse=True)
def _no_blocking_calls_on_the_loop() -> Iterator[None]:
    """Fail a test during which a loop thread of this process made a blocking file or socket call."""
    take_loop_guard_violations()
    yield
    caught = take_loop_guard_violations()
    if caught:
        listed = "\n".join(f"  {v}\n{v.stack}" for v in caught)
        pytest.fail(f"blocking calls on the trio loop thread ({len(caught)}):\n{listed}", pytrace=False)


# pytester runs the docs' pytest example files in a fresh pytest (tests/runtime/test_pytest_plugin.py).
pytest_plugins = ["pytester"]


def _our_threads() -> set[threading.Thread]:
    # trio keeps a global cache of idle worker threads ("Trio thread N") that
    # exit on their own; they belong to trio, not to the system under test.
    # "weald-spawner" forks every child process, for the life of the process
    # (a child's parent-death signal fires when its forking thread exits).
    return {t for t in threading.enumerate() if not t.name.startswith("Trio thread") and t.name != "weald-spawner"}


@pytest.fixture
def system(tmp_path) -> Iterator[ActorSystem]:
    """A started system with its store in tmp_path; checks no thread outlives it."""
    before = _our_threads()
    with ActorSystem(store_path=tmp_path / "store.db") as s:
        yield s
    wait_until(
        lambda: not (_our_threads() - before),
        timeout=10,
        message=lambda: f"threads left behind: {sorted(t.name for t in _our_threads() - before)}",
    )


@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    """Pids a test started; any still running at teardown is killed, so a failing test leaves nothing behind."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``tmpfs("3m")`` mounts a real tmpfs of that size in tmp_path and returns it; unmounted at teardown.

    Mounting needs root (CAP_SYS_ADMIN): where it is refused the test fails
    saying so, it is not skipped.
    """
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounts)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"this test needs a real tmpfs (run as root): mount failed: {done.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in reversed(mounts):
        # lazy: a process of a failed test may still hold a file open there
        subprocess.run(["umount", "--lazy", str(where)], check=True)


@pytest.fixture(scope="session")
def bubblewrap() -> str:
    """The path of a ``bwrap`` that works here: installed if missing, then checked by running a sandbox."""
    apt_install("bubblewrap", present=lambda: shutil.which("bwrap") is not None, needed_for="the OS sandbox tests")
    status = sandbox_status(refresh=True)
    if not status.available or status.bwrap is None:
        pytest.fail(f"the OS sandbox does not work here: {status.reason}. To fix: {SANDBOX_ENABLE_HINT}", pytrace=False)
    return status.bwrap


@pytest.fixture(scope="session")
def git() -> str:
    """The path of a real ``git``, installed if missing (the tests of git's configuration and hooks run it)."""
    apt_install("git", present=lambda: shutil.which("git") is not None, needed_for="the tests of git's hooks")
    found = shutil.which("git")
    if found is None:
        pytest.fail("git is not installed and could not be installed", pytrace=False)
    return found


@pytest.fixture
def path_without_bwrap(tmp_path: Path) -> str:
    """A ``PATH`` with the usual programs (bash, sh, env, cat, ls...) but no ``bwrap``: a machine without bubblewrap."""
    bin_dir = tmp_path / "bin-without-bwrap"
    bin_dir.mkdir()
    for name in ("bash", "sh", "env", "echo", "true", "cat", "ls", "python3", "node", "npx"):
        found = shutil.which(name)
        if found is not None:
            (bin_dir / name).symlink_to(found)
    return str(bin_dir)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A running throwaway PostgreSQL cluster for this test process; a missing piece fails, naming it."""
    from pg_cluster import PgCluster, PgUnavailable

    try:
        cluster = PgCluster(fsync=False).init().start()
    except PgUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(scope="session")
def loopback_listener() -> Iterator[int]:
    """The port of a TCP server on the host's loopback that answers every connection with ``hello``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"hello\n")

    thread = threading.Thread(target=serve, name="loopback-listener", daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()
