"""An agent session: its supervision subtree and the services its tools reach the runtime through.

::

    /sessions/<id>                Supervisor, rest_for_one
    ├── mcp                       MCPSupervisor: the session's own MCP servers (only when it has some)
    ├── tool_runner               ToolRunner (each call a temporary child)
    ├── sub_agents                DynamicSupervisor: sub-agents, depth-limited
    └── agent                     Agent (reloads its history on restart)

rest_for_one: if the tool runner dies, the agent (which depends on it) is
restarted too and reloads its history; if the agent dies alone, only the
agent restarts. `SessionRuntime` is what ``ctx.session.runtime`` is for the
tools of this session: questions to the user, sub-agents, skills, the store,
events.

Sub-agents of every depth are children of the one ``sub_agents``
supervisor, named ``sub-<n>-<call id>``: ``n`` counts the session's
sub-agents from 1 (carried on across daemon restarts, read back from the
store), so ids never repeat even when two models number their tool calls
alike, and the history key ``<session>.sub-<n>-<call id>`` is never reused.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import trio
from pykka.messages import ProxyCall
from weald.runtime import Actor, ActorSystem, Event, Future, Ref, Store, Stub, redact
from weald.runtime.agents.agent import Agent, AgentConfig, AskUser, TurnResult, TurnSettings
from weald.runtime.agents.tool_runner import RunnerConfig, ToolRunner
from weald.runtime.llm import Provider, Recorder, ReplayDivergence, ScriptedProvider, make_provider
from weald.supervisors import ChildSpec, DynamicSupervisor, Restart, Supervisor
from weald.tools import Tool, ToolRegistry, default_registry
from weald.tools.skills import default_skill_dirs, describe_skills

__all__ = [
    "RuntimeView",
    "SessionConfig",
    "SessionRuntime",
    "agent_path",
    "asleep_session_spec",
    "session_dir",
    "session_shape",
    "session_spec",
    "valid_session_id",
]

_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def valid_session_id(session_id: str) -> bool:
    """A session id is 1-64 letters, digits, ``_``, ``.`` or ``-`` (it names a path in the tree).

    The whole string must match: ``$`` would also match before a final newline, letting an id and a newline in.
    """
    return _SESSION_ID.fullmatch(session_id) is not None


@attrs.frozen
class SessionConfig:
    """Everything needed to start (or restart) one session.

    Attributes:
        session_id: the session's id; also the top-level agent's id.
        working_dir: the project directory.
        agent: the top-level agent's configuration.
        runner: tool runner configuration (permissions, timeouts, limits).
        allowed_dirs: further directories file tools may touch.
        output_dir: where full tool outputs are saved (default: next to the store).
        hibernate_after: seconds the session may stay idle before it
            hibernates (see `SessionRuntime.hibernate`); None: never.
        mcp_servers: MCP servers of this session alone (an editor's, through
            ACP): `weald.runtime.mcp.ServerConfig`s, run under the session's
            ``mcp`` supervisor; their tools are this session's only.
        settings: the session's configuration as it stands, asked by the
            top-level agent at each turn's start (see `TurnSettings`): a
            changed project configuration applies from the next turn. When
            given, ``agent`` and ``runner`` must be what it returns now.
            None: ``agent`` and ``runner`` for good.
        skill_dirs: where skills are looked for, highest precedence first;
            None: the working directory's ``.weald/skills``, then ``~/.weald/skills``.
        editor: session id -> the editor driving that session through ACP
            (``ctx.session.editor``, `weald.tools.EditorBridge`), or None;
            None: file tools and the shell never go through an editor.
    """

    session_id: str
    working_dir: str
    agent: AgentConfig
    runner: RunnerConfig = attrs.field(factory=RunnerConfig)
    allowed_dirs: tuple[str, ...] = ()
    output_dir: str | None = None
    hibernate_after: float | None = None
    mcp_servers: tuple[Any, ...] = ()
    settings: Callable[[], TurnSettings] | None = attrs.field(default=None, eq=False)
    skill_dirs: tuple[str, ...] | None = None
    editor: Callable[[str], Any] | None = attrs.field(default=None, eq=False)


class _SessionTools(ToolRegistry):
    """The daemon's tools plus a session's own (its MCP servers'); the session's win a name clash.

    The daemon's registry is read live, so tools that register there later
    (the daemon's MCP servers connecting) are offered here too.
    """

    def __init__(self, base: ToolRegistry) -> None:
        super().__init__()
        self._base = base

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or name in self._base

    def __len__(self) -> int:
        return len(self.names())

    def get(self, name: str) -> Tool | None:
        """The session's tool called ``name``, else the daemon's."""
        return super().get(name) or self._base.get(name)

    def names(self) -> list[str]:
        """Every tool name, sorted."""
        return sorted({*super().names(), *self._base.names()})

    def select(self, patterns: Iterable[str] | None = None) -> list[Tool]:
        """The tools a filter allows among both, sorted by name."""
        patterns = None if patterns is None else tuple(patterns)
        chosen = {t.name: t for t in self._base.select(patterns)}
        chosen.update((t.name, t) for t in super().select(patterns))
        return [chosen[name] for name in sorted(chosen)]

    def copy(self) -> ToolRegistry:
        """An independent registry holding the same tools (the daemon's as they are now)."""
        return ToolRegistry({**{t.name: t for t in self._base.select()}, **self._tools}.values())


class RuntimeView:
    """Read-only introspection of a running system: the store, recent events, places in the tree.

    Thread-safe: called from thread tools and from the daemon's RPC methods.
    """

    def __init__(self, system: ActorSystem, default_source: str = "/") -> None:
        self._system = system
        self._default_source = default_source

    @property
    def store(self) -> Store:
        """The persistent store."""
        return self._system.store

    def recent_events(self, source: str | None = None, limit: int = 20) -> list[Event]:
        """Recent events from ``source`` (a path prefix), oldest first."""
        return self._system.events.recent(limit, source=source or self._default_source)

    def whereis(self, path: str) -> Ref[Any] | None:
        """The live actor at ``path``."""
        return self._system.whereis(path)

    def tree_place(self, path: str) -> list[dict[str, Any]]:
        """The chain of actors from the root down to ``path``: path, kind, status."""
        parts = path.strip("/").split("/")
        chain = ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
        out = []
        for p in chain:
            ref = self._system.whereis(p)
            out.append(
                {
                    "path": p,
                    "kind": ref.actor_class.__name__ if ref else None,
                    "alive": bool(ref and ref.is_alive()),
                    "mailbox": ref.mailbox_size() if ref else 0,
                }
            )
        return out


class SessionRuntime(RuntimeView):
    """The runtime as the tools of one session see it (``ctx.session.runtime``).

    Thread-safe where it must be: `store` and `recent_events` are called from
    thread tools; the ``async`` methods run on the loop, in a tool's task.
    """

    def __init__(
        self,
        system: ActorSystem,
        session_path: str,
        config: SessionConfig,
        registry: ToolRegistry,
        provider_factory: Callable[[str], Provider] | None,
    ) -> None:
        super().__init__(system, session_path)
        self.session_path = session_path
        self.config = config
        self._registry = registry
        self._provider_factory = provider_factory
        # Invariant: once set, only grows; touched only on the trio loop.
        self._sub_agent_seq: int | None = None
        self._skills_lock = threading.Lock()
        self._skills_text: str | None = None

    @property
    def session_id(self) -> str:
        """This session's id."""
        return self.config.session_id

    @property
    def agent_config(self) -> AgentConfig:
        """The top-level agent's configuration as it stands (its project's, which may change between turns)."""
        settings = self.config.settings
        return settings().agent if settings is not None else self.config.agent

    @property
    def skill_dirs(self) -> tuple[Path, ...]:
        """Where ``use_skill`` and the skill catalog look for skills, highest precedence first."""
        if self.config.skill_dirs is not None:
            return tuple(Path(d) for d in self.config.skill_dirs)
        return default_skill_dirs(self.config.working_dir)

    def skills_prompt(self) -> str:
        """The skill catalog for the system prompt (names and descriptions), fixed once per session.

        Blocking (it may read the skill directories): agents call it in a
        worker thread when `skills_prompt_nowait` has no answer. Every agent
        of the session, sub-agents and restarted agents included, gets the
        same text. The scan is shared by the sessions of one working
        directory started within `CATALOG_TTL` seconds of it.
        """
        with self._skills_lock:
            if self._skills_text is None:
                self._skills_text = _shared_catalog(self.config.working_dir, self.skill_dirs)
            return self._skills_text

    def skills_prompt_nowait(self) -> str | None:
        """`skills_prompt` when it needs no scan (this session's, or a recent shared one); else None."""
        text = self._skills_text
        if text is None:
            text = _fresh_catalog(self.config.working_dir, self.skill_dirs)
            if text is not None:
                with self._skills_lock:
                    if self._skills_text is None:
                        self._skills_text = text
                    text = self._skills_text
        return text

    async def hibernate(self) -> bool:
        """Hibernate this session if nothing runs in it; returns whether it did.

        Asked by the session's agent once it has been idle for
        ``hibernate_after`` seconds, while it holds its messages (so a prompt
        that arrives meanwhile is not lost but wakes the session again). The
        session's supervisor stops the whole subtree (the agent persists its
        state, as for any stop) and leaves a stub at its paths; the next
        message to any of them restores it from the store. Not while the tool
        runner has anything running or listed (a call, a permission prompt,
        a background job). Runs on the loop, in the agent's I/O task.
        """
        if self._system.asleep(self.session_path) is not None:
            # Asleep already (an idle deadline of the last turn, late under load): no lookup below
            # it, which would make and register a stub for its tool runner that nobody asked for.
            return False
        runner = self._system.whereis(f"{self.session_path}/tool_runner")
        sessions = self._system.whereis(self.session_path.rpartition("/")[0] or "/")
        if runner is None or sessions is None or runner.__class__ is Stub:
            return False
        # What .proxy().idle() sends, without building a proxy (~40 us of introspection each).
        if not await runner.ask(ProxyCall(("idle",), (), {}), block=False):
            return False
        hibernated: bool = await sessions.ask(ProxyCall(("hibernate_child",), (self.session_id,), {}), block=False)
        return hibernated

    async def ask_user(self, agent_path: str, question: str, choices: Sequence[str] = ()) -> str:
        """Ask whoever drives the top-level agent; a sub-agent's question goes up the chain.

        Raises:
            RuntimeError: the agent is gone, or the question was withdrawn (abort).
        """
        agent = self._system.whereis(agent_path)
        if agent is None:
            msg = f"the agent {agent_path} is not running"
            raise RuntimeError(msg)
        reply: Future[str] = Future()
        agent.tell(AskUser(question, tuple(choices), reply, agent_path))
        return await reply

    async def run_sub_agent(
        self,
        *,
        parent_path: str,
        parent_model: str,
        parent_filter: tuple[str, ...] | None,
        depth: int,
        call_id: str,
        task: str,
        tools: Sequence[str] | None,
        model: str | None,
        system_prompt: str | None,
        timeout: float,
        emit: Callable[[str, Mapping[str, Any]], None],
    ) -> TurnResult:
        """Start a sub-agent, give it ``task``, forward its events, and return its final turn.

        The sub-agent may use at most the tools its parent may use. It is
        stopped when it answers, when ``timeout`` runs out, or when the call
        is cancelled (abort).

        Raises:
            RuntimeError: the session's sub_agents supervisor is not running.
            TimeoutError: the sub-agent did not finish within ``timeout``.
        """
        sub_agents = self._system.whereis(f"{self.session_path}/sub_agents")
        parent = self._system.whereis(parent_path)
        if sub_agents is None:
            msg = "the session's sub_agents supervisor is not running"
            raise RuntimeError(msg)
        allowed = {t.name for t in self._registry.select(parent_filter)}
        if tools is not None:
            allowed &= {t.name for t in self._registry.select(tools)}
        live = self.config.settings() if self.config.settings is not None else None
        base = live.agent if live is not None else self.config.agent
        agent_id = await self._next_sub_agent_id(call_id)
        config = AgentConfig(
            model=model or parent_model,
            system_prompt=system_prompt,
            tool_filter=tuple(sorted(allowed)),
            max_steps=base.max_steps,
            depth=depth,
            max_depth=base.max_depth,
            debug_state=base.debug_state,
            sub_agent_timeout=base.sub_agent_timeout,
            context=base.context,
        )
        # The sub-agent runs under the session's configuration as of its start, for its whole life.
        fixed = None if live is None else TurnSettings(live.generation, config, live.runner, live.model_key)
        spec = ChildSpec(
            agent_id,
            Agent,
            args=(self.session_id, agent_id, self.config.working_dir, config),
            kwargs={
                "registry": self._registry,
                "runner_path": f"{self.session_path}/tool_runner",
                "parent": parent,
                "provider_factory": self._provider_factory,
                "skills": self.skills_prompt,
                "settings": None if fixed is None else (lambda: fixed),
            },
            restart="temporary",
            shutdown=5.0,
        )
        proxy = sub_agents.proxy()
        child = await proxy.start_child(spec)
        # The child's own events, and the events of the tool calls it makes
        # (published by the session's tool runner, naming the calling agent).
        # Its sub-agents' events arrive inside the latter, already forwarded
        # by its own sub_agent calls.
        own_events = self._system.events.subscribe("*", source=child.path, max_buffer=4096)
        tool_events = self._system.events.subscribe(
            "tool.*", source=f"{self.session_path}/tool_runner", max_buffer=4096
        )
        forwarders = ((own_events, None), (tool_events, child.path))
        result: TurnResult | None = None
        try:
            with trio.move_on_after(timeout):
                async with trio.open_nursery() as nursery:
                    for subscription, agent in forwarders:
                        nursery.start_soon(_forward, subscription, emit, call_id, agent)
                    turn_future = await child.proxy().prompt(task)
                    result = await turn_future
                    nursery.cancel_scope.cancel()
            # What was published before the turn ended but not yet forwarded.
            for subscription, agent in forwarders:
                for event in subscription.drain_nowait():
                    _forward_one(event, emit, call_id, agent)
        finally:
            own_events.close()
            tool_events.close()
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await proxy.terminate_child(child)
        if result is None:
            msg = f"the sub-agent did not finish within {timeout:g} s"
            raise TimeoutError(msg)
        return result

    async def _next_sub_agent_id(self, call_id: str) -> str:
        """A sub-agent id unique in this session: ``sub-<n>-<call id>``, ``n`` counting from 1.

        The first time, ``n`` carries on from the sub-agents the store holds
        for this session (a restarted daemon must not reuse a stored history).
        """
        if self._sub_agent_seq is None:
            store = self._system.store
            prefix = f"{self.session_id}.sub-"
            keys = await trio.to_thread.run_sync(store.keys, "agents", prefix)
            numbers = (key[len(prefix) :].partition("-")[0] for key in keys)
            highest = max((int(n) for n in numbers if n.isdigit()), default=0)
            if self._sub_agent_seq is None:  # another call may have set it while this one read
                self._sub_agent_seq = highest
        self._sub_agent_seq += 1
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in call_id)[:40]
        return f"sub-{self._sub_agent_seq}-{safe}"


CATALOG_TTL = 5.0
"""Seconds a skill catalog scan is shared by the sessions of its working directory."""

_CATALOG_LIMIT = 1024  # working directories remembered
_catalogs: OrderedDict[tuple[str, tuple[Path, ...]], tuple[str, float]] = OrderedDict()
_catalogs_lock = threading.Lock()


def _fresh_catalog(working_dir: str, dirs: tuple[Path, ...]) -> str | None:
    with _catalogs_lock:
        found = _catalogs.get((working_dir, dirs))
    if found is not None and time.monotonic() - found[1] < CATALOG_TTL:
        return found[0]
    return None


def _shared_catalog(working_dir: str, dirs: tuple[Path, ...]) -> str:
    """The catalog of ``dirs``, scanned at most once per `CATALOG_TTL` seconds (blocking)."""
    text = _fresh_catalog(working_dir, dirs)
    if text is None:
        text = describe_skills(working_dir, dirs=dirs)
        with _catalogs_lock:
            _catalogs[(working_dir, dirs)] = (text, time.monotonic())
            _catalogs.move_to_end((working_dir, dirs))
            while len(_catalogs) > _CATALOG_LIMIT:
                _catalogs.popitem(last=False)
    return text


def _forward_one(event: Event, emit: Callable[[str, Mapping[str, Any]], None], call_id: str, agent: str | None) -> None:
    """Re-emit one event as the parent call's output, tagged with the parent's call id.

    Args:
        event: a sub-agent's event, or a tool event of the session.
        emit: the parent call's ``ctx.emit``.
        call_id: the parent call's id.
        agent: forward only events whose ``agent`` field names this path
            (tool events); None: forward every event.
    """
    if agent is not None and event.data.get("agent") != agent:
        return
    emit(
        "sub_agent",
        {"parent_call_id": call_id, "topic": event.topic, "source": event.source, "data": redact(event.data)},
    )


async def _forward(
    subscription: Any, emit: Callable[[str, Mapping[str, Any]], None], call_id: str, agent: str | None
) -> None:
    """Forward a sub-agent's events from ``subscription`` until cancelled (see `_forward_one`)."""
    async for event in subscription:
        _forward_one(event, emit, call_id, agent)


def _replay_factory(
    factory: Callable[[str], Provider],
    working_dir: str,
    on_divergence: Callable[[ReplayDivergence], None] | None,
) -> Callable[[str], Provider]:
    """``factory``, with each scripted provider comparing recorded requests under this project's directory."""

    def build_in_project(spec: str) -> Provider:
        provider = factory(spec)
        if isinstance(provider, ScriptedProvider):
            provider.project_dir = working_dir
            if on_divergence is not None and provider.on_divergence is None:
                provider.on_divergence = on_divergence
        return provider

    return build_in_project


def session_spec(
    config: SessionConfig,
    *,
    system: ActorSystem,
    registry: ToolRegistry | None = None,
    provider_factory: Callable[[str], Provider] | None = None,
    sessions_path: str = "/sessions",
    recorder: Recorder | None = None,
    on_divergence: Callable[[ReplayDivergence], None] | None = None,
    rebuild: Callable[[], ChildSpec] | None = None,
) -> ChildSpec:
    """The ChildSpec of one session's subtree, for the ``sessions`` DynamicSupervisor.

    Args:
        config: the session.
        system: the running system.
        registry: the tools (default: the built-ins).
        provider_factory: builds model providers from ``provider:model``
            (default: `weald.runtime.llm.make_provider`).
        sessions_path: where the session's subtree goes.
        recorder: record the top-level agent's model calls into it
            (``weald run --record``); sub-agents are not recorded.
        on_divergence: for a top-level agent replaying a recording
            (``scripted:FILE``): None stops a turn whose request differs
            from the recorded one with `ReplayDivergence`; a callable is
            told, and the replay goes on (see `ScriptedProvider`).
        rebuild: makes this spec again (``ChildSpec.rebuild``): the
            sessions supervisor then lets the spec, and with it the
            session's configuration and runtime objects, go while the
            session sleeps, and calls it at the wake.

    Raises:
        ValueError: the session id cannot name a path.
    """
    if not valid_session_id(config.session_id):
        msg = f"bad session id {config.session_id!r}: use 1-64 letters, digits, '_', '.' or '-'"
        raise ValueError(msg)
    registry = registry if registry is not None else default_registry
    path = f"{sessions_path.rstrip('/')}/{config.session_id}"
    base = provider_factory if provider_factory is not None else make_provider
    # Recordings compare texts with the project's directory as <project>, so they replay in another checkout.
    project = os.path.abspath(config.working_dir)
    sub_agent_factory = _replay_factory(base, project, None)
    agent_factory = _replay_factory(base, project, on_divergence)
    if recorder is not None:
        agent_factory = recorder.wrap_factory(agent_factory)
    mcp: list[ChildSpec] = []
    if config.mcp_servers:
        from weald.runtime.mcp import mcp_supervisor_spec

        registry = _SessionTools(registry)
        working_dir = config.working_dir
        mcp.append(mcp_supervisor_spec(config.mcp_servers, registry, roots=lambda: (working_dir,)))
    runtime = SessionRuntime(system, path, config, registry, sub_agent_factory)
    children = [
        *mcp,
        ChildSpec(
            "tool_runner",
            ToolRunner,
            args=(config.session_id, config.working_dir),
            kwargs={
                "allowed_dirs": config.allowed_dirs,
                "registry": registry,
                "config": config.runner,
                "output_dir": config.output_dir,
                "runtime": runtime,
                "editor": config.editor,
            },
            shutdown=15.0,
        ),
        # Started by its first message (the first sub_agent call): most sessions never need it.
        ChildSpec("sub_agents", DynamicSupervisor, kwargs={"max_restarts": 10, "max_seconds": 10.0}, lazy=True),
        ChildSpec(
            "agent",
            Agent,
            args=(config.session_id, config.session_id, config.working_dir, config.agent),
            kwargs={
                "registry": registry,
                "runner_path": f"{path}/tool_runner",
                "provider_factory": agent_factory,
                "skills": runtime.skills_prompt,
                "skills_nowait": runtime.skills_prompt_nowait,
                # Asked after hibernate_after idle seconds, or at once by an operator (`Agent.hibernate_now`).
                "hibernate": runtime.hibernate,
                "idle_after": config.hibernate_after,
                "settings": config.settings,
            },
            shutdown=15.0,
        ),
    ]
    return ChildSpec(
        config.session_id,
        Supervisor,
        kwargs={"children": children, "strategy": "rest_for_one", "max_restarts": 5, "max_seconds": 30.0},
        restart=_SESSION_RESTART,
        shutdown=_SESSION_SHUTDOWN,
        rebuild=rebuild,
    )


_SESSION_RESTART: Restart = "transient"
_SESSION_SHUTDOWN = 30.0


def asleep_session_spec(session_id: str, rebuild: Callable[[], ChildSpec]) -> ChildSpec:
    """The spec of a session added asleep: only what `session_spec` makes is known of it before its wake.

    Its id, class, restart type and shutdown, as `session_spec`'s; its
    children and configuration are made by ``rebuild`` (which must return
    `session_spec`'s) when its first message wakes it. For
    ``DynamicSupervisor.add_asleep``, which keeps ``rebuild`` and lets the
    spec go at once: building the whole spec (four specs, the session's
    configuration and runtime) only to drop it was most of an asleep start.
    """
    return ChildSpec(session_id, Supervisor, restart=_SESSION_RESTART, shutdown=_SESSION_SHUTDOWN, rebuild=rebuild)


def session_shape() -> Mapping[str, type[Actor]]:
    """The actors a session's subtree starts, by path relative to the session's.

    Before any tool call or sub-agent: what a session added asleep answers
    for (``DynamicSupervisor.add_hibernated``), as a hibernated one does.
    """
    return _SESSION_SHAPE


_SESSION_SHAPE: Mapping[str, type[Actor]] = MappingProxyType({"tool_runner": ToolRunner, "agent": Agent})


def agent_path(session_id: str, sessions_path: str = "/sessions") -> str:
    """The path of a session's top-level agent."""
    return f"{sessions_path.rstrip('/')}/{session_id}/agent"


def session_dir(store_path: Path, session_id: str) -> Path:
    """Where a session's full tool outputs go by default."""
    return store_path.parent / "weald-outputs" / session_id
