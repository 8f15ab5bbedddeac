"""Stubs: what holds the path of an actor that is not running but starts on its first message.

A supervisor leaves a `Stub` in the registry for a child it starts on
demand (a lazy child, before its first use) or one it hibernated (stopped
while idle, its state in the store; OTP's ``proc_lib:hibernate``, taken to
a whole subtree). ``system.whereis(path)`` returns the stub, and a stub is
a `Ref`: a ``tell``, an ``ask`` or a call through its proxy is buffered,
and the first one asks the supervisor to wake the child (``wake``). When
the child's actors register again, each stub hands its buffered messages,
in order, to the actor that took its path, and forwards everything sent to
it later, so a caller holding a stub loses nothing.

A stub also answers for the paths below it that its subtree had (its
``shape``): ``whereis("/sessions/a1/agent")`` of a hibernated session gives
a stub for the agent, made on demand, which wakes the session the same way.

Threads: ``put`` may be called from any thread; everything else runs on the
loop thread. Invariant: a stub's state goes buffering -> forwarding (it has
a successor) or buffering -> dead, once, under ``_STUB_LOCK``; a buffered
message is either handed on by `_succeed` or failed by `discard`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import pykka
from weald.runtime._actor import Actor, Exit, Ref, _fail_envelope, _Proxy, _Signal, _StopFlag

if TYPE_CHECKING:
    from pykka._envelope import Envelope
    from pykka._introspection import AttrInfo
__all__ = ["Stub", "StubState"]

StubState = Literal["dormant", "hibernated"]

# Re-entrant: failing a message completes its future, whose callbacks may send again.
_STUB_LOCK = threading.RLock()


def _no_actor() -> None:
    return None


class _Group:
    """The stubs of one sleeping subtree: one wake-up for all of them."""

    __slots__ = ("root", "shape", "stubs", "wake", "woken")

    def __init__(self, wake: Callable[[], None], shape: Mapping[str, type[Actor]], root: str) -> None:
        self.wake: Callable[[], None] | None = wake
        self.shape = shape  # relative to root, the path of the subtree's top
        self.root = root
        self.stubs: list[Stub] = []
        self.woken = False


class Stub(Ref[Any]):
    """A `Ref` to an actor that is not running now but is started by its first message.

    Created only by the runtime (`ActorSystem.install_stub`). ``state`` is
    ``dormant`` (a lazy child not yet started) or ``hibernated``.
    `is_alive` is True while it stands in for its actor (or forwards to a
    live successor).
    """

    def __init__(self, path: str, actor_class: type[Actor], state: StubState, group: _Group) -> None:
        # Ref.__init__ needs an actor; a stub has none.
        self._actor_weakref = _no_actor  # type: ignore[assignment]
        self.actor_class = actor_class
        self.actor_inbox = self
        self.actor_stopped = _StopFlag()  # type: ignore[assignment]
        self._urn = None
        self.path = path
        self._started = _Signal()
        self._exited = _Signal()
        self.state: StubState = state
        self._group = group
        self._buffer: list[Envelope[Any]] | None = None
        self._successor: Ref[Any] | None = None
        group.stubs.append(self)

    def __repr__(self) -> str:
        return f"<Stub {self.path} ({self.actor_class.__name__}, {self.state})>"

    def __str__(self) -> str:
        return f"{self.actor_class.__name__} at {self.path} ({self.state})"

    # -- what a Ref's users see ----------------------------------------------------------

    def is_alive(self) -> bool:
        """True while it stands in for its actor, or forwards to a live one."""
        successor = self._successor
        if successor is not None:
            return successor.is_alive()
        return not self.actor_stopped.is_set()

    @property
    def successor(self) -> Ref[Any] | None:
        """The actor that took this stub's path once it woke, else None."""
        return self._successor

    def proxy(self) -> pykka.ActorProxy[Any]:
        """A proxy whose calls are buffered like any message (and wake the actor).

        Raises:
            ActorDeadError: the stub was discarded.
        """
        successor = self._successor
        if successor is not None:
            return successor.proxy()
        if not self.is_alive():
            msg = f"{self} not found"
            raise pykka.ActorDeadError(msg)
        return _StubProxy(self)

    def mailbox_size(self) -> int:
        """Messages buffered, waiting for the actor to wake."""
        return len(self)

    def kill(self) -> None:
        """Forward the kill to the successor; a sleeping actor has nothing to kill."""
        successor = self._successor
        if successor is not None:
            successor.kill()

    # -- the inbox (a stub is its own) ---------------------------------------------------

    def __len__(self) -> int:
        buffer = self._buffer
        return len(buffer) if buffer else 0

    def __bool__(self) -> bool:
        # A stub is its own inbox (so it has a length), but as a ref it is
        # always truthy, like every other ref: `if ref:` must not depend on
        # how many messages it holds.
        return True

    def empty(self) -> bool:
        """True when nothing is buffered."""
        return not self._buffer

    def get(self) -> Envelope[Any]:
        """Not for stubs: nothing reads a stub's messages but its successor."""
        msg = "a stub's messages are handed to the actor that takes its path"
        raise TypeError(msg)

    def put(self, envelope: Envelope[Any], /) -> None:
        """Buffer (the first one wakes the group), forward to the successor, or fail when discarded."""
        wake = None
        with _STUB_LOCK:
            successor = self._successor
            if successor is None:
                if self.actor_stopped.is_set():
                    dead = True
                else:
                    dead = False
                    if self._buffer is None:
                        self._buffer = []
                    self._buffer.append(envelope)
                    group = self._group
                    if not group.woken:
                        group.woken = True
                        wake = group.wake
            else:
                successor.actor_inbox.put(envelope)
                return
        if dead:
            _fail_envelope(envelope, str(self))
        elif wake is not None:
            wake()

    # -- the runtime's side --------------------------------------------------------------

    @property
    def waking(self) -> bool:
        """True once a message asked for the actor (the supervisor has been told)."""
        return self._group.woken

    def _succeed(self, ref: Ref[Any]) -> None:
        """``ref`` took the path: hand it the buffer, in order, and forward from now on."""
        with _STUB_LOCK:
            if self._successor is not None or self.actor_stopped.is_set():
                return
            buffer, self._buffer = self._buffer, None
            if buffer:
                for envelope in buffer:
                    ref.actor_inbox.put(envelope)
            self._successor = ref
        self._exited.resolve(_NORMAL_OUTCOME)

    def _discard(self, reason: str) -> None:
        with _STUB_LOCK:
            if self._successor is not None or self.actor_stopped.is_set():
                return
            self.actor_stopped.set()
            buffer, self._buffer = self._buffer, None
        for envelope in buffer or ():
            _fail_envelope(envelope, f"{self} ({reason})")
        self._exited.resolve(_NORMAL_OUTCOME)

    def below(self) -> dict[str, type[Actor]]:
        """The paths below this one that its sleeping subtree had, with their classes.

        Each is what ``system.whereis`` answers with a stub (made then) that
        wakes the subtree; listing them wakes nothing. Empty once it woke.
        """
        if self._successor is not None or self.actor_stopped.is_set():
            return {}
        root = self._group.root
        prefix = self.path + "/"
        found = {}
        for relative, actor_class in self._group.shape.items():
            path = f"{root}/{relative}"
            if path.startswith(prefix):
                found[path] = actor_class
        return found

    def _below(self, path: str) -> Stub | None:
        """A stub for ``path`` under this one, made on demand from the group's shape."""
        group = self._group
        if not path.startswith(group.root + "/"):
            return None
        actor_class = group.shape.get(path[len(group.root) + 1 :])
        if actor_class is None or self.actor_stopped.is_set() or self._successor is not None:
            return None
        return Stub(path, actor_class, self.state, group)


