"""The daemon's metrics: its counters read every second into fixed-size rings, for the observer's charts.

::

    /metrics   Sampler: every `SAMPLE_INTERVAL` seconds, one value per series into `MetricRings`

What is sampled (`SERIES`): the process's resident memory and CPU, the trio
loop's lag (how late a sleeping task wakes: the loop's scheduling delay, the
worst of four probes a second), turns, model calls, tokens in and out, tool
calls and restarts per second, store commits per second and their mean
latency, the store's size on disk, open connections (socket clients and
observer viewers) and the sessions awake and asleep.

Nearly every figure is a counter the daemon keeps anyway, read in constant
time: the event bus's count per topic (turns, tool calls, restarts,
connections), the store's commit count and commit time, the ``/sessions``
supervisor's `weald.supervisors.SupervisorStatistics` (asked once a
sample), ``os.times`` and ``/proc/self/statm``. Tokens are the one figure
no counter holds: a subscription to ``agent.message_end`` and
``agent.sampled`` (each model call's usage) is drained once a sample. The
sampler measures its own cost (`SamplerSnapshot.cost_seconds`: the CPU time
of its samples); the rings hold `POINTS` samples, ten minutes, whatever
the daemon's size.

`MetricRings` is the reusable part: one time axis and any number of named
series, each a fixed-size ring of floats, read whole or from a sequence
number on (what a viewer has not seen yet).
"""

from __future__ import annotations

import math
import os
import time
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import trio
from pykka.messages import ProxyCall
from weald.runtime import Actor, ActorDeadError, StoreError, WealdError

__all__ = [
    "POINTS",
    "SAMPLE_INTERVAL",
    "SERIES",
    "MetricRings",
    "MetricSpec",
    "Sampler",
    "SamplerSnapshot",
]

SAMPLE_INTERVAL = 1.0
"""Seconds between two samples."""
POINTS = 600
"""Samples each ring holds: ten minutes at one a second."""
_PROBES = 4  # loop-lag probes per sample


@attrs.frozen
class MetricSpec:
    """One series: its name, its unit and what it measures."""

    name: str
    unit: str
    help: str


SERIES: tuple[MetricSpec, ...] = (
    MetricSpec("rss_bytes", "bytes", "resident memory of the daemon process"),
    MetricSpec("loop_lag_ms", "ms", "the trio loop's scheduling delay: the latest a sleeping task woke, per interval"),
    MetricSpec("cpu_percent", "%", "the process's CPU time over wall time (100 = one core busy)"),
    MetricSpec("turns_per_s", "/s", "agent turns ended (agent.turn_end)"),
    MetricSpec("model_calls_per_s", "/s", "model calls answered (agent.message_end, agent.sampled)"),
    MetricSpec("tokens_in_per_s", "/s", "input tokens of those calls, cached ones included"),
    MetricSpec("tokens_out_per_s", "/s", "output tokens of those calls"),
    MetricSpec("tool_calls_per_s", "/s", "tool calls started (tool.started)"),
    MetricSpec("restarts_per_s", "/s", "supervised restarts (supervisor.child_restarted)"),
    MetricSpec("commits_per_s", "/s", "store transactions committed"),
    MetricSpec("commit_ms", "ms", "their mean latency over the interval"),
    MetricSpec("store_bytes", "bytes", "the store's files on disk (database and write-ahead log; none for PostgreSQL)"),
    MetricSpec("connections", "", "socket clients and observer viewers connected"),
    MetricSpec("sessions_awake", "", "top-level sessions whose actors run"),
    MetricSpec("sessions_asleep", "", "top-level sessions held by a stub (hibernated or started asleep)"),
)


class MetricRings:
    """Named series on one time axis, each a fixed-size ring of floats (NaN: no value).

    Appending costs the same however long the daemon runs; reading gives
    the samples from a sequence number on, oldest first.

    Args:
        names: the series.
        points: samples kept per series.
    """

    def __init__(self, names: Iterable[str], points: int = POINTS) -> None:
        if points < 1:
            msg = f"a ring holds at least one point, not {points}"
            raise ValueError(msg)
        self.names = tuple(names)
        self.points = points
        self._times = array("d", [math.nan]) * points
        self._values = {name: array("d", [math.nan]) * points for name in self.names}
        self.seq = 0  # samples appended so far; the newest has seq - 1

    def append(self, at: float, values: Mapping[str, float | None]) -> None:
        """Add one sample taken at ``at`` (seconds since the epoch); a series not given gets NaN."""
        slot = self.seq % self.points
        self._times[slot] = at
        for name, ring in self._values.items():
            value = values.get(name)
            ring[slot] = math.nan if value is None else float(value)
        self.seq += 1

    def latest(self, name: str) -> float | None:
        """The newest value of ``name``; None when there is none yet (or it was NaN)."""
        if not self.seq:
            return None
        value = self._values[name][(self.seq - 1) % self.points]
        return None if math.isnan(value) else value

    def since(self, seq: int = 0) -> tuple[int, list[float], dict[str, list[float | None]]]:
        """The samples numbered ``seq`` and later that the rings still hold, oldest first.

        Returns:
            (the next seq to ask for, their times, each series' values; None where NaN).
        """
        first = max(seq, self.seq - self.points, 0)
        slots = [n % self.points for n in range(first, self.seq)]
        times = [self._times[slot] for slot in slots]
        values: dict[str, list[float | None]] = {}
        for name, ring in self._values.items():
            values[name] = [None if math.isnan(v) else v for v in (ring[slot] for slot in slots)]
        return self.seq, times, values


