"""Fault injection: break actors, tools, MCP servers and model calls on purpose, reproducibly.

::

    injector = FaultInjector.from_file("faults.toml")        # or FaultInjector(seed=7)
    injector.install(system)                                  # actor and MCP faults
    factory = injector.wrap_provider_factory(make_provider)   # provider faults
    registry = injector.wrap_registry(default_registry)       # tool faults (sessions' registry)
    injector.inject({"target": "actor", "kind": "crash", "path": "/sessions/*/agent", "message": "ToolResults"})

A `FaultInjector` holds fault declarations (`ActorFault`, `ToolFault`,
`MCPFault`, `ProviderFault`) and applies them at four seams:

- actors: it is the system's `FaultHook`; every receive loop asks it about
  each message before the handler runs (crash, delay, drop);
- tools: `wrap_registry` returns a view of a `ToolRegistry` whose ``select``
  hands out tools that consult it when called (hang, crash, kill the
  subprocess, delay);
- MCP servers: through the same hook, at the ``MCPConnection`` actors (kill
  the server's process group, never answer its calls);
- providers: `as_provider_hook` is the ``faults`` callable of an LLM provider
  (HTTP error statuses, stalls, malformed streams), consulted before each
  HTTP attempt.

Every fault that fires is published as a ``fault.injected`` event whose
source is where it fired (the actor, the tool runner, the agent, the MCP
connection), so the supervisors' ``supervisor.child_crashed`` /
``child_restarted`` / ``gave_up`` events that follow can be correlated by
path; `fault_counts_by_path` gives the daemon's tree its "faults fired here"
counts. Crashes raise `InjectedFault`, whose message names the fault's id.

Replay: each fault draws its random decisions from its own
``random.Random`` seeded from the injector's seed and the fault's id, one
draw per eligible match, in the order its matches happen. So the same
declarations, seed and workload make the same decisions, and one fault's
schedule never depends on another's. "The same workload" means the same
matches in the same order *per fault*: messages to one actor arrive in a
deterministic order when one sender sends them, but matches that race
(two actors sending to a third, concurrent tool calls, retries timed by a
jittered backoff) may reach a fault in a different order from run to run,
and then its decisions follow that order.

Threads: every public method may be called from any thread; decisions are
made under one lock that is never held while anything blocks or sleeps.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import fnmatch
import functools
import itertools
import logging
import random
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, NoReturn

import attrs
import outcome
import pykka
import trio
from pykka.messages import ProxyCall, ProxyGetAttr
from weald.runtime import Actor, ActorSystem, llm
from weald.runtime import _faults_proc as proc
from weald.runtime._faults_spec import (
    KINDS,
    TARGETS,
    ActorFault,
    FaultError,
    FaultPlan,
    FaultProblem,
    FaultSpec,
    FaultSpecError,
    InjectedFault,
    MCPFault,
    ProviderFault,
    ToolFault,
    UnknownFaultError,
    fault_from_dict,
    fault_to_dict,
    parse_plan,
    read_fault_file,
)
from weald.tools import Tool, ToolContext, ToolRegistry

__all__ = [
    "KINDS",
    "TARGETS",
    "ActorFault",
    "FaultError",
    "FaultInjector",
    "FaultPlan",
    "FaultProblem",
    "FaultSpec",
    "FaultSpecError",
    "FaultStatistics",
    "FaultStatus",
    "InjectedFault",
    "MCPFault",
    "ProviderFault",
    "ToolFault",
    "UnknownFaultError",
    "fault_from_dict",
    "fault_to_dict",
    "parse_plan",
    "read_fault_file",
]

# The errors a test meets are named as this module's (pytest shows "weald.runtime.faults.FaultSpecError"),
# not the private module's that defines them.
for _error in (FaultError, FaultSpecError, UnknownFaultError, InjectedFault):
    _error.__module__ = __name__

logger = logging.getLogger("weald.runtime")

# The path of the actor whose receive loop is running, set by `FaultInjector.admit`
# for each message. Tasks inherit a copy of the context they were started from,
# so an I/O task an actor starts while handling a message (an agent's model
# stream) still knows whose it is: that is how provider faults find their agent.
_current_actor: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "weald_faults_current_actor", default=None
)

# Tools that hand `[tools.options.<name>] env` to the subprocesses they start, so
# that a mark put there identifies a faulted call's process exactly.
_MARK_HONOURING_TOOLS: Final = frozenset({"shell"})

# How often a kill_subprocess fault looks for the call's subprocess (growing to the cap).
_POLL_FIRST = 0.002
_POLL_MAX = 0.05


@attrs.frozen
class FaultStatus:
    """One injected fault, as `FaultInjector.list` reports it.

    Attributes:
        id: the fault's id.
        target: ``actor``, ``tool``, ``mcp`` or ``provider``.
        kind: what it does (``crash``, ``hang``, ...).
        spec: the declaration.
        matches: events it matched so far (messages, calls, attempts).
        fires: times it fired.
        exhausted: it fired ``count`` times and will not fire again.
        last_fired: wall-clock time of its last fire, or None.
    """

    id: str
    target: str
    kind: str
    spec: FaultSpec
    matches: int
    fires: int
    exhausted: bool
    last_fired: float | None

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-encodable data (what ``fault.list`` returns per fault)."""
        return {
            "id": self.id,
            "target": self.target,
            "kind": self.kind,
            "spec": fault_to_dict(self.spec),
            "matches": self.matches,
            "fires": self.fires,
            "exhausted": self.exhausted,
            "last_fired": self.last_fired,
        }


