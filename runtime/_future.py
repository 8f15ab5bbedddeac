"""A pykka future that both threads and trio tasks can wait on.

pykka's `ThreadingFuture` blocks a thread; its ``__await__`` is meant for
asyncio and would block the trio loop. weald's `Future` keeps pykka's
meaning (``get``, ``set``, ``set_exception``, ``map``, ``join``...) and adds:

- ``await future`` from a trio task parks only that task;
- ``get()`` on the loop thread, when the value is not there yet, raises
  `LoopBlockedError` instead of deadlocking every loop-hosted actor.

Invariant: ``_result`` goes from ``None`` to a tuple exactly once, under
``_LOCK``; waiters are registered under the same lock only while
``_result`` is ``None``, so a waiter is either woken or sees the result.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

import pykka
import trio
from pykka._future import _Unset
from weald.runtime._errors import LoopBlockedError

logger = logging.getLogger("weald.runtime")

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Future", "is_loop_thread"]

T = TypeVar("T")

_OptExcInfo = tuple[type[BaseException] | None, BaseException | None, "TracebackType | None"]

# One lock for every future's state transition: the critical sections are a
# handful of bytecodes, and a lock per future would cost memory on the hot path.
_LOCK = threading.Lock()

# Thread idents of running trio loops hosted by weald; maintained by _loop.
LOOP_THREADS: set[int] = set()
# Each such loop's `Loop.wake_soon`, by thread ident; maintained by _loop.
LOOP_WAKES: dict[int, Callable[[Any], None]] = {}
# Each such loop thread's native (kernel) id, by thread ident; maintained by _loop.
LOOP_NATIVE_IDS: dict[int, int] = {}

# How many times a thread that shares its only CPU with the loop yields the
# CPU to it, checking for the value, before it sleeps on a lock (see `_wait_thread`).
SPIN_YIELDS = 20

_UNSET = _Unset()

_allocate_lock = _thread.allocate_lock
_LockType = _thread.LockType
_sched_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: None)
_getaffinity: Callable[[int], set[int]] | None = getattr(os, "sched_getaffinity", None)


def _shares_its_only_cpu_with_the_loop() -> bool:
    """True if the calling thread may run on one CPU only, and every weald loop thread on that same one."""
    if _getaffinity is None:  # not Linux
        return False
    mine = _getaffinity(0)
    if len(mine) != 1 or not LOOP_NATIVE_IDS:
        return False
    try:
        return all(_getaffinity(native) == mine for native in list(LOOP_NATIVE_IDS.values()))
    except OSError:  # a loop thread ended meanwhile
        return False


def is_loop_thread() -> bool:
    """Return True if the calling thread runs a weald trio loop."""
    return threading.get_ident() in LOOP_THREADS


class _TrioWaiter:
    """A trio task parked on a future; woken on its own loop thread."""

    __slots__ = ("active", "task", "thread", "token", "wake_soon")

    def __init__(self) -> None:
        self.task = trio.lowlevel.current_task()
        self.thread = thread = threading.get_ident()
        # A weald loop's door for foreign threads (see `Loop.wake_soon`); else trio's.
        self.wake_soon = LOOP_WAKES.get(thread)
        self.token = trio.lowlevel.current_trio_token() if self.wake_soon is None else None
        self.active = True

    def wake(self) -> None:
        if threading.get_ident() == self.thread:
            self.wake_in_loop()
            return
        # The loop has ended (its task with it): nothing to wake, and the
        # completer must go on to the other waiters.
        with contextlib.suppress(trio.RunFinishedError):
            if self.wake_soon is not None:
                self.wake_soon(self)
            else:
                assert self.token is not None
                self.token.run_sync_soon(self.wake_in_loop)

    def wake_in_loop(self) -> None:
        # Runs on the waiter's loop thread, as does the abort callback, so
        # `active` needs no lock: exactly one of them reschedules or aborts.
        if self.active:
            self.active = False
            trio.lowlevel.reschedule(self.task)

    _loop_wake = wake_in_loop

    def _loop_gone(self) -> None:
        """The loop ended before the wake-up arrived: its task ended with it."""


class _Callback:
    """A runtime-internal continuation of a future: ``fn(future)`` when it completes."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Future[Any]], object]) -> None:
        self.fn = fn

    def run(self, future: Future[Any]) -> None:
        try:
            self.fn(future)
        except BaseException:
            # The completer (a handler, a committer thread) must not see the
            # continuation's failure; the runtime's continuations catch their
            # own errors, so this only reports a bug.
            logger.exception("callback %r of %r failed", self.fn, future)


