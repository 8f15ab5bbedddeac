"""What every supervisor does: start, watch, terminate and restart children, and give up.

Semantics are OTP's (see ``Supervisor`` for the list). The supervisor is a
loop-hosted actor; its handlers run one at a time, so a restart in progress
is never interleaved with another child's exit: the next `Down` waits in the
mailbox until the restart is done, exactly as a gen_server would.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any

import attrs
import trio
from weald.runtime import Actor, ActorDeadError, Down, Ref, SleepingChild, StartError, Stub, StubState
from weald.supervisors._errors import (
    ChildExistsError,
    ChildNotFoundError,
    ChildRunningError,
    RestartIntensityError,
)
from weald.supervisors._spec import ChildInfo, ChildSpec, ChildStatus, Restart

__all__ = ["SupervisorBase", "SupervisorSnapshot", "SupervisorStatistics"]


@attrs.frozen
class SupervisorSnapshot:
    """A supervisor's state for introspection.

    Attributes:
        path: its path in the tree.
        kind: ``Supervisor`` or ``DynamicSupervisor`` (or a subclass name).
        strategy: its restart strategy.
        status: its actor status.
        max_restarts: restart intensity: restarts allowed...
        max_seconds: ...within this many seconds.
        restarts: restarts performed in its lifetime.
        children: every child, in start order.
    """

    path: str
    kind: str
    strategy: str
    status: str
    max_restarts: int
    max_seconds: float
    restarts: int
    children: tuple[ChildInfo, ...]


@attrs.frozen
class SupervisorStatistics:
    """A supervisor's counts, kept as it goes: reading them costs the same for 10 children or 100,000.

    Attributes:
        children: every child known (running, restarting, stopped, asleep).
        asleep: children held by a stub (dormant or hibernated): nothing of them runs.
        restarts: restarts performed in its lifetime.
    """

    children: int
    asleep: int
    restarts: int


class _Child:
    """A supervisor's record of one child (mutable; only the supervisor touches it).

    Invariant: ``asleep`` is True exactly while ``status`` is ``dormant`` or
    ``hibernated``, and then ``ref`` is None; its stub, when one is made, is
    the one registered at its path (`ActorSystem.stub_at`): a child asleep
    has no stub until its path is looked up (the supervisor's table,
    `ActorSystem.set_sleeping`). While it sleeps, a spec with a ``rebuild``
    is let go (``_spec`` is None, ``_rebuild`` set) and `spec` makes it
    again when asked; ``id``, ``actor`` and ``restart`` are always there,
    for the questions asked of a sleeping child, and ``shape`` is the
    subtree its stub answers for.
    """

    __slots__ = (
        "_rebuild",
        "_spec",
        "actor",
        "asleep",
        "attempt",
        "escalations",
        "generation",
        "id",
        "ref",
        "restart",
        "restarts",
        "shape",
        "started_at",
        "status",
    )

    def __init__(self, spec: ChildSpec) -> None:
        self._spec: ChildSpec | None = spec
        self._rebuild: Callable[[], ChildSpec] | None = None
        self.id = spec.id
        self.actor = spec.actor
        self.restart: Restart = spec.restart
        self.ref: Ref[Any] | None = None
        self.asleep = False
        self.shape: Mapping[str, type[Actor]] | None = None
        self.status: ChildStatus = "stopped"
        self.restarts = 0
        self.escalations = 0
        self.started_at = 0.0
        self.attempt = 0
        self.generation = 0

    @property
    def spec(self) -> ChildSpec:
        """The child's spec, made again by its ``rebuild`` if it was let go while the child slept.

        Raises:
            Exception: whatever ``rebuild`` raised; ValueError if it made a spec of another id or actor.
        """
        spec = self._spec
        if spec is None:
            rebuild = self._rebuild
            assert rebuild is not None  # let go only with a rebuild
            spec = rebuild()
            if not isinstance(spec, ChildSpec) or spec.id != self.id or spec.actor is not self.actor:
                msg = f"its rebuild made {spec!r}, not a spec of id {self.id!r} and actor {self.actor.__name__}"
                raise ValueError(msg)
            self._spec, self._rebuild = spec, None
        return spec

    def let_go(self) -> None:
        """Asleep: keep only the spec's ``rebuild`` (when it has one), not the spec."""
        spec = self._spec
        if spec is not None and spec.rebuild is not None:
            self._spec, self._rebuild = None, spec.rebuild

    def info(self, base: str, stub: Stub | None) -> ChildInfo:
        return ChildInfo(
            id=self.id,
            ref=self.ref if stub is None else stub,
            status=self.status,
            restarts=self.restarts,
            path=f"{base}/{self.id}",
            kind=self.actor.__name__,
            restart=self.restart,
            escalations=self.escalations,
        )