@attrs.frozen
class FaultStatistics:
    """Counts over an injector's life (cleared faults included).

    Attributes:
        seed: the seed the injector's decisions derive from.
        active: faults currently injected.
        injected: faults ever injected.
        fires: fires in total.
        fires_by_kind: fires per ``<target>.<kind>`` (``actor.crash``).
        fires_by_fault: fires per fault id.
    """

    seed: int
    active: int
    injected: int
    fires: int
    fires_by_kind: Mapping[str, int]
    fires_by_fault: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-encodable data."""
        return {
            "seed": self.seed,
            "active": self.active,
            "injected": self.injected,
            "fires": self.fires,
            "fires_by_kind": dict(self.fires_by_kind),
            "fires_by_fault": dict(self.fires_by_fault),
        }


# -- matching ---------------------------------------------------------------------------------------

Matcher = Callable[[str], bool]


def _any(_: str) -> bool:
    return True


def _glob(pattern: str) -> Matcher:
    if pattern == "*":
        return _any
    match = re.compile(fnmatch.translate(pattern)).match
    return lambda text: match(text) is not None


def _message_label(message: Any) -> str:
    """How events name a message: its class, or ``call:<method>`` for a proxy call."""
    cls = message.__class__
    if cls is ProxyCall:
        return "call:" + ".".join(message.attr_path)
    if cls is ProxyGetAttr:
        return "get:" + ".".join(message.attr_path)
    return str(cls.__name__)


def _message_matches(match: Matcher, message: Any) -> bool:
    if match is _any:
        return True
    cls = message.__class__
    if match(cls.__name__):
        return True
    return cls in (ProxyCall, ProxyGetAttr) and match(_message_label(message))


class _Armed:
    """An injected fault and its counters; the counters change only under the injector's lock."""

    __slots__ = ("agent", "fires", "id", "last_fired", "matches", "message", "model", "path", "rng", "spec", "tool")

    def __init__(self, spec: FaultSpec, fault_id: str, seed: int) -> None:
        self.spec = spec
        self.id = fault_id
        # One generator per fault, derived from (seed, id): its decisions do not
        # depend on how its matches interleave with other faults' matches.
        self.rng = random.Random(f"{seed}/{fault_id}")  # noqa: S311 - schedules, not secrets
        self.matches = 0
        self.fires = 0
        self.last_fired: float | None = None
        self.path: Matcher = _any
        self.message: Matcher = _any
        self.tool: Matcher = _any
        self.agent: Matcher = _any
        self.model: Matcher = _any
        if isinstance(spec, ActorFault):
            self.path, self.message = _glob(spec.path), _glob(spec.message)
        elif isinstance(spec, ToolFault):
            self.tool, self.agent = _glob(spec.tool), _glob(spec.agent)
        elif isinstance(spec, MCPFault):
            self.path, self.tool = _glob(spec.server), _glob(spec.tool)  # path: the server name
        else:
            self.model, self.agent = _glob(spec.model), _glob(spec.agent)

    @property
    def exhausted(self) -> bool:
        count = self.spec.count
        return count is not None and self.fires >= count

    def decide(self) -> int:
        """Count a match and decide it; returns the fire's number (1-based), or 0 for no fire."""
        spec = self.spec
        self.matches += 1
        eligible = self.matches - spec.after
        if eligible <= 0 or self.exhausted:
            return 0
        if spec.nth is not None:
            fire = eligible % spec.nth == 0
        elif spec.p is not None:
            fire = self.rng.random() < spec.p
        else:
            fire = True
        if not fire:
            return 0
        self.fires += 1
        self.last_fired = time.time()
        return self.fires

    def status(self) -> FaultStatus:
        spec = self.spec
        return FaultStatus(
            id=self.id,
            target=spec.target,
            kind=spec.kind,
            spec=spec,
            matches=self.matches,
            fires=self.fires,
            exhausted=self.exhausted,
            last_fired=self.last_fired,
        )


