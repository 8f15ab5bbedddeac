"""Shared fixtures: a running ActorSystem per test, and a check that it leaves no thread behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from weald.runtime import ActorSystem
from weald.runtime.testing import (
    LOOP_GUARD_ENV,
    install_loop_guard,
    process_alive,
    take_loop_guard_violations,
    wait_until,
)

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
