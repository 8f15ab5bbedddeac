"""The event bus: publish/subscribe by topic, with a bounded ring of recent events.

Publishing never blocks and never waits on a subscriber: every subscription
has a bounded buffer; when a slow subscriber's buffer is full, its oldest
event is dropped and counted (``Subscription.dropped``). The ring keeps the
last ``ring_size`` events for introspection (``recent``).

Topics are dotted names (``supervisor.child_crashed``, ``tool.finished``);
subscriptions match with shell-style patterns (``tool.*``, ``*``) and can be
narrowed to events whose source path starts with a prefix (one session).
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
import trio
from weald.runtime import _secrets
from weald.runtime._future import LOOP_WAKES
from weald.runtime._secrets import REDACTED, is_secret_name, redact, redact_text

__all__ = ["Event", "EventBus", "Subscription"]

# Whether a payload key looks secret, per key. Event payloads use a small,
# fixed set of keys, and the regex search behind `is_secret_name` was most of
# the cost of publishing (a tool call publishes four events). Bounded: keys
# beyond the bound are checked every time, never cached.
_SECRET_KEY_CACHE: dict[str, bool] = {}
_SECRET_KEY_CACHE_MAX = 4096

# Values `redact` returns as they are; they skip the call.
_PLAIN = frozenset({int, float, bool, type(None)})


def _redact_payload(data: Mapping[str, Any]) -> dict[str, Any]:
    """``redact(dict(data))`` in one pass: the same result, without the copy and re-checks.

    Invariant: for every key and value this returns exactly what `redact`
    returns for the mapping (a secret-looking string key with a truthy value
    becomes `REDACTED`, strings are cut with `redact_text`, nested values go
    through `redact`), so the bus's guarantee does not depend on this path.
    """
    out: dict[str, Any] = {}
    cache = _SECRET_KEY_CACHE
    # No known secret values (the common case) means strings pass unchanged;
    # `redact_text` would say so once per string.
    cut_text = _secrets._pattern is not None
    for key, value in data.items():
        if key.__class__ is str or isinstance(key, str):
            secret = cache.get(key)
            if secret is None:
                secret = is_secret_name(key)
                if len(cache) < _SECRET_KEY_CACHE_MAX and key.__class__ is str:
                    cache[key] = secret
            if secret and value:
                out[key] = REDACTED
                continue
        cls = value.__class__
        if cls is str:
            out[key] = redact_text(value) if cut_text else value
        elif cls in _PLAIN:
            out[key] = value
        else:
            out[key] = _redact_value(value)
    return out


def _redact_value(value: Any) -> Any:
    """`redact` of a nested value, with plain dicts, lists and tuples taken here (keys cached)."""
    cls = value.__class__
    if cls is str:
        return redact_text(value)
    if cls in _PLAIN:
        return value
    if cls is dict:
        return _redact_payload(value)
    if cls is list or cls is tuple:
        return [_redact_value(v) for v in value]  # as redact does: a tuple becomes a list
    return redact(value)


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One published event.

    Attributes:
        seq: position in the bus's total order, starting at 1.
        time: wall-clock time of publication (seconds since the epoch).
        topic: dotted topic name.
        source: path of the actor (or component) that published it.
        data: the payload; plain, JSON-encodable data, secrets redacted.
    """

    seq: int
    time: float
    topic: str
    source: str
    data: dict[str, Any]