class _Fire:
    """One decision to fire: what the event says, and where."""

    __slots__ = ("armed", "data", "number", "source")

    def __init__(self, armed: _Armed, number: int, source: str, data: Mapping[str, Any]) -> None:
        self.armed = armed
        self.number = number
        self.source = source
        self.data = data

    @property
    def spec(self) -> FaultSpec:
        return self.armed.spec

    def event(self, **extra: Any) -> dict[str, Any]:
        spec = self.armed.spec
        return {
            "id": self.armed.id,
            "target": spec.target,
            "kind": spec.kind,
            "path": self.source,
            **self.data,
            "fire": self.number,
            "match": self.armed.matches,
            **extra,
        }

    def error(self, what: str) -> InjectedFault:
        spec = self.armed.spec
        message = f"injected fault {self.armed.id!r} ({spec.target} {spec.kind}, fire {self.number}): {what}"
        return InjectedFault(message, fault_id=self.armed.id, target=spec.target, kind=spec.kind, path=self.source)


class _Effect:
    __slots__ = ("delay", "drop", "error", "fatal_signal")

    def __init__(self) -> None:
        self.delay = 0.0
        self.drop = False
        self.error: InjectedFault | None = None
        self.fatal_signal: str | None = None


class _KillProbe:
    """Sent to MCP connection actors for a ``trigger = "now"`` fault; the hook takes it, the actor never sees it."""

    __slots__ = ("fault_id",)

    def __init__(self, fault_id: str) -> None:
        self.fault_id = fault_id


def _mcp_connection_class() -> type[Actor]:
    # Imported when an MCP fault is first injected: weald.runtime.mcp loads the MCP SDK.
    from weald.runtime.mcp import MCPConnection

    return MCPConnection


def _server_pid(actor: Any) -> int | None:
    """The process group of a connected stdio MCP server; runs in the connection actor's own context."""
    snapshot = actor.snapshot()
    if snapshot.status != "running" or snapshot.session is None:
        return None  # a stale pid could have been reused by now
    pid = snapshot.session.pid
    return pid if isinstance(pid, int) else None


# -- tools ---------------------------------------------------------------------------------------------


def _agent_path(ctx: ToolContext) -> str | None:
    # The runner hands every call the calling agent's frozen snapshot.
    path = getattr(ctx.snapshot, "path", None)
    return path if isinstance(path, str) else None


def _runner_path(ctx: ToolContext) -> str:
    """The tool runner the call runs under: from its session, or from the task's actor."""
    session_path = getattr(getattr(ctx.session, "runtime", None), "session_path", None)
    if isinstance(session_path, str):
        return f"{session_path}/tool_runner"
    # Outside a session: the call runs in its execution actor, a child of the
    # runner's `calls` supervisor (`<runner>/calls/<call>`, see weald.runtime.agents.tool_runner).
    actor = _current_actor.get()
    if actor is None:
        return "/"
    runner, calls, _ = actor.rpartition("/calls/")
    return (runner or "/") if calls else actor


def _with_mark(ctx: ToolContext, mark: str) -> ToolContext:
    """``ctx`` with ``WEALD_FAULT_MARK=<mark>`` added to the environment the shell tool builds."""
    options = {name: dict(values) for name, values in ctx.config.options.items()}
    shell = options.setdefault("shell", {})
    env = dict(shell.get("env", {}))
    env[proc.MARK_VARIABLE] = mark
    shell["env"] = env
    return attrs.evolve(ctx, config=attrs.evolve(ctx.config, options=options))


async def _call_tool(tool: Tool, ctx: ToolContext, arguments: Mapping[str, Any]) -> Any:
    """Run the tool's own function as `weald.tools.invoke` does (it has validated the arguments)."""
    if tool.is_async:
        return await tool.fn(ctx, **arguments)  # type: ignore[misc]
    return await trio.to_thread.run_sync(functools.partial(tool.fn, ctx, **arguments), abandon_on_cancel=True)


