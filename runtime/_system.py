"""The actor system: the loop thread, the root supervisor, the registry, the bus, the store.

::

    with ActorSystem(store_path="state.db") as system:
        ref = system.spawn(MyActor, name="worker")
        system.whereis("/worker")          # O(1), gone once the actor ends

The root supervisor (one_for_one, path ``/``) owns three infrastructure
children, started in this order and stopped in reverse: ``/store`` (owns the
`Store`), ``/events`` (the `EventBus`) and ``/io`` (the trio `Loop`). The
daemon adds its own subtrees (``/mcp``, ``/sessions``, ``/server``) with
``system.root.proxy().start_child(...)``.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

import attrs
from weald.runtime._actor import Actor, Down, Ref, ThreadActor
from weald.runtime._errors import LoopBlockedError, NameTakenError, NoSystemError, StoreError, WealdError
from weald.runtime._events import EventBus
from weald.runtime._loop import Loop
from weald.runtime._secrets import refresh_from_env
from weald.runtime._store import Store
from weald.runtime._store_backend import mask_url
from weald.runtime._stub import Stub, StubState, _Group, shape_of

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "ActorSystem",
    "ComponentSnapshot",
    "EventsActor",
    "FaultHook",
    "IOActor",
    "SleepingChild",
    "StoreActor",
    "StoreSnapshot",
    "SystemStatistics",
]

logger = logging.getLogger("weald.runtime")

A = TypeVar("A", bound=Actor)

SleepingChild = tuple[type[Actor], StubState, Callable[[], None], Mapping[str, type[Actor]]]
"""A sleeping child as a supervisor's table describes it: its class, state, wake-up and subtree shape."""


class FaultHook(Protocol):
    """What the receive loops consult, per message, when fault injection is on.

    Return False to drop the message; raise to crash the actor as if its
    handler had raised; sleep (``admit``) or block (``admit_blocking``) to
    delay it. Installed with `ActorSystem.set_fault_hook`.
    """

    async def admit(self, actor: Actor, message: Any) -> bool:
        """Decide the fate of ``message`` for a loop actor."""
        ...

    def admit_blocking(self, actor: Actor, message: Any) -> bool:
        """Decide the fate of ``message`` for a thread actor."""
        ...


@attrs.frozen
class SystemStatistics:
    """Counts describing a running system."""

    actors: int
    loop_tasks: int
    events_published: int
    orphan_exits: int
    store: dict[str, Any]


@attrs.frozen
class StoreSnapshot:
    """The ``/store`` actor's state: the store's file and counters."""

    path: str
    status: str
    statistics: dict[str, Any]


class StoreActor(ThreadActor):
    """Owns the `Store`: opens it on start (a bad file or database fails the start); closes it on stop."""

    def __init__(self, path: str, durability: Literal["process", "power"] = "process", url: str | None = None) -> None:
        super().__init__()
        self._store_path = path
        self._durability = durability
        self._url = url

    def on_start(self) -> None:
        self.system._store = Store(self._store_path, url=self._url, durability=self._durability)

    def on_stop(self) -> None:
        store = self.system._store
        if store is not None:
            store.close()

    def on_failure(self, *_: object) -> None:
        self.on_stop()

    def snapshot(self) -> StoreSnapshot:
        store = self.system._store
        stats = store.statistics() if store is not None else {}
        where = store.location if store is not None else self._store_path
        return StoreSnapshot(path=where, status=self._status, statistics=stats)


@attrs.frozen
class ComponentSnapshot:
    """State of an infrastructure actor that fronts a shared component."""

    path: str
    kind: str
    status: str
    statistics: dict[str, Any]


class EventsActor(Actor):
    """The ``/events`` node: fronts the system's `EventBus` for introspection.

    Publishing does not go through this actor (it would add a hop to every
    event); the bus is thread-safe and non-blocking on its own.
    """

    def snapshot(self) -> ComponentSnapshot:
        return ComponentSnapshot(self.path, "EventBus", self._status, self.system.events.statistics())


class IOActor(Actor):
    """The ``/io`` node: fronts the trio `Loop` thread for introspection."""

    def snapshot(self) -> ComponentSnapshot:
        stats = self.system.loop.statistics()
        return ComponentSnapshot(self.path, "Loop", self._status, {"running": stats.running, "tasks": stats.tasks})


