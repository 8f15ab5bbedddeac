"""The Agent actor: the model <-> tools loop as an event-driven state machine.

::

    idle --prompt--> streaming --Completed with tool calls--> executing_tools
      ^                 |   ^                                      |
      |      no calls   |   +------------- ToolResults ------------+
      +---- (flushed) --+          (waiting while a question or a
                                    permission is open)

    Before a model call that would not fit the model's context window, and
    on ``compact()``, the agent passes through ``compacting`` (see below).

The agent never blocks its mailbox: the model stream runs as an I/O task on
the trio loop and arrives as messages; tool calls go to the session's
`ToolRunner` and their results come back as messages; history is written by
a writer task that commits in groups. So `abort` is handled at once in every
state.

The agent holds only its *context* in memory (`weald.runtime.agents.context`): the
messages since its last compaction, led by that compaction's summary, with
old tool outputs pruned. Before each model call it estimates the request's
tokens; when they exceed the model's input budget it prunes old tool results
and, if that is not enough, compacts: its own model summarizes the older
part, the summary is appended to the history with a `CompactionMark`, and
the context goes on from the summary and the recent messages
(``agent.compacted``). A server that refuses a request as too long
(`ContextLengthExceeded`) triggers one compaction and a retry of the step.
The history in the store is never rewritten: after a restart the context is
rebuilt from the last compaction entry, so a crash during a compaction
leaves the context as it was before it.

Every message is written to the store as it completes. A turn's result is
acknowledged (the prompt's future resolved) only after everything the turn
wrote is committed. When the store cannot commit (the disk is full), the
turn ends with an error naming the cause instead, never ``ok``; the agent
keeps running, and its writes, kept by the store, land once it can write
again (a turn that has not started its model call does not start it, and a
running one stops at its next step). An agent that crashes is restarted by its session
supervisor and reloads its history: an interrupted turn is marked
``interrupted`` in the store and reported (``agent.recovered``), and tool
calls it left unanswered get ``[interrupted]`` results so the history stays
valid for the model.

Store layout (namespaces):

- ``agents``: ``<key>`` -> `AgentRecord` (config, status, restarts, usage,
  the model provider's position for scripted models, where the context
  starts, where pruning stopped, and the estimate's `Calibration`).
- ``history``: ``<key>/<seq:08d>`` -> `HistoryEntry` (a summary carries its
  `CompactionMark`; a message left out of the context says why).
- ``turns``: ``<key>/<turn id>`` -> `TurnRecord`.

``<key>`` is the session id for a top-level agent and ``<session>.<agent
id>`` for a sub-agent.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import msgspec
import outcome
import trio
from weald.runtime import Actor, ActorDeadError, Future, Ref, StoreError, StoreFencedError, redact, redact_text
from weald.runtime.agents.context import (
    Calibration,
    CompactionMark,
    Context,
    ContextConfig,
    ContextStats,
    summary_message,
)
from weald.runtime.agents.tool_runner import RunnerConfig, RunTools, ToolCallRequest, ToolResults
from weald.runtime.llm import (
    Completed,
    ContextLengthExceeded,
    Image,
    Message,
    ModelLimits,
    ModelRequest,
    Provider,
    ProviderError,
    TextDelta,
    ToolCallStarted,
    ToolSpec,
    Usage,
    make_provider,
    model_limits,
)
from weald.tools import ToolRegistry, default_registry

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentRecord",
    "AgentSnapshot",
    "AnswerQuestion",
    "AskUser",
    "CompactionResult",
    "HistoryEntry",
    "PermissionState",
    "PromptKey",
    "SampleModel",
    "TurnRecord",
    "TurnResult",
    "TurnSettings",
    "WithdrawQuestion",
    "history_key",
    "load_history",
    "provider_limits",
]

AgentStatus = Literal["idle", "streaming", "executing_tools", "waiting", "compacting"]


@attrs.frozen
class AgentConfig:
    """What an agent is: its model, prompt, tools and limits.

    Attributes:
        model: ``provider:model``, e.g. ``openai:gpt-4.1`` or ``scripted:demo.json``.
        system_prompt: the system prompt, if any.
        tool_filter: which tools it may call (patterns; None = all).
        max_steps: model calls per turn before the turn stops.
        depth: 0 for a top-level agent, 1 for its sub-agent...
        max_depth: sub-agents may nest this deep; at the limit the
            ``sub_agent`` tool is not offered.
        debug_state: offer the ``debug_state`` tool.
        sub_agent_timeout: seconds a sub-agent may run before it is stopped.
        context: how the conversation is kept under the model's window.
    """

    model: str
    system_prompt: str | None = None
    tool_filter: tuple[str, ...] | None = None
    max_steps: int = 50
    depth: int = 0
    max_depth: int = 2
    debug_state: bool = False
    sub_agent_timeout: float = 600.0
    context: ContextConfig = attrs.field(default=ContextConfig())  # frozen: one shared default


@attrs.frozen(eq=False)
class TurnSettings:
    """The configuration an agent's next turn runs under: its session's project's, as it stands now.

    An agent given a ``settings`` callable asks it for one of these at the
    start of every turn (a call and a comparison: no file is read); when the
    ``generation`` differs from the one it runs under, it takes the new
    configuration before the turn's first model call. Shared by the sessions
    of a project: treat it as read-only.

    Attributes:
        generation: Changes whenever the configuration does (never reused in a process).
        agent: The agent's configuration (model, prompt, tools, limits).
        runner: The tool runner's (permissions, timeouts, tool options), sent with each batch of calls.
        model_key: Equal for two configurations whose model resolves alike;
            when it changes, the agent builds its model provider again.
    """

    generation: int
    agent: AgentConfig
    runner: RunnerConfig
    model_key: object = None


class AgentRecord(msgspec.Struct, kw_only=True):
    """An agent as stored: enough to restart it after a crash or a daemon restart."""

    key: str
    session_id: str
    agent_id: str
    working_dir: str
    model: str
    system_prompt: str | None = None
    tool_filter: list[str] | None = None
    max_steps: int = 50
    depth: int = 0
    created: float = 0.0
    status: str = "active"
    restarts: int = 0  # see Agent: unplanned restarts since the daemon started, restores included
    run_id: str = ""  # the `ActorSystem.run_id` that ``restarts`` counts for
    next_seq: int = 0
    provider_position: int | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    # The context starts at the last compaction whose first kept message has
    # this sequence number (a hint: recovery reads the history from here).
    context_from: int = 0
    pruned_before: int = 0
    compactions: int = 0
    calibration: Calibration | None = None  # what the estimate learnt: a restart or a wake keeps it

    @classmethod
    def fresh(
        cls, config: AgentConfig, *, key: str, session_id: str, agent_id: str, working_dir: str, created: float
    ) -> AgentRecord:
        """The record of an agent never started yet: what it writes at its first start."""
        return cls(
            key=key,
            session_id=session_id,
            agent_id=agent_id,
            working_dir=working_dir,
            model=config.model,
            system_prompt=config.system_prompt,
            tool_filter=list(config.tool_filter) if config.tool_filter is not None else None,
            max_steps=config.max_steps,
            depth=config.depth,
            created=created,
        )

    def restarts_at_load(self, run_id: str) -> int:
        """The ``restarts`` the agent reports once it loads this record in the run ``run_id``.

        The count of this run, plus one when the record was left active (its
        agent crashed or its daemon was killed: the load is a restore). What
        `tree` and ``agent.list`` show for a hibernated agent without waking it.
        """
        restarts = self.restarts if self.run_id == run_id else 0
        return restarts + 1 if self.status == "active" else restarts


class HistoryEntry(msgspec.Struct, kw_only=True):
    """One message of an agent's history, as stored.

    A compaction's summary carries ``compaction``: the context starts again
    here. A message that is not in the context carries ``left_out``, why: a
    prompt refused as too large for the model, or a prompt whose turn failed
    because its request did not fit. The message itself is never rewritten.
    """

    seq: int
    turn_id: str
    time: float
    message: Message
    compaction: CompactionMark | None = None
    left_out: str | None = None
    usage: Usage | None = None  # an assistant message: the tokens of the model call that made it


class PromptKey(msgspec.Struct, kw_only=True):
    """An idempotency key's record (``prompt_keys``: ``<key>/<idempotency key>``): the turn its prompt joined."""

    turn_id: str


class TurnRecord(msgspec.Struct, kw_only=True):
    """One turn, as stored: running, done, error, aborted or interrupted."""

    turn_id: str
    status: str
    started: float
    ended: float | None = None
    steps: int = 0
    error: str | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    text: str = ""


@attrs.frozen
class TurnResult:
    """How a turn ended; what ``prompt`` resolves to.

    Attributes:
        turn_id: the turn.
        ok: True when the model answered without tool calls.
        text: the final answer (or what there was when it stopped).
        usage: tokens used by this turn.
        steps: model calls made.
        error: why it did not end well, if it did not.
        aborted: it was aborted.
        interrupted: the agent crashed during it.
    """

    turn_id: str
    ok: bool
    text: str
    usage: Usage
    steps: int
    error: str | None = None
    aborted: bool = False
    interrupted: bool = False


@attrs.frozen
class AgentSnapshot:
    """A frozen view of an agent, handed to every tool call and to debug_state."""

    path: str
    session_id: str
    agent_id: str
    status: AgentStatus
    model: str
    working_dir: str
    depth: int
    tool_filter: tuple[str, ...] | None
    tools: tuple[str, ...]
    turn_id: str | None
    step: int
    pending_prompts: tuple[str, ...]
    running_tool_calls: tuple[str, ...]
    open_questions: tuple[str, ...]
    open_permissions: tuple[str, ...]
    usage: Usage
    restarts: int
    message_count: int
    messages: tuple[Message, ...]
    context: ContextStats | None = None
    config_generation: int | None = None


