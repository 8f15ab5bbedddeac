"""The recent durations of an operation (`weald.runtime._latency.LatencyWindow`): the store's commit latency."""

from __future__ import annotations

import threading

import pytest
from weald.runtime._latency import LatencySummary, LatencyWindow


def test_an_empty_window_has_no_figures() -> None:
    assert LatencyWindow(4).summary() == LatencySummary(0, 0, None, None, None, None, None)
    assert LatencyWindow(4).since(0) == (0, [])


def test_the_figures_are_over_the_newest_durations_the_ring_holds() -> None:
    window = LatencyWindow(100)
    for ms in range(1, 201):  # 1..200 ms; the ring keeps 101..200
        window.record(ms / 1000)
    summary = window.summary()
    assert (summary.count, summary.window) == (200, 100)
    assert summary.last_ms == 200.0
    assert summary.mean_ms == 150.5
    assert summary.p50_ms == 150.0
    assert summary.p99_ms == 199.0
    assert summary.max_ms == 200.0


def test_a_reader_gets_each_duration_once_and_skips_what_left_the_ring() -> None:
    window = LatencyWindow(3)
    window.record(0.1)
    window.record(0.2)
    seen, durations = window.since(0)
    assert (seen, durations) == (2, [0.1, 0.2])
    assert window.since(seen) == (2, [])
    for value in (0.3, 0.4, 0.5, 0.6):
        window.record(value)
    seen, durations = window.since(seen)
    assert (seen, durations) == (6, [0.4, 0.5, 0.6])  # 0.3 left the ring before the reader looked


def test_recording_from_many_threads_loses_nothing() -> None:
    window = LatencyWindow(10_000)

    def record() -> None:
        for _ in range(1000):
            window.record(0.001)

    threads = [threading.Thread(target=record) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert window.count == 8000
    assert len(window.since(0)[1]) == 8000


def test_a_window_holds_at_least_one_duration() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LatencyWindow(0)