class ActorSystem:
    """Starts and stops the runtime; usable as a context manager.

    Args:
        store_path: the store's database file, whose directory is the
            state directory; None uses a private temporary file, removed at
            shutdown.
        store_url: a ``postgresql://`` URL: the data lives in that database
            (``store_path`` still names the state directory).
        durability: see `Store`.
        ring_size: recent events kept by the bus.
        root_max_restarts: restart intensity of the root supervisor.
        root_max_seconds: its window.

    Attributes:
        run_id: a random id of this system's one run (a system starts once):
            what a record written by an earlier process cannot carry.
    """

    __weald_shared__ = True  # shared by every actor: not in one actor's memory estimate

    _running: ClassVar[list[ActorSystem]] = []
    _running_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        *,
        store_path: str | Path | None = None,
        store_url: str | None = None,
        durability: Literal["process", "power"] = "process",
        ring_size: int = 2048,
        root_max_restarts: int = 10,
        root_max_seconds: float = 10.0,
    ) -> None:
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        if store_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="weald-store-")
            store_path = Path(self._tmpdir.name) / "store.db"
        self.store_path = Path(store_path).expanduser()
        self.store_url = store_url
        self._durability = durability
        self._root_intensity = (root_max_restarts, root_max_seconds)
        self.loop = Loop()
        self.events = EventBus(ring_size=ring_size)
        self._store: Store | None = None
        self._registry: dict[str, Ref[Any]] = {}
        # The actors themselves, without the stubs (100,000 asleep sessions are 100,000 stubs): `actors`.
        self._live: dict[str, Ref[Any]] = {}
        self._registry_lock = threading.Lock()
        # Supervisors' tables of sleeping children whose stubs are not made yet, by the supervisor's path
        # (without its final '/'): a million asleep sessions are a million table rows, not a million stubs.
        self._sleeping: dict[str, Callable[[str], SleepingChild | None]] = {}
        self._toplevel: OrderedDict[str, Ref[Any]] = OrderedDict()
        self._orphan_exits: deque[Down] = deque(maxlen=256)
        self._orphan_count = 0
        self._faults: FaultHook | None = None
        self._root: Ref[Any] | None = None
        self._state = "new"
        # A system runs once: records an earlier process wrote carry another run id.
        self.run_id = uuid.uuid4().hex

    def __repr__(self) -> str:
        return f"<ActorSystem {self._state} actors={len(self._registry)} store={self.store_path}>"

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ActorSystem:
        """Start the loop thread and the root tree; returns self.

        Raises:
            StartError: an infrastructure child failed to start, e.g. the
                store file is corrupt (the cause is chained).
        """
        from weald.supervisors import ChildSpec, Supervisor

        if self._state != "new":
            msg = f"an ActorSystem starts once; this one is {self._state}"
            raise WealdError(msg)
        refresh_from_env()
        self.loop.start()
        self._state = "running"
        with self._running_lock:
            self._running.append(self)
        children = [
            ChildSpec(
                "store",
                StoreActor,
                kwargs={"path": str(self.store_path), "durability": self._durability, "url": self.store_url},
            ),
            ChildSpec("events", EventsActor),
            ChildSpec("io", IOActor),
        ]
        max_restarts, max_seconds = self._root_intensity
        try:
            self._root = Supervisor._spawn(
                self,
                "/",
                None,
                (children,),
                {"strategy": "one_for_one", "max_restarts": max_restarts, "max_seconds": max_seconds},
            )
            self._root.started().get(timeout=timeout)
        except BaseException:
            self._teardown()
            raise
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every actor, last started first, then the loop; leaves no thread behind.

        Raises:
            LoopBlockedError: called from the loop thread (from an actor).
        """
        if self.loop.in_loop_thread():
            msg = "ActorSystem.shutdown() cannot run on the loop thread; call it from outside the actors"
            raise LoopBlockedError(msg)
        if self._state != "running":
            return
        self._state = "stopping"
        for ref in reversed(list(self._toplevel.values())):
            with contextlib.suppress(Exception):
                ref.stop(block=True, timeout=timeout)
        if self._root is not None:
            with contextlib.suppress(Exception):
                self._root.stop(block=True, timeout=timeout)
        self._teardown()

    def _teardown(self) -> None:
        self.loop.stop()
        if self._store is not None and not self._store.closed:
            self._store.close()
        with self._running_lock:
            if self in self._running:
                self._running.remove(self)
        self._state = "stopped"
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> ActorSystem:
        if self._state == "new":
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    @property
    def running(self) -> bool:
        """True between `start` and `shutdown`."""
        return self._state in ("running", "stopping") and self.loop.running

    @classmethod
    def current(cls) -> ActorSystem:
        """Return the most recently started system that is still running.

        Raises:
            NoSystemError: none is running.
        """
        with cls._running_lock:
            if cls._running:
                return cls._running[-1]
        msg = "no ActorSystem is running; start one with `with ActorSystem() as system:`"
        raise NoSystemError(msg)

    # -- components --------------------------------------------------------------------

    @property
    def root(self) -> Ref[Any]:
        """The root supervisor's ref (path ``/``)."""
        if self._root is None:
            msg = "the actor system has not started"
            raise NoSystemError(msg)
        return self._root

    @property
    def store(self) -> Store:
        """The persistent store, owned by the ``/store`` actor.

        Raises:
            StoreError: the store actor is not running (e.g. restarting).
        """
        store = self._store
        if store is None or store.closed:
            where = mask_url(self.store_url) if self.store_url else self.store_path
            msg = f"the store {where} is not open (its actor is not running)"
            raise StoreError(msg)
        return store

    def set_fault_hook(self, hook: FaultHook | None) -> None:
        """Install (or remove, with None) the per-message fault hook."""
        self._faults = hook

    # -- actors ---------------------------------------------------------------------------

    def spawn(
        self,
        actor_class: type[A],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        name: str | None = None,
    ) -> Ref[A]:
        """Start a top-level actor at ``/<name>``; its end is reported to the system.

        Raises:
            NameTakenError: a live actor already holds that path.
        """
        if name is None:
            return actor_class.start(*args, **(kwargs or {}))
        return actor_class._spawn(self, f"/{name}", None, args, kwargs or {})

    def whereis(self, path: str) -> Ref[Any] | None:
        """Return the live actor registered at ``path``, or None. O(1) when it runs.

        For an actor that is not running but starts on its first message (a
        lazy child, or one in a hibernated subtree), the answer is its
        `Stub`, a `Ref` like any other: whatever is sent to it wakes it.
        """
        ref = self._registry.get(path)
        if ref is None:
            return self._stub_below(path)
        return ref

    def _stub_below(self, path: str) -> Ref[Any] | None:
        # A miss: is it a sleeping child whose stub is not made yet, or is an
        # ancestor a stub whose sleeping subtree had this path?
        registry = self._registry
        made = self._stub_asleep(path)
        if made is not None:
            return made
        parent = path
        while True:
            cut = parent.rfind("/")
            if cut <= 0:
                return None
            parent = parent[:cut]
            above = registry.get(parent)
            if above is None:
                above = self._stub_asleep(parent)
                if above is None:
                    continue
            if above.__class__ is not Stub:
                return None
            with self._registry_lock:
                again = registry.get(path)
                if again is not None:
                    return again
                stub = above._below(path)
                if stub is not None:
                    registry[path] = stub
                return stub

    def _stub_asleep(self, path: str) -> Ref[Any] | None:
        """The stub of a sleeping child at ``path``, made now from its supervisor's table (else None)."""
        parent, _, name = path.rpartition("/")
        table = self._sleeping.get(parent)
        if table is None:
            return None
        with self._registry_lock:
            again = self._registry.get(path)
            if again is not None:
                return again  # registered meanwhile (its stub, or the child itself once woken)
            child = table(name)
            if child is None:
                return None
            actor_class, state, wake, shape = child
            stub = Stub(path, actor_class, state, _Group(wake, shape, path))
            self._registry[path] = stub
        return stub

    def set_sleeping(self, parent: str, table: Callable[[str], SleepingChild | None] | None) -> None:
        """Where the stubs of ``parent``'s sleeping children come from (for supervisors; None: nowhere).

        A supervisor with many children asleep keeps them as rows of its
        own, not as stubs: ``table(child_id)`` answers for a child asleep
        whose stub is not made (its class, state, wake-up and subtree
        shape, as `install_stub` takes them), else None. It is called
        with the registry's lock held, from any thread, when a path at or
        below ``<parent>/<child_id>`` is looked up and nothing holds it;
        the stub it describes is then made and registered, and from then
        on is the child's stub like any other (`stub_at`).
        """
        with self._registry_lock:
            if table is None:
                self._sleeping.pop(parent, None)
            else:
                self._sleeping[parent] = table

    def asleep(self, path: str) -> StubState | None:
        """Whether the actor at ``path`` sleeps (its state: dormant or hibernated), without making its stub.

        None when it runs, or nothing is there. For questions about many
        (``agent.list`` of a million sessions asleep), where `whereis` would
        make a stub for each.
        """
        ref = self._registry.get(path)
        if ref is None:
            parent, _, name = path.rpartition("/")
            table = self._sleeping.get(parent)
            if table is None:
                return None
            with self._registry_lock:
                ref = self._registry.get(path)
                if ref is None:
                    child = table(name)
                    return None if child is None else child[1]
        if ref.__class__ is Stub and ref.successor is None and ref.is_alive():
            return ref.state
        return None

    def stub_at(self, path: str) -> Stub | None:
        """The stub registered at ``path``, if one is (none is made): for the supervisor that owns the path."""
        ref = self._registry.get(path)
        return ref if ref.__class__ is Stub else None

    def actors(self) -> list[Ref[Any]]:
        """The actors started and not yet ended, stubs left out, in no particular order.

        Costs what they are, not what sleeps: with 100,000 sessions asleep,
        the registry holds 100,000 stubs this leaves aside (the observer's
        process table). An actor a stub has replaced at its path while it
        stops (a hibernating session's) is still here until it has ended.
        """
        with self._registry_lock:
            return list(self._live.values())

    def registered(self, prefix: str = "/") -> list[str]:
        """Return the paths of live actors (and stubs) under ``prefix``, sorted."""
        with self._registry_lock:
            return sorted(p for p in self._registry if p.startswith(prefix))

    def install_stub(
        self,
        path: str,
        actor_class: type[Actor],
        *,
        state: StubState,
        wake: Callable[[], None],
        like: Ref[Any] | None = None,
        shape: Mapping[str, type[Actor]] | None = None,
    ) -> Stub:
        """Register a `Stub` at ``path``: its first message calls ``wake`` (for supervisors).

        It replaces whatever holds the path (a live actor about to be
        hibernated keeps running until it is stopped, but is no longer
        found there). ``wake`` is called once, on the thread that sent the
        first message; it must only send a message. When an actor later
        registers at the path, the stub hands it its messages.

        Args:
            path: the path to hold.
            actor_class: the class of the actor that will take the path.
            state: ``dormant`` (never started yet) or ``hibernated``.
            wake: asks for the actor to be started.
            like: a live actor whose subtree the stub answers for too (its
                descendants' paths get stubs on demand).
            shape: without ``like``, the subtree to answer for: the classes
                of the actors below ``path``, by path relative to it.
        """
        below = shape_of(like) if like is not None or shape is None else shape
        stub = Stub(path, actor_class, state, _Group(wake, below, path.rstrip("/")))
        with self._registry_lock:
            self._registry[path] = stub
        return stub

    def discard_stubs(self, stub: Stub, reason: str, *, only_unused: bool = False) -> None:
        """Retire ``stub`` and the other stubs of its subtree; their buffered messages fail with ``reason``.

        With ``only_unused``, stubs that an actor has taken over are left
        alone (they forward to it): what a wake leaves behind.
        """
        group = stub._group
        group.wake = None
        for member in list(group.stubs):
            if only_unused and member.successor is not None:
                continue
            member._discard(reason)
            with self._registry_lock:
                if self._registry.get(member.path) is member:
                    del self._registry[member.path]
        group.stubs = [member for member in group.stubs if member.successor is not None]

    def _register(self, path: str, ref: Ref[Any], *, toplevel: bool) -> None:
        with self._registry_lock:
            existing = self._registry.get(path)
            if existing is not None and existing.is_alive() and existing.__class__ is not Stub:
                msg = f"an actor is already running at {path}"
                raise NameTakenError(msg)
            self._registry[path] = ref
            self._live[path] = ref
            if toplevel:
                self._toplevel[path] = ref
        if existing is not None and existing.__class__ is Stub:
            existing._succeed(ref)  # its messages go first

    def _unregister(self, path: str, ref: Ref[Any]) -> None:
        with self._registry_lock:
            if self._registry.get(path) is ref:
                del self._registry[path]
            if self._live.get(path) is ref:
                del self._live[path]
            if self._toplevel.get(path) is ref:
                del self._toplevel[path]

    def _orphan_down(self, down: Down, *, parented: bool) -> None:
        """An actor ended with no live parent to tell: record and publish it."""
        self._orphan_count += 1
        self._orphan_exits.append(down)
        if down.exit.abnormal or parented:
            self.events.publish(
                "actor.exited",
                down.path,
                {"exit": down.exit.kind, "error": repr(down.exit.error) if down.exit.error else None},
            )

    def orphan_exits(self) -> list[Down]:
        """Recent ends of actors that had no live parent (top-level actors)."""
        return list(self._orphan_exits)

    def statistics(self) -> SystemStatistics:
        """Counts for introspection."""
        store = self._store.statistics() if self._store is not None else {}
        return SystemStatistics(
            actors=len(self._registry),
            loop_tasks=self.loop.statistics().tasks,
            events_published=self.events.published,
            orphan_exits=self._orphan_count,
            store=store,
        )
