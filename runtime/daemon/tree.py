"""The daemon: the whole supervision tree, sessions that survive restarts, and shutdown.

::

    /  root (one_for_one)                      started by ActorSystem
    ├── store      persistent KV (sqlitedict)
    ├── events     event bus
    ├── io         trio loop thread
    ├── mcp        one MCPConnection per configured server (one_for_one, backoff)
    ├── sessions   DynamicSupervisor: one session subtree per agent
    ├── metrics    the sampler: the daemon's counters every second, in fixed-size rings (``metrics.series``)
    ├── config     ConfigWatcher: each project's configuration kept current (``weald reload``, SIGHUP)
    ├── server     JSON-RPC front (Unix socket / stdio)
    └── http       the observer: a live web view (``[server] http``, ``weald serve --http``)

Shutting down (SIGTERM, SIGINT, ``daemon.stop``) goes: the server stops
accepting connections and new turns; running turns are aborted and prompts
waiting for a turn slot are answered as aborted; every pending
``agent.prompt`` gets its reply written to its client; then the tree stops
last-started first: the server (connections close, the socket is removed),
the sessions (each agent persists), MCP servers, then the loop, the bus and
the store. Sessions are stored when started and restored on the next start
(after a clean stop or a kill -9 alike); a turn that a kill -9 interrupted
is reported by its agent when it comes back.

One daemon owns a state directory: `Daemon.start` takes an exclusive
``flock`` on ``<store file>.lock`` beside it and holds it for the daemon's
life (the kernel releases it if the process dies, kill -9 included), so a
second daemon on the same state directory exits at once, naming the first
one's pid, instead of sharing the file and losing acknowledged writes.

With the store in PostgreSQL (``[store] url``, ``weald serve --store``)
several daemons, each with a state directory of its own, share one database
as nodes: each start joins it (``--node-id``; its epoch is the previous
start's + 1), claims the sessions it owned and those whose owner's lease ran
out (one ``UPDATE ... RETURNING``) and restores them; a new session is
claimed before it starts, a stopped one released. A session this node loses
(another node took it over, or this node's lease ran out) is stopped here at
once: its turn in flight ends with the fence's error (`StoreFencedError`),
nothing more of it is written, the daemon goes on (``daemon.session_fenced``).
When a lost lease comes back, the node restores what it can claim again.

Spill files (tool output saved for the model) go to ``[spill] dir``, one
directory per session, on this node's disk; their bookkeeping (bytes and
files per session and node) is in the store's ``spill`` namespace. A
session's directory and rows are removed when it is stopped
(``agent.stop``); at start, the rows of this node say which directories go
(those of sessions gone, or, on a cluster, owned elsewhere for longer than
``spill.retention``), and directories no row names and no active session
owns are removed once ``spill.retention`` has passed.

A session started with ``record`` (``weald run --record FILE``) records its
top-level agent's model calls into that file (`weald.runtime.llm.Recorder`),
and goes on recording into it when it is restored. With fault injection on,
an agent replaying a recording (``scripted:FILE``) does not stop where its
requests differ from the recorded ones, as a fault makes them do: each new
divergence is published as ``agent.replay_diverged`` and the recorded answer
is given.

``[limits]`` applies here and in the server: ``max_agents`` bounds the
top-level sessions alive at once (children of ``/sessions``; sub-agents are
not counted), ``max_concurrent_turns`` the top-level agents running turns
at once (`TurnGate`), ``max_message_bytes`` each JSON-RPC message.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import gc
import hashlib
import logging
import os
import re
import socket
import stat
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import attrs
import msgspec
import trio
from weald.runtime import (
    Actor,
    ActorDeadError,
    ActorSystem,
    Future,
    NodeLease,
    Ref,
    Store,
    StoreError,
    Stub,
    WealdError,
    environ_value,
    is_secret_name,
    make_private_dirs,
    redact,
    register_secret,
    restore_environ,
)
from weald.runtime.agents.agent import AgentConfig, AgentRecord, PromptKey, TurnRecord, TurnResult, TurnSettings
from weald.runtime.agents.context import ContextConfig
from weald.runtime.agents.session import (
    SessionConfig,
    agent_path,
    asleep_session_spec,
    session_shape,
    session_spec,
    valid_session_id,
)
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.daemon._config_convert import unstructure_config
from weald.runtime.daemon._config_load import (
    ProjectFiles,
    find_project_files,
    load_files,
    source_from_data,
    weald_home,
)
from weald.runtime.daemon._config_model import DAEMON_WIDE, parse_retention
from weald.runtime.daemon._editors import EditorBridges
from weald.runtime.daemon._gc import apply_collector_setting, restore_collector_setting
from weald.runtime.daemon._hygiene import SandboxReport, prepare_process, stop_leftovers
from weald.runtime.daemon._index import SessionIndex
from weald.runtime.daemon._projects import ProjectChange, ProjectConfig, Projects
from weald.runtime.daemon._retention import HistoryKeeper, RetentionJob
from weald.runtime.daemon._runlog import DaemonLog, PreviousRun
from weald.runtime.daemon._telemetry_settings import TelemetrySettings, telemetry_settings
from weald.runtime.daemon._tool_modules import load_tools
from weald.runtime.daemon._trust import (
    TRUST_NAMESPACE,
    TrustRecord,
    UntrustedConfigError,
    config_digest_blocking,
    enclosing_project_blocking,
)
from weald.runtime.daemon.config import CONFIG_ENV, Config, ConfigError, config_to_dict
from weald.runtime.daemon.metrics import Sampler
from weald.runtime.daemon.server import (
    SHUTDOWN_REASON,
    UNTRUSTED_CONFIG,
    ClusterPort,
    Server,
    SessionMCPServer,
    prepare_socket,
)
from weald.runtime.llm import Image, Provider, Recorder, RecordingError, ReplayDivergence, Usage, make_provider
from weald.supervisors import ChildExistsError, ChildSpec, DynamicSupervisor, MaxChildrenError
from weald.tools import (
    SPILL_NAMESPACE,
    SpillRow,
    ToolRegistry,
    default_registry,
    forget_spill,
    remove_spill_dir,
    session_spill,
    sweep_spill_dirs,
)
from weald.tools.mcp_sandbox import MCPSandbox, project_sandbox

__all__ = [
    "DEMO_MODEL",
    "SHUTDOWN_REASON",
    "Daemon",
    "DaemonError",
    "InvalidRequestError",
    "Roots",
    "SessionRecord",
    "Sessions",
    "TurnGate",
    "TurnGateStatistics",
    "demo_script_path",
    "lock_state_dir",
]

logger = logging.getLogger("weald.runtime")


class DaemonError(WealdError):
    """A daemon operation failed; the message says what to do."""


class InvalidRequestError(DaemonError, ValueError):
    """What a request asked for is wrong in itself (a relative path, a malformed id, an unknown model).

    The JSON-RPC server answers it -32602 (invalid params), naming the field;
    a request that is right but failed (an id in use, a directory that is not
    there) is a plain `DaemonError`, -32000.

    Attributes:
        field: the param at fault.
    """

    rpc_code = -32602

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UntrustedConfigDaemonError(DaemonError):
    """``agent.start`` of a directory whose project file is nested in another project and not trusted.

    The server answers it -32005, with ``data``: ``file``, ``sha256``,
    ``size``, ``project`` (the enclosing project), ``changed`` (trusted
    before, with other contents), ``directory``.
    """

    rpc_code = UNTRUSTED_CONFIG

    def __init__(self, error: UntrustedConfigError, directory: str) -> None:
        super().__init__(error.one_line(directory))
        self.data = {**error.data(), "directory": directory}


def demo_script_path(name: str = "default.json") -> Path:
    """A script bundled with weald (``weald/runtime/daemon/demo_scripts``)."""
    return Path(str(resources.files("weald.runtime.daemon") / "demo_scripts" / name))


DEMO_MODEL = "scripted:" + str(demo_script_path())
"""The model used when none is configured: a script that says it is scripted."""


class StoredConfigFile(msgspec.Struct, kw_only=True):
    """A configuration file a session was started under: its path, digest and layer (user or project)."""

    path: str
    digest: str
    layer: str


class SessionRecord(msgspec.Struct, kw_only=True):
    """A session as stored in the ``sessions`` namespace; restored on start while active.

    ``model`` is the model it was started with; with ``follows_default``
    (no model was asked for) the session follows its project's
    ``[models] default`` as it changes. ``project`` is the directory whose
    configuration it runs under when ``agent.start`` named one (else its
    working directory's); ``config_files`` the files it was started under.
    """

    session_id: str
    working_dir: str
    model: str
    tools: list[str] | None = None
    system_prompt: str | None = None
    created: float = 0.0
    status: str = "active"
    record: str | None = None
    mcp_servers: list[SessionMCPServer] | None = None
    project: str | None = None
    follows_default: bool = False
    config_files: list[StoredConfigFile] = msgspec.field(default_factory=list)
    # Started for one client's run: stopped when that client goes, never restored (reaped instead).
    ephemeral: bool = False
    title: str | None = None  # what it is for, in a line (``weald run`` gives its first prompt)

    @property
    def config_dir(self) -> str:
        """The directory its configuration is found from (`Projects`)."""
        return self.project or self.working_dir


@attrs.frozen
class TurnGateStatistics:
    """The turn gate's load.

    Attributes:
        limit: ``limits.max_concurrent_turns``; None: no limit.
        running: top-level agents holding a slot (running or about to run a turn).
        waiting: prompts waiting for a slot.
    """

    limit: int | None
    running: int
    waiting: int


class _WaitingPrompt:
    """A prompt the gate holds or has handed on; ``result`` is what ``agent.prompt`` replies."""

    __slots__ = ("agent_id", "images", "key", "result", "text")

    def __init__(self, agent_id: str, text: str, images: tuple[Image, ...] = (), key: str | None = None) -> None:
        self.agent_id = agent_id
        self.text = text
        self.images = images
        self.key = key
        self.result: Future[TurnResult] = Future()


class TurnGate:
    """Bounds how many top-level agents run turns at once (``limits.max_concurrent_turns``).

    An agent holds one slot from the moment the gate hands it a prompt
    until every prompt the gate handed it has its result. A prompt for an
    agent that holds a slot goes straight in: it steers the running turn or
    queues behind it inside the agent, as without a limit. Any other prompt
    takes a free slot or waits for one, first come first served; waiting
    prompts are never refused, and they do not depend on their client (one
    that disconnects loses nothing: the prompt runs when its slot comes).

    Sub-agents are prompted by their parent's ``sub_agent`` tool call, not
    through the gate: their turns run inside the top-level turn and its slot
    (so a parent waiting on its sub-agent can never deadlock on a slot).

    Threads: every method runs on the loop thread (RPC handlers). A turn's
    result may arrive on another thread (the store's committer answers a
    crashed agent's futures); freeing its slot is then handed to the loop
    with ``call_soon``, so the gate's state needs no lock.

    Args:
        system: the running system (its loop, registry and bus).
        limit: slots; None for no limit.
    """

    def __init__(self, system: ActorSystem, limit: int | None) -> None:
        self._system = system
        self._limit = limit
        self._holders: dict[str, int] = {}  # agent id -> prompts handed to it and not yet answered
        # Invariant: a prompt waits only while every slot is taken; the oldest goes first.
        self._waiting: deque[_WaitingPrompt] = deque()
        self._closed: str | None = None

    def submit_nowait(
        self, agent_id: str, text: str, images: tuple[Image, ...] = (), key: str | None = None
    ) -> Future[TurnResult]:
        """Hand ``text`` (and ``images``) to the agent now, or queue it for a slot; returns the turn's future.

        The future resolves with the `TurnResult` of the turn the prompt ran
        in; an aborted result when it was aborted (or dropped by
        `cancel_waiting_nowait` or `close_nowait`) before it ran; or
        `DaemonError` when its agent was gone by the time its slot came.
        """
        prompt = _WaitingPrompt(agent_id, text, images, key)
        if self._closed is not None:
            prompt.result.set(_aborted(self._closed))
        elif agent_id in self._holders or self._free():
            self._hand(prompt)
        else:
            self._waiting.append(prompt)
            self._system.events.publish(
                "daemon.turn_queued",
                f"/sessions/{agent_id}",
                {"agent_id": agent_id, "position": len(self._waiting), "limit": self._limit},
            )
        return prompt.result

    def cancel_waiting_nowait(self, agent_id: str, reason: str) -> int:
        """Answer the agent's waiting prompts as aborted with ``reason``; returns how many."""
        dropped = [p for p in self._waiting if p.agent_id == agent_id]
        if dropped:
            self._waiting = deque(p for p in self._waiting if p.agent_id != agent_id)
            for prompt in dropped:
                prompt.result.set(_aborted(reason))
        return len(dropped)

    def close_nowait(self, reason: str) -> None:
        """Answer every waiting prompt as aborted, and every later one at once (shutdown)."""
        self._closed = reason
        waiting, self._waiting = self._waiting, deque()
        for prompt in waiting:
            prompt.result.set(_aborted(reason))

    def statistics(self) -> TurnGateStatistics:
        """The limit, the slots held and the prompts waiting."""
        return TurnGateStatistics(limit=self._limit, running=len(self._holders), waiting=len(self._waiting))

    # -- slots -----------------------------------------------------------------------------

    def _free(self) -> bool:
        return self._limit is None or len(self._holders) < self._limit

    def _hand(self, prompt: _WaitingPrompt) -> None:
        """Give the prompt to its agent; its slot is held until the turn's result is in."""
        agent_id = prompt.agent_id
        ref = self._system.whereis(agent_path(agent_id))
        if ref is None:
            error = DaemonError(f"no running agent {agent_id!r} (it was stopped while its prompt waited)")
            prompt.result.set_exception((DaemonError, error, None))
            return
        try:
            call: Future[Future[TurnResult]] = ref.proxy().prompt(prompt.text, prompt.images, prompt.key)
        except Exception:  # ActorDeadError: whoever waits on the prompt learns why
            prompt.result.set_exception()
            return
        self._holders[agent_id] = self._holders.get(agent_id, 0) + 1
        if self._limit is not None:
            self._system.events.publish(
                "daemon.turn_admitted",
                f"/sessions/{agent_id}",
                {"agent_id": agent_id, "running": len(self._holders), "limit": self._limit},
            )
        call._on_done(lambda done: self._handed(prompt, done))

    def _handed(self, prompt: _WaitingPrompt, call: Future[Future[TurnResult]]) -> None:
        # Runs where the agent answered the call (the loop thread); must not block.
        try:
            turn = call.get()
        except Exception:
            prompt.result.set_exception()
            self._release_soon(prompt.agent_id)
            return
        turn._on_done(lambda done: self._answered(prompt, done))

    def _answered(self, prompt: _WaitingPrompt, turn: Future[TurnResult]) -> None:
        # Runs on the thread that ended the turn; the slot is freed on the loop.
        try:
            prompt.result.set(turn.get())
        except Exception:
            prompt.result.set_exception()
        self._release_soon(prompt.agent_id)

    def _release_soon(self, agent_id: str) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the loop has stopped: nothing waits any more
            self._system.loop.call_soon(self._release, agent_id)

    def _release(self, agent_id: str) -> None:
        # Runs outside any task (call_soon): an exception here would break the loop itself.
        try:
            self._release_and_admit(agent_id)
        except Exception:
            logger.exception("the turn gate failed to free the slot of %s", agent_id)

    def _release_and_admit(self, agent_id: str) -> None:
        left = self._holders.get(agent_id, 0) - 1
        if left > 0:
            self._holders[agent_id] = left
        else:
            self._holders.pop(agent_id, None)
        # The oldest waiting prompt goes next: into a free slot, or its agent's own.
        while self._waiting and (self._free() or self._waiting[0].agent_id in self._holders):
            self._hand(self._waiting.popleft())


_START_BATCH = 256  # sessions per start_children request
_ASLEEP_BATCH = 1024  # sessions per add_asleep request and store commit
_BATCHES_AT_ONCE = 2  # start_all calls (agents.start requests) worked on at once
_CHECKERS = 16  # tasks checking one start_all's starts
_RECORD_PAGE = 10_000  # records read at once by a pass over every session (restore, retention)
# Appended to a key: a key just above it that no other key lies between (session ids hold letters, digits,
# '_', '.' and '-'; keys below them add '/' or '.' and more); not NUL, which PostgreSQL refuses in text.
_ABOVE = "\x01"


def _copy_outcome(done: Future[TurnResult], into: Future[TurnResult]) -> None:
    try:
        into.set(done.get())
    except BaseException:  # the turn's own error, for whoever waits on the key
        into.set_exception()


def _aborted(reason: str) -> TurnResult:
    """The result of a prompt that never ran."""
    return TurnResult(turn_id="", ok=False, text="", usage=Usage(), steps=0, error=reason, aborted=True)


class Roots:
    """The working directories of the running top-level agents: the roots MCP servers are given.

    Updated by `Sessions` as agents start and stop (on the loop thread); when
    the set changes, the ``mcp`` supervisor tells every connected server
    (``notifications/roots/list_changed``) and they ask for `paths` again.
    """

    def __init__(self, system: ActorSystem) -> None:
        self._system = system
        self._dirs: dict[str, str] = {}  # session id -> working dir
        # Invariant: how many sessions of _dirs run in each directory (none at 0: the key goes).
        self._counts: dict[str, int] = {}

    def paths(self) -> list[str]:
        """The directories, sorted, each once."""
        return sorted(self._counts)

    def set_nowait(self, session_id: str, working_dir: str | None) -> None:
        """Note that a session runs in ``working_dir`` (None: it stopped); O(1), 10,000 sessions or one."""
        old = self._dirs.pop(session_id, None)
        if working_dir is not None:
            self._dirs[session_id] = working_dir
        if old == working_dir:
            return
        changed = False
        if old is not None:
            left = self._counts[old] - 1
            if left:
                self._counts[old] = left
            else:
                del self._counts[old]
                changed = True
        if working_dir is not None:
            count = self._counts.get(working_dir, 0)
            self._counts[working_dir] = count + 1
            changed = changed or count == 0
        mcp = self._system.whereis("/mcp") if changed else None
        if mcp is not None:
            with contextlib.suppress(ActorDeadError):
                mcp.proxy().roots_changed()


class Sessions:
    """Starts, stops, lists and restores sessions; used by the RPC methods (on the loop).

    Args:
        system: the running system.
        config: the daemon's configuration.
        registry: the tools (built-ins plus MCP tools as they register).
        supervisor: the ``/sessions`` DynamicSupervisor.
    """

    def __init__(
        self,
        system: ActorSystem,
        config: Config,
        registry: ToolRegistry,
        supervisor: Ref[Any],
        *,
        faults: Any = None,
        roots: Roots | None = None,
        private_paths: tuple[str, ...] = (),
        projects: Projects | None = None,
        editors: EditorBridges | None = None,
    ) -> None:
        self.system = system
        self.config = config
        # The editors driving sessions through ACP, for the tools that go through them ([acp]).
        self.editors = editors if editors is not None else EditorBridges(system.loop)
        self.roots = roots if roots is not None else Roots(system)
        # Every active session's project and model, for pages of sessions (sessions.page).
        self.index = SessionIndex()
        # What no sandboxed command may see: the state directory, the socket, the config file.
        self.private_paths = private_paths
        # Each session's own configuration: its project's (the daemon's config is its base when built by hand).
        self.projects = projects if projects is not None else Projects(base=_base_source(config))
        # Tool calls see the faulting view when fault injection is on.
        self.registry = faults.wrap_registry(registry) if faults is not None else registry
        self._faults = faults
        self._supervisor = supervisor
        self._proxy = supervisor.proxy()
        self.gate = TurnGate(system, config.limits.max_concurrent_turns)
        # Touched only on the loop thread (RPC handlers and their tasks).
        self._starts: list[tuple[Any, Future[Ref[Any]]]] = []
        self._starting = False
        self._sleepers: list[tuple[SessionRecord, AgentRecord, ChildSpec, Future[None]]] = []
        self._batches = trio.Semaphore(_BATCHES_AT_ONCE)  # agents.start requests worked on at once
        self._adding = False
        self._resolving: dict[str, Future[str]] = {}
        # Prompts with an idempotency key in flight: (agent id, key) -> what the prompt replies.
        self._keyed: dict[tuple[str, str], Future[TurnResult]] = {}
        self._models_checked: set[tuple[int, str]] = set()
        self._session_dirs: dict[str, str] = {}  # session id -> the configuration directory it holds
        self._home_skills: tuple[float, str | None] = (-1e9, None)  # (looked at, <weald home>/skills if a directory)
        self._weald_home = weald_home()
        # One frozen value per project configuration (generation), shared by its sessions.
        self._per_generation: dict[int, tuple[RunnerConfig, ContextConfig]] = {}
        self._turn_settings: dict[tuple[int, str | None, tuple[str, ...] | None, str | None], TurnSettings] = {}
        self._project_mcp: dict[int, tuple[Any, ...]] = {}  # generation -> the project's own MCP servers
        self._spill_dir = str(self.spill_root)
        # Sessions being handed to another node (a drain): requests for them are refused as not this node's.
        self.leaving: set[str] = set()
        self._claims = trio.Lock()  # `_claim`
        self._rebuilding: set[str] = set()  # sessions waiting to be idle to go to sleep (`_rebuild_when_idle`)

    # -- configuration -----------------------------------------------------------------

    def provider_factory(self, model: str, directory: str | None = None) -> Provider:
        """Build the provider for ``model`` (an alias, ``provider:model``, or the demo).

        Names resolve under the configuration of ``directory`` (a session's
        `SessionRecord.config_dir`, acquired), as it stands when called; None: the daemon's.
        With fault injection on, the provider consults the injector before each call.
        Blocking (a script is read from its file): call it from a worker thread.
        """
        config = self.config if directory is None else self.projects.current(directory).config
        choice = config.resolve_model(model)
        spec, settings = (DEMO_MODEL, None) if choice is None else (choice.spec, choice.settings)
        if self._faults is not None:
            build = self._faults.wrap_provider_factory(lambda s: make_provider(s, settings))
            provider: Provider = build(spec)
            return provider
        return make_provider(spec, settings)

    def config_of(self, session_id: str) -> Config:
        """The configuration a running session is under now (its project's), else the daemon's; no I/O, on the loop."""
        directory = self._session_dirs.get(session_id)
        if directory is None or not self.projects.known(directory):
            return self.config
        return self.projects.current(directory).config

    def default_model(self, project: ProjectConfig | None = None) -> str:
        """The configured default model (of ``project``, else the daemon's), or the bundled demo script."""
        config = self.config if project is None else project.config
        return config.models.default or DEMO_MODEL

    def _per_project(self, project: ProjectConfig) -> tuple[RunnerConfig, ContextConfig]:
        """The tool runner's and the context's configuration of ``project``: made once per generation."""
        made = self._per_generation.get(project.generation)
        if made is None:
            if len(self._per_generation) >= 1024:
                self._per_generation.clear()
            config = project.config
            tools = config.tools
            runner = RunnerConfig(
                timeouts=dict(tools.timeouts),
                permissions=dict(tools.permissions),
                permission_timeout=tools.permission_timeout,
                tool_config=attrs.evolve(
                    tools.to_tool_config(),
                    private_paths=self.private_paths,
                    protected_paths=self._protected_paths(project),
                    editor_files=config.acp.files == "editor",
                    editor_terminal=config.acp.terminal == "editor",
                ),
                spill=self.config.spill.to_limits(),  # daemon-wide: the daemon's disk
            )
            made = self._per_generation[project.generation] = (runner, config.context.to_context_config())
        return made

    def _protected_paths(self, project: ProjectConfig) -> tuple[str, ...]:
        """What no agent of ``project`` may write besides its working directory's ``weald.toml`` and ``.weald``.

        The files its configuration was read from, its project directory's
        own ``weald.toml`` and ``.weald`` (above the working directory, they
        matter where ``[tools.shell] writable`` reaches them), and the files
        its configuration and the daemon's read: ``[mcp] import`` files and
        the faults file.
        """
        paths = [file.path for file in project.files]
        if project.root is not None:
            paths += [str(Path(project.root) / "weald.toml"), str(Path(project.root) / ".weald")]
        for config in (project.config, self.config):
            paths.extend(str(path) for path in config.mcp.imports)
            if config.faults.file is not None:
                paths.append(str(config.faults.file))
        return tuple(dict.fromkeys(paths))

    def turn_settings(self, project: ProjectConfig, record: SessionRecord) -> TurnSettings:
        """What a session's turns run under with ``project``'s configuration: its parameters over the project's."""
        model = None if record.follows_default else record.model
        tools = tuple(record.tools) if record.tools is not None else None
        key = (project.generation, model, tools, record.system_prompt)
        settings = self._turn_settings.get(key)
        if settings is not None:
            return settings
        config = project.config
        agent = config.agent
        runner, context = self._per_project(project)
        model = model or self.default_model(project)
        settings = TurnSettings(
            generation=project.generation,
            agent=AgentConfig(
                model=model,
                system_prompt=record.system_prompt if record.system_prompt is not None else agent.system_prompt,
                tool_filter=tools if tools is not None else tuple(config.tools.enabled),
                max_steps=agent.max_steps,
                max_depth=agent.sub_agent_depth,
                debug_state=agent.debug_state,
                sub_agent_timeout=agent.sub_agent_timeout,
                context=context,
            ),
            runner=runner,
            model_key=config.resolve_model(model),
        )
        if len(self._turn_settings) >= 4096:
            self._turn_settings.clear()
        self._turn_settings[key] = settings
        return settings

    def runner_config(self) -> RunnerConfig:
        """The tool runner configuration of the daemon's own ``[tools]`` (sessions use their project's)."""
        project = ProjectConfig(key=(), root=None, files=(), config=self.config, generation=0)
        return self._per_project(project)[0]

    @property
    def spill_root(self) -> Path:
        """The directory holding one spill directory per session (``[spill] dir``)."""
        return self.config.spill.root(self.system.store_path)

    def session_config(self, record: SessionRecord) -> SessionConfig:
        """The full configuration of a stored session, from its project's configuration as it stands.

        No I/O: the session's `SessionRecord.config_dir` must be acquired (`Projects.acquire`).

        Raises:
            KeyError: it is not.
        """
        project = self.projects.current(record.config_dir)
        live = self.turn_settings(project, record)
        checked, home_skills = self._home_skills
        if time.monotonic() - checked > 5.0:  # one look per 5 s, not one per session
            found = self._weald_home / "skills"
            home_skills = str(found) if found.is_dir() else None
            self._home_skills = (time.monotonic(), home_skills)
        root = project.root or record.working_dir
        return SessionConfig(
            session_id=record.session_id,
            working_dir=record.working_dir,
            agent=live.agent,
            runner=live.runner,
            # Skills in ~/.weald/skills may be read by file tools too.
            allowed_dirs=(home_skills,) if home_skills is not None else (),
            output_dir=f"{self._spill_dir}/{record.session_id}",
            hibernate_after=self.config.limits.hibernate_after or None,  # 0: never
            mcp_servers=self.session_mcp(project, record),
            settings=_SessionSettings(self, record),
            skill_dirs=(f"{root}/.weald/skills", str(self._weald_home / "skills")),
            editor=self.editors.current,
        )

    def project_mcp(self, project: ProjectConfig) -> tuple[Any, ...]:
        """The MCP servers of ``project``'s configuration that the daemon does not host itself (no I/O).

        A server the daemon's own files name alike is the daemon's (offered to
        every session); any other enabled server of the project's files runs
        for each of the project's sessions, under the session's ``mcp``
        supervisor. Made once per configuration generation.
        """
        made = self._project_mcp.get(project.generation)
        if made is None:
            hosted = self.config.mcp.servers
            own = {
                name: server
                for name, server in project.config.mcp.servers.items()
                if server.enabled and hosted.get(name) != server
            }
            made = tuple(_mcp_configs(attrs.evolve(project.config, mcp=attrs.evolve(project.config.mcp, servers=own))))
            if made:
                made = self._in_project(project, made)
            if len(self._project_mcp) >= 1024:
                self._project_mcp.clear()
            self._project_mcp[project.generation] = made
        return made

    def _in_project(self, project: ProjectConfig, servers: tuple[Any, ...]) -> tuple[Any, ...]:
        """``project``'s stdio servers in its OS sandbox (`_mcp_sandbox`), run in its directory without a ``cwd``."""
        base = project.root
        sandbox = self._mcp_sandbox(project)
        made = []
        for server in servers:
            if server.command is not None:
                cwd = server.cwd if server.cwd is not None or base is None else base
                server = attrs.evolve(server, cwd=cwd, launcher=sandbox)  # noqa: PLW2901
            made.append(server)
        return tuple(made)

    def _mcp_sandbox(self, project: ProjectConfig) -> MCPSandbox | None:
        """The OS sandbox ``project``'s own stdio servers run in: its shell commands' (None: ``sandbox = "off"``).

        The project's directory writable but its protected paths, the rest
        read-only, the credential homes and the daemon's state hidden, a
        cache directory of the project's own in the state directory, the
        network unless ``[mcp] network = false`` (`weald.tools.mcp_sandbox`).
        """
        tool_config = self._per_project(project)[0].tool_config
        state = self.system.store_path.parent
        tool_config = attrs.evolve(tool_config, private_paths=(*tool_config.private_paths, str(state)))
        base = project.root
        cache = state / "mcp-cache" / hashlib.sha256(os.fsencode(base or "")).hexdigest()[:16]
        return project_sandbox(tool_config, base, str(cache), network=project.config.mcp.network)

    def session_mcp(self, project: ProjectConfig, record: SessionRecord) -> tuple[Any, ...]:
        """A session's own MCP servers: its project's (`project_mcp`), then agent.start's (which win a name)."""
        given = _session_mcp_configs(record.mcp_servers or ())
        if not given:
            return self.project_mcp(project)
        names = {config.name for config in given}
        return (*(config for config in self.project_mcp(project) if config.name not in names), *given)

    async def prepare_mcp(self, projects: Sequence[ProjectConfig]) -> None:
        """Load the MCP SDK (in a worker thread) if any of ``projects`` has servers of its own, before their specs."""
        if any(self.project_mcp(project) for project in projects):
            from weald.runtime.mcp._actor import load_connection_modules

            await trio.to_thread.run_sync(load_connection_modules)

    async def apply_mcp_changes(self, directories: Sequence[str]) -> list[str]:
        """Bring the awake sessions of ``directories`` to their project's MCP servers now; returns their ids.

        A session with an ``mcp`` supervisor gets the new set
        (`MCPSupervisor.update_servers`); one without it is put to sleep once
        idle (at once if it is; after its turn if not), and its next message
        builds it with them. A session asleep builds with them anyway when it wakes.
        """
        touched: list[str] = []
        wanted = set(directories)
        for session_id, directory in list(self._session_dirs.items()):
            if directory not in wanted or not self.projects.known(directory):
                continue
            ref = self.system.whereis(f"/sessions/{session_id}")
            if ref is None or (isinstance(ref, Stub) and ref.successor is None):
                continue  # asleep (or gone): it wakes with the new servers
            record = await self.stored(session_id)
            if record is None:
                continue
            servers = self.session_mcp(self.projects.current(directory), record)
            mcp = self.system.whereis(f"/sessions/{session_id}/mcp")
            with contextlib.suppress(Exception):  # it stopped meanwhile: nothing to bring up to date
                if mcp is not None and not isinstance(mcp, Stub):
                    done = await mcp.proxy().update_servers(servers)
                    if any(done.values()):
                        touched.append(session_id)
                elif servers:
                    touched.append(session_id)
                    self._rebuild_when_idle(session_id)
        return touched

    def _rebuild_when_idle(self, session_id: str) -> None:
        """Put a session to sleep as soon as it is idle, so that its next message builds it anew (with MCP servers).

        Never sooner: a turn, a question or a permission request in flight is
        not cut short (`Agent.hibernate_now` declines while busy); asked again
        every second until it sleeps, stops, or is asleep already.
        """
        if session_id in self._rebuilding:
            return
        self._rebuilding.add(session_id)

        async def when_idle() -> None:
            try:
                while True:
                    agent = self.system.whereis(agent_path(session_id))
                    if agent is None or isinstance(agent, Stub):
                        return  # stopped, or asleep: it wakes with its project's servers
                    try:
                        if await (await agent.proxy().hibernate_now()):
                            return
                    except ActorDeadError:
                        return
                    await trio.sleep(1.0)
            finally:
                self._rebuilding.discard(session_id)

        self.system.loop.spawn_nowait(when_idle)

    @property
    def start_asleep(self) -> bool:
        """Whether a start adds its session asleep unless told otherwise: when hibernation is on.

        A new session is as idle as one can be; with ``limits.hibernate_after``
        set it would go to sleep anyway, so it starts there (measured: a start
        costs 0.24-0.33 ms instead of 0.64-1.38 and 6 KiB instead of 29; its
        first prompt 0.6-0.9 ms more, the wake). With hibernation off (0) nothing
        sleeps, and a start builds the session at once.
        """
        return bool(self.config.limits.hibernate_after)

    # -- operations ------------------------------------------------------------------------

    async def start(
        self,
        working_dir: str,
        *,
        model: str | None = None,
        tools: list[str] | None = None,
        system_prompt: str | None = None,
        agent_id: str | None = None,
        record: str | None = None,
        asleep: bool = False,
        mcp_servers: Sequence[SessionMCPServer] | None = None,
        project: str | None = None,
        ephemeral: bool = False,
        title: str | None = None,
        trust_config: bool = False,
    ) -> str:
        """Store and start a new session; returns its agent id.

        Asleep (``asleep``), the session is added as a hibernated one would
        be: every check below is made and its record committed before the
        answer, but no actor is built; the first message to any of its
        paths (a prompt, ``debug_state``) starts it, as it wakes a
        hibernated session. A session that records its model calls
        (``record``) always starts at once: its recording begins now.

        Args:
            working_dir: the project directory (absolute).
            model: an alias or ``provider:model``; default: the configured one.
            tools: the tool filter; default: ``[tools] enabled``.
            system_prompt: the agent's system prompt; default: ``[agent]``'s.
            agent_id: the id; default: a new one.
            record: a file to record the agent's model calls into (relative:
                to ``working_dir``); it is replaced by the new recording.
            asleep: add the session hibernated, its actors built by its first message.
            mcp_servers: MCP servers of this session alone, run under its
                ``mcp`` supervisor (the session then starts awake).
            project: the directory whose configuration the session runs under
                (absolute); default: the working directory's (its project is
                the nearest directory at or above it with ``weald.toml`` or ``.weald/``).
            ephemeral: the session belongs to one client's run; a daemon that finds it active when it starts
                stops it (``daemon.reaped``) instead of restoring it.
            title: a line saying what the agent is for, shown by ``agent.list``.
            trust_config: trust the project's configuration file if it is nested and
                not trusted (`trust_file`), as ``weald trust`` would, then start.

        Raises:
            InvalidRequestError: a relative working dir or project, a malformed or empty id, a model that
                cannot be used.
            UntrustedConfigDaemonError: the project's configuration file is nested in another project
                and not trusted (or changed since it was), and ``trust_config`` is not set.
            DaemonError: a working dir or project that is not a directory, a project configuration with
                errors, a bad recording file, an id in use, a recording file another agent records into,
                or too many agents.
        """
        session = await self._checked(
            working_dir,
            model=model,
            tools=tools,
            system_prompt=system_prompt,
            agent_id=agent_id,
            record=record,
            mcp_servers=mcp_servers,
            project=project,
            ephemeral=ephemeral,
            title=title,
            trust_config=trust_config,
        )
        try:
            if asleep and session.record is None and not self._own_mcp(session):
                await self._queue_asleep(session)
            elif self._own_mcp(session):
                await self._start_with_mcp(session)
            else:
                await self._start_awake(session)
        except BaseException:
            self.projects.release_nowait(session.config_dir)
            raise
        self._configured_nowait(session)
        return session.session_id

    def _own_mcp(self, session: SessionRecord) -> tuple[Any, ...]:
        """The MCP servers a checked new session runs as its own (its project's, agent.start's); no I/O."""
        return self.session_mcp(self.projects.current(session.config_dir), session)

    async def _start_with_mcp(self, session: SessionRecord) -> None:
        """Start a session with MCP servers of its own; answered once each is connected or has failed.

        So the session's first prompt finds their tools (an editor prompts at
        once). A server that fails is reported (``mcp.disconnected``) and
        retried under the session's ``mcp`` supervisor; the session runs
        without its tools meanwhile.
        """
        servers = self._own_mcp(session)
        assert servers
        waiting = {server.name for server in servers}
        deadline = max(servers, key=lambda c: c.connect_timeout).connect_timeout
        topics = ["mcp.connected", "mcp.disconnected"]
        with self.system.events.subscribe(topics, source=f"/sessions/{session.session_id}/mcp", max_buffer=256) as sub:
            await self._start_awake(session)
            with trio.move_on_after(deadline + 5.0):
                async for event in sub:
                    waiting.discard(event.data.get("server", ""))
                    if not waiting:
                        break

    async def start_all(self, starts: Sequence[Mapping[str, Any]]) -> list[str | Exception]:
        """Start each of ``starts`` (`start`'s keyword arguments) as `start` would, together.

        Every start is checked first, all at once; then the sessions to
        start asleep are added in the order given (when ``limits.max_agents``
        is reached, the later ones are refused), while those to start awake
        start together.

        Returns:
            For each, in order: its agent id, or the exception `start` would have raised.
        """
        # One batch at a time (the next one's checks overlap this one's commit): a client sending a
        # thousand batches at once must not have a million checks suspended together, whose memory
        # the daemon would keep (measured: 7.4 KiB a session asleep, 20 batches of 1,000 at once).
        async with self._batches:
            return await self._start_all(starts)

    async def _start_all(self, starts: Sequence[Mapping[str, Any]]) -> list[str | Exception]:
        checked: list[SessionRecord | Exception] = [DaemonError("not checked")] * len(starts)
        todo = iter(enumerate(starts))

        async def check() -> None:
            # A few workers, not a task per start: most checks never wait (a directory, a model checked).
            for index, options in todo:
                options = {key: value for key, value in options.items() if key != "asleep"}  # noqa: PLW2901
                try:
                    checked[index] = await self._checked(**options)
                except Exception as exc:
                    checked[index] = exc

        async with trio.open_nursery() as nursery:
            for _ in range(min(_CHECKERS, len(starts))):
                nursery.start_soon(check)
        out: list[str | Exception] = [DaemonError("not started")] * len(starts)

        async def awake(index: int, session: SessionRecord) -> None:
            try:
                await self._start_awake(session)
            except Exception as exc:
                self.projects.release_nowait(session.config_dir)
                out[index] = exc
            else:
                self._configured_nowait(session)
                out[index] = session.session_id

        added: list[tuple[int, str, Future[None]]] = []
        async with trio.open_nursery() as nursery:
            for index, (options, session) in enumerate(zip(starts, checked, strict=True)):
                if isinstance(session, Exception):
                    out[index] = session
                elif options.get("asleep") and session.record is None and not self._own_mcp(session):
                    # Queued here, in order (no checkpoint between two): admitted in this order.
                    added.append((index, session.session_id, self._queue_asleep(session)))
                else:
                    nursery.start_soon(awake, index, session)
            for index, session_id, future in added:  # one batch: they are answered together
                try:
                    await future
                except Exception as exc:
                    session = checked[index]
                    assert isinstance(session, SessionRecord)
                    self.projects.release_nowait(session.config_dir)
                    out[index] = exc
                else:
                    self._configured_nowait(checked[index])  # type: ignore[arg-type]
                    out[index] = session_id
        return out

    def _configured_nowait(self, session: SessionRecord) -> None:
        """Note the configuration directory a started session holds (`Projects.acquire`), released at its stop."""
        previous = self._session_dirs.get(session.session_id)
        if previous is not None:  # started again without a stop (a restore): one hold is enough
            self.projects.release_nowait(previous)
        self._session_dirs[session.session_id] = session.config_dir

    async def _checked(
        self,
        working_dir: str,
        *,
        model: str | None = None,
        tools: list[str] | None = None,
        system_prompt: str | None = None,
        agent_id: str | None = None,
        record: str | None = None,
        mcp_servers: Sequence[SessionMCPServer] | None = None,
        project: str | None = None,
        ephemeral: bool = False,
        title: str | None = None,
        trust_config: bool = False,
    ) -> SessionRecord:
        """The record of a new session once everything `start` checks is checked (see there).

        On success the session's configuration directory is acquired (`Projects.acquire`):
        whoever does not start the session releases it.
        """
        if mcp_servers:
            try:
                await trio.to_thread.run_sync(_prepare_session_mcp, mcp_servers)
            except ValueError as exc:  # MCPConfigError: no transport, or both, or a name twice
                raise InvalidRequestError("mcp_servers", f"mcp_servers: {exc}") from exc
        if agent_id is not None and not valid_session_id(agent_id):
            what = "an empty agent_id" if agent_id == "" else f"{agent_id!r}"
            msg = (
                f"{what} is not an agent id: use 1-64 letters, digits, '_', '.' or '-' (first a letter or "
                "digit), or leave agent_id out to have one made up"
            )
            raise InvalidRequestError("agent_id", msg)
        # Interned, as the model below: a million sessions of a few projects and models share their strings.
        resolved = sys.intern(await self._resolve(working_dir))
        project_dir = None if project is None else sys.intern(await self._resolve(project, field="project"))
        recording = None
        if record is not None:
            recording = await trio.to_thread.run_sync(_recording_path, record, resolved)
            await self._check_recording_free(recording)
        session_id = agent_id or "a" + uuid.uuid4().hex[:10]
        config_dir = project_dir or resolved
        try:
            try:
                configured = await self.projects.acquire(config_dir)
            except UntrustedConfigError as exc:
                if not trust_config:
                    raise UntrustedConfigDaemonError(exc, config_dir) from exc
                await self.trust_file(exc.file, exc.sha256)
                configured = await self.projects.acquire(config_dir)
        except UntrustedConfigError as exc:  # changed between its trust and the start
            raise UntrustedConfigDaemonError(exc, config_dir) from exc
        except ConfigError as exc:
            where = f"the project of {config_dir}" if project_dir is None else f"the project {config_dir}"
            msg = f"{where} has a configuration weald cannot use; fix it and start the agent again:\n{exc}"
            raise DaemonError(msg) from exc
        self.projects.trust.note_dirs(resolved, project_dir)  # a project file below them is nested from now on
        chosen = sys.intern(model or self.default_model(configured))
        try:
            await self.prepare_mcp([configured])
            # Building the provider may read a file (a script): not on the loop.
            # A model checked already needs no thread hop (10,000 starts, one model).
            if (configured.generation, chosen) not in self._models_checked:
                await trio.to_thread.run_sync(self._check_model, chosen, config_dir, configured.generation)
        except BaseException:
            self.projects.release_nowait(config_dir)
            raise
        if self.system.whereis(f"/sessions/{session_id}") is not None:
            self.projects.release_nowait(config_dir)
            msg = f"an agent {session_id!r} is already running; stop it first or choose another agent_id"
            raise DaemonError(msg)
        return SessionRecord(
            session_id=session_id,
            working_dir=resolved,
            model=chosen,
            tools=tools,
            system_prompt=system_prompt,
            created=time.time(),
            record=recording,
            mcp_servers=list(mcp_servers) if mcp_servers else None,
            project=project_dir,
            follows_default=model is None,
            config_files=[
                StoredConfigFile(path=file.path, digest=file.digest, layer=file.layer) for file in configured.files
            ],
            ephemeral=ephemeral,
            title=title,
        )

    async def _start_awake(self, session: SessionRecord) -> None:
        """Start a checked new session now and commit its record (see `start`)."""
        # Started first, recorded after: a session refused (limits.max_agents) or
        # failed leaves no record behind, and a stopped session's record is
        # replaced only once its successor runs. The record is committed with
        # the agent's own first writes (one flush) before the start is answered.
        await self._claim_new([session.session_id], refuse=True)
        await self._launch(session, new=True)
        store = self.system.store
        store.enqueue_nowait("sessions", session.session_id, session, session=session.session_id)
        await store.flush(session.session_id)

    async def _claim_new(self, session_ids: list[str], *, refuse: bool = False) -> set[str]:
        """Claim new sessions for this node (a database several nodes share); returns those claimed.

        With ``refuse``, one not claimed raises `DaemonError`: it runs on another live node.
        """
        store = self.system.store
        if not store.fences:
            return set(session_ids)
        claimed = set(await trio.to_thread.run_sync(store.claim, session_ids))
        if refuse and len(claimed) < len(session_ids):
            taken = next(s for s in session_ids if s not in claimed)
            raise DaemonError(_taken(taken))
        return claimed

    async def _resolve(self, working_dir: str, *, field: str = "working_dir") -> str:
        """`_resolve_working_dir` in a worker thread, one look per directory for concurrent starts."""
        pending = self._resolving.get(f"{field}:{working_dir}")
        if pending is None:
            pending = self._resolving[f"{field}:{working_dir}"] = Future()

            async def look() -> None:
                try:
                    pending.set(await trio.to_thread.run_sync(_resolve_working_dir, working_dir, field))
                except BaseException:
                    pending.set_exception()
                finally:
                    self._resolving.pop(f"{field}:{working_dir}", None)

            self.system.loop.spawn_nowait(look)
        resolved: str = await pending
        return resolved

    def _check_model(self, model: str, directory: str, generation: int) -> None:
        if (generation, model) in self._models_checked:
            return
        try:
            self.provider_factory(model, directory)
        except Exception as exc:
            raise InvalidRequestError("model", f"cannot use model {model!r}: {exc}") from exc
        if len(self._models_checked) >= 256:
            self._models_checked.clear()
        self._models_checked.add((generation, model))

    async def _check_recording_free(self, path: str) -> None:
        records = await trio.to_thread.run_sync(self.records)
        for other in records:
            if other.record == path and other.status == "active":
                msg = (
                    f"agent {other.session_id!r} records into {path} already; choose another file "
                    "or stop that agent first"
                )
                raise DaemonError(msg)

    async def _recorder(self, record: SessionRecord, *, new: bool) -> Recorder:
        """The recorder of a session started with ``record``: a new recording, or the stored one continued."""
        assert record.record is not None
        options: dict[str, Any] = {"project_dir": record.working_dir, "redact": redact}
        if new:
            return Recorder(record.record, **options)
        try:
            return await trio.to_thread.run_sync(functools.partial(Recorder.resume, record.record, **options))
        except RecordingError as exc:
            msg = f"agent {record.session_id!r} cannot go on recording: {exc}"
            raise DaemonError(msg) from exc

    def _divergence_reporter(self, session_id: str) -> Callable[[ReplayDivergence], None]:
        """Publishes each place a replay diverges as ``agent.replay_diverged`` (fault injection is on)."""
        events = self.system.events
        source = agent_path(session_id)

        def report(divergence: ReplayDivergence) -> None:
            data = {
                "session_id": session_id,
                "agent_id": session_id,
                "step": divergence.step,
                "part": divergence.part,
                "message_index": divergence.message_index,
                "error": str(divergence),
            }
            events.publish("agent.replay_diverged", source, data)

        return report

    def _spec(
        self, record: SessionRecord, recorder: Recorder | None = None, config: SessionConfig | None = None
    ) -> ChildSpec:
        """The session's `ChildSpec` under ``/sessions`` (``config``: its `session_config`, made already).

        It can be made again from ``record`` (``ChildSpec.rebuild``): while
        the session sleeps, the supervisor keeps the record (and the
        recorder), not the spec with the configuration objects it holds.
        """
        return session_spec(
            config if config is not None else self.session_config(record),
            system=self.system,
            registry=self.registry,
            provider_factory=functools.partial(self.provider_factory, directory=record.config_dir),
            recorder=recorder,
            on_divergence=self._divergence_reporter(record.session_id) if self._faults is not None else None,
            rebuild=_SpecAgain(self, record, recorder),
        )

    def _asleep_spec(self, record: SessionRecord) -> ChildSpec:
        """The spec a session added asleep is kept by (`asleep_session_spec`): `_spec` is made at its wake."""
        return asleep_session_spec(record.session_id, _SpecAgain(self, record, None))

    async def _launch(self, record: SessionRecord, *, new: bool = False) -> Ref[Any]:
        recorder = await self._recorder(record, new=new) if record.record is not None else None
        spec = self._spec(record, recorder)
        # Starts are gathered and handed to the supervisor in batches
        # (start_children): each session's children then start together,
        # not one session per supervisor round (see `_start_batches`).
        result: Future[Ref[Any]] = Future()
        self._starts.append((spec, result))
        if not self._starting:
            self._starting = True
            self.system.loop.spawn_nowait(self._start_batches)
        ref: Ref[Any] = await result
        self.roots.set_nowait(record.session_id, record.working_dir)
        self.index.add(record.session_id, record.working_dir, record.model)
        return ref

    async def _start_batches(self) -> None:
        """Start the sessions queued by `_launch`, up to `_START_BATCH` per supervisor request."""
        try:
            await trio.lowlevel.checkpoint()  # let the other requests of this tick queue theirs
            while self._starts:
                batch, self._starts = self._starts[:_START_BATCH], self._starts[_START_BATCH:]
                # The cyclic collector waits while a batch is built: every object
                # it allocates lives on with its session, so the collections its
                # allocations would trigger (each a walk over every tracked
                # object of the daemon) find nothing to free. Measured: 45% of a
                # start with 3,000 sessions alive (benchmarks/README.md).
                paused = gc.isenabled()
                if paused:
                    gc.disable()
                try:
                    outcomes = await self._proxy.start_children([spec for spec, _ in batch])
                except BaseException as exc:
                    outcomes = [exc] * len(batch)
                finally:
                    if paused:
                        gc.enable()
                for (spec, result), outcome in zip(batch, outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        error = self._refusal(outcome, spec.id)
                        result.set_exception((type(error), error, error.__traceback__))
                    else:
                        result.set(outcome)
        finally:
            self._starting = False
            for _, result in self._starts:  # only if this task itself was cancelled (the loop stopped)
                with contextlib.suppress(Exception):
                    result.set_exception((DaemonError, DaemonError("the daemon is stopping"), None))
            self._starts = []

    def _queue_asleep(self, record: SessionRecord) -> Future[None]:
        """Queue a checked new session to be added hibernated; the future resolves once its records are committed.

        Adds are gathered like starts (`_add_batches`): one supervisor
        request and one store commit for all the sessions of a batch, in
        the order they were queued. The future fails with `DaemonError`
        when the id is in use, ``limits.max_agents`` is reached, or the
        daemon is stopping, and with `StoreError` when the records could
        not be committed.
        """
        # What the agent would write at its first start, as a cleanly stopped
        # agent leaves it: a restore (clean stop or kill -9) adds the session
        # asleep again, and tree and agent.list read its restarts from it.
        stored = AgentRecord.fresh(
            self.turn_settings(self.projects.current(record.config_dir), record).agent,
            key=record.session_id,
            session_id=record.session_id,
            agent_id=record.session_id,
            working_dir=record.working_dir,
            created=record.created,
        )
        stored.status = "stopped"
        stored.run_id = self.system.run_id
        result: Future[None] = Future()
        self._sleepers.append((record, stored, self._asleep_spec(record), result))
        if not self._adding:
            self._adding = True
            self.system.loop.spawn_nowait(self._add_batches)
        return result

    async def _add_batches(self) -> None:
        """Add the sessions queued by `_queue_asleep`: each batch one supervisor request, one commit.

        A batch takes whatever was queued meanwhile (up to `_ASLEEP_BATCH`):
        while one batch's commit is awaited, the next gathers.
        """
        try:
            await trio.lowlevel.checkpoint()  # let the other requests of this tick queue theirs
            while self._sleepers:
                batch, self._sleepers = self._sleepers[:_ASLEEP_BATCH], self._sleepers[_ASLEEP_BATCH:]
                await self._add_batch(batch)
        finally:
            self._adding = False
            for *_, result in self._sleepers:  # only if this task itself was cancelled (the loop stopped)
                with contextlib.suppress(Exception):
                    result.set_exception((DaemonError, DaemonError("the daemon is stopping"), None))
            self._sleepers = []

    async def _add_batch(self, batch: list[tuple[SessionRecord, AgentRecord, ChildSpec, Future[None]]]) -> None:
        try:
            claimed = await self._claim_new([record.session_id for record, *_ in batch])
        except Exception:  # the database failed: nothing of the batch starts
            for *_, result in batch:
                result.set_exception()
            return
        for record, *_, result in batch:
            if record.session_id not in claimed:
                result.set_exception((DaemonError, DaemonError(_taken(record.session_id)), None))
        batch = [entry for entry in batch if entry[0].session_id in claimed]
        if not batch:
            return
        try:
            outcomes: list[Any] = await self._proxy.add_asleep([spec for *_, spec, _ in batch], session_shape())
        except BaseException as exc:
            outcomes = [exc] * len(batch)
        store = self.system.store
        added: list[Future[None]] = []
        for (record, stored, _, result), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                error = self._refusal(outcome, record.session_id)
                result.set_exception((type(error), error, error.__traceback__))
                continue
            try:
                store.enqueue_nowait("sessions", record.session_id, record, session=record.session_id)
                store.enqueue_nowait("agents", record.session_id, stored, session=record.session_id)
            except Exception:
                # Not recorded: not kept either (a later restore would not know it).
                result.set_exception()
                with contextlib.suppress(Exception):
                    await self._proxy.stop_child(record.session_id)
                continue
            self.roots.set_nowait(record.session_id, record.working_dir)
            self.index.add(record.session_id, record.working_dir, record.model)
            added.append(result)
        if not added:
            return
        try:
            await store.flush()
        except Exception:  # not committed (a full disk): each start says so; the store keeps them to retry
            for result in added:
                result.set_exception()
            return
        except BaseException:  # cancelled: the loop stops
            for result in added:
                result.set_exception((DaemonError, DaemonError("the daemon is stopping"), None))
            raise
        for result in added:
            result.set(None)
        self.system.events.publish("daemon.sessions_added", "/sessions", {"sessions": len(added), "asleep": True})

    def _refusal(self, outcome: BaseException, session_id: str) -> BaseException:
        """What a start answers for the supervisor's refusal ``outcome``."""
        if isinstance(outcome, MaxChildrenError):
            limit = self.config.limits.max_agents
            msg = (
                f"the daemon already hosts its limit of {limit} agents (limits.max_agents counts "
                "the top-level agents running); stop one with agent.stop or raise the limit in weald.toml"
            )
        elif isinstance(outcome, ChildExistsError):
            msg = f"an agent {session_id!r} is already running; stop it first or choose another agent_id"
        else:
            return outcome
        error = DaemonError(msg)
        error.__cause__ = outcome
        return error

    async def wait_settled(self) -> None:
        """Wait until the ``/sessions`` supervisor has handled what was sent to it before (a wake, say)."""
        with contextlib.suppress(ActorDeadError):
            await self._proxy.statistics()

    async def stop(self, session_id: str) -> bool:
        """Stop a session for good (it is not restored); returns whether it ran.

        Its prompts waiting for a turn slot are answered as aborted; its
        running turn is aborted by the agent as it stops.
        """
        record = await self.system.store.aget("sessions", session_id, type=SessionRecord)
        if record is not None:
            record.status = "stopped"
            await self.system.store.aput("sessions", session_id, record)
        self.gate.cancel_waiting_nowait(session_id, "the agent was stopped")
        self.roots.set_nowait(session_id, None)
        # By id: a session that hibernates (or wakes) meanwhile has another ref than one looked up here.
        ran: bool = await self._proxy.stop_child(session_id)
        held = self._session_dirs.pop(session_id, None)
        if held is not None:
            self.projects.release_nowait(held)
        self.index.remove(session_id)
        self.system.events.publish("daemon.session_stopped", "/sessions", {"session_id": session_id, "ran": ran})
        if record is not None:
            # Stopped for good: its saved tool outputs go with it (the directory, then its rows: a crash in
            # between leaves a row the next start's sweep acts on), and no node owns it any more.
            await trio.to_thread.run_sync(remove_spill_dir, self.spill_root / session_id)
            await trio.to_thread.run_sync(forget_spill, self.system.store, [session_id])
            if self.system.store.fences:
                await trio.to_thread.run_sync(self.system.store.release, [session_id])
        return ran

    async def stored(self, session_id: str) -> SessionRecord | None:
        """The stored record of a session, if any."""
        record: SessionRecord | None = await self.system.store.aget("sessions", session_id, type=SessionRecord)
        return record

    def config_state(self, record: SessionRecord, memo: dict[Any, dict[str, Any]] | None = None) -> dict[str, Any]:
        """Which configuration a session runs under, as plain data (``agent.list``, ``debug_state``).

        ``project`` is its project directory, ``files`` the files its next
        turn runs under (each with its digest and layer), ``generation``
        their configuration's, ``refused`` the problems of a newer text that
        could not be used, ``started_with`` the files it was started under.
        No I/O. With ``memo`` (one dict for one answer: ``agent.list`` of
        100,000 sessions of a few projects), sessions of the same directory
        and files share one dict, read-only from then on.
        """
        directory = self._session_dirs.get(record.session_id)
        key: Any = None
        if memo is not None:
            key = (directory, *((f.path, f.digest, f.layer) for f in record.config_files))
            state = memo.get(key)
            if state is not None:
                return state
        started = [msgspec.structs.asdict(file) for file in record.config_files]
        if directory is not None and self.projects.known(directory):
            state = {**self.projects.current(directory).describe(), "started_with": started}
        else:  # not running here: what it was started with
            state = {
                "project": None,
                "files": started,
                "generation": None,
                "refused": [],
                "ignored": [],
                "started_with": started,
            }
        if memo is not None:
            memo[key] = state
        return state

    async def drop(self, session_ids: Sequence[str], reason: str) -> int:
        """Stop sessions this node lost (the store's fence refused them): nothing more of them is written here.

        Their waiting prompts are answered as aborted with ``reason``; each is
        published as ``daemon.session_fenced``. The daemon goes on.

        Returns:
            How many of them ran here.
        """
        dropped = 0
        for session_id in session_ids:
            self.gate.cancel_waiting_nowait(session_id, reason)
            self.roots.set_nowait(session_id, None)
            ran = False
            with contextlib.suppress(Exception):  # gone meanwhile
                ran = bool(await self._proxy.stop_child(session_id))
            held = self._session_dirs.pop(session_id, None)
            if held is not None:
                self.projects.release_nowait(held)
            dropped += ran
            self.system.events.publish(
                "daemon.session_fenced",
                f"/sessions/{session_id}",
                {"agent_id": session_id, "ran": ran, "error": reason},
            )
        return dropped

    async def adopt(self, session_ids: Sequence[str]) -> list[str]:
        """Claim sessions for this node (orphans of a dead node, or handed to it) and add them; returns those adopted.

        Each is claimed in one statement (its epoch goes up: its previous
        owner's writes are refused from now on) unless another live node owns
        it, then restored as at a start: asleep when it was stopped cleanly
        (it wakes at its next message), else started to finish what it was doing.
        """
        store = self.system.store
        wanted = [s for s in dict.fromkeys(session_ids) if self.system.whereis(f"/sessions/{s}") is None]

        def claim_unheld() -> dict[str, int]:
            # One held already is being restored here: claimed again, its epoch would move under its writes.
            unheld = [s for s in wanted if not store.holds(s)]
            return store.claim(unheld) if unheld else {}

        claimed = await self._claim(claim_unheld) if wanted else {}
        if claimed:
            self.system.events.publish("daemon.sessions_adopted", "/sessions", {"sessions": sorted(claimed)})
            await self.restore(claimed=claimed)
        # Those claimed before (by this node's own look for orphans, say) run here, or are being restored here.
        here = [s for s in session_ids if s not in claimed and store.holds(s)]
        return here + [s for s in wanted if s in claimed and self.system.whereis(f"/sessions/{s}") is not None]

    async def claim_orphans(self) -> dict[str, int]:
        """Claim the sessions of nodes whose leases ran out; returns those claimed, to restore."""
        return await self._claim(self.system.store.claim_orphans)

    async def _claim(self, claim: Callable[[], dict[str, int]]) -> dict[str, int]:
        """Run one of this node's claims of sessions, one at a time (so a session is restored by one of them only)."""
        async with self._claims:
            return await trio.to_thread.run_sync(claim)

    async def hand_over(self, session_ids: Sequence[str], to: str, *, timeout: float = 300.0) -> dict[str, Any]:
        """Hand sessions to node ``to`` (a drain): each, once idle, stops here and its placement goes to ``to``.

        A session stops here only when idle (no turn, question, permission
        request or write in flight); a busy one is waited for, up to ``timeout``
        seconds, then left here (``busy``). Its writes are committed, then its
        placement row names ``to`` with its epoch + 1, in one statement: from
        then on this node can write nothing of it, and ``to`` restores it asleep
        when it adopts it (``cluster.adopt``). Requests for it meanwhile are
        refused as not this node's, so a front looks its owner up again.

        Returns:
            ``{"handed": [...], "busy": [...], "missing": [...]}``.
        """
        store = self.system.store
        deadline = trio.current_time() + timeout
        pending = list(dict.fromkeys(session_ids))
        missing = [s for s in pending if not store.holds(s)]
        pending = [s for s in pending if s not in missing]
        ready: list[str] = []
        while pending:
            waiting = []
            for session_id in pending:
                ref = self.system.whereis(f"/sessions/{session_id}")
                agent = self.system.whereis(agent_path(session_id))
                if ref is not None and not isinstance(ref, Stub) and agent is not None:
                    try:
                        idle = bool(await (await agent.proxy().hibernate_now()))
                    except ActorDeadError:
                        idle = True
                    if not idle:
                        waiting.append(session_id)
                        continue
                self.leaving.add(session_id)
                ready.append(session_id)
            pending = waiting
            if not pending or trio.current_time() >= deadline:
                break
            await trio.sleep(0.1)
        handed: list[str] = []
        try:
            for session_id in ready:
                self.gate.cancel_waiting_nowait(session_id, f"the session moved to node {to!r}; send it again")
                self.roots.set_nowait(session_id, None)
                with contextlib.suppress(Exception):  # gone meanwhile
                    await self._proxy.stop_child(session_id)
                held = self._session_dirs.pop(session_id, None)
                if held is not None:
                    self.projects.release_nowait(held)
                self.index.remove(session_id)
            if ready:
                await store.flush()
                handed = await trio.to_thread.run_sync(store.hand_over, ready, to)
        finally:
            self.leaving.difference_update(ready)
        if handed:
            self.system.events.publish("daemon.sessions_handed_over", "/sessions", {"sessions": handed, "to": to})
        lost = [s for s in ready if s not in handed]
        return {"handed": handed, "busy": pending, "missing": missing + lost}

    def sweep_spill(self) -> list[Path]:
        """Remove the spill directories (and rows) of sessions gone from this node; blocking.

        From this node's rows in the store (``spill``): a session that is
        stopped or no longer stored loses its directory and rows at once; on
        a cluster, an active session placed on another node loses them once
        its row is older than ``spill.retention``. A directory no kept row
        names (a crash before its row was committed, a store from before
        the rows) is removed as before: when no active session owns it and
        nothing in it changed for ``spill.retention``. On a store only one
        node uses at a time (sqlite), rows of other node names are stale
        (the node was renamed), and so are, on a shared database, rows of
        nodes it has never seen (a store migrated to it): they are deleted,
        their directories left to the pass over the disk.

        For the thread starting the daemon, before any session runs.

        Returns:
            The directories removed.
        """
        store = self.system.store
        node = store.node
        me = node.node_id if node is not None else None
        retention = self.config.spill.retention
        now = time.time()
        known = self._store_nodes() if store.fences else None
        doomed: list[str] = []
        mine: list[tuple[str, SpillRow]] = []
        for rows, bad in _pages(store, SPILL_NAMESPACE, SpillRow):  # a page at a time: only this node's are kept
            if bad:  # rows that cannot be decoded name nothing usable
                logger.warning("spill bookkeeping: %d rows cannot be decoded and are deleted", len(bad))
                doomed += [key for key, _ in bad]
            for key, row in rows:
                if me is None or row.node == me:
                    mine.append((key, row))
                elif not store.fences or (known is not None and row.node not in known):
                    doomed.append(key)  # a node renamed, or one that never joined this database (a migrated store)
        # Only the sessions with a spill directory or a row are asked after, a page of records at a time (a
        # million sessions, a few with saved outputs).
        try:
            names = {entry.name for entry in os.scandir(self.spill_root) if entry.is_dir(follow_symlinks=False)}
        except OSError:
            names = set()
        wanted = names | {row.session for _, row in mine}
        status: dict[str, str] = {}
        if wanted:
            for page in self.record_pages(type_=_RecordPlace):
                status.update((r.session_id, r.status) for r in page if r.session_id in wanted)
        active = {session for session, state in status.items() if state == "active"}
        elsewhere = self._placed_elsewhere(sorted({row.session for _, row in mine} & active), me)
        removed: list[Path] = []
        kept: set[str] = set()
        for key, row in mine:
            gone = row.session not in active
            if not gone and not (row.session in elsewhere and now - row.changed >= retention):
                kept.add(row.session)
                continue
            directory = Path(row.directory)
            # A row names its session's own directory; any other path (a damaged row) is not removed.
            if directory.name == row.session and directory.is_dir():
                remove_spill_dir(directory)
                removed.append(directory)
            doomed.append(key)
        if doomed:
            store.delete_many(SPILL_NAMESPACE, doomed)
        removed += sweep_spill_dirs(self.spill_root, active | kept, retention, now=now)
        if removed or doomed:
            self.system.events.publish(
                "daemon.spill_removed",
                "/sessions",
                {"directories": len(removed), "rows": len(doomed), "retention": retention},
            )
        return removed

    def _store_nodes(self) -> set[str] | None:
        """The nodes a shared database knows (joined once), or None if it cannot say."""
        nodes = getattr(self.system.store.backend, "nodes", None)
        if nodes is None:
            return None
        try:
            return {node["node_id"] for node in nodes()}
        except StoreError as exc:
            logger.warning("the spill sweep could not read the store's nodes: %s", exc)
            return None

    def _placed_elsewhere(self, session_ids: list[str], me: str | None) -> set[str]:
        """Those of ``session_ids`` the cluster's placement gives to another node (none unless the store fences)."""
        store = self.system.store
        placement = getattr(store.backend, "placement", None)
        if not session_ids or me is None or not store.fences or placement is None:
            return set()
        try:
            placed: dict[str, tuple[str | None, int, bool]] = placement(session_ids)
        except StoreError as exc:
            logger.warning("the spill sweep could not read the sessions' placement: %s", exc)
            return set()
        return {session for session, (owner, _, _) in placed.items() if owner != me}

    def spill_state(self, session_id: str) -> dict[str, Any]:
        """A session's spill bookkeeping from the store: bytes and files in all, and bytes per node (blocking)."""
        rows = session_spill(self.system.store, session_id)
        return {
            "bytes": sum(row.bytes for row in rows),
            "files": sum(row.files for row in rows),
            "nodes": {row.node: row.bytes for row in rows},
        }

    def spill_bytes(self) -> int:
        """The bytes of this node's spill files, from the store's rows, a page at a time (blocking)."""
        store = self.system.store
        me = store.node.node_id if store.node is not None else None
        return sum(
            row.bytes
            for rows, _ in _pages(store, SPILL_NAMESPACE, SpillRow)
            for _, row in rows
            if me is None or row.node == me
        )

    def listing_page(
        self, after: str | None, limit: int, *, stopped: bool, spill: bool, only: str | None = None
    ) -> tuple[list[SessionRecord], bool, dict[str, AgentRecord], dict[str, int]]:
        """A page of ``agent.list`` from the store: what costs the page, not every session (a worker thread).

        The records of up to ``limit`` sessions whose ids sort after ``after``
        (one key range of ``sessions``; ``stopped`` false skips stopped ones),
        whether more follow, the top-level agent records among them (one key
        range of ``agents``: a session's key is its id, its sub-agents' sort
        right after it, a session never woken has none), and with ``spill``
        each one's spill bytes on every node (one key range of ``spill``). A
        record that cannot be decoded is reported as `records` does; an agent
        record that cannot leaves its row without restarts and usage. ``only``:
        that session alone (its key, if stored), not a page.
        """
        store = self.system.store
        if only is not None:
            record = None
            with contextlib.suppress(StoreError):  # one that cannot be decoded is not listed
                record = store.get("sessions", only, type=SessionRecord)
            records = [record] if record is not None and (stopped or record.status != "stopped") else []
            more = False
        else:
            records, more = self._record_page(after, limit, stopped=stopped)
        if not records:
            return records, more, {}, {}
        first, last = records[0].session_id, records[-1].session_id
        ids = {record.session_id for record in records}
        try:
            found = store.items_range("agents", "", start=first, stop=last + _ABOVE, type=AgentRecord)
        except StoreError:  # one record that cannot be decoded: the others one by one
            found = []
            for session_id in ids:
                with contextlib.suppress(StoreError):
                    stored = store.get("agents", session_id, type=AgentRecord)  # a top-level key is its id
                    if stored is not None:
                        found.append((session_id, stored))
        agents = {key: record for key, record in found if key in ids}
        spilled: dict[str, int] = {}
        if spill:
            # Keys are <session>/<node>: the page's rows lie from "<first>/" to "<last>0" ('0' follows '/').
            with contextlib.suppress(StoreError):
                for _, row in store.items_range(SPILL_NAMESPACE, "", start=first + "/", stop=last + "0", type=SpillRow):
                    if row.session in ids:
                        spilled[row.session] = spilled.get(row.session, 0) + row.bytes
        return records, more, agents, spilled

    def _record_page(self, after: str | None, limit: int, *, stopped: bool) -> tuple[list[SessionRecord], bool]:
        """Up to ``limit`` session records whose ids sort after ``after`` (key ranges), and whether more follow."""
        store = self.system.store
        records: list[SessionRecord] = []
        start = "" if after is None else after + _ABOVE
        while len(records) <= limit:
            ask = limit + 1 - len(records)
            good, bad = store.scan_range("sessions", start=start, limit=ask, type=SessionRecord)
            for key, exc in bad:
                self.system.events.publish(
                    "daemon.bad_session_record", "/sessions", {"session_id": key, "error": str(exc)}
                )
            records += [record for _, record in good if stopped or record.status != "stopped"]
            if len(good) + len(bad) < ask:
                break
            start = max(good[-1][0] if good else "", bad[-1][0] if bad else "") + _ABOVE
        more = len(records) > limit
        del records[limit:]
        return records, more

    def record_pages(self, type_: Any = SessionRecord) -> Iterator[list[Any]]:
        """Every readable stored session (active and stopped), `_RECORD_PAGE` at a time, in key order (a worker thread).

        For the passes over every session (a restore, retention): a million
        are read a page of rows at a time, not all rows at once (measured:
        1.1 GiB held at once for a million). A record that cannot be decoded
        is skipped and reported as `records` does. ``type_``: a type that
        decodes only the fields a pass needs.
        """
        for good, bad in _pages(self.system.store, "sessions", type_):
            for key, exc in bad:
                self.system.events.publish(
                    "daemon.bad_session_record", "/sessions", {"session_id": key, "error": str(exc)}
                )
            if good:
                yield [record for _, record in good]

    # -- trust of nested project files (`_trust`) ---------------------------------------------------------

    def load_trust(self, *, session_dirs: bool) -> None:
        """Read the trust records, and with ``session_dirs`` every session's directories; blocking, at start.

        Without ``session_dirs`` the restore notes the directories, as it reads every record anyway.
        """
        book = self.projects.trust
        good, bad = self.system.store.scan(TRUST_NAMESPACE, type=TrustRecord)
        for key, exc in bad:
            logger.warning("trusted_configs: the record of %s cannot be decoded and is ignored: %s", key, exc)
        book.records.update(good)
        if session_dirs:
            for page in self.record_pages(type_=_RecordPlace):
                for record in page:
                    book.note_dirs(record.working_dir, record.project)

    async def trust_file(self, path: str, sha256: str | None = None) -> dict[str, Any]:
        """Trust a nested project configuration file (or ``.weald/`` directory) as it is now.

        Args:
            path: The file (absolute): a ``weald.toml`` or a ``.weald`` directory.
            sha256: The digest the user was shown; the file must still have it.

        Returns:
            The trust record as plain data, with ``nested`` (its enclosing project, or None).

        Raises:
            InvalidRequestError: not an absolute path to a ``weald.toml`` or ``.weald``.
            DaemonError: it cannot be read, or its digest is no longer ``sha256``.
        """
        real, digest, size, project = await trio.to_thread.run_sync(self._describe_config, path)
        if sha256 is not None and sha256.removeprefix("sha256:") != digest:
            msg = f"{real} changed since it was shown (sha256 {digest}, not {sha256}); review it again"
            raise DaemonError(msg)
        record = TrustRecord(path=real, sha256=digest, size=size, project=project, trusted_at=time.time())
        await self.system.store.aput(TRUST_NAMESPACE, real, record)
        self.projects.trust.records[real] = record
        self.system.events.publish("config.trusted", "/config", {"path": real, "sha256": digest})
        return {**msgspec.to_builtins(record), "nested": project}

    async def untrust_file(self, path: str) -> dict[str, Any]:
        """Forget the trust of a file; sessions started under it afterwards are refused (running ones keep it).

        Returns:
            The record removed, as plain data.

        Raises:
            DaemonError: it was not trusted.
        """
        real = await trio.to_thread.run_sync(os.path.realpath, path)
        record = self.projects.trust.records.pop(real, None)
        if record is None:
            raise DaemonError(f"{real} is not trusted (weald trust --list shows the trusted files)")
        await self.system.store.adelete(TRUST_NAMESPACE, real)
        self.system.events.publish("config.untrusted", "/config", {"path": real})
        return dict(msgspec.to_builtins(record))

    def trusted_files(self) -> list[dict[str, Any]]:
        """Every trust record, by path (no I/O)."""
        return [msgspec.to_builtins(record) for _, record in sorted(self.projects.trust.records.items())]

    def _describe_config(self, path: str) -> tuple[str, str, int, str | None]:
        """(real path, sha256, size, enclosing project or None) of a project file to trust (a worker thread)."""
        if not os.path.isabs(path):
            raise InvalidRequestError("path", f"{path!r} is not an absolute path")
        real = os.path.realpath(path)
        name = os.path.basename(real)
        if name not in ("weald.toml", ".weald"):
            raise InvalidRequestError("path", f"{real} is not a weald.toml or a .weald directory")
        try:
            digest, size = config_digest_blocking(real)
        except OSError as exc:
            raise DaemonError(f"cannot read {real}: {exc.strerror or exc}") from exc
        directory = os.path.dirname(real)
        projects = self.projects
        user = projects.user_file_blocking()
        project = enclosing_project_blocking(directory, str(projects.home), projects.trust.session_dirs, user)
        return real, digest, size, project

    def records(self) -> list[SessionRecord]:
        """Every readable stored session (active and stopped), in creation order.

        A record that cannot be decoded is skipped and reported
        (``daemon.bad_session_record``), never fatal: one damaged value must not
        keep every other session from being served.
        """
        good, bad = self.system.store.scan("sessions", type=SessionRecord)
        for key, exc in bad:
            self.system.events.publish("daemon.bad_session_record", "/sessions", {"session_id": key, "error": str(exc)})
        return [record for _, record in good]

    async def retention_plan(self) -> tuple[list[RetentionJob], list[str]]:
        """The sessions whose project keeps less than its whole history (``[history] retention``).

        Every stored session, active or stopped, under its project's
        configuration as it stands (read in a worker thread when no session
        of the project runs). In a cluster, only the sessions this node holds.

        Returns:
            The jobs, and the projects whose configuration could not be read (with why).
        """
        store = self.system.store

        def read() -> dict[str, list[str]]:
            # Only the ids, by directory, a page of records at a time: a million records are not held at once.
            by_directory: dict[str, list[str]] = {}
            for page in self.record_pages(type_=_RecordPlace):
                for record in page:
                    if store.node is None or store.holds(record.session_id):
                        by_directory.setdefault(record.project or record.working_dir, []).append(record.session_id)
            return by_directory

        by_directory = await trio.to_thread.run_sync(read)
        jobs: list[RetentionJob] = []
        problems: list[str] = []
        for directory, found in by_directory.items():
            try:
                if self.projects.known(directory):
                    project = self.projects.current(directory)
                else:
                    project = await self.projects.acquire(directory, use=False)
            except ConfigError as exc:
                problems.append(f"{directory}: its configuration has errors, its sessions were left as they are: {exc}")
                continue
            kind, count = parse_retention(project.config.history.retention)
            if kind != "all":
                jobs.extend(RetentionJob(session_id, kind, count) for session_id in found)
        return jobs, problems

    async def restore(
        self, on_progress: Callable[[int, int], None] | None = None, *, claimed: Collection[str] | None = None
    ) -> int:
        """Restore every stored active session that is not running; returns how many were.

        With hibernation on (``limits.hibernate_after``), a session whose
        agent was stopped cleanly (the daemon shut down with it idle or its
        turn aborted) comes back hibernated: a stub, started by its first
        message, as if it had gone to sleep. One the daemon left without
        stopping it (a ``kill -9``, a crash) may have a turn to mark
        interrupted and tool calls to answer: it starts at once, as does one
        that records its model calls.

        On a database several nodes share, only the sessions this node claims
        are restored: its own and orphans whose owner's lease ran out (one
        statement), or ``claimed``, sessions claimed already.
        """

        def read_active() -> list[SessionRecord]:
            # A page at a time, in creation order again (the order they were started, as the index keeps them);
            # the kept records share their directories' and models' strings (a million sessions, a few projects).
            active = []
            for page in self.record_pages():
                for record in page:
                    # Every session's directories, any state: a project file below one is nested (`_trust`).
                    self.projects.trust.note_dirs(record.working_dir, record.project)
                    if record.status == "active":
                        _share_strings(record)
                        active.append(record)
            active.sort(key=_created)
            return active

        records = await trio.to_thread.run_sync(read_active)
        store = self.system.store
        if store.fences:
            if claimed is None:
                claimed = await self._claim(functools.partial(store.claim, new_only=True))
            records = [r for r in records if r.session_id in claimed]
        for record in [r for r in records if r.ephemeral]:
            # The run that started it ended with the daemon (a crash, a kill): nobody is left to use it.
            await self.stop(record.session_id)
            reaped = {"agent_id": record.session_id, "reason": "the run that started it ended with the daemon"}
            self.system.events.publish("daemon.reaped", "/sessions", reaped)
        records = [r for r in records if not r.ephemeral]
        with_mcp = [server for r in records for server in r.mcp_servers or ()]
        if with_mcp:
            await trio.to_thread.run_sync(_prepare_session_mcp, with_mcp, False)
        todo = [r for r in records if self.system.whereis(f"/sessions/{r.session_id}") is None]
        asleep: list[SessionRecord] = []
        if self.config.limits.hibernate_after and todo:
            store = self.system.store

            def stopped_cleanly() -> set[str]:
                # The agents' records a page at a time, only their key and status decoded (not one read each).
                # The ids kept are the records' own strings, not the pages' keys (a million of them, short-lived).
                wanted = {record.session_id: record.session_id for record in todo}
                found: set[str] = set()
                for good, _ in _pages(store, "agents", _AgentStatus):  # one that cannot be decoded: not clean
                    found.update(wanted[key] for key, agent in good if agent.status == "stopped" and key in wanted)
                return found

            clean = await trio.to_thread.run_sync(stopped_cleanly)
            asleep = [r for r in todo if r.session_id in clean and r.record is None]
            todo = [r for r in todo if r.session_id not in clean or r.record is not None]
        unusable = await self._configure_all([r.config_dir for r in (*todo, *asleep)])
        for record in (*todo, *asleep):
            if record.config_dir in unusable:
                error = (
                    "its project's configuration has errors; fix it, then restart the daemon or start the agent "
                    f"again:\n{unusable[record.config_dir]}"
                )
                self.system.events.publish(
                    "daemon.restore_failed", "/sessions", {"session_id": record.session_id, "error": error}
                )
        todo = [r for r in todo if r.config_dir not in unusable]
        asleep = [r for r in asleep if r.config_dir not in unusable]
        hibernated = await self._restore_asleep(asleep)
        started = 0
        limiter = trio.CapacityLimiter(64)

        async def one(record: SessionRecord) -> None:
            nonlocal started
            async with limiter:
                try:
                    await self._launch(record)
                except Exception as exc:
                    self.system.events.publish(
                        "daemon.restore_failed", "/sessions", {"session_id": record.session_id, "error": str(exc)}
                    )
                    self.projects.release_nowait(record.config_dir)
                    return
                self._configured_nowait(record)
                started += 1
                if on_progress is not None:
                    on_progress(started, len(todo))

        async with trio.open_nursery() as nursery:
            for record in todo:
                nursery.start_soon(one, record)
        restored = started + hibernated
        data = {"sessions": restored, "of": len(todo) + len(asleep), "hibernated": hibernated}
        self.system.events.publish("daemon.restored", "/sessions", data)
        return restored

    async def _restore_asleep(self, records: list[SessionRecord]) -> int:
        """Add ``records``' sessions hibernated (started by their first message); returns how many were."""
        added = 0
        for first in range(0, len(records), _START_BATCH):
            batch = records[first : first + _START_BATCH]
            specs = [self._asleep_spec(record) for record in batch]
            outcomes = await self._proxy.add_asleep(specs, session_shape())
            for record, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    data = {"session_id": record.session_id, "error": str(outcome)}
                    self.system.events.publish("daemon.restore_failed", "/sessions", data)
                    self.projects.release_nowait(record.config_dir)
                    continue
                added += 1
                self._configured_nowait(record)
                self.roots.set_nowait(record.session_id, record.working_dir)
                self.index.add(record.session_id, record.working_dir, record.model)
        return added

    async def _configure_all(self, directories: list[str]) -> dict[str, str]:
        """Acquire each directory's configuration once per entry (one read per directory); returns those that failed.

        Returns:
            The directories whose configuration cannot be used, each with why (not acquired).
        """
        counts: dict[str, int] = {}
        for directory in directories:
            counts[directory] = counts.get(directory, 0) + 1
        failed: dict[str, str] = {}
        limiter = trio.CapacityLimiter(16)

        async def one(directory: str, count: int) -> None:
            async with limiter:
                try:
                    await self.prepare_mcp([await self.projects.acquire(directory)])
                except ConfigError as exc:
                    failed[directory] = str(exc)
                    return
                except Exception as exc:  # a directory gone since: its sessions say so
                    failed[directory] = f"cannot read it: {exc}"
                    return
            for _ in range(count - 1):
                self.projects.hold_nowait(directory)

        async with trio.open_nursery() as nursery:
            for directory, count in counts.items():
                nursery.start_soon(one, directory, count)
        return failed

    def prompt_nowait(self, agent_id: str, text: str, images: tuple[Image, ...] = ()) -> Future[TurnResult]:
        """Prompt a running top-level agent through the turn gate; returns the turn's future.

        Raises:
            DaemonError: no such agent is running.
        """
        self.agent(agent_id)
        return self.gate.submit_nowait(agent_id, text, images)

    async def prompt_once(
        self, agent_id: str, text: str, key: str, images: tuple[Image, ...] = ()
    ) -> Future[TurnResult]:
        """Prompt with an idempotency key: the same key runs one turn, however often it is sent.

        A repeat while the key's prompt is in flight (waiting for a slot or
        running) gets the same future; a repeat after its turn ended gets the
        recorded outcome (the key is committed with the prompt's user message,
        the outcome before it was acknowledged). A key whose turn never ended
        (its node died, or the agent crashed, during it) runs again, once, here.

        Raises:
            DaemonError: no such agent is running.
        """
        self.agent(agent_id)
        slot = (agent_id, key)
        pending = self._keyed.get(slot)
        if pending is not None:
            return pending
        # Registered before the first await: a repeat arriving meanwhile attaches to it.
        result: Future[TurnResult] = Future()
        self._keyed[slot] = result
        result._on_done(lambda _: self._keyed.pop(slot, None) if self._keyed.get(slot) is result else None)
        try:
            recorded = await self._recorded_turn(agent_id, key)
            if recorded is not None:
                result.set(recorded)
            else:
                turn = self.prompt_nowait_keyed(agent_id, text, images, key)
                turn._on_done(lambda done: _copy_outcome(done, result))
        except BaseException:
            result.set_exception()
            raise
        return result

    def prompt_nowait_keyed(self, agent_id: str, text: str, images: tuple[Image, ...], key: str) -> Future[TurnResult]:
        """`prompt_nowait` with the idempotency key handed to the agent (it records it with the prompt)."""
        self.agent(agent_id)
        return self.gate.submit_nowait(agent_id, text, images, key)

    async def _recorded_turn(self, agent_id: str, key: str) -> TurnResult | None:
        """The outcome of the turn a key's prompt joined, if that turn ended; None: run the prompt."""
        store = self.system.store

        def read() -> TurnResult | None:
            joined = store.get("prompt_keys", f"{agent_id}/{key}", type=PromptKey)
            if joined is None:
                return None
            turn = store.get("turns", f"{agent_id}/{joined.turn_id}", type=TurnRecord)
            if turn is None or turn.status in ("running", "interrupted"):
                return None  # it never ended: interrupted by a crash or a node's loss, it runs again
            return TurnResult(
                turn_id=turn.turn_id,
                ok=turn.status == "done",
                text=turn.text,
                usage=turn.usage,
                steps=turn.steps,
                error=turn.error,
                aborted=turn.status == "aborted",
            )

        return await trio.to_thread.run_sync(read)

    async def abort(self, agent_id: str, reason: str = "aborted") -> bool:
        """Abort the agent's running turn and drop its waiting prompts; returns whether there was any.

        Raises:
            DaemonError: no such agent is running.
        """
        ref = self.agent(agent_id)
        dropped = self.gate.cancel_waiting_nowait(agent_id, reason)
        if isinstance(ref, Stub) and ref.successor is None:
            return dropped > 0  # hibernated: no turn runs (and waking it to say so would be waste)
        aborted: bool = await ref.proxy().abort()
        return aborted or dropped > 0

    async def abort_all(self, reason: str = SHUTDOWN_REASON) -> int:
        """Close the turn gate and abort every running top-level turn (shutdown); returns how many ran.

        Waiting prompts and any prompt sent later are answered as aborted
        with ``reason``. A prompt the gate handed an agent before this is in
        its mailbox before the abort, so it is aborted too. Each aborted
        turn is committed to the store before its result is given.
        """
        self.gate.close_nowait(reason)
        # The children awake only: asked of all, a million asleep would be a million stubs made.
        awake = await self._proxy.awake_children()
        refs = [
            ref
            for info in await self._proxy.which_children(awake)
            if info.status == "running" and (ref := self.system.whereis(agent_path(info.id))) is not None
        ]
        aborted = 0
        limiter = trio.CapacityLimiter(64)  # 10,000 agents: bounded asks in flight

        async def one(ref: Ref[Any]) -> None:
            nonlocal aborted
            async with limiter:
                with contextlib.suppress(Exception):  # gone or stopping: its own stop aborts the turn
                    aborted += bool(await ref.proxy().abort())

        async with trio.open_nursery() as nursery:
            for ref in refs:
                nursery.start_soon(one, ref)
        return aborted

    def agent(self, agent_id: str) -> Ref[Any]:
        """The running top-level agent of a session.

        Raises:
            DaemonError: no such agent is running.
        """
        ref = self.system.whereis(agent_path(agent_id))
        if ref is None:
            msg = f"no running agent {agent_id!r}; agent.list shows the running ones"
            raise DaemonError(msg)
        return ref


class _RecordPlace(msgspec.Struct, kw_only=True):
    """The fields of a `SessionRecord` a pass over every session needs (retention, the spill sweep)."""

    session_id: str
    working_dir: str
    project: str | None = None
    status: str = "active"


class _AgentStatus(msgspec.Struct, kw_only=True):
    """The field of an `AgentRecord` a restore asks (was it stopped cleanly?)."""

    status: str = "active"


def _pages(store: Store, namespace: str, type_: Any) -> Iterator[tuple[list[tuple[str, Any]], list[tuple[str, Any]]]]:
    """A namespace's values, `_RECORD_PAGE` at a time, in key order: the decoded ones and those that were not."""
    start = ""
    while True:
        good, bad = store.scan_range(namespace, start=start, limit=_RECORD_PAGE, type=type_)
        yield good, bad
        if len(good) + len(bad) < _RECORD_PAGE:
            return
        start = max(good[-1][0] if good else "", bad[-1][0] if bad else "") + _ABOVE


def _created(record: SessionRecord) -> float:
    return record.created


def _share_strings(record: SessionRecord) -> None:
    """Make a restored record's directories, model and status the strings every other session of them holds."""
    record.working_dir = sys.intern(record.working_dir)
    record.model = sys.intern(record.model)
    record.status = sys.intern(record.status)  # "active": decoded, one string a session
    if record.project is not None:
        record.project = sys.intern(record.project)


class _SpecAgain:
    """A sleeping session's ``ChildSpec.rebuild``: its record (and recorder), three words.

    What the supervisor keeps of a session asleep beside its record (a
    `functools.partial` of `Sessions._spec` was three objects and 208 bytes;
    this is one of 56).
    """

    __slots__ = ("record", "recorder", "sessions")

    def __init__(self, sessions: Sessions, record: SessionRecord, recorder: Recorder | None) -> None:
        self.sessions = sessions
        self.record = record
        self.recorder = recorder

    def __call__(self) -> ChildSpec:
        return self.sessions._spec(self.record, self.recorder)


class _SessionSettings:
    """A session's `TurnSettings` as its project's configuration stands: two lookups a turn, made anew on a change.

    Called on the loop thread (the agent at each turn's start, the session's
    sub-agent starts). A session whose directory is no longer known (it is
    being stopped) keeps what it had.
    """

    __slots__ = ("_generation", "_record", "_sessions", "_settings")

    def __init__(self, sessions: Sessions, record: SessionRecord) -> None:
        self._sessions = sessions
        self._record = record
        project = sessions.projects.current(record.config_dir)
        self._generation = project.generation
        self._settings = sessions.turn_settings(project, record)

    def __call__(self) -> TurnSettings:
        try:
            project = self._sessions.projects.current(self._record.config_dir)
        except KeyError:
            return self._settings
        if project.generation != self._generation:
            self._settings = self._sessions.turn_settings(project, self._record)
            self._generation = project.generation
        return self._settings


def _base_source(config: Config) -> Any:
    """A configuration built by hand, as the lowest file layer of every session's configuration."""
    return source_from_data(config_to_dict(config, redact=False), "<the daemon's configuration>")


class Daemon:
    """The long-running daemon: the system, its tree, the sessions and the server.

    Args:
        config: the configuration (``weald.toml``).
        socket_path: the Unix socket to serve on; None serves no socket.
        stdio: serve JSON-RPC on stdin/stdout instead.
        http: ``HOST:PORT`` for the observer; default: ``[server] http`` (None: no observer).
        faults: a fault injector (`weald.runtime.faults`) when faults are enabled.
        registry: the tools; default: a copy of the built-ins and of the tools
            installed packages offer (the ``weald.tools`` entry points). The
            modules ``[tools] modules`` names are imported into it either way
            (`weald.runtime.daemon._tool_modules`); `tool_origins` says where
            each tool came from.
        log: keep ``<state dir>/daemon.log``: faulthandler's tracebacks of a
            fatal crash and weald's warnings, and the record of how the
            previous run ended (`weald.runtime.daemon._runlog`). ``"terminal"``
            also writes a fatal crash's tracebacks to stderr.
        config_files: the files ``config`` was read from (`find_project_files`
            of the directory ``weald serve`` ran in): each session then reads
            the user file and its own project's file, and ``config.reload``
            reads these again for the daemon-wide settings. None (a config
            built by hand): ``config`` is every session's base, under its project's file.
    """

    def __init__(
        self,
        config: Config,
        *,
        socket_path: str | Path | None = None,
        stdio: bool = False,
        faults: Any = None,
        registry: ToolRegistry | None = None,
        http: str | None = None,
        log: bool | Literal["terminal"] = False,
        config_files: ProjectFiles | None = None,
    ) -> None:
        self.config = config
        self._read_config = config  # as the daemon's own files last read it (`reload`)
        self._log_mode = log
        self.log: DaemonLog | None = None
        self.config_files = config_files
        # Read with the environment as it is now, before secrets leave it at start.
        self.projects = Projects(
            base=None if config_files is not None else _base_source(config), on_loaded=register_config_secrets
        )
        self.socket_path = Path(socket_path) if socket_path else None
        self.stdio = stdio
        self.http = http or config.server.http
        self.observer_token: str | None = None
        if self.http:
            # Here, on the daemon's own thread: the observer's imports read files.
            from weald.runtime.daemon.http import new_token

            # Every request to the observer carries it; only the owner-only socket tells it (observer.url).
            self.observer_token = new_token()
            register_secret(self.observer_token)
        self.observer_port: int | None = None  # the port the observer got; a restart keeps it
        self.faults = faults
        self.registry = registry if registry is not None else default_registry.copy()
        self.tool_origins = load_tools(
            self.registry,
            config.tools.modules,
            import_dirs=_import_dirs(config_files),
            source=_files_source(config_files),
            entry_points=registry is None,
        )
        register_config_secrets(config)
        self._mcp_configs = _mcp_configs(config)
        # Read before the environment loses its secrets (OTEL_EXPORTER_OTLP_HEADERS); None: telemetry is off.
        self.telemetry_settings = telemetry_settings(config.telemetry)
        self.telemetry: Any = None  # a `_telemetry.Telemetry` once started, when on
        self.system = ActorSystem(
            store_path=config.store.path,
            store_url=config.store.url,
            durability=config.store.durability,
            ring_size=config.server.event_history,
        )
        self.node: NodeLease | None = None
        self.cluster_port: ClusterPort | None = None  # the port fronts connect to (``[cluster] listen``)
        self._load: dict[str, Any] = {}  # what lease renewals tell fronts of this node's load
        self.roots = Roots(self.system)
        self.state_dir = self.system.store_path.parent
        self.sandbox: SandboxReport | None = None
        self.sessions: Sessions | None = None
        # Which editor (through weald acp) drives which session: the server attaches them, tools ask them.
        self.editors = EditorBridges(self.system.loop)
        self.history: HistoryKeeper | None = None  # [history] retention's passes, once started
        self._stop_requested = False
        self._lock_fd: int | None = None
        self._collector_set = False
        self.started_at = 0.0

    def start(self, *, restore: bool = True, progress: Callable[[int, int], None] | None = None) -> Daemon:
        """Lock the store, start the tree, restore stored sessions, then start serving.

        Raises:
            StartError: a part of the tree failed to start (the cause is chained).
            SocketInUseError: the socket is held by a live daemon.
            DaemonError: another daemon uses the store's directory.
        """
        if self.socket_path is not None:
            prepare_socket(self.socket_path)
        self._lock_fd = lock_state_dir(self.system.store_path)
        if self._log_mode:
            try:  # with the lock held: no other daemon rotates or marks this directory
                self.log = DaemonLog.open(self.state_dir, terminal=self._log_mode == "terminal")
            except OSError as exc:
                self._unlock()
                msg = f"cannot write the daemon's log in {self.state_dir}: {exc.strerror or exc}"
                raise DaemonError(msg) from exc
        # No secret in the environment, marks for this state directory, the sandbox decided.
        self.sandbox, _ = prepare_process(self.config, self.state_dir)
        apply_collector_setting()  # larger generations: see _gc.py
        self._collector_set = True
        try:
            self.system.start()
        except BaseException:
            self._restore_collector()
            restore_environ()
            self._close_log()
            self._unlock()
            raise
        self.started_at = time.time()
        root = self.system.root.proxy()
        try:
            # Before anything new is spawned (MCP servers, restored sessions).
            stop_leftovers(self.system, self.state_dir)
            if self.faults is not None:
                self.faults.install(self.system)
            if self.config.cluster.listen:
                self.cluster_port = self._open_cluster_port()
            self._join_store()
            root.start_child(self._mcp_spec()).get(timeout=60)
            sessions = root.start_child(
                ChildSpec(
                    "sessions",
                    DynamicSupervisor,
                    kwargs={
                        "max_restarts": 1000,
                        "max_seconds": 10.0,
                        "max_children": self.config.limits.max_agents,
                    },
                    shutdown=120,
                )
            ).get(timeout=30)
            self.sessions = Sessions(
                self.system,
                self.config,
                self.registry,
                sessions,
                faults=self.faults,
                roots=self.roots,
                private_paths=self._private_paths(),
                projects=self.projects,
                editors=self.editors,
            )
            self.sessions.sweep_spill()
            self.sessions.load_trust(session_dirs=not restore)
            self.history = HistoryKeeper(
                self.system,
                self.sessions.retention_plan,
                interval=self.config.store.gc_interval,
                warn_bytes=self.config.store.warn_bytes,
                spill_bytes=self.sessions.spill_bytes,
            )
            self.system.loop.spawn_nowait(self.history.follow)
            if self.telemetry_settings is not None:
                self._start_telemetry(self.telemetry_settings)
            if restore:
                self.system.loop.run(self.sessions.restore, progress)
            # The charts' figures, sampled whether anyone watches or not (a few us a second).
            root.start_child(ChildSpec("metrics", Sampler, shutdown=5)).get(timeout=30)
            if self.system.store.fences:
                self.system.loop.spawn_nowait(self._adopt_orphans)
                self.system.loop.spawn_nowait(self._measure_load)
            # Looks at the projects' files every CONFIG_POLL seconds: a changed one applies at its sessions' next turn.
            root.start_child(ChildSpec("config", ConfigWatcher, kwargs={"daemon": self}, shutdown=5)).get(timeout=30)
            if self.socket_path is not None or self.stdio or self.http or self.cluster_port is not None:
                server: dict[str, Any] = {"daemon": self, "socket_path": self.socket_path, "stdio": self.stdio}
                server["cluster"] = self.cluster_port
                root.start_child(ChildSpec("server", Server, kwargs=server, shutdown=10)).get(timeout=30)
            if self.http:
                from weald.runtime.daemon.http import Observer

                # Beside the server: every piece of data it shows comes through the server's methods.
                observer = {"daemon": self, "address": self.http, "token": self.observer_token}
                observer["remote"] = self.config.server.http_remote
                root.start_child(ChildSpec("http", Observer, kwargs=observer, shutdown=10)).get(timeout=30)
        except BaseException:
            if self.cluster_port is not None:
                self.cluster_port.sock.close()
            self.system.shutdown()
            self._restore_collector()
            restore_environ()
            self._close_log()
            self._unlock()
            raise
        return self

    def _open_cluster_port(self) -> ClusterPort:
        """Bind the TCP port fronts connect to (before joining the store, whose node row names its address).

        Raises:
            DaemonError: the store is not shared, the secret or TLS is not usable, or the address cannot be bound.
        """
        from weald.runtime.daemon._cluster import (
            ClusterError,
            advertised_address,
            cluster_secret,
            split_host_port,
            tls_server_context,
        )

        cluster = self.config.cluster
        if not self.system.store.fences:
            msg = (
                f"--listen {cluster.listen}: a node serves fronts only on a shared store; "
                "give it --store postgresql://... (or [store] url)"
            )
            raise DaemonError(msg)
        try:
            secret = cluster_secret(cluster)
            tls = tls_server_context(cluster)
        except ClusterError as exc:
            raise DaemonError(str(exc)) from exc
        host, port = split_host_port(str(cluster.listen))
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, kind, proto, _, where = infos[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            msg = f"cannot listen on {cluster.listen} ([cluster] listen): {exc.strerror or exc}"
            raise DaemonError(msg) from exc
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
            sock.listen(512)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            msg = f"cannot listen on {cluster.listen} ([cluster] listen): {exc.strerror or exc}"
            raise DaemonError(msg) from exc
        bound = sock.getsockname()
        return ClusterPort(sock=sock, secret=secret, tls=tls, address=advertised_address(cluster, bound))

    def load_info(self) -> dict[str, Any]:
        """This node's load as fronts see it (awake and asleep sessions, CPU, last commit); any thread, no I/O."""
        info = dict(self._load)
        info["last_commit"] = self.system.store.last_commit if self.system.running else None
        return info

    async def _measure_load(self) -> None:
        """Every third of the lease, the figures each lease renewal writes into this node's row (a loop task)."""
        period = self.config.store.lease / 3
        before = time.monotonic()
        used = _cpu_seconds()
        while True:
            sessions = self.system.whereis("/sessions")
            if sessions is not None:
                with contextlib.suppress(Exception):  # stopping: the last figures stay
                    stats = await sessions.proxy().statistics()
                    now, cpu = time.monotonic(), _cpu_seconds()
                    self._load = {
                        "awake": stats.children - stats.asleep,
                        "asleep": stats.asleep,
                        "cpu": round((cpu - used) / max(now - before, 1e-3), 3),
                        "turns": self.sessions.gate.statistics().running if self.sessions is not None else 0,
                    }
                    before, used = now, cpu
            await trio.sleep(period)

    @property
    def previous_run(self) -> PreviousRun | None:
        """How the run before this one ended, when it did not stop cleanly (with ``log``)."""
        return self.log.previous if self.log is not None else None

    def _close_log(self) -> None:
        log, self.log = self.log, None
        if log is not None:
            log.close()

    def _start_telemetry(self, settings: TelemetrySettings) -> None:
        """Start exporting traces and metrics (OpenTelemetry is imported here, and only when it is on)."""
        from weald.runtime.daemon._telemetry import Telemetry

        sessions = self.sessions
        assert sessions is not None

        def model_spec(session_id: str, model: str) -> str:
            choice = sessions.config_of(session_id).resolve_model(model)
            return DEMO_MODEL if choice is None else choice.spec

        def capture_content(session_id: str) -> bool:
            # Per project: a session's project may opt in; where its messages go is the daemon's choice.
            return sessions.config_of(session_id).telemetry.capture_content

        self.telemetry = Telemetry(settings, self.system, self._session_counts, model_spec, capture_content)
        self.system.loop.spawn_nowait(self.telemetry.follow)
        self.system.loop.spawn_nowait(self.telemetry.measure_lag)
        # MCP tool calls (the daemon's servers' and sessions' own) carry their span's W3C trace context.
        from weald.runtime.mcp import set_trace_context_provider

        set_trace_context_provider(self.telemetry.mcp_call_traceparent)

    def _session_counts(self) -> tuple[int, int]:
        """``(awake, asleep)`` sessions (for telemetry's gauge; from any thread but the loop's)."""
        sessions = self.system.whereis("/sessions")
        if sessions is None:
            return 0, 0
        counts = sessions.proxy().count_children().get(timeout=5)
        return counts.get("active", 0), counts.get("hibernated", 0)

    def _join_store(self) -> None:
        """Join the store as this daemon's node (its epoch: the previous start's + 1), and hear of lost sessions."""
        store = self.system.store
        store.on_fenced = self._on_fenced
        store.on_lease_back = self._on_lease_back
        node_id = self.config.store.node_id or default_node_id(self.state_dir)
        info: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "state_dir": str(self.state_dir)}
        if self.cluster_port is not None:
            info["address"] = self.cluster_port.address
            info["tls"] = self.cluster_port.tls is not None
        info["labels"] = dict(self.config.cluster.labels)
        store.lease_info = self.load_info
        self.node = store.join(
            node_id, lease=self.config.store.lease, info=info, commit_log=self.config.store.commit_log
        )

    def _on_fenced(self, session_ids: tuple[str, ...], error: BaseException) -> None:
        # On the store's committer or lease thread: the sessions are stopped on the loop.
        sessions = self.sessions
        if sessions is None:
            return
        reason = f"the store's fence refused this node's writes (StoreFencedError): {error}"
        with contextlib.suppress(trio.RunFinishedError, RuntimeError):  # the daemon is stopping
            self.system.loop.spawn_nowait(sessions.drop, session_ids, reason)

    async def _adopt_orphans(self) -> None:
        """Every lease period, claim and restore the sessions of nodes whose leases ran out (a loop task).

        And adopt those handed to this node that no front had it adopt (`Store.stranded`).
        """
        store = self.system.store
        period = self.config.store.lease
        while True:
            await trio.sleep(period)
            sessions = self.sessions
            if sessions is None or self._stop_requested:
                return
            try:
                claimed = await sessions.claim_orphans()
            except Exception as exc:  # the database is away: the next period tries again
                logger.warning("claiming orphaned sessions failed: %s", exc)
                continue
            if claimed:
                self.system.events.publish("daemon.orphans_claimed", "/sessions", {"sessions": sorted(claimed)})
                try:
                    await sessions.restore(claimed=claimed)
                except ActorDeadError:  # the daemon is stopping: the next start restores them
                    return
            stranded = store.stranded(period)
            if stranded:
                # Handed to this node by a front that did not live to have it adopt them.
                logger.warning("adopting %d sessions handed to this node and never adopted", len(stranded))
                try:
                    adopted = await sessions.adopt(stranded)
                except ActorDeadError:
                    return
                except Exception as exc:  # the database is away: the next period tries again
                    logger.warning("adopting sessions handed to this node failed: %s", exc)
                    continue
                store.forget_arrived(set(stranded).difference(adopted))

    def _on_lease_back(self) -> None:
        # On the store's lease thread: the node restores what it can claim again.
        sessions = self.sessions
        if sessions is None or self._stop_requested:
            return
        with contextlib.suppress(trio.RunFinishedError, RuntimeError):
            self.system.loop.spawn_nowait(sessions.restore)

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock

    def _private_paths(self) -> tuple[str, ...]:
        paths = [str(self.state_dir), str(self.config.spill.root(self.system.store_path))]
        if self.socket_path is not None:
            paths.append(str(self.socket_path))
        if os.environ.get(CONFIG_ENV):
            paths.append(os.environ[CONFIG_ENV])
        return tuple(paths)

    def _mcp_spec(self) -> ChildSpec:
        from weald.runtime.mcp import mcp_supervisor_spec

        spec: ChildSpec = mcp_supervisor_spec(self._mcp_configs, self.registry, roots=self.roots.paths)
        return spec

    async def reload(self) -> dict[str, Any]:
        """Read every configuration file again and apply what changed: ``weald reload``, SIGHUP (on the loop).

        OTP's ``config_change``, for weald: the daemon's own files (those
        ``weald serve`` found) are read again, and when they are right, the
        MCP servers they name are started, stopped or restarted to match
        (`MCPSupervisor.update_servers`), while a change to another
        daemon-wide key is named in ``restart_needed``. Every project's files
        are read again too (`Projects.refresh`); a changed project applies at
        its sessions' next turn. A file with errors is refused as a whole,
        with every problem: the configuration running stays.

        Returns:
            ``daemon`` (``status``: changed, unchanged or refused; ``files``,
            ``problems``, ``mcp``, ``restart_needed``) and ``projects``
            (`ProjectChange.describe` of each).
        """
        daemon = await self._reload_own()
        changes = await self.projects.refresh(force=True)
        await self.after_refresh(changes)
        report = {"daemon": daemon, "projects": [change.describe() for change in changes]}
        summary = {
            "daemon": daemon["status"],
            "changed": [c.project for c in changes if c.status == "changed" and c.news],
            "refused": [c.project for c in changes if c.status == "refused"],
        }
        self.system.events.publish("config.reloaded", "/config", summary)
        return report

    async def after_refresh(self, changes: list[ProjectChange]) -> None:
        """Publish ``config.changed`` / ``config.refused`` for what is news, and bring project MCP servers up to date.

        A changed project's own MCP servers (`Sessions.project_mcp`) are
        started, stopped or restarted under each of its awake sessions
        (`Sessions.apply_mcp_changes`); the rest of its configuration applies
        at each session's next turn by itself.
        """
        changed = [change for change in changes if change.news and change.status == "changed"]
        sessions = self.sessions
        if changed and sessions is not None:
            directories = [directory for change in changed for directory in change.directories]
            projects = [sessions.projects.current(d) for d in directories if sessions.projects.known(d)]
            await sessions.prepare_mcp(projects)
            await sessions.apply_mcp_changes(directories)
        for change in changes:
            if change.news:
                topic = "config.refused" if change.status == "refused" else "config.changed"
                self.system.events.publish(topic, "/config", change.describe())

    async def _reload_own(self) -> dict[str, Any]:
        """Read the daemon's own files again; apply their MCP servers; name what needs a restart."""
        if self.config_files is None:
            note = "the daemon was given its configuration in code: there are no files of its own to read again"
            return {"status": "unchanged", "files": [], "problems": [], "note": note}
        start = self.config_files.start

        def read() -> Any:
            files = find_project_files(start)
            return files, load_files(files)

        try:
            files, loaded = await trio.to_thread.run_sync(read)
        except ConfigError as exc:
            problems = [str(problem) for problem in exc.problems]
            self.system.events.publish("config.refused", "/config", {"project": str(start), "problems": problems})
            return {"status": "refused", "files": [], "problems": problems}
        new: Config = loaded.config
        old_plain, new_plain = unstructure_config(self.config), unstructure_config(new)
        restart_needed = sorted(
            key
            for section in DAEMON_WIDE
            for key in _changed_keys(old_plain.get(section), new_plain.get(section), section)
        )
        register_config_secrets(new)
        configs = _mcp_configs(new)
        mcp: dict[str, list[str]] = {"started": [], "stopped": [], "restarted": [], "retried": []}
        supervisor = self.system.whereis("/mcp")
        if supervisor is not None:
            if configs:
                from weald.runtime.mcp._actor import load_connection_modules

                await trio.to_thread.run_sync(load_connection_modules)
            try:
                mcp = await supervisor.proxy().update_servers(configs)
            except ValueError as exc:  # MCPConfigError: two servers of one name (nothing changed)
                return {"status": "refused", "files": [], "problems": [str(exc)]}
        changed = bool(restart_needed or any(mcp.values()) or new != self._read_config)
        self._read_config = new
        self.config = attrs.evolve(self.config, mcp=new.mcp)
        self._mcp_configs = configs
        self.config_files = files
        if self.sessions is not None:
            self.sessions.config = self.config
        return {
            "status": "changed" if changed else "unchanged",
            "files": [attrs.asdict(file) for file in loaded.files],
            "problems": [],
            "mcp": mcp,
            "restart_needed": restart_needed,
        }

    def request_stop(self) -> None:
        """Ask the process running the daemon to shut it down (from an RPC or a signal)."""
        self._stop_requested = True

    @property
    def stop_requested(self) -> bool:
        """True once `request_stop` was called."""
        return self._stop_requested

    def shutdown(self, timeout: float = 60.0) -> None:
        """Wind down, then stop everything, last started first; the server first, the store last.

        Winding down: the server stops accepting connections and new turns,
        running turns are aborted (each committed to the store first), and
        every request in flight, ``agent.prompt`` above all, gets its reply
        written to its client before any connection closes. Then the tree
        stops: the server (connections close, the socket is removed), the
        sessions (each agent persists and stops), MCP, the loop, the store.
        Runs on the thread that started the daemon, never on the loop.

        Args:
            timeout: seconds for winding down, then again for each stop.
        """
        if self.history is not None:
            self.history.stop_nowait()  # a retention pass ends between two transactions
        if self.system.running and self.sessions is not None:
            try:
                self.system.loop.run(self._wind_down, timeout)
            except Exception:  # the stop goes on whatever went wrong; say what it was
                logger.exception("winding the daemon down failed; stopping it anyway")
        try:
            self.system.shutdown(timeout=timeout)
        finally:
            self._restore_collector()
            if self.cluster_port is not None:
                self.cluster_port.sock.close()
            self._close_log()  # a clean stop: the run's marker goes
            self._unlock()  # last: the store is closed
            if self.telemetry is not None:
                from weald.runtime.mcp import set_trace_context_provider

                set_trace_context_provider(None)
                self.telemetry.shutdown()  # what is queued is exported (bounded by its export timeout)
        if self.sandbox is not None:
            restore_environ()  # for a program hosting the daemon; `weald serve` exits next

    def _restore_collector(self) -> None:
        if self._collector_set:
            self._collector_set = False
            restore_collector_setting()

    async def _wind_down(self, timeout: float) -> None:
        """Stop accepting, abort running turns, and deliver every pending reply (on the loop)."""
        server = self.system.whereis("/server")
        with trio.move_on_after(timeout):
            if server is not None:
                with contextlib.suppress(ActorDeadError):
                    await server.proxy().stop_accepting()
            if self.sessions is not None:
                await self.sessions.abort_all(SHUTDOWN_REASON)
            if server is not None:
                with contextlib.suppress(ActorDeadError):
                    await server.proxy().wait_replies_written()

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _cpu_seconds() -> float:
    """CPU seconds this process used so far (user and system)."""
    times = os.times()
    return times.user + times.system


def default_node_id(state_dir: Path) -> str:
    """A node's name when none is configured: the host name and a short hash of the state directory."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:8]
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:100] or "host"
    return f"{host}-{digest}"


def _taken(session_id: str) -> str:
    return (
        f"agent {session_id!r} runs on another live node of this store; stop it there first, or choose another agent_id"
    )


def _mcp_configs(config: Config) -> list[Any]:
    """The enabled MCP servers' configs, each with the environment variables its ``${...}`` use.

    Captured as the daemon started with them (`environ_value`: the secrets
    scrubbed from the process environment at start included): a server
    restarted hours later, or added by a reload, still expands
    ``${GITHUB_TOKEN}`` to what the daemon was started with.
    """
    servers = {name: server for name, server in config.mcp.servers.items() if server.enabled}
    if not servers:
        return []
    configs = []
    for name, server in servers.items():
        built = server.to_server_config(name)
        captured = {variable: value for variable in built.variables() if (value := environ_value(variable)) is not None}
        configs.append(attrs.evolve(built, environ=captured))
    return configs


def _changed_keys(old: object, new: object, path: str) -> list[str]:
    """The dotted keys under ``path`` whose values differ between two unstructured tables."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = sorted(set(old) | set(new))
        return [changed for key in keys for changed in _changed_keys(old.get(key), new.get(key), f"{path}.{key}")]
    return [] if old == new else [path]


#: Seconds between two looks at the projects' configuration files.
CONFIG_POLL = 1.0


@attrs.frozen
class _Polled:
    result: Any  # outcome.Outcome[None]: the poll loop ended (it only ends by failing)


class ConfigWatcher(Actor):
    """``/config``: keeps each project's configuration current (see `Projects.refresh`).

    Every `CONFIG_POLL` seconds it has the projects' files looked at (in a
    worker thread: the files found upward, each file's identity; only what
    changed is read again), and publishes ``config.changed`` and
    ``config.refused`` for what it finds. A changed project applies at its
    sessions' next turn; ``weald reload`` (`Daemon.reload`) does the same
    at once, and reads the daemon's own files too. If the look fails, the
    actor crashes and the root restarts it.

    Args:
        daemon: the daemon.
        interval: seconds between looks.
    """

    def __init__(self, daemon: Daemon, interval: float = CONFIG_POLL) -> None:
        super().__init__()
        self._daemon = daemon
        self._interval = interval

    def on_start(self) -> None:
        """Start the poll loop (an I/O task of this actor); runs in the actor's task."""
        self.run_io(self._poll, reply=_Polled, name="config poll")

    async def _poll(self) -> None:
        while True:
            await trio.sleep(self._interval)
            began = trio.current_time()
            await self._daemon.after_refresh(await self._daemon.projects.refresh(report=False))
            # A pass over many projects costs more: at most about 5% of the time goes to looking.
            spent = trio.current_time() - began
            await trio.sleep(max(0.0, 20 * spent - self._interval))

    def on_receive(self, message: Any) -> None:
        """The poll loop ended: its failure crashes this actor (the root restarts it)."""
        if isinstance(message, _Polled):
            message.result.unwrap()


def _prepare_session_mcp(servers: Sequence[SessionMCPServer], unique: bool = True) -> None:
    """Check sessions' own MCP servers and load the MCP SDK for them (in a worker thread: it reads many files).

    Raises:
        MCPConfigError: as `_session_mcp_configs`.
    """
    from weald.runtime.mcp import mcp_supervisor_spec

    # Making a spec with enabled servers loads the connection modules; the spec itself is not used.
    mcp_supervisor_spec(_session_mcp_configs(servers, unique=unique), ToolRegistry())


def _session_mcp_configs(servers: Sequence[SessionMCPServer], *, unique: bool = True) -> tuple[Any, ...]:
    """A session's own MCP servers as `weald.runtime.mcp.ServerConfig`s; their secrets made unprintable.

    Raises:
        MCPConfigError: a server with no transport, or both, or two with one name.
    """
    if not servers:
        return ()
    from weald.runtime.mcp import MCPConfigError, ServerConfig

    names = [server.name for server in servers]
    if unique and len(set(names)) != len(names):
        raise MCPConfigError(f"two MCP servers share a name among {names}")
    for server in servers:
        for name, value in [*server.env.items(), *server.headers.items()]:
            if value and is_secret_name(name):
                register_secret(value)
                for part in value.split():
                    register_secret(part)
    return tuple(
        ServerConfig(
            name=server.name,
            command=server.command,
            args=tuple(server.args),
            env=dict(server.env),
            url=server.url,
            headers=dict(server.headers),
        )
        for server in servers
    )


def register_config_secrets(config: Config, environ: Mapping[str, str] | None = None) -> None:
    """Make the secrets the configuration names unprintable, whatever their names.

    The value of every provider's ``api_key_env`` variable, and the values of
    its secret-looking ``extra_headers`` (whole, and each word, so the token
    of ``Bearer <token>`` too).
    """
    for provider in config.providers.values():
        key = (environ_value if environ is None else environ.get)(provider.api_key_env or "")
        if provider.api_key_env and key:
            register_secret(key)
        for name, value in provider.extra_headers.items():
            if is_secret_name(name) and value:
                register_secret(value)
                for part in value.split():
                    register_secret(part)


def lock_state_dir(store_path: Path) -> int:
    """Take the exclusive lock on the store: ``flock`` on ``<store file>.lock``; returns its descriptor.

    Hold the descriptor for as long as the store is used, and close it to
    release the lock; the kernel releases it too when the process dies. It
    is close-on-exec, so no subprocess keeps it. The file holds the owner's pid.

    Raises:
        DaemonError: another process holds the lock (its pid is named), or the
            lock file cannot be opened.
    """
    state_dir = store_path.parent
    lock_path = state_dir / f"{store_path.name}.lock"
    try:
        make_private_dirs(state_dir)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        msg = f"cannot open the store's lock file {lock_path}: {exc.strerror or exc}"
        raise DaemonError(msg) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        held = exc.errno in (errno.EAGAIN, errno.EACCES)
        owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip() if held else ""
        fd_stat = os.fstat(fd)
        os.close(fd)
        if not held:
            msg = f"cannot lock the store's lock file {lock_path}: {exc.strerror or exc}"
            raise DaemonError(msg) from exc
        # The owner writes its pid just after it takes the lock: in between, the kernel knows it.
        pid = owner if owner.isdigit() else _flock_holder(fd_stat) or "unknown"
        msg = (
            f"another weald daemon (pid {pid}) is using {state_dir}; its store {store_path} serves one daemon "
            "at a time: stop that daemon first, or give this one another [store] path"
        )
        raise DaemonError(msg) from exc
    with contextlib.suppress(OSError):  # a full disk keeps the pid out, not the lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _flock_holder(stat: os.stat_result) -> str | None:
    """The pid holding a ``flock`` on the file ``stat`` describes, from ``/proc/locks``; None if not found."""
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:  # procfs: never blocks on a disk
            for line in locks:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF" ("->" marks a waiter)
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[2] != "->" and fields[5] == device:
                    return fields[4]
    except OSError:
        return None
    return None


def _resolve_working_dir(working_dir: str, field: str = "working_dir") -> str:
    path = Path(working_dir).expanduser()
    if not path.is_absolute():
        raise InvalidRequestError(field, f"must be an absolute path, got {working_dir!r}")
    if not path.is_dir():
        msg = f"{field} {working_dir} is not a directory"
        raise DaemonError(msg)
    return str(path.resolve())


def _recording_path(record: str, working_dir: str) -> str:
    """Where ``agent.start``'s ``record`` writes: absolute, in a directory, a regular file or a new one."""
    path = Path(record).expanduser()
    if not path.is_absolute():
        path = Path(working_dir) / path
    if not path.parent.is_dir():
        msg = f"cannot record to {path}: {path.parent} is not a directory"
        raise DaemonError(msg)
    path = path.parent.resolve() / path.name
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return str(path)
    except OSError as exc:
        msg = f"cannot record to {path}: {exc.strerror or exc}"
        raise DaemonError(msg) from exc
    if not stat.S_ISREG(mode):
        msg = f"cannot record to {path}: it exists and is not a regular file (a recording replaces only a file)"
        raise DaemonError(msg)
    return str(path)


def _import_dirs(files: ProjectFiles | None) -> list[Path]:
    """Where ``[tools] modules`` may live besides the environment: by the config files, and here."""
    dirs = [Path.cwd()]
    if files is not None:
        dirs += [path.parent for path in (files.project, files.user) if path is not None]
    return dirs


def _files_source(files: ProjectFiles | None) -> str:
    """The file(s) ``[tools] modules`` came from, for its error messages."""
    if files is None:
        return "weald.toml"
    named = [str(path) for path in (files.user, files.project) if path is not None]
    return " + ".join(named) or "weald.toml"
