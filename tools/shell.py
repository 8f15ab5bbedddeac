"""The ``shell`` tool: run a bash command line, in the foreground or as a background job.

A foreground command runs under ``bash -c`` in a process group (and session)
of its own, in a directory inside the sandbox, with secrets removed from its
environment and ``/dev/null`` as its stdin. Its stdout and stderr stream out
as ``output`` events while it runs and come back, interleaved, as the tail
of the result; when there was more than fits, all of it is in a spool file
named by ``full_output_path``. When it times out or the call is aborted, its
whole process group is stopped (SIGTERM, then SIGKILL) before the call ends;
processes it left running in the background when it exited are stopped too,
including those that left its session (``setsid``): every process the
command starts carries a mark for the call in its environment
(``WEALD_PROCESS_MARK``), and what carries it is stopped with the group. The
result says processes were stopped only once none is left; otherwise it
names the ones that survived.

``background=true`` starts the command as a job of the session's `JobTable`
and returns its id at once; ``action`` ``wait``, ``input``, ``kill`` and
``list`` follow it up.

Where bubblewrap works, every command and background job runs in weald's
OS sandbox (`weald.tools._bwrap`): the filesystem read-only except the
project, a private ``/tmp`` (one per session) and configured paths; the
daemon's state, socket and config and the usual homes of credentials
hidden; a PID namespace of its own, which dies whole with the command, the
call, the agent and the daemon; no network unless configured.

Options (``[tools.shell]``): ``env`` (variables added to the
environment), ``env_keep`` (secret-looking variables to keep), ``kill_grace``
(seconds between SIGTERM and SIGKILL, default 2), ``sandbox`` (``"auto"``:
the OS sandbox where it works, else process groups only; ``"required"``:
refuse to run a command without it; ``"off"``), ``network`` (true, false,
or a list of command patterns that may use it), ``writable``, ``readable``
and ``hidden`` (lists of paths; ``~`` is the home directory).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio
from weald.runtime import (
    MARK_VARIABLE,
    ChildProcess,
    ProtectedLinks,
    RestoredLink,
    make_private_dirs,
    marked_processes,
    new_process_mark,
    sanitized_env,
)
from weald.tools._bwrap import (
    SANDBOX_ENABLE_HINT,
    SandboxPolicy,
    bwrap_options,
    cached_sandbox_status,
    default_hidden_paths,
    expand_paths,
    options_file,
    sandbox_status,
)
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._editor import EditorBridge, EditorError, editor_terminal
from weald.tools._jobs import JobInfo, JobOutput, JobTable
from weald.tools._process import (
    DEFAULT_KILL_GRACE,
    OutputCapture,
    capture_until_exit,
    leftover_processes,
    open_group_process,
    procfs_readable,
)
from weald.tools._protected import Placeholders
from weald.tools._sandbox import pinned_directory
from weald.tools._shellrules import match_shell_patterns

_logger = logging.getLogger("weald.tools")

__all__ = ["DEFAULT_TIMEOUT", "MAX_TIMEOUT", "shell"]

DEFAULT_TIMEOUT = 120.0
"""Seconds a foreground command may run unless the call asks for more."""

MAX_TIMEOUT = 600.0
"""The longest a call may ask for."""

_DEFAULT_WAIT = 30.0
_DEFAULT_INPUT_WAIT = 1.0

# Output is still read this long after the command exited, in case a
# process it left in the background holds the pipes open.
_DRAIN_AFTER_EXIT = 0.25
# In the sandbox, the pipes close once bwrap's namespace is gone, which it is
# when bwrap exits: a longer wait that ends at once, unless the loop lags.
_SANDBOX_DRAIN_AFTER_EXIT = 2.0

# Room in the output limits for the lines this tool adds around the output.
_RESERVED_BYTES = 1024
_RESERVED_LINES = 6

# Make the common interactive programs behave in a pipe; config can override.
_NON_INTERACTIVE = {"PAGER": "cat", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"}

_DESCRIPTION = """\
Run a bash command line in the project and return its exit code and output (stdout and stderr \
interleaved; when long, the end of it, with the full output saved to a file).
Foreground commands time out after 120 s (unless configured otherwise) or after `timeout` s when given \
(at most 600); stdin is empty, so nothing can prompt. For servers, watchers and other long jobs set \
`background` true: the call returns a job id at once, and `action` follows the job up: `wait` (job_id, \
timeout: wait for it to end, return its new output), `input` (job_id, text: write to its stdin), \
`kill` (job_id), `list`.
Prefer the file tools over cat/sed/grep for reading and editing files."""

_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "minLength": 1,
            "description": "The bash command line to run (for action 'run', the default).",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_TIMEOUT,
            "description": (
                "Seconds. 'run': how long the command may take (default 120 or as configured, at most 600). "
                "'wait': how long to wait for the job to end (default 30). "
                "'input': how long to wait for the job's reply (default 1)."
            ),
        },
        "cwd": {
            "type": "string",
            "description": "Directory to run in, inside the project (default: the working directory).",
        },
        "background": {
            "type": "boolean",
            "description": "Start the command as a background job and return its job id at once.",
        },
        "action": {
            "type": "string",
            "enum": ["run", "wait", "input", "kill", "list"],
            "description": "'run' (default) a command; or follow up a background job: 'wait', 'input', 'kill', 'list'.",
        },
        "job_id": {"type": "string", "description": "The background job, for 'wait', 'input' and 'kill'."},
        "text": {
            "type": "string",
            "description": "For 'input': what to write to the job's stdin (end a line with \\n).",
        },
        "eof": {"type": "boolean", "description": "For 'input': close the job's stdin after writing."},
    },
    "additionalProperties": False,
}


@tool(
    name="shell",
    description=_DESCRIPTION,
    parameters=_PARAMETERS,
    permission="ask",
    timeout=DEFAULT_TIMEOUT,
    max_timeout=MAX_TIMEOUT,
    truncate="tail",
    subject=lambda args: args.get("command"),
    match_patterns=match_shell_patterns,
    kind="exec",
)
async def shell(
    ctx: ToolContext,
    *,
    command: str | None = None,
    timeout: float | None = None,
    cwd: str | None = None,
    background: bool = False,
    action: str = "run",
    job_id: str | None = None,
    text: str | None = None,
    eof: bool = False,
) -> ToolResult:
    """Run a command, start a background job, or follow one up (see the module docstring)."""
    if action == "run":
        if command is None:
            raise ToolError(
                "command is required to run something. To follow up a background job, "
                "set action to 'wait', 'input', 'kill' or 'list'.",
            )
        if background:
            return await _start_job(ctx, command, cwd)
        return await _run(ctx, command, _run_timeout(ctx, timeout), cwd)
    jobs = _job_table(ctx)
    if action == "list":
        return _list_jobs(jobs)
    if job_id is None:
        raise ToolError(f"job_id is required for action {action!r}. Use action='list' to see the background jobs.")
    limits = _Limits.of(ctx)
    if action == "wait":
        wait = timeout if timeout is not None else _DEFAULT_WAIT
        return _job_result(await jobs.wait(job_id, wait, max_lines=limits.lines), waited=wait)
    if action == "input":
        if text is None and not eof:
            raise ToolError("text is required for action 'input' (or eof=true to close the job's stdin).")
        printed = jobs.get(job_id).output_bytes
        info = await jobs.send_input(job_id, text or "", eof=eof)
        wait = timeout if timeout is not None else _DEFAULT_INPUT_WAIT
        await jobs.wait_output(job_id, wait, after=printed)
        sent = f"Sent {len(text or '')} characters to {info.id}" + (" and closed its stdin." if eof else ".")
        return _job_result(jobs.read_nowait(job_id, max_lines=limits.lines), before=sent)
    if action == "kill":
        was_running = jobs.get(job_id).running
        output = await jobs.kill(job_id, max_lines=limits.lines)
        note = None if was_running else f"{job_id} had already ended."
        return _job_result(output, before=note, ok_if_failed=True)
    raise ToolError(f"unknown action {action!r}; use 'run', 'wait', 'input', 'kill' or 'list'.")


# -- shared -----------------------------------------------------------------------


def _run_timeout(ctx: ToolContext, asked: float | None) -> float:
    """Seconds a foreground command may run: what the call asked, else the runner's limit, else the default.

    Under the tool runner ``ctx.timeout`` already holds the call's own
    ``timeout`` or the configured ``[tools.timeouts] shell``; the default
    only applies to a call made outside a runner.
    """
    if asked is not None:
        return asked
    return ctx.timeout if ctx.timeout is not None else DEFAULT_TIMEOUT


class _Limits:
    __slots__ = ("bytes", "lines")

    def __init__(self, lines: int, size: int) -> None:
        self.lines = lines
        self.bytes = size

    @classmethod
    def of(cls, ctx: ToolContext) -> _Limits:
        # Keep what we return inside the runner's limits, so that it does
        # not cut our output again (and our own spool file stays the full one).
        lines = max(10, ctx.config.max_output_lines - _RESERVED_LINES)
        size = max(4096, ctx.config.max_output_bytes - _RESERVED_BYTES)
        return cls(lines, size)


@functools.cache
def _shell_program() -> str:
    for candidate in (shutil.which("bash"), "/bin/bash"):
        if candidate and Path(candidate).is_file():
            return candidate
    return "/bin/sh"


def _argv(command: str) -> list[str]:
    return [_shell_program(), "-c", command]


def _environment(ctx: ToolContext, workdir: Path) -> dict[str, str]:
    keep = tuple(str(name) for name in ctx.config.option("shell", "env_keep", ()))
    env = sanitized_env(keep=keep)
    env.update(_NON_INTERACTIVE)
    # The command runs in /proc/self/fd/N; PWD gives the shell its real name
    # (bash checks it names the same directory before it uses it).
    env["PWD"] = str(workdir)
    extra: Mapping[str, Any] = ctx.config.option("shell", "env", {})
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


# -- the OS sandbox ---------------------------------------------------------------

# A network pattern matches a command made of one simple command only: with
# any of these in it, the command may run something the pattern never named.
_SHELL_SYNTAX = frozenset(";&|<>()$`\n\r")

_READ_ONLY_HINT = (
    "The command runs in weald's OS sandbox, where only the project directory and /tmp are writable "
    "(and the rest of the filesystem is read-only). If it must write elsewhere (a cache such as ~/.cache, "
    "a toolchain's directory), ask the user to add that path to [tools.shell] writable in weald.toml."
)
_NETWORK_HINT = (
    "The command runs in weald's OS sandbox without network access. If it needs the network, ask the user "
    "to allow it in weald.toml: [tools.shell] network = true, or a list of command patterns such as "
    '["npm install*", "pip install *"].'
)
_PROTECTED_HINT = (
    "weald.toml, .weald/, git's config and hooks (and the files weald's configuration reads) are read-only to "
    "every command, whether they exist or not (a missing one is an empty read-only placeholder while the command "
    "runs): they decide what agents may do. Nothing was changed there. If one must change, tell the user what "
    "to change and why."
)
_READ_ONLY_SIGNS = ("Read-only file system",)
_PROTECTED_SIGNS = ("weald.toml", ".weald", ".git/", "Device or resource busy")
_NETWORK_SIGNS = (
    "Could not resolve host",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "network is unreachable",
    "No address associated with hostname",
    "getaddrinfo",
    "ENOTFOUND",
    "EAI_AGAIN",
)


class _Launch:
    """How a command is started: its argv, environment and descriptors, in or out of the sandbox.

    A sandboxed launch holds bubblewrap's options file (`started` closes it
    once the command runs), the placeholders of missing protected paths and
    the links on the way to protected paths (`ended` gives them back once it
    has ended, putting back a link the command replaced: `restored`).
    """

    __slots__ = (
        "argv",
        "emit",
        "env",
        "links",
        "mode",
        "network",
        "options_fd",
        "pass_fds",
        "placeholders",
        "restored",
        "sandboxed",
    )

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        mode: str,
        network: bool,
        pass_fds: tuple[int, ...],
        options_fd: int | None = None,
        placeholders: Placeholders | None = None,
        links: ProtectedLinks | None = None,
        emit: Callable[[str, Mapping[str, Any]], None] | None = None,
    ):
        self.argv = argv
        self.env = env
        self.mode = mode  # "bwrap", "off" (configured) or "unavailable" (auto, and bwrap does not work here)
        self.network = network
        self.pass_fds = pass_fds
        self.sandboxed = mode == "bwrap"
        self.options_fd = options_fd
        self.placeholders = placeholders
        self.links = links
        self.emit = emit
        self.restored: list[RestoredLink] = []

    def started(self) -> None:
        """Close the options file: bubblewrap has it (idempotent)."""
        fd, self.options_fd = self.options_fd, None
        if fd is not None:
            os.close(fd)

    async def ended(self) -> None:
        """Give back the placeholders and the links, in a worker thread (they are files); call once the command ended.

        A protected link the command replaced or removed is put back
        (`weald.runtime.ProtectedLinks.release`), kept in `restored`, and
        published as ``tool.link_restored``.
        """
        self.started()
        with trio.CancelScope(shield=True):
            if self.placeholders is not None and self.placeholders.paths:
                await trio.to_thread.run_sync(self.placeholders.release)
            if self.links is not None and self.links.paths:
                self.restored = await trio.to_thread.run_sync(self.links.release)
        for link in self.restored:
            _logger.warning("%s", link.describe())
            if self.emit is not None:
                self.emit(
                    "link_restored",
                    {
                        "path": str(link.path),
                        "target": link.target,
                        "moved_to": None if link.moved_to is None else str(link.moved_to),
                        "error": link.error,
                    },
                )

    def with_restored(self, result: ToolResult) -> ToolResult:
        """``result`` with a line for each protected link the command replaced (see `ended`)."""
        if not self.restored:
            return result
        lines = "\n".join(link.describe() for link in self.restored)
        data = {**(result.data or {}), "links_restored": [str(link.path) for link in self.restored]}
        return attrs.evolve(result, output=f"{result.output}\n\n{lines}", data=data)


def network_allowed(setting: object, command: str) -> bool:
    """Whether ``[tools.shell] network`` lets ``command`` use the network.

    ``true`` and ``false`` say it for every command. A list of glob
    patterns allows a command that one of them matches whole, and only
    when it is one simple command: with ``;``, ``&``, ``|``, a redirection,
    a substitution or a second line in it, no pattern matches (the pattern
    would otherwise lend the network to whatever follows).
    """
    if isinstance(setting, bool):
        return setting
    if not isinstance(setting, list | tuple) or any(char in _SHELL_SYNTAX for char in command):
        return False
    text = command.strip()
    return any(fnmatch.fnmatchcase(text, str(pattern)) for pattern in setting)


async def _sandbox_bwrap(mode: str) -> str | None:
    """The ``bwrap`` a command of ``[tools.shell] sandbox = mode`` runs under; None: it runs outside the sandbox.

    Raises:
        ToolError: ``mode`` is ``"required"`` and the sandbox does not work here.
    """
    if mode == "off":
        return None
    status = cached_sandbox_status()
    if status is None:
        status = await trio.to_thread.run_sync(sandbox_status)
    if status.available and status.bwrap is not None:
        return status.bwrap
    if mode == "required":
        raise ToolError(
            f'commands may only run in weald\'s OS sandbox here ([tools.shell] sandbox = "required"), '
            f"and it does not work on this machine: {status.reason}. Nothing was run. Ask the user to "
            f"{SANDBOX_ENABLE_HINT}.",
        )
    return None


def _unsandboxed(mode: str) -> str:
    """A `_Launch`'s mode for a command run outside the sandbox: ``off`` as asked, or ``unavailable``."""
    return "off" if mode == "off" else "unavailable"


