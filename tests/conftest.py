"""Shared fixtures: a running ActorSystem per test, and a check that it leaves no thread behind."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest
from weald.runtime import ActorSystem
from weald.runtime.testing import process_alive, wait_until


def _our_threads() -> set[threading.Thread]:
    # trio keeps a global cache of idle worker threads ("Trio thread N") that
    # exit on their own; they belong to trio, not to the system under test.
    return {t for t in threading.enumerate() if not t.name.startswith("Trio thread")}


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
