"""What stops a turn with 10 no-op tool calls from costing less: its floors, side by side.

Measured in one process, every thread on one CPU (``pin("one")``), each
figure the median of three runs' medians:

- the loop's own floors, per 10: trio checkpoints; trio tasks spawned and
  joined; loop actors started and ended (``spawn_child``, each ending as soon
  as it started, awaited with ``exited()``); temporary children started with
  ``DynamicSupervisor.start_children`` and awaited the same way;
- a batch of 10 no-op calls through a real `ToolRunner` (``RunTools`` ->
  ``ToolResults``), in the loop thread's CPU time (the batch runs on it alone);
- the turn of bench_agent.py (a real session, a scripted model: 10 no-op
  calls, then the answer) in three variants, sessions alternating between
  them so load hits all alike: the real store; flushes answered at once (the
  writes still committed, unwaited); no store at all (writes dropped too);
- the cyclic garbage collector's time per turn, with the default thresholds
  and with a first-generation threshold of 20,000, sessions alternating.

Run: ``python benchmarks/bench_turn_floor.py [--quick]``
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from weald.runtime import Actor, ActorSystem, Exit, Future, Store
from weald.runtime._actor import NORMAL
from weald.runtime.agents.tool_runner import RunTools, ToolCallRequest, ToolResults, ToolRunner
from weald.supervisors import ChildSpec, DynamicSupervisor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import banner, load_note, pin
from bench_agent import REG, TURNS_PER_SESSION, start_session


class Quick(Actor):
    """Ends as soon as it has started (the receive loop returns at once)."""

    async def _loop_serve(self) -> Exit:
        return NORMAL

    def on_receive(self, message: Any) -> None:
        pass


class Collector(Actor):
    """Completes the future it was handed when the runner's `ToolResults` arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: Future[Any] | None = None

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Future):
            self.waiting = message
        elif isinstance(message, ToolResults):
            assert self.waiting is not None
            assert all(o.result.ok for o in message.outcomes), message
            self.waiting.set(message)


class Driver(Actor):
    def on_receive(self, message: Any) -> None:
        pass

    async def checkpoints(self, n: int) -> float:
        out = []
        for _ in range(n):
            began = time.perf_counter()
            for _ in range(10):
                await trio.lowlevel.checkpoint()
            out.append((time.perf_counter() - began) * 1e6)
        return statistics.median(out)

    async def tasks(self, n: int) -> float:
        async def nothing() -> None:
            pass

        out = []
        for _ in range(n):
            began = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(nothing)
            out.append((time.perf_counter() - began) * 1e6)
        return statistics.median(out)

    async def actors(self, n: int) -> float:
        out = []
        for i in range(n):
            began = time.perf_counter()
            refs = [self.spawn_child(Quick, name=f"q{i}-{j}") for j in range(10)]
            for ref in refs:
                await ref.exited()
            out.append((time.perf_counter() - began) * 1e6)
        return statistics.median(out)

    async def supervised(self, sup: Any, n: int) -> float:
        proxy = sup.proxy()
        out = []
        for i in range(n):
            began = time.perf_counter()
            specs = [ChildSpec(f"c{i}-{j}", Quick, restart="temporary", progress=False) for j in range(10)]
            for ref in await proxy.start_children(specs):
                await ref.exited()
            out.append((time.perf_counter() - began) * 1e6)
        return statistics.median(out)

    async def batches(self, runner: Any, collector: Any, n: int) -> float:
        calls = tuple(ToolCallRequest(f"c{i}", "noop", {}) for i in range(10))
        out = []
        for i in range(n):
            began = time.thread_time()
            done: Future[Any] = Future()
            collector.tell(done)
            runner.tell(RunTools(f"b{i}", calls, None, collector, agent_id="a", agent_path="/a"))
            await done
            out.append((time.thread_time() - began) * 1e6)
        return statistics.median(out)


