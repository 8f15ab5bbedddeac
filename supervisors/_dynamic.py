"""`DynamicSupervisor`: children started at run time (sessions, tool executions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from weald.runtime import Actor, ActorSystem, Ref, StartError, Stub
from weald.supervisors._core import SupervisorBase, _Child
from weald.supervisors._errors import ChildNotFoundError, MaxChildrenError, SupervisorError
from weald.supervisors._spec import ChildSpec

__all__ = ["DynamicSupervisor"]


class DynamicSupervisor(SupervisorBase):
    """A one_for_one supervisor whose children are added while it runs.

    Each child restarts by its own spec's restart type; restart intensity
    and escalation are as for `Supervisor`. Children are addressed by ref.

    Args:
        max_restarts: restarts allowed within ``max_seconds`` before giving up.
        max_seconds: the window of the restart intensity.
        max_children: refuse `start_child` beyond this many children.
    """

    def __init__(
        self,
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        max_children: int | None = None,
    ) -> None:
        super().__init__(max_restarts, max_seconds)
        if max_children is not None and (not isinstance(max_children, int) or max_children < 0):
            msg = f"max_children is None or an integer >= 0, got {max_children!r}"
            raise ValueError(msg)
        self._max_children = max_children

    @classmethod
    def start(
        cls,
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        max_children: int | None = None,
        name: str | None = None,
    ) -> Ref[Self]:
        """Start a top-level dynamic supervisor in the current system (at ``/<name>`` if named)."""
        kwargs: dict[str, Any] = {
            "max_restarts": max_restarts,
            "max_seconds": max_seconds,
            "max_children": max_children,
        }
        if name is None:
            return super().start(**kwargs)
        return ActorSystem.current().spawn(cls, kwargs=kwargs, name=name)

    async def start_child(self, spec: ChildSpec) -> Ref[Any]:
        """Start a child from ``spec``; its id must be unique among the children.

        A lazy spec is not started: its `weald.runtime.Stub` is returned,
        and the first message sent to it starts the child.

        Raises:
            MaxChildrenError: ``max_children`` children are already present.
            ChildExistsError: a child with that id is present.
            StartError: the child failed to start (it is not kept).
        """
        child = self._admit(spec)
        if spec.lazy:
            return self._sleep(child, "dormant")
        try:
            return await self._start(child)
        except BaseException:
            self._kids.pop(spec.id, None)
            raise

    def add_hibernated(
        self, specs: Sequence[ChildSpec], shape: Mapping[str, type[Actor]]
    ) -> list[Stub | SupervisorError]:
        """Add children as if each had run and hibernated: none is started until its first message.

        For children whose state is stored and that need not run now (a
        daemon restoring its sessions). Each gets a `weald.runtime.Stub` in
        state ``hibernated`` at its path, answering for the paths of
        ``shape`` below it as well (the classes of the actors its subtree
        starts, by path relative to the child's); the first message to any
        of them starts the child from its spec, as a hibernated child wakes.

        Returns:
            For each spec, in order: its stub, or why it was not added
            (`MaxChildrenError`, `ChildExistsError`).
        """
        base = self._base
        whereis = self.system.whereis
        out: list[Stub | SupervisorError] = []
        for outcome in self.add_asleep(specs, shape):
            if isinstance(outcome, SupervisorError):
                out.append(outcome)
                continue
            stub = whereis(f"{base}/{outcome}")  # made from the table
            assert isinstance(stub, Stub)
            out.append(stub)
        return out

    def add_asleep(self, specs: Sequence[ChildSpec], shape: Mapping[str, type[Actor]]) -> list[str | SupervisorError]:
        """`add_hibernated` without making the stubs: each is made when its path is first looked up.

        For many children (a daemon's million sessions asleep): a child
        added so is a row of this supervisor's (its record), nothing in the
        registry, until ``system.whereis`` of its path (or of a path of
        ``shape`` below it) makes its stub, which then wakes it as any
        hibernated child's does.

        Returns:
            For each spec, in order: its id, or why it was not added
            (`MaxChildrenError`, `ChildExistsError`).
        """
        out: list[str | SupervisorError] = []
        for spec in specs:
            try:
                child = self._admit(spec)
            except SupervisorError as exc:
                out.append(exc)
                continue
            self._keep_stub(child, "hibernated", shape or None)
            out.append(child.id)
        return out

    def _admit(self, spec: ChildSpec) -> _Child:
        if self._max_children is not None and len(self._kids) >= self._max_children:
            msg = f"{self.path} already has its maximum of {self._max_children} children"
            raise MaxChildrenError(msg)
        return self._add(spec)

    async def start_children(self, specs: Sequence[ChildSpec]) -> list[Ref[Any] | SupervisorError | StartError]:
        """Start several children, each as `start_child` would, all at once.

        Every child is spawned before the first is waited for, so their
        ``on_start`` hooks run together rather than one supervisor round
        each (the tool runner starts a model response's calls this way). A
        child counts toward ``max_children`` from its spawn, so one whose
        ``on_start`` then fails still took its place while the later specs
        were admitted.

        Returns:
            For each spec, in order: the child's `Ref`, or the error that
            kept it from starting (`MaxChildrenError`, `ChildExistsError` or
            `StartError`); one child's failure does not stop the others.
        """
        out: list[Ref[Any] | SupervisorError | StartError] = []
        launched: list[tuple[int, _Child, Ref[Any]]] = []
        for spec in specs:
            try:
                child = self._admit(spec)
            except SupervisorError as exc:
                out.append(exc)
                continue
            try:
                ref = self._launch_child(child)
            except StartError as exc:
                self._kids.pop(spec.id, None)
                out.append(exc)
                continue
            launched.append((len(out), child, ref))
            out.append(ref)
        for position, (index, child, ref) in enumerate(launched):
            try:
                await self._confirm_start(child, ref)
            except StartError as exc:
                self._kids.pop(child.spec.id, None)
                out[index] = exc
            except BaseException:
                for _, unconfirmed, _ in launched[position:]:
                    self._kids.pop(unconfirmed.spec.id, None)
                raise
        return out

    async def stop_child(self, child_id: str) -> bool:
        """Stop the child called ``child_id`` in whatever state it is, and forget it; returns whether it was alive.

        Running, hibernated or dormant (a `weald.runtime.Stub` at its path),
        waking, or waiting out a restart backoff: by id, the request cannot
        miss a child whose ref changed since the caller looked it up (a
        session that hibernated, or woke, in between), as `terminate_child`
        with that older ref would.
        """
        child = self._kids.get(child_id)
        if child is None:
            return False
        alive = child.status != "stopped"
        await self._terminate(child)
        if self._kids.get(child_id) is child:
            del self._kids[child_id]
        return alive

    async def terminate_child(self, ref: Ref[Any]) -> None:
        """Stop the child behind ``ref`` and forget it.

        Raises:
            ChildNotFoundError: ``ref`` is not a child of this supervisor.
        """
        child_id = self._by_ref.get(ref)
        if child_id is None and isinstance(ref, Stub) and ref.successor is None:
            # A sleeping child's stub: the one registered at its path.
            child_id = ref.path.rpartition("/")[2]
            child = self._kids.get(child_id)
            if child is None or not child.asleep or self.system.stub_at(ref.path) is not ref:
                child_id = None
        if child_id is None:
            msg = f"{ref} is not a running child of {self.path}"
            raise ChildNotFoundError(msg)
        child = self._kids[child_id]
        await self._terminate(child)
        self._kids.pop(child_id, None)
