"""What context management costs: a long session's steps with and without it, and its operations alone.

Session: one agent in a real session (``session_spec``: tool runner,
sub-agents supervisor, agent) runs one turn of ``--steps`` model steps
(default 300), each calling a tool whose output is 3,600 characters, with a
scripted model. Side by side, in alternating rounds:

- *managed*: the model's window is 6,000 tokens, so the agent prunes old
  tool outputs and compacts (the scripted model answers the summary request
  at once: what is timed is weald's side of a compaction);
- *unmanaged*: a window of 100 million tokens, so the same accounting runs
  but never prunes or compacts. (Its requests grow with the session, which
  costs the scripted model time linear in the history: that is the model's
  cost, not weald's.)

Printed: time per step, the prunes and compactions, the time from
``agent.compacting`` to ``agent.compacted`` (building the transcript,
the model call, writing the summary, rebuilding the context), and the
largest context each kept in memory.

Alone, on a context of 200 messages: the estimate before a model call,
one prune, and planning plus building a compaction request.

Churn (``--churn``): a long session with large outputs, the case that made
an agent compact at almost every step. One turn of ``--steps`` steps, each
calling a tool whose output is 6 KB, under a 4,000-token window (500 kept
for the answer) with the last 3 steps' outputs protected: three outputs
alone exceed the budget. Printed: compactions per 100 steps, the model calls
spent on compaction (summary requests the model answered), prunes per 100
steps, the largest request and time per step. ``--before REF`` runs the same
session with that commit's code in a worker process, side by side with this
checkout's (rounds alternating), and prints both with the ratios.

Run: ``python benchmarks/bench_context.py [--steps 300] [--rounds 3]``, or
``python benchmarks/bench_context.py --churn [--steps 300] [--rounds 3] [--before REF]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from weald.runtime import ActorSystem
from weald.runtime.agents.agent import AgentConfig
from weald.runtime.agents.context import Context, ContextConfig
from weald.runtime.agents.session import SessionConfig, agent_path, session_spec
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.llm import (
    Message,
    ModelLimits,
    ModelRequest,
    ProviderSettings,
    ScriptedProvider,
    StreamEvent,
    ToolCall,
    ToolSpec,
    Usage,
)
from weald.runtime.testing import wait_until
from weald.supervisors import DynamicSupervisor
from weald.tools import ToolContext, ToolRegistry, tool

REG = ToolRegistry()
OUTPUT = "line of tool output, 36 characters\n" * 100  # 3,600 characters


@tool(name="big", description="returns 3,600 characters", parameters={"type": "object", "properties": {}}, registry=REG)
async def big(ctx: ToolContext) -> str:  # noqa: ARG001 - the tool signature
    return OUTPUT


LARGE = "a line of a large tool output, 40 chars\n" * 150  # 6,000 characters


@tool(
    name="large", description="returns 6,000 characters", parameters={"type": "object", "properties": {}}, registry=REG
)
async def large(ctx: ToolContext) -> str:  # noqa: ARG001 - the tool signature
    return LARGE


class Counting:
    """A scripted model that counts the requests it answers, by purpose (``turn`` or ``compaction``)."""

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.settings = inner.settings
        self.model = "scripted:bench"
        self.answered: dict[str, int] = {}
        self.largest = 0

    @property
    def position(self) -> int:
        return self.inner.position

    def seek(self, position: int) -> None:
        self.inner.seek(position)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        async for event in self.inner.stream(request):
            usage = getattr(event, "usage", None)
            if usage is not None:
                self.answered[request.purpose] = self.answered.get(request.purpose, 0) + 1
                if request.purpose == "turn":
                    self.largest = max(self.largest, usage.input_tokens)
            yield event

    async def aclose(self) -> None:
        await self.inner.aclose()


def churn_run(steps: int, root: Path) -> dict[str, Any]:
    """One turn of ``steps`` steps of 6 KB outputs under a 4,000-token window, keeping 3 steps' outputs."""
    turns: list[dict[str, Any]] = [{"text": "step", "tool_calls": [{"name": "large", "arguments": {}}]}] * steps
    script = {"turns": [*turns, {"text": "done"}], "summary": "They ran the large tool, step after step."}
    settings = ProviderSettings(context_window=4_000, output_reserve=500)
    models: list[Counting] = []

    def factory(_model: str) -> Counting:
        models.append(Counting(ScriptedProvider.from_dict(script, settings=settings)))
        return models[-1]

    with ActorSystem(store_path=root / f"churn-{time.monotonic_ns()}.db") as system:
        sessions = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 5}, name="sessions")
        agent_config = AgentConfig(
            model="scripted:bench", max_steps=steps + 10, context=ContextConfig(keep_tool_results=3)
        )
        config = SessionConfig("s1", str(root), agent_config, RunnerConfig())
        spec = session_spec(config, system=system, registry=REG, provider_factory=factory)
        sessions.proxy().start_child(spec).get(timeout=30)
        agent = wait_until(lambda: system.whereis(agent_path("s1")))
        events = system.events.subscribe(["agent.compacting", "agent.pruned"], max_buffer=100_000)
        began = time.perf_counter()
        result = agent.proxy().prompt("go").get(timeout=30).get(timeout=1200)
        elapsed = time.perf_counter() - began
        seen = events.drain_nowait()
        events.close()
    model = models[0]
    done = result.steps
    return {
        "ok": bool(result.ok),
        "error": result.error,
        "steps": done,
        "compactions_per_100": sum(1 for e in seen if e.topic == "agent.compacting") * 100 / max(1, done),
        "compaction_calls": model.answered.get("compaction", 0),
        "prunes_per_100": sum(1 for e in seen if e.topic == "agent.pruned") * 100 / max(1, done),
        "largest_request": model.largest,
        "per_step_ms": elapsed / max(1, done) * 1e3,
    }


