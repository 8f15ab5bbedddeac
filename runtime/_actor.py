"""Actors: a loop-hosted `Actor` and a thread-hosted `ThreadActor`, both pykka actors.

`Actor` plugs into pykka's extension points (``_create_actor_inbox``,
``_create_future``, ``_start_actor_loop``): its receive loop is a trio task on
the system's loop thread, so an idle actor costs a parked task and a few small
objects instead of an OS thread. Handlers may be ``async def``; nothing in
them may block the loop (a blocking ``Future.get()`` there raises
`LoopBlockedError` instead of deadlocking). `ThreadActor` is also a
`pykka.ThreadingActor`, for actors that must run blocking code.

Both follow the same rules, which differ from pykka's on purpose:

- an exception escaping a handler of a ``tell`` crashes the actor; one in an
  ``ask`` goes back to the caller and the actor lives on (pykka's rule);
- any `BaseException` crashes only the actor that raised it (pykka stops
  every actor in the process);
- a failure in ``on_start`` is a crash, and ``on_failure`` runs for it;
- when an actor ends, for any reason, its parent receives a `Down` message
  carrying the `Exit`; an actor without a parent reports to its system.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import sys
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import BuiltinFunctionType, CoroutineType, FunctionType, GeneratorType, MethodType, ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar

import attrs
import outcome
import pykka
import trio
from pykka._envelope import Envelope as _Envelope
from pykka._introspection import AttrInfo, get_attr_directly, get_obj_dict
from pykka.messages import ProxyCall, ProxyGetAttr, ProxySetAttr, _ActorStop
from weald.runtime._errors import IOCancelledError, NoSystemError, StartError, WealdError
from weald.runtime._future import _LOCK, AskFuture, Future

if TYPE_CHECKING:
    from types import TracebackType

    from pykka._envelope import Envelope
    from weald.runtime._system import ActorSystem

__all__ = [
    "Actor",
    "ActorMemory",
    "ActorSnapshot",
    "Down",
    "Exit",
    "IOHandle",
    "Ref",
    "ThreadActor",
]

logger = logging.getLogger("weald.runtime")

A = TypeVar("A", bound="Actor")
T = TypeVar("T")

ExitKind = Literal["normal", "crashed", "killed"]


@attrs.frozen
class Exit:
    """Why an actor ended.

    Attributes:
        kind: ``"normal"`` (it was stopped), ``"crashed"`` (an exception
            escaped it; ``error`` holds it) or ``"killed"`` (it was cancelled,
            or abandoned because it would not stop in time).
        error: the exception for a crash, else None.
    """

    kind: ExitKind
    error: BaseException | None = attrs.field(default=None, eq=False)

    @property
    def abnormal(self) -> bool:
        """True for a crash or a kill."""
        return self.kind != "normal"

    def describe(self) -> str:
        """A one-line description, e.g. ``crashed: ValueError('boom')``."""
        if self.error is None:
            return self.kind
        return f"{self.kind}: {self.error!r}"


NORMAL = Exit("normal")
KILLED = Exit("killed")
# What every actor's `started` signal resolves to: one shared value, not one per actor.
_STARTED: outcome.Outcome[None] = outcome.Value(None)


@attrs.frozen
class Down:
    """Sent to an actor's parent when the actor has ended.

    Attributes:
        ref: the ended actor.
        path: its path in the tree.
        exit: why it ended.
    """

    ref: Ref[Any]
    path: str
    exit: Exit


@attrs.frozen
class ActorSnapshot:
    """A frozen view of an actor's state, as ``snapshot()`` returns by default.

    Attributes:
        path: the actor's path in the tree.
        kind: the actor's class name.
        status: ``starting``, ``running``, ``stopping`` or the exit kind.
        mailbox: messages waiting in the inbox.
        handled: messages handled so far.
    """

    path: str
    kind: str
    status: str
    mailbox: int
    handled: int


@attrs.frozen
class ActorMemory:
    """`Ref.memory_estimate`'s answer.

    Attributes:
        bytes: the sizes of what the actor holds, each object once (an estimate).
        objects: the objects counted.
        complete: False when there was more than it was allowed to look at: at least ``bytes``.
    """

    bytes: int
    objects: int
    complete: bool


class _Signal:
    """A one-shot outcome whose `Future` is created only if someone waits."""

    __slots__ = ("_future", "_result")

    def __init__(self) -> None:
        self._result: outcome.Outcome[Any] | None = None
        self._future: Future[Any] | None = None

    def resolve(self, result: outcome.Outcome[Any]) -> None:
        with _LOCK:
            if self._result is not None:
                return
            self._result = result
            future = self._future
        if future is not None:
            _complete(future, result)

    def future(self) -> Future[Any]:
        with _LOCK:
            if self._future is None:
                self._future = Future()
                result = self._result
            else:
                return self._future
        if result is not None:
            _complete(self._future, result)
        return self._future

    @property
    def resolved(self) -> bool:
        return self._result is not None


def _complete(future: Future[Any], result: outcome.Outcome[Any]) -> None:
    if isinstance(result, outcome.Value):
        future.set(result.value)
    else:
        assert isinstance(result, outcome.Error)
        error = result.error
        future.set_exception((type(error), error, error.__traceback__))


_pykka_logger = logging.getLogger("pykka")


def _introspect(root: Any, proxy: Any) -> dict[tuple[str, ...], AttrInfo]:
    """What ``pykka._introspection.introspect_attrs`` returns, without its repeated work.

    pykka merges the ``__dict__`` of every class in the MRO, and of the
    object, once per attribute it looks at: ~200 us for a proxy of an agent,
    paid on every ``ref.proxy()``. This merges once per object visited and
    otherwise follows pykka's breadth-first walk exactly (same order, same
    checks, same warning and error).
    """
    result: dict[tuple[str, ...], AttrInfo] = {}
    # (path of a traversable attribute, the names pykka visits under it)
    pending: deque[tuple[tuple[str, ...], list[str]]] = deque([((), dir(root))])
    while pending:
        parent_path, names = pending.popleft()
        parent = get_attr_directly(root, parent_path)
        merged = get_obj_dict(parent)
        for name in names:
            if name.startswith("_"):
                continue  # private: not exposed through a proxy
            attr_path = (*parent_path, name)
            try:
                attr = merged[name]
            except KeyError:
                msg = f"type object {parent.__class__.__name__!r} has no attribute {name!r}"
                raise AttributeError(msg) from None
            if proxy == attr:
                _pykka_logger.warning(
                    f"{root} attribute {'.'.join(attr_path)!r} is a proxy to itself. "
                    f"Consider making it private by renaming it to {'_' + name!r}."
                )
                continue
            info = AttrInfo(
                callable=callable(attr),
                traversable=(
                    getattr(attr, "_pykka_traversable", False) is True
                    or getattr(attr, "pykka_traversable", False) is True
                ),
            )
            result[attr_path] = info
            if info.traversable:
                pending.append((attr_path, dir(attr)))
    return result


class _Proxy(pykka.ActorProxy[A]):
    """pykka's `ActorProxy`, the same in every respect but the cost of making one (see `_introspect`)."""

    def __init__(self, *, actor_ref: pykka.ActorRef[A], attr_path: tuple[str, ...] | None = None) -> None:
        if not actor_ref.is_alive() and not (isinstance(actor_ref, Ref) and actor_ref._holds_while_stopping()):
            msg = f"{actor_ref} not found"
            raise pykka.ActorDeadError(msg)
        if (actor := actor_ref._actor_weakref()) is None:
            msg = f"{actor_ref}'s actor weakref has been deallocated"
            raise pykka.ActorDeadError(msg)
        self.actor_ref = actor_ref
        self._actor = actor
        self._attr_path = attr_path or ()
        self._known_attrs = _introspect(actor, self)
        self._actor_proxies = {}
        self._callable_proxies = {}

    def __getattr__(self, name: str) -> Any:
        attr_path = (*self._attr_path, name)
        if attr_path not in self._known_attrs:
            self._known_attrs = _introspect(self._actor, self)
        attr_info = self._known_attrs.get(attr_path)
        if attr_info is None:
            msg = f"{self} has no attribute {name!r}"
            raise AttributeError(msg)
        if attr_info.callable:
            if attr_path not in self._callable_proxies:
                self._callable_proxies[attr_path] = pykka.CallableProxy(actor_ref=self.actor_ref, attr_path=attr_path)
            return self._callable_proxies[attr_path]
        if attr_info.traversable:
            if attr_path not in self._actor_proxies:
                self._actor_proxies[attr_path] = _Proxy(actor_ref=self.actor_ref, attr_path=attr_path)
            return self._actor_proxies[attr_path]
        return self.actor_ref.ask(ProxyGetAttr(attr_path=attr_path), block=False)