@attrs.frozen
class AskUser:
    """A question for whoever drives the top-level agent (from the ask_user tool, or a sub-agent).

    Attributes:
        question: the question.
        choices: optional answers to choose from.
        reply: completed with the answer text.
        asked_by: path of the agent whose tool asked.
        schema: for a structured question (an MCP server's elicitation), the
            JSON Schema of the answer, shown to clients in ``question.asked``
            so they can render fields; None for a plain question.
        question_id: the id to ask under, chosen by the asker so it can
            withdraw the question (`WithdrawQuestion`); None: the agent picks one.
        origin: who wants the answer when it is not the agent's own tool
            (``mcp:<server>`` for an MCP server's elicitation); None otherwise.
    """

    question: str
    choices: tuple[str, ...]
    reply: Future[str]
    asked_by: str
    schema: Mapping[str, Any] | None = attrs.field(default=None, hash=False)
    question_id: str | None = None
    origin: str | None = None


@attrs.frozen
class WithdrawQuestion:
    """The asker no longer waits for question ``question_id`` (its deadline passed, its call ended).

    The question's reply fails with a RuntimeError, and ``question.answered``
    is published with ``withdrawn`` set, so clients stop offering it.
    """

    question_id: str
    reason: str


@attrs.frozen
class CompactionResult:
    """What ``compact()`` resolves to.

    Attributes:
        compacted: whether a summary replaced part of the context.
        tokens_before: the context's estimated size before, in tokens.
        tokens_after: its estimated size after.
        replaced: messages the summary replaced.
        detail: why nothing was compacted, or why it failed.
    """

    compacted: bool
    tokens_before: int
    tokens_after: int
    replaced: int = 0
    detail: str | None = None


@attrs.frozen
class AnswerQuestion:
    """The answer to an open question (sent by the daemon when a client answers)."""

    question_id: str
    answer: str


@attrs.frozen
class PermissionState:
    """From the runner: a permission request opened (True) or closed (False)."""

    request_id: str
    open: bool


@attrs.frozen
class SampleModel:
    """A model call on this agent's provider for someone else: an MCP server's ``sampling/createMessage``.

    It is not part of the agent's history or turn; its usage counts toward the
    agent's, and it is published as ``agent.sampled``.

    Attributes:
        request: the call (no tools).
        reply: completed with ``(model, completed)``, or failed with the
            provider's error.
        origin: who asked (``mcp:<server>``).
    """

    request: ModelRequest
    reply: Future[tuple[str, Completed]]
    origin: str


# -- internal messages -------------------------------------------------------------------------


@attrs.frozen
class _Prompt:
    text: str
    future: Future[TurnResult]
    images: tuple[Image, ...] = ()
    key: str | None = None


@attrs.frozen
class _ModelEvent:
    gen: int
    event: Any


@attrs.frozen
class _ModelDone:
    gen: int
    result: outcome.Outcome[None]


@attrs.frozen
class _Sampled:
    origin: str
    completed: Completed | None


@attrs.frozen
class _Flushed:
    token: int


@attrs.frozen
class _WriterFailed:
    token: int
    error: BaseException


@attrs.frozen
class _Summarized:
    gen: int
    result: outcome.Outcome[Completed]


@attrs.frozen
class _IdleFor:
    token: int


@attrs.frozen
class _HibernateAnswer:
    result: outcome.Outcome[bool]


@attrs.frozen
class _Reconfigured:
    turn: Any  # the _Turn it was started for
    result: outcome.Outcome[tuple[str | None, Provider | None]]
    model_key: object


class _Turn:
    __slots__ = (
        "batch",
        "futures",
        "id",
        "overflowed",
        "pending_calls",
        "prompts",
        "started",
        "steps",
        "text",
        "usage",
    )

    def __init__(self, turn_id: str) -> None:
        self.id = turn_id
        self.futures: list[Future[TurnResult]] = []
        self.started = time.time()
        self.steps = 0
        self.usage = Usage()
        self.text = ""
        self.batch: str | None = None
        self.pending_calls: tuple[str, ...] = ()
        # The server refused this step as too long once ("compacted": the context was
        # compacted for the retry; "pruned": nothing could be); a second refusal ends the turn.
        self.overflowed: str | None = None
        # The prompts the turn took into the context: (seq, the time they were stored).
        self.prompts: list[tuple[int, float]] = []


class _Compaction:
    """A compaction in flight: where the context is cut, why, and what to do once it ends."""

    __slots__ = ("gen", "reason", "split", "then", "tokens_before", "waiters")

    def __init__(
        self, gen: int, split: int, reason: str, tokens_before: int, then: Callable[[CompactionResult], None]
    ) -> None:
        self.gen = gen
        self.split = split
        self.reason = reason
        self.tokens_before = tokens_before
        self.then = then
        self.waiters: list[Future[CompactionResult]] = []


# What a tool result costs in a request besides its output (framing, its call's id), in tokens.
_RESULT_FRAMING_TOKENS = 64
# The least output a tool call is given, however full the context: its notice and a start.
_MIN_OUTPUT_BYTES = 1024

# The model stream events the agent acts on (see Agent._on_model_event).
_HANDLED_EVENTS = (TextDelta, ToolCallStarted, Completed)


def _redacted(message: Message) -> Message:
    """The message with every known secret cut out of its text and its tool calls' arguments."""
    content = redact_text(message.content)
    calls = [
        msgspec.structs.replace(
            call,
            arguments=redact(call.arguments) if call.arguments is not None else None,
            raw_arguments=redact_text(call.raw_arguments),
        )
        for call in message.tool_calls
    ]
    if content == message.content and calls == message.tool_calls:
        return message
    return msgspec.structs.replace(message, content=content, tool_calls=calls)


class _IdleClock:
    """One timer for every agent's idle deadline on a system, instead of a sleeping task each.

    Every agent waits the same ``idle_after``, so deadlines come in the
    order they are armed: one entry per agent in arming order (an agent
    armed again moves to the end, its older deadline dropped, so a busy
    agent holds one entry, not one per turn), and one task that sleeps
    until the first and then tells each agent whose deadline passed
    `_IdleFor` (stale tokens are ignored by the agent). Saves an I/O task
    and its cancel scope per idle agent (about 2 KB), and a cancellation
    per expiry. Touched only on the loop thread.
    """

    def __init__(self, system: Any) -> None:
        self._system = system
        # agent -> (deadline, token), in deadline order (dicts keep insertion order).
        self._due: dict[Ref[Any], tuple[float, int]] = {}
        self._running = False
        self._wake: trio.Event | None = None

    def __len__(self) -> int:
        return len(self._due)

    def arm(self, ref: Ref[Any], token: int, after: float) -> None:
        due = trio.current_time() + after
        self._due.pop(ref, None)
        if self._due and due < next(reversed(self._due.values()))[0]:
            # A shorter idle_after than the others': keep the deadlines in order.
            entries = sorted((*self._due.items(), (ref, (due, token))), key=lambda e: e[1][0])
            self._due = dict(entries)
        else:
            self._due[ref] = (due, token)
        if not self._running:
            self._running = True
            self._system.loop.spawn_nowait(self._run)
        elif self._wake is not None and next(iter(self._due)) is ref:
            self._wake.set()

    async def _run(self) -> None:
        try:
            while self._due:
                self._wake = trio.Event()
                with trio.move_on_at(next(iter(self._due.values()))[0]):
                    await self._wake.wait()
                now = trio.current_time()
                while self._due:
                    ref, (due, token) = next(iter(self._due.items()))
                    if due > now:
                        break
                    del self._due[ref]
                    with contextlib.suppress(ActorDeadError):
                        ref.tell(_IdleFor(token))
        finally:
            self._running = False
            self._wake = None


_idle_clocks: weakref.WeakKeyDictionary[Any, _IdleClock] = weakref.WeakKeyDictionary()


def _idle_clock(system: Any) -> _IdleClock:
    clock = _idle_clocks.get(system)
    if clock is None:
        clock = _idle_clocks[system] = _IdleClock(system)
    return clock


def history_key(session_id: str, agent_id: str, depth: int) -> str:
    """The store key of an agent's records: the session id, or ``<session>.<agent>`` below the top."""
    return session_id if depth == 0 else f"{session_id}.{agent_id}"


def load_history(store: Any, key: str) -> list[HistoryEntry]:
    """Read an agent's stored history, oldest first (blocking; for threads and tools)."""
    return [entry for _, entry in store.items("history", f"{key}/", type=HistoryEntry)]


def provider_limits(provider: Any) -> ModelLimits:
    """The context window and output reserve of a provider's model.

    A provider may carry its own ``limits``; else they come from its
    ``model`` and ``settings`` (see `weald.runtime.llm.model_limits`).
    """
    limits = getattr(provider, "limits", None)
    if isinstance(limits, ModelLimits):
        return limits
    return model_limits(str(getattr(provider, "model", "")), getattr(provider, "settings", None))


