"""An agent session: its supervision subtree and the services its tools reach the runtime through.

::

    /sessions/<id>                Supervisor, rest_for_one
    ├── tool_runner               ToolRunner (each call a temporary child)
    ├── sub_agents                DynamicSupervisor: sub-agents, depth-limited
    └── agent                     Agent (reloads its history on restart)

rest_for_one: if the tool runner dies, the agent (which depends on it) is
restarted too and reloads its history; if the agent dies alone, only the
agent restarts. `SessionRuntime` is what ``ctx.session.runtime`` is for the
tools of this session: questions to the user, sub-agents, the store, events.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from weald.runtime import ActorSystem, Event, Future, Ref, Store, redact
from weald.runtime.agent import Agent, AgentConfig, AskUser, TurnResult
from weald.runtime.llm import Provider
from weald.runtime.tool_runner import RunnerConfig, ToolRunner
from weald.supervisors import ChildSpec, DynamicSupervisor, Supervisor
from weald.tools import ToolRegistry, default_registry

__all__ = [
    "RuntimeView",
    "SessionConfig",
    "SessionRuntime",
    "agent_path",
    "session_dir",
    "session_spec",
    "valid_session_id",
]

_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def valid_session_id(session_id: str) -> bool:
    """A session id is 1-64 letters, digits, ``_``, ``.`` or ``-`` (it names a path in the tree)."""
    return bool(_SESSION_ID.match(session_id))


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
    """

    session_id: str
    working_dir: str
    agent: AgentConfig
    runner: RunnerConfig = attrs.field(factory=RunnerConfig)
    allowed_dirs: tuple[str, ...] = ()
    output_dir: str | None = None


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

    @property
    def session_id(self) -> str:
        """This session's id."""
        return self.config.session_id

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
        base = self.config.agent
        agent_id = "sub-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in call_id)[:48]
        config = AgentConfig(
            model=model or parent_model,
            system_prompt=system_prompt,
            tool_filter=tuple(sorted(allowed)),
            max_steps=base.max_steps,
            depth=depth,
            max_depth=base.max_depth,
            debug_state=base.debug_state,
            sub_agent_timeout=base.sub_agent_timeout,
        )
        spec = ChildSpec(
            agent_id,
            Agent,
            args=(self.session_id, agent_id, self.config.working_dir, config),
            kwargs={
                "registry": self._registry,
                "runner_path": f"{self.session_path}/tool_runner",
                "parent": parent,
                "provider_factory": self._provider_factory,
            },
            restart="temporary",
            shutdown=5.0,
        )
        proxy = sub_agents.proxy()
        child = await proxy.start_child(spec)
        subscription = self._system.events.subscribe("*", source=child.path, max_buffer=4096)
        result: TurnResult | None = None
        try:
            with trio.move_on_after(timeout):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_forward, subscription, emit, call_id)
                    turn_future = await child.proxy().prompt(task)
                    result = await turn_future
                    nursery.cancel_scope.cancel()
        finally:
            subscription.close()
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await proxy.terminate_child(child)
        if result is None:
            msg = f"the sub-agent did not finish within {timeout:g} s"
            raise TimeoutError(msg)
        return result


async def _forward(subscription: Any, emit: Callable[[str, Mapping[str, Any]], None], call_id: str) -> None:
    """Re-emit a sub-agent's events as the parent call's output, tagged with the parent's call id."""
    async for event in subscription:
        emit(
            "sub_agent",
            {"parent_call_id": call_id, "topic": event.topic, "source": event.source, "data": redact(event.data)},
        )


def session_spec(
    config: SessionConfig,
    *,
    system: ActorSystem,
    registry: ToolRegistry | None = None,
    provider_factory: Callable[[str], Provider] | None = None,
    sessions_path: str = "/sessions",
) -> ChildSpec:
    """The ChildSpec of one session's subtree, for the ``sessions`` DynamicSupervisor.

    Raises:
        ValueError: the session id cannot name a path.
    """
    if not valid_session_id(config.session_id):
        msg = f"bad session id {config.session_id!r}: use 1-64 letters, digits, '_', '.' or '-'"
        raise ValueError(msg)
    registry = registry if registry is not None else default_registry
    path = f"{sessions_path.rstrip('/')}/{config.session_id}"
    runtime = SessionRuntime(system, path, config, registry, provider_factory)
    children = [
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
            },
            shutdown=15.0,
        ),
        ChildSpec("sub_agents", DynamicSupervisor, kwargs={"max_restarts": 10, "max_seconds": 10.0}),
        ChildSpec(
            "agent",
            Agent,
            args=(config.session_id, config.session_id, config.working_dir, config.agent),
            kwargs={
                "registry": registry,
                "runner_path": f"{path}/tool_runner",
                "provider_factory": provider_factory,
            },
            shutdown=15.0,
        ),
    ]
    return ChildSpec(
        config.session_id,
        Supervisor,
        kwargs={"children": children, "strategy": "rest_for_one", "max_restarts": 5, "max_seconds": 30.0},
        restart="transient",
        shutdown=30.0,
    )


def agent_path(session_id: str, sessions_path: str = "/sessions") -> str:
    """The path of a session's top-level agent."""
    return f"{sessions_path.rstrip('/')}/{session_id}/agent"


def session_dir(store_path: Path, session_id: str) -> Path:
    """Where a session's full tool outputs go by default."""
    return store_path.parent / "weald-outputs" / session_id
