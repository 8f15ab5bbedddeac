"""The trio loop thread that hosts loop actors and runs all I/O.

One `Loop` per `ActorSystem`. Loop-hosted actors are trio tasks in its root
nursery; actors hand it coroutines (``Actor.run_io``) and get results back as
messages. Nothing that reaches the nursery may raise: every task is wrapped
so that an escaping exception is reported, never allowed to cancel the loop.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio
from weald.runtime._errors import LoopBlockedError, WealdError
from weald.runtime._future import LOOP_NATIVE_IDS, LOOP_THREADS, LOOP_WAKES
from weald.runtime._guard import LOOP_GUARD_ENV, install_loop_guard

__all__ = ["Loop", "LoopStatistics"]

logger = logging.getLogger("weald.runtime")

# Whether `Loop.wake_soon` kicks the loop with trio's private I/O-manager
# wake-up when there is one (else with ``run_sync_soon``); read at loop start.
USE_FORCE_WAKEUP = True

T = TypeVar("T")


class LoopStatistics:
    """A frozen view of the loop's load (plain slots; created on demand)."""

    __slots__ = ("running", "tasks", "thread_name")

    def __init__(self, *, running: bool, tasks: int, thread_name: str) -> None:
        self.running = running
        self.tasks = tasks
        self.thread_name = thread_name

    def __repr__(self) -> str:
        return f"LoopStatistics(running={self.running}, tasks={self.tasks})"


class Wakeable(Protocol):
    """Something a foreign thread wakes on the loop with `Loop.wake_soon`."""

    def _loop_wake(self) -> None:
        """Runs on the loop thread, outside any task: quick, must not block (it reschedules a task)."""

    def _loop_gone(self) -> None:
        """Runs instead of `_loop_wake` when the loop ended before it could: answer what would be lost."""


class _ForeignWakes(trio.abc.Instrument):
    """The loop's door for foreign threads: wake-ups queued in a deque, run between I/O wait and tasks.

    A foreign thread appends to ``queue`` and, unless a wake-up is already on
    its way (``armed``), arms and kicks the loop out of its I/O wait. trio
    calls `after_io_wait` once per scheduler pass, after the I/O wait and
    before it runs the ready tasks, so a task rescheduled here runs in the
    same pass: one pass per burst of foreign messages instead of two per
    message (trio's own ``run_sync_soon`` wakes its entry-queue task, whose
    callback can only make the woken task ready for the pass after).

    The instrument costs ~0.5 us a pass, so it is installed only while
    foreign threads use the door: the first wake-up after a quiet spell goes
    through ``run_sync_soon``, whose callback (`drain_installing`) installs
    it, and it removes itself after `_IDLE_PASSES` passes without work.

    Invariants: a thread that appends and then reads ``armed`` as True was
    preceded by an arm whose kick is still to reach the loop, or whose pass
    has not yet disarmed; the pass that disarms drains afterwards, so it sees
    the append. A thread reads ``installed`` after it appended and armed; the
    removal clears ``installed``, then disarms, then drains: a kick that took
    the instrument for installed was for an append that drain sees, and a
    later arm sees it removed and goes through ``run_sync_soon``. So nothing
    queued is left behind, and a burst of N messages from any number of
    threads costs one kick.
    """

    def __init__(self) -> None:
        self.queue: deque[Wakeable] = deque()
        self.armed = False
        self.installed = False
        self._idle = 0

    def after_io_wait(self, timeout: float) -> None:  # noqa: ARG002  # trio's hook signature
        if self.armed or self.queue:
            self._idle = 0
            self.armed = False
            self.drain()
        else:
            self._idle += 1
            if self._idle >= _IDLE_PASSES:
                self.installed = False
                self.armed = False
                self.drain()
                trio.lowlevel.remove_instrument(self)

    def drain_installing(self) -> None:
        """Install the instrument if it is not, then drain (the ``run_sync_soon`` kick's callback)."""
        if not self.installed:
            self._idle = 0
            trio.lowlevel.add_instrument(self)
            self.installed = True
        self.armed = False
        self.drain()

    def drain(self) -> None:
        queue = self.queue
        for _ in range(len(queue)):  # bounded: what arrives meanwhile re-arms
            target = queue.popleft()
            try:
                target._loop_wake()
            except BaseException:  # an instrument that raises is removed by trio
                logger.exception("waking %r on the loop failed", target)


# Scheduler passes without a foreign wake-up after which the door's instrument is removed.
_IDLE_PASSES = 256


