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

Run: ``python benchmarks/bench_context.py [--steps 300] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from weald.runtime import ActorSystem
from weald.runtime.agents.agent import AgentConfig
from weald.runtime.agents.context import Context, ContextConfig
from weald.runtime.agents.session import SessionConfig, agent_path, session_spec
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.llm import Message, ModelLimits, ProviderSettings, ScriptedProvider, ToolCall, ToolSpec, Usage
from weald.runtime.testing import wait_until
from weald.supervisors import DynamicSupervisor
from weald.tools import ToolContext, ToolRegistry, tool

REG = ToolRegistry()
OUTPUT = "line of tool output, 36 characters\n" * 100  # 3,600 characters


@tool(name="big", description="returns 3,600 characters", parameters={"type": "object", "properties": {}}, registry=REG)
async def big(ctx: ToolContext) -> str:  # noqa: ARG001 - the tool signature
    return OUTPUT


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
    args = parser.parse_args()
    console = Console(width=140, highlight=False)
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
