"""Child specifications: what a supervisor starts, and how it restarts it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import attrs
from weald.runtime import Actor

__all__ = ["RESTART_TYPES", "STRATEGIES", "Backoff", "ChildInfo", "ChildSpec", "ChildStatus", "Restart", "Strategy"]

Restart = Literal["permanent", "transient", "temporary"]
ChildStatus = Literal["running", "restarting", "stopped", "dormant", "hibernated"]
Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
RESTART_TYPES: tuple[str, ...] = ("permanent", "transient", "temporary")
STRATEGIES: tuple[str, ...] = ("one_for_one", "one_for_all", "rest_for_one")


def _check_id(_: object, __: object, value: str) -> None:
    if not isinstance(value, str) or not value or "/" in value:
        msg = f"a child id is a non-empty string without '/', got {value!r}"
        raise ValueError(msg)


def _check_restart(_: object, __: object, value: str) -> None:
    if value not in RESTART_TYPES:
        msg = f"restart must be one of {', '.join(RESTART_TYPES)}; got {value!r}"
        raise ValueError(msg)


def _check_actor(_: object, __: object, value: type) -> None:
    if not (isinstance(value, type) and issubclass(value, Actor)):
        msg = f"a child's actor must be a subclass of weald.runtime.Actor, got {value!r}"
        raise TypeError(msg)


def _check_shutdown(_: object, __: object, value: float) -> None:
    if not value >= 0:
        msg = f"shutdown is a number of seconds >= 0, got {value!r}"
        raise ValueError(msg)


def _check_rebuild(_: object, __: object, value: Callable[[], ChildSpec] | None) -> None:
    if value is not None and not callable(value):
        msg = f"rebuild is None or a function returning the spec again, got {value!r}"
        raise TypeError(msg)


def _as_tuple(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(values)


def _freeze_kwargs(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class Backoff:
    """Exponential delay before restarting a child, something OTP lacks.

    The n-th consecutive restart of a child waits ``min(initial * factor**(n-1), cap)``
    seconds. A child that stayed up for ``reset_after`` seconds starts over at ``initial``.
    """

    initial: float = 0.1
    factor: float = 2.0
    cap: float = 30.0
    reset_after: float = 60.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` (1-based)."""
        return float(min(self.initial * self.factor ** max(attempt - 1, 0), self.cap))


@attrs.frozen
class ChildSpec:
    """How to start a child and when to restart it.

    Attributes:
        id: the child's name, unique under its supervisor; its path is
            ``<supervisor path>/<id>``.
        actor: the `weald.runtime.Actor` subclass to start (loop-hosted or
            a `ThreadActor`).
        args: positional arguments for the actor's constructor.
        kwargs: keyword arguments for the actor's constructor.
        restart: ``permanent`` (always restarted), ``transient`` (only
            after a crash) or ``temporary`` (never; removed when it ends).
        shutdown: seconds the child gets to stop before it is killed (or,
            for a thread actor, abandoned) and reported.
        backoff: optional exponential delay between restarts; off by default.
        progress: publish ``supervisor.child_started`` and, for a normal
            end, ``supervisor.child_exited`` for this child (OTP's progress
            reports). Off for children numerous and short-lived enough to
            flood the event ring, whose starts and ends their parent reports
            itself (each tool call: ``tool.started`` / ``tool.finished``).
            Crashes, failed starts, kills and restarts are published always.
        lazy: start the child on its first message instead of with its
            supervisor. Until then it is ``dormant``: a `weald.runtime.Stub`
            holds its path, and whatever is sent there starts it and is
            then handled by it. A dormant child is left as it is by restarts
            of its siblings (nothing of it runs); once started it is an
            ordinary child.
        rebuild: a function that returns this spec again (same id and
            actor, same arguments as far as the child can tell). With it, a
            supervisor lets the spec go while the child is ``dormant`` or
            ``hibernated``, keeping only the child's id, class and restart
            type and this function, and calls it when the child starts: a
            sleeping child then costs what the function holds rather than
            what its spec holds (a session's configuration objects and
            closures). It runs in the supervisor's task, so it must not
            block; an exception from it, or a spec of another id or actor,
            is a failed start (`weald.runtime.StartError`). Not compared by
            ``==``.
    """

    id: str
    actor: type[Actor]
    args: tuple[Any, ...] = attrs.field(default=(), converter=_as_tuple)
    kwargs: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_kwargs)
    restart: Restart = "permanent"
    shutdown: float = 5.0
    backoff: Backoff | None = None
    progress: bool = True
    lazy: bool = False
    rebuild: Callable[[], ChildSpec] | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        # One check of every field instead of a validator call per field: a
        # spec is made for every tool call (attrs.evolve runs this too).
        child_id = self.id
        if child_id.__class__ is not str or not child_id or "/" in child_id:
            _check_id(self, None, child_id)
        _check_actor(self, None, self.actor)
        if self.restart not in RESTART_TYPES:
            _check_restart(self, None, self.restart)
        if not self.shutdown >= 0:
            _check_shutdown(self, None, self.shutdown)
        if self.rebuild is not None:
            _check_rebuild(self, None, self.rebuild)


@attrs.frozen
class ChildInfo:
    """One child as its supervisor sees it.

    Attributes:
        id: the child's id.
        ref: its `Ref` while running; its `weald.runtime.Stub` while
            ``dormant`` or ``hibernated`` (a message there starts it); else None.
        status: ``running``, ``restarting``, ``stopped``, ``dormant`` (lazy,
            not started yet) or ``hibernated`` (stopped while idle; started
            again by its next message).
        restarts: how many times the supervisor restarted it.
        path: its path in the tree.
        kind: the actor class name.
        restart: its restart type.
        escalations: how many times it gave up and escalated to this supervisor
            (crashed with `RestartIntensityError`); kept across its restarts.
    """

    id: str
    ref: Any
    status: ChildStatus
    restarts: int = 0
    path: str = ""
    kind: str = ""
    restart: Restart = "permanent"
    escalations: int = 0