async def _launch(ctx: ToolContext, command: str, workdir: Path, fd: int) -> _Launch:
    """The command line for ``command``: in the OS sandbox when it is on and works here.

    Raises:
        ToolError: ``sandbox = "required"`` and the sandbox does not work here.
    """
    env = _environment(ctx, workdir)
    mode = str(ctx.config.option("shell", "sandbox", "auto"))
    network = network_allowed(ctx.config.option("shell", "network", False), command)
    bwrap = await _sandbox_bwrap(mode)
    if bwrap is None:
        return _Launch(_argv(command), env, mode=_unsandboxed(mode), network=True, pass_fds=(fd,))
    search_path = env.get("PATH", "")
    env["TMPDIR"] = "/tmp"  # noqa: S108 - the sandbox's own /tmp
    placeholders, links = Placeholders(), ProtectedLinks()

    def options() -> int:  # in a memory file, its descriptor; the filesystem is looked at in a worker thread
        return options_file(
            _sandbox_option_list(ctx, workdir, network, placeholders=placeholders, links=links, search_path=search_path)
        )

    try:
        options_fd = await trio.to_thread.run_sync(options)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(placeholders.release)
            await trio.to_thread.run_sync(links.release)
        raise
    argv = [bwrap, "--args", str(options_fd), "--", *_argv(command)]
    # No directory's descriptor goes in: one opened out here would lead back
    # out of the sandbox's mounts (openat(fd, "..")). bwrap starts in the
    # pinned directory and enters it again by its name, inside. The options
    # file is a memory file, which bubblewrap reads and closes.
    return _Launch(
        argv,
        env,
        mode="bwrap",
        network=network,
        pass_fds=(options_fd,),
        options_fd=options_fd,
        placeholders=placeholders,
        links=links,
        emit=ctx.emit,
    )


