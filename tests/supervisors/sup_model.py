"""A pure-Python model of OTP supervision, the oracle for the property tests.

It predicts, for a tree of supervisors and workers, what a crash or an
external stop of one worker does: which children restart (and so get a new
generation), which are removed, which supervisor gives up, and whether the
top escalates. Children that start on demand are modelled too: a lazy
worker is ``dormant`` until its first message, a hibernated child (worker
or supervisor) sleeps until its next one; either then starts afresh (a new
generation, its own lazy children dormant again), and neither is touched by
a restart of its siblings. Restart intensity is modelled with a frozen clock: every
restart falls within the window.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

_gens = itertools.count(1)


@dataclass(frozen=True)
class WorkerNode:
    id: str
    restart: str
    threaded: bool = False  # hosted on its own thread (ThreadActor) rather than the loop; same OTP rules
    lazy: bool = False  # started by its first message (ChildSpec.lazy)


@dataclass(frozen=True)
class SupNode:
    id: str
    restart: str
    strategy: str
    max_restarts: int
    children: tuple[WorkerNode | SupNode, ...]


@dataclass
class Inst:
    """A running (or stopped) instance of a node."""

    node: WorkerNode | SupNode
    gen: int = field(default_factory=lambda: next(_gens))
    status: str = "running"
    restarts: int = 0
    kids: dict[str, Inst] = field(default_factory=dict)  # ordered, supervisors only

    @classmethod
    def start(cls, node: WorkerNode | SupNode) -> Inst:
        inst = cls(node)
        if isinstance(node, SupNode):
            inst.kids = {c.id: cls.first(c) for c in node.children}
        return inst

    @classmethod
    def first(cls, node: WorkerNode | SupNode) -> Inst:
        """A child as its supervisor's start leaves it: running, or dormant if lazy."""
        if isinstance(node, WorkerNode) and node.lazy:
            return cls(node, status="dormant")
        return cls.start(node)

    @property
    def asleep(self) -> bool:
        return self.status in ("dormant", "hibernated")


class Model:
    def __init__(self, top: SupNode) -> None:
        self.top = Inst.start(top)
        self.escalated = False

    def paths(self) -> dict[str, tuple[str, int]]:
        """path -> (status, generation) of every child known to a live supervisor."""
        out: dict[str, tuple[str, int]] = {}

        def walk(inst: Inst, base: str) -> None:
            for cid, kid in inst.kids.items():
                path = f"{base}/{cid}"
                out[path] = (kid.status, kid.gen)
                if isinstance(kid.node, SupNode) and kid.status == "running":
                    walk(kid, path)

        if not self.escalated:
            walk(self.top, f"/{self.top.node.id}")
        return out

    def sleeping(self) -> list[str]:
        """Dormant and hibernated children, by path."""
        return sorted(p for p, (status, _) in self.paths().items() if status in ("dormant", "hibernated"))

    def running_children(self) -> list[str]:
        """Running children (workers and supervisors), by path."""
        return sorted(p for p, (status, _) in self.paths().items() if status == "running")

    def hibernate(self, path: str) -> None:
        """Its supervisor hibernated the running child at ``path``: its subtree is gone."""
        sup, cid = self._parent(path)
        sup.kids[cid] = Inst(sup.kids[cid].node, status="hibernated")

    def wake(self, path: str) -> None:
        """A message reached the sleeping child at ``path``: it starts afresh (not a restart)."""
        sup, cid = self._parent(path)
        sup.kids[cid] = Inst.start(sup.kids[cid].node)

    def running_workers(self) -> list[str]:
        return sorted(
            p
            for p, (status, _) in self.paths().items()
            if status == "running" and self._node(p).__class__ is WorkerNode
        )

    def _node(self, path: str) -> WorkerNode | SupNode:
        inst = self._inst(path)
        return inst.node

    def _inst(self, path: str) -> Inst:
        parts = path.strip("/").split("/")[1:]
        inst = self.top
        for part in parts:
            inst = inst.kids[part]
        return inst

    def _parent(self, path: str) -> tuple[Inst, str]:
        parent_path, _, cid = path.rpartition("/")
        return self._inst(parent_path), cid

    def exit(self, path: str, *, abnormal: bool) -> None:
        """A child at ``path`` ended (crash if abnormal, else an external stop)."""
        sup, cid = self._parent(path)
        self._child_exit(sup, cid, abnormal=abnormal, sup_path=path.rpartition("/")[0])

    def _child_exit(self, sup: Inst, cid: str, *, abnormal: bool, sup_path: str) -> None:
        child = sup.kids[cid]
        restart = child.node.restart
        if restart == "temporary":
            del sup.kids[cid]
            return
        if restart == "transient" and not abnormal:
            child.status = "stopped"
            return
        node = sup.node
        assert isinstance(node, SupNode)
        sup.restarts += 1
        if sup.restarts > node.max_restarts:
            self._give_up(sup, sup_path)
            return
        ids = list(sup.kids)
        if node.strategy == "one_for_all":
            group = ids
        elif node.strategy == "rest_for_one":
            group = ids[ids.index(cid) :]
        else:
            group = [cid]
        for gid in group:
            kid = sup.kids[gid]
            if gid != cid and kid.asleep:
                continue  # nothing of it runs: it stays as it is
            if gid != cid and kid.node.restart == "temporary":
                del sup.kids[gid]
                continue
            sup.kids[gid] = Inst.start(kid.node)

    def _give_up(self, sup: Inst, sup_path: str) -> None:
        if sup is self.top:
            self.escalated = True
            return
        parent_path, _, sid = sup_path.rpartition("/")
        parent = self._inst(parent_path)
        self._child_exit(parent, sid, abnormal=True, sup_path=parent_path)
