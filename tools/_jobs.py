"""Background jobs: shell commands that outlive the tool call that started them.

A `JobTable` belongs to one agent session (``ctx.session.jobs``). Each job
is a command in a process group of its own, watched by a supervising
coroutine that the table hands to its ``spawn`` callable, so that the job
runs somewhere long-lived rather than in the tool call's task (which ends
with the call). The session's tool runner passes a spawner built on its own
``run_io``; tests and scripts use `nursery_spawner`.

Each job keeps the end of its output in memory (bounded) and, once the
output outgrows that, all of it in a spool file. Reads return what arrived
since the previous read.

Threads: the async methods must run on the trio loop the jobs' supervisors
run on (the one ``spawn`` uses; with ``run_io`` that is the system's loop,
where async tools run). `snapshot`, `get`, `close` and `close_nowait` may be
called from any thread.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import attrs
import trio
from weald.runtime import ChildProcess, marked_processes, new_process_mark
from weald.tools._contract import ToolError
from weald.tools._process import (
    DEFAULT_KILL_GRACE,
    KILL_WAIT,
    OutputCapture,
    capture_until_exit,
    open_group_process,
    signal_group,
    terminate_groups_blocking,
)
from weald.tools._spill import SpillBudget

__all__ = ["CancelHandle", "JobInfo", "JobOutput", "JobStatus", "JobTable", "Spawn", "nursery_spawner"]

logger = logging.getLogger("weald.tools")

JobStatus = Literal["starting", "running", "exited", "killed", "failed"]


class CancelHandle(Protocol):
    """What ``spawn`` returns: something that cancels the coroutine it started."""

    def cancel(self) -> None:
        """Cancel the coroutine (it may still be running its cleanup when this returns)."""


Spawn = Callable[..., CancelHandle]
"""``spawn(async_fn, *args) -> handle``: run ``async_fn(*args)`` as a long-lived task."""

# How long a job's output is still read after its shell exited, when a
# process it left behind holds the pipes open.
_DRAIN_AFTER_EXIT = 0.25

# How long writing to a job's stdin may block before we say it is not reading.
_INPUT_TIMEOUT = 5.0


@attrs.frozen
class JobInfo:
    """A snapshot of one background job.

    Attributes:
        id: the job's id (``job1``, ``job2``...), unique in its table.
        command: the command line, as given.
        cwd: where it runs.
        pid: its process id (also its process group id), once started.
        status: ``starting``, ``running``, ``exited`` (on its own),
            ``killed`` (by `JobTable.kill` or on close) or ``failed`` (did not start).
        exit_code: its exit status once it ended; negative: killed by that signal.
        started_at: when it was started (Unix time).
        ended_at: when it ended (Unix time), or None while it runs.
        output_bytes: bytes of output so far.
        unread_bytes: bytes of output not yet returned by a read.
        output_path: the file with its whole output, once it outgrew memory.
        error: why it failed to start, or what went wrong watching it.
        output_cut: where and why ``output_path`` ends before the output
            does (the session's `SpillBudget`), if it does.
    """

    id: str
    command: str
    cwd: str
    pid: int | None
    status: JobStatus
    exit_code: int | None
    started_at: float
    ended_at: float | None
    output_bytes: int
    unread_bytes: int
    output_path: str | None
    error: str | None = None
    output_cut: str | None = None

    @property
    def running(self) -> bool:
        """True until the job has ended (or failed to start)."""
        return self.status in ("starting", "running")

    @property
    def duration(self) -> float:
        """Seconds it has run (until now, or until it ended)."""
        end = self.ended_at if self.ended_at is not None else time.time()
        return max(0.0, end - self.started_at)


@attrs.frozen
class JobOutput:
    """New output of a job, and the job's state after reading it.

    Attributes:
        job: the job's state.
        text: output that arrived since the previous read (as much as memory held).
        omitted: bytes of that new output not in ``text`` (they are in ``job.output_path``).
    """

    job: JobInfo
    text: str
    omitted: int


class _Job:
    """A job's mutable state; only `JobTable` and the job's supervisor touch it."""

    __slots__ = (
        "argv",
        "capture",
        "command",
        "cwd",
        "done",
        "ended_at",
        "env",
        "error",
        "exit_code",
        "handle",
        "id",
        "kill_requested",
        "mark",
        "on_end",
        "pass_fds",
        "pid",
        "process",
        "run_in",
        "sandboxed",
        "scope",
        "started",
        "started_at",
        "status",
        "stdin_lock",
        "token",
    )

    def __init__(
        self,
        job_id: str,
        argv: Sequence[str],
        *,
        command: str,
        cwd: Path,
        env: Mapping[str, str] | None,
        capture: OutputCapture,
    ) -> None:
        self.id = job_id
        self.argv = list(argv)
        self.command = command
        self.cwd = cwd
        self.run_in = cwd  # where the process starts (a pinned /proc/self/fd path, or cwd)
        self.pass_fds: tuple[int, ...] = ()
        self.sandboxed = False
        self.on_end: Callable[[], Awaitable[None]] | None = None
        self.env = env
        self.capture = capture
        self.token = trio.lowlevel.current_trio_token()
        self.started = trio.Event()
        self.done = trio.Event()
        self.scope = trio.CancelScope()
        self.stdin_lock = trio.Lock()
        self.handle: CancelHandle | None = None
        self.process: ChildProcess | None = None
        self.pid: int | None = None
        self.status: JobStatus = "starting"
        self.exit_code: int | None = None
        self.error: str | None = None
        self.kill_requested = False
        # In the environment of every process the job starts, so that one that
        # leaves its session (setsid) is still found and stopped with the job.
        self.mark = new_process_mark()
        self.started_at = time.time()
        self.ended_at: float | None = None

    def info(self) -> JobInfo:
        spool = self.capture.spool_path
        return JobInfo(
            id=self.id,
            command=self.command,
            cwd=str(self.cwd),
            pid=self.pid,
            status=self.status,
            exit_code=self.exit_code,
            started_at=self.started_at,
            ended_at=self.ended_at,
            output_bytes=self.capture.total,
            unread_bytes=self.capture.unread,
            output_path=str(spool) if spool is not None else None,
            error=self.error,
            output_cut=self.capture.spool_cut,
        )


def nursery_spawner(nursery: trio.Nursery) -> Spawn:
    """A ``spawn`` for `JobTable` that runs each job's supervisor as a task in ``nursery``.

    For tests and scripts; call it on the nursery's trio thread. The handles
    it returns may be cancelled from any thread.
    """
    token = trio.lowlevel.current_trio_token()

    def spawn(async_fn: Callable[..., Awaitable[object]], *args: Any) -> CancelHandle:
        handle = _ScopeHandle(token)

        async def run() -> None:
            with handle.scope:
                await async_fn(*args)

        nursery.start_soon(run)
        return handle

    return spawn


class _ScopeHandle:
    """Cancels a task's cancel scope from any thread."""

    __slots__ = ("scope", "token")

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self.scope = trio.CancelScope()

    def cancel(self) -> None:
        if trio.lowlevel.in_trio_run() and trio.lowlevel.current_trio_token() is self.token:
            self.scope.cancel()
        else:
            with contextlib.suppress(trio.RunFinishedError):
                self.token.run_sync_soon(self.scope.cancel)


class JobTable:
    """The background jobs of one session.

    Args:
        spawn: ``spawn(async_fn, *args) -> handle with .cancel()``; runs a job's
            supervising coroutine on the trio loop the table is used from,
            in a task that outlives the tool call.
        output_dir: where spool files go (None: the system's temp directory).
        spill: the session's bounds on spool files (None: default bounds per job).
        max_running: how many jobs may run at once.
        tail_bytes: output kept in memory per job (the rest is spooled).
        kill_grace: seconds between SIGTERM and SIGKILL when a job is stopped.
        keep_finished: how many ended jobs stay listed (oldest dropped first).
    """

    def __init__(
        self,
        spawn: Spawn,
        *,
        output_dir: Path | None = None,
        spill: SpillBudget | None = None,
        max_running: int = 8,
        tail_bytes: int = 64 * 1024,
        kill_grace: float = DEFAULT_KILL_GRACE,
        keep_finished: int = 32,
    ) -> None:
        self._spawn = spawn
        self._output_dir = output_dir
        self._spill = spill
        self._max_running = max_running
        self._tail_bytes = tail_bytes
        self._kill_grace = kill_grace
        self._keep_finished = keep_finished
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._ids = itertools.count(1)
        self._closed = False

    def __repr__(self) -> str:
        running = sum(1 for job in self._jobs.values() if not job.done.is_set())
        return f"<JobTable jobs={len(self._jobs)} running={running} closed={self._closed}>"

    # -- starting ------------------------------------------------------------------

    async def start(
        self,
        argv: Sequence[str],
        *,
        command: str,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        pass_fds: Sequence[int] = (),
        run_in: Path | None = None,
        sandboxed: bool = False,
        on_end: Callable[[], Awaitable[None]] | None = None,
    ) -> JobInfo:
        """Start ``argv`` as a background job; return once it runs.

        Its stdin is a pipe (see `send_input`); its stdout and stderr are captured.

        Args:
            argv: the program and its arguments.
            command: how the job is shown (the command line).
            cwd: where it runs.
            env: its environment (None: this process's).
            pass_fds: descriptors it inherits (a pinned directory); they must
                stay open until this returns, which is when the job runs.
            run_in: where the process starts, if not ``cwd`` (a pinned
                ``/proc/self/fd/N`` naming ``cwd``'s directory).
            sandboxed: ``argv`` runs the command in bubblewrap's PID
                namespace (see `weald.tools._process.terminate_group`).
            on_end: awaited (shielded) once the job has ended, or failed to
                start: what its launch holds is given back then (the
                sandbox's placeholders).

        Raises:
            ToolError: the table is closed, too many jobs run, or the program did not start.
        """
        spool_dir = self._output_dir if self._output_dir is not None else Path(tempfile.gettempdir())
        with self._lock:
            if self._closed:
                raise ToolError("the session is ending; background jobs can no longer be started")
            running = [job.id for job in self._jobs.values() if not job.done.is_set()]
            if len(running) >= self._max_running:
                listed = ", ".join(running)
                raise ToolError(
                    f"{len(running)} background jobs are already running ({listed}), the most allowed. "
                    "Kill one (action='kill') or wait for one to end (action='wait') before starting another.",
                )
            job_id = f"job{next(self._ids)}"
            capture = OutputCapture(
                tail_bytes=self._tail_bytes, spool_dir=spool_dir, spool_prefix=f"{job_id}-", spill=self._spill
            )
            job = _Job(job_id, argv, command=command, cwd=cwd, env=env, capture=capture)
            job.pass_fds = tuple(pass_fds)
            job.sandboxed = sandboxed
            job.on_end = on_end
            job.run_in = run_in if run_in is not None else cwd
            self._jobs[job_id] = job
            self._prune_locked()
        try:
            job.handle = self._spawn(self._supervise, job)
        except Exception as exc:
            job.status = "failed"
            job.error = f"could not schedule the job: {type(exc).__name__}: {exc}"
            job.ended_at = time.time()
            job.started.set()
            job.done.set()
            if on_end is not None:
                with trio.CancelScope(shield=True):
                    await on_end()
            raise ToolError(f"{job_id} did not start: {job.error}") from exc
        await job.started.wait()
        if job.status == "failed":
            raise ToolError(f"{job_id} did not start: {job.error}. Check the command and the working directory.")
        return job.info()

    def _prune_locked(self) -> None:
        finished = [job for job in self._jobs.values() if job.done.is_set()]
        for job in finished[: max(0, len(finished) - self._keep_finished)]:
            del self._jobs[job.id]

    async def _supervise(self, job: _Job) -> None:
        """Run one job from start to end; the task ``spawn`` created runs it.

        Never raises (except trio's Cancelled when its handle is cancelled,
        after the job's processes are gone): what goes wrong is recorded on the job.
        """
        if trio.lowlevel.current_trio_token() is not job.token:
            job.status = "failed"
            job.error = "JobTable's spawn ran the job on another trio loop than the caller's; it must use the same"
            with contextlib.suppress(trio.RunFinishedError):
                job.token.run_sync_soon(job.started.set)
                job.token.run_sync_soon(job.done.set)
            return
        try:
            with job.scope:
                async with open_group_process(
                    job.argv,
                    cwd=job.run_in,
                    env=job.env,
                    stdin=subprocess.PIPE,
                    grace=self._kill_grace,
                    session=True,
                    pass_fds=job.pass_fds,
                    mark=job.mark,
                    sandboxed=job.sandboxed,
                ) as process:
                    job.process = process
                    job.pid = process.pid
                    job.status = "running"
                    job.started.set()
                    await capture_until_exit(process, job.capture, drain=_DRAIN_AFTER_EXIT)
        except OSError as exc:
            if job.process is None:
                job.status = "failed"
                job.error = f"{type(exc).__name__}: {exc}"
            else:
                job.error = f"reading its output failed: {type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug here must not take the runner's loop down; it is logged and shown
            logger.exception("supervising background job %s failed", job.id)
            job.error = f"the job's supervisor failed: {type(exc).__name__}: {exc}"
        finally:
            with trio.CancelScope(shield=True):
                await job.capture.aclose()
                if job.on_end is not None:
                    try:
                        await job.on_end()
                    except Exception:  # logged: the job's own end is recorded all the same
                        logger.exception("ending background job %s failed", job.id)
            if job.process is not None:
                job.exit_code = job.process.returncode
                job.status = "killed" if job.kill_requested else "exited"
            elif job.status != "failed":
                job.status = "killed"
            job.ended_at = time.time()
            job.started.set()
            job.done.set()

    # -- using -------------------------------------------------------------------

    def _job(self, job_id: str) -> _Job:
        with self._lock:
            job = self._jobs.get(job_id)
            known = ", ".join(self._jobs) or "none"
        if job is None:
            raise ToolError(
                f"there is no background job {job_id!r} (jobs: {known}). Use action='list' to see them.",
            )
        return job

    def _check_loop(self, job: _Job) -> None:
        if trio.lowlevel.current_trio_token() is not job.token:
            msg = "JobTable's async methods must run on the trio loop its jobs run on"
            raise RuntimeError(msg)

    def get(self, job_id: str) -> JobInfo:
        """The state of one job.

        Raises:
            ToolError: there is no such job.
        """
        return self._job(job_id).info()

    def snapshot(self) -> tuple[JobInfo, ...]:
        """Every listed job, oldest first."""
        with self._lock:
            jobs = list(self._jobs.values())
        return tuple(job.info() for job in jobs)

    def read_nowait(self, job_id: str, *, max_lines: int | None = None) -> JobOutput:
        """Output that arrived since the previous read, without waiting.

        Raises:
            ToolError: there is no such job.
        """
        job = self._job(job_id)
        new = job.capture.read_new(max_lines=max_lines)
        return JobOutput(job=job.info(), text=new.text, omitted=new.omitted)

    async def wait(self, job_id: str, timeout: float, *, max_lines: int | None = None) -> JobOutput:
        """Wait until the job ends or ``timeout`` seconds pass; return its new output.

        Raises:
            ToolError: there is no such job.
        """
        job = self._job(job_id)
        self._check_loop(job)
        with trio.move_on_after(timeout):
            await job.done.wait()
        return self.read_nowait(job_id, max_lines=max_lines)

    async def wait_output(self, job_id: str, timeout: float, *, after: int) -> None:
        """Wait until the job has printed more than ``after`` bytes in all, ends, or ``timeout`` passes.

        Raises:
            ToolError: there is no such job.
        """
        job = self._job(job_id)
        self._check_loop(job)
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:

                async def output() -> None:
                    await job.capture.wait_output(after)
                    nursery.cancel_scope.cancel()

                async def ended() -> None:
                    await job.done.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(output)
                nursery.start_soon(ended)

    async def send_input(self, job_id: str, text: str, *, eof: bool = False) -> JobInfo:
        """Write ``text`` to the job's stdin; with ``eof``, close its stdin afterwards.

        Raises:
            ToolError: no such job, it has ended or closed its input, or it
                has not read its input for a while (the pipe is full).
        """
        job = self._job(job_id)
        self._check_loop(job)
        process = job.process
        if process is None or process.stdin is None or job.done.is_set():
            raise ToolError(
                f"{job_id} is not running ({job.status}); it cannot take input. "
                "Use action='wait' to read its last output.",
            )
        stdin = process.stdin
        async with job.stdin_lock:
            try:
                with trio.move_on_after(_INPUT_TIMEOUT) as scope:
                    if text:
                        await stdin.send_all(text.encode("utf-8"))
                    if eof:
                        await stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ToolError(
                    f"{job_id} has closed its input (or exited); the text was not delivered. "
                    "Use action='wait' to see what it printed.",
                ) from exc
        if scope.cancelled_caught:
            raise ToolError(
                f"{job_id} did not read its input for {_INPUT_TIMEOUT:.0f} s (its stdin pipe is full); "
                "some of the text may not have been delivered. Check it is waiting for input, or kill it.",
            )
        return job.info()

    async def kill(self, job_id: str, *, max_lines: int | None = None) -> JobOutput:
        """Stop the job (its whole process group: SIGTERM, then SIGKILL) and return its last output.

        Returns once its processes are gone.

        Raises:
            ToolError: there is no such job.
        """
        job = self._job(job_id)
        self._check_loop(job)
        if not job.done.is_set():
            job.kill_requested = True
            job.scope.cancel()
            await job.done.wait()
        return self.read_nowait(job_id, max_lines=max_lines)

    # -- closing -------------------------------------------------------------------

    def _begin_close(self) -> list[_Job]:
        with self._lock:
            self._closed = True
            jobs = [job for job in self._jobs.values() if not job.done.is_set()]
        for job in jobs:
            job.kill_requested = True
        # Shut down last-started first.
        return jobs[::-1]

    async def aclose(self) -> None:
        """Stop every job; return once their processes are gone. Idempotent.

        Runs on the table's trio loop. New jobs are refused from now on.
        """
        jobs = self._begin_close()
        for job in jobs:
            self._check_loop(job)
            job.scope.cancel()
        with trio.move_on_after(self._kill_grace + KILL_WAIT + 1.0):
            for job in jobs:
                await job.done.wait()

    def close(self) -> None:
        """Stop every job from a thread that is not running trio; blocks until their processes are gone.

        Signals the process groups directly (SIGTERM, then SIGKILL after the
        grace period) and cancels the supervisors, which then find nothing
        left to stop. Idempotent.

        Raises:
            RuntimeError: called from a thread running trio (use `aclose`,
                or `close_nowait`, which does not wait).
        """
        if trio.lowlevel.in_trio_run():
            msg = "JobTable.close() blocks; on a trio thread use 'await aclose()' or close_nowait()"
            raise RuntimeError(msg)
        jobs = self._begin_close()
        terminate_groups_blocking(
            [job.pid for job in jobs if job.pid is not None], grace=self._kill_grace, session=True
        )
        _kill_escapees(jobs)
        self._cancel_supervisors(jobs)

    def close_nowait(self) -> None:
        """Kill every job at once (SIGKILL, no grace) without waiting; callable from any thread. Idempotent."""
        jobs = self._begin_close()
        for job in jobs:
            if job.pid is not None:
                signal_group(job.pid, signal.SIGKILL, session=True)
        _kill_escapees(jobs)
        self._cancel_supervisors(jobs)

    def _cancel_supervisors(self, jobs: list[_Job]) -> None:
        for job in jobs:
            with contextlib.suppress(trio.RunFinishedError):
                job.token.run_sync_soon(job.scope.cancel)
            if job.handle is not None:
                job.handle.cancel()


def _kill_escapees(jobs: Sequence[_Job]) -> None:
    """SIGKILL the processes of ``jobs`` that left their session (found by the jobs' marks)."""
    for job in jobs:
        for pid in marked_processes(job.mark) or ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
