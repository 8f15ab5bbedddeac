"""History retention: how much of each agent's stored conversation is kept, applied without blocking a turn.

An agent's history (``history/<key>/<seq:08d>``, see `weald.runtime.agents.agent`)
is only ever appended to; ``[history] retention`` (per project) bounds it:
``"all"`` (the default) keeps everything, ``"N days"`` removes messages once
they are N days old, ``"N turns"`` keeps the last N turns before the last
compaction. Only messages older than the context the agent would be restored
with can go: those below its record's ``context_from`` (the first message its
last compaction kept), and never a compaction's summary (the history's
marks). Everything a restore reads (the record, the last summary, every
message from its first kept one on) stays. A turn's record goes with the last
of its messages.

`HistoryKeeper` runs the passes: every ``[store] gc_interval`` seconds on the
daemon's loop, and when asked (``history.gc``, ``weald gc``). A pass runs in
a worker thread and deletes at most `BATCH` keys per transaction, so an
agent's writes wait at most one small transaction; a pass the daemon's
shutdown interrupts stops between two of them. The keeper also watches the
store's size: past ``[store] warn_bytes`` it publishes ``store.size_warning``
(once each time the size goes past it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Literal

import attrs
import msgspec
import trio
from weald.runtime import ActorSystem, StoreError
from weald.runtime._codec import msgspec_decoder
from weald.runtime.agents.agent import AgentRecord

__all__ = ["BATCH", "GcReport", "HistoryKeeper", "RetentionJob", "collect_blocking"]

logger = logging.getLogger("weald.runtime")

#: Keys deleted per transaction.
BATCH: Final = 256

# The first pass waits this long after the daemon starts (its restore comes first).
_FIRST_PASS_DELAY: Final = 60.0
# How often the store's size is looked at, at most.
_SIZE_INTERVAL: Final = 60.0

_DAY: Final = 86_400.0


@attrs.frozen
class RetentionJob:
    """A session whose history a pass looks at, and its project's retention.

    Attributes:
        session_id: the session (its sub-agents' histories are looked at with it).
        kind: ``"days"`` or ``"turns"``.
        count: how many.
    """

    session_id: str
    kind: Literal["days", "turns"]
    count: int


@attrs.frozen
class GcReport:
    """What a retention pass removed.

    Attributes:
        sessions: sessions whose project keeps less than everything.
        agents: agent histories looked at (sub-agents' included).
        messages: history messages removed.
        turns: turn records removed.
        bytes: the bytes of the stored values removed (the store file keeps
            its size; the space is reused by new writes).
        store_bytes: the store's size after the pass.
        seconds: how long the pass took.
        problems: sessions that could not be looked at, and why (a project
            whose configuration has errors, a store error).
        interrupted: the daemon's shutdown stopped the pass before its end.
    """

    sessions: int = 0
    agents: int = 0
    messages: int = 0
    turns: int = 0
    bytes: int = 0
    store_bytes: int = 0
    seconds: float = 0.0
    problems: tuple[str, ...] = ()
    interrupted: bool = False

    def to_dict(self) -> dict[str, Any]:
        """As plain data (``history.gc``, ``daemon.status``)."""
        return {**attrs.asdict(self), "problems": list(self.problems)}


class _Head(msgspec.Struct):
    """What a pass reads of a history entry (the message itself is skipped, not decoded)."""

    seq: int
    turn_id: str = ""
    time: float = 0.0
    compaction: dict[str, Any] | None = None


_HEAD: Final = msgspec_decoder(_Head)


def collect_blocking(
    store: Any, jobs: Sequence[RetentionJob], *, now: float | None = None, stop: threading.Event | None = None
) -> GcReport:
    """Apply each job's retention to its session's histories (blocking: run it in a worker thread).

    Args:
        store: the daemon's store.
        jobs: the sessions and their retention.
        now: the time ``"N days"`` counts back from (default: now).
        stop: set to end the pass between two transactions.

    Returns:
        What was removed (the problems of sessions that could not be looked at included).
    """
    began = time.monotonic()
    now = time.time() if now is None else now
    agents = messages = turns = freed = 0
    problems: list[str] = []
    interrupted = False
    for job in jobs:
        if stop is not None and stop.is_set():
            interrupted = True
            break
        try:
            keys = [job.session_id, *store.keys("agents", f"{job.session_id}.")]
            for key in keys:
                removed = _collect_agent(store, key, job, now, stop)
                agents += 1
                messages += removed[0]
                turns += removed[1]
                freed += removed[2]
        except StoreError as exc:
            problems.append(f"{job.session_id}: {exc}")
    size = int(store.statistics().get("bytes", 0))
    return GcReport(
        sessions=len(jobs),
        agents=agents,
        messages=messages,
        turns=turns,
        bytes=freed,
        store_bytes=size,
        seconds=round(time.monotonic() - began, 3),
        problems=tuple(problems),
        interrupted=interrupted or (stop is not None and stop.is_set()),
    )


def _collect_agent(
    store: Any, key: str, job: RetentionJob, now: float, stop: threading.Event | None
) -> tuple[int, int, int]:
    """One agent's history: ``(messages, turn records, bytes)`` removed."""
    record = store.get("agents", key, type=AgentRecord)
    if record is None or record.context_from <= 0:
        return 0, 0, 0  # never compacted: every message is in the context a restore rebuilds
    kept_from = f"{record.context_from:08d}"
    older = [
        (entry_key, raw, _HEAD.decode(raw))
        for entry_key, raw in store.items_range("history", f"{key}/", stop=kept_from, type=msgspec.Raw)
    ]
    candidates = [(entry_key, raw, head) for entry_key, raw, head in older if head.compaction is None]
    if job.kind == "days":
        cutoff = now - job.count * _DAY
        doomed = [c for c in candidates if c[2].time < cutoff]
    else:
        order = list(dict.fromkeys(head.turn_id for _, _, head in candidates))
        keep = set(order[-job.count :])
        doomed = [c for c in candidates if c[2].turn_id not in keep]
    if not doomed:
        return 0, 0, 0
    gone = {entry_key for entry_key, _, _ in doomed}
    remaining = {head.turn_id for entry_key, _, head in older if entry_key not in gone}
    remaining.update(head.turn_id for _, head in store.items_range("history", f"{key}/", start=kept_from, type=_Head))
    finished = sorted({head.turn_id for _, _, head in doomed} - remaining - {""})
    removed = freed = records = 0
    for start in range(0, len(doomed), BATCH):
        if stop is not None and stop.is_set():
            return removed, records, freed  # the turn records wait for a pass that ends
        batch = doomed[start : start + BATCH]
        removed += store.delete_many("history", [entry_key for entry_key, _, _ in batch])
        freed += sum(len(raw) for _, raw, _ in batch)
    turn_keys = [f"{key}/{turn_id}" for turn_id in finished]
    for start in range(0, len(turn_keys), BATCH):
        if stop is not None and stop.is_set():
            break
        batch_keys = turn_keys[start : start + BATCH]
        for turn_key in batch_keys:
            raw = store.get("turns", turn_key, type=msgspec.Raw)
            freed += len(raw) if raw is not None else 0
        records += store.delete_many("turns", batch_keys)
    return removed, records, freed


class HistoryKeeper:
    """Applies ``[history] retention`` in the background and on request; watches the store's size.

    Args:
        system: the daemon's actor system (its store, its loop, its events).
        plan: returns the sessions to look at and their retention, and the
            problems met finding them (runs on the loop; may read in worker threads).
        interval: seconds between passes (``[store] gc_interval``); 0: only on request.
        warn_bytes: the store size past which ``store.size_warning`` is published; 0: never.
        spill_bytes: measures this node's spill files from the store's rows
            (blocking: in a worker thread), each minute with the store's size.
    """

    def __init__(
        self,
        system: ActorSystem,
        plan: Callable[[], Awaitable[tuple[list[RetentionJob], list[str]]]],
        *,
        interval: float,
        warn_bytes: int,
        spill_bytes: Callable[[], int] | None = None,
    ) -> None:
        self._system = system
        self._plan = plan
        self._spill = spill_bytes
        self.spill_bytes: int | None = None  # this node's spill files as last measured (None: not yet, or unreadable)
        self.interval = interval
        self.warn_bytes = warn_bytes
        self._stop = threading.Event()
        self._lock: trio.Lock | None = None  # made on the loop: one pass at a time
        self._over = False  # the store is past warn_bytes (warned once until it comes back under)
        self.store_bytes: int | None = None  # the store's size as last measured (None: not yet)
        self.passes = 0
        self.last: GcReport | None = None
        self.last_at: float | None = None

    def stop_nowait(self) -> None:
        """End a running pass between two transactions, and start no other (the daemon stops)."""
        self._stop.set()

    async def collect(self) -> GcReport:
        """Run one pass now (after the one running, if one is); returns what it removed."""
        if self._lock is None:
            self._lock = trio.Lock()
        async with self._lock:
            jobs, problems = await self._plan()
            store = self._system.store
            report = await trio.to_thread.run_sync(lambda: collect_blocking(store, jobs, stop=self._stop))
            if problems:
                report = attrs.evolve(report, problems=(*problems, *report.problems))
            self.passes += 1
            self.last, self.last_at = report, time.time()
            if report.messages:
                logger.info(
                    "history retention removed %d messages and %d turn records (%d bytes) in %.1f s",
                    report.messages,
                    report.turns,
                    report.bytes,
                    report.seconds,
                )
            self._check_size(report.store_bytes)
            return report

    async def follow(self) -> None:
        """Pass every ``interval`` seconds, and measure the store's size (and spill) each minute, until cancelled.

        A loop task.
        """
        next_pass = trio.current_time() + min(_FIRST_PASS_DELAY, self.interval or _FIRST_PASS_DELAY)
        while not self._stop.is_set():
            if self.interval and trio.current_time() >= next_pass:
                try:
                    await self.collect()
                except Exception:  # a failed pass is logged; the next one tries again
                    logger.exception("a history retention pass failed")
                next_pass = trio.current_time() + self.interval
            else:
                self._check_size(await trio.to_thread.run_sync(self._size))
            if self._spill is not None:
                self.spill_bytes = await trio.to_thread.run_sync(self._spill_size)
            wait = _SIZE_INTERVAL
            if self.interval:
                wait = min(wait, max(0.0, next_pass - trio.current_time()))
            await trio.sleep(wait)

    def _size(self) -> int:
        try:
            return int(self._system.store.statistics().get("bytes", 0))
        except StoreError:
            return 0

    def _spill_size(self) -> int | None:
        assert self._spill is not None
        try:
            return self._spill()
        except StoreError:
            return None

    def _check_size(self, size: int) -> None:
        self.store_bytes = size
        over = bool(self.warn_bytes) and size > self.warn_bytes
        if over and not self._over:
            self._system.events.publish(
                "store.size_warning",
                "/",
                {
                    "bytes": size,
                    "warn_bytes": self.warn_bytes,
                    "store": str(self._system.store_path),
                    "hint": "set [history] retention in the projects' weald.toml, then run weald gc",
                },
            )
            logger.warning("the store %s holds %d bytes, past [store] warn_bytes", self._system.store_path, size)
        self._over = over

    def statistics(self) -> dict[str, Any]:
        """For ``daemon.status``: the passes so far, the last one, the settings."""
        return {
            "gc_interval": self.interval,
            "warn_bytes": self.warn_bytes,
            "over_warn_bytes": self._over,
            "passes": self.passes,
            "last_pass": None if self.last is None else {"at": self.last_at, **self.last.to_dict()},
        }
