"""One no-op tool call through the ToolRunner, beside calling the tool directly.

A session's `ToolRunner` runs each call of a `RunTools` batch in its own
temporary `ToolExecution` child (under the runner's ``calls``
DynamicSupervisor), handing it a `ToolContext` with the agent's snapshot,
and sends one `ToolResults` back. Measured here, all on the system's loop
(the caller is a task on the loop, as the agent is an actor there; results
arrive as a message to a stand-in agent actor):

- ``one call``: a batch of one no-op call, from sending ``RunTools`` until the
  stand-in agent actor handles the ``ToolResults``, each started on an idle
  loop (median; target <= 150 us); also back to back, where each call also
  pays for the tail of the one before (its child's exit reaching the
  supervisor, which follows the result);
- throughput: sequential batches of 1, 10 (an agent turn's shape) and 100
  no-op calls, in calls per second (target >= 5,000/s, for batches of 10);
- the same no-op tool called directly (``await tool.fn(ctx)``) and through
  `weald.tools.invoke` (schema validation included), and the ratios of the
  runner path to both;
- for scale, a synchronous no-op, which ``invoke`` runs in a worker thread.

The no-op tool is ``async def noop(ctx) -> "ok"`` with an empty object schema.

Run: ``python benchmarks/bench_tools.py [--quick]``
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
import trio.testing
from weald.runtime import Actor, ActorSystem, Future
from weald.runtime.agents.tool_runner import RunTools, ToolCallRequest, ToolResults, ToolRunner
from weald.tools import ToolContext, ToolRegistry, invoke, tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, quick_main, summary, verdict

REG = ToolRegistry()
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}


@tool(name="noop", description="does nothing", parameters=EMPTY, registry=REG)
async def noop(ctx: ToolContext) -> str:  # noqa: ARG001 - the tool signature
    return "ok"


@tool(name="noop_sync", description="does nothing, in a worker thread", parameters=EMPTY, registry=REG)
def noop_sync(ctx: ToolContext) -> str:  # noqa: ARG001 - the tool signature
    return "ok"


class StandIn(Actor):
    """Stands in for the agent: notes when the runner's ToolResults arrive and completes the caller's future."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: Future[ToolResults] | None = None
        self.received_at = 0.0

    def on_receive(self, message: Any) -> None:
        if isinstance(message, ToolResults) and self.waiting is not None:
            # A call ends when its results reach the agent, not when the
            # benchmark's waiting task is next scheduled.
            self.received_at = time.perf_counter()
            future, self.waiting = self.waiting, None
            future.set(message)


class Caller:
    """Sends batches to the runner from a task on the loop and waits for each reply."""

    def __init__(self, runner: Any, stand_in: StandIn) -> None:
        self.runner = runner
        self.stand_in = stand_in
        self.ids = itertools.count()
        self.snapshot = {"agent": "bench", "messages": ()}

    async def batch(self, calls: tuple[ToolCallRequest, ...]) -> ToolResults:
        future: Future[ToolResults] = Future()
        self.stand_in.waiting = future
        self.runner.tell(RunTools(f"b{next(self.ids)}", calls, self.snapshot, self.stand_in.actor_ref))
        return await future

    async def samples(self, name: str, size: int, n: int, *, settle: bool = False) -> list[float]:
        """Time ``n`` batches of ``size`` calls to ``name``; microseconds each.

        With ``settle``, each batch starts on an idle loop: the previous
        call's tail (its child's exit reaching the supervisor) is done first.
        """
        calls = tuple(ToolCallRequest(f"call_{i}", name, {}) for i in range(size))
        perf = time.perf_counter
        out = []
        for _ in range(n):
            if settle:
                await trio.testing.wait_all_tasks_blocked()
            began = perf()
            results = await self.batch(calls)
            out.append((self.stand_in.received_at - began) * 1e6)
            assert all(o.result.ok for o in results.outcomes), results
        return out


async def direct_samples(ctx: ToolContext, n: int, *, via_invoke: bool, target: Any = noop) -> list[float]:
    perf = time.perf_counter
    out = []
    fn = target.fn
    for _ in range(n):
        began = perf()
        if via_invoke:
            await invoke(target, ctx, {})
        else:
            await fn(ctx)
        out.append((perf() - began) * 1e6)
    return out