class Ref(pykka.ActorRef[A]):
    """A reference to an actor, safe to pass anywhere; pykka's ActorRef plus a path.

    Created only by the runtime. Keeps pykka's ``tell``, ``ask``, ``proxy``
    and ``stop``; adds `path`, `started`, `exited`, `exit` and `kill`.
    """

    path: str

    def __init__(self, actor: A) -> None:
        # pykka's ActorRef.__init__ without the URN: a uuid4 per actor cost a
        # syscall and ~100 bytes, and almost no actor is ever asked for it
        # (weald addresses actors by path). `actor_urn` makes it on first use.
        self._actor_weakref = weakref.ref(actor)
        self.actor_class = actor.__class__
        self.actor_inbox = actor.actor_inbox
        self.actor_stopped = actor.actor_stopped
        self._urn: str | None = None
        self.path = ""
        self._started = _Signal()
        self._exited = _Signal()

    @property
    def actor_urn(self) -> str:
        """The actor's URN (``urn:uuid:<uuid4>``), made on first use; the same for the actor and every copy."""
        urn = self._urn
        if urn is None:
            fresh = uuid.uuid4().urn
            with _LOCK:
                if self._urn is None:
                    self._urn = fresh
                urn = self._urn
        return urn

    @actor_urn.setter
    def actor_urn(self, urn: str) -> None:
        self._urn = urn

    def __repr__(self) -> str:
        return f"<Ref {self.path or self.actor_urn} ({self.actor_class.__name__})>"

    def __str__(self) -> str:
        return f"{self.actor_class.__name__} at {self.path or self.actor_urn}"

    def started(self) -> Future[None]:
        """A future resolved once ``on_start`` returned.

        It fails with `StartError` (cause chained) when ``on_start`` raised,
        and with ``pykka.ActorDeadError`` when the actor ended before starting.
        """
        return self._started.future()

    def exited(self) -> Future[Exit]:
        """A future resolved with the actor's `Exit` once it has fully ended."""
        return self._exited.future()

    @property
    def exit(self) -> Exit | None:
        """The actor's `Exit` once it has ended, else None."""
        result = self._exited._result
        if isinstance(result, outcome.Value):
            exit_: Exit = result.value
            return exit_
        return None

    def ask(self, message: Any, *, block: bool = True, timeout: float | None = None) -> Any:
        """Send ``message`` and wait for the reply (pykka's ``ask``; ``block=False`` returns the `Future`).

        Raises:
            pykka.Timeout: no reply within ``timeout`` seconds (blocking only).
            ActorDeadError: the actor is not running.
            Exception: what the actor's handler raised.
        """
        # pykka's ask, without its per-call lookups: this is every ask's path.
        future: Future[Any] = AskFuture()
        if self.is_alive() or self._holds_while_stopping():
            self.actor_inbox.put(_Envelope(message, future))
        else:
            error = pykka.ActorDeadError(f"{self} not found")
            future.set_exception((pykka.ActorDeadError, error, None))
        if block:
            return future.get(timeout=timeout)
        return future

    def is_alive(self) -> bool:
        """Whether the actor is running: its stop flag read directly (pykka's, one call fewer)."""
        return not self.actor_stopped._set  # type: ignore[attr-defined]  # always a _StopFlag here

    def tell(self, message: Any) -> None:
        """Send ``message`` without waiting for a reply (pykka's ``tell``).

        Raises:
            ActorDeadError: the actor is not running.
        """
        if self.actor_stopped._set and not self._holds_while_stopping():  # type: ignore[attr-defined]
            msg = f"{self} not found"
            raise pykka.ActorDeadError(msg)
        self.actor_inbox.put(_Envelope(message))

    def _holds_while_stopping(self) -> bool:
        """True while the actor stops holding its messages (`Actor.hold_messages`).

        It is no longer alive, but what it is sent is still taken and handed,
        in order, to whatever holds its path once it has ended (the stub of a
        hibernating subtree): refusing it would fail a message sent in the
        moment a session goes to sleep. Read from any thread: a message that
        races the actor's very end is answered by its closed inbox.
        """
        actor = self._actor_weakref()
        return actor is not None and actor._holding is not None and actor._exit is None

    def proxy(self) -> pykka.ActorProxy[A]:
        """Wrap the ref in a pykka `ActorProxy` (pykka's ``proxy``, made faster).

        Raises:
            ActorDeadError: the actor is not running.
        """
        return _Proxy(actor_ref=self)

    def mailbox_size(self) -> int:
        """Messages waiting in the actor's inbox."""
        return len(self.actor_inbox)  # type: ignore[arg-type]

    def statistics(self) -> ActorSnapshot | None:
        """The actor's status, mailbox and messages handled, read without sending it a message.

        Erlang's ``process_info``: what the runtime knows of an actor, read
        from any thread while the actor goes on (``snapshot()`` through the
        proxy is the actor's own answer, in its turn). None once the actor
        has ended, and for a stub (nothing runs behind it).
        """
        actor = self._actor_weakref()
        if actor is None or actor._exit is not None:
            return None
        return ActorSnapshot(
            path=self.path,
            kind=self.actor_class.__name__,
            status=actor._status,
            mailbox=len(self.actor_inbox),  # type: ignore[arg-type]
            handled=actor._handled,
        )

    def memory_estimate(self, max_objects: int = 20_000) -> ActorMemory | None:
        """An estimate of the bytes the actor holds, read without sending it a message; None once it ended.

        The sizes (``sys.getsizeof``) of the actor and of what it reaches
        through its attributes, containers and structs, each object counted
        once. What is shared rather than held is counted shallow or not at
        all: other actors and refs, classes, functions, modules, frozen attrs
        values (configuration, specs) and what a class marks shared with a
        true ``__weald_shared__`` (the system, its loop, bus and store). At most ``max_objects`` objects
        are visited, so a huge state is under-counted (``complete`` false),
        never slow. Call it on the thread the actor runs on (the loop thread,
        for a loop actor): it walks state the actor may be changing.
        """
        actor = self._actor_weakref()
        if actor is None or actor._exit is not None:
            return None
        return _estimate_size(actor, max_objects)

    def stop(self, *, block: bool = True, timeout: float | None = None) -> Any:
        """Ask the actor to stop after the messages already in its inbox.

        Returns True if the actor was running (it has fully ended, parent
        notified, when the blocking call returns), False if it was already
        dead. With ``block=False``, returns a `Future` of that boolean.
        """
        future: Future[bool] = Future()
        if self.is_alive():
            self.actor_inbox.put(_envelope(_ActorStop(), future))
        else:
            future.set(False)
        if block:
            return future.get(timeout=timeout)
        return future

    def kill(self) -> None:
        """End the actor now, without running the rest of its inbox.

        A loop actor's task is cancelled where it stands (its ``on_stop``
        does not run). A thread actor cannot be interrupted: it is abandoned,
        reported as killed, and its thread finishes its current handler alone.
        """
        actor = self._actor_weakref()
        if actor is not None:
            actor._kill()