class Loop:
    """Runs ``trio.run`` in a dedicated thread and accepts work from any thread.

    Lifecycle: `start` blocks until the loop is ready; `stop` cancels every
    task still in the nursery and joins the thread.
    """

    __weald_shared__ = True  # shared by every actor: not in one actor's memory estimate

    def __init__(self, name: str = "weald-loop") -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._thread_id: int | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._ready = threading.Event()
        self._stop_requested: trio.Event | None = None
        self._crash: BaseException | None = None
        self._wakes = _ForeignWakes()
        self._kick: Callable[[], object] | None = None
        self._slow_kick: Callable[[], object] | None = None
        self._finished = False

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread and wait until it accepts work."""
        if self._thread is not None:
            msg = "loop already started"
            raise WealdError(msg)
        if os.environ.get(LOOP_GUARD_ENV) == "1":
            install_loop_guard(echo=True)
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._crash is not None:
            msg = "the weald loop failed to start"
            raise WealdError(msg) from self._crash

    def _run(self) -> None:
        try:
            trio.run(self._main, strict_exception_groups=True)
        except BaseException as exc:  # the loop itself broke: record and report
            self._crash = exc
            logger.critical("weald loop thread crashed", exc_info=exc)
        finally:
            if self._thread_id is not None:
                LOOP_THREADS.discard(self._thread_id)
                LOOP_WAKES.pop(self._thread_id, None)
                LOOP_NATIVE_IDS.pop(self._thread_id, None)
            self._nursery = None
            self._finished = True
            # Wake-ups queued too late for the loop: answer their messages.
            queue = self._wakes.queue
            while queue:
                try:
                    queue.popleft()._loop_gone()
                except IndexError:  # a racing `wake_soon` took it (it raised RunFinishedError)
                    break
                except Exception:
                    logger.exception("answering a wake-up after the loop ended failed")
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._thread_id = threading.get_ident()
        LOOP_THREADS.add(self._thread_id)
        self._kick = _kicker(self._token, self._wakes)
        self._slow_kick = functools.partial(self._token.run_sync_soon, self._wakes.drain_installing)
        LOOP_WAKES[self._thread_id] = self.wake_soon
        LOOP_NATIVE_IDS[self._thread_id] = threading.get_native_id()
        self._stop_requested = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await self._stop_requested.wait()
            nursery.cancel_scope.cancel()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every remaining task and join the loop thread.

        Raises:
            LoopBlockedError: called from the loop thread itself.
        """
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if self.in_loop_thread():
            msg = "Loop.stop() cannot be called from the loop thread"
            raise LoopBlockedError(msg)
        assert self._token is not None
        assert self._stop_requested is not None
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._stop_requested.set)
        thread.join(timeout)

    @property
    def running(self) -> bool:
        """True while the loop accepts work."""
        return self._nursery is not None

    def in_loop_thread(self) -> bool:
        """Return True if called from this loop's thread."""
        return threading.get_ident() == self._thread_id

    @property
    def token(self) -> trio.lowlevel.TrioToken:
        """The trio token of the running loop."""
        if self._token is None:
            msg = "loop not started"
            raise WealdError(msg)
        return self._token

    def statistics(self) -> LoopStatistics:
        """Return the loop's current load."""
        nursery = self._nursery
        tasks = len(nursery.child_tasks) if nursery is not None else 0
        return LoopStatistics(running=self.running, tasks=tasks, thread_name=self._name)

    # -- scheduling ------------------------------------------------------------

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread soon; callable from any thread.

        ``fn`` must not raise: it runs outside any task.
        """
        self.token.run_sync_soon(fn, *args)

    def wake_soon(self, target: Wakeable) -> None:
        """From a foreign thread: call ``target._loop_wake()`` on the loop thread soon.

        For a wake-up that only makes a parked task ready (a message for an
        idle actor, a reply for a waiting task): the task runs in the same
        scheduler pass as the wake-up, and a burst of wake-ups from any
        number of threads costs the loop one kick. Cheaper than `call_soon`,
        which costs two passes.

        Raises:
            trio.RunFinishedError: the loop has ended; ``target`` will not be
                woken (``_loop_gone`` may have run for it).
        """
        wakes = self._wakes
        wakes.queue.append(target)
        if not wakes.armed:
            wakes.armed = True
            kick = self._kick if wakes.installed else self._slow_kick
            if kick is not None:
                try:  # noqa: SIM105  # contextlib.suppress costs ~1 us a call here
                    kick()
                except (OSError, trio.RunFinishedError):  # the loop is ending: see below
                    pass
        if self._finished:
            msg = "the weald loop has stopped"
            raise trio.RunFinishedError(msg)

    def spawn_nowait(
        self,
        async_fn: Callable[..., Awaitable[object]],
        *args: Any,
        on_error: Callable[[BaseException], object] | None = None,
    ) -> None:
        """Start ``async_fn(*args)`` as a task in the loop's nursery.

        Callable from any thread. An exception escaping the task is passed to
        ``on_error`` (or logged when there is none); it never reaches the
        nursery, so one broken task cannot cancel the others.
        """
        if self.in_loop_thread():
            self._start_in_loop(async_fn, args, on_error)
        else:
            self._spawn_from_thread(async_fn, args, on_error, True)

    def spawn_contained_nowait(
        self, async_fn: Callable[[], Awaitable[object]], *, on_error: Callable[[BaseException], object]
    ) -> None:
        """`spawn_nowait` for a function that contains its own errors (it raises only `trio.Cancelled`).

        Without the guarding wrapper: one coroutine frame fewer for every
        loop actor's receive loop (~240 bytes each). ``on_error`` is called
        only if the loop has stopped.
        """
        if self.in_loop_thread():
            self._start_in_loop(async_fn, (), on_error, guarded=False)
        else:
            self._spawn_from_thread(async_fn, (), on_error, False)

    def _spawn_from_thread(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[Any, ...],
        on_error: Callable[[BaseException], object] | None,
        guarded: bool,
    ) -> None:
        # Through the door (`wake_soon`): the task starts in the pass the kick
        # arrives, not in the one after, and in order with the messages this
        # thread sends it next (an actor started, then stopped, from a thread).
        spawn = _Spawn(self, async_fn, args, on_error, guarded)
        try:
            self.wake_soon(spawn)
        except trio.RunFinishedError:
            if not spawn.told:  # else the loop's end has told ``on_error`` already
                spawn.told = True
                raise

    def _start_in_loop(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[Any, ...],
        on_error: Callable[[BaseException], object] | None,
        guarded: bool = True,
    ) -> None:
        nursery = self._nursery
        if nursery is None:
            # The loop is shutting down; the work can no longer run.
            error = trio.RunFinishedError("the weald loop has stopped")
            if on_error is not None:
                on_error(error)
            return
        if guarded:
            nursery.start_soon(self._guarded, async_fn, args, on_error, name=async_fn)
        else:
            nursery.start_soon(async_fn, *args, name=async_fn)

    async def _guarded(
        self,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[Any, ...],
        on_error: Callable[[BaseException], object] | None,
    ) -> None:
        try:
            await async_fn(*args)
        except trio.Cancelled:
            raise
        except BaseException as exc:
            if on_error is None:
                logger.exception("unhandled error in loop task %r", async_fn, exc_info=exc)
            else:
                try:
                    on_error(exc)
                except Exception:
                    logger.exception("error handler for %r failed", async_fn)

    def run(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``async_fn(*args)`` on the loop and block the calling thread for its result.

        Raises:
            LoopBlockedError: called from the loop thread.
        """
        if self.in_loop_thread():
            msg = "Loop.run() would block the loop thread; await the coroutine instead"
            raise LoopBlockedError(msg)
        return trio.from_thread.run(async_fn, *args, trio_token=self.token)


