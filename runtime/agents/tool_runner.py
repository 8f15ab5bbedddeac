"""The tool runner: one per agent session; every tool call a short-lived, supervised child actor.

::

    /sessions/<id>/tool_runner                  ToolRunner
    /sessions/<id>/tool_runner/calls            DynamicSupervisor (owned by the runner)
    /sessions/<id>/tool_runner/calls/<call_id>  ToolExecution (temporary), one per call

An agent sends `RunTools` with the calls of one model response and a frozen
snapshot of its state; the runner checks each call's permission, starts each
allowed call in its own `ToolExecution` child (which receives the snapshot in
its `ToolContext`), runs them concurrently, and sends one `ToolResults` back
with the results in call order. Nothing here blocks the runner's mailbox: a
call runs in its execution actor's own task, its start and end are followed
by callbacks on futures, permission prompts wait in I/O tasks, and all of
them report back as messages, so `abort` is handled at once.

A call never raises into the runner: a bad call, a denied permission, a
timeout, an abort, a tool that raises (even a BaseException) or a crashed
execution actor all become error results telling the model what happened.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import itertools
import logging
import math
import re
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

import attrs
import trio
from outcome import Outcome
from pykka.messages import ProxyCall, _ActorStop
from weald.runtime import Actor, ActorDeadError, Exit, Future, Ref, StoreError, redact
from weald.runtime._actor import NORMAL, _envelope
from weald.supervisors import ChildSpec, DynamicSupervisor
from weald.tools import (
    AbortSignal,
    JobTable,
    Permission,
    PermissionScope,
    ReadLedger,
    SessionServices,
    SpillBudget,
    SpillLedger,
    SpillLimits,
    SpillRow,
    Tool,
    ToolConfig,
    ToolContext,
    ToolRegistry,
    ToolResult,
    default_registry,
    invoke,
    limit_output,
    within_limits,
)

__all__ = [
    "CallOutcome",
    "PermissionRequest",
    "RunTools",
    "RunnerConfig",
    "RunnerSnapshot",
    "ToolCallRequest",
    "ToolExecution",
    "ToolResults",
    "ToolRunner",
    "decide_permission",
]

logger = logging.getLogger("weald.runtime")

PermissionRule = Permission | Mapping[str, Permission]
Decision = Literal["allow", "deny", "allow_always"]
_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
_NO_SCOPE = PermissionScope()


@attrs.frozen
class RunnerConfig:
    """How a session's tool runner treats calls (from ``weald.toml`` ``[tools]``).

    Attributes:
        timeouts: seconds per tool name, overriding each tool's default; the
            limit reaches the tool as ``ToolContext.timeout``.
        permissions: per tool name, a permission, or (for tools with a
            subject, like shell) a mapping of glob patterns on the subject to
            permissions. Deny beats ask beats allow.
        permission_timeout: seconds to wait for an answer to ``ask``; no
            answer counts as deny.
        tool_config: what tools may read (output limits, per-tool options).
        grace: extra seconds the runner allows a tool that enforces its own
            time limit (shell, fetch: tools with a ``max_timeout``) before it
            cancels it from outside, so the tool can stop its subprocesses
            and report its own timeout first.
        spill: the bounds on output saved to spill files (``[spill]``).
    """

    timeouts: Mapping[str, float] = attrs.field(factory=dict)
    permissions: Mapping[str, PermissionRule] = attrs.field(factory=dict)
    permission_timeout: float = 300.0
    tool_config: ToolConfig = attrs.field(factory=ToolConfig)
    grace: float = 5.0
    spill: SpillLimits = attrs.field(factory=SpillLimits)


@attrs.frozen
class ToolCallRequest:
    """One tool call from a model response.

    Attributes:
        id: the model's call id.
        name: the tool called.
        arguments: the parsed arguments, or None when they could not be parsed.
        error: why the arguments could not be parsed (then the call fails at once).
    """

    id: str
    name: str
    arguments: Mapping[str, Any] | None
    error: str | None = None


@attrs.frozen
class RunTools:
    """Message to the runner: run these calls, send `ToolResults` to ``reply_to``.

    Attributes:
        batch_id: names this batch in the reply and in `ToolRunner.abort`.
        calls: the calls, in the model's order.
        snapshot: the agent's frozen state, handed to every call.
        reply_to: the agent to send `ToolResults` to.
        agent_id: the calling agent's id.
        agent_path: its path (events and permission prompts name it).
        depth: 0 for the top-level agent, 1 for a sub-agent...
        tool_filter: which tools this agent may call (patterns; None = all).
        config: the permissions, timeouts and tool options these calls run
            under (the session's configuration as of the agent's turn); None:
            the runner's own.
        max_output_bytes: the most bytes of output each call's result may
            bring to the model, when less than ``[tools] max_output_bytes``:
            what the agent's context can hold now (derived from its model's
            window). Tools see it as ``ToolContext.config.max_output_bytes``
            (read_file pages by it), and longer results are cut to it.
    """

    batch_id: str
    calls: tuple[ToolCallRequest, ...]
    snapshot: Any
    reply_to: Ref[Any] | None
    agent_id: str = ""
    agent_path: str = ""
    depth: int = 0
    tool_filter: tuple[str, ...] | None = None
    config: RunnerConfig | None = None
    max_output_bytes: int | None = None


@attrs.frozen
class CallOutcome:
    """The result of one call, as the agent receives it."""

    call_id: str
    name: str
    result: ToolResult
    duration: float


@attrs.frozen
class ToolResults:
    """Message from the runner: every call of a batch ended, results in call order."""

    batch_id: str
    outcomes: tuple[CallOutcome, ...]
    aborted: bool = False


@attrs.frozen
class PermissionRequest:
    """A call waiting for whoever drives the agent to allow or deny it.

    Published as the ``permission.requested`` event; answered with
    `ToolRunner.respond_permission`. ``reason`` says why it is asked (the
    tool's default, a pattern, or what in a shell command could not be checked).
    """

    request_id: str
    session_id: str
    agent_path: str
    call_id: str
    tool: str
    subject: str | None
    arguments: Mapping[str, Any]
    timeout: float
    reason: str = ""


@attrs.frozen
class RunnerSnapshot:
    """The runner's state for introspection."""

    path: str
    session_id: str
    status: str
    running_calls: tuple[str, ...]
    pending_permissions: tuple[str, ...]
    calls_started: int
    calls_finished: int
    allowed_always: tuple[str, ...]


def decide_permission(
    tool: Tool,
    arguments: Mapping[str, Any],
    rules: Mapping[str, PermissionRule],
    allowed_always: frozenset[tuple[str, str | None]] = frozenset(),
    *,
    scope: PermissionScope = _NO_SCOPE,
) -> tuple[Permission, str]:
    """Decide allow, ask or deny for one call, and say why.

    A rule for the tool is either a permission or, for tools with a
    subject (the shell command), a mapping of glob patterns to permissions:
    among the patterns that match the subject, the strictest wins (deny
    beats ask beats allow). No rule, or no matching pattern, falls back to
    the tool's default. A tool with its own `Tool.match_patterns` (shell:
    every simple command of the command line must be allowed) decides
    under its patterns itself, with ``scope`` telling it where the call runs.
    """
    subject = tool.subject(arguments) if tool.subject is not None else None
    if (tool.name, subject) in allowed_always or (tool.name, None) in allowed_always:
        return "allow", "allowed for this session"
    rule = rules.get(tool.name)
    if rule is None:
        return tool.permission, f"default for {tool.name}"
    if isinstance(rule, str):
        return rule, f"tools.permissions.{tool.name} = {rule}"
    if tool.match_patterns is not None:
        return tool.match_patterns(arguments, rule, tool.permission, scope)
    matched: list[tuple[Permission, str]] = [
        (perm, pattern)
        for pattern, perm in rule.items()
        if subject is not None and fnmatch.fnmatchcase(subject, pattern)
    ]
    if not matched:
        return tool.permission, f"default for {tool.name} (no pattern matched)"
    perm, pattern = max(matched, key=lambda m: _STRICTNESS[m[0]])
    return perm, f'tools.permissions.{tool.name} "{pattern}" = {perm}'


# -- messages the runner sends itself ------------------------------------------------------


class _CallDone:
    """A call's result, kept for the runner until it takes its finished calls (`_CALLS_DONE`)."""

    __slots__ = ("batch_id", "index", "result")

    def __init__(self, batch_id: str, index: int, result: ToolResult) -> None:
        self.batch_id = batch_id
        self.index = index
        self.result = result


# Told to the runner when its first finished call is kept: take them all.
_CALLS_DONE = object()


@attrs.frozen
class _PermissionTimeout:
    request_id: str


@attrs.frozen
class _Decided:
    """A permission decided in a worker thread (`ToolRunner._decide_in_thread`)."""

    batch_id: str
    index: int
    decision: Outcome[tuple[Permission, str]]


class _Pending:
    """A call in a batch: where it is, and how to stop it."""

    __slots__ = ("abort", "call", "execution", "index", "request_id", "started", "tool")

    def __init__(self, index: int, call: ToolCallRequest, tool: Tool | None) -> None:
        self.index = index
        self.call = call
        self.tool = tool
        self.abort = AbortSignal()
        self.execution: Ref[Any] | None = None
        self.request_id: str | None = None
        self.started = time.monotonic()


class _Batch:
    __slots__ = ("config", "dispatching", "msg", "pending", "results", "tool_config")

    def __init__(self, msg: RunTools, config: RunnerConfig) -> None:
        self.msg = msg
        self.config = config  # what its calls run under (the turn's, or the runner's own)
        # What its tools see: the config's, with the agent's output limit when that is lower.
        limit, tools = msg.max_output_bytes, config.tool_config
        lower = limit is not None and limit < tools.max_output_bytes
        self.tool_config = _with_output_limit(tools, limit) if lower and limit is not None else tools
        self.results: list[CallOutcome | None] = [None] * len(msg.calls)
        self.pending: dict[int, _Pending] = {}
        # Invariant: no reply while the batch's calls are still being dispatched,
        # even if every call dispatched so far has already completed.
        self.dispatching = True


# A call ready to start: its child spec, and what to do with the supervisor's answer.
_Launch = tuple[ChildSpec, Callable[["Ref[Any] | BaseException"], None]]


def _with_output_limit(config: ToolConfig, max_output_bytes: int) -> ToolConfig:
    """``config`` with a smaller output limit (at least 1 byte)."""
    return attrs.evolve(config, max_output_bytes=max(1, max_output_bytes))


class _OutputLimit:
    """Cuts one call's result to the model's limits, saving the whole to a spill file.

    Saving writes a file: the execution calls it in a worker thread, and
    only when `needed` says the result is too long.
    """

    __slots__ = ("call_id", "config", "keep", "save_dir", "spill")

    def __init__(
        self, keep: Literal["head", "tail"], config: ToolConfig, *, save_dir: Path, call_id: str, spill: SpillBudget
    ) -> None:
        self.keep = keep
        self.config = config
        self.save_dir = save_dir
        self.call_id = call_id
        self.spill = spill

    def needed(self, result: ToolResult) -> bool:
        """Whether ``result`` is too long for the model (cheap; writes nothing)."""
        return not within_limits(result, max_lines=self.config.max_output_lines, max_bytes=self.config.max_output_bytes)

    def __call__(self, result: ToolResult) -> ToolResult:
        return limit_output(
            result,
            keep=self.keep,
            max_lines=self.config.max_output_lines,
            max_bytes=self.config.max_output_bytes,
            save_dir=self.save_dir,
            call_id=self.call_id,
            spill=self.spill,
        )


# -- the execution child -------------------------------------------------------------------


class ToolExecution(Actor):
    """Runs one tool call; a temporary child of the runner's ``calls`` supervisor.

    The call runs in the actor's own task once it has started (the
    supervisor's start completes at once), and the actor ends as soon as it
    is done, without a message or another round of the loop. The outcome completes
    ``result``. Killing the actor cancels the call (async tools are
    cancelled where they wait; thread tools see ``ctx.abort``).

    ``deadline`` is how many seconds the call gets before the execution
    cancels it; a timeout reported from here names the call's limit,
    ``ctx.timeout``, which is what the model and the config know.

    ``on_end(exit, result)`` is called once the execution has ended (its
    supervisor told, its path free), on the loop thread: ``result`` is the
    call's outcome, or None if it ended without one (killed, stopped,
    crashed). It must not raise. It replaces a future per call and a
    continuation on ``exited()``.

    ``limit`` cuts an outcome too long for the model, saving it whole to a
    spill file, in a worker thread (never on the loop); None leaves it as it is.
    """

    def __init__(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        ctx: ToolContext,
        deadline: float,
        on_end: Callable[[Exit, ToolResult | None], None],
        *,
        limit: _OutputLimit | None = None,
    ) -> None:
        super().__init__()
        self._tool = tool
        self._arguments = arguments
        self._ctx = ctx
        self._deadline = deadline
        self._on_end = on_end
        self._value: ToolResult | None = None
        self._limit = limit

    def _finish(self, exit_: Exit) -> None:
        if self._exit is not None:
            return
        super()._finish(exit_)
        self._on_end(exit_, self._value)

    async def _loop_serve(self) -> Exit:
        """Run the call, then end normally: neither the call nor the end is a message.

        The supervisor's start has completed by now (``on_start`` is done),
        so the call runs in the actor's own task, next, and the actor ends as
        soon as it is done. What is sent to it meanwhile is answered as at
        any actor's end (a stop with False). Under fault injection, which
        decides the fate of every message, the call and the stop go through
        the inbox as messages instead.
        """
        if self._system._faults is not None:
            inbox = self.actor_inbox
            inbox.put(_envelope(_RUN_CALL))
            inbox.put(_envelope(_ActorStop()))
            return await super()._loop_serve()
        try:
            await self._call()
        except Exception as exc:  # as a handler's error: the execution crashed
            return Exit("crashed", exc)
        return NORMAL

    async def on_receive(self, message: Any) -> None:
        """Run the call (the queued `_RUN_CALL`, under fault injection); anything else sent here is ignored."""
        if message is _RUN_CALL:
            await self._call()

    async def _call(self) -> None:
        tool = self._tool
        # The deadline is set on the actor's own cancel scope (the one a kill
        # cancels) rather than on a scope of its own: one deadline
        # registration instead of a scope entered and left per call. A
        # Cancelled is the deadline's only if the deadline has passed.
        scope = self._scope
        assert scope is not None
        deadline = scope.deadline = trio.current_time() + self._deadline
        try:
            value = await invoke(tool, self._ctx, self._arguments)
        except trio.Cancelled:
            if trio.current_time() < deadline:
                self._ctx.abort.set("stopped")  # killed: a thread tool still running sees it
                raise
            # The deadline's: the scope stays cancelled, so nothing below may wait.
            self._value = self._timeout_result()
            return
        except BaseException as exc:  # a tool's BaseException is still only an error result
            value = ToolResult.error(
                f"{tool.name} crashed with {type(exc).__name__}: {exc}. "
                "The tool is fine to call again; change the arguments or try another approach."
            )
        limit = self._limit
        if limit is not None and limit.needed(value):
            scope.deadline = math.inf  # saving it is not part of the call's time
            # Shielded only if the tool returned although its deadline passed
            # (it kept the Cancelled to itself): the scope stays cancelled then,
            # and the save is bounded by the spill limits.
            with trio.CancelScope(shield=scope.cancel_called):
                value = await trio.to_thread.run_sync(limit, value)
        self._value = value

    def _timeout_result(self) -> ToolResult:
        tool = self._tool
        self._ctx.abort.set("timed out")
        limit = self._ctx.timeout if self._ctx.timeout is not None else self._deadline
        return ToolResult.error(
            f"{tool.name} timed out after {limit:g} s and was stopped"
            + (f"; ask for more with the timeout argument (up to {tool.max_timeout:g} s)" if tool.max_timeout else "")
            + "."
        )


# The call, as the execution's first message.
_RUN_CALL = object()


# -- the runner ------------------------------------------------------------------------------


class ToolRunner(Actor):
    """Runs an agent session's tool calls, each in its own supervised child actor.

    Args:
        session_id: the session this runner belongs to.
        working_dir: the project directory; file tools are sandboxed to it.
        allowed_dirs: further directories file tools may touch.
        registry: where tools are looked up (built-ins and MCP tools).
        config: timeouts, permissions, output limits.
        output_dir: where full outputs and job spools go (default: a
            ``weald-outputs`` folder in the system's store directory).
        runtime: handles for tools that talk to the runtime (``ctx.session.runtime``).
        editor: session id -> the editor driving it through ACP (``ctx.session.editor``), or None.
    """

    def __init__(
        self,
        session_id: str,
        working_dir: str | Path,
        *,
        allowed_dirs: Sequence[str | Path] = (),
        registry: ToolRegistry | None = None,
        config: RunnerConfig | None = None,
        output_dir: str | Path | None = None,
        runtime: Any = None,
        editor: Callable[[str], Any] | None = None,
    ) -> None:
        super().__init__()
        self._session_id = session_id
        self._working_dir = _resolved(working_dir)
        config = config or RunnerConfig()
        # Commands in the OS sandbox never see the store (histories, tasks, tokens).
        self._config = self._with_store_private(config)
        self._last_given: tuple[RunnerConfig, RunnerConfig] = (config, self._config)  # (as sent, as used)
        self._registry = registry if registry is not None else default_registry
        out = Path(output_dir) if output_dir else self.system.store_path.parent / "weald-outputs" / session_id
        self._output_dir = out
        self._spill = SpillBudget(out, self._config.spill, ledger=self._spill_ledger(session_id))
        # Saved full outputs must stay readable by read_file: they are in the sandbox.
        self._allowed_dirs = (*(_resolved(d) for d in allowed_dirs), _resolved(out))
        self._permission_scope = PermissionScope(self._working_dir, self._allowed_dirs)
        self._runtime = runtime
        self._editor = editor
        self._batches: dict[str, _Batch] = {}
        self._permissions: dict[str, tuple[str, int]] = {}  # request_id -> (batch_id, index)
        self._allowed_always: set[tuple[str, str | None]] = set()
        self._calls: Ref[Any] | None = None
        self._services: SessionServices | None = None
        self._ids = itertools.count(1)
        self._started_calls = 0
        self._finished_calls = 0
        # Calls that ended, kept by their continuations (on the loop thread)
        # until the runner takes them: one message for the calls that end
        # together rather than one each. Invariant: while it is not empty,
        # `_CALLS_DONE` is in the runner's inbox or being handled.
        self._done: deque[_CallDone] = deque()
        self._done_told = False

    # -- lifecycle -----------------------------------------------------------------

    def on_start(self) -> None:
        """Make the session services (on the runner's task); ``calls`` starts with the first call."""
        jobs = JobTable(self._spawn_job, output_dir=self._output_dir / "jobs", spill=self._spill)
        self._services = SessionServices(
            output_dir=self._output_dir,
            ledger=ReadLedger(),
            jobs=jobs,
            runtime=self._runtime,
            spill=self._spill,
            editor=self._editor,
        )

    def on_stop(self) -> Any:
        """Abort what runs, kill background jobs, stop the calls supervisor (awaited on the runner's task)."""
        return self._shutdown()

    async def _shutdown(self) -> None:
        self._abort_all("the session stopped")
        if self._services is not None and self._services.jobs is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self._services.jobs.aclose()
        if self._calls is not None and self._calls.is_alive():
            self._calls.stop(block=False)
            with trio.move_on_after(5):
                await self._calls.exited()
        # The sandbox's /tmp of this session (shell): nothing runs in it any more.
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await trio.to_thread.run_sync(shutil.rmtree, self._output_dir / "tmp", True)

    def on_failure(self, *_: object) -> None:
        """After a crash, kill background jobs at once (no grace)."""
        if self._services is not None and self._services.jobs is not None:
            self._services.jobs.close_nowait()

    def _spill_ledger(self, session_id: str) -> SpillLedger | None:
        """The session's spill bookkeeping in the store, for a store this process joined as a node (a daemon's).

        A runner outside a daemon (no node) counts its directory instead.
        """
        system = self.system
        try:
            node = system.store.node
        except StoreError:
            return None
        if node is None:
            return None
        return SpillLedger(lambda: system.store, session_id, node.node_id, record=self._record_spill)

    def _record_spill(self, row: SpillRow) -> None:
        # From the worker thread that spilled: the row is enqueued on the loop, where the turn's own writes
        # gather, so it rides in their group commit instead of waking the committer for a commit of its own.
        try:
            self.system.loop.call_soon(self._enqueue_spill, row)
        except RuntimeError:  # the loop has ended (the daemon stops): queued from here
            self._enqueue_spill(row)

    def _enqueue_spill(self, row: SpillRow) -> None:
        # On the loop (must not raise), or on the spilling thread once the loop has ended.
        ledger = self._spill.ledger
        if ledger is None:
            return
        try:
            ledger.enqueue(row)
        except StoreError as exc:
            logger.warning("the spill bookkeeping of session %s could not be queued: %s", row.session, exc)

    def _with_store_private(self, config: RunnerConfig) -> RunnerConfig:
        """``config`` with the store's directory among the paths no sandboxed command may see."""
        tool_config = config.tool_config
        store_dir = str(self.system.store_path.parent)
        if store_dir in tool_config.private_paths:
            return config
        private = (*tool_config.private_paths, store_dir)
        return attrs.evolve(config, tool_config=attrs.evolve(tool_config, private_paths=private))

    def _config_for(self, msg: RunTools) -> RunnerConfig:
        """What a batch runs under: the configuration it was sent with (the last one is kept made), or the runner's."""
        given = msg.config
        if given is None:
            return self._config
        if given is not self._last_given[0]:
            self._last_given = (given, self._with_store_private(given))
        return self._last_given[1]

    def _spawn_job(self, async_fn: Callable[..., Any], *args: Any) -> Any:
        # Background jobs live as long as the runner, not the call that started them.
        return self.run_io(async_fn, *args, name="background job")

    # -- public API (through the proxy) --------------------------------------------------

    @property
    def services(self) -> SessionServices:
        """The session services handed to every call (read ledger, jobs, runtime)."""
        assert self._services is not None
        return self._services

    def tool_specs(self, tool_filter: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Definitions of the tools an agent with ``tool_filter`` may call, for the model."""
        return [t.spec() for t in self._registry.select(tool_filter)]

    def respond_permission(self, request_id: str, decision: Decision, message: str | None = None) -> bool:
        """Answer a permission request; returns False if it is unknown or already answered.

        ``allow_always`` allows this call and every later call of the same
        tool with the same subject in this session. ``message`` (with
        ``deny``) tells the model why, when it was not the user who said no.
        """
        where = self._permissions.pop(request_id, None)
        if where is None:
            return False
        batch_id, index = where
        batch = self._batches.get(batch_id)
        if batch is None:
            return False
        pending = batch.pending[index]
        tool = pending.tool
        assert tool is not None
        self.system.events.publish(
            "permission.answered", self.path, {"request_id": request_id, "decision": decision, "tool": tool.name}
        )
        if decision == "deny":
            why = f"was not given: {message}" if message else "was denied by the user"
            self._complete(
                batch,
                index,
                ToolResult.error(
                    f"permission to run {tool.name} {why}. Do not retry the same call; "
                    "ask the user or take another approach."
                ),
            )
            return True
        if decision == "allow_always":
            subject = tool.subject(pending.call.arguments or {}) if tool.subject else None
            self._allowed_always.add((tool.name, subject))
        self._launch([self._prepare(batch, pending)])
        return True

    def abort(self, batch_id: str | None = None) -> int:
        """Stop the calls of one batch (or all); unfinished calls end as ``[aborted]``.

        Returns:
            How many calls were stopped.
        """
        if batch_id is None:
            return self._abort_all("aborted")
        batch = self._batches.get(batch_id)
        return 0 if batch is None else self._abort_batch(batch, "aborted")

    def idle(self) -> bool:
        """True when nothing runs or waits here: no call, no permission prompt, no background job.

        A job that ended still counts while it is listed: its output is read
        through this runner, so its session must not hibernate.
        """
        jobs = self._services.jobs if self._services is not None else None
        return not self._batches and not self._permissions and (jobs is None or not jobs.snapshot())

    def snapshot(self) -> RunnerSnapshot:
        """A frozen view of running calls and pending permission prompts."""
        running = tuple(
            p.call.id for b in self._batches.values() for p in b.pending.values() if p.execution is not None
        )
        return RunnerSnapshot(
            path=self.path,
            session_id=self._session_id,
            status=self._status,
            running_calls=running,
            pending_permissions=tuple(self._permissions),
            calls_started=self._started_calls,
            calls_finished=self._finished_calls,
            allowed_always=tuple(sorted(f"{t}:{s or '*'}" for t, s in self._allowed_always)),
        )

    # -- messages ----------------------------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        """Handle `RunTools`, and the runner's own completion and timeout messages."""
        if message is _CALLS_DONE:
            self._take_done()
        elif isinstance(message, RunTools):
            self._run(message)
        elif isinstance(message, _PermissionTimeout):
            self._permission_timed_out(message.request_id)
        elif isinstance(message, _Decided):
            self._decided(message)

    def _run(self, msg: RunTools) -> None:
        batch = _Batch(msg, self._config_for(msg))
        self._batches[msg.batch_id] = batch
        allowed = {t.name: t for t in self._registry.select(msg.tool_filter)}
        launches: list[_Launch] = []
        for index, call in enumerate(msg.calls):
            tool = allowed.get(call.name)
            pending = _Pending(index, call, tool)
            batch.pending[index] = pending
            # The bus redacts every payload (nested mappings included) before
            # anything can see it; redacting the arguments here too did it twice.
            # Arguments are not the runner's to hand over (`EventBus.emit`): a
            # call with some is published, built now.
            self._publish(
                "tool.started", batch, call, {"arguments": dict(call.arguments or {})}, built=bool(call.arguments)
            )
            problem = self._refuse(call, tool, allowed)
            if problem is not None:
                self._complete(batch, index, problem)
                continue
            assert tool is not None
            arguments = call.arguments or {}
            if self._decides_in_thread(batch.config, tool):
                self._decide_in_thread(batch, pending, arguments)
                continue
            perm, why = decide_permission(
                tool,
                arguments,
                batch.config.permissions,
                frozenset(self._allowed_always) if self._allowed_always else _NONE_ALLOWED,
                scope=self._permission_scope,
            )
            launch = self._act_on(batch, pending, perm, why)
            if launch is not None:
                launches.append(launch)
        if launches:
            self._launch(launches)
        batch.dispatching = False
        if not batch.pending:
            self._reply(batch)

    def _act_on(self, batch: _Batch, pending: _Pending, perm: Permission, why: str) -> _Launch | None:
        """Refuse, ask about, or prepare (returned, to launch) a call under its permission."""
        tool = pending.tool
        assert tool is not None
        if perm == "deny":
            self._complete(
                batch,
                pending.index,
                ToolResult.error(
                    f"{tool.name} is not allowed here ({why}). Do not retry this call; take another approach."
                ),
            )
            return None
        if perm == "ask":
            self._ask_permission(batch, pending, why)
            return None
        return self._prepare(batch, pending)

    def _decides_in_thread(self, config: RunnerConfig, tool: Tool) -> bool:
        """Whether this call's permission is decided off the loop: a pattern table read by the tool itself.

        Reading a shell command line (bash's grammar, then each pattern on
        each simple command) is bounded and linear, but a 48 KB command
        still takes milliseconds of CPU: never on the loop thread, where
        every actor of the daemon (``daemon.status`` included) waits for it.
        """
        rule = config.permissions.get(tool.name)
        return tool.match_patterns is not None and rule is not None and not isinstance(rule, str)

    def _decide_in_thread(self, batch: _Batch, pending: _Pending, arguments: Mapping[str, Any]) -> None:
        """Decide in a worker thread, off the loop: parsing a command line takes up to milliseconds.

        The call stays pending meanwhile (an abort ends it as any other);
        `_Decided` brings the decision back.
        """
        tool = pending.tool
        assert tool is not None
        rules = batch.config.permissions
        allowed = frozenset(self._allowed_always) if self._allowed_always else _NONE_ALLOWED
        scope = self._permission_scope
        batch_id, index = batch.msg.batch_id, pending.index

        def decide() -> tuple[Permission, str]:
            return decide_permission(tool, arguments, rules, allowed, scope=scope)

        self.run_io(
            functools.partial(trio.to_thread.run_sync, decide, abandon_on_cancel=True),
            reply=lambda decided: _Decided(batch_id, index, decided),
            name=f"permission check {pending.call.id}",
        )

    def _decided(self, message: _Decided) -> None:
        batch = self._batches.get(message.batch_id)
        pending = batch.pending.get(message.index) if batch is not None else None
        if batch is None or pending is None or pending.execution is not None or pending.request_id is not None:
            return  # aborted meanwhile
        try:
            perm, why = message.decision.unwrap()
        except Exception as exc:  # decide_permission does not raise; if it ever does, a person decides
            perm, why = "ask", f"the permission check failed ({type(exc).__name__}: {exc})"
        launch = self._act_on(batch, pending, perm, why)
        if launch is not None:
            self._launch([launch])

    def _refuse(self, call: ToolCallRequest, tool: Tool | None, allowed: Mapping[str, Tool]) -> ToolResult | None:
        if call.error is not None or call.arguments is None:
            return ToolResult.error(
                call.error or f"the arguments for {call.name} were not a JSON object; call it again with valid JSON."
            )
        if tool is None:
            names = ", ".join(sorted(allowed)) or "none"
            return ToolResult.error(f"there is no tool named {call.name!r} available here. Available tools: {names}.")
        return None

    def _limits_for(self, config: RunnerConfig, tool: Tool, arguments: Mapping[str, Any]) -> tuple[float, float]:
        """The call's time limit, and the runner's own deadline for it, in seconds.

        The limit is the call's ``timeout`` argument (for a tool that takes
        one, up to its ``max_timeout``), else ``[tools.timeouts]``, else the
        tool's default; it reaches the tool as ``ctx.timeout``. A tool with a
        ``max_timeout`` enforces the limit itself (shell stops its process
        group and reports the timeout), so the runner's deadline is ``grace``
        seconds later, for the case where the tool does not stop in time.
        """
        limit = float(config.timeouts.get(tool.name, tool.timeout))
        if tool.max_timeout is None:
            return limit, limit
        asked = arguments.get("timeout")
        if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
            limit = min(float(asked), tool.max_timeout)
        return limit, limit + config.grace

    def _prepare(self, batch: _Batch, pending: _Pending) -> _Launch:
        """The call's child spec, and what to do once the supervisor has (or has not) started it."""
        tool = pending.tool
        assert tool is not None
        call = pending.call
        msg = batch.msg
        runner_path = self.path

        def emit(kind: str, data: Mapping[str, Any]) -> None:
            self.system.events.publish(
                f"tool.{kind}",
                runner_path,
                {"call_id": call.id, "tool": tool.name, "agent": msg.agent_path, **data},
            )

        config = batch.config
        limit, deadline = self._limits_for(config, tool, call.arguments or {})
        ctx = ToolContext(
            working_dir=self._working_dir,
            allowed_dirs=self._allowed_dirs,
            session_id=self._session_id,
            agent_id=msg.agent_id,
            call_id=call.id,
            depth=msg.depth,
            config=batch.tool_config,
            snapshot=msg.snapshot,
            abort=pending.abort,
            emit=emit,
            session=self._services,
            tool_name=tool.name,
            timeout=limit,
        )
        self._started_calls += 1
        pending.started = time.monotonic()
        child_id = f"{call.id}-{next(self._ids)}"
        batch_id, index = msg.batch_id, pending.index
        runner = self.actor_ref

        # The call's life is followed with continuations (on the supervisor's
        # reply to start_children, then the child's own end), not with an I/O
        # task awaiting them: a task per call cost a spawn, a cancel scope and
        # two more wake-ups of the loop. The continuations run on the loop
        # thread, in the supervisor's and the child's tasks, and only record
        # the child and keep its end for the runner (`_CallDone`, `_take_done`).
        def report(value: ToolResult | BaseException) -> None:
            if isinstance(value, BaseException):
                value = ToolResult.error(
                    "[aborted]" if pending.abort.is_set() else f"the {tool.name} call could not run: {value}"
                )
            if self._exit is None:  # a runner that ended takes no more messages
                self._done.append(_CallDone(batch_id, index, value))
                if not self._done_told:
                    self._done_told = True
                    with contextlib.suppress(ActorDeadError):
                        runner.tell(_CALLS_DONE)

        def ended(exit_: Exit, value: ToolResult | None) -> None:
            if value is None:  # killed or stopped mid-call (an abort by the runner has answered the call already)
                value = ToolResult.error(
                    f"the {tool.name} call ended without a result ({exit_.describe()}). "
                    "It is fine to call the tool again."
                )
            report(value)

        spec = ChildSpec(
            _child_name(child_id),
            ToolExecution,
            args=(tool, call.arguments or {}, ctx, deadline, ended),
            kwargs={
                "limit": _OutputLimit(
                    tool.truncate,
                    batch.tool_config,
                    save_dir=self._output_dir,
                    call_id=f"{call.id}-{pending.index}",
                    spill=self._spill,
                )
            },
            restart="temporary",
            shutdown=1.0,
            progress=False,  # tool.started / tool.finished report each call
        )

        def started(outcome: Ref[Any] | BaseException) -> None:
            if isinstance(outcome, BaseException):  # it could not start: the supervisor's error
                report(outcome)
                return
            pending.execution = outcome
            if pending.abort.is_set():
                # Aborted before the supervisor's answer came (the abort found
                # no execution to kill): the call is answered; end it now.
                outcome.kill()

        return spec, started

    def _launch(self, launches: list[_Launch]) -> None:
        """Start calls as children of the ``calls`` supervisor, all in one request."""
        calls = self._calls
        if calls is None:
            # Started on first use: an idle session's runner has no calls supervisor.
            calls = self._calls = self.spawn_child(DynamicSupervisor, kwargs={"max_restarts": 1_000_000}, name="calls")
        if len(launches) == 1:  # the common single call: start_child, a little cheaper
            spec, started = launches[0]
            # What calls.proxy().start_child(spec) sends, without the proxy's lookups.
            one = cast("Future[Ref[Any]]", calls.ask(ProxyCall(_START_CHILD, (spec,), {}), block=False))

            def answered_one(reply: Future[Ref[Any]]) -> None:
                try:
                    ref = reply.get()
                except BaseException as exc:  # it could not start: the supervisor's error
                    started(exc)
                    return
                started(ref)

            one._on_done(answered_one)
            return
        specs = [spec for spec, _ in launches]
        # Every child is spawned before the supervisor waits for the first to start.
        many = cast("Future[list[Any]]", calls.ask(ProxyCall(_START_CHILDREN, (specs,), {}), block=False))

        def answered(reply: Future[list[Any]]) -> None:
            try:
                outcomes: list[Ref[Any] | BaseException] = reply.get()
            except BaseException as exc:  # the supervisor failed the whole request (it ended, say)
                outcomes = [exc] * len(launches)
            for (_, started), outcome in zip(launches, outcomes, strict=True):
                started(outcome)

        many._on_done(answered)

    # -- permissions ------------------------------------------------------------------------

    def _ask_permission(self, batch: _Batch, pending: _Pending, why: str) -> None:
        tool = pending.tool
        assert tool is not None
        request_id = uuid.uuid4().hex[:12]
        pending.request_id = request_id
        self._permissions[request_id] = (batch.msg.batch_id, pending.index)
        arguments = pending.call.arguments or {}
        request = PermissionRequest(
            request_id=request_id,
            session_id=self._session_id,
            agent_path=batch.msg.agent_path,
            call_id=pending.call.id,
            tool=tool.name,
            subject=tool.subject(arguments) if tool.subject else None,
            arguments=redact(dict(arguments)),
            timeout=batch.config.permission_timeout,
            reason=why,
        )
        self.system.events.publish("permission.requested", self.path, attrs.asdict(request))
        self.run_io(
            trio.sleep,
            batch.config.permission_timeout,
            reply=lambda _: _PermissionTimeout(request_id),
            name=f"permission {request_id}",
        )

    def _permission_timed_out(self, request_id: str) -> None:
        where = self._permissions.pop(request_id, None)
        if where is None:
            return
        batch = self._batches.get(where[0])
        if batch is None:
            return
        pending = batch.pending[where[1]]
        self.system.events.publish("permission.timed_out", self.path, {"request_id": request_id})
        self._complete(
            batch,
            where[1],
            ToolResult.error(
                f"nobody answered the permission request for {pending.call.name} within "
                f"{batch.config.permission_timeout:g} s, so it counts as denied. Do not retry it unasked."
            ),
        )

    # -- completion ----------------------------------------------------------------------------

    def _take_done(self) -> None:
        """Complete the calls that ended since the runner last looked."""
        # Reset before taking: a call that ends meanwhile tells again.
        self._done_told = False
        done = self._done
        while done:
            call = done.popleft()
            batch = self._batches.get(call.batch_id)
            if batch is not None and call.index in batch.pending:
                self._complete(batch, call.index, call.result)

    def _complete(self, batch: _Batch, index: int, result: ToolResult) -> None:
        pending = batch.pending.pop(index, None)
        if pending is None:
            return
        if pending.request_id is not None:
            self._permissions.pop(pending.request_id, None)
        duration = time.monotonic() - pending.started
        call = pending.call
        batch.results[index] = CallOutcome(call.id, call.name, result, duration)
        self._finished_calls += 1
        if result.ok:
            self._publish("tool.finished", batch, call, {"ok": True, "duration_ms": round(duration * 1000, 3)})
        else:
            self._publish(
                "tool.failed",
                batch,
                call,
                {"ok": False, "duration_ms": round(duration * 1000, 3), "error": result.output[:500]},
            )
        if not batch.pending and not batch.dispatching:
            self._reply(batch)

    def _reply(self, batch: _Batch, *, aborted: bool = False) -> None:
        self._batches.pop(batch.msg.batch_id, None)
        outcomes = tuple(r for r in batch.results if r is not None)
        reply_to = batch.msg.reply_to
        if reply_to is not None and reply_to.is_alive():
            with contextlib.suppress(Exception):
                reply_to.tell(ToolResults(batch.msg.batch_id, outcomes, aborted))

    def _abort_batch(self, batch: _Batch, reason: str) -> int:
        stopped = 0
        for index, pending in list(batch.pending.items()):
            pending.abort.set(reason)
            if pending.execution is not None and pending.execution.is_alive():
                pending.execution.kill()
            stopped += 1
            self._complete(batch, index, ToolResult.error("[aborted]"))
        return stopped

    def _abort_all(self, reason: str) -> int:
        return sum(self._abort_batch(b, reason) for b in list(self._batches.values()))

    def _publish(
        self, topic: str, batch: _Batch, call: ToolCallRequest, data: dict[str, Any], *, built: bool = False
    ) -> None:
        msg = batch.msg
        payload = {"call_id": call.id, "tool": call.name, "agent": msg.agent_path, "batch_id": msg.batch_id}
        payload.update(data)
        events = self._system.events
        if built:
            events.publish(topic, self._path, payload)
        else:  # built when something reads it; the payload is made here, for the bus to keep
            events.emit(topic, self._path, payload)


_NONE_ALLOWED: frozenset[tuple[str, str | None]] = frozenset()

_RESOLVED_TTL = 5.0  # seconds a resolved directory is reused by the runners started after it
_resolved_dirs: dict[str, tuple[Path, float]] = {}


def _resolved(path: str | Path) -> Path:
    """``Path(path).resolve()``, done once per directory for the runners started within `_RESOLVED_TTL` s.

    Resolving walks the path's components with a system call each, on the
    loop thread: 10,000 sessions of one project resolved it 20,000 times.
    """
    key = str(path)
    now = time.monotonic()
    found = _resolved_dirs.get(key)
    if found is not None and now - found[1] < _RESOLVED_TTL:
        return found[0]
    resolved = Path(path).resolve()
    if len(_resolved_dirs) >= 1024:
        _resolved_dirs.clear()
    _resolved_dirs[key] = (resolved, now)
    return resolved


_START_CHILD = ("start_child",)
_START_CHILDREN = ("start_children",)

# Characters a child id keeps: str.isalnum() ones and "-_."; re's \w on str
# patterns is exactly isalnum() plus "_", so this is the per-character rule
# below in one pass.
_UNSAFE = re.compile(r"[^\w.-]")


def _child_name(call_id: str) -> str:
    # Child ids are path components: keep them free of '/' and reasonably short.
    safe = _UNSAFE.sub("_", call_id)
    return safe[:80] or "call"
