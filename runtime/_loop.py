"""The trio loop thread that hosts loop actors and runs all I/O.

One `Loop` per `ActorSystem`. Loop-hosted actors are trio tasks in its root
nursery; actors hand it coroutines (``Actor.run_io``) and get results back as
messages. Nothing that reaches the nursery may raise: every task is wrapped
so that an escaping exception is reported, never allowed to cancel the loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from weald.runtime._errors import LoopBlockedError, WealdError
from weald.runtime._future import LOOP_THREADS
from weald.runtime._guard import LOOP_GUARD_ENV, install_loop_guard

__all__ = ["Loop", "LoopStatistics"]

logger = logging.getLogger("weald.runtime")

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


class Loop:
    """Runs ``trio.run`` in a dedicated thread and accepts work from any thread.

    Lifecycle: `start` blocks until the loop is ready; `stop` cancels every
    task still in the nursery and joins the thread.
    """

    def __init__(self, name: str = "weald-loop") -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._thread_id: int | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._ready = threading.Event()
        self._stop_requested: trio.Event | None = None
        self._crash: BaseException | None = None

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
            self._nursery = None
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._thread_id = threading.get_ident()
        LOOP_THREADS.add(self._thread_id)
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
            self.token.run_sync_soon(self._start_in_loop, async_fn, args, on_error)

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
            self.token.run_sync_soon(self._start_in_loop, async_fn, (), on_error, False)

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
