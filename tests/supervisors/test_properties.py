"""Property tests: random trees, random crashes, compared with a model of OTP at every step."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sup_model import Model, SupNode, WorkerNode
from sup_strategies import operations, trees
from sup_workers import FakeClock, ThreadWorker, Worker
from weald.runtime import ActorSystem, Ref, Stub
from weald.runtime.testing import WaitTimeout, wait_until
from weald.supervisors import ChildSpec, RestartIntensityError, Supervisor, SupervisorBase


def spec_of(node: WorkerNode | SupNode, path: str = "", rebuilt: Counter[str] | None = None) -> ChildSpec:
    """The spec of ``node``; with ``rebuilt``, one that can be made again (counted there, by path)."""
    path = f"{path}/{node.id}"
    rebuild = None
    if rebuilt is not None:

        def rebuild() -> ChildSpec:
            rebuilt[path] += 1
            return spec_of(node, path.rpartition("/")[0], rebuilt)

    if isinstance(node, WorkerNode):
        return ChildSpec(
            node.id,
            ThreadWorker if node.threaded else Worker,
            restart=node.restart,  # type: ignore[arg-type]
            lazy=node.lazy,
            rebuild=rebuild,
        )
    return ChildSpec(
        node.id,
        Supervisor,
        kwargs={
            "children": [spec_of(c, path, rebuilt) for c in node.children],
            "strategy": node.strategy,
            "max_restarts": node.max_restarts,
        },
        restart=node.restart,  # type: ignore[arg-type]
        rebuild=rebuild,
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
        # Only running supervisors are asked: a question to a stub would wake it.
        if info.status == "running" and issubclass(info.ref.actor_class, SupervisorBase):
            out.update(observe(info.ref, path))
    return out


def check_counts(ref: Ref[Any]) -> None:
    """Each running supervisor's constant-time statistics() agree with its children, as which_children lists them."""
    infos = ref.proxy().which_children().get(timeout=5)
    stats = ref.proxy().statistics().get(timeout=5)
    asleep = sum(1 for info in infos if info.status in ("dormant", "hibernated"))
    assert (stats.children, stats.asleep) == (len(infos), asleep), (ref.path, stats, [i.status for i in infos])
    awake = ref.proxy().awake_children().get(timeout=5)
    assert sorted(awake) == sorted(i.id for i in infos if i.status not in ("dormant", "hibernated"))
    for info in infos:
        if info.status == "running" and issubclass(info.ref.actor_class, SupervisorBase):
            check_counts(info.ref)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tree=trees(), ops=operations, rebuilds=st.booleans())
def test_random_trees_return_to_their_spec_shape_or_escalate_exactly_as_otp_would(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch, tree: SupNode, ops: list[tuple[str, int]], rebuilds: bool
) -> None:
    """With ``rebuilds``, every spec has a ``rebuild``: a sleeping child keeps none, and wakes from a new one."""
    monkeypatch.setattr(SupervisorBase, "_clock", FakeClock())  # every restart within the window
    model = Model(tree)
    rebuilt: Counter[str] | None = Counter() if rebuilds else None
    top = Supervisor.start(
        [spec_of(c, "/top", rebuilt) for c in tree.children],
        strategy=tree.strategy,
        max_restarts=tree.max_restarts,  # type: ignore[arg-type]
    )
    base = top.path
    try:
        refs_by_gen: dict[int, Any] = {}
        seen_refs: set[int] = set()

        def settled() -> bool:
            expected = model.paths()
            real = observe(top, base)
            real = {p.replace(base, "/top", 1): v for p, v in real.items()}
            if {p: s for p, (s, _) in expected.items()} != {p: s for p, (s, _) in real.items()}:
                return False
            for path, (status, gen) in expected.items():
                ref = real[path][1]
                if status != "running":
                    continue
                known = refs_by_gen.get(gen)
                if known is not None and known is not ref:
                    return False  # the model kept this child; the system replaced it
                if known is None and id(ref) in seen_refs:
                    return False  # the model restarted this child; the system did not (yet)
            return True

        def record() -> None:
            check_counts(top)
            real = {p.replace(base, "/top", 1): v for p, v in observe(top, base).items()}
            for path, (status, gen) in model.paths().items():
                if status == "running":
                    refs_by_gen[gen] = real[path][1]
                    seen_refs.add(id(real[path][1]))

        wait_until(settled, timeout=10, message="the initial tree")
        record()
        for kind, pick in ops:
            real = {p.replace(base, "/top", 1): v for p, v in observe(top, base).items()}
            if kind in ("hibernate", "wake"):
                choices = model.running_children() if kind == "hibernate" else model.sleeping()
                if not choices:
                    continue
                path = choices[pick % len(choices)]
                if kind == "hibernate":
                    parent = top if path.count("/") == 2 else real[path.rpartition("/")[0]][1]
                    assert parent.proxy().hibernate_child(path.rpartition("/")[2]).get(timeout=10) is True
                    model.hibernate(path)
                else:
                    stub = real[path][1]
                    assert isinstance(stub, Stub)
                    before = rebuilt[path] if rebuilt is not None else 0
                    stub.tell("wake up")  # any message: workers echo it, supervisors ignore it
                    model.wake(path)
                event(kind)
                wait_until(settled, timeout=10, message=f"the tree after {kind} of {path}")
                if kind == "wake" and rebuilt is not None:
                    assert rebuilt[path] == before + 1, f"{path} woke without its spec made again"
                record()
                continue
            workers = model.running_workers()
            if not workers:
                break
            path = workers[pick % len(workers)]
            target = real[path][1]
            if kind == "crash":
                target.tell("crash")
            else:
                target.stop(block=False)
            target.exited().get(timeout=5)
            model.exit(path, abnormal=kind == "crash")
            if model.escalated:
                exit_ = top.exited().get(timeout=10)
                assert exit_.kind == "crashed"
                assert isinstance(exit_.error, RestartIntensityError)
                assert system.registered(base + "/") == []
                return
            try:
                wait_until(settled, timeout=10, message=f"the tree after {kind} of {path}")
            except WaitTimeout:
                pytest.fail(
                    f"after {kind} of {path}: model {model.paths()} "
                    f"system { {p: s for p, (s, _) in observe(top, base).items()} }"
                )
            record()
        assert top.is_alive()
    finally:
        if top.is_alive():
            top.stop(timeout=10)