@attrs.frozen
class SamplerSnapshot:
    """The sampler's state for introspection.

    Attributes:
        path: its path (``/metrics``).
        status: the actor's status.
        interval: seconds between samples.
        points: samples kept per series.
        samples: samples taken since it started.
        cost_seconds: CPU time its samples took, all told (its own cost).
        dropped_usage: model-call events missed (its subscription fell behind); their tokens are not counted.
    """

    path: str
    status: str
    interval: float
    points: int
    samples: int
    cost_seconds: float
    dropped_usage: int


@attrs.frozen
class _Asleep:
    """The ``/sessions`` supervisor's answer: its children and those asleep (None: no answer)."""

    counts: tuple[int, int] | None


class Sampler(Actor):
    """Samples the daemon's counters into `MetricRings` every `SAMPLE_INTERVAL` seconds; the ``/metrics`` actor.

    Args:
        interval: seconds between samples.
        points: samples kept per series.
        sessions_path: the supervisor of the top-level sessions.
    """

    def __init__(
        self, interval: float = SAMPLE_INTERVAL, points: int = POINTS, sessions_path: str = "/sessions"
    ) -> None:
        super().__init__()
        if not interval > 0:
            msg = f"the sampling interval is a number of seconds > 0, not {interval!r}"
            raise ValueError(msg)
        self._interval = float(interval)
        self._sessions_path = sessions_path
        self.rings = MetricRings((spec.name for spec in SERIES), points)
        self._statm: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._usage: Any = None  # the subscription to model calls' usage
        self._usage_dropped = 0
        self._previous: dict[str, float] = {}
        self._sessions: tuple[int, int] | None = None
        self._cost = 0.0

    # -- lifecycle ---------------------------------------------------------------------

    def on_start(self) -> None:
        """Open ``/proc/self/statm`` (kept open: one read a sample) and start sampling, on the loop."""
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None  # not Linux: no RSS series
        self._usage = self.system.events.subscribe(["agent.message_end", "agent.sampled"], max_buffer=65536)
        self._previous = self._counters()
        self.run_io(self._run, reply=_crash_on_error, name="sampling")

    def on_stop(self) -> None:
        """Close what `on_start` opened (the loop thread)."""
        self._close()

    def on_failure(self, *_: object) -> None:
        """As `on_stop`: nothing of a crashed sampler stays open."""
        self._close()

    def _close(self) -> None:
        if self._usage is not None:
            self._usage.close()
            self._usage = None
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None

    def on_receive(self, message: Any) -> None:
        """The sessions supervisor's counts arrived; or sampling broke (crash, to be restarted)."""
        if isinstance(message, _Asleep):
            self._sessions = message.counts
        elif isinstance(message, _Broken):
            msg = f"the metrics sampler stopped: {message.error!r}"
            raise WealdError(msg) from message.error

    # -- public, through the proxy -----------------------------------------------------

    def series(self, since: int = 0) -> dict[str, Any]:
        """The samples from ``since`` on (what a viewer has not seen), with what each series means.

        Returns:
            ``{"interval", "points", "next", "series": [{"name", "unit", "help"}...], "t": [...],
            "values": {name: [...]}}``: ``t`` in seconds since the epoch, a value None where none
            was taken; ``next`` is the ``since`` of the next call.
        """
        seq, times, values = self.rings.since(since)
        return {
            "interval": self._interval,
            "points": self.rings.points,
            "next": seq,
            "series": [attrs.asdict(spec) for spec in SERIES],
            "t": times,
            "values": values,
        }

    def snapshot(self) -> SamplerSnapshot:
        """Its settings, how many samples it took and what they cost."""
        return SamplerSnapshot(
            path=self.path,
            status=self._status,
            interval=self._interval,
            points=self.rings.points,
            samples=self.rings.seq,
            cost_seconds=round(self._cost, 6),
            dropped_usage=self._usage_dropped,
        )

    # -- sampling ---------------------------------------------------------------------------

    async def _run(self) -> None:
        """Probe the loop's lag `_PROBES` times an interval; sample at each interval's end."""
        step = self._interval / _PROBES
        due = trio.current_time() + step
        worst = 0.0
        probes = 0
        while True:
            await trio.sleep_until(due)
            now = trio.current_time()
            worst = max(worst, now - due)
            probes += 1
            if probes >= _PROBES:
                self._sample(worst)
                worst, probes = 0.0, 0
            due += step
            if due < now:  # the loop was stalled for more than a probe: start again from now
                due = now + step

    def _sample(self, lag: float) -> None:
        started = time.thread_time()
        now = time.time()
        counters = self._counters()
        previous, self._previous = self._previous, counters
        elapsed = counters["wall"] - previous["wall"]

        def rate(name: str) -> float | None:
            if elapsed <= 0:
                return None
            return max(counters[name] - previous[name], 0.0) / elapsed

        commits = counters["commits"] - previous["commits"]
        commit_time = counters["commit_seconds"] - previous["commit_seconds"]
        sessions = self._sessions
        values: dict[str, float | None] = {
            "rss_bytes": counters.get("rss"),
            "loop_lag_ms": lag * 1000,
            "cpu_percent": None if elapsed <= 0 else 100 * (counters["cpu"] - previous["cpu"]) / elapsed,
            "turns_per_s": rate("turns"),
            "model_calls_per_s": rate("model_calls"),
            "tokens_in_per_s": rate("tokens_in"),
            "tokens_out_per_s": rate("tokens_out"),
            "tool_calls_per_s": rate("tool_calls"),
            "restarts_per_s": rate("restarts"),
            "commits_per_s": rate("commits"),
            "commit_ms": 1000 * commit_time / commits if commits > 0 else None,
            "store_bytes": counters.get("store_bytes"),
            "connections": counters["connections"],
            "sessions_awake": None if sessions is None else sessions[0] - sessions[1],
            "sessions_asleep": None if sessions is None else sessions[1],
        }
        self.rings.append(now, values)
        self._ask_sessions()
        self._cost += time.thread_time() - started

    def _counters(self) -> dict[str, float]:
        """The daemon's cumulative counters now, each read in constant time."""
        times = os.times()
        topics: dict[str, int] = self.system.events.statistics()["topics"]
        counters: dict[str, float] = {
            "wall": time.monotonic(),
            "cpu": times.user + times.system,
            "turns": topics.get("agent.turn_end", 0),
            "tool_calls": topics.get("tool.started", 0),
            "restarts": topics.get("supervisor.child_restarted", 0),
            "connections": topics.get("server.connected", 0)
            - topics.get("server.disconnected", 0)
            + topics.get("observer.viewer_opened", 0)
            - topics.get("observer.viewer_closed", 0),
        }
        model_calls, tokens_in, tokens_out = self._drain_usage()
        previous = self._previous
        counters["model_calls"] = previous.get("model_calls", 0) + model_calls
        counters["tokens_in"] = previous.get("tokens_in", 0) + tokens_in
        counters["tokens_out"] = previous.get("tokens_out", 0) + tokens_out
        counters["commits"] = previous.get("commits", 0)
        counters["commit_seconds"] = previous.get("commit_seconds", 0)
        try:
            store = self.system.store
        except StoreError:  # restarting: its figures are carried over
            store = None
        if store is not None:
            counters["commits"] = store.commits
            counters["commit_seconds"] = store.commit_seconds
            if store.path is not None:  # a database server's size is not on this disk
                counters["store_bytes"] = _file_size(str(store.path)) + _file_size(f"{store.path}-wal")
        if self._statm is not None:
            fields = os.pread(self._statm, 128, 0).split()
            counters["rss"] = int(fields[1]) * self._page
        return counters

    def _drain_usage(self) -> tuple[int, int, int]:
        sub = self._usage
        if sub is None:
            return 0, 0, 0
        calls = tokens_in = tokens_out = 0
        for event in sub.drain_nowait():
            calls += 1
            usage = event.data.get("usage") or {}
            tokens_in += (
                usage.get("input_tokens", 0) + usage.get("cache_read_tokens", 0) + usage.get("cache_write_tokens", 0)
            )
            tokens_out += usage.get("output_tokens", 0)
        self._usage_dropped = sub.dropped
        return calls, tokens_in, tokens_out

    def _ask_sessions(self) -> None:
        """Ask the sessions supervisor for its counts; the answer comes back as a message (`_Asleep`)."""
        ref = self.system.whereis(self._sessions_path)
        if ref is None:
            self._sessions = None
            return
        try:
            future = ref.ask(ProxyCall(("statistics",), (), {}), block=False)
        except ActorDeadError:
            return

        async def answer() -> tuple[int, int] | None:
            with trio.move_on_after(self._interval):
                stats = await future
                return stats.children, stats.asleep
            return None

        self.run_io(answer, reply=_asleep, name="sessions count")


def _asleep(result: Any) -> _Asleep:
    value = getattr(result, "value", None)
    return _Asleep(value if isinstance(value, tuple) else None)


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


@attrs.frozen
class _Broken:
    error: BaseException


def _crash_on_error(result: Any) -> _Broken | None:
    error = getattr(result, "error", None)
    if error is None:
        return None
    return _Broken(error)