def toolchain_in_tmp(search_path: str) -> tuple[Path, ...]:
    """Where the command's programs live under the host's ``/tmp``, which the sandbox replaces with its own.

    A checkout and its virtualenv under ``/tmp`` (a CI runner's work
    directory, ``git clone`` into ``/tmp``) would otherwise vanish from the
    sandbox with the rest of the host's ``/tmp``: the daemon's own Python
    prefixes and the ``PATH`` directories found there (with the virtualenv a
    ``bin`` belongs to) are shown again, read-only. Blocks: it looks at the
    filesystem.
    """
    host_tmp = Path("/tmp")  # noqa: S108 - the host's /tmp, which the sandbox hides
    found: list[Path] = []
    candidates = [Path(sys.prefix), Path(sys.exec_prefix), Path(sys.base_prefix)]
    candidates += [Path(entry) for entry in search_path.split(os.pathsep) if entry]
    for candidate in candidates:
        try:
            real = candidate.resolve(strict=True)
        except OSError:
            continue
        if host_tmp not in real.parents:
            continue
        if real.name == "bin" and (real.parent / "pyvenv.cfg").is_file():
            real = real.parent  # the whole virtualenv: its lib/ holds what its python imports
        if real not in found:
            found.append(real)
    return tuple(found)


def _sandbox_option_list(
    ctx: ToolContext,
    workdir: Path,
    network: bool,
    *,
    placeholders: Placeholders,
    links: ProtectedLinks,
    search_path: str,
) -> list[str]:
    """The options bubblewrap gets for a command (blocking, for a worker thread).

    It looks at the filesystem, makes the placeholders of missing protected
    paths (held in ``placeholders``) and remembers the links on the way to
    them (in ``links``).
    """
    option = ctx.config.option
    tmp = None
    if ctx.session is not None:
        # One private /tmp per session, so a job and later calls share it.
        tmp = Path(ctx.session.output_dir) / "tmp"
        make_private_dirs(tmp)
    project = Path(ctx.working_dir)
    policy = SandboxPolicy(
        project=project,
        workdir=workdir,
        writable=expand_paths(option("shell", "writable", ()), base=project),
        readable=(
            *expand_paths(option("shell", "readable", ()), base=project),
            *ctx.allowed_dirs,
            *toolchain_in_tmp(search_path),
        ),
        hidden=(*default_hidden_paths(), *expand_paths(option("shell", "hidden", ()), base=project)),
        private=expand_paths(ctx.config.private_paths),
        protected=expand_paths(ctx.config.protected_paths),
        network=network,
        tmp=tmp,
    )
    return bwrap_options(policy, placeholders, links)