_CHURN_ROWS = (
    ("compactions per 100 steps", "compactions_per_100", "{:.1f}"),
    ("model calls spent on compaction", "compaction_calls", "{:.0f}"),
    ("prunes per 100 steps", "prunes_per_100", "{:.1f}"),
    ("largest request (tokens; budget 3,500)", "largest_request", "{:,.0f}"),
    ("time per step (ms)", "per_step_ms", "{:.2f}"),
)


def _churn_worker(steps: int, pythonpath: Path | None) -> dict[str, Any]:
    """`churn_run` in a fresh process, with ``pythonpath`` first (another commit's weald) if given."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    argv = [sys.executable, __file__, "--churn-worker", "--steps", str(steps)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise RuntimeError(f"the churn worker failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def churn(steps: int, rounds: int, before: str | None, console: Console) -> None:
    """The churn session, with this checkout and (``before``) another commit, rounds alternating."""
    from _bench import checkout

    console.print(f"load: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    baseline = checkout(before, "bench-context-before-") if before is not None else None
    contenders: dict[str, Path | None] = {"after (this checkout)": None}
    if baseline is not None:
        contenders = {f"before ({before})": baseline / "pkg", **contenders}
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    try:
        for i in range(rounds):
            order = list(contenders.items()) if i % 2 == 0 else list(reversed(contenders.items()))
            for name, path in order:
                got[name].append(_churn_worker(steps, path))
    finally:
        if baseline is not None:
            shutil.rmtree(baseline, ignore_errors=True)
    title = f"churn: one turn of {steps} steps, 6 KB outputs, window 4,000, keep_tool_results 3 (median of {rounds})"
    table = Table(title=title)
    table.add_column("")
    for name in contenders:
        table.add_column(name, justify="right")
    if baseline is not None:
        table.add_column("after / before", justify="right")
    for label, key, fmt in _CHURN_ROWS:
        values = [statistics.median(r[key] for r in got[name]) for name in contenders]
        cells = [fmt.format(v) for v in values]
        if baseline is not None:
            cells.append(f"{values[1] / values[0]:.2f}x" if values[0] else "-")
        table.add_row(label, *cells)
    ended = ", ".join(
        f"{name}: {sum(r['ok'] for r in runs)}/{len(runs)} turns ok, {statistics.median(r['steps'] for r in runs):.0f}"
        " steps"
        for name, runs in got.items()
    )
    console.print(table)
    console.print(ended)
    console.print(f"load: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def session_run(steps: int, window: int, root: Path) -> dict[str, Any]:
    turns: list[dict[str, Any]] = [{"text": "step", "tool_calls": [{"name": "big", "arguments": {}}]}] * steps
    script = {"turns": [*turns, {"text": "done"}]}
    settings = ProviderSettings(context_window=window, output_reserve=1_000)
    with ActorSystem(store_path=root / f"store-{window}-{time.monotonic_ns()}.db") as system:
        sessions = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 5}, name="sessions")
        config = SessionConfig(
            "s1", str(root), AgentConfig(model="scripted:bench", max_steps=steps + 10), RunnerConfig()
        )
        spec = session_spec(
            config,
            system=system,
            registry=REG,
            provider_factory=lambda _model: ScriptedProvider.from_dict(script, settings=settings),
        )
        sessions.proxy().start_child(spec).get(timeout=30)
        agent = wait_until(lambda: system.whereis(agent_path("s1")))
        events = system.events.subscribe(["agent.compacting", "agent.compacted", "agent.pruned"], max_buffer=100_000)
        began = time.perf_counter()
        result = agent.proxy().prompt("go").get(timeout=30).get(timeout=600)
        elapsed = time.perf_counter() - began
        assert result.ok, result.error
        seen = events.drain_nowait()
        events.close()
        compacting = [e.time for e in seen if e.topic == "agent.compacting"]
        compacted = [e.time for e in seen if e.topic == "agent.compacted"]
        snapshot = agent.proxy().snapshot(0).get()
    return {
        "per_step_ms": elapsed / (steps + 1) * 1e3,
        "prunes": sum(1 for e in seen if e.topic == "agent.pruned"),
        "compactions": len(compacted),
        "compaction_ms": [(b - a) * 1e3 for a, b in zip(compacting, compacted, strict=False)],
        "context_messages": snapshot.context.messages,
        "context_tokens": snapshot.context.tokens,
    }


def operations(samples: int) -> dict[str, float]:
    """The context's own operations on 200 messages, in microseconds (median)."""
    tools = [ToolSpec(f"tool{i}", "a tool " * 20, {"type": "object", "properties": {}}) for i in range(15)]

    def filled() -> Context:
        context = Context(ModelLimits(100_000, 1_000), ContextConfig(keep_tool_results=3))
        context.append(0, Message(role="user", content="go"))
        for i in range(100):
            call = ToolCall(id=f"c{i}", name="big", arguments={}, raw_arguments="{}")
            context.append(1 + 2 * i, Message(role="assistant", content="step", tool_calls=[call]))
            context.append(2 + 2 * i, Message(role="tool", content=OUTPUT, tool_call_id=f"c{i}", name="big"))
        context.calibrate(context.request_chars(None, tools), Usage(input_tokens=90_000))
        return context

    def timed(fn: Any) -> float:
        times = []
        for _ in range(samples):
            context = filled()
            began = time.perf_counter()
            fn(context)
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1e6

    return {
        "estimate": timed(lambda c: c.tokens_for(c.request_chars("system prompt", tools))),
        "append": timed(lambda c: c.append(999, Message(role="user", content="one more prompt"))),
        "prune": timed(lambda c: c.prune()),
        "plan_compaction": timed(lambda c: c.compaction_request(c.compaction_split() or 1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--churn", action="store_true", help="the long session with large outputs (see above)")
    parser.add_argument("--before", help="with --churn: a commit to run side by side with this checkout")
    parser.add_argument("--churn-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.churn_worker:
        with tempfile.TemporaryDirectory(prefix="weald-bench-churn-") as tmp:
            print(json.dumps(churn_run(args.steps, Path(tmp))))
        return
    console = Console(width=140, highlight=False)
    if args.churn:
        churn(args.steps, args.rounds, args.before, console)
        return
    console.print(f"load: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    results: dict[str, list[dict[str, Any]]] = {"managed": [], "unmanaged": []}
    with tempfile.TemporaryDirectory(prefix="weald-bench-context-") as tmp:
        root = Path(tmp)
        for _ in range(args.rounds):
            results["managed"].append(session_run(args.steps, 6_000, root))
            results["unmanaged"].append(session_run(args.steps, 100_000_000, root))
    table = Table(title=f"one turn of {args.steps} steps, 3,600-character tool outputs (median of {args.rounds})")
    for column in ("window", "per step (ms)", "prunes", "compactions", "per compaction (ms)", "context kept"):
        table.add_column(column, justify="right")
    for name, window in (("managed", "6,000"), ("unmanaged", "100,000,000")):
        runs = results[name]
        compaction_ms = [ms for run in runs for ms in run["compaction_ms"]]
        table.add_row(
            f"{window} ({name})",
            f"{statistics.median(r['per_step_ms'] for r in runs):.2f}",
            str(runs[-1]["prunes"]),
            str(runs[-1]["compactions"]),
            f"{statistics.median(compaction_ms):.2f}" if compaction_ms else "-",
            f"{runs[-1]['context_messages']} messages, {runs[-1]['context_tokens']:,} tokens",
        )
    console.print(table)
    managed = statistics.median(r["per_step_ms"] for r in results["managed"])
    unmanaged = statistics.median(r["per_step_ms"] for r in results["unmanaged"])
    console.print(f"managed / unmanaged time per step: {managed / unmanaged:.2f}x")
    ops = operations(200)
    table = Table(title="the context's operations on 200 messages (median, us)")
    for column in ("estimate before a call", "append a message", "prune", "plan + build a compaction request"):
        table.add_column(column, justify="right")
    table.add_row(*(f"{ops[k]:.1f}" for k in ("estimate", "append", "prune", "plan_compaction")))
    console.print(table)
    console.print(f"load: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