class _StubProxy(_Proxy[Any]):
    """A proxy to a stub: attributes are looked up on the actor's class (there is no instance yet)."""

    def __init__(self, stub: Stub) -> None:
        self.actor_ref = stub
        self._actor = stub.actor_class
        self._attr_path = ()
        self._known_attrs = _class_attrs(stub.actor_class)
        self._actor_proxies = {}
        self._callable_proxies = {}

    def __getattr__(self, name: str) -> Any:
        attr_path = (name,)
        info = self._known_attrs.get(attr_path)
        if info is None:
            msg = f"{self.actor_ref} has no attribute {name!r}"
            raise AttributeError(msg)
        if info.callable:
            proxy = self._callable_proxies.get(attr_path)
            if proxy is None:
                proxy = self._callable_proxies[attr_path] = pykka.CallableProxy(
                    actor_ref=self.actor_ref, attr_path=attr_path
                )
            return proxy
        from pykka.messages import ProxyGetAttr

        return self.actor_ref.ask(ProxyGetAttr(attr_path=attr_path), block=False)


_CLASS_ATTRS: dict[type, dict[tuple[str, ...], AttrInfo]] = {}


def _class_attrs(cls: type) -> dict[tuple[str, ...], AttrInfo]:
    attrs = _CLASS_ATTRS.get(cls)
    if attrs is None:
        from pykka._introspection import AttrInfo

        attrs = {}
        for name in dir(cls):
            if name.startswith("_"):
                continue
            attr = getattr(cls, name, None)
            attrs[(name,)] = AttrInfo(callable=callable(attr) and not isinstance(attr, type), traversable=False)
        _CLASS_ATTRS[cls] = attrs
    return attrs


def _make_outcome() -> Any:
    import outcome

    return outcome.Value(Exit("normal"))


_NORMAL_OUTCOME = _make_outcome()

_SHAPES: dict[frozenset[tuple[str, type]], Mapping[str, type[Actor]]] = {}


def shape_of(ref: Ref[Any] | None) -> Mapping[str, type[Actor]]:
    """The relative paths and classes of the live actors below ``ref``, shared between equal subtrees.

    Walks the actors each one spawned (its linked children): O(subtree), never the whole registry.
    """
    if ref is None:
        return _EMPTY_SHAPE
    base = len(ref.path.rstrip("/")) + 1
    found: list[tuple[str, type]] = []
    pending = [ref]
    while pending:
        actor = pending.pop()._actor_weakref()
        linked = actor._linked if actor is not None else None
        for child in list(linked or ()):
            found.append((child.path[base:], child.actor_class))
            pending.append(child)
    if not found:
        return _EMPTY_SHAPE
    key = frozenset(found)
    shape = _SHAPES.get(key)
    if shape is None:
        shape = _SHAPES[key] = dict(key)
    return shape


_EMPTY_SHAPE: Mapping[str, type[Actor]] = {}