def _sandbox_hints(launch: _Launch, output: str, failed: bool) -> list[str]:
    if not launch.sandboxed or not failed:
        return []
    hints = []
    if any(sign in output for sign in _PROTECTED_SIGNS):
        hints.append(_PROTECTED_HINT)
    if any(sign in output for sign in _READ_ONLY_SIGNS):
        hints.append(_READ_ONLY_HINT)
    if not launch.network and any(sign in output for sign in _NETWORK_SIGNS):
        hints.append(_NETWORK_HINT)
    return hints


def _workdir(ctx: ToolContext, cwd: str | None) -> Path:
    path = ctx.resolve_path(cwd if cwd is not None else ".", must_exist=True)
    if not path.is_dir():
        raise ToolError(f"cwd {cwd!r} is a file, not a directory. Give a directory (or leave cwd out).")
    return path


def _spool_dir(ctx: ToolContext) -> Path:
    if ctx.session is not None:
        return Path(ctx.session.output_dir)
    return Path(tempfile.gettempdir()) / "weald-output"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if 128 < code <= 128 + 64:
        # What a shell (and the sandbox, for the command it ran) reports
        # for a process a signal killed.
        return f"exit code {code} (128 + {code - 128}: killed by {_signal_name(code - 128)})"
    return f"exit code {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _omitted_note(omitted: int, spool: Path | str | None, error: str | None = None, cut: str | None = None) -> str:
    if spool is not None and cut is not None:
        where = f"the output is in {spool} (read_file or grep it), but {cut}"
    elif spool is not None:
        where = f"the full output is in {spool} (read_file or grep it)"
    elif cut is not None:
        where = f"the full output: {cut}"
    elif error is not None:
        where = f"the full output could not be saved ({error})"
    else:
        where = "it was not kept"
    return f"[{omitted:,} bytes of earlier output not shown; {where}]"


