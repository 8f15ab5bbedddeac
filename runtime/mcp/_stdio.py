"""stdio transport: the server as a subprocess in a process group of its own.

The SDK's ``stdio_client`` is not used, for two reasons (mcp 2.3.0):
it escalates to killing the process group only when the *leader* outlives
its grace period, so children of a leader that exits on stdin EOF (``npx``
leaves ``node`` behind this way) survive the session; and it sends the
server's stderr to a file rather than keeping the tail we report when a
server fails to start. This module speaks the same stream contract
(``SessionMessage`` in, ``SessionMessage | Exception`` out) over
`trio.lowlevel.open_process`, so the SDK's ``ClientSession`` runs on it
unchanged.

Invariant: once `open_stdio_transport` has spawned the process, every way
out of it (normal exit, error, cancellation) runs `_StdioServer.shutdown`
under a shield, and that ends with no live process in the group.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from typing import TypeAlias

import anyio
import anyio.abc
import mcp_types as types
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage
from weald.runtime import MARK_VARIABLE, ChildProcess, new_process_mark, open_child_process

from ._config import ServerConfig, StdioLaunch
from ._exceptions import MCPStartError

__all__ = [
    "ReadReceive",
    "ReadSend",
    "StdioServer",
    "WriteReceive",
    "WriteSend",
    "describe_exit",
    "group_alive",
    "open_stdio_transport",
    "terminate_group",
]

logger = logging.getLogger("weald.runtime.mcp")

ReadSend: TypeAlias = MemoryObjectSendStream[SessionMessage | Exception]
ReadReceive: TypeAlias = MemoryObjectReceiveStream[SessionMessage | Exception]
WriteSend: TypeAlias = MemoryObjectSendStream[SessionMessage]
WriteReceive: TypeAlias = MemoryObjectReceiveStream[SessionMessage]

# Shutdown timing. The MCP lifecycle asks for stdin EOF first, then SIGTERM,
# then SIGKILL; the waits between are short because an agent waits on them.
EXIT_GRACE = 1.0  # after stdin EOF, for the leader to exit by itself
TERM_GRACE = 2.0  # after SIGTERM to the group, before SIGKILL
KILL_WAIT = 2.0  # after SIGKILL, for the kernel to finish the group off
STDOUT_DRAIN = 0.5  # after the leader died, for its last output to be read
STDERR_DRAIN = 0.5  # at shutdown, for the stderr tail to be complete
_GROUP_POLL = 0.02

STDERR_TAIL_LINES = 64
STDERR_TAIL_BYTES = 8 * 1024
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_READ_CHUNK = 64 * 1024


class _StderrRing:
    """The last lines of a stream, bounded in lines and in bytes.

    Invariant: ``sum(len(line) for line in lines) == size <= max_bytes``
    unless one line alone is kept, and that line is cut to ``max_bytes``.
    """

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._max_bytes = max_bytes
        self._partial = bytearray()

    def feed(self, data: bytes | bytearray) -> list[str]:
        """Add raw bytes; return the lines they completed."""
        self._partial += data
        done: list[str] = []
        while (newline := self._partial.find(b"\n")) >= 0:
            done.append(self._add(bytes(self._partial[:newline])))
            del self._partial[: newline + 1]
        if len(self._partial) > self._max_bytes:
            # A line with no end in sight is kept in pieces, not without bound.
            done.append(self._add(bytes(self._partial)))
            self._partial.clear()
        return done

    def finish(self) -> list[str]:
        """Flush a last unterminated line at end of stream."""
        if not self._partial:
            return []
        line = self._add(bytes(self._partial))
        self._partial.clear()
        return [line]

    def tail(self) -> str:
        """The kept lines, joined by newlines."""
        return "\n".join(self._lines)

    def _add(self, raw: bytes) -> str:
        line = raw.decode("utf-8", errors="replace").rstrip("\r")[-self._max_bytes :]
        self._lines.append(line)
        while len(self._lines) > 1 and sum(len(kept) for kept in self._lines) > self._max_bytes:
            self._lines.popleft()
        return line


def describe_exit(code: int) -> str:
    """Say how a process ended, for error messages."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _proc_has_live_member(pgid: int) -> bool:
    """Whether /proc shows a member of the group that is not a zombie.

    A group whose members are all zombies is dead but still answers
    ``killpg(pgid, 0)`` until their reaper collects them, which some
    container inits do only every second or two. Without /proc (not Linux)
    every group that answers is taken to be alive.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                data = stat.read()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def group_alive(pgid: int) -> bool:
    """Whether the process group still has a live (non-zombie) member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member we may not signal is still a member
    return _proc_has_live_member(pgid)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    # The pgid is the leader's pid (start_new_session). It stays reserved while
    # any member lives, so this cannot reach a stranger's group unless the
    # whole group died and the number was reused in between, the same window
    # every kill(2) by pid has.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


