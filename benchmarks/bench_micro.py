"""Micro-benchmarks of the hot paths the runtime optimised, for before/after comparisons.

Each figure is the best of 5 repeats of a timed loop (``timeit``), in
microseconds per operation:

- ``EventBus.publish`` of three payloads shaped like the tool runner's and
  the supervisors' events (every payload is redacted);
- ``validate_arguments`` for read_file, grep and a no-argument tool;
- ``ref.proxy()`` of a DynamicSupervisor and of a ToolRunner (pykka
  introspects the actor on every proxy);
- ``Future()`` and an ask round trip between two loop actors;
- start + stop of a loop actor from another actor (``spawn_child``, then
  ``await ref.stop(block=False)``).

Run it on two checkouts to compare (the benchmark only uses public API, plus
the runner's ``ToolRunner`` which both have)::

    python benchmarks/bench_micro.py
    PYTHONPATH=/path/to/other/checkout/pkg python benchmarks/bench_micro.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from weald.runtime import Actor, ActorSystem, EventBus, Future
from weald.runtime.agents.tool_runner import ToolRunner
from weald.supervisors import DynamicSupervisor
from weald.tools import default_registry, validate_arguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, print_rows


def best(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


class Echo(Actor):
    def on_receive(self, message: Any) -> Any:
        return message


class Parent(Actor):
    async def start_stop(self, n: int) -> float:
        samples = []
        for i in range(n):
            began = time.perf_counter()
            ref = self.spawn_child(Echo, name=f"c{i}")
            await ref.stop(block=False)
            samples.append((time.perf_counter() - began) * 1e6)
        return statistics.median(samples)

    async def asks(self, target: Any, n: int) -> float:
        samples = []
        for _ in range(n):
            began = time.perf_counter()
            await target.ask(1, block=False)
            samples.append((time.perf_counter() - began) * 1e6)
        return statistics.median(samples)

    def on_receive(self, message: Any) -> None:
        pass


def run(quick: bool = False) -> list[Row]:
    banner("bench_micro: hot paths, per operation")
    n = 2000 if quick else 10000
    rows: list[Row] = []

    def add(name: str, value: float) -> None:
        rows.append(Row("micro", name, value, "us"))

    bus = EventBus()
    started = {"call_id": "c1", "tool": "noop", "agent": "/sessions/s/agent", "batch_id": "b1", "arguments": {}}
    finished = {"call_id": "c1", "tool": "noop", "agent": "/a", "batch_id": "b1", "ok": True, "duration_ms": 0.1}
    child = {"id": "c1-1", "path": "/sessions/s/tool_runner/calls/c1-1", "kind": "ToolExecution"}
    add("publish tool.started", best(lambda: bus.publish("tool.started", "/s/tool_runner", started), n))
    add("publish tool.finished", best(lambda: bus.publish("tool.finished", "/s/tool_runner", finished), n))
    add("publish supervisor.child_started", best(lambda: bus.publish("supervisor.child_started", "/c", child), n))
    read_file, grep = default_registry.get("read_file"), default_registry.get("grep")
    ask_user = default_registry.get("ask_user")
    assert read_file is not None
    assert grep is not None
    assert ask_user is not None
    rf_args = {"path": "src/module.py", "offset": 10, "limit": 200}
    add("validate read_file arguments", best(lambda: validate_arguments(read_file, rf_args), n))
    add("validate grep arguments", best(lambda: validate_arguments(grep, {"pattern": "def \\w+", "path": "src"}), n))
    add("validate ask_user arguments", best(lambda: validate_arguments(ask_user, {"question": "ok?"}), n))
    add("Future()", best(Future, n * 5))
    with tempfile.TemporaryDirectory() as tmp, ActorSystem(store_path=Path(tmp) / "s.db") as system:
        sup = DynamicSupervisor.start()
        runner = system.spawn(ToolRunner, args=("s", tmp), name="runner")
        parent = Parent.start()
        echo = Echo.start()
        for ref in (sup, runner, parent, echo):
            ref.started().get(timeout=10)
        add("proxy() of a DynamicSupervisor", best(sup.proxy, n // 10))
        add("proxy() of a ToolRunner", best(runner.proxy, n // 10))
        proxy = parent.proxy()
        proxy.asks(echo, 500).get()
        add("ask between two loop actors", statistics.median(proxy.asks(echo, n).get() for _ in range(3)))
        proxy.start_stop(200).get()
        add("start + stop, from an actor", statistics.median(proxy.start_stop(n // 5).get() for _ in range(3)))
    print_rows(rows)
    return rows


def main() -> None:
    run(quick="--quick" in sys.argv)


if __name__ == "__main__":
    main()