def _result(ok: bool, output: str, *, data: Any, hints: list[str]) -> ToolResult:
    return (
        ToolResult.success(output, data=data, hints=hints) if ok else ToolResult.error(output, data=data, hints=hints)
    )


def _job_table(ctx: ToolContext) -> JobTable:
    jobs = getattr(ctx.session, "jobs", None)
    if not isinstance(jobs, JobTable):
        raise ToolError(
            "background jobs are not available in this session. Run the command in the foreground "
            "(background=false), with a timeout of up to 600 s.",
        )
    return jobs


# -- foreground -------------------------------------------------------------------


async def _run(ctx: ToolContext, command: str, timeout: float, cwd: str | None) -> ToolResult:
    workdir = _workdir(ctx, cwd)
    if ctx.config.editor_terminal:  # off unless the project chose the editor's terminals: one attribute
        editor = editor_terminal(ctx)
        if editor is not None:
            return await _run_in_editor(ctx, editor, command, timeout, workdir)
    # The command starts in the directory held open by an O_NOFOLLOW walk
    # (/proc/self/fd/N), not by its name: one swapped for a symlink after the
    # check is refused, never entered.
    with pinned_directory(ctx, workdir) as (pinned, fd):
        return await _run_in(ctx, command, timeout, workdir=workdir, pinned=pinned, fd=fd)


async def _run_in(
    ctx: ToolContext, command: str, timeout: float, *, workdir: Path, pinned: Path, fd: int
) -> ToolResult:
    limits = _Limits.of(ctx)
    grace = float(ctx.config.option("shell", "kill_grace", DEFAULT_KILL_GRACE))
    launch = await _launch(ctx, command, workdir, fd)
    try:
        result = await _run_launched(ctx, launch, timeout, limits=limits, grace=grace, pinned=pinned)
    finally:
        await launch.ended()
    return launch.with_restored(result)


async def _run_launched(
    ctx: ToolContext, launch: _Launch, timeout: float, *, limits: _Limits, grace: float, pinned: Path
) -> ToolResult:
    capture = OutputCapture(
        tail_bytes=limits.bytes,
        spool_dir=_spool_dir(ctx),
        spool_prefix="shell-",
        emit=ctx.emit,
        spill=getattr(ctx.session, "spill", None),
    )
    started = trio.current_time()
    process: ChildProcess | None = None
    timed_out = False
    left_running = False
    mark = new_process_mark()
    try:
        async with open_group_process(
            launch.argv,
            cwd=pinned,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            grace=grace,
            session=True,
            pass_fds=launch.pass_fds,
            mark=mark,
            sandboxed=launch.sandboxed,
        ) as process:
            launch.started()
            # The whole timeout: the runner's own deadline for the call is later
            # (`RunnerConfig.grace`), so this answer, with the output, comes first.
            with trio.move_on_after(timeout) as deadline:
                # In the sandbox nothing outlives the command: its namespace is
                # gone when bwrap is, so the pipes close, however busy the loop.
                drain = _SANDBOX_DRAIN_AFTER_EXIT if launch.sandboxed else _DRAIN_AFTER_EXIT
                held_open = await capture_until_exit(process, capture, drain=drain)
                left_running = (
                    _left_in_sandbox(process.returncode, held_open)
                    if launch.sandboxed
                    else _left_running(process.pid, mark, held_open)
                )
            timed_out = deadline.cancelled_caught
        # Leaving the block stopped whatever was still running: all of it
        # on a timeout, what the command left in the background otherwise.
    except OSError as exc:
        if process is not None:
            raise
        raise ToolError(f"the command could not be started: {exc}. Check cwd, and that bash is installed.") from exc
    finally:
        with trio.CancelScope(shield=True):
            await capture.aclose()
    duration = trio.current_time() - started
    assert process is not None
    # Checked, not assumed: a process stuck in the kernel, or one that
    # changed its user, outlives even SIGKILL.
    check = (left_running or timed_out) and not (launch.sandboxed and process.returncode is not None)
    survivors = leftover_processes(process.pid, session=True, mark=mark) if check else []
    return _foreground_result(
        capture,
        code=process.returncode,
        timed_out=timed_out,
        timeout=timeout,
        left_running=left_running,
        survivors=survivors,
        duration=duration,
        limits=limits,
        launch=launch,
    )


def _left_running(pid: int, mark: str, held_open: bool) -> bool:
    """Whether a command (run outside the sandbox) left processes running once it ended.

    Asked of /proc (a live process of its session, or carrying its mark),
    not of the pipes: their holder may have been SIGKILLed with the group a
    moment before (by a fault, or the user) and be dying. Without /proc, a
    pipe still held open is the sign.
    """
    if procfs_readable():
        return bool(leftover_processes(pid, session=True, mark=mark))
    return held_open