def _estimate_size(root: object, max_objects: int) -> ActorMemory:
    """`Ref.memory_estimate`: sizes of what ``root`` reaches, each object once, shared values left out."""
    seen = {id(root)}
    stack: list[object] = [root]
    total = 0
    visited = 0
    cut = False  # a container held more than the budget let the walk look at
    while stack and visited < max_objects:
        obj = stack.pop()
        visited += 1
        try:
            total += sys.getsizeof(obj)
        except TypeError:  # an extension type without a size
            continue
        cls = obj.__class__
        if cls in _ATOMS:
            continue
        if isinstance(obj, dict):
            children: Iterable[object] = itertools.chain(obj.keys(), obj.values())
        elif isinstance(obj, list | tuple | set | frozenset | deque):
            children = obj
        elif obj is root or not (isinstance(obj, _NOT_HELD) or _shared_value(cls)):
            fields = getattr(cls, "__struct_fields__", None)  # a msgspec Struct
            if fields is not None:
                children = [getattr(obj, name, None) for name in fields]
            else:
                state = getattr(obj, "__dict__", None)
                slotted = [getattr(obj, name, None) for name in _slots(cls)]
                children = itertools.chain(state.values() if isinstance(state, dict) else (), slotted)
        else:
            continue
        # Never more on the stack than the budget has left: a dict of 100,000 entries is not walked whole.
        room = max_objects - visited - len(stack)
        for child in children:
            if child is None or child.__class__ in _SMALL or id(child) in seen:
                continue
            if isinstance(child, _NOT_HELD):
                continue
            if room <= 0:
                cut = True
                break
            seen.add(id(child))
            stack.append(child)
            room -= 1
    return ActorMemory(bytes=total, objects=visited, complete=not stack and not cut)


_ATOMS = frozenset({str, bytes, bytearray, int, float, bool, complex, memoryview})
# The machinery an actor runs on (its task, its locks, its sockets), not state it holds.
_RUNTIME_MODULES = frozenset(
    {"trio", "outcome", "threading", "_thread", "socket", "selectors", "pykka", "_contextvars"}
)
_SMALL = frozenset({bool, type(None)})


def _shared_value(cls: type) -> bool:
    """Whether instances of ``cls`` are shared rather than held by one actor.

    A class marked ``__weald_shared__`` (the system, its loop, bus and store,
    the tool registry), the runtime's machinery (trio, threads, sockets), or
    a frozen attrs class (configuration and specs).
    """
    if getattr(cls, "__weald_shared__", False) or cls.__module__.partition(".")[0] in _RUNTIME_MODULES:
        return True
    params = getattr(cls, "__attrs_attrs__", None)
    return params is not None and getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [name for name in names if name not in ("__dict__", "__weakref__")]


def _envelope(message: Any, reply_to: Future[Any] | None = None) -> Envelope[Any]:
    envelope: Envelope[Any] = _Envelope(message, reply_to)
    return envelope


def _unowned(owner: object) -> object:
    """What an inbox keeps of its owner once closed: its class and path, not its `Ref`.

    A live inbox names its `Ref` (which holds the inbox): a cycle, which
    would leave every ended actor's ref, inbox and signals to the cyclic
    collector instead of freeing them at once (70 objects a turn of 10 tool
    calls). Closed, it keeps only what names it.
    """
    if owner.__class__ is Ref:
        return (owner.actor_class, owner.path)
    return owner


def _owner_name(owner: object) -> str:
    if owner.__class__ is tuple:
        actor_class, path = owner
        return f"{actor_class.__name__} at {path}"
    return str(owner)


