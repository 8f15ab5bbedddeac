"""`Supervisor`: a fixed list of children under an OTP restart strategy."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Self

from weald.runtime import ActorSystem, Ref, StartError
from weald.supervisors._core import SupervisorBase, _Child
from weald.supervisors._spec import STRATEGIES, ChildSpec, Strategy

__all__ = ["Supervisor"]


class Supervisor(SupervisorBase):
    """Starts children in order, restarts them by strategy, and escalates when restarts run away.

    Semantics (OTP's):

    - children start in list order and stop in reverse order;
    - a crash is an exception escaping a handler of a ``tell``, an exception
      in ``on_start``, or any BaseException; an exception in an ``ask`` goes
      back to the caller and the child lives on; a stop by anyone other than
      the supervisor is a normal exit;
    - ``permanent`` children are always restarted, ``transient`` ones only
      after a crash, ``temporary`` ones never (they are removed);
    - ``one_for_one`` restarts the child alone; ``one_for_all`` stops the
      others in reverse order, then restarts all in order; ``rest_for_one``
      does that for the failed child and those started after it;
    - more than ``max_restarts`` restarts within ``max_seconds`` makes the
      supervisor stop all its children in reverse order and crash with
      `RestartIntensityError`, so its own supervisor handles it;
    - each child gets its spec's ``shutdown`` seconds to stop before it is
      killed (a thread actor: abandoned) and reported.

    Through ``ref.proxy()``: `which_children`, `start_child`,
    `terminate_child`, `restart_child`, `delete_child`, `count_children`.

    Args:
        children: the child specs, in start order.
        strategy: ``one_for_one``, ``one_for_all`` or ``rest_for_one``.
        max_restarts: restarts allowed within ``max_seconds`` before giving up.
        max_seconds: the window of the restart intensity.
    """

    def __init__(
        self,
        children: Iterable[ChildSpec] = (),
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        max_seconds: float = 5.0,
    ) -> None:
        super().__init__(max_restarts, max_seconds)
        if strategy not in STRATEGIES:
            msg = f"strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}"
            raise ValueError(msg)
        self._strategy = strategy
        for spec in children:
            if not isinstance(spec, ChildSpec):
                msg = f"children are ChildSpec values, got {spec!r}"
                raise TypeError(msg)
            self._add(spec)

    @classmethod
    def start(
        cls,
        children: Iterable[ChildSpec] = (),
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        name: str | None = None,
    ) -> Ref[Self]:
        """Start a top-level supervisor in the current system (at ``/<name>`` if named).

        Returns at once; the children start, in order, before the
        supervisor handles any message, so a call through its proxy sees
        them running. If one fails to start, the supervisor crashes (its
        ``ref.started()`` future fails with `StartError`).
        """
        kwargs: dict[str, Any] = {
            "children": list(children),
            "strategy": strategy,
            "max_restarts": max_restarts,
            "max_seconds": max_seconds,
        }
        if name is None:
            return super().start(**kwargs)
        return ActorSystem.current().spawn(cls, kwargs=kwargs, name=name)

    def on_start(self) -> Any:
        """Start every child in order; on a failure stop those started, in reverse, and fail."""
        return self._start_all()

    async def _start_all(self) -> None:
        started: list[_Child] = []
        for child in list(self._kids.values()):
            if child.spec.lazy:
                self._sleep(child, "dormant")
                continue
            try:
                await self._start(child)
            except StartError:
                for done in reversed(started):
                    await self._terminate(done)
                raise
            started.append(child)

    async def start_child(self, spec: ChildSpec) -> Ref[Any]:
        """Add a child spec and start it; if it fails to start, the spec is not kept.

        Raises:
            ChildExistsError: a child with that id is already present.
            StartError: the child failed to start.
        """
        child = self._add(spec)
        if spec.lazy:
            return self._sleep(child, "dormant")
        try:
            return await self._start(child)
        except BaseException:
            self._kids.pop(spec.id, None)
            raise

    async def terminate_child(self, child_id: str) -> None:
        """Stop a child (its spec stays, status ``stopped``, unless it is temporary)."""
        child = self._get(child_id)
        await self._terminate(child)
        if child.restart == "temporary":
            self._kids.pop(child_id, None)

    async def restart_child(self, child_id: str) -> Ref[Any]:
        """Start a stopped child again (a dormant or hibernated one: now, without a message).

        Raises:
            ChildRunningError: the child is running or restarting.
        """
        child = self._get(child_id)
        self._require_stopped(child, "restart")
        return await self._start(child)

    def delete_child(self, child_id: str) -> None:
        """Remove a stopped child's spec.

        Raises:
            ChildRunningError: the child is running or restarting.
        """
        child = self._get(child_id)
        self._require_stopped(child, "delete")
        self._forget_stub(child, f"{self.path} deleted it")
        del self._kids[child_id]