class Future(pykka.Future[T]):
    """A handle to a value available now or later; awaitable from trio.

    Created by the runtime for every ``ask`` and proxy call to a weald actor.
    """

    # Whether a thread waiting in `get` first yields its CPU to the loop (see `_wait_thread`).
    _yield_first = False

    def __init__(self) -> None:
        # pykka.Future.__init__ sets these two, the second to a fresh `_Unset`
        # per future; pykka only tests it with isinstance, so one shared
        # instance will do. A future is made for every ask, stop and wait.
        self._get_hook = None
        self._get_hook_result = _UNSET
        self._result: tuple[Any, _OptExcInfo | None] | None = None
        self._waiters: list[threading.Lock | _TrioWaiter | _Callback] | None = None

    def __repr__(self) -> str:
        state = "pending" if self._result is None else "done"
        return f"<weald.Future {state}>"

    def done(self) -> bool:
        """Return True if a value or exception has been set."""
        return self._result is not None

    def get(self, *, timeout: float | None = None) -> T:
        """Return the value, blocking the calling thread until it is set.

        Args:
            timeout: seconds to wait; None waits forever.

        Raises:
            pykka.Timeout: the value did not arrive within ``timeout``.
            LoopBlockedError: called on the loop thread before the value is
                set; ``await`` the future instead.
            Exception: the exception set on the future.
        """
        result = self._result  # never set on a future with a get hook
        if result is None:
            if self._get_hook is not None:
                return super().get(timeout=timeout)
            if threading.get_ident() in LOOP_THREADS:
                msg = (
                    "Future.get() would block the weald loop thread, which hosts "
                    "every loop actor (including the one that must reply); "
                    "use `await future` in an async handler instead"
                )
                raise LoopBlockedError(msg)
            result = self._wait_thread(timeout)
        return self._unpack(result)

    def _wait_thread(self, timeout: float | None) -> tuple[Any, _OptExcInfo | None]:
        if self._yield_first and SPIN_YIELDS and _shares_its_only_cpu_with_the_loop():
            # The loop (woken by this thread's message) can only run once this
            # thread leaves the CPU: yielding it hands over directly, where a
            # lock would cost a sleep and a wake-up on top (17 -> 9 us an ask
            # here). On more than one CPU yielding only fights for the GIL.
            # Only for an ask's reply: a yielding thread runs again only once
            # the loop is idle, not as soon as its value is set, which costs
            # more than it saves when the loop has more to do after it (a
            # stop, whose actor still reports its end: +12 us a start+stop).
            for _ in range(SPIN_YIELDS):
                _sched_yield()
                result = self._result
                if result is not None:
                    return result
        lock = _allocate_lock()
        lock.acquire()
        with _LOCK:
            if self._result is not None:
                return self._result
            waiters = self._waiters
            if waiters is None:
                self._waiters = [lock]
            else:
                waiters.append(lock)
        acquired = lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        if not acquired:
            with _LOCK:
                if self._result is None:
                    assert self._waiters is not None
                    self._waiters.remove(lock)
                    raise pykka.Timeout(f"{timeout} seconds")
        assert self._result is not None
        return self._result

    @staticmethod
    def _unpack(result: tuple[Any, _OptExcInfo | None]) -> T:
        value, exc_info = result
        if exc_info is None:
            return value  # type: ignore[no-any-return]
        exc_type, exc_value, tb = exc_info
        if exc_value is None:
            assert exc_type is not None
            exc_value = exc_type()
        raise exc_value.with_traceback(tb)

    def _complete(self, result: tuple[Any, _OptExcInfo | None]) -> None:
        with _LOCK:
            if self._result is not None or self._get_hook is not None:
                raise queue.Full
            self._result = result
            waiters = self._waiters
            self._waiters = None
        if waiters:
            for waiter in waiters:
                if waiter.__class__ is _LockType:  # a thread in get(): the commonest
                    waiter.release()
                elif isinstance(waiter, _TrioWaiter):
                    waiter.wake()
                elif isinstance(waiter, _Callback):
                    waiter.run(self)
                else:
                    waiter.release()

    def set(self, value: T | None = None) -> None:
        """Set the value and wake every waiter.

        Raises:
            queue.Full: the future was already completed (pykka's contract).
        """
        self._complete((value, None))

    def set_exception(self, exc_info: _OptExcInfo | None = None) -> None:
        """Set an exception (``sys.exc_info()`` by default) and wake every waiter."""
        if exc_info is None:
            exc_info = sys.exc_info()
        self._complete((None, exc_info))

    def set_get_hook(self, func: Callable[[float | None], T]) -> None:
        """Compute the value with ``func(timeout)`` at ``get()`` time (pykka's contract)."""
        with _LOCK:
            if self._result is not None:
                raise queue.Full
            super().set_get_hook(func)

    def _on_done(self, fn: Callable[[Future[T]], object]) -> None:
        """Call ``fn(self)`` once the future is completed; at once if it is already.

        Runtime-internal: a continuation without a task to run it in, for
        work that only turns the outcome into a message (the tool runner
        learns of a call's execution this way). ``fn`` runs on the thread that
        completes the future, after the lock is released; it must be quick,
        must not block, and should not raise (an exception is logged).
        Not for futures with a get hook (their value exists only in ``get``).
        """
        callback = _Callback(fn)
        with _LOCK:
            if self._result is None:
                if self._get_hook is not None:
                    msg = "_on_done() on a future with a get hook"
                    raise AssertionError(msg)
                if self._waiters is None:
                    self._waiters = []
                self._waiters.append(callback)
                return
        callback.run(self)

    async def wait(self) -> T:
        """Wait in a trio task for the value, then return it (or raise).

        Futures built with a get hook (``map``, ``join``, ``filter``) are
        resolved in a worker thread, since the hook may block.
        """
        if self._get_hook is not None:
            return await trio.to_thread.run_sync(self.get)
        result = self._result
        if result is None:
            waiter = _TrioWaiter()
            with _LOCK:
                if self._result is None:
                    if self._waiters is None:
                        self._waiters = []
                    self._waiters.append(waiter)
                else:
                    waiter.active = False
            if waiter.active:

                def abort(_: object) -> trio.lowlevel.Abort:
                    waiter.active = False
                    with _LOCK:
                        if self._waiters is not None and waiter in self._waiters:
                            self._waiters.remove(waiter)
                    return trio.lowlevel.Abort.SUCCEEDED

                await trio.lowlevel.wait_task_rescheduled(abort)
            else:
                await trio.lowlevel.checkpoint()
            result = self._result
            assert result is not None
        return self._unpack(result)

    def __await__(self) -> Generator[Any, None, T]:
        return self.wait().__await__()

    __iter__ = __await__


class AskFuture(Future[T]):
    """The future of an ask (or a proxy call): a thread waiting for it may first yield its CPU to the loop."""

    _yield_first = True
