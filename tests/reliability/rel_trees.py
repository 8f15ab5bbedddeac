"""Random supervision trees whose workers are crashed by a seeded `FaultInjector`, checked against a model of OTP.

The tree, the OTP oracle (`sup_model.Model`) and the worker come from the
supervisor property tests (``tests/supervisors``); what is new here is where
the crashes come from. The workload pings workers one at a time; every ping
is a message the injector decides on (``crash``, ``delay`` or ``drop``, by
``nth`` or ``p``, up to ``count``), so the crashes follow the fault schedule
and its seed, never the test's choice. After each ping the run checks:

- ``fault_fired_iff_crashed``: a worker crashed exactly when a crash fault
  (one or more) fired on its ping: no crash from nowhere, no fire without
  effect;
- ``tree_shape``: the live tree is the model's (same children, statuses, and
  a new actor exactly where OTP restarts one);
- ``restart_limits``: the top escalates (ends with `RestartIntensityError`)
  exactly when the model's restart intensity says so, and is alive otherwise;
- ``replay``: the same tree, faults, seed and workload, run again in a fresh
  system, make the same decisions ping by ping (the injector's promise in
  ``docs/faults.md``, "Seeds and replay").
"""

from __future__ import annotations

import contextlib
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
from rel_chaos import InvariantCheck
from sup_model import Model, SupNode, WorkerNode
from sup_workers import FakeClock, Worker
from weald.runtime import ActorDeadError, ActorSystem, Ref
from weald.runtime.faults import ActorFault, FaultInjector
from weald.runtime.testing import WaitTimeout, wait_until
from weald.supervisors import ChildSpec, RestartIntensityError, Supervisor, SupervisorBase

TREE_INVARIANTS = ("fault_fired_iff_crashed", "tree_shape", "restart_limits", "replay")


@attrs.frozen
class Ping:
    """The message the workload sends; faults match it by name (``message = "Ping"``)."""

    n: int


@attrs.define
class TreeReport:
    """One tree run: the decisions ping by ping, faults fired, restarts, escalation, invariants."""

    trace: list[tuple[str, bool]] = attrs.field(factory=list)
    faults_by_kind: Counter[str] = attrs.field(factory=Counter)
    restarts: int = 0
    escalated: bool = False
    checks: list[InvariantCheck] = attrs.field(factory=list)

    @property
    def failures(self) -> list[InvariantCheck]:
        """The invariants that did not hold."""
        return [c for c in self.checks if not c.held]


def spec_of(node: WorkerNode | SupNode) -> ChildSpec:
    """The ChildSpec of a model node."""
    if isinstance(node, WorkerNode):
        return ChildSpec(node.id, Worker, restart=node.restart)  # type: ignore[arg-type]
    return ChildSpec(
        node.id,
        Supervisor,
        kwargs={
            "children": [spec_of(c) for c in node.children],
            "strategy": node.strategy,
            "max_restarts": node.max_restarts,
        },
        restart=node.restart,  # type: ignore[arg-type]
    )


def observe(ref: Ref[Any], base: str) -> dict[str, tuple[str, Any]]:
    """path -> (status, ref) of every child under a live supervisor, asked top-down."""
    out: dict[str, tuple[str, Any]] = {}
    try:
        infos = ref.proxy().which_children().get(timeout=5)
    except Exception:
        return out
    for info in infos:
        path = f"{base}/{info.id}"
        out[path] = (info.status, info.ref)
        if info.ref is not None and issubclass(info.ref.actor_class, SupervisorBase):
            out.update(observe(info.ref, path))
    return out


@contextlib.contextmanager
def frozen_supervisor_clock() -> Iterator[None]:
    """Every restart falls within the intensity window, as the model assumes."""
    saved = SupervisorBase.__dict__.get("_clock")
    SupervisorBase._clock = FakeClock()  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        if saved is None:
            del SupervisorBase._clock
        else:
            SupervisorBase._clock = saved  # type: ignore[method-assign]