class _Spawn:
    """A task to start, handed to the loop by a foreign thread through `Loop.wake_soon`."""

    __slots__ = ("args", "async_fn", "guarded", "loop", "on_error", "told")

    def __init__(
        self,
        loop: Loop,
        async_fn: Callable[..., Awaitable[object]],
        args: tuple[Any, ...],
        on_error: Callable[[BaseException], object] | None,
        guarded: bool,
    ) -> None:
        self.loop = loop
        self.async_fn = async_fn
        self.args = args
        self.on_error = on_error
        self.guarded = guarded
        self.told = False

    def _loop_wake(self) -> None:
        self.loop._start_in_loop(self.async_fn, self.args, self.on_error, self.guarded)

    def _loop_gone(self) -> None:
        if self.on_error is not None and not self.told:
            self.told = True
            self.on_error(trio.RunFinishedError("the weald loop has stopped"))


def _kicker(token: trio.lowlevel.TrioToken, wakes: _ForeignWakes) -> Callable[[], object]:
    """How a foreign thread gets the loop out of its I/O wait for `_ForeignWakes`.

    trio's I/O manager has a wake-up of its own, drained by the scheduler
    itself (no task step, no re-arm of the fd). It is not public API (trio's
    guest mode uses it), so it is used only where it is there; otherwise
    ``run_sync_soon`` of the drain, whose entry-queue task may run the drain
    itself when the kick comes too late for the instrument. Used while the
    instrument is installed.
    """
    runner = getattr(getattr(getattr(trio, "_core", None), "_run", None), "GLOBAL_RUN_CONTEXT", None)
    io_manager = getattr(getattr(runner, "runner", None), "io_manager", None)
    force_wakeup = getattr(io_manager, "force_wakeup", None)
    if callable(force_wakeup) and USE_FORCE_WAKEUP:
        # What force_wakeup() does, without its contextlib.suppress (~1 us a call here).
        write_sock = getattr(getattr(io_manager, "_force_wakeup", None), "write_sock", None)
        if isinstance(write_sock, socket.socket):
            send = write_sock.send

            def send_byte() -> None:
                try:  # noqa: SIM105  # contextlib.suppress costs ~1 us a call here
                    send(b"\x00")
                except BlockingIOError:  # its buffer is full: a wake-up is on its way already
                    pass

            return send_byte
        kick: Callable[[], object] = force_wakeup
        return kick

    def run_drain() -> None:
        token.run_sync_soon(wakes.drain_installing)

    return run_drain