def _left_in_sandbox(returncode: int | None, held_open: bool) -> bool:
    """Whether a sandboxed command left processes running once it ended.

    A pipe still held open is the sign, unless bwrap itself was killed by a
    signal (a fault, the user): then its namespace is being torn down with
    it (it dies with its parent), and what holds the pipes is dying.
    """
    return held_open and not (returncode is not None and returncode < 0)


def _foreground_result(
    capture: OutputCapture,
    *,
    code: int | None,
    timed_out: bool,
    timeout: float,
    left_running: bool,
    survivors: list[int],
    duration: float,
    limits: _Limits,
    launch: _Launch,
) -> ToolResult:
    tail = capture.tail(max_lines=limits.lines)
    spool = capture.spool_path if tail.omitted else None
    parts = []
    if tail.omitted:
        parts.append(_omitted_note(tail.omitted, spool, capture.spool_error, capture.spool_cut))
    body = tail.text.rstrip("\n")
    parts.append(body if body else "(no output)")
    hints = []
    if timed_out:
        ok = False
        stopped = "its whole process group was killed" if not survivors else "but some of its processes survived"
        parts.append(f"\nThe command timed out after {timeout:g} s and was stopped ({stopped}).")
        hints.append(
            f"To give it longer, call shell again with a larger timeout (at most {MAX_TIMEOUT:g} s), "
            "or start it with background=true and follow it with action='wait'.",
        )
    else:
        ok = code == 0
        if not ok:
            parts.append(f"\nThe command failed: {_describe_exit(code)}.")
    if survivors:
        hints.append(
            f"Processes the command started are still running and could not be stopped: "
            f"pid {', '.join(map(str, survivors))}. Check them with ps, and stop them if they should not run.",
        )
    elif left_running:
        hints.append(
            "The command left processes running in the background; they were stopped when it ended. "
            "Start long-running processes (servers, watchers) with background=true.",
        )
    hints.extend(_sandbox_hints(launch, tail.text, not ok))
    data: dict[str, Any] = {
        "exit_code": code,
        "timed_out": timed_out,
        "duration": round(duration, 3),
        "output_bytes": capture.total,
        "sandbox": launch.mode,
    }
    if survivors:
        data["survivors"] = survivors
    result = _result(ok, "\n".join(parts), data=data, hints=hints)
    return attrs.evolve(result, full_output_path=str(spool)) if spool is not None else result


# -- in the editor's terminal --------------------------------------------------------
#
# With [acp] terminal = "editor", and an editor offering terminal/* driving the
# session, a foreground command runs in one of the editor's terminals, where the
# user watches it. It is the same command line as weald's own: bash -c COMMAND
# in the OS sandbox where it works here (bubblewrap; the editor runs on this
# machine), with the same environment (secrets out, the call's process mark in).
# The editor starts a small launcher (`_LAUNCHER`), which reads the command line,
# the environment and the sandbox's options from a file only this user can read,
# removes it, and becomes the command: nothing of the environment is on a command
# line, and nothing of the editor's own environment reaches the command.

# Seconds one terminal/create, output, kill or release may take the editor.
_EDITOR_STEP_TIMEOUT = 30.0
# How often the command's output is asked for while it runs.
_TERMINAL_POLL = 0.2
# What the editor keeps of the output (it drops the oldest past it); polled far more often than it fills.
_TERMINAL_OUTPUT_LIMIT = 1024 * 1024

_LAUNCHER = """\
import json, os, sys
path = sys.argv[1]
with open(path, encoding="utf-8") as f:
    spec = json.load(f)
os.unlink(path)
argv = spec["argv"]
if spec["options"] is not None:
    fd = os.memfd_create("weald-bwrap-options", 0)
    data = memoryview(b"".join(os.fsencode(option) + b"\\0" for option in spec["options"]))
    while data:
        data = data[os.write(fd, data):]
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    argv = [spec["bwrap"], "--args", str(fd), "--", *argv]
else:
    os.chdir(spec["cwd"])
os.execve(argv[0], argv, spec["env"])
"""