def measure(quick: bool) -> dict[str, float]:
    n = 500 if quick else 2000
    rounds = 3 if quick else 5
    res: dict[str, list[float]] = {
        k: [] for k in ("one", "one_b2b", "b10", "b100", "direct", "invoke", "sync_one", "sync_invoke", "sync_direct")
    }
    with (
        tempfile.TemporaryDirectory(prefix="weald-bench-tools-") as tmp,
        ActorSystem(store_path=Path(tmp) / "s.db") as system,
    ):
        runner = system.spawn(ToolRunner, args=("bench", tmp), kwargs={"registry": REG}, name="runner")
        stand_in_ref = system.spawn(StandIn, name="agent")
        runner.started().get(timeout=10)
        stand_in_ref.started().get(timeout=10)
        stand_in = stand_in_ref._actor_weakref()
        assert stand_in is not None
        caller = Caller(runner, stand_in)
        ctx = ToolContext(working_dir=tmp)
        token = system.loop.token

        def on_loop(afn: Any, *args: Any, **kwargs: Any) -> Any:
            async def go() -> Any:
                return await afn(*args, **kwargs)

            return trio.from_thread.run(go, trio_token=token)

        on_loop(caller.samples, "noop", 1, 200)  # warm up
        for _ in range(rounds):
            res["one"] += on_loop(caller.samples, "noop", 1, n, settle=True)
            res["one_b2b"] += on_loop(caller.samples, "noop", 1, n)
            res["b10"] += on_loop(caller.samples, "noop", 10, n // 10)
            res["b100"] += on_loop(caller.samples, "noop", 100, max(n // 100, 3))
            res["direct"] += on_loop(direct_samples, ctx, n, via_invoke=False)
            res["invoke"] += on_loop(direct_samples, ctx, n, via_invoke=True)
            res["sync_one"] += on_loop(caller.samples, "noop_sync", 1, n // 4)
            res["sync_invoke"] += on_loop(direct_samples, ctx, n // 4, via_invoke=True, target=noop_sync)
            res["sync_direct"] += _sync_direct(ctx, n // 4)
    return {k: statistics.median(v) for k, v in res.items()}


def _sync_direct(ctx: ToolContext, n: int) -> list[float]:
    perf = time.perf_counter
    out = []
    fn = noop_sync.fn
    for _ in range(n):
        began = perf()
        fn(ctx)
        out.append((perf() - began) * 1e6)
    return out


def run(quick: bool = False) -> list[Row]:
    banner("bench_tools: a no-op tool call through the ToolRunner (spawn, run, result back)")
    m = measure(quick)
    one, direct, inv = m["one"], m["direct"], m["invoke"]
    rate1 = 1e6 / m["one_b2b"]
    rate10 = 10 * 1e6 / m["b10"]
    rate100 = 100 * 1e6 / m["b100"]
    print(f"\n{'async no-op':<44}{'median':>12}{'vs direct':>12}{'vs invoke':>12}")
    for label, value in (
        ("called directly: await tool.fn(ctx)", direct),
        ("invoke(tool, ctx, {})", inv),
        ("through the ToolRunner, batch of 1", one),
        ("  same, back to back (no idle between)", m["one_b2b"]),
        ("through the ToolRunner, per call in 10", m["b10"] / 10),
        ("through the ToolRunner, per call in 100", m["b100"] / 100),
    ):
        print(f"{label:<44}{value:>9.2f} us{value / direct:>11.0f}x{value / inv:>11.1f}x")
    print(
        f"\nthroughput through one runner: {rate1:,.0f}/s (batches of 1), "
        f"{rate10:,.0f}/s (of 10), {rate100:,.0f}/s (of 100)"
    )
    print(
        f"sync no-op (worker thread): direct {m['sync_direct']:.1f} us, invoke {m['sync_invoke']:.1f} us, "
        f"through the runner {m['sync_one']:.1f} us"
    )
    rows = [
        Row(
            "tools",
            "no-op call through the runner",
            one,
            "us",
            "<= 150 us",
            verdict(one, "<=", 150),
            f"= {one / inv:.0f}x invoke(), {one / direct:.0f}x direct",
        ),
        Row(
            "tools",
            "no-op calls/s (batches of 10)",
            rate10,
            "/s",
            ">= 5,000/s",
            verdict(rate10, ">=", 5000),
            f"batches of 1: {rate1:,.0f}/s, of 100: {rate100:,.0f}/s",
        ),
        Row("tools", "invoke() of the no-op", inv, "us", note=f"= {inv / direct:.0f}x direct"),
        Row("tools", "no-op called directly", direct, "us"),
    ]
    return summary(rows)


def main() -> None:
    quick_main(run, __doc__)


if __name__ == "__main__":
    main()