def _fail_envelope(envelope: Envelope[Any], actor_str: str) -> None:
    """Answer a message that reached an actor after it ended."""
    reply_to = envelope.reply_to
    if reply_to is None or reply_to.done():  # type: ignore[attr-defined]
        return
    if isinstance(envelope.message, _ActorStop):
        reply_to.set(False)
    else:
        error = pykka.ActorDeadError(f"{actor_str} stopped before handling the message")
        reply_to.set_exception((pykka.ActorDeadError, error, None))


class _StopFlag:
    """The part of ``threading.Event`` that pykka uses, without its lock and condition."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True


# An inbox's items before its first message (see `_LoopInbox`).
_NO_ITEMS: tuple[()] = ()
_INBOX_LOCK = threading.Lock()


class _LoopInbox:
    """A loop actor's inbox: a deque plus the parked task, if any.

    Invariant: the actor publishes ``task`` *before* checking for items, and
    a putter appends *before* reading ``task``; so a put either is seen by
    that check or sees the task and wakes it. Rescheduling happens only on
    the loop thread, which is what keeps it exactly-once.
    """

    __slots__ = ("_closed", "_items", "_loop", "_owner", "_task", "_wake_pending")

    def __init__(self) -> None:
        # The deque is made by the first put: an empty one costs ~760 bytes,
        # and most actors of an idle tree never receive a message.
        self._items: deque[Envelope[Any]] | tuple[()] = _NO_ITEMS
        self._task: trio.lowlevel.Task | None = None
        self._loop: Any = None
        self._wake_pending = False
        self._closed = False
        self._owner: object = ""

    def __len__(self) -> int:
        return len(self._items)

    def _made_items(self) -> deque[Envelope[Any]]:
        # Puts may come from any thread: exactly one deque is ever installed.
        with _INBOX_LOCK:
            items = self._items
            if items.__class__ is not deque:
                items = self._items = deque()
        return items

    def put(self, envelope: Envelope[Any], /) -> None:
        items = self._items
        if items.__class__ is not deque:
            items = self._made_items()
        items.append(envelope)
        if self._closed:
            self._drain_dead()
        elif self._task is not None:
            loop = self._loop
            if loop.in_loop_thread():
                self._wake()
            elif not self._wake_pending:
                self._wake_pending = True
                try:
                    loop.wake_soon(self)
                except trio.RunFinishedError:
                    self._drain_dead()

    def _loop_wake(self) -> None:
        # On the loop thread, from `Loop.wake_soon`, outside any task: the
        # actor's synchronous handlers answer here (see `Actor._serve_inline`);
        # otherwise its task runs in this scheduler pass.
        task = self._task
        if task is None:
            self._wake_pending = False
            return
        owner = self._owner
        actor = owner._actor_weakref() if owner.__class__ is Ref else None
        served = actor is not None and actor._serve_inline(self)
        # Cleared only now: what arrived while serving found a wake-up pending
        # and did not kick, so it is seen here and left to the task (which,
        # while it runs, takes what comes without any kick).
        self._wake_pending = False
        if served and not self._items:
            return
        self._task = None
        trio.lowlevel.reschedule(task)

    def _loop_gone(self) -> None:
        # The loop ended first: the actor's task with it; answer what waits.
        self._wake_pending = False
        self._drain_dead()

    def _wake(self) -> None:
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED

    def get(self) -> Envelope[Any]:
        return self._items.popleft()  # type: ignore[union-attr]

    def empty(self) -> bool:
        return not self._items

    def close(self) -> None:
        self._closed = True
        self._owner = _unowned(self._owner)
        self._drain_dead()

    def take_nowait(self) -> list[Envelope[Any]]:
        """Remove and return every envelope waiting (for an actor that hands its inbox on)."""
        items = self._items
        out: list[Envelope[Any]] = []
        while items:
            try:
                out.append(items.popleft())
            except IndexError:
                break
        return out

    def _drain_dead(self) -> None:
        items = self._items
        # Every actor's end drains its (nearly always empty) inbox: test
        # before popping rather than raise IndexError each time; the pop
        # still guards against a racing drain from another thread.
        while items:
            try:
                envelope = items.popleft()
            except IndexError:
                return
            _fail_envelope(envelope, _owner_name(self._owner))


class _ThreadInbox:
    """A thread actor's inbox: a deque and a condition; ``get`` returns None once closed."""

    __slots__ = ("_closed", "_cond", "_items", "_owner")

    def __init__(self) -> None:
        self._items: deque[Envelope[Any]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._owner: object = ""

    def __len__(self) -> int:
        return len(self._items)

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._cond:
            if not self._closed:
                self._items.append(envelope)
                self._cond.notify()
                return
        _fail_envelope(envelope, _owner_name(self._owner))

    def get(self) -> Envelope[Any] | None:
        with self._cond:
            while not self._items:
                if self._closed:
                    return None
                self._cond.wait()
            return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._owner = _unowned(self._owner)
            dead = list(self._items)
            self._items.clear()
            self._cond.notify_all()
        for envelope in dead:
            _fail_envelope(envelope, _owner_name(self._owner))


class IOHandle:
    """A running ``run_io`` task; `cancel` it, or check whether it is `done`."""

    __slots__ = ("_actor", "_cancel_requested", "_scope", "done", "name")

    def __init__(self, actor: Actor, name: str) -> None:
        self._actor = actor
        self._scope: trio.CancelScope | None = None
        self._cancel_requested = False
        self.done = False
        self.name = name

    def __repr__(self) -> str:
        return f"<IOHandle {self.name} done={self.done}>"

    def cancel(self) -> None:
        """Cancel the task (from any thread); its reply, if any, carries Cancelled."""
        self._cancel_requested = True
        loop = self._actor._system.loop
        if loop.in_loop_thread():
            self._cancel_in_loop()
        elif loop.running:
            with contextlib.suppress(trio.RunFinishedError):
                loop.call_soon(self._cancel_in_loop)

    def _cancel_in_loop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()


class _SpawnContext(threading.local):
    system: ActorSystem | None = None
    path: str = ""
    parent: Ref[Any] | None = None


# The messages pykka's Actor._handle_receive dispatches itself.
_PYKKA_MESSAGES = (_ActorStop, ProxyCall, ProxyGetAttr, ProxySetAttr)

_spawning = _SpawnContext()
_anonymous = itertools.count(1)

# A loop actor with a backlog yields to the loop's other tasks after this many
# messages handled without a yield (an async handler that waits also yields).
# Yielding after every message made a trio scheduling round per message,
# most of the cost of a tell. Invariant: no other task waits longer than
# this many handler runs of one actor; a kill lands within as many.
_FAIRNESS_BURST = 16


class Actor(pykka.Actor):
    """The base of every weald actor; hosted on the system's trio loop.

    Subclass it and implement ``on_receive`` and/or public methods called
    through ``ref.proxy()``; either may be ``async def``. Start it with
    ``MyActor.start(...)`` (a top-level actor of the current system), with
    ``system.spawn(...)``, or as a supervisor's child.

    Lifecycle hooks run in the actor's own context (the loop thread, as a
    step of the actor's task; for `ThreadActor`, the actor's thread) and
    may be ``async def`` for loop actors:

    - ``on_start``: before the first message; raising is a crash.
    - ``on_stop``: after a normal stop; raising turns the exit into a crash.
    - ``on_failure(exc_type, exc_value, tb)``: after a crash, including a
      crash in ``on_start``; raising is logged and changes nothing.
    """

    _system: ActorSystem
    _actor_ref: Ref[Any]
    # Messages kept unhandled while set (see `hold_messages`); a class default,
    # so an actor that never holds pays no instance slot for it.
    _holding: list[Envelope[Any]] | None = None
    # What `_serve_inline` leaves to the actor's task: the coroutine an async
    # handler returned (awaited first), or the crash it met. Class defaults too.
    _inline_coroutine: Any = None
    _inline_exit: Exit | None = None
    # Whether messages from foreign threads may be handled by `_serve_inline`.
    serve_foreign_inline: ClassVar[bool] = True
    # Set per class (`__init_subclass__`): a loop actor whose ``on_start`` is
    # the default cannot fail to start, so a supervisor need not wait for it.
    _starts_at_once: ClassVar[bool] = True
    # Set per class too: ``on_stop`` is the default (nothing to call at a normal end).
    _plain_stop: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._starts_at_once = cls.on_start is Actor.on_start and not issubclass(cls, pykka.ThreadingActor)
        cls._plain_stop = cls.on_stop is Actor.on_stop

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        system = _spawning.system
        if system is None:
            msg = (
                f"{type(self).__name__} must be started with .start(), system.spawn() "
                "or by a supervisor, not constructed directly"
            )
            raise NoSystemError(msg)
        self._system = system
        self._path = _spawning.path
        self._parent = _spawning.parent
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = _StopFlag()  # type: ignore[assignment]
        self._actor_ref = Ref(self)
        self._actor_ref.path = self._path
        self._status = "starting"
        self._handled = 0
        self._exit: Exit | None = None
        self._io: set[IOHandle] | None = None
        self._stop_replies: list[pykka.Future[Any]] = []
        self._scope: trio.CancelScope | None = None
        self._linked: set[Ref[Any]] | None = None

    # -- construction ------------------------------------------------------------

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> Ref[Self]:
        """Start a top-level actor in the current system (pykka's ``start``).

        Its path is ``/<ClassName>-<n>``; it has no parent, so its end is
        reported to the system. Returns at once: ``on_start`` runs on the
        actor's own context, before any message.
        """
        from weald.runtime._system import ActorSystem

        system = ActorSystem.current()
        path = f"/{cls.__name__}-{next(_anonymous)}"
        return cls._spawn(system, path, None, args, kwargs)

    @classmethod
    def _spawn(
        cls,
        system: ActorSystem,
        path: str,
        parent: Ref[Any] | None,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> Ref[Self]:
        if not system.running:
            msg = f"cannot start {cls.__name__} at {path}: the actor system is not running"
            raise NoSystemError(msg)
        previous = (_spawning.system, _spawning.path, _spawning.parent)
        _spawning.system, _spawning.path, _spawning.parent = system, path, parent
        try:
            obj = cls(*args, **kwargs)
        finally:
            _spawning.system, _spawning.path, _spawning.parent = previous
        if getattr(obj, "_actor_ref", None) is None:
            msg = f"{cls.__name__}.__init__() did not call super().__init__()"
            raise WealdError(msg)
        ref: Ref[Self] = obj._actor_ref
        obj.actor_inbox._owner = ref  # type: ignore[attr-defined]  # named by str() only when a message fails
        system._register(path, ref, toplevel=parent is None and path != "/")
        if parent is not None:
            parent_actor = parent._actor_weakref()
            if parent_actor is not None:
                if parent_actor._linked is None:
                    parent_actor._linked = set()
                parent_actor._linked.add(ref)
        try:
            obj._start_actor_loop()
        except BaseException:
            system._unregister(path, ref)
            raise
        return ref

    def spawn_child(
        self,
        actor_class: type[A],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        name: str,
    ) -> Ref[A]:
        """Start a child actor at ``<self.path>/<name>``; its `Down` comes to this actor.

        Raises:
            NameTakenError: a live actor already holds that path.
        """
        base = self._path.rstrip("/")
        return actor_class._spawn(self._system, f"{base}/{name}", self._actor_ref, args, kwargs or {})

    @staticmethod
    def _create_actor_inbox() -> _LoopInbox:
        return _LoopInbox()

    @staticmethod
    def _create_future() -> Future[Any]:
        return Future()

    def _start_actor_loop(self) -> None:
        inbox = self.actor_inbox
        assert isinstance(inbox, _LoopInbox)
        inbox._loop = self._system.loop
        # Unguarded (one coroutine frame fewer per actor): `_loop_main` contains its own errors.
        self._system.loop.spawn_contained_nowait(self._loop_main, on_error=self._loop_task_error)

    # -- identity and introspection ---------------------------------------------

    @property
    def actor_urn(self) -> str:
        """The unique id pykka gives this actor; made on first use (see `Ref.actor_urn`)."""
        return self._actor_ref.actor_urn

    @actor_urn.setter
    def actor_urn(self, urn: str) -> None:
        self._actor_ref.actor_urn = urn

    @property
    def actor_ref(self) -> Ref[Self]:
        """This actor's `Ref` (pykka's ActorRef, with a path)."""
        return self._actor_ref

    @property
    def path(self) -> str:
        """This actor's path in the tree, e.g. ``/sessions/a1/agent``."""
        return self._path

    @property
    def parent(self) -> Ref[Any] | None:
        """The actor that receives this one's `Down`; None for a top-level actor."""
        return self._parent

    @property
    def system(self) -> ActorSystem:
        """The `ActorSystem` hosting this actor."""
        return self._system

    def snapshot(self) -> Any:
        """Return a frozen attrs value of this actor's state.

        Subclasses override it to expose their own state; call it through
        the actor's proxy (``ref.proxy().snapshot().get()``) so it runs in
        the actor's own context.
        """
        return ActorSnapshot(
            path=self._path,
            kind=type(self).__name__,
            status=self._status,
            mailbox=len(self.actor_inbox),  # type: ignore[arg-type]
            handled=self._handled,
        )

    def __str__(self) -> str:
        return f"{type(self).__name__} at {self._path}"

    # -- holding messages ---------------------------------------------------------

    def hold_messages(self) -> None:
        """Keep the messages that arrive from now on, unhandled, until `release_messages`.

        For an actor about to be hibernated by its supervisor: whatever
        reaches it while it stops is not lost, but handed, in order, to
        whatever holds its path once it has ended (the stub that wakes its
        successor). A stop is still handled. Call it in the actor's own context.

        Raises:
            TypeError: the actor is a `ThreadActor` (loop actors only).
        """
        if not isinstance(self.actor_inbox, _LoopInbox):
            msg = f"{type(self).__name__} is a thread actor; only loop actors hold messages"
            raise TypeError(msg)
        if self._holding is None:
            self._holding = []

    def release_messages(self) -> None:
        """Stop holding: the held messages are handled next, before any newer one."""
        held, self._holding = self._holding, None
        inbox = self.actor_inbox
        if held and isinstance(inbox, _LoopInbox):
            items = inbox._items if inbox._items.__class__ is deque else inbox._made_items()
            items.extendleft(reversed(held))
            if inbox._task is not None:
                inbox._wake()

    def _hand_on_held(self) -> None:
        """After the actor is unregistered: send what it held (and what queued after its stop) on."""
        held = self._holding
        if held is None:
            return
        self._holding = None
        inbox = self.actor_inbox
        if isinstance(inbox, _LoopInbox):
            held.extend(inbox.take_nowait())
        if not held:
            # Nothing to hand on: no lookup, which below a hibernated parent
            # would make (and register) a stub for this path that nobody asked for.
            return
        target = self._system.whereis(self._path)
        for envelope in held:
            if target is None or target is self._actor_ref:
                _fail_envelope(envelope, str(self._actor_ref))
            else:
                target.actor_inbox.put(envelope)

    # -- I/O ----------------------------------------------------------------------

    def run_io(
        self,
        async_fn: Callable[..., Awaitable[T]],
        *args: Any,
        reply: Callable[[outcome.Outcome[T]], Any] | None = None,
        name: str | None = None,
    ) -> IOHandle:
        """Run ``async_fn(*args)`` as a task on the loop, without blocking this actor.

        When it ends, ``reply(outcome)`` is called on the loop thread and its
        return value, unless None, is sent to this actor as a message (so
        the result is handled in the actor's own context, in mailbox order).
        Every I/O task is cancelled when its actor ends.

        Returns:
            A handle to cancel the task.
        """
        handle = IOHandle(self, name or str(getattr(async_fn, "__name__", "io")))
        if self._io is None:
            self._io = set()
        self._io.add(handle)
        self._system.loop.spawn_nowait(self._io_main, handle, async_fn, args, reply)
        return handle

    async def _io_main(
        self,
        handle: IOHandle,
        async_fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        reply: Callable[[outcome.Outcome[Any]], Any] | None,
    ) -> None:
        with trio.CancelScope() as scope:
            handle._scope = scope
            if handle._cancel_requested or self._exit is not None:
                handle._cancel_requested = True
                scope.cancel()
            result = await outcome.acapture(async_fn, *args)
        handle.done = True
        if self._io is not None:
            self._io.discard(handle)
        if isinstance(result, outcome.Error) and isinstance(result.error, trio.Cancelled):
            result = outcome.Error(IOCancelledError(f"I/O task {handle.name} was cancelled"))
        if reply is None:
            if isinstance(result, outcome.Error):
                logger.error("I/O task %s of %s failed", handle.name, self, exc_info=result.error)
            return
        message = reply(result)
        if message is not None and self._exit is None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._actor_ref.tell(message)

    def _cancel_io(self) -> None:
        if self._io:
            for handle in list(self._io):
                handle.cancel()

    # -- the receive loop ---------------------------------------------------------

    def _loop_task_error(self, exc: BaseException) -> None:
        # Only reached if the loop machinery itself failed; contain it.
        logger.critical("actor loop of %s failed", self, exc_info=exc)
        self._finish(Exit("crashed", exc))

    async def _loop_main(self) -> None:
        try:
            await self._loop_body()
        except trio.Cancelled:
            raise
        except BaseException as exc:  # the loop machinery itself broke: contain it
            self._loop_task_error(exc)

    async def _loop_body(self) -> None:
        exit_: Exit | None = KILLED
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._exit is not None:  # killed before it ever ran
                return
            exit_ = await self._loop_start()
            if exit_ is None:
                exit_ = await self._loop_serve()
        if exit_ is None:
            exit_ = KILLED
        if scope.cancelled_caught:
            exit_ = KILLED
        if exit_.kind != "crashed" and (self._plain_stop or exit_.kind == "killed"):
            # No hook to run (a normal end without ``on_stop``, or a kill):
            # what `_loop_terminate` does, without a coroutine for it.
            if self._exit is None:
                self._status = "stopping"
                self.actor_stopped.set()
                self._cancel_io()
                self._finish(exit_)
            return
        await self._loop_terminate(exit_)

    async def _loop_start(self) -> Exit | None:
        if self._starts_at_once:  # the default on_start: nothing to run, nothing to fail
            self._status = "running"
            self._actor_ref._started.resolve(_STARTED)
            return None
        try:
            result = self.on_start()
            if type(result) is CoroutineType:
                await result
        except trio.Cancelled:
            raise
        except BaseException as exc:
            self._actor_ref._started.resolve(_start_failed(self, exc))
            return Exit("crashed", exc)
        self._status = "running"
        self._actor_ref._started.resolve(_STARTED)
        return None

    def _serve_inline(self, inbox: _LoopInbox) -> bool:
        """Handle what a foreign thread queued for this idle actor, on the loop thread, outside its task.

        Runs from `Loop.wake_soon` (a trio instrument, between the I/O wait
        and the tasks) when the actor's task is parked on its empty inbox,
        so no handler of this actor is running: an ask from a foreign thread
        is answered without a step of the actor's task (~4 us of a ~17 us
        round trip here). A synchronous handler runs here, with the same
        rules as in the task (an ask's exception goes back, a tell's is a
        crash); whatever needs the task is left to it, in order: a stop, an
        async handler (its coroutine, made here, is awaited there first), a
        crash, fault injection, held messages, more than `_FAIRNESS_BURST`
        messages. A handler run here has no current trio task: it must not
        enter a cancel scope or call ``trio.lowlevel.current_task`` (an
        actor whose synchronous handlers do sets `serve_foreign_inline` False).

        Returns:
            True if the inbox was emptied and the task may stay parked.
        """
        if not self.serve_foreign_inline or self._system._faults is not None:
            return False
        items = inbox._items
        for _ in range(_FAIRNESS_BURST):
            if not items or self._holding is not None or self._exit is not None:
                break
            envelope = items[0]
            message = envelope.message
            if message.__class__ is _ActorStop:
                break
            items.popleft()
            reply_to = envelope.reply_to
            try:
                result = self._handle_receive(message)
            except Exception as exc:
                if reply_to is None:
                    self._inline_exit = Exit("crashed", exc)
                    return False
                reply_to.set_exception()
                self._handled += 1
                continue
            except BaseException as exc:
                if reply_to is not None:
                    reply_to.set_exception()
                self._inline_exit = Exit("crashed", exc)
                return False
            if result.__class__ is CoroutineType:
                self._inline_coroutine = result
                items.appendleft(envelope)  # handled by the task, which awaits the coroutine
                return False
            if reply_to is not None:
                reply_to.set(result)
            self._handled += 1
        return not items

    async def _loop_serve(self) -> Exit:
        inbox: _LoopInbox = self.actor_inbox  # type: ignore[assignment]
        system = self._system
        burst = 0  # messages handled since this task last yielded to the loop
        envelope = message = reply_to = result = None
        while True:
            # Read afresh each time: the first put replaces the empty sentinel.
            items = inbox._items
            if not items:
                inbox._task = trio.lowlevel.current_task()
                if inbox._items:
                    inbox._task = None
                else:
                    # Parked: the last message and its result are let go (a
                    # child's Down keeps its ref, and so on, until the next one).
                    envelope = message = reply_to = result = None
                    await trio.lowlevel.wait_task_rescheduled(inbox._abort)
                    if self._inline_exit is not None:  # a handler crashed in `_serve_inline`
                        return self._inline_exit
                    continue
                items = inbox._items
            envelope = items.popleft()
            message = envelope.message
            if self._holding is not None and message.__class__ is not _ActorStop:
                self._holding.append(envelope)  # handed on when it ends (see `hold_messages`)
                continue
            if message.__class__ is _ActorStop:
                if envelope.reply_to is not None:
                    self._stop_replies.append(envelope.reply_to)
                return NORMAL
            reply_to = envelope.reply_to
            try:
                if self._inline_coroutine is not None:  # made by `_serve_inline` for this message
                    coroutine, self._inline_coroutine = self._inline_coroutine, None
                    result = await coroutine
                else:
                    faults = system._faults
                    if faults is not None and not await faults.admit(self, message):
                        continue
                    result = self._handle_receive(message)
                    if result.__class__ is CoroutineType:
                        result = await result
            except trio.Cancelled:
                if reply_to is not None:
                    error = pykka.ActorDeadError(f"{self._actor_ref} was killed while handling the message")
                    reply_to.set_exception((pykka.ActorDeadError, error, None))
                raise
            except Exception as exc:
                if reply_to is None:
                    return Exit("crashed", exc)
                reply_to.set_exception()
            except BaseException as exc:
                if reply_to is not None:
                    reply_to.set_exception()
                return Exit("crashed", exc)
            else:
                if reply_to is not None:
                    reply_to.set(result)
            self._handled += 1
            if inbox._items:
                burst += 1
                if burst >= _FAIRNESS_BURST:
                    # Fairness: a busy actor lets the loop's other tasks run.
                    burst = 0
                    await trio.lowlevel.checkpoint()
            else:
                burst = 0

    async def _loop_terminate(self, exit_: Exit) -> None:
        if self._exit is not None:
            return
        self._status = "stopping"
        self.actor_stopped.set()
        if exit_.kind == "killed":
            self._cancel_io()
        try:
            if exit_.kind == "normal":
                result = None if self._plain_stop else self.on_stop()
            elif exit_.kind == "crashed":
                error = exit_.error
                assert error is not None
                result = self.on_failure(type(error), error, error.__traceback__)
            else:
                result = None
            if type(result) is CoroutineType:
                with trio.CancelScope(shield=True):
                    await result
        except trio.Cancelled:
            raise
        except BaseException as exc:
            if exit_.kind == "normal":
                exit_ = Exit("crashed", exc)
            else:
                logger.exception("on_failure of %s raised", self, exc_info=exc)
        # I/O tasks end after the hooks, which may still need them (to flush).
        self._cancel_io()
        self._finish(exit_)

    def _finish(self, exit_: Exit) -> None:
        """Record the exit and tell everyone who needs to know. Runs once."""
        with _LOCK:
            if self._exit is not None:
                return
            self._exit = exit_
        self._status = exit_.kind
        self.actor_stopped.set()
        if exit_.kind == "killed":
            try:
                self._on_killed()
            except Exception:
                logger.exception("cleanup after killing %s failed", self)
        ref = self._actor_ref
        if not ref._started.resolved:
            error = pykka.ActorDeadError(f"{ref} ended ({exit_.describe()}) before it started")
            ref._started.resolve(outcome.Error(error))
        self._system._unregister(self._path, ref)
        if self._inline_coroutine is not None:  # made by `_serve_inline`, never awaited: its message fails below
            self._inline_coroutine.close()
            self._inline_coroutine = None
        if self._holding is not None:
            self._hand_on_held()
        self.actor_inbox.close()  # type: ignore[attr-defined]
        if self._stop_replies:
            for future in self._stop_replies:
                with contextlib.suppress(queue.Full):  # answered already
                    future.set(True)
            self._stop_replies.clear()
        if exit_.kind == "crashed":
            logger.info("%s crashed", self, exc_info=exit_.error)
        # Children outlive no parent: any still running (the parent was
        # killed or crashed before stopping them) are killed now.
        if self._linked:
            for child in list(self._linked):
                if child.is_alive():
                    child.kill()
            self._linked = None
        parent = self._parent
        if parent is not None:
            parent_actor = parent._actor_weakref()
            if parent_actor is not None and parent_actor._linked is not None:
                parent_actor._linked.discard(ref)
        # The parent hears first: whoever waits on exited() and then asks the
        # parent finds the Down already in the parent's mailbox.
        down = Down(ref, self._path, exit_)
        told = False
        if parent is not None and parent.is_alive():
            try:
                parent.tell(down)
                told = True
            except pykka.ActorDeadError:
                pass  # the parent died meanwhile: report to the system instead
        if not told:
            self._system._orphan_down(down, parented=parent is not None)
        ref._exited.resolve(outcome.Value(exit_))

    def _kill(self) -> None:
        loop = self._system.loop
        if loop.in_loop_thread():
            self._kill_in_loop()
        elif loop.running:
            with contextlib.suppress(trio.RunFinishedError):
                loop.call_soon(self._kill_in_loop)

    def _kill_in_loop(self) -> None:
        scope = self._scope
        if self._exit is not None:
            return
        if scope is None:
            # Not running yet: it will see _exit on its first step.
            self._cancel_io()
            self._finish(KILLED)
        else:
            scope.cancel()

    def _on_killed(self) -> None:
        """Release what must not hang when the actor is killed (no hook runs then).

        Runs on the thread that finished the actor; must not block. Subclasses
        that hand out futures answer them here.
        """

    def _handle_receive(self, message: Any) -> Any:
        # pykka's dispatch, with its commonest case first: a proxy call (every
        # call through ref.proxy()) took four isinstance checks to reach.
        if message.__class__ is ProxyCall:
            callee = get_attr_directly(self, message.attr_path)
            return callee(*message.args, **message.kwargs)
        if isinstance(message, _PYKKA_MESSAGES):
            return super()._handle_receive(message)
        return self.on_receive(message)

    def _stop(self) -> None:
        # pykka's Actor.stop() tells _ActorStop to itself; the receive loop
        # handles it before pykka's _handle_receive could call this.
        msg = "weald actors stop through their receive loop"
        raise AssertionError(msg)

    def on_start(self) -> Any:
        """Run before the first message, in the actor's own context; may be ``async def``.

        Raising here is a crash: ``on_failure`` runs, then the parent is told.
        """

    def on_stop(self) -> Any:
        """Run after a normal stop, in the actor's own context; may be ``async def``.

        Raising here turns the exit into a crash.
        """

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> Any:
        """Run after a crash (including in ``on_start``), before the parent hears of it.

        May be ``async def``. Raising here is logged and changes nothing.
        """


def _start_failed(actor: Actor, exc: BaseException) -> outcome.Error:
    error = StartError(f"{actor} failed to start: {exc!r}")
    error.__cause__ = exc
    return outcome.Error(error)


_thread_names = itertools.count(1)


class ThreadActor(Actor, pykka.ThreadingActor):
    """A weald actor on its own OS thread, for code that must block.

    It is a `pykka.ThreadingActor` and follows every weald rule of `Actor`.
    An ``async def`` handler or hook runs on the system's loop while the
    actor's thread waits for it.
    """

    use_daemon_thread: ClassVar[bool] = True

    @staticmethod
    def _create_actor_inbox() -> _ThreadInbox:  # type: ignore[override]
        return _ThreadInbox()

    @staticmethod
    def _create_future() -> Future[Any]:
        return Future()

    def _start_actor_loop(self) -> None:
        thread = threading.Thread(
            target=self._thread_main,
            name=f"{type(self).__name__}-{next(_thread_names)}",
            daemon=self.use_daemon_thread,
        )
        self._thread = thread
        thread.start()

    def _await_on_loop(self, result: Any) -> Any:
        if type(result) is CoroutineType:

            async def _run() -> Any:
                return await result

            return self._system.loop.run(_run)
        return result

    def _thread_main(self) -> None:
        try:
            exit_ = self._thread_start()
            if exit_ is None:
                exit_ = self._thread_serve()
        except BaseException as exc:  # the loop machinery itself broke
            exit_ = Exit("crashed", exc)
        self._thread_terminate(exit_)

    def _thread_start(self) -> Exit | None:
        if self._exit is not None:
            return self._exit
        try:
            self._await_on_loop(self.on_start())
        except BaseException as exc:
            self._actor_ref._started.resolve(_start_failed(self, exc))
            return Exit("crashed", exc)
        self._status = "running"
        self._actor_ref._started.resolve(_STARTED)
        return None

    def _thread_serve(self) -> Exit:
        inbox: _ThreadInbox = self.actor_inbox  # type: ignore[assignment]
        system = self._system
        while True:
            envelope = inbox.get()
            if envelope is None or self._exit is not None:  # closed: abandoned by kill()
                if envelope is not None:
                    _fail_envelope(envelope, str(self._actor_ref))
                assert self._exit is not None
                return self._exit
            message = envelope.message
            if message.__class__ is _ActorStop:
                if envelope.reply_to is not None:
                    self._stop_replies.append(envelope.reply_to)
                return NORMAL
            reply_to = envelope.reply_to
            try:
                faults = system._faults
                if faults is not None and not faults.admit_blocking(self, message):
                    continue
                result = self._await_on_loop(self._handle_receive(message))
            except Exception as exc:
                if reply_to is None:
                    return Exit("crashed", exc)
                reply_to.set_exception()
            except BaseException as exc:
                if reply_to is not None:
                    reply_to.set_exception()
                return Exit("crashed", exc)
            else:
                if reply_to is not None:
                    reply_to.set(result)
            self._handled += 1

    def _thread_terminate(self, exit_: Exit) -> None:
        if self._exit is not None:
            return
        self._status = "stopping"
        self.actor_stopped.set()
        try:
            if exit_.kind == "normal":
                self._await_on_loop(self.on_stop())
            elif exit_.kind == "crashed":
                error = exit_.error
                assert error is not None
                self._await_on_loop(self.on_failure(type(error), error, error.__traceback__))
        except BaseException as exc:
            if exit_.kind == "normal":
                exit_ = Exit("crashed", exc)
            else:
                logger.exception("on_failure of %s raised", self, exc_info=exc)
        self._cancel_io()
        self._finish(exit_)

    def _kill(self) -> None:
        # A thread cannot be interrupted: abandon it. Wake it with a no-op so
        # a thread parked on an empty inbox notices and ends.
        self._cancel_io()
        self._finish(KILLED)  # closes the inbox, which wakes the thread

    def _loop_main(self) -> Any:  # pragma: no cover - never used by thread actors
        raise AssertionError


# What `Ref.memory_estimate` does not count as held by the actor: other actors, code, threads.
_NOT_HELD = (
    Ref,
    Actor,
    type,
    ModuleType,
    FunctionType,
    BuiltinFunctionType,
    MethodType,
    CoroutineType,
    GeneratorType,
    weakref.ref,
    threading.Thread,
)