def floors(system: ActorSystem, tmp: str, n: int) -> None:
    driver = system.spawn(Driver, name="driver")
    sup = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 1_000_000}, name="calls")
    runner = system.spawn(ToolRunner, args=("s", tmp), kwargs={"registry": REG}, name="runner")
    collector = system.spawn(Collector, name="collector")
    proxy = driver.proxy()
    rows = [
        ("10 trio checkpoints", proxy.checkpoints),
        ("10 trio tasks spawned and joined", proxy.tasks),
        ("10 loop actors started and ended", proxy.actors),
        ("10 temporary children via start_children", lambda k: proxy.supervised(sup, k)),
        ("10 no-op calls through a ToolRunner (loop CPU)", lambda k: proxy.batches(runner, collector, k)),
    ]
    print("floors, per 10 (medians of 3 runs' medians):")
    for name, fn in rows:
        fn(n // 5).get()
        runs = [fn(n).get() for _ in range(3)]
        print(f"  {name:<50} {statistics.median(runs):8.1f} us  {[round(r) for r in runs]}")


def turns(system: ActorSystem, tmp: str, sessions_n: int) -> None:
    real_flush, real_enqueue = Store.flush, Store.enqueue_nowait

    def instant_flush(self: Store, session: str | None = None) -> Future[None]:  # noqa: ARG001 - Store.flush's
        done: Future[None] = Future()
        done.set(None)
        return done

    def dropped(self: Store, *args: Any, **kwargs: Any) -> None:  # noqa: ARG001 - a Store method's signature
        return None

    variants: dict[str, tuple[Any, Any, tuple[int, int, int] | None]] = {
        "the real store": (real_flush, real_enqueue, None),
        "flushes answered at once": (instant_flush, real_enqueue, None),
        "no store (writes dropped too)": (instant_flush, dropped, None),
        "the real store, gc gen0 threshold 20,000": (real_flush, real_enqueue, (20_000, 10, 10)),
    }
    got: dict[str, list[float]] = {name: [] for name in variants}
    collecting: dict[str, list[float]] = {name: [] for name in variants}
    gc_time = [0.0, 0.0]

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            gc_time[1] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_time[1]

    gc.callbacks.append(on_gc)
    sessions = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 50}, name="sessions")
    token = system.loop.token

    async def run(agent: Any, n: int, name: str | None) -> None:
        proxy = agent.proxy()
        for _ in range(n):
            spent, began = gc_time[0], time.perf_counter()
            result = await (await proxy.prompt("go"))
            assert result.ok, result
            if name is not None:
                got[name].append((time.perf_counter() - began) * 1e6)
                collecting[name].append((gc_time[0] - spent) * 1e6)

    names = list(variants)
    default_threshold = gc.get_threshold()
    try:
        for i in range(sessions_n):
            name = names[i % len(names)]
            sid = f"s{i}"
            agent = start_session(system, sessions, tmp, sid)
            trio.from_thread.run(run, agent, 1, None, trio_token=token)
            flush, enqueue, threshold = variants[name]
            Store.flush, Store.enqueue_nowait = flush, enqueue  # type: ignore[method-assign]
            if threshold is not None:
                gc.set_threshold(*threshold)
            try:
                trio.from_thread.run(run, agent, TURNS_PER_SESSION - 1, name, trio_token=token)
            finally:
                Store.flush, Store.enqueue_nowait = real_flush, real_enqueue  # type: ignore[method-assign]
                gc.set_threshold(*default_threshold)
            sessions.proxy().terminate_child(system.whereis(f"/sessions/{sid}")).get(timeout=10)
    finally:
        gc.callbacks.remove(on_gc)
    base = statistics.median(got[names[0]])
    print("\nthe turn (10 no-op calls), sessions alternating between the variants:")
    print(f"  {'':<44}{'median':>10}{'ratio':>8}{'gc mean':>10}")
    for name in names:
        median = statistics.median(got[name])
        gc_mean = statistics.mean(collecting[name])
        print(f"  {name:<44}{median:>8.0f} us{median / base:>7.2f}x{gc_mean:>7.0f} us   (n={len(got[name])})")


def main() -> None:
    quick = "--quick" in sys.argv
    banner("bench_turn_floor: the floors under a turn with 10 no-op tool calls (every thread on CPU 0)")
    with (
        tempfile.TemporaryDirectory(prefix="weald-bench-floor-") as tmp,
        ActorSystem(store_path=Path(tmp) / "store.db") as system,
    ):
        pin("one")
        floors(system, tmp, 200 if quick else 1000)
        turns(system, tmp, 12 if quick else 40)
    pin(None)
    print(load_note())


if __name__ == "__main__":
    main()