class _TerminalText:
    """What the editor has shown of a terminal's output so far, to take only what is new from each answer."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = ""

    async def take(self, answer: Any, capture: OutputCapture) -> dict[str, Any] | None:
        """Feed what ``answer`` (terminal/output's) adds to ``capture``; returns its exit status, if it has one."""
        if not isinstance(answer, dict) or not isinstance(answer.get("output"), str):
            raise EditorError("the editor answered terminal/output without the output (no 'output' string)")
        now: str = answer["output"]
        seen, self.seen = self.seen, now
        if now.startswith(seen):
            new = now[len(seen) :]
        else:  # the editor dropped the start (outputByteLimit): go on after what was seen last
            probe = seen[-512:]
            at = now.rfind(probe) if probe else -1
            new = now[at + len(probe) :] if at >= 0 else now
        if new:
            await capture.feed("stdout", new.encode("utf-8", "surrogateescape"))
        status = answer.get("exitStatus")
        return status if isinstance(status, dict) else None


async def _editor_launch(ctx: ToolContext, command: str, workdir: Path, mark: str) -> tuple[_Launch, dict[str, Any]]:
    """How the editor's terminal starts ``command``: a `_Launch` (mode, placeholders) and the launcher's spec.

    Raises:
        ToolError: ``sandbox = "required"`` and the sandbox does not work here.
    """
    env = _environment(ctx, workdir)
    env[MARK_VARIABLE] = mark
    mode = str(ctx.config.option("shell", "sandbox", "auto"))
    network = network_allowed(ctx.config.option("shell", "network", False), command)
    spec: dict[str, Any] = {"argv": _argv(command), "env": env, "cwd": str(workdir), "bwrap": None, "options": None}
    bwrap = await _sandbox_bwrap(mode)
    if bwrap is None:
        return _Launch(_argv(command), env, mode=_unsandboxed(mode), network=True, pass_fds=()), spec
    search_path = env.get("PATH", "")
    env["TMPDIR"] = "/tmp"  # noqa: S108 - the sandbox's own /tmp
    placeholders, links = Placeholders(), ProtectedLinks()
    try:
        spec["options"] = await trio.to_thread.run_sync(
            functools.partial(
                _sandbox_option_list,
                ctx,
                workdir,
                network,
                placeholders=placeholders,
                links=links,
                search_path=search_path,
            )
        )
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(placeholders.release)
            await trio.to_thread.run_sync(links.release)
        raise
    spec["bwrap"] = bwrap
    launch = _Launch(
        _argv(command),
        env,
        mode="bwrap",
        network=network,
        pass_fds=(),
        placeholders=placeholders,
        links=links,
        emit=ctx.emit,
    )
    return launch, spec


def _write_launch_file(spec: dict[str, Any]) -> str:
    """The launcher's spec in a new file only this user can read (0600, O_EXCL); returns its path (blocking)."""
    fd, path = tempfile.mkstemp(prefix="weald-launch-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return path


async def _run_in_editor(
    ctx: ToolContext, editor: EditorBridge, command: str, timeout: float, workdir: Path
) -> ToolResult:
    """Run ``command`` in a terminal of the editor; the result is the one weald's own run gives, plus the terminal."""
    limits = _Limits.of(ctx)
    grace = float(ctx.config.option("shell", "kill_grace", DEFAULT_KILL_GRACE))
    mark = new_process_mark()
    launch, spec = await _editor_launch(ctx, command, workdir, mark)
    capture = OutputCapture(
        tail_bytes=limits.bytes,
        spool_dir=_spool_dir(ctx),
        spool_prefix="shell-",
        emit=ctx.emit,
        spill=getattr(ctx.session, "spill", None),
    )
    text = _TerminalText()
    started = trio.current_time()
    terminal: str | None = None
    status: dict[str, Any] | None = None
    timed_out = False
    launch_file: str | None = None
    leftovers: tuple[list[int], list[int]] = ([], [])
    try:
        launch_file = await trio.to_thread.run_sync(_write_launch_file, spec)
        created = await editor.arequest(
            "terminal/create",
            {
                "command": sys.executable,
                "args": ["-I", "-S", "-c", _LAUNCHER, launch_file],
                "cwd": str(workdir),
                "outputByteLimit": _TERMINAL_OUTPUT_LIMIT,
            },
            timeout=_EDITOR_STEP_TIMEOUT,
            call_id=ctx.call_id,
        )
        terminal = created.get("terminalId") if isinstance(created, dict) else None
        if not isinstance(terminal, str) or not terminal:
            terminal = None
            raise EditorError("the editor answered terminal/create without a terminal id; nothing was run")
        launch.started()
        with trio.move_on_after(timeout) as deadline:
            status = await _follow_terminal(ctx, editor, terminal, text, capture, timeout=timeout)
        timed_out = deadline.cancelled_caught
    finally:
        with trio.CancelScope(shield=True):
            if terminal is not None:
                ended = await _end_terminal(ctx, editor, terminal, text, capture, running=status is None)
                status = status or ended
            leftovers = await trio.to_thread.run_sync(_stop_marked, mark, grace)
            await capture.aclose()
            await launch.ended()
            if launch_file is not None:
                await trio.to_thread.run_sync(_remove_quietly, launch_file)
    stopped, survivors = leftovers
    result = _foreground_result(
        capture,
        code=_terminal_exit_code(status),
        timed_out=timed_out,
        timeout=timeout,
        left_running=bool(stopped) and not timed_out,
        survivors=survivors,
        duration=trio.current_time() - started,
        limits=limits,
        launch=launch,
    )
    result = attrs.evolve(result, data={**result.data, "terminal": "editor", "terminal_id": terminal})
    return launch.with_restored(result)


async def _follow_terminal(
    ctx: ToolContext,
    editor: EditorBridge,
    terminal: str,
    text: _TerminalText,
    capture: OutputCapture,
    *,
    timeout: float,
) -> dict[str, Any]:
    """Stream the terminal's output into ``capture`` until the command exits; returns its exit status."""
    ids = {"terminalId": terminal}
    failure: list[EditorError] = []
    exited: dict[str, Any] = {}

    async def poll() -> None:
        while True:
            await text.take(
                await editor.arequest("terminal/output", ids, timeout=_EDITOR_STEP_TIMEOUT, call_id=ctx.call_id),
                capture,
            )
            await trio.sleep(_TERMINAL_POLL)

    async def wait() -> None:
        answer = await editor.arequest(
            "terminal/wait_for_exit", ids, timeout=timeout + _EDITOR_STEP_TIMEOUT, call_id=ctx.call_id
        )
        exited.update(answer if isinstance(answer, dict) else {})
        nursery.cancel_scope.cancel()

    async def guarded(step: Any) -> None:
        try:
            await step()
        except EditorError as exc:
            failure.append(exc)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(capture.run_emitter)
        nursery.start_soon(guarded, poll)
        nursery.start_soon(guarded, wait)
    if failure:
        raise failure[0]
    # What it printed last, between the last poll and its exit.
    await text.take(
        await editor.arequest("terminal/output", ids, timeout=_EDITOR_STEP_TIMEOUT, call_id=ctx.call_id), capture
    )
    return exited


async def _end_terminal(
    ctx: ToolContext,
    editor: EditorBridge,
    terminal: str,
    text: _TerminalText,
    capture: OutputCapture,
    *,
    running: bool,
) -> dict[str, Any] | None:
    """Kill the terminal's command if it still runs, take its last output, release it; best effort (shielded).

    Returns:
        Its exit status, when the editor had one.
    """
    ids = {"terminalId": terminal}
    status: dict[str, Any] | None = None
    with contextlib.suppress(EditorError):  # the editor is gone: its terminals went with it
        if running:
            await editor.arequest("terminal/kill", ids, timeout=_EDITOR_STEP_TIMEOUT, call_id=ctx.call_id)
            answer = await editor.arequest("terminal/output", ids, timeout=_EDITOR_STEP_TIMEOUT, call_id=ctx.call_id)
            status = await text.take(answer, capture)
        await editor.arequest("terminal/release", ids, timeout=_EDITOR_STEP_TIMEOUT, call_id=ctx.call_id)
    return status


def _terminal_exit_code(status: Mapping[str, Any] | None) -> int | None:
    """The exit code as weald reports one: the code, or minus the signal's number."""
    if not status:
        return None
    code = status.get("exitCode")
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    name = status.get("signal")
    if isinstance(name, str):
        with contextlib.suppress(KeyError):
            return -signal.Signals[name if name.startswith("SIG") else f"SIG{name}"].value
    return None


def _stop_marked(mark: str, grace: float) -> tuple[list[int], list[int]]:
    """Stop what the command left running (its processes carry ``mark``): SIGTERM, then SIGKILL (blocking).

    Returns:
        The processes found, and those still alive at the end.
    """
    found = marked_processes(mark) or []
    if not found:
        return [], []
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = found
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = marked_processes(mark) or []
    if not left:
        return found, []
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.05)
    return found, marked_processes(mark) or []


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# -- background -------------------------------------------------------------------


async def _start_job(ctx: ToolContext, command: str, cwd: str | None) -> ToolResult:
    jobs = _job_table(ctx)
    workdir = _workdir(ctx, cwd)
    with pinned_directory(ctx, workdir) as (pinned, fd):  # held until the job has started in it
        launch = await _launch(ctx, command, workdir, fd)
        try:
            info = await jobs.start(
                launch.argv,
                command=command,
                cwd=workdir,
                env=launch.env,
                pass_fds=launch.pass_fds,
                run_in=pinned,
                sandboxed=launch.sandboxed,
                on_end=launch.ended,
            )
        finally:
            launch.started()
    return ToolResult.success(
        f"Started {info.id} (pid {info.pid}) in the background: {command}\n"
        f"Use action='wait' with job_id='{info.id}' to read its output and see whether it ended, "
        "'input' to write to its stdin, 'kill' to stop it.",
        data={"job_id": info.id, "pid": info.pid, "sandbox": launch.mode},
    )


def _job_state(info: JobInfo) -> str:
    if info.running:
        return f"{info.id} is still running (pid {info.pid}, for {info.duration:.1f} s)."
    if info.status == "failed":
        return f"{info.id} failed: {info.error}."
    verb = "was killed" if info.status == "killed" else "ended"
    return f"{info.id} {verb} after {info.duration:.1f} s: {_describe_exit(info.exit_code)}."


def _job_result(
    output: JobOutput,
    *,
    before: str | None = None,
    waited: float | None = None,
    ok_if_failed: bool = False,
) -> ToolResult:
    info = output.job
    parts = [before] if before else []
    parts.append(_job_state(info))
    if output.omitted:
        parts.append(_omitted_note(output.omitted, info.output_path, cut=info.output_cut))
    text = output.text.rstrip("\n")
    parts.append(text if text else "(no new output)")
    hints = []
    if info.running and waited is not None:
        hints.append(
            f"It did not end within {waited:g} s. Wait again, send it input (action='input') "
            "or stop it (action='kill').",
        )
    failed = info.status == "failed" or (info.status == "exited" and info.exit_code != 0)
    data = {
        "job_id": info.id,
        "status": info.status,
        "exit_code": info.exit_code,
        "pid": info.pid,
        "output_path": info.output_path,
    }
    return _result(ok_if_failed or not failed, "\n".join(parts), data=data, hints=hints)


def _list_jobs(jobs: JobTable) -> ToolResult:
    infos = jobs.snapshot()
    if not infos:
        return ToolResult.success("No background jobs. Start one with background=true.", data={"jobs": []})
    lines = []
    for info in infos:
        if info.running:
            state = f"running (pid {info.pid})"
        elif info.status == "failed":
            state = "failed to start"
        else:
            state = f"{info.status} ({_describe_exit(info.exit_code)})"
        unread = f", {info.unread_bytes:,} bytes unread" if info.unread_bytes else ""
        lines.append(f"{info.id}: {state}, {info.duration:.1f} s{unread}: {info.command}")
    data = {"jobs": [{"job_id": i.id, "status": i.status, "pid": i.pid, "exit_code": i.exit_code} for i in infos]}
    return ToolResult.success("\n".join(lines), data=data)