class _FaultedTool:
    """A tool function that asks the injector, at each call, whether a tool fault fires.

    Attributes:
        tool: the tool it stands in for.
        __wrapped__: that tool's own function.
    """

    __slots__ = ("__wrapped__", "_injector", "tool")

    def __init__(self, injector: FaultInjector, tool: Tool) -> None:
        self._injector = injector
        self.tool = tool
        self.__wrapped__ = tool.fn

    def __repr__(self) -> str:
        return f"<faulted {self.tool.name}>"

    async def __call__(self, ctx: ToolContext, /, **arguments: Any) -> Any:
        return await self._injector._run_tool(self.tool, ctx, arguments)


class _FaultingRegistry(ToolRegistry):
    """A live view of a `ToolRegistry` whose `select` hands out tools with faults applied.

    Every method reads and writes the wrapped registry, so tools registered
    there later (MCP tools) are covered. Only `select`, which is what the
    tool runner and agents call, applies faults; `get` returns the tool as
    registered, since registrars (the MCP connection) compare a tool's
    function by identity.
    """

    def __init__(self, injector: FaultInjector, base: ToolRegistry) -> None:
        super().__init__()
        self._injector = injector
        self._base = base

    def __repr__(self) -> str:
        return f"<faulting {self._base!r}>"

    def __contains__(self, name: object) -> bool:
        return name in self._base

    def __len__(self) -> int:
        return len(self._base)

    def register(self, tool_: Tool, *, replace: bool = False) -> Tool:
        """Add a tool to the wrapped registry."""
        return self._base.register(tool_, replace=replace)

    def unregister(self, name: str) -> bool:
        """Remove a tool from the wrapped registry."""
        return self._base.unregister(name)

    def get(self, name: str) -> Tool | None:
        """The tool as registered (no faults applied)."""
        return self._base.get(name)

    def names(self) -> list[str]:
        """Every tool name, sorted."""
        return self._base.names()

    def select(self, patterns: Iterable[str] | None = None) -> list[Tool]:
        """The tools a filter allows, each with the tool faults that may match it applied."""
        return [self._injector._faulted(tool) for tool in self._base.select(patterns)]

    def copy(self) -> ToolRegistry:
        """A faulting view of a copy of the wrapped registry."""
        return _FaultingRegistry(self._injector, self._base.copy())


# -- the injector ------------------------------------------------------------------------------------