async def _wait_group_gone(pgid: int, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        # Polled: nothing signals the death of processes that are not our children.
        while True:
            if not group_alive(pgid):
                return True
            await trio.sleep(_GROUP_POLL)
    return False


async def terminate_group(pgid: int) -> None:
    """SIGTERM the whole group, then SIGKILL what is left after a grace.

    Bounded: returns within ``TERM_GRACE + KILL_WAIT`` seconds.
    """
    if not group_alive(pgid):
        return
    _signal_group(pgid, signal.SIGTERM)
    # A stopped member (SIGSTOP, a debugger) acts on SIGTERM only once continued.
    _signal_group(pgid, signal.SIGCONT)
    if await _wait_group_gone(pgid, TERM_GRACE):
        return
    logger.warning("MCP server process group %d ignored SIGTERM; sending SIGKILL", pgid)
    _signal_group(pgid, signal.SIGKILL)
    if not await _wait_group_gone(pgid, KILL_WAIT):
        logger.error("MCP server process group %d survived SIGKILL", pgid)


class StdioServer:
    """A running stdio server process and the tasks that pump its pipes.

    Created only by `open_stdio_transport`. The pump tasks run in the
    transport's nursery; ``on_lost`` and ``on_stderr_line`` are called from
    them, synchronously, and must not block or raise.
    """

    def __init__(
        self,
        config: ServerConfig,
        process: ChildProcess,
        *,
        on_lost: Callable[[str], None],
        on_stderr_line: Callable[[str], None],
    ) -> None:
        self._config = config
        self._process = process
        self._on_lost = on_lost
        self._on_stderr_line = on_stderr_line
        self._stderr = _StderrRing(STDERR_TAIL_LINES, STDERR_TAIL_BYTES)
        self._exited = trio.Event()
        self._stdout_done = trio.Event()
        self._stderr_done = trio.Event()
        self._stdout_scope = trio.CancelScope()
        self._closing = False

    @property
    def pid(self) -> int:
        """The server's pid, which is also its process group id."""
        return self._process.pid

    @property
    def exit_code(self) -> int | None:
        """The server's exit status once it has exited, else ``None``."""
        return self._process.returncode

    def stderr_tail(self) -> str:
        """The last lines (at most 64, 8 KiB) the server wrote to stderr."""
        return self._stderr.tail()

    async def wait_exited(self) -> None:
        """Wait until the server process has exited and been reaped."""
        await self._exited.wait()

    def describe_loss(self, fallback: str) -> str:
        """Say why the server is gone, preferring its exit status."""
        code = self.exit_code
        return f"the server process {describe_exit(code)}" if code is not None else fallback

    def _lose(self, reason: str) -> None:
        if not self._closing:
            self._on_lost(reason)

    async def pump_stdout(self, read_send: ReadSend) -> None:
        """Frame stdout into JSON-RPC messages; close ``read_send`` at its end."""
        stdout = self._process.stdout
        assert stdout is not None  # spawned with a pipe
        buffer = bytearray()
        try:
            async with read_send:
                with self._stdout_scope:
                    try:
                        while chunk := await stdout.receive_some(_READ_CHUNK):
                            buffer += chunk
                            for line in _split_lines(buffer):
                                await read_send.send(self._parse(line))
                            if len(buffer) > MAX_MESSAGE_BYTES:
                                self._lose(f"the server sent a line longer than {MAX_MESSAGE_BYTES} bytes")
                                return
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # the pipe broke or shutdown closed it
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return  # the session stopped reading: it is going away
                self._lose("the server closed its stdout")
        finally:
            self._stdout_done.set()

    def _parse(self, line: bytes) -> SessionMessage | Exception:
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            logger.warning(
                "MCP server %r wrote a line to stdout that is not JSON-RPC: %.200r",
                self._config.name,
                line,
            )
            return exc

    async def pump_stdin(self, write_receive: WriteReceive) -> None:
        """Write each outgoing message to stdin as one line of JSON."""
        stdin = self._process.stdin
        assert stdin is not None  # spawned with a pipe
        try:
            async with write_receive:
                async for message in write_receive:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send_all(data.encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            # The server stopped reading. Its answers can no longer come, so
            # end the read side too: waiting requests fail now, not never.
            self._lose("the server stopped reading its stdin")
            self._stdout_scope.cancel()

    async def pump_stderr(self) -> None:
        """Keep the stderr tail and hand each line to ``on_stderr_line``."""
        stderr = self._process.stderr
        assert stderr is not None  # spawned with a pipe
        try:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while chunk := await stderr.receive_some(_READ_CHUNK):
                    for line in self._stderr.feed(chunk):
                        self._on_stderr_line(line)
            for line in self._stderr.finish():
                self._on_stderr_line(line)
        finally:
            self._stderr_done.set()

    async def watch_exit(self) -> None:
        """Reap the server; if it died on its own, end the session and its group."""
        await self._process.wait()
        self._exited.set()
        if self._closing:
            return
        self._lose(self.describe_loss("the server process exited"))
        # Let the reader take what the server wrote before it died (a last
        # response may be in the pipe), but not wait on an orphan that
        # inherited stdout and keeps it open.
        with trio.move_on_after(STDOUT_DRAIN):
            await self._stdout_done.wait()
        self._stdout_scope.cancel()
        await terminate_group(self.pid)

    async def shutdown(self) -> None:
        """Stop the server: stdin EOF, then SIGTERM and SIGKILL to the group.

        Bounded (about 6 s at worst) and meant to run shielded. Runs even if
        the server already exited, since its children may not have.
        """
        self._closing = True
        stdin = self._process.stdin
        assert stdin is not None
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await stdin.aclose()
        await self._wait_reaped(EXIT_GRACE)
        await terminate_group(self.pid)
        await self._wait_reaped(KILL_WAIT)
        with trio.move_on_after(STDERR_DRAIN):
            await self._stderr_done.wait()

    async def _wait_reaped(self, timeout: float) -> None:
        # Polls rather than awaiting the process: when the session is
        # cancelled, the watcher task that awaits it is cancelled too, and
        # two tasks may not await one process at once.
        with trio.move_on_after(timeout):
            while True:
                if self._process.returncode is not None:  # reading it reaps
                    return
                await trio.sleep(_GROUP_POLL)


def _split_lines(buffer: bytearray) -> list[bytes]:
    """Remove and return the complete, non-blank lines at the start of ``buffer``."""
    lines: list[bytes] = []
    while (newline := buffer.find(b"\n")) >= 0:
        line = bytes(buffer[:newline]).strip()
        del buffer[: newline + 1]
        if line:
            lines.append(line)
    return lines


async def _spawn(config: ServerConfig) -> tuple[ChildProcess, StdioLaunch | None]:
    assert config.command is not None
    # The mark finds what the server started if the daemon dies before it
    # could stop them (`weald.runtime.stop_leftover_processes`, at the next start).
    env = get_default_environment() | dict(config.env) | {MARK_VARIABLE: new_process_mark()}
    argv = [config.command, *config.args]
    launch: StdioLaunch | None = None
    if config.launcher is not None:
        try:
            launch = await trio.to_thread.run_sync(config.launcher.prepare, config.name, argv, env, config.cwd)
        except (OSError, ValueError, RuntimeError) as exc:
            raise MCPStartError(f"MCP server {config.name!r} may not start: {exc}", server=config.name) from exc
        if launch is not None:
            argv, env = launch.argv, launch.env
    try:
        # Forked so that it gets SIGKILL if the daemon dies.
        process = await open_child_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=config.cwd,
            # A session (hence a process group) of its own, so that shutdown
            # can signal everything the server starts, not just the server.
            start_new_session=True,
            pass_fds=() if launch is None else launch.pass_fds,
        )
    except (OSError, ValueError) as exc:
        if launch is not None:
            await _ended(launch)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise MCPStartError(
            f"MCP server {config.name!r} could not be started: {config.command!r}: {reason}",
            server=config.name,
        ) from exc
    except BaseException:
        if launch is not None:
            await _ended(launch)
        raise
    if launch is not None:
        launch.started()
    return process, launch


async def _ended(launch: StdioLaunch) -> None:
    """Give back what ``launch`` held, once its process is gone (shielded: it runs on every way out)."""
    launch.started()
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(launch.ended)


@contextlib.asynccontextmanager
async def open_stdio_transport(
    config: ServerConfig,
    *,
    on_lost: Callable[[str], None],
    on_stderr_line: Callable[[str], None],
) -> AsyncIterator[tuple[StdioServer, ReadReceive, WriteSend]]:
    """Start a stdio server and yield it with the SDK's stream pair.

    Args:
        config: A stdio config (``command`` set).
        on_lost: Called once the server is gone or unusable while the
            transport is open, with a reason; not called during shutdown.
        on_stderr_line: Called with each line the server writes to stderr.

    Yields:
        The server handle, the stream of messages from the server and the
        stream of messages to it.

    Raises:
        MCPStartError: The process could not be spawned.
    """
    process, launch = await _spawn(config)
    server = StdioServer(config, process, on_lost=on_lost, on_stderr_line=on_stderr_line)
    # Unbuffered, as the SDK's own transports: a reader that falls behind
    # holds the server back instead of queueing without bound.
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.watch_exit)
            nursery.start_soon(server.pump_stdout, read_send)
            nursery.start_soon(server.pump_stdin, write_receive)
            nursery.start_soon(server.pump_stderr)
            try:
                yield server, read_receive, write_send
            finally:
                with trio.CancelScope(shield=True):
                    await server.shutdown()
                nursery.cancel_scope.cancel()
    finally:
        # Reached without shutdown() only if the nursery could not start.
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGKILL)
        for stream in (read_send, read_receive, write_send, write_receive):
            stream.close()
        if launch is not None:
            await _ended(launch)
