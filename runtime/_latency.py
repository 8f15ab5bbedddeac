"""The recent durations of one operation (the store's commits): a fixed ring, cheap to add to from any thread."""

from __future__ import annotations

import threading

import attrs

__all__ = ["LatencySummary", "LatencyWindow"]


@attrs.frozen
class LatencySummary:
    """The durations in a `LatencyWindow`, in milliseconds.

    Attributes:
        count: how many were recorded since the start.
        window: how many the figures below are over (the most recent, at most the ring's size).
        last_ms: the newest.
        mean_ms: their mean.
        p50_ms: their median.
        p99_ms: the 99th percentile (nearest rank).
        max_ms: the longest.
    """

    count: int
    window: int
    last_ms: float | None
    mean_ms: float | None
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None


class LatencyWindow:
    """The last ``size`` durations of an operation, and how many there were in all; thread-safe.

    `record` costs a lock and a list store (the store's committer calls it
    once per group commit). Readers take the figures (`summary`) or the
    durations recorded since they last looked (`since`, for a histogram).

    Args:
        size: how many of the newest durations are kept.
    """

    def __init__(self, size: int = 1024) -> None:
        if size < 1:
            msg = "a latency window keeps at least one duration"
            raise ValueError(msg)
        self._ring = [0.0] * size
        self._size = size
        # Invariant: the newest min(count, size) durations are in _ring, the newest at (count - 1) % size.
        self._count = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<LatencyWindow count={self._count} size={self._size}>"

    @property
    def count(self) -> int:
        """How many durations were recorded since the start."""
        return self._count

    def record(self, seconds: float) -> None:
        """Add one duration, in seconds."""
        with self._lock:
            self._ring[self._count % self._size] = seconds
            self._count += 1

    def since(self, seen: int) -> tuple[int, list[float]]:
        """The durations recorded after the first ``seen`` (oldest first, those still held), and the count now.

        A reader passes back the count it got, so it sees each duration once;
        durations that left the ring before it looked are skipped.
        """
        with self._lock:
            count = self._count
            first = max(seen, count - self._size, 0)
            return count, [self._ring[i % self._size] for i in range(first, count)]

    def summary(self) -> LatencySummary:
        """The figures over the durations the ring holds."""
        with self._lock:
            count = self._count
            held = min(count, self._size)
            values = [self._ring[i % self._size] for i in range(count - held, count)]
        if not values:
            return LatencySummary(count, 0, None, None, None, None, None)
        ordered = sorted(values)

        def ms(seconds: float) -> float:
            return round(seconds * 1000, 3)

        rank99 = max(0, -(-99 * len(ordered) // 100) - 1)  # nearest rank: ceil(0.99 n), 1-based
        return LatencySummary(
            count=count,
            window=len(values),
            last_ms=ms(values[-1]),
            mean_ms=ms(sum(values) / len(values)),
            p50_ms=ms(ordered[(len(ordered) - 1) // 2]),
            p99_ms=ms(ordered[rank99]),
            max_ms=ms(ordered[-1]),
        )