class _TreeRun:
    def __init__(self, system: ActorSystem, tree: SupNode, faults: Sequence[ActorFault], seed: int) -> None:
        self.system = system
        self.tree = tree
        self.report = TreeReport()
        self.model = Model(tree)
        self.injector = FaultInjector(seed=seed)
        self.injector.install(system)
        for fault in faults:
            self.injector.inject(fault)
        self.top = Supervisor.start(
            [spec_of(c) for c in tree.children],
            strategy=tree.strategy,
            max_restarts=tree.max_restarts,  # type: ignore[arg-type]
        )
        self.base = self.top.path
        self.refs_by_gen: dict[int, Any] = {}
        self.seen_refs: set[int] = set()
        self.problems: dict[str, list[str]] = {name: [] for name in TREE_INVARIANTS}

    def real(self) -> dict[str, tuple[str, Any]]:
        return {p.replace(self.base, "/top", 1): v for p, v in observe(self.top, self.base).items()}

    def settled(self) -> bool:
        expected = self.model.paths()
        real = self.real()
        if {p: s for p, (s, _) in expected.items()} != {p: s for p, (s, _) in real.items()}:
            return False
        for path, (status, gen) in expected.items():
            if status != "running":
                continue
            ref = real[path][1]
            known = self.refs_by_gen.get(gen)
            if known is not None and known is not ref:
                return False  # the model kept this child; the system replaced it
            if known is None and id(ref) in self.seen_refs:
                return False  # the model restarted this child; the system did not (yet)
        return True

    def record(self) -> None:
        real = self.real()
        for path, (status, gen) in self.model.paths().items():
            if status == "running":
                self.refs_by_gen[gen] = real[path][1]
                self.seen_refs.add(id(real[path][1]))

    def wait_settled(self, what: str) -> bool:
        try:
            wait_until(self.settled, timeout=10, message=what)
        except WaitTimeout:
            live = {p: s for p, (s, _) in self.real().items()}
            self.problems["tree_shape"].append(f"after {what}: model {self.model.paths()} system {live}")
            return False
        self.record()
        return True

    def run(self, picks: Sequence[int]) -> TreeReport:
        try:
            if self.wait_settled("the start"):
                self._pings(picks)
        finally:
            if self.top.is_alive():
                self.top.stop(timeout=10)
            self.injector.uninstall()
        stats = self.injector.statistics()
        self.report.faults_by_kind.update(stats.fires_by_kind)
        for name in TREE_INVARIANTS[:-1]:
            self.report.checks.append(InvariantCheck(name, not self.problems[name], "; ".join(self.problems[name][:3])))
        return self.report

    def _pings(self, picks: Sequence[int]) -> None:
        for n, pick in enumerate(picks):
            workers = self.model.running_workers()
            if not workers:
                return
            path = workers[pick % len(workers)]
            target = self.real()[path][1]
            fired_before = self.injector.statistics().fires_by_kind.get("actor.crash", 0)
            target.tell(Ping(n))
            try:
                target.ask("sync", timeout=10)
                crashed = False
            except ActorDeadError:
                crashed = True
            fired = self.injector.statistics().fires_by_kind.get("actor.crash", 0) - fired_before
            # Faults decide on their own; several may fire on one ping, and it crashes once.
            if (fired > 0) != crashed:
                self.problems["fault_fired_iff_crashed"].append(f"ping {n} of {path}: {fired} fired, crashed={crashed}")
            self.report.trace.append((path, crashed))
            if not crashed:
                continue
            target.exited().get(timeout=10)
            self.model.exit(path, abnormal=True)
            self.report.restarts = sum(1 for _, c in self.report.trace if c)
            if self.model.escalated:
                self.report.escalated = True
                self._check_escalated()
                return
            if not self.top.is_alive():
                self.problems["restart_limits"].append(f"the top ended after the crash of {path}; OTP would restart")
                return
            if not self.wait_settled(f"the crash of {path} (ping {n})"):
                return

    def _check_escalated(self) -> None:
        try:
            exit_ = self.top.exited().get(timeout=10)
        except Exception as exc:
            self.problems["restart_limits"].append(f"the model escalates; the top did not end ({exc!r})")
            return
        if exit_.kind != "crashed" or not isinstance(exit_.error, RestartIntensityError):
            self.problems["restart_limits"].append(f"the top ended with {exit_!r}, not RestartIntensityError")
        if self.system.registered(self.base + "/"):
            self.problems["restart_limits"].append(f"left behind: {self.system.registered(self.base + '/')}")


def run_tree_chaos(tree: SupNode, faults: Sequence[ActorFault], seed: int, picks: Sequence[int]) -> TreeReport:
    """Run the workload twice in fresh systems; the first report, with the replay check added."""
    reports = []
    with frozen_supervisor_clock(), tempfile.TemporaryDirectory(prefix="weald-trees-") as tmp:
        for attempt in range(2):
            with ActorSystem(store_path=Path(tmp) / f"store{attempt}.db") as system:
                reports.append(_TreeRun(system, tree, faults, seed).run(picks))
    first, second = reports
    same = first.trace == second.trace
    detail = "" if same else f"first {first.trace} second {second.trace}"
    first.checks.append(InvariantCheck("replay", same, detail))
    return first