class Agent(Actor):
    """One agent: a session's model <-> tools loop.

    Args:
        session_id: the session.
        agent_id: this agent's id (the session id for the top-level agent).
        working_dir: the project directory.
        config: model, prompt, tools and limits.
        registry: the tools (built-ins and MCP).
        runner_path: path of the session's ToolRunner.
        parent: for a sub-agent, the agent that started it (questions go up to it).
        provider_factory: builds the model provider from ``config.model``;
            called in a worker thread (it may read a file, a script).
        skills: returns the skill catalog for the system prompt (names and
            descriptions, as `weald.tools.skills.describe_skills` writes it;
            "" when there are none). Blocking: it is called once per start,
            in a worker thread, and only when the agent is offered
            ``use_skill``. None: the model is shown no skills.
        hibernate: asks for the agent's session to be hibernated (see
            `weald.runtime.agents.session.SessionRuntime.hibernate`); returns
            whether it will be. Called once the agent has been idle for
            ``idle_after`` seconds, or when `hibernate_now` is asked, while
            it holds its messages. None: the agent never hibernates.
        idle_after: seconds of idleness before ``hibernate`` is called; None: never.
        skills_nowait: the skill catalog when it is at hand without a scan,
            else None (then ``skills`` is called in a worker thread).
        settings: the session's current configuration (see `TurnSettings`),
            asked at the start of every turn; when given, its ``agent`` is the
            agent's configuration and ``config`` is not used. None: ``config``
            for good, and the runner's own configuration for tool calls.
    """

    def __init__(
        self,
        session_id: str,
        agent_id: str,
        working_dir: str | Path,
        config: AgentConfig,
        *,
        registry: ToolRegistry | None = None,
        runner_path: str | None = None,
        parent: Ref[Any] | None = None,
        provider_factory: Callable[[str], Provider] | None = None,
        skills: Callable[[], str] | None = None,
        hibernate: Callable[[], Awaitable[bool]] | None = None,
        idle_after: float | None = None,
        skills_nowait: Callable[[], str | None] | None = None,
        settings: Callable[[], TurnSettings] | None = None,
    ) -> None:
        super().__init__()
        self._session_id = session_id
        self._agent_id = agent_id
        self._working_dir = str(Path(working_dir).resolve())
        self._settings = settings
        self._generation: int | None = None
        self._runner_config: RunnerConfig | None = None
        self._model_key: object = None
        if settings is not None:
            live = settings()
            config = live.agent
            self._generation, self._runner_config, self._model_key = live.generation, live.runner, live.model_key
        self._config = config
        self._registry = registry if registry is not None else default_registry
        self._runner_path = runner_path
        self._parent_agent = parent
        self._provider_factory = provider_factory or make_provider
        self._skills = skills
        self._skills_nowait = skills_nowait
        # The configured prompt plus the skill catalog; settled in on_start.
        self._system_prompt = config.system_prompt
        self._key = history_key(session_id, agent_id, config.depth)
        self._state: AgentStatus = "idle"
        # What the next model request sends; limits are settled in on_start, with the provider.
        self._context = Context(model_limits(""), config.context)
        self._compaction: _Compaction | None = None
        self._compact_waiters: list[Future[CompactionResult]] | None = None  # asked for, not started
        # Model steps answered since the last compaction (attempted): two compactions with
        # no step between them only when an overflow forces the second.
        self._steps_since_compaction = 1
        self._record: AgentRecord | None = None
        self._turn: _Turn | None = None
        self._queue: list[_Prompt] = []
        self._gen = 0
        self._stream_io: Any = None
        self._questions: dict[str, AskUser] = {}
        # Open permission requests; None while there is none (an empty set costs 216 bytes an agent).
        self._permissions: set[str] | None = None
        self._provider: Provider | None = None
        self._flush_tokens = itertools.count(1)
        # Turns that ended but whose writes are not yet confirmed committed:
        # (their futures, their result). Answered on acknowledgement, or, if
        # this actor ends first, once the store confirms (the store outlives it).
        self._unacknowledged: list[tuple[list[Future[TurnResult]], TurnResult]] = []
        # token -> (what to run once committed, what to run with the store's error instead)
        self._flush_waiters: dict[int, tuple[Callable[[], None], Callable[[BaseException], None]]] = {}
        self._hibernate = hibernate
        self._idle_after = idle_after
        self._hibernate_waiters: list[Future[bool]] | None = None  # asked for (`hibernate_now`), not answered
        self._idle_timer: Any = None
        self._idle_token = 0

    # -- lifecycle ------------------------------------------------------------------------

    def on_start(self) -> Any:
        """Load (or create) the agent's record and history, and recover an interrupted turn."""
        return self._load()

    async def _load(self) -> None:
        store = self.system.store
        # What a previous incarnation queued (it may have been killed) is read
        # with the rest: the store's reads see its queued writes.
        key = self._key

        model = self._config.model

        def read() -> tuple[AgentRecord | None, list[tuple[str, HistoryEntry]], outcome.Outcome[Provider]]:
            # One worker-thread hop for both reads and the model provider (building it
            # may read a file: a script): agents start, and wake, by the thousand. The
            # history from where the last compaction's context starts: only what the
            # next request needs. The provider's failure is raised where it was
            # before, after the record is loaded.
            stored = store.get("agents", key, type=AgentRecord)
            start = f"{stored.context_from:08d}" if stored is not None else None
            entries = store.items_range("history", f"{key}/", start=start, type=HistoryEntry)
            return stored, entries, outcome.capture(self._provider_factory, model)

        record, entries, built = await trio.to_thread.run_sync(read)
        recovered = record is not None and record.status == "active"
        # `restarts` counts from the daemon's start, a restore from the store included.
        restarts = record.restarts_at_load(self.system.run_id) if record is not None else 0
        if record is None:
            record = AgentRecord.fresh(
                self._config,
                key=self._key,
                session_id=self._session_id,
                agent_id=self._agent_id,
                working_dir=self._working_dir,
                created=time.time(),
            )
        self._context.load(
            [(entry.seq, entry.message, entry.compaction) for _, entry in entries if entry.left_out is None],
            pruned_before=record.pruned_before,
        )
        self._context.compactions = record.compactions
        record.next_seq = max(record.next_seq, (entries[-1][1].seq + 1) if entries else 0)
        self._record = record
        record.restarts = restarts
        record.run_id = self.system.run_id
        interrupted = await self._recover(store) if recovered else None
        if recovered:
            record.status = "active"
            self._persist_record()
            self._publish("agent.recovered", {"restarts": record.restarts, "interrupted_turn": interrupted})
        else:
            record.status = "active"
            self._persist_record()
        self._system_prompt = await self._compose_system_prompt()
        self._provider = built.unwrap()  # built in the worker thread of the reads
        self._context.limits = provider_limits(self._provider)
        # Estimate as before the restart or the sleep: never a guess that compacts a context that fits.
        self._context.restore(record.calibration, self._config.model)
        seek = getattr(self._provider, "seek", None)
        if seek is not None and record.provider_position is not None:
            seek(record.provider_position)
        self._arm_idle()

    # -- hibernation ----------------------------------------------------------------------------

    def _arm_idle(self) -> None:
        """(Re)start the idle timer: after ``idle_after`` quiet seconds, ask to hibernate."""
        if self._hibernate is None or self._idle_after is None:
            return
        self._idle_token += 1
        self._idle_timer = self._idle_token
        _idle_clock(self.system).arm(self.actor_ref, self._idle_token, self._idle_after)

    def _disarm_idle(self) -> None:
        # The clock's entry stays queued; its token no longer matches, so it is ignored.
        self._idle_timer = None
        self._idle_token += 1

    def _is_idle(self) -> bool:
        return (
            self._turn is None
            and self._compaction is None  # a compaction's summary is not yet in the store
            and not self._compact_waiters
            and not self._queue
            and not self._questions
            and not self._permissions
            and not self._unacknowledged
            and not self._flush_waiters
            and not len(self.actor_inbox)  # type: ignore[arg-type]
        )

    def _on_idle_for(self, token: int) -> None:
        if token != self._idle_token or self._idle_timer is None or self._hibernate is None:
            return
        self._idle_timer = None
        if not self._is_idle():
            if self._turn is None:
                # Busy between turns (a compaction, a write not yet committed,
                # a message waiting): ask again after another idle period. A
                # turn re-arms the clock itself once it is acknowledged.
                self._arm_idle()
            return
        self._go_to_sleep({"idle_for": self._idle_after})

    def _go_to_sleep(self, why: Mapping[str, Any]) -> None:
        # From here on what arrives is kept, and handed on, in order, to the
        # session when it wakes (or handled here if it does not hibernate).
        assert self._hibernate is not None
        self.hold_messages()
        self._publish("agent.hibernating", why)
        self.run_io(self._hibernate, reply=_HibernateAnswer, name="hibernate")

    def hibernate_now(self) -> Future[bool]:
        """Hibernate the session now if this agent is idle (an operator's ``agent.hibernate``).

        What ``hibernate_after`` idle seconds would do, without the wait:
        the agent holds what it is sent from here on, and its session's
        supervisor stops the subtree and leaves a stub, which the next
        message wakes. Nothing is cut short: an agent in a turn, with a
        question or a permission request open, a compaction or a write not
        yet committed, or a tool runner with anything running, stays awake.

        Returns:
            A future resolved with whether the session hibernated.
        """
        future: Future[bool] = Future()
        if self._hibernate is None or not self._is_idle():
            future.set(False)
            return future
        if self._hibernate_waiters is not None:  # asked already: the same answer
            self._hibernate_waiters.append(future)
            return future
        self._hibernate_waiters = [future]
        self._disarm_idle()
        self._go_to_sleep({"asked": True})
        return future

    def _on_hibernate_answer(self, answer: _HibernateAnswer) -> None:
        result = answer.result
        hibernated = isinstance(result, outcome.Value) and bool(result.value)
        if hibernated:
            return  # the session is stopping us (`_shutdown` answers who asked); what arrives is held
        self._settle_hibernation(False)
        self.release_messages()
        self._arm_idle()

    def _settle_hibernation(self, hibernated: bool) -> None:
        """Answer whoever asked `hibernate_now`: declined, or stopping for it (a hibernation ends this actor)."""
        waiters, self._hibernate_waiters = self._hibernate_waiters or [], None
        for waiter in waiters:
            with contextlib.suppress(Exception):
                waiter.set(hibernated)

    async def _compose_system_prompt(self) -> str | None:
        """The configured system prompt, followed by the skill catalog when ``use_skill`` is offered."""
        if self._skills is None or not any(s.name == "use_skill" for s in self._tool_specs()):
            return self._config.system_prompt
        catalog = self._skills_nowait() if self._skills_nowait is not None else None
        if catalog is None:
            catalog = await trio.to_thread.run_sync(self._skills)
        parts = [p for p in (self._config.system_prompt, catalog) if p]
        return "\n\n".join(parts) if parts else None

    async def _recover(self, store: Any) -> str | None:
        """Mark a turn left running as interrupted; answer tool calls it left open."""
        interrupted = None
        for _, turn in await store.aitems("turns", f"{self._key}/", type=TurnRecord):
            if turn.status == "running":
                turn.status = "interrupted"
                turn.ended = time.time()
                turn.error = "the agent crashed during this turn; it was restarted from its stored history"
                self._enqueue_write("turns", f"{self._key}/{turn.turn_id}", turn)
                interrupted = turn.turn_id
        history = self._context.messages
        answered = {m.tool_call_id for m in history if m.role == "tool"}
        open_calls = [
            call for m in history if m.role == "assistant" for call in m.tool_calls if call.id not in answered
        ]
        for call in open_calls:
            self._append(
                Message(
                    role="tool",
                    content="[interrupted] the agent crashed while this call ran; its result is unknown.",
                    tool_call_id=call.id,
                    name=call.name,
                    is_error=True,
                ),
                interrupted or "recovery",
            )
        return interrupted

    def on_stop(self) -> Any:
        """Abort a running turn and mark the agent stopped, after the last write is committed."""
        return self._shutdown()

    async def _shutdown(self) -> None:
        # Stopping while holding its messages for a hibernation: the session is going to sleep.
        self._settle_hibernation(self._holding is not None)
        crashed = self._crashed_dependency()
        if self._turn is not None or self._compaction is not None or self._compact_waiters:
            fenced = self.system.store.fenced_error(self._session_id) if crashed is None else None
            if fenced is not None:
                # Stopped because another node owns the session now: the turn says so.
                self._abort_turn(_unsaved_error(fenced))
            elif crashed is None:
                self._abort_turn("the agent was stopped")
            else:
                reason = (
                    f"the session's {crashed} crashed and was restarted, and this agent with it (rest_for_one); "
                    "the turn was interrupted: its history is kept, prompt again to carry on"
                )
                self._abort_turn(reason, interrupted=True)
        if self._record is not None:
            # Stopped because an actor it depends on crashed: the supervisor starts it again at
            # once, a restart like its own crash ("active" makes the next start count it).
            self._record.status = "stopped" if crashed is None or self._config.depth > 0 else "active"
            self._persist_record()
        failure = await self._drain_writes()
        # The receive loop has ended, so flush acknowledgements cannot arrive
        # as messages any more: run them here, with the store's verdict.
        for done, failed in list(self._flush_waiters.values()):
            if failure is None:
                done()
            else:
                failed(failure)
        self._flush_waiters.clear()
        if self._provider is not None:
            with trio.move_on_after(2):
                await self._provider.aclose()

    def _crashed_dependency(self) -> str | None:
        """The actor this agent depends on that has died, if that is why it is being stopped.

        A session supervisor (rest_for_one) stops the agent, to restart it,
        after its tool runner or sub-agent supervisor crashed: by then that
        sibling is gone from the registry. A stop for good (``agent.stop``,
        the daemon's shutdown) stops the agent first, its siblings still alive.
        """
        if self._runner_path is not None and self.system.whereis(self._runner_path) is None:
            return "tool runner"
        if self._config.depth == 0 and self._runner_path is not None:
            sub_agents = self._runner_path.rsplit("/", 1)[0] + "/sub_agents"
            if self.system.whereis(sub_agents) is None and self.system.whereis(self._runner_path) is not None:
                return "sub-agent supervisor"
        return None

    def on_failure(self, *exc_info: Any) -> None:
        """Tell whoever waits on the turn that it was interrupted (the supervisor restarts us)."""
        self._settle_hibernation(False)
        error = exc_info[1]
        # In words, as a person reads it ("InjectedFault: injected fault 'x' ..."), not a repr.
        self._interrupt_waiters(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)

    def _on_killed(self) -> None:
        self._settle_hibernation(False)
        self._interrupt_waiters("killed")

    def _interrupt_waiters(self, error: str) -> None:
        # Turns that ended before the crash: their writes are queued in the
        # store, which outlives this actor; answer them once it confirms.
        ended = list(self._unacknowledged)
        self._unacknowledged.clear()
        if ended:

            def answer(flushed: Future[None]) -> None:
                # Acknowledged as they ended only if their writes are in the store.
                try:
                    flushed.get()
                except BaseException as exc:  # the store's error: no result is given as ok
                    results = [(futures, _unsaved(result, exc)) for futures, result in ended]
                else:
                    results = ended
                for futures, result in results:
                    for future in futures:
                        with contextlib.suppress(Exception):
                            future.set(result)

            try:
                self.system.store.flush(self._session_id)._on_done(answer)
            except StoreError as exc:  # no store to ask (it is restarting): not known to be committed
                unknown: Future[None] = Future()
                unknown.set_exception((type(exc), exc, None))
                answer(unknown)
        for future in self._pending_futures():
            with contextlib.suppress(Exception):
                future.set(
                    TurnResult(
                        turn_id=self._turn.id if self._turn else "",
                        ok=False,
                        text="",
                        usage=self._turn.usage if self._turn else Usage(),  # the model calls it made count
                        steps=self._turn.steps if self._turn else 0,
                        error=f"the agent crashed ({error}); it is being restarted with its history",
                        interrupted=True,
                    )
                )
        for question in self._questions.values():
            with contextlib.suppress(Exception):
                question.reply.set_exception((RuntimeError, RuntimeError("the agent crashed"), None))
        self._cancel_compactions(f"the agent crashed ({error}); its context is rebuilt from the store")

    def _pending_futures(self) -> list[Future[TurnResult]]:
        futures = [p.future for p in self._queue]
        if self._turn is not None:
            futures = self._turn.futures + futures
        return futures

    # -- public API (through the proxy) ---------------------------------------------------------

    def prompt(self, text: str, images: Sequence[Image] = (), key: str | None = None) -> Future[TurnResult]:
        """Start a turn with ``text`` (and ``images`` the model sees with it); returns a future of the `TurnResult`.

        A prompt sent while a turn runs is queued and handed to the model at
        the next step boundary (steering); its future resolves when that turn ends.

        ``key`` (an idempotency key) is recorded under ``prompt_keys`` with
        the turn the prompt joins, in the same commit as its user message: a
        repeat of the prompt finds the turn there (see the daemon's ``agent.prompt``).
        """
        future: Future[TurnResult] = Future()
        refusal = self._refusal(Message(role="user", content=text, images=list(images)), self._tool_specs())
        if refusal is not None:
            self._refuse(Message(role="user", content=text, images=list(images)), refusal, future)
            return future
        self._queue.append(_Prompt(text, future, tuple(images), key))
        if self._turn is None and self._compaction is None:
            self._start_turn()
        else:
            # During a turn: steering. During a compaction between turns: the turn starts after it.
            self._publish("agent.prompt_queued", {"text": text[:200], "queued": len(self._queue)})
        return future

    def _refuse(self, message: Message, refusal: str, future: Future[TurnResult]) -> None:
        """Answer a prompt too large for the model without a turn: stored, marked refused, left out of the context."""
        turn_id = uuid.uuid4().hex[:12]
        now = time.time()
        entry = self._append(message, turn_id, left_out=f"refused: {refusal}")
        self._enqueue_write(
            "turns",
            f"{self._key}/{turn_id}",
            TurnRecord(turn_id=turn_id, status="refused", started=now, ended=now, error=refusal),
        )
        self._persist_record()
        self._publish(
            "agent.prompt_refused",
            {"turn_id": turn_id, "seq": entry.seq, "tokens": self._context.message_tokens(message), "error": refusal},
        )
        result = TurnResult(turn_id=turn_id, ok=False, text="", usage=Usage(), steps=0, error=refusal)

        def answer(final: TurnResult = result) -> None:
            with contextlib.suppress(Exception):
                future.set(final)

        self._flush(answer, lambda exc: answer(_unsaved(result, exc)))

    def abort(self) -> bool:
        """Stop the running turn in any state; returns False when there was none.

        The model stream and running tool calls are cancelled, unanswered
        tool calls get ``[aborted]`` results, queued prompts are dropped
        (their futures resolve as aborted), and the agent returns to idle.
        """
        if self._turn is None and not self._queue and self._compaction is None:
            return False
        self._abort_turn("aborted")
        return True

    def compact(self) -> Future[CompactionResult]:
        """Compact the context now (``agent.compact``); returns a future resolved with the outcome.

        Between turns the compaction starts at once; during a turn it runs
        before the next model call (or, if the turn ends first, right after
        it). A context of a single step has nothing to compact: the result
        says so with ``compacted`` false.
        """
        future: Future[CompactionResult] = Future()
        if self._compaction is not None:
            self._compaction.waiters.append(future)
        elif self._turn is not None:
            self._compact_waiters = [*(self._compact_waiters or ()), future]
        else:
            self._compact_waiters = [*(self._compact_waiters or ()), future]
            self._compact_between_turns()
        return future

    def answer(self, question_id: str, answer: str, *, declined: str | None = None) -> bool:
        """Answer an open question; returns False if it is unknown or already answered.

        With ``declined`` (why no answer came: no one could be asked, say), the
        question gets no answer: whoever asked it fails with that reason.
        """
        question = self._questions.pop(question_id, None)
        if question is None:
            return False
        with contextlib.suppress(Exception):
            if declined is not None:
                question.reply.set_exception((RuntimeError, RuntimeError(declined), None))
            else:
                question.reply.set(answer)
        self._publish("question.answered", {"question_id": question_id})
        self._refresh_waiting()
        return True

    def history(self, limit: int | None = None) -> list[Message]:
        """The context: what the next model call sends (the last ``limit`` messages of it).

        Until the first compaction that is the whole conversation; after it,
        the last summary and the messages since. The whole conversation is in
        the store (``agent.history`` pages through it).
        """
        messages = self._context.messages
        return list(messages[-limit:] if limit else messages)

    def snapshot(self, messages: int = 20) -> AgentSnapshot:
        """A frozen view of the agent's state, with the last ``messages`` messages of its context."""
        record = self._record
        turn = self._turn
        specs = self._tool_specs()
        history = self._context.messages
        return AgentSnapshot(
            path=self.path,
            session_id=self._session_id,
            agent_id=self._agent_id,
            status=self._state,
            model=self._config.model,
            working_dir=self._working_dir,
            depth=self._config.depth,
            tool_filter=self._config.tool_filter,
            tools=tuple(s.name for s in specs),
            turn_id=turn.id if turn else None,
            step=turn.steps if turn else 0,
            pending_prompts=tuple(p.text[:200] for p in self._queue),
            running_tool_calls=turn.pending_calls if turn else (),
            open_questions=tuple(self._questions),
            open_permissions=tuple(sorted(self._permissions or ())),
            usage=record.usage if record else Usage(),
            restarts=record.restarts if record else 0,
            message_count=record.next_seq if record else len(history),
            messages=tuple(history[-messages:]) if messages else (),
            context=self._context.stats(self._system_prompt, specs),
            config_generation=self._generation,
        )

    # -- messages ------------------------------------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        """Model events, tool results, questions, permission states and flushes, in mailbox order."""
        if isinstance(message, _ModelEvent):
            if message.gen == self._gen:
                self._on_model_event(message.event)
        elif isinstance(message, _ModelDone):
            if message.gen == self._gen:
                self._on_model_done(message.result)
        elif isinstance(message, _Summarized):
            if self._compaction is not None and message.gen == self._compaction.gen:
                self._on_summarized(message.result)
        elif isinstance(message, ToolResults):
            self._on_tool_results(message)
        elif isinstance(message, _Flushed):
            waiter = self._flush_waiters.pop(message.token, None)
            if waiter is not None:
                waiter[0]()
        elif isinstance(message, _WriterFailed):
            waiter = self._flush_waiters.pop(message.token, None)
            if waiter is not None:
                waiter[1](message.error)
        elif isinstance(message, AskUser):
            self._on_ask(message)
        elif isinstance(message, AnswerQuestion):
            self.answer(message.question_id, message.answer)
        elif isinstance(message, WithdrawQuestion):
            self._on_withdraw(message)
        elif isinstance(message, SampleModel):
            self._sample(message)
        elif isinstance(message, _Sampled):
            self._on_sampled(message)
        elif isinstance(message, _IdleFor):
            self._on_idle_for(message.token)
        elif isinstance(message, _HibernateAnswer):
            self._on_hibernate_answer(message)
        elif isinstance(message, _Reconfigured):
            self._on_reconfigured(message)
        elif isinstance(message, PermissionState):
            if message.open:
                if self._permissions is None:
                    self._permissions = set()
                self._permissions.add(message.request_id)
            elif self._permissions is not None:
                self._permissions.discard(message.request_id)
                if not self._permissions:
                    self._permissions = None
            self._refresh_waiting()

    # -- the loop --------------------------------------------------------------------------------------

    def _start_turn(self) -> None:
        self._disarm_idle()
        turn = _Turn(uuid.uuid4().hex[:12])
        self._turn = turn
        self._publish("agent.turn_start", {"turn_id": turn.id})
        self._write_turn(turn, "running")
        self._take_queue(turn)
        self._set_state("streaming")
        live = self._settings() if self._settings is not None else None
        if live is not None and live.generation != self._generation:
            self._reconfigure(turn, live)
        else:
            self._step(first=True)

    def _reconfigure(self, turn: _Turn, live: TurnSettings) -> None:
        """Take the session's new configuration, then start the turn (its first step).

        The tool runner gets the new rules with this turn's calls; the
        system prompt is composed again when what it depends on changed,
        and the model provider built again (in a worker thread) when the
        model resolves differently. A provider that cannot be built ends
        the turn with the reason; the next turn tries again.
        """
        old = self._config
        new = live.agent
        self._generation, self._runner_config = live.generation, live.runner
        self._config = new
        self._context.config = new.context
        rebuild = live.model_key != self._model_key or new.model != old.model
        recompose = (new.system_prompt, new.tool_filter, new.debug_state, new.max_depth) != (
            old.system_prompt,
            old.tool_filter,
            old.debug_state,
            old.max_depth,
        )
        self._publish("agent.config_changed", {"generation": live.generation, "model": new.model})
        if not rebuild and not recompose:
            self._step(first=True)
            return
        key = live.model_key if rebuild else self._model_key

        async def rebuilt() -> tuple[str | None, Provider | None]:
            prompt = await self._compose_system_prompt() if recompose else self._system_prompt
            provider = await trio.to_thread.run_sync(self._provider_factory, new.model) if rebuild else None
            return prompt, provider

        self.run_io(rebuilt, reply=lambda result: _Reconfigured(turn, result, key), name="reconfigure")

    def _on_reconfigured(self, message: _Reconfigured) -> None:
        turn = message.turn
        try:
            prompt, provider = message.result.unwrap()
        except Exception as exc:
            if self._turn is turn:
                self._generation = None  # try again at the next turn
                self._end_turn(ok=False, error=f"the changed configuration could not be applied: {exc}")
            return
        self._system_prompt = prompt
        self._model_key = message.model_key
        if provider is not None:
            self._provider = provider
            self._context.limits = provider_limits(provider)
            self._context.forget_calibration()  # another model counts otherwise: measured again
            if self._record is not None:
                self._record.provider_position = None  # a new model: a script starts from its beginning
        if self._turn is turn:
            self._step(first=True)

    def _take_queue(self, turn: _Turn) -> None:
        for prompt in self._queue:
            turn.futures.append(prompt.future)
            entry = self._append(Message(role="user", content=prompt.text, images=list(prompt.images)), turn.id)
            turn.prompts.append((entry.seq, entry.time))
            if prompt.key is not None:
                # In the same group as the user message: a repeat finds its turn once the prompt is in the store.
                self._enqueue_write("prompt_keys", f"{self._key}/{prompt.key}", PromptKey(turn_id=turn.id))
        self._queue.clear()

    def _tool_specs(self) -> list[ToolSpec]:
        specs = []
        for tool in self._registry.select(self._config.tool_filter):
            if tool.name == "sub_agent" and self._config.depth >= self._config.max_depth:
                continue  # past the depth limit the tool is not offered
            if tool.name == "debug_state" and not self._config.debug_state:
                continue
            specs.append(ToolSpec(tool.name, tool.description, dict(tool.parameters)))
        return specs

    def _step(self, *, first: bool = False) -> None:
        turn = self._turn
        assert turn is not None
        if turn.steps >= self._config.max_steps:
            self._end_turn(
                ok=False,
                error=f"the turn stopped after {self._config.max_steps} model calls (agent.max_steps)",
            )
            return
        store = self.system.store
        failure = store.write_failure or store.fenced_error(self._session_id)
        if not first and failure is not None:
            # The store cannot commit: stop here rather than pile up writes it cannot keep.
            self._end_turn(ok=False, error=_unsaved_error(failure))
            return
        turn.steps += 1
        position = getattr(self._provider, "position", None)
        if isinstance(position, int) and self._record is not None:
            # A scripted model spends its turn once called; a restart resumes after it.
            self._record.provider_position = position + 1
            self._persist_record()
        if first:
            # The prompt, the running turn (and a scripted model's position) are
            # committed before the model is first called: a crash from here on,
            # even a kill -9, always leaves a turn to report. Later steps' writes
            # are queued in the store, which outlives this actor; one commit per
            # turn start and one per turn end is what a turn costs.
            self._flush(lambda: self._call_model(turn) if self._turn is turn else None, self._unsaved_start(turn))
        else:
            self._call_model(turn)

    def _unsaved_start(self, turn: _Turn) -> Callable[[BaseException], None]:
        """What to do when a turn's start cannot be committed: end it, unstarted, with the store's error."""

        def failed(exc: BaseException) -> None:
            if self._turn is not turn:
                return
            # The model was not called: the record keeps the position it is really at.
            self._save_provider_position()
            self._end_turn(ok=False, error=_unsaved_error(exc))

        return failed

    def _call_model(self, turn: _Turn, *, compacted: bool = False) -> None:
        tools = self._tool_specs()
        context = self._context
        chars = context.request_chars(self._system_prompt, tools)
        # An estimate not anchored on a report is a guess (tool schemas a server may not count):
        # it never prunes or compacts on its own. The request is sent, and measured.
        over = context.calibrated and context.tokens_for(chars) > context.budget
        if self._compact_waiters or (self._config.context.auto and over):
            room = self._make_room(turn, tools, chars, compacted=compacted)
            if room is None:
                return  # a compaction runs; the step goes on when it ends
            chars = room
        context.sent_chars = chars
        context.sent_fixed = context.fixed_chars(self._system_prompt, tools)
        request = ModelRequest(
            model="",
            messages=list(context.messages),
            system=self._system_prompt,
            tools=tools,
        )
        self._gen += 1
        gen = self._gen
        self._set_state("streaming")
        self._publish(
            "agent.message_start",
            {"turn_id": turn.id, "step": turn.steps, "role": "assistant", "model": self._config.model},
        )
        self._stream_io = self.run_io(
            self._stream, gen, request, reply=lambda o: _ModelDone(gen, o), name=f"model {turn.id}.{turn.steps}"
        )

    async def _stream(self, gen: int, request: ModelRequest) -> None:
        provider = self._provider
        assert provider is not None
        ref = self.actor_ref
        async with contextlib.aclosing(provider.stream(request)) as events:
            async for event in events:
                # Only what _on_model_event handles becomes a message: argument
                # fragments (one per tool call) are in the Completed message.
                if isinstance(event, _HANDLED_EVENTS):
                    ref.tell(_ModelEvent(gen, event))

    def _on_model_event(self, event: Any) -> None:
        turn = self._turn
        if turn is None:
            return
        if isinstance(event, TextDelta):
            self._publish("agent.message_delta", {"turn_id": turn.id, "text": event.text})
        elif isinstance(event, ToolCallStarted):
            self._publish("agent.tool_call", {"turn_id": turn.id, "call_id": event.id, "tool": event.name})
        elif isinstance(event, Completed):
            self._on_completed(turn, event)

    def _sample(self, message: SampleModel) -> None:
        provider = self._provider
        if provider is None:
            message.reply.set_exception((RuntimeError, RuntimeError(f"{self.path} has no model yet"), None))
            return
        model = provider.model

        async def call() -> Completed:
            async with contextlib.aclosing(provider.stream(message.request)) as events:
                async for event in events:
                    if isinstance(event, Completed):
                        return event
            msg = f"the model {model} ended its answer without completing it"
            raise ProviderError(msg)

        def done(result: outcome.Outcome[Completed]) -> _Sampled:
            # Runs on the loop thread as the call ends, even if this agent ended meanwhile.
            if isinstance(result, outcome.Value):
                message.reply.set((model, result.value))
                return _Sampled(message.origin, result.value)
            assert isinstance(result, outcome.Error)
            message.reply.set_exception((type(result.error), result.error, result.error.__traceback__))
            return _Sampled(message.origin, None)

        self.run_io(call, reply=done, name=f"sampling for {message.origin}")

    def _on_sampled(self, message: _Sampled) -> None:
        self._save_provider_position()
        usage = message.completed.usage if message.completed is not None else Usage()
        if self._record is not None:
            self._record.usage = self._record.usage + usage
            self._persist_record()
        self._publish(
            "agent.sampled",
            {"origin": message.origin, "ok": message.completed is not None, "usage": msgspec.to_builtins(usage)},
        )

    def _on_completed(self, turn: _Turn, event: Completed) -> None:
        message = event.message
        self._context.calibrate(self._context.sent_chars, event.usage, self._context.sent_fixed)
        self._steps_since_compaction += 1
        self._save_provider_position()
        turn.usage = turn.usage + event.usage
        record = self._record
        assert record is not None
        record.usage = record.usage + event.usage
        kept = self._append(message, turn.id, usage=event.usage).message
        self._publish(
            "agent.message_end",
            {
                "turn_id": turn.id,
                "step": turn.steps,
                "text": message.content,
                "tool_calls": [{"id": c.id, "name": c.name} for c in message.tool_calls],
                "stop_reason": event.stop_reason,
                "usage": msgspec.to_builtins(event.usage),
            },
        )
        if kept.content:
            turn.text = kept.content
        if not message.tool_calls:
            self._end_turn(ok=True)
            return
        batch = f"{turn.id}.{turn.steps}"
        turn.batch = batch
        turn.pending_calls = tuple(c.id for c in message.tool_calls)
        self._set_state("executing_tools")
        calls = tuple(ToolCallRequest(c.id, c.name, c.arguments, c.error) for c in message.tool_calls)
        runner = self.system.whereis(self._runner_path) if self._runner_path else None
        if runner is None:
            results = [
                Message(
                    role="tool",
                    content="the tool runner is not running (it may be restarting); try again shortly.",
                    tool_call_id=c.id,
                    name=c.name,
                    is_error=True,
                )
                for c in message.tool_calls
            ]
            self._after_tools(turn, results)
            return
        runner.tell(
            RunTools(
                batch,
                calls,
                self.snapshot(messages=50),
                self.actor_ref,
                agent_id=self._agent_id,
                agent_path=self.path,
                depth=self._config.depth,
                tool_filter=self._allowed_filter(),
                config=self._runner_config,
                max_output_bytes=self._output_limit(len(calls)),
            )
        )

    def _allowed_filter(self) -> tuple[str, ...] | None:
        hidden = []
        if self._config.depth >= self._config.max_depth:
            hidden.append("!sub_agent")
        if not self._config.debug_state:
            hidden.append("!debug_state")
        base = self._config.tool_filter if self._config.tool_filter is not None else ("*",)
        return (*base, *hidden)

    def _on_model_done(self, result: outcome.Outcome[None]) -> None:
        self._stream_io = None
        turn = self._turn
        if turn is None or not isinstance(result, outcome.Error):
            return
        self._save_provider_position()
        error = result.error
        text = redact_text(str(error)) if isinstance(error, ProviderError) else redact_text(repr(error))
        if isinstance(error, ContextLengthExceeded) and not turn.overflowed:
            self._retry_after_overflow(turn, error, text)
            return
        self._publish("agent.error", {"turn_id": turn.id, "error": text, "kind": type(error).__name__})
        if isinstance(error, ContextLengthExceeded):
            context = self._context
            context.learn_overflow(context.sent_chars, error.limit, error.requested, context.sent_fixed)
            again = "compacted and sent again" if turn.overflowed == "compacted" else "pruned and sent again"
            text += f" (the step was {again}, and it still does not fit: {self._does_not_fit(turn)})"
            self._end_turn(ok=False, error=text, context_failure=True)
            return
        self._end_turn(ok=False, error=text)

    def _on_tool_results(self, results: ToolResults) -> None:
        turn = self._turn
        if turn is None or results.batch_id != turn.batch:
            return  # a batch we stopped waiting for (aborted)
        messages = [
            Message(
                role="tool",
                content=o.result.text(),
                tool_call_id=o.call_id,
                name=o.name,
                is_error=not o.result.ok,
                images=[Image(image.mime_type, image.data) for image in o.result.images],
            )
            for o in results.outcomes
        ]
        self._after_tools(turn, messages)

    def _after_tools(self, turn: _Turn, results: list[Message]) -> None:
        for message in results:
            self._append(message, turn.id)
        turn.batch = None
        turn.pending_calls = ()
        if self._queue:
            self._publish("agent.steering", {"turn_id": turn.id, "prompts": len(self._queue)})
            self._take_queue(turn)
        self._step()

    def _end_turn(
        self,
        *,
        ok: bool,
        error: str | None = None,
        aborted: bool = False,
        interrupted: bool = False,
        context_failure: bool = False,
    ) -> None:
        turn = self._turn
        assert turn is not None
        if context_failure:
            self._repair_context(turn)
        self._turn = None
        status = "aborted" if aborted else "interrupted" if interrupted else ("done" if ok else "error")
        self._write_turn(turn, status, error=error)
        self._persist_record()
        result = TurnResult(
            turn_id=turn.id,
            ok=ok,
            text=turn.text,
            usage=turn.usage,
            steps=turn.steps,
            error=error,
            aborted=aborted,
            interrupted=interrupted,
        )
        futures = list(turn.futures)
        entry = (futures, result)
        self._unacknowledged.append(entry)
        self._set_state("idle")

        def acknowledge(final: TurnResult = result) -> None:
            # Everything the turn wrote is committed: now the result may be seen.
            with contextlib.suppress(ValueError):
                self._unacknowledged.remove(entry)
            for future in futures:
                with contextlib.suppress(Exception):
                    future.set(final)
            self._publish(
                "agent.turn_end",
                {
                    "turn_id": turn.id,
                    "ok": final.ok,
                    "status": status if final is result else "error",
                    "steps": turn.steps,
                    "error": final.error,
                    "usage": msgspec.to_builtins(turn.usage),
                },
            )
            if self._turn is None:
                self._arm_idle()

        def unsaved(exc: BaseException) -> None:
            # Not committed: the turn is not acknowledged as it ended, but as
            # failed, naming the cause; its record says so once it lands.
            final = _unsaved(result, exc)
            if status != "error" or error != final.error:
                with contextlib.suppress(StoreError):
                    self._write_turn(turn, "error", error=final.error)
            self._publish("agent.error", {"turn_id": turn.id, "error": final.error, "kind": type(exc).__name__})
            acknowledge(final)

        self._flush(acknowledge, unsaved)
        if self._queue and not (aborted or interrupted):
            self._start_turn()
        elif self._compact_waiters:
            self._compact_between_turns()  # asked for during the turn, which ended before another model call

    def _repair_context(self, turn: _Turn) -> None:
        """After a turn that failed because its request did not fit: make the next one fit.

        The turn's prompts that got no answer leave the context (they stay in
        the history, marked), and its tool results are pruned (``recall``
        reads them back): a prompt that came before is never stuck behind
        the one that did not fit.
        """
        dangling = self._dangling_prompts(turn)
        times = dict(turn.prompts)
        reason = "its turn failed: the request did not fit the model's context window"
        for seq, message in zip(dangling, self._context.leave_out(list(dangling)), strict=True):
            entry = HistoryEntry(seq=seq, turn_id=turn.id, time=times[seq], message=message, left_out=reason)
            self._enqueue_write("history", f"{self._key}/{seq:08d}", entry)
        tools = self._tool_specs()
        self._prune(turn, tools, self._context.request_chars(self._system_prompt, tools), how="all")

    def _abort_turn(self, reason: str, *, interrupted: bool = False) -> None:
        turn = self._turn
        self._gen += 1  # events still in flight from the cancelled stream are ignored
        if self._stream_io is not None:
            self._stream_io.cancel()
            self._stream_io = None
        self._cancel_compactions(reason)
        for question_id, question in list(self._questions.items()):
            with contextlib.suppress(Exception):
                question.reply.set_exception(
                    (RuntimeError, RuntimeError(f"the question was withdrawn: {reason}"), None)
                )
            self._questions.pop(question_id, None)
        queued = list(self._queue)
        self._queue.clear()
        if turn is not None:
            if turn.batch is not None:
                runner = self.system.whereis(self._runner_path) if self._runner_path else None
                if runner is not None:
                    with contextlib.suppress(Exception):
                        runner.proxy().abort(turn.batch)
                history = self._context.messages
                last = history[-1] if history else None
                calls = last.tool_calls if last is not None and last.role == "assistant" else []
                answer = f"[interrupted] {reason}" if interrupted else "[aborted]"
                for call in calls:
                    self._append(
                        Message(role="tool", content=answer, tool_call_id=call.id, name=call.name, is_error=True),
                        turn.id,
                    )
                turn.batch = None
                turn.pending_calls = ()
            turn.futures.extend(p.future for p in queued)
            self._publish("agent.aborted", {"turn_id": turn.id, "reason": reason, "interrupted": interrupted})
            self._end_turn(ok=False, error=reason, aborted=not interrupted, interrupted=interrupted)
        else:
            for prompt in queued:
                with contextlib.suppress(Exception):
                    prompt.future.set(TurnResult("", False, "", Usage(), 0, error=reason, aborted=True))
        self._set_state("idle")

    # -- questions ---------------------------------------------------------------------------------

    def _on_ask(self, ask: AskUser) -> None:
        if self._parent_agent is not None and self._parent_agent.is_alive():
            # A sub-agent's question goes up to its parent, and on up to the top.
            self._parent_agent.tell(ask)
            return
        question_id = ask.question_id or uuid.uuid4().hex[:12]
        self._questions[question_id] = ask
        asked: dict[str, Any] = {
            "question_id": question_id,
            "session_id": self._session_id,
            "question": ask.question,
            "choices": list(ask.choices),
            "asked_by": ask.asked_by,
        }
        if ask.schema is not None:
            asked["schema"] = dict(ask.schema)
        if ask.origin is not None:
            asked["origin"] = ask.origin
        self._publish("question.asked", asked)
        self._refresh_waiting()

    def _on_withdraw(self, withdraw: WithdrawQuestion) -> None:
        question = self._questions.pop(withdraw.question_id, None)
        if question is None:
            if self._parent_agent is not None and self._parent_agent.is_alive():
                self._parent_agent.tell(withdraw)  # a sub-agent's question lives at the top
            return
        with contextlib.suppress(Exception):
            question.reply.set_exception(
                (RuntimeError, RuntimeError(f"the question was withdrawn: {withdraw.reason}"), None)
            )
        # "answered" so that whoever lists open questions (the daemon) drops it.
        self._publish(
            "question.answered", {"question_id": withdraw.question_id, "withdrawn": True, "reason": withdraw.reason}
        )
        self._refresh_waiting()

    def _refresh_waiting(self) -> None:
        if self._state in ("executing_tools", "waiting"):
            self._set_state("waiting" if (self._questions or self._permissions) else "executing_tools")

    # -- persistence ----------------------------------------------------------------------------------

    def _append(
        self, message: Message, turn_id: str, *, left_out: str | None = None, usage: Usage | None = None
    ) -> HistoryEntry:
        """Add a message to the history (in the store, and in the context unless ``left_out`` says why not).

        Known secrets are cut out first (a key the model or a tool output
        repeats): histories, turn results and the store never hold one.
        ``usage`` is the model call's, for an assistant message.

        Returns:
            The entry stored, with the message as kept.
        """
        message = _redacted(message)
        record = self._record
        assert record is not None
        seq = record.next_seq
        record.next_seq += 1
        if left_out is None:
            self._context.append(seq, message)
        entry = HistoryEntry(
            seq=seq, turn_id=turn_id, time=time.time(), message=message, left_out=left_out, usage=usage
        )
        self._enqueue_write("history", f"{self._key}/{seq:08d}", entry)
        return entry

    def _write_turn(self, turn: _Turn, status: str, *, error: str | None = None) -> None:
        record = TurnRecord(
            turn_id=turn.id,
            status=status,
            started=turn.started,
            ended=None if status == "running" else time.time(),
            steps=turn.steps,
            error=error,
            usage=turn.usage,
            text=turn.text,
        )
        self._enqueue_write("turns", f"{self._key}/{turn.id}", record)

    def _persist_record(self) -> None:
        record = self._record
        if record is not None:
            if self._provider is not None:  # loaded: the context's calibration is the agent's own
                record.calibration = self._context.calibration(self._config.model)
            self._enqueue_write("agents", self._key, msgspec.structs.replace(record))

    def _save_provider_position(self) -> None:
        position = getattr(self._provider, "position", None)
        if isinstance(position, int) and self._record is not None:
            self._record.provider_position = position

    def _enqueue_write(self, namespace: str, key: str, value: Any) -> None:
        # The store's committer commits it in a group; the queue outlives this actor. On a
        # database several nodes share, only while this node owns the session (the fence).
        self.system.store.enqueue_nowait(namespace, key, value, session=self._session_id)

    def _flush(self, then: Callable[[], None], failed: Callable[[BaseException], None]) -> None:
        """Run ``then`` in this actor's context once everything queued so far is committed.

        If the store cannot commit it (yet), ``failed`` runs instead, with the store's error.
        """
        token = next(self._flush_tokens)
        self._flush_waiters[token] = (then, failed)
        ref = self.actor_ref

        # Runs on the store's committer thread (or here, if it is done
        # already) and only sends this actor a message: no task of the loop
        # waits for the commit.
        def landed(future: Future[None]) -> None:
            try:
                future.get()
            except BaseException as exc:  # the store's error, for this actor to handle in its own context
                message: Any = _WriterFailed(token, exc)
            else:
                message = _Flushed(token)
            with contextlib.suppress(ActorDeadError):  # it ended meanwhile: its waiters are answered
                ref.tell(message)

        self.system.store.flush(self._session_id)._on_done(landed)

    async def _drain_writes(self) -> BaseException | None:
        """Wait until every write this agent queued is committed; returns why not, if not.

        Bounded: the store may be gone, or unable to commit for longer.
        """
        try:
            with trio.fail_after(10):
                await self.system.store.flush(self._session_id)
        except (StoreError, trio.TooSlowError) as exc:
            return exc
        return None

    # -- the context ------------------------------------------------------------------------------

    def _make_room(self, turn: _Turn, tools: list[ToolSpec], chars: int, *, compacted: bool) -> int | None:
        """Prune, then compact, until the next request fits; the request's characters, or None while compacting.

        Pruning goes first, down to the last step's results: a model call
        to summarize costs more than old outputs, which ``recall`` reads
        back. Two compactions never follow each other without a model step
        between them (an overflow may force the second, see
        `_retry_after_overflow`). A compaction asked for with ``compact()``
        runs here too, fitting or not.
        """
        context = self._context
        if context.tokens_for(chars) > context.budget:
            chars = self._prune(turn, tools, chars, how="steps")
        requested = bool(self._compact_waiters)
        over = context.tokens_for(chars) > context.budget
        if requested or (over and not compacted and self._steps_since_compaction > 0):
            waiters, self._compact_waiters = self._compact_waiters or [], None
            reason = "auto" if over else "manual"
            if self._start_compaction(reason, lambda result: self._after_compaction(turn, result), waiters):
                return None
        if context.tokens_for(chars) > context.budget:
            # Compacted already, or nothing to compact: the tool results of earlier steps go too.
            chars = self._prune(turn, tools, chars, how="last_step")
        return chars

    def _prune(self, turn: _Turn | None, tools: list[ToolSpec], chars: int, *, how: str) -> int:
        """Stub old tool results; returns the request's characters after.

        ``how``: ``"steps"``, those older than ``keep_tool_results`` steps,
        then the oldest steps' one step at a time while the request does not
        fit; ``"last_step"``, all but the last step's; ``"all"``, every one
        (a turn that failed).
        """
        context = self._context
        system = self._system_prompt
        before = context.tokens_for(chars)
        if how == "all":
            pruned = context.prune_all()
        elif how == "last_step":
            pruned = context.prune_all_but_last_step()
        else:
            pruned = context.prune()
            while context.tokens_for(context.request_chars(system, tools)) > context.budget:
                more = context.prune_step()
                if more is None:
                    break
                pruned += more
        record = self._record
        assert record is not None
        if record.pruned_before == context.pruned_before:
            return chars
        record.pruned_before = context.pruned_before
        self._persist_record()
        if not pruned:
            return chars
        chars = context.request_chars(system, tools)
        self._publish(
            "agent.pruned",
            {
                "turn_id": turn.id if turn else None,
                "tool_results": pruned,
                "tokens_before": before,
                "tokens_after": context.tokens_for(chars),
                "pruned_before": context.pruned_before,
            },
        )
        return chars

    def _retry_after_overflow(self, turn: _Turn, error: ContextLengthExceeded, text: str) -> None:
        """The server refused the step as too long: compact once (or prune) and send the step again.

        A prompt of the turn that cannot fit even alone, now that the server
        has said its sizes, ends the turn at once, as it would have been
        refused had they been known (see `prompt`).
        """
        turn.overflowed = "compacted"
        context = self._context
        context.learn_overflow(context.sent_chars, error.limit, error.requested, context.sent_fixed)
        self._publish(
            "agent.context_overflow",
            {"turn_id": turn.id, "error": text, "limit": error.limit, "requested": error.requested},
        )
        tools = self._tool_specs()
        for message in self._dangling_prompts(turn).values():
            refusal = self._refusal(message, tools)
            if refusal is not None:
                self._end_turn(ok=False, error=refusal, context_failure=True)
                return
        if not self._start_compaction("overflow", lambda result: self._after_compaction(turn, result), []):
            turn.overflowed = "pruned"
            self._prune(turn, tools, context.request_chars(self._system_prompt, tools), how="last_step")
            self._call_model(turn, compacted=True)

    def _after_compaction(self, turn: _Turn, result: CompactionResult) -> None:
        """A compaction before a step ended: make the step, or end the turn if it still cannot fit."""
        if self._turn is not turn:
            return  # aborted meanwhile
        context = self._context
        if not result.compacted:
            tools = self._tool_specs()
            chars = self._prune(turn, tools, context.request_chars(self._system_prompt, tools), how="last_step")
            if context.calibrated and context.tokens_for(chars) > context.budget:
                self._end_turn(ok=False, error=self._does_not_fit(turn, result.detail), context_failure=True)
                return
        self._call_model(turn, compacted=True)

    # -- what does not fit ----------------------------------------------------------------------------

    def _refusal(self, message: Message, tools: list[ToolSpec]) -> str | None:
        """Why a prompt cannot be sent even alone: it exceeds what the model takes after the system prompt and tools."""
        context = self._context
        tokens = context.message_tokens(message)
        room = context.room_for(self._system_prompt, tools)
        if tokens <= room or room <= 0:
            return None  # it fits; or nothing would, and the prompt is not the cause (see _does_not_fit)
        limits = context.limits
        return (
            f"the prompt is ~{tokens:,} tokens; this agent's model takes ~{max(0, room):,} after its system prompt "
            f"and tools (a window of {limits.context_window:,} tokens, {limits.output_reserve:,} of them kept for "
            "the answer): shorten it or send it in parts, or save it to a file and ask the agent to read it"
        )

    def _dangling_prompts(self, turn: _Turn) -> dict[int, Message]:
        """The turn's prompts still in the context with no model answer after them, by sequence number."""
        context = self._context
        answered = max(
            (seq for seq, m in zip(context.seqs, context.messages, strict=True) if m.role == "assistant"), default=-1
        )
        mine = {seq for seq, _ in turn.prompts if seq > answered}
        return {seq: m for seq, m in zip(context.seqs, context.messages, strict=True) if seq in mine}

    def _does_not_fit(self, turn: _Turn, detail: str | None = None) -> str:
        """Why the step's request does not fit the model's window, naming what is too large."""
        context = self._context
        tools = self._tool_specs()
        limits = context.limits
        budget = context.budget
        window = f"a window of {limits.context_window:,} tokens, {limits.output_reserve:,} of them kept for the answer"
        fixed = context.fixed_tokens(self._system_prompt, tools)
        if fixed is not None and fixed >= budget:
            cause = (
                f"the system prompt and the tools' descriptions alone take ~{fixed:,} tokens, more than the "
                f"~{budget:,} this agent's model takes ({window}): give the model a larger context window "
                "(context_window in weald.toml) or the agent fewer tools"
            )
        else:
            refusals = (self._refusal(m, tools) for m in self._dangling_prompts(turn).values())
            cause = next((r for r in refusals if r is not None), "")
            if not cause:
                tokens = context.estimate(self._system_prompt, tools)
                largest = max(
                    zip(context.seqs, context.messages, strict=True),
                    key=lambda pair: len(pair[1].content),
                    default=None,
                )
                what = ""
                if largest is not None:
                    seq, message = largest
                    source = f"the {message.name} output" if message.role == "tool" else f"the {message.role} message"
                    what = f"; its largest part is {source} at seq {seq} (~{context.message_tokens(message):,} tokens)"
                cause = (
                    f"the request does not fit the model's context window: ~{tokens:,} estimated tokens, "
                    f"~{budget:,} allowed ({window}){what}"
                )
        return f"{cause}; {detail}" if detail else cause

    def _output_limit(self, calls: int) -> int:
        """The most bytes each of ``calls`` tool results may bring, so that the next request can hold them.

        The room the context has for them (see `Context.output_room`), shared
        by the batch's results: nine tenths of it, as the estimate errs.
        """
        context = self._context
        room = context.output_room(self._system_prompt, self._tool_specs())
        share = room * 0.9 / max(1, calls) - _RESULT_FRAMING_TOKENS
        return max(_MIN_OUTPUT_BYTES, int(share * context.chars_per_token))

    def _compact_between_turns(self) -> None:
        waiters, self._compact_waiters = self._compact_waiters or [], None
        self._start_compaction("manual", self._after_idle_compaction, waiters)

    def _after_idle_compaction(self, _result: CompactionResult) -> None:
        self._set_state("idle")
        if self._queue and self._turn is None:
            self._start_turn()
        elif self._turn is None:
            self._arm_idle()  # idle again: the clock starts over

    def _start_compaction(
        self, reason: str, then: Callable[[CompactionResult], None], waiters: list[Future[CompactionResult]]
    ) -> bool:
        """Ask the model for a summary of the older part of the context; False when there is nothing to compact.

        ``then`` runs in this actor's context when the compaction ends
        (not when it is cancelled by an abort); ``waiters`` get the result
        once it is committed to the store.
        """
        context = self._context
        tools = self._tool_specs()
        before = context.estimate(self._system_prompt, tools)
        split = context.compaction_split()
        if split is None:
            result = CompactionResult(
                compacted=False,
                tokens_before=before,
                tokens_after=before,
                detail="nothing to compact: the context holds only its most recent step",
            )
            for waiter in waiters:
                with contextlib.suppress(Exception):
                    waiter.set(result)
            return False
        older = list(context.messages[:split])
        summarizer = Context(context.limits, context.config)
        summarizer.chars_per_token = context.chars_per_token
        for seq, message in zip(context.seqs[:split], older, strict=True):
            summarizer.append(seq, message)

        def request(limit: int | None) -> ModelRequest:
            return summarizer.compaction_request(len(older), model_chars=limit)

        self._gen += 1
        gen = self._gen
        compaction = _Compaction(gen, split, reason, before, then)
        compaction.waiters.extend(waiters)
        self._compaction = compaction
        self._set_state("compacting")
        turn = self._turn
        self._publish(
            "agent.compacting",
            {"turn_id": turn.id if turn else None, "reason": reason, "tokens_before": before, "messages": split},
        )
        initial = context.transcript_chars()
        self._stream_io = self.run_io(
            self._summarize, request, initial, reply=lambda o: _Summarized(gen, o), name=f"compaction {self._key}"
        )
        return True

    async def _summarize(self, request: Callable[[int | None], ModelRequest], limit: int) -> Completed:
        """Stream the summary; a summary request the server finds too long is sent again, shorter (twice at most)."""
        provider = self._provider
        assert provider is not None
        for attempt in range(3):
            completed = None
            try:
                async with contextlib.aclosing(provider.stream(request(limit))) as events:
                    async for event in events:
                        if isinstance(event, Completed):
                            completed = event
            except ContextLengthExceeded as exc:
                if attempt == 2:
                    raise
                ratio = (exc.limit / exc.requested) if exc.limit and exc.requested else 0.5
                limit = max(200, int(limit * min(0.5, ratio * 0.8)))
                continue
            if completed is None:
                msg = "the model's answer to the summary request ended without completing"
                raise ProviderError(msg)
            return completed
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _on_summarized(self, result: outcome.Outcome[Completed]) -> None:
        compaction = self._compaction
        assert compaction is not None
        self._compaction = None
        self._stream_io = None
        self._steps_since_compaction = 0  # an attempt, whatever its outcome: the next waits for a step
        turn = self._turn
        record = self._record
        assert record is not None
        context = self._context
        summary = ""
        failure = None
        if isinstance(result, outcome.Error):
            error = result.error
            failure = redact_text(str(error)) if isinstance(error, ProviderError) else redact_text(repr(error))
        else:
            completed = result.unwrap()
            record.usage = record.usage + completed.usage
            if turn is not None:
                turn.usage = turn.usage + completed.usage
            summary = completed.message.content.strip()
            if not summary:
                failure = "the model answered the summary request with no text"
        if failure is not None:
            failure = f"the summary request failed: {failure}"
        message = _redacted(summary_message(summary))
        tools = self._tool_specs()
        if failure is None:
            # A summary no smaller than what it replaces (a short conversation, a verbose model) is no use.
            fixed = context.fixed_chars(self._system_prompt, tools)
            before = context.tokens_for(context.chars + fixed)
            after = context.tokens_for(context.chars_after_compaction(compaction.split, message) + fixed)
            if after >= before:
                failure = f"compaction did not help: kept the original ({before:,} -> {after:,} estimated tokens)"
        if failure is not None:
            self._publish(
                "agent.compaction_failed",
                {"turn_id": turn.id if turn else None, "reason": compaction.reason, "error": failure},
            )
            outcome_ = CompactionResult(
                compacted=False,
                tokens_before=compaction.tokens_before,
                tokens_after=compaction.tokens_before,
                detail=failure,
            )
        else:
            first_kept = context.seqs[compaction.split]
            seq = record.next_seq
            record.next_seq += 1
            context.apply_compaction(compaction.split, seq, message)
            after = context.estimate(self._system_prompt, tools)
            mark = CompactionMark(
                first_kept=first_kept,
                replaced=compaction.split,
                tokens_before=compaction.tokens_before,
                tokens_after=after,
                reason=compaction.reason,
            )
            entry = HistoryEntry(
                seq=seq, turn_id=turn.id if turn else "", time=time.time(), message=message, compaction=mark
            )
            # The summary first, then the record that points at it: committed in this order.
            self._enqueue_write("history", f"{self._key}/{seq:08d}", entry)
            record.context_from = first_kept
            record.compactions = context.compactions
            self._persist_record()
            self._publish(
                "agent.compacted",
                {
                    "turn_id": turn.id if turn else None,
                    "reason": compaction.reason,
                    "tokens_before": compaction.tokens_before,
                    "tokens_after": after,
                    "replaced": compaction.split,
                    "first_kept": first_kept,
                    "summary_seq": seq,
                },
            )
            outcome_ = CompactionResult(
                compacted=True, tokens_before=compaction.tokens_before, tokens_after=after, replaced=compaction.split
            )
        waiters = compaction.waiters
        if waiters:

            def answer(result: CompactionResult = outcome_) -> None:
                for waiter in waiters:
                    with contextlib.suppress(Exception):
                        waiter.set(result)

            def unsaved(exc: BaseException) -> None:
                # The context is compacted; its summary is kept by the store and lands when it can write.
                answer(attrs.evolve(outcome_, detail=f"the summary could not be saved yet: {exc}"))

            self._flush(answer, unsaved)
        compaction.then(outcome_)

    def _cancel_compactions(self, reason: str) -> None:
        """Answer every compaction waiting or running as not done (an abort, a stop, a crash)."""
        waiters = list(self._compact_waiters or ())
        self._compact_waiters = None
        compaction = self._compaction
        if compaction is not None:
            self._compaction = None
            waiters.extend(compaction.waiters)
        if not waiters:
            return
        tokens = self._context.tokens_for(self._context.chars)
        result = CompactionResult(compacted=False, tokens_before=tokens, tokens_after=tokens, detail=reason)
        for waiter in waiters:
            with contextlib.suppress(Exception):
                waiter.set(result)

    # -- events ----------------------------------------------------------------------------------

    def _set_state(self, state: AgentStatus) -> None:
        if state != self._state:
            previous = self._state
            self._state = state
            self._publish("agent.state", {"from": previous, "to": state})

    def _publish(self, topic: str, data: Mapping[str, Any]) -> None:
        # The bus redacts secrets from every event, when the event is built:
        # `emit` builds it only once something wants it. Every payload is
        # made for its call and changed by no one afterwards, as `emit` needs.
        self.system.events.emit(topic, self.path, {"session_id": self._session_id, "agent_id": self._agent_id, **data})


def _unsaved_error(exc: BaseException) -> str:
    """A turn's error when its writes could not be committed: the store's reason, and what happens next."""
    if isinstance(exc, StoreFencedError):
        return (
            f"the turn's messages were refused by the store's fence (StoreFencedError): {exc}. Another node "
            "owns this session now; it is stopped here, and its history is the one the store holds"
        )
    return (
        f"the turn's messages could not be saved: {exc}. The agent keeps them and saves them "
        "as soon as the store can write again; prompt again then"
    )


def _unsaved(result: TurnResult, exc: BaseException) -> TurnResult:
    """``result`` as failed because its writes were not committed."""
    error = _unsaved_error(exc)
    if result.error and result.error != error:
        error = f"{result.error}; and {error}"
    return attrs.evolve(result, ok=False, error=error)