class FaultInjector:
    """Holds fault declarations, decides when they fire, and applies them at every seam.

    It implements the system's `FaultHook` (`admit`, `admit_blocking`):
    install it with `install`. Everything else is opt-in per seam:
    `wrap_registry` for tool faults, `as_provider_hook` (or
    `wrap_provider_factory`) for provider faults.

    Args:
        seed: the seed of every random decision; None picks one (reported
            by `statistics` and in events, so any run can be replayed).
    """

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self._lock = threading.Lock()
        self._armed: dict[str, _Armed] = {}  # in injection order
        # Copy-on-write snapshots per seam: the hot paths read them without the lock.
        self._message_faults: tuple[_Armed, ...] = ()  # actor faults and MCP trigger=call faults
        self._tool_faults: tuple[_Armed, ...] = ()
        self._provider_faults: tuple[_Armed, ...] = ()
        self._pending_probes: list[str] = []  # trigger=now faults injected before install
        self._mcp_class: type[Actor] | None = None
        self._system: ActorSystem | None = None
        self._ids = itertools.count(1)
        self._injected = 0
        self._fires = 0
        self._by_kind: dict[str, int] = {}
        self._by_fault: dict[str, int] = {}
        self._by_path: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<FaultInjector seed={self._seed} faults={len(self._armed)} fires={self._fires}>"

    @classmethod
    def from_file(cls, path: str | Path) -> FaultInjector:
        """An injector holding a fault file's declarations, seeded with its ``seed`` (if it sets one).

        Raises:
            FaultSpecError: the file cannot be read or is invalid; every problem with its key path.
        """
        plan = read_fault_file(path)
        injector = cls(seed=plan.seed)
        injector._inject_plan(plan)
        return injector

    @property
    def seed(self) -> int:
        """The seed the random decisions of faults injected from now on derive from."""
        return self._seed

    # -- declarations ----------------------------------------------------------------------------

    def inject(self, spec: FaultSpec | Mapping[str, Any]) -> str:
        """Add a fault; it applies from the next match on. Returns its id.

        Args:
            spec: a declaration, or plain data shaped as one entry of a
                fault file's ``faults`` array (``{"target": "tool", "kind":
                "hang", "tool": "shell"}``), as ``fault.inject`` receives it.

        Raises:
            FaultSpecError: the declaration is invalid, or its id is taken.
        """
        if not isinstance(spec, ActorFault | ToolFault | MCPFault | ProviderFault):
            spec = fault_from_dict(spec)
        return self._inject_plan(FaultPlan(seed=None, faults=(spec,), source="<fault>"))[0]

    def load(self, path: str | Path) -> builtins.list[str]:
        """Inject every fault of a TOML (``.toml``) or JSON (``.json``) fault file; returns their ids.

        A ``seed`` in the file becomes the injector's seed first (for these
        faults and any injected later). Nothing is injected if anything is wrong.

        Raises:
            FaultSpecError: the file cannot be read, is invalid, or declares
                an id already injected; every problem with its key path.
        """
        return self._inject_plan(read_fault_file(path))

    def _inject_plan(self, plan: FaultPlan) -> builtins.list[str]:
        if any(isinstance(spec, MCPFault) for spec in plan.faults) and self._mcp_class is None:
            self._mcp_class = _mcp_connection_class()
        ids: list[str] = []
        probes: list[str] = []
        with self._lock:
            single = plan.source == "<fault>"
            taken = [
                FaultProblem(plan.source, "id" if single else f"faults[{index}].id", _taken(spec.id))
                for index, spec in enumerate(plan.faults)
                if spec.id is not None and spec.id in self._armed
            ]
            if taken:
                raise FaultSpecError(taken)
            if plan.seed is not None:
                self._seed = plan.seed
            for declared in plan.faults:
                fault_id = declared.id or self._new_id(declared)
                spec = declared if declared.id is not None else attrs.evolve(declared, id=fault_id)
                self._armed[fault_id] = _Armed(spec, fault_id, self._seed)
                self._injected += 1
                ids.append(fault_id)
                if isinstance(spec, MCPFault) and spec.trigger == "now":
                    (probes if self._system is not None else self._pending_probes).append(fault_id)
            self._rebuild()
            system = self._system
            specs = [self._armed[fault_id].spec for fault_id in ids]
        for fault_id, spec in zip(ids, specs, strict=True):
            self._publish("fault.armed", "/", {"id": fault_id, "spec": fault_to_dict(spec)})
        if system is not None:
            for fault_id in probes:
                self._probe_servers(system, fault_id)
        return ids

    def _new_id(self, spec: FaultSpec) -> str:
        while True:
            candidate = f"{spec.target}-{spec.kind}-{next(self._ids)}"
            if candidate not in self._armed:
                return candidate

    def _rebuild(self) -> None:
        armed = list(self._armed.values())
        self._message_faults = tuple(
            a
            for a in armed
            if isinstance(a.spec, ActorFault) or (isinstance(a.spec, MCPFault) and a.spec.trigger == "call")
        )
        self._tool_faults = tuple(a for a in armed if isinstance(a.spec, ToolFault))
        self._provider_faults = tuple(a for a in armed if isinstance(a.spec, ProviderFault))

    def clear(self, fault_id: str | None = None) -> int:
        """Remove one fault (by id), or every fault (None); returns how many were removed.

        Fire counts stay in `statistics` and `fault_counts_by_path`. A call
        a fault is already hanging stays hung until it is cancelled.

        Raises:
            UnknownFaultError: no injected fault has that id.
        """
        with self._lock:
            if fault_id is None:
                removed = list(self._armed.values())
            elif fault_id in self._armed:
                removed = [self._armed[fault_id]]
            else:
                known = ", ".join(self._armed) or "none"
                msg = f"no injected fault has the id {fault_id!r} (injected: {known})"
                raise UnknownFaultError(msg)
            for armed in removed:
                del self._armed[armed.id]
                with contextlib.suppress(ValueError):
                    self._pending_probes.remove(armed.id)
            self._rebuild()
        for armed in removed:
            self._publish("fault.cleared", "/", {"id": armed.id, "fires": armed.fires, "matches": armed.matches})
        return len(removed)

    def list(self) -> builtins.list[FaultStatus]:
        """The injected faults, in injection order, with their counters."""
        with self._lock:
            return [armed.status() for armed in self._armed.values()]

    def statistics(self) -> FaultStatistics:
        """Counts of fires by kind and by fault, over the injector's life."""
        with self._lock:
            return FaultStatistics(
                seed=self._seed,
                active=len(self._armed),
                injected=self._injected,
                fires=self._fires,
                fires_by_kind=dict(self._by_kind),
                fires_by_fault=dict(self._by_fault),
            )

    def fault_counts_by_path(self) -> dict[str, int]:
        """Fires per path where they happened (actor, tool runner, agent, MCP connection), cleared faults included.

        For the daemon's tree: "faults fired here: N" on each node. Provider
        faults whose agent was not known are not counted here.
        """
        with self._lock:
            return dict(self._by_path)

    # -- installation --------------------------------------------------------------------------------

    def install(self, system: ActorSystem) -> None:
        """Make this injector the system's fault hook, and publish its events on the system's bus.

        ``trigger = "now"`` faults injected before are decided now.

        Raises:
            FaultError: the system already has another fault hook, or this
                injector is installed in another system.
        """
        with self._lock:
            if self._system is not None and self._system is not system:
                msg = "this FaultInjector is installed in another ActorSystem; uninstall it there first"
                raise FaultError(msg)
            current = system._faults
            if current is not None and current is not self:
                msg = f"the system already has a fault hook ({current!r}); remove it with set_fault_hook(None)"
                raise FaultError(msg)
            self._system = system
            probes, self._pending_probes = self._pending_probes, []
        system.set_fault_hook(self)
        for fault_id in probes:
            self._probe_servers(system, fault_id)

    def uninstall(self) -> None:
        """Stop consulting this injector for actor and MCP faults (tool and provider seams stay wired)."""
        with self._lock:
            system, self._system = self._system, None
        if system is not None and system._faults is self:
            system.set_fault_hook(None)

    def _probe_servers(self, system: ActorSystem, fault_id: str) -> None:
        cls = self._mcp_class
        assert cls is not None
        for path in system.registered():
            ref = system.whereis(path)
            if ref is not None and issubclass(ref.actor_class, cls):
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(_KillProbe(fault_id))

    # -- the actor seam (FaultHook) ---------------------------------------------------------------------

    async def admit(self, actor: Actor, message: Any) -> bool:
        """Decide the fate of ``message`` for a loop actor: True to handle it, False to drop it.

        Raises `InjectedFault` for a crash; sleeps for a delay. Runs on the
        loop thread, in the actor's own task.
        """
        _current_actor.set(actor.path)
        if message.__class__ is _KillProbe:
            self._on_probe(actor, message)
            return False
        if not self._message_faults:
            return True
        effect = self._message_effect(actor, message)
        if effect is None:
            return True
        if effect.delay:
            await trio.sleep(effect.delay)
        if effect.error is not None:
            raise effect.error
        return not effect.drop

    def admit_blocking(self, actor: Actor, message: Any) -> bool:
        """`admit` for a thread actor: runs on the actor's thread, and blocks it for a delay."""
        _current_actor.set(actor.path)
        if message.__class__ is _KillProbe:
            self._on_probe(actor, message)
            return False
        if not self._message_faults:
            return True
        effect = self._message_effect(actor, message)
        if effect is None:
            return True
        if effect.delay:
            time.sleep(effect.delay)
        if effect.error is not None:
            raise effect.error
        return not effect.drop

    def _message_effect(self, actor: Actor, message: Any) -> _Effect | None:
        path = actor.path
        candidates: list[tuple[_Armed, int | None]] = []
        mcp_class = self._mcp_class
        is_call = mcp_class is not None and isinstance(actor, mcp_class) and message.__class__.__name__ == "CallTool"
        for armed in self._message_faults:
            spec = armed.spec
            if isinstance(spec, ActorFault):
                if armed.path(path) and _message_matches(armed.message, message):
                    candidates.append((armed, None))
            elif is_call and armed.path(str(getattr(actor, "server", ""))) and armed.tool(str(message.tool)):
                if spec.kind == "hang":
                    candidates.append((armed, None))
                else:
                    pid = _server_pid(actor)
                    if pid is not None:  # an HTTP server, or not connected: nothing to kill
                        candidates.append((armed, pid))
        if not candidates:
            return None
        label = _message_label(message)
        fires: list[tuple[_Fire, int | None]] = []
        with self._lock:
            for armed, pid in candidates:
                number = self._decide(armed, path)
                if number:
                    data: dict[str, Any] = {"message": label}
                    if pid is not None or isinstance(armed.spec, MCPFault):
                        data.update(server=getattr(actor, "server", None), tool=getattr(message, "tool", None))
                    fires.append((_Fire(armed, number, path, data), pid))
        if not fires:
            return None
        effect = _Effect()
        for fire, pid in fires:
            spec = fire.spec
            extra: dict[str, Any] = {}
            if isinstance(spec, ActorFault):
                if spec.kind == "crash" and effect.error is None:
                    effect.error = fire.error(f"crashed {path} on {label}")
                elif spec.kind == "delay":
                    effect.delay += spec.seconds or 0.0
                elif spec.kind == "drop":
                    effect.drop = True
                elif spec.kind == "fatal_signal":
                    effect.fatal_signal = spec.signal or "SIGSEGV"
                    extra["signal"] = effect.fatal_signal
                if spec.kind == "delay":
                    extra["seconds"] = spec.seconds
            elif spec.kind == "hang":
                effect.drop = True  # never answered: the caller waits until its timeout
            elif pid is not None:
                proc.kill_group(pid)
                extra["pid"] = pid
            self._publish("fault.injected", path, fire.event(**extra))
        if effect.fatal_signal is not None:
            # The whole process goes, as after a crash in C code: faulthandler prints every thread's stack,
            # this one's as the current thread (a signal sent to this thread arrives before the call returns).
            signal.pthread_kill(threading.get_ident(), signal.Signals[effect.fatal_signal])
        return effect

    def _on_probe(self, actor: Actor, probe: _KillProbe) -> None:
        mcp_class = self._mcp_class
        with self._lock:
            armed = self._armed.get(probe.fault_id)
        if armed is None or mcp_class is None or not isinstance(actor, mcp_class):
            return
        server = str(getattr(actor, "server", ""))
        if not armed.path(server):
            return
        pid = _server_pid(actor)
        if pid is None:
            return
        with self._lock:
            number = self._decide(armed, actor.path)
        if number:
            proc.kill_group(pid)
            fire = _Fire(armed, number, actor.path, {"server": server, "trigger": "now"})
            self._publish("fault.injected", actor.path, fire.event(pid=pid))

    def _decide(self, armed: _Armed, path: str | None) -> int:
        """Decide one match and count the fire; the caller holds the lock."""
        if self._armed.get(armed.id) is not armed:
            return 0  # cleared meanwhile
        number = armed.decide()
        if number:
            spec = armed.spec
            kind = f"{spec.target}.{spec.kind}"
            self._fires += 1
            self._by_kind[kind] = self._by_kind.get(kind, 0) + 1
            self._by_fault[armed.id] = self._by_fault.get(armed.id, 0) + 1
            if path:
                self._by_path[path] = self._by_path.get(path, 0) + 1
        return number

    def _publish(self, topic: str, source: str, data: Mapping[str, Any]) -> None:
        """Publish on the installed system's bus, with the seed (for replay); log each fire."""
        if topic == "fault.injected":
            logger.info("fault %s fired at %s: %s", data.get("id"), source, data)
        system = self._system
        if system is not None:
            system.events.publish(topic, source, {**data, "seed": self._seed})

    # -- the tool seam ---------------------------------------------------------------------------------------

    def wrap_registry(self, registry: ToolRegistry) -> ToolRegistry:
        """A live view of ``registry`` whose ``select`` applies this injector's tool faults.

        Give it to what runs tool calls (``session_spec(registry=...)``, a
        `ToolRunner`); give registrars (the MCP supervisor) the registry
        itself. Tools registered in ``registry`` later are covered too.
        A fault decides when the call runs, not when the tool is selected.
        """
        return _FaultingRegistry(self, registry)

    def _faulted(self, tool: Tool) -> Tool:
        if isinstance(tool.fn, _FaultedTool) or not any(armed.tool(tool.name) for armed in self._tool_faults):
            return tool
        return attrs.evolve(tool, fn=_FaultedTool(self, tool), is_async=True)

    async def _run_tool(self, tool: Tool, ctx: ToolContext, arguments: Mapping[str, Any]) -> Any:
        agent = _agent_path(ctx)
        where = _runner_path(ctx)
        candidates = [
            armed
            for armed in self._tool_faults
            if armed.tool(tool.name) and (armed.agent is _any or (agent is not None and armed.agent(agent)))
        ]
        if not candidates:
            return await _call_tool(tool, ctx, arguments)
        data = {"tool": tool.name, "call_id": ctx.call_id, "agent": agent}
        with self._lock:
            fires = [
                _Fire(armed, number, where, data) for armed in candidates if (number := self._decide(armed, where))
            ]
        delay = 0.0
        crash: _Fire | None = None
        hang: _Fire | None = None
        kill: _Fire | None = None
        for fire in fires:
            spec = fire.spec
            assert isinstance(spec, ToolFault)
            if spec.kind == "kill_subprocess":
                kill = kill or fire  # its event says what was killed, once it is
                continue
            if spec.kind == "delay":
                delay += spec.seconds or 0.0
            elif spec.kind == "crash":
                crash = crash or fire
            else:
                hang = hang or fire
            self._publish("fault.injected", where, fire.event(seconds=spec.seconds))
        if delay:
            await trio.sleep(delay)
        if crash is not None:
            raise crash.error(f"{tool.name} crashed (call {ctx.call_id or '?'})")
        if hang is not None:
            await _hang()
        if kill is not None:
            return await self._kill_mid_call(tool, ctx, arguments, kill)
        return await _call_tool(tool, ctx, arguments)

    async def _kill_mid_call(self, tool: Tool, ctx: ToolContext, arguments: Mapping[str, Any], fire: _Fire) -> Any:
        """Run the tool, and SIGKILL the process group it starts once it appears."""
        spec = fire.spec
        assert isinstance(spec, ToolFault)
        mark = uuid.uuid4().hex
        ctx = _with_mark(ctx, mark)
        # A /proc scan on the loop thread: a few hundred small reads from kernel memory.
        before = proc.session_leaders()
        unmarked = tool.name not in _MARK_HONOURING_TOOLS
        killed: list[int] = []

        async def kill_when_seen() -> None:
            delay = _POLL_FIRST
            while (pgid := proc.find_group(mark, before, unmarked=unmarked)) is None:
                await trio.sleep(delay)
                delay = min(delay * 2, _POLL_MAX)
            if spec.seconds:
                await trio.sleep(spec.seconds)
            proc.kill_group(pgid)
            killed.append(pgid)
            self._publish("fault.injected", fire.source, fire.event(pgid=pgid, mark=mark))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_when_seen)
            result = await outcome.acapture(_call_tool, tool, ctx, arguments)
            nursery.cancel_scope.cancel()
        if not killed:
            note = "the call ended before it started a subprocess"
            self._publish("fault.injected", fire.source, fire.event(pgid=None, mark=mark, note=note))
        return result.unwrap()

    # -- the provider seam -----------------------------------------------------------------------------

    def as_provider_hook(self, model: str = "") -> llm.FaultHook:
        """The ``faults`` callable for an LLM provider: ``provider.faults = injector.as_provider_hook(spec)``.

        Args:
            model: the spec the provider was built from (``openai:gpt-4.1``);
                fault ``model`` patterns match it, as well as the provider's
                own ``provider:model`` and bare model.
        """

        def hook(point: llm.FaultPoint, /) -> llm.Fault | None:
            return self._provider_fault(point, model)

        return hook

    def wrap_provider_factory(
        self, factory: Callable[[str], llm.Provider] | None = None
    ) -> Callable[[str], llm.Provider]:
        """A provider factory (as agents take) whose providers consult this injector.

        Args:
            factory: builds a provider from a ``provider:model`` spec;
                `weald.runtime.llm.make_provider` when None.

        Returns:
            A factory that builds with ``factory`` and sets each provider's
            ``faults`` to `as_provider_hook` of the spec. It raises
            `FaultError` for a provider that has no ``faults`` attribute.
        """
        build = factory if factory is not None else llm.make_provider

        def build_with_faults(spec: str) -> llm.Provider:
            provider = build(spec)
            if not hasattr(provider, "faults"):
                msg = f"provider {provider!r} (for {spec!r}) has no faults attribute, so faults cannot be injected"
                raise FaultError(msg)
            provider.faults = self.as_provider_hook(spec)
            return provider

        return build_with_faults

    def _provider_fault(self, point: llm.FaultPoint, label: str) -> llm.Fault | None:
        faults = self._provider_faults
        if not faults:
            return None
        agent = _current_actor.get()
        names = [name for name in (f"{point.provider}:{point.model}", point.model, label) if name]
        candidates = [
            armed
            for armed in faults
            if any(armed.model(name) for name in names)
            and (armed.agent is _any or (agent is not None and armed.agent(agent)))
        ]
        if not candidates:
            return None
        where = agent or "/"
        data = {"model": f"{point.provider}:{point.model}", "attempt": point.attempt, "agent": agent}
        with self._lock:
            fires = [
                _Fire(armed, number, where, data) for armed in candidates if (number := self._decide(armed, agent))
            ]
        for fire in fires:
            self._publish("fault.injected", where, fire.event())
        if not fires:
            return None
        spec = fires[0].spec
        assert isinstance(spec, ProviderFault)
        if spec.kind == "http_error":
            text = spec.error_text or f"injected fault {fires[0].armed.id!r}"
            return llm.HTTPErrorFault(status=spec.status or 500, retry_after=spec.retry_after, message=text)
        if spec.kind == "timeout":
            return llm.TimeoutFault()
        return llm.MalformedStreamFault()


def _taken(fault_id: str | None) -> str:
    return f'a fault with the id "{fault_id}" is already injected; clear it first or choose another id'


async def _hang() -> NoReturn:
    """Wait until cancelled: the call never returns on its own."""
    await trio.sleep_forever()