class Subscription:
    """A bounded queue of events matching a pattern; read by a thread or a trio task.

    Use it as a context manager (or call `close`) to unsubscribe.
    """

    def __init__(
        self,
        bus: EventBus,
        patterns: tuple[str, ...],
        source: str | None,
        max_buffer: int,
    ) -> None:
        self._bus = bus
        self.patterns = patterns
        self.source = source
        self.max_buffer = max_buffer
        self._match = re.compile("|".join(fnmatch.translate(p) for p in patterns)).match
        self._items: deque[Event] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._trio_waiter: tuple[trio.lowlevel.Task, trio.lowlevel.TrioToken, int] | None = None
        self.dropped = 0
        self.closed = False

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Subscription {self.patterns} buffered={len(self._items)} dropped={self.dropped}>"

    def matches(self, event: Event) -> bool:
        """Return True if ``event`` is one this subscription wants."""
        return self._wants(event.topic, event.source)

    def _wants(self, topic: str, source: str) -> bool:
        if self.source is not None and not source.startswith(self.source):
            return False
        return self._match(topic) is not None

    def _push(self, event: Event) -> None:
        with self._cond:
            if len(self._items) >= self.max_buffer:
                self._items.popleft()
                self.dropped += 1
            self._items.append(event)
            self._cond.notify()
            waiter = self._trio_waiter
            self._trio_waiter = None
        if waiter is not None:
            _wake(waiter)

    def close(self) -> None:
        """Unsubscribe and wake any reader; buffered events stay readable."""
        self._bus._unsubscribe(self)
        with self._cond:
            self.closed = True
            self._cond.notify_all()
            waiter = self._trio_waiter
            self._trio_waiter = None
        if waiter is not None:
            _wake(waiter)

    def get_nowait(self) -> Event | None:
        """Return the next buffered event, or None when there is none."""
        with self._cond:
            return self._items.popleft() if self._items else None

    def drain_nowait(self) -> list[Event]:
        """Return and remove every buffered event."""
        with self._cond:
            items = list(self._items)
            self._items.clear()
            return items

    def get(self, timeout: float | None = None) -> Event | None:
        """Block the calling thread for the next event; None on timeout or close."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if self.closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._items.popleft()

    async def receive(self) -> Event:
        """Wait in a trio task for the next event.

        Raises:
            trio.EndOfChannel: the subscription was closed and is empty.
        """
        # trio's rule for a receive: a cancellation may land only before an
        # event is taken, never after (then it would be lost with the task).
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            with self._cond:
                if self._items:
                    event = self._items.popleft()
                    break
                if self.closed:
                    raise trio.EndOfChannel
                task = trio.lowlevel.current_task()
                self._trio_waiter = (task, trio.lowlevel.current_trio_token(), threading.get_ident())

            def abort(_: object, task: trio.lowlevel.Task = task) -> trio.lowlevel.Abort:
                with self._cond:
                    if self._trio_waiter is not None and self._trio_waiter[0] is task:
                        self._trio_waiter = None
                        return trio.lowlevel.Abort.SUCCEEDED
                # A wake-up is already on its way; let it land.
                return trio.lowlevel.Abort.FAILED

            await trio.lowlevel.wait_task_rescheduled(abort)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return event

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


class _Unbuilt:
    """An event `EventBus.emit` kept unbuilt in the ring: built (and redacted) when `recent` reads it.

    ``data`` is the payload as the publisher handed it over (see `emit`);
    the built `Event` is kept, so every reader gets the same one.
    """

    __slots__ = ("data", "event", "seq", "source", "time", "topic")

    def __init__(self, seq: int, time_: float, topic: str, source: str, data: Mapping[str, Any] | None) -> None:
        self.seq = seq
        self.time = time_
        self.topic = topic
        self.source = source
        self.data = data
        self.event: Event | None = None

    def built(self) -> Event:
        event = self.event
        if event is None:
            data = self.data
            payload = _redact_payload(data) if data else {}
            # Two readers may build it at once: equal events; one is kept.
            event = self.event = Event(seq=self.seq, time=self.time, topic=self.topic, source=self.source, data=payload)
            self.data = None
        return event


class _TaskWake:
    """A subscriber's task woken through a weald loop's door for foreign threads (`Loop.wake_soon`)."""

    __slots__ = ("task",)

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task

    def _loop_wake(self) -> None:
        trio.lowlevel.reschedule(self.task)

    def _loop_gone(self) -> None:
        """The loop ended first, and the task with it."""


def _wake(waiter: tuple[trio.lowlevel.Task, trio.lowlevel.TrioToken, int]) -> None:
    task, token, thread = waiter
    if threading.get_ident() == thread:
        trio.lowlevel.reschedule(task)
        return
    wake_soon = LOOP_WAKES.get(thread)
    with contextlib.suppress(trio.RunFinishedError):
        if wake_soon is not None:
            # In order with the messages the publishing thread sends next, which go the same way.
            wake_soon(_TaskWake(task))
        else:
            token.run_sync_soon(trio.lowlevel.reschedule, task)


class EventBus:
    """Thread-safe publish/subscribe with a ring of recent events.

    Args:
        ring_size: how many recent events `recent` can return.
        default_buffer: a subscription's buffer size unless it asks otherwise.
    """

    __weald_shared__ = True  # shared by every actor: not in one actor's memory estimate

    def __init__(self, ring_size: int = 2048, default_buffer: int = 1024) -> None:
        self._ring: deque[Event | _Unbuilt] = deque(maxlen=ring_size)
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._default_buffer = default_buffer
        self.published = 0
        self._topic_counts: dict[str, int] = {}

    def publish(self, topic: str, source: str = "", data: Mapping[str, Any] | None = None) -> Event:
        """Publish an event; returns at once whatever the subscribers do.

        Values under secret-looking keys, and known secret values, are
        redacted before anything can see the event.
        """
        payload: dict[str, Any] = _redact_payload(data) if data else {}
        with self._lock:
            event = Event(seq=next(self._seq), time=time.time(), topic=topic, source=source, data=payload)
            self._ring.append(event)
            self.published += 1
            self._topic_counts[topic] = self._topic_counts.get(topic, 0) + 1
            subs = self._subs
        for sub in subs:
            if sub.matches(event):
                sub._push(event)
        return event

    def emit(self, topic: str, source: str = "", data: Mapping[str, Any] | None = None) -> None:
        """`publish`, building the event only when something wants it; for publishers on hot paths.

        With no subscription for the topic and source, the event is kept
        unbuilt (not redacted, no `Event` made) and built when `recent`
        reads it; it takes its place in the bus's order and its time now,
        as a published one does. With a subscription that wants it, it is
        published as `publish` does.

        ``data`` is handed over: the caller must not change it, or anything
        in it, afterwards (build it for the call).
        """
        with self._lock:
            subs = self._subs
            wanted = False
            for sub in subs:
                if sub._wants(topic, source):
                    wanted = True
                    break
            if not wanted:
                self._ring.append(_Unbuilt(next(self._seq), time.time(), topic, source, data))
                self.published += 1
                self._topic_counts[topic] = self._topic_counts.get(topic, 0) + 1
                return
        self.publish(topic, source, data)

    def subscribe(
        self,
        patterns: str | Iterable[str] = "*",
        *,
        source: str | None = None,
        max_buffer: int | None = None,
    ) -> Subscription:
        """Subscribe to topics matching ``patterns`` (shell-style), optionally from one subtree.

        Args:
            patterns: one pattern or several; ``*`` matches everything.
            source: only events whose source path starts with this prefix.
            max_buffer: buffered events before the oldest is dropped.
        """
        pats = (patterns,) if isinstance(patterns, str) else tuple(patterns)
        sub = Subscription(self, pats, source, max_buffer or self._default_buffer)
        with self._lock:
            # Copy on write: publishers iterate a list no one mutates.
            self._subs = [*self._subs, sub]
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs = [s for s in self._subs if s is not sub]

    def recent(
        self,
        limit: int = 100,
        *,
        topic: str | None = None,
        source: str | None = None,
        where: Callable[[Event], bool] | None = None,
        exclude: Iterable[str] = (),
    ) -> list[Event]:
        """Return up to ``limit`` most recent events, oldest first, optionally filtered.

        ``topic`` and ``exclude`` are shell-style patterns (``exclude``: topics
        to leave out); they and ``source`` (a path prefix) are checked before
        an event is built, ``where`` after. The newest are looked at first, so
        a small ``limit`` builds few events however large the ring.
        """
        if not limit:
            return []
        with self._lock:
            events = list(self._ring)
        match = re.compile(fnmatch.translate(topic)).match if topic else None
        patterns = [fnmatch.translate(pattern) for pattern in exclude]
        skip = re.compile("|".join(patterns)).match if patterns else None
        picked: list[Event] = []
        for e in reversed(events):
            if match is not None and match(e.topic) is None:
                continue
            if skip is not None and skip(e.topic) is not None:
                continue
            if source is not None and not e.source.startswith(source):
                continue
            event = e if isinstance(e, Event) else e.built()
            if where is not None and not where(event):
                continue
            picked.append(event)
            if len(picked) >= limit:
                break
        picked.reverse()
        return picked

    def statistics(self) -> dict[str, Any]:
        """Counts: events published, per topic, subscribers and their drops."""
        with self._lock:
            subs = list(self._subs)
            counts = dict(self._topic_counts)
        return {
            "published": self.published,
            "ring": len(self._ring),
            "subscribers": len(subs),
            "dropped": sum(s.dropped for s in subs),
            "topics": counts,
        }