@attrs.frozen
class _Wake:
    """A message reached the stub of a dormant or hibernated child: start it."""

    child_id: str


@attrs.frozen
class _RestartDue:
    """A backoff delay ended: restart ``group`` if nothing changed since (``generation``)."""

    child_id: str
    generation: int
    group: tuple[str, ...]


class SupervisorBase(Actor):
    """Shared machinery of `Supervisor` and `DynamicSupervisor`."""

    _strategy: str = "one_for_one"

    def _clock(self) -> float:
        """The clock restart intensity and backoff resets are measured with (tests replace it)."""
        return time.monotonic()

    def __init__(self, max_restarts: int = 3, max_seconds: float = 5.0) -> None:
        super().__init__()
        if not isinstance(max_restarts, int) or max_restarts < 0:
            msg = f"max_restarts is an integer >= 0, got {max_restarts!r}"
            raise ValueError(msg)
        if not max_seconds > 0:
            msg = f"max_seconds is a number > 0, got {max_seconds!r}"
            raise ValueError(msg)
        self._max_restarts = max_restarts
        self._max_seconds = float(max_seconds)
        self._kids: dict[str, _Child] = {}
        self._by_ref: dict[Ref[Any], str] = {}
        # Made by the first restart: most supervisors never restart anything.
        self._restart_times: deque[float] | None = None
        self._total_restarts = 0
        # Invariant: _asleep counts the children ``asleep`` (they leave _kids only once they are not).
        self._asleep = 0
        # The children without a stub, in the order they came up (started, or woken: moved to the end); an id
        # whose child left _kids stays until `awake_children` prunes it, so no removal has to touch it.
        self._awake: dict[str, None] = {}
        self._table_set = False  # the system knows `_sleeping_child` (set at the first child asleep)

    # -- events -------------------------------------------------------------------------

    def _publish(self, topic: str, **data: Any) -> None:
        self.system.events.emit(f"supervisor.{topic}", self.path, data)  # ``data`` is made for the call

    @property
    def _base(self) -> str:
        return self.path.rstrip("/")

    # -- starting -----------------------------------------------------------------------

    async def _start(self, child: _Child) -> Ref[Any]:
        if not child.asleep:
            return await self._confirm_start(child, self._launch_child(child))
        # Dormant or hibernated: the new actors take the stubs' paths (and messages).
        path = f"{self._base}/{child.id}"
        stub = self.system.stub_at(path)
        try:
            try:
                ref = self._launch_child(child)  # registered at its path (or failed): no longer asleep
            finally:
                child.asleep = False
                self._asleep -= 1
                self._awake[child.id] = None
            return await self._confirm_start(child, ref)
        finally:
            reason = "it did not come back when its subtree was started"
            for left in {stub, self.system.stub_at(path)}:  # one made while it started, if it failed
                if left is not None:
                    self.system.discard_stubs(left, reason, only_unused=True)

    def _sleep(self, child: _Child, state: StubState) -> Stub:
        """Put the child to sleep and return its stub; its first message starts the child (`_Wake`)."""
        self._keep_stub(child, state)
        stub = self.system.whereis(f"{self._base}/{child.id}")
        assert isinstance(stub, Stub)  # made from the table (`_sleeping_child`)
        return stub

    def _wake_for(self, child_id: str) -> Callable[[], None]:
        """What a stub of the child calls at its first message: a `_Wake` to this supervisor."""
        ref = self.actor_ref
        wake_message = _Wake(child_id)

        def wake() -> None:
            with contextlib.suppress(ActorDeadError):  # the supervisor ended: so did its stubs
                ref.tell(wake_message)

        return wake

    def _install_stub(self, child: _Child, state: StubState, like: Ref[Any]) -> Stub:
        path = f"{self._base}/{child.id}"
        return self.system.install_stub(path, child.actor, state=state, wake=self._wake_for(child.id), like=like)

    def _sleeping_child(self, child_id: str) -> SleepingChild | None:
        """The table of sleeping children (`ActorSystem.set_sleeping`): any thread, the registry's lock held."""
        child = self._kids.get(child_id)
        if child is None or not child.asleep:
            return None
        state: StubState = "dormant" if child.status == "dormant" else "hibernated"
        return (child.actor, state, self._wake_for(child_id), child.shape or _NO_SHAPE)

    def _keep_stub(self, child: _Child, state: StubState, shape: Mapping[str, type[Actor]] | None = None) -> None:
        """The child sleeps from now on: its stub is the one at its path, or made when its path is looked up."""
        if not child.asleep:
            self._asleep += 1
            if self._asleep == 1 and not self._table_set:
                self._table_set = True
                self.system.set_sleeping(self._base, self._sleeping_child)
        self._awake.pop(child.id, None)
        child.asleep = True
        child.status = state
        child.shape = shape
        child.let_go()

    def _forget_stub(self, child: _Child, reason: str) -> None:
        if child.asleep:
            child.asleep = False
            self._asleep -= 1
            self._awake[child.id] = None
            stub = self.system.stub_at(f"{self._base}/{child.id}")
            if stub is not None:
                self.system.discard_stubs(stub, reason)

    def _launch_child(self, child: _Child) -> Ref[Any]:
        """Spawn the child's actor; its ``on_start`` runs in its own task, next."""
        try:
            spec = child.spec  # made again here if it was let go while the child slept
            ref = self.spawn_child(spec.actor, spec.args, spec.kwargs, name=spec.id)
        except Exception as exc:
            child.status = "stopped"
            msg = f"cannot start child {child.id!r} of {self.path}: {exc!r}"
            raise StartError(msg) from exc
        self._by_ref[ref] = child.id
        return ref

    async def _confirm_start(self, child: _Child, ref: Ref[Any]) -> Ref[Any]:
        """Wait for the child's ``on_start``; a failure there is a `StartError`."""
        spec = child.spec
        try:
            # A loop actor with the default ``on_start`` has nothing that could
            # fail its start: it is running from its spawn (OTP's start_child
            # of a process without init), and a supervisor that starts many
            # (a model response's tool calls) waits for none of them. Should
            # it end before its first step, its Down says so as for any end.
            if not ref.actor_class._starts_at_once:
                await ref.started()
        except Exception as exc:
            self._by_ref.pop(ref, None)
            child.status = "stopped"
            child.ref = None
            self._publish("child_start_failed", id=spec.id, error=repr(exc.__cause__ or exc))
            if isinstance(exc, StartError):
                raise
            msg = f"child {spec.id!r} of {self.path} ended before it started"
            raise StartError(msg) from exc
        child.ref = ref
        child.status = "running"
        child.started_at = self._clock()
        if spec.progress:
            self._publish("child_started", id=spec.id, path=ref.path, kind=spec.actor.__name__)
        return ref

    def _add(self, spec: ChildSpec) -> _Child:
        if spec.id in self._kids:
            msg = f"{self.path} already has a child {spec.id!r}"
            raise ChildExistsError(msg)
        child = _Child(spec)
        self._kids[spec.id] = child
        self._awake.pop(spec.id, None)
        self._awake[spec.id] = None
        return child

    def _get(self, child_id: str) -> _Child:
        child = self._kids.get(child_id)
        if child is None:
            msg = f"{self.path} has no child {child_id!r}"
            raise ChildNotFoundError(msg)
        return child

    # -- stopping ------------------------------------------------------------------------

    async def _terminate(self, child: _Child) -> None:
        """Stop a child, giving it ``spec.shutdown`` seconds, then kill or abandon it."""
        ref = child.ref
        child.generation += 1  # cancels a pending backoff restart
        child.status = "stopped"
        child.ref = None
        self._forget_stub(child, f"{self.path} stopped it")
        if ref is None:
            return
        self._by_ref.pop(ref, None)  # its Down, when it comes, is ours: ignore it
        if ref.is_alive():
            ref.stop(block=False)
        exited = ref.exited()
        with trio.move_on_after(child.spec.shutdown):
            await exited
            return
        ref.kill()
        self._publish(
            "child_killed",
            id=child.spec.id,
            path=ref.path,
            reason=f"did not stop within its shutdown of {child.spec.shutdown} s",
        )
        with trio.move_on_after(max(child.spec.shutdown, 1.0)):
            await exited

    async def _terminate_all(self) -> None:
        for child in reversed(list(self._kids.values())):
            if child.ref is not None or child.asleep:
                await self._terminate(child)
        if self._table_set:
            self._table_set = False
            self.system.set_sleeping(self._base, None)

    def on_stop(self) -> Any:
        """Stop every child, last started first (awaited on the supervisor's task)."""
        return self._terminate_all()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,  # noqa: ARG002 - pykka's hook signature
        exception_value: BaseException | None,  # noqa: ARG002
        traceback: TracebackType | None,  # noqa: ARG002
    ) -> Any:
        """After a crash, stop the children still running, so none outlives the supervisor."""
        return self._terminate_all()

    # -- watching -------------------------------------------------------------------------

    def on_receive(self, message: Any) -> Coroutine[Any, Any, None] | None:
        """Handle a child's end, a wake-up or a backoff's end; returns the work to await, if any.

        Not ``async``: a child's end that needs no restart (every tool
        call's) is handled without making a coroutine at all; the receive
        loop awaits what is returned.
        """
        if isinstance(message, Down):
            return self._on_down(message)
        if isinstance(message, _Wake):
            return self._on_wake(message)
        if isinstance(message, _RestartDue):
            return self._on_restart_due(message)
        return None

    async def _on_wake(self, wake: _Wake) -> None:
        child = self._kids.get(wake.child_id)
        if child is None or not child.asleep:
            return  # stopped, deleted or started meanwhile
        stub = self.system.stub_at(f"{self._base}/{child.id}")
        if stub is None or not stub.waking:
            return
        state = child.status
        try:
            ref = await self._start(child)
        except StartError:
            return  # _confirm_start published child_start_failed; the stubs' messages failed with it
        if child.spec.progress:
            self._publish("child_woken", id=child.id, path=ref.path, was=state)

    async def hibernate_child(self, child_id: str) -> bool:
        """Stop a running child and leave a `weald.runtime.Stub` in its place; its next message restarts it.

        OTP's ``proc_lib:hibernate`` taken to a subtree: the child's actors
        end (normally: their ``on_stop`` runs, so they persist what they
        must), and the stub answers for the child's path and every path of
        its subtree. The first message sent to any of them starts the child
        again from its spec (not counted as a restart) and is then handled
        by it, with everything sent meanwhile, in order. A hibernated child
        is left as it is by restarts of its siblings.

        Returns:
            True if it was hibernated; False if it was not running.

        Raises:
            ChildNotFoundError: there is no such child.
        """
        child = self._get(child_id)
        ref = child.ref
        if ref is None or child.status != "running" or not ref.is_alive():
            return False
        # The stub holds the paths from now on; what reaches it while the
        # child stops wakes it once this handler is done (`_Wake` queues).
        stub = self._install_stub(child, "hibernated", ref)
        await self._terminate(child)
        if self._kids.get(child_id) is not child:
            self.system.discard_stubs(stub, f"{self.path} removed it")
            return False
        self._keep_stub(child, "hibernated")
        self._publish("child_hibernated", id=child_id, path=ref.path)
        return True

    def _on_down(self, down: Down) -> Coroutine[Any, Any, None] | None:
        """Record a child's end; returns the restart to await, if it is to be restarted."""
        child_id = self._by_ref.pop(down.ref, None)
        if child_id is None:
            return None  # a child we stopped ourselves, or one that failed to start
        child = self._kids[child_id]
        child.ref = None
        exit_ = down.exit
        spec = child.spec
        if isinstance(exit_.error, RestartIntensityError):
            child.escalations += 1  # it gave up: kept so the tree shows it after the restart
        if exit_.abnormal or spec.progress:
            self._publish(
                "child_crashed" if exit_.abnormal else "child_exited",
                id=child_id,
                path=down.path,
                exit=exit_.kind,
                error=repr(exit_.error) if exit_.error is not None else None,
            )
        restart = spec.restart == "permanent" or (spec.restart == "transient" and exit_.abnormal)
        if not restart:
            if spec.restart == "temporary":
                del self._kids[child_id]
            else:
                child.status = "stopped"
            return None
        return self._restart(child_id)

    def _restart_group(self, child_id: str) -> list[str]:
        ids = list(self._kids)
        if self._strategy == "one_for_all":
            return ids
        if self._strategy == "rest_for_one":
            return ids[ids.index(child_id) :]
        return [child_id]

    def _allow_restart(self) -> bool:
        now = self._clock()
        times = self._restart_times
        if times is None:
            times = self._restart_times = deque()
        times.append(now)
        while times and times[0] < now - self._max_seconds:
            times.popleft()
        return len(times) <= self._max_restarts

    async def _give_up(self, reason: str) -> None:
        await self._terminate_all()
        self._publish(
            "gave_up",
            reason=reason,
            max_restarts=self._max_restarts,
            max_seconds=self._max_seconds,
        )
        msg = f"{self.path} gave up: {reason}; more than {self._max_restarts} restarts within {self._max_seconds:g} s"
        raise RestartIntensityError(msg)

    async def _restart(self, child_id: str) -> None:
        if not self._allow_restart():
            await self._give_up(f"child {child_id!r} needed another restart")
        full = self._restart_group(child_id)
        for other_id in reversed(full):
            other = self._kids[other_id]
            if other_id != child_id and other.ref is not None:
                await self._terminate(other)
        # Temporary children stopped for a group restart are not restarted (OTP).
        # Dormant and hibernated ones are left as they are: nothing of them ran.
        asleep = {i for i in full if self._kids[i].asleep}
        group = [i for i in full if i == child_id or (i not in asleep and self._kids[i].restart != "temporary")]
        for i in full:
            if i not in group and i not in asleep:
                del self._kids[i]
        child = self._kids[child_id]
        delay = self._backoff_delay(child)
        for i in group:
            self._kids[i].status = "restarting"
        if delay > 0:
            child.generation += 1
            due = _RestartDue(child_id, child.generation, tuple(group))
            self.run_io(trio.sleep, delay, reply=lambda _: due, name=f"backoff {child_id}")
            self.on_restart_scheduled(child_id, child.attempt, delay)
            return
        await self._start_group(group)

    def on_restart_scheduled(self, child_id: str, attempt: int, delay: float) -> None:
        """Hook: a child's restart waits ``delay`` seconds of its backoff; the default does nothing.

        Runs in the supervisor's task, right after the restart was scheduled
        (``attempt`` is the backoff's 1-based attempt count, reset after the
        child stayed up ``reset_after`` seconds). Subclasses override it to
        show when a child comes back; it must not block, and an exception
        from it crashes the supervisor like any handler's.
        """

    def _backoff_delay(self, child: _Child) -> float:
        backoff = child.spec.backoff
        if backoff is None:
            return 0.0
        if child.started_at and self._clock() - child.started_at >= backoff.reset_after:
            child.attempt = 0
        child.attempt += 1
        return backoff.delay(child.attempt)

    async def _on_restart_due(self, due: _RestartDue) -> None:
        child = self._kids.get(due.child_id)
        if child is None or child.generation != due.generation:
            return
        await self._start_group([i for i in due.group if i in self._kids])

    async def _start_group(self, group: list[str]) -> None:
        for child_id in group:
            child = self._kids.get(child_id)
            if child is None or child.ref is not None or child.asleep:
                continue
            while True:
                try:
                    await self._start(child)
                except StartError as exc:
                    if not self._allow_restart():
                        await self._give_up(f"child {child_id!r} failed to restart: {exc.__cause__!r}")
                    delay = self._backoff_delay(child)
                    if delay > 0:
                        # A failed restart waits its backoff too, like a crash does.
                        child.status = "restarting"
                        child.generation += 1
                        rest = tuple(group[group.index(child_id) :])
                        due = _RestartDue(child_id, child.generation, rest)
                        self.run_io(trio.sleep, delay, reply=_constant(due), name=f"backoff {child_id}")
                        self.on_restart_scheduled(child_id, child.attempt, delay)
                        return
                    continue
                child.restarts += 1
                self._total_restarts += 1
                self._publish("child_restarted", id=child_id, path=f"{self._base}/{child_id}", restarts=child.restarts)
                break

    # -- the public API (called through ref.proxy()) ---------------------------------------------

    def which_children(self, only: Iterable[str] | None = None) -> list[ChildInfo]:
        """Every child in start order, with its ref (None when not running) and status.

        Args:
            only: just these children (by id; unknown ids are left out): for a
                question about a few children of a supervisor of 100,000.
        """
        base = self._base
        kids = self._kids
        chosen = kids.values() if only is None else [kids[i] for i in dict.fromkeys(only) if i in kids]
        return [child.info(base, self._stub_of(child) if child.asleep else None) for child in chosen]

    def _stub_of(self, child: _Child) -> Stub | None:
        """A sleeping child's stub, made now if it was not: what `which_children` gives as its ref."""
        stub = self.system.whereis(f"{self._base}/{child.id}")
        return stub if isinstance(stub, Stub) else None

    def count_children(self) -> dict[str, int]:
        """Counts: ``specs``, ``active`` (running), ``supervisors``, ``workers``, ``dormant``, ``hibernated``.

        ``specs`` is every child known; ``dormant`` and ``hibernated`` children are held by stubs.
        """
        kids = list(self._kids.values())
        supervisors = sum(1 for c in kids if issubclass(c.actor, SupervisorBase))
        return {
            "specs": len(kids),
            "active": sum(1 for c in kids if c.ref is not None and c.ref.is_alive()),
            "supervisors": supervisors,
            "workers": len(kids) - supervisors,
            "dormant": sum(1 for c in kids if c.status == "dormant"),
            "hibernated": sum(1 for c in kids if c.status == "hibernated"),
        }

    def awake_children(self) -> list[str]:
        """The ids of the children not asleep (running, restarting or stopped), the most recently up last.

        In the order they started or woke: a child that wakes moves to the
        end. Costs what the children awake cost, not all of them: for the
        question "which of 100,000 sessions run" (``sessions.page``).
        """
        kids = self._kids
        gone = [child_id for child_id in self._awake if (child := kids.get(child_id)) is None or child.asleep]
        for child_id in gone:
            del self._awake[child_id]
        return list(self._awake)

    def statistics(self) -> SupervisorStatistics:
        """Its counts (children, asleep, restarts), in constant time: for a sampler asking every second."""
        return SupervisorStatistics(children=len(self._kids), asleep=self._asleep, restarts=self._total_restarts)

    def snapshot(self) -> SupervisorSnapshot:
        """A frozen view of this supervisor and its children."""
        return SupervisorSnapshot(
            path=self.path,
            kind=type(self).__name__,
            strategy=self._strategy,
            status=self._status,
            max_restarts=self._max_restarts,
            max_seconds=self._max_seconds,
            restarts=self._total_restarts,
            children=tuple(self.which_children()),
        )

    def _require_stopped(self, child: _Child, action: str) -> None:
        if child.ref is not None or child.status == "restarting":
            msg = f"cannot {action} child {child.id!r} of {self.path}: it is {child.status}"
            raise ChildRunningError(msg)


_NO_SHAPE: Mapping[str, type[Actor]] = {}


def _constant(message: Any) -> Callable[[object], Any]:
    """A ``run_io`` reply that sends ``message`` whatever the outcome."""
    return lambda _: message
