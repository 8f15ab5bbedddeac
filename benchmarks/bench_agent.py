"""Agent loop overhead: one turn with 10 no-op tool calls, beside a raw pykka agent loop.

weald: a real session (``session_spec`` under a ``/sessions`` DynamicSupervisor:
tool runner, sub-agents supervisor, agent) with a `ScriptedProvider` whose
script answers each prompt with a model step calling the no-op tool 10
times, then a model step with the final text. A turn is timed from
``prompt`` to its `TurnResult`, which the agent acknowledges only after every
message of the turn is committed to the store. Everything an agent turn does
is included: model streams as messages, events, the runner's 10 supervised
``ToolExecution`` children, history writes and the flush.

The turn is driven from a task on the loop (as the daemon's server drives
it) and, for comparison, from a foreign thread. The session is replaced
every 10 turns, so the history stays short (a scripted model step costs
time linear in the history; that is the model's cost, not the loop's).

raw pykka: a minimal agent loop with no supervision, persistence or events:
an agent ``ThreadingActor`` takes the prompt (an ask), makes a model step
(a function returning 10 calls), asks a tool-runner ``ThreadingActor`` to
run the batch (it calls the no-op function for each call), makes the second
model step and replies.

Figure: turn time minus the tools' own time (10 direct calls of the no-op
function): target <= 2 ms (median), with its ratio to the raw pykka loop.
Also printed: where a turn's time goes (from the agent's own events), how
many times a turn waits for the store to commit, and what one such commit
round trip costs (the store's committer thread, measured alone).

``--before REF`` compares this checkout with another commit side by side
in one run (default ``main``): each contender measures in a worker process
of its own (``git archive REF`` loaded instead of this tree), in rounds that
alternate them, so load hits both alike; the figures are medians over the
rounds, with the ratio after / before.

``--telemetry`` adds a third contender: this checkout with OpenTelemetry
on (the daemon's `Telemetry` following the events, spans batched and
exported over OTLP/HTTP to a sink on loopback in the worker process, which
answers 200 to everything), so the cost of telemetry on is measured beside
off (the other two contenders have it off: nothing of it is loaded).

``--postgres`` (with ``--before``) adds this checkout with its store on
PostgreSQL: a throwaway cluster of Debian's ``postgresql`` (tests/pg_cluster.py;
as ``nobody``, fsync on, TCP on loopback), a fresh database per worker run,
the worker joined as a node with its sessions claimed, so every commit checks
the fence as a daemon's does.

Run: ``python benchmarks/bench_agent.py [--quick] [--before REF] [--rounds N] [--telemetry] [--postgres]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pykka
import trio
from weald.runtime import ActorSystem, Store
from weald.runtime.agents.agent import AgentConfig
from weald.runtime.agents.session import SessionConfig, agent_path, session_spec
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.llm import ScriptedProvider
from weald.runtime.testing import wait_until
from weald.supervisors import DynamicSupervisor
from weald.tools import ToolContext, ToolRegistry, tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PLACEMENTS, Row, banner, checkout, load_note, pin, quick_main, summary, verdict

REG = ToolRegistry()
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}
CALLS = 10
TURNS_PER_SESSION = 10


@tool(name="noop", description="does nothing", parameters=EMPTY, registry=REG)
async def noop(ctx: ToolContext) -> str:  # noqa: ARG001 - the tool signature
    return "ok"


def script(turns: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for _ in range(turns):
        steps.append({"text": "", "tool_calls": [{"name": "noop", "arguments": {}}] * CALLS})
        steps.append({"text": "done"})
    return {"turns": steps}


# -- raw pykka -------------------------------------------------------------------------------------


def pykka_noop(ctx: Any) -> str:  # noqa: ARG001 - the tool signature
    return "ok"


class PykkaRunner(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> list[str]:
        return [pykka_noop(None) for _ in message]


class PykkaAgent(pykka.ThreadingActor):
    def __init__(self, runner: pykka.ActorRef[Any]) -> None:
        super().__init__()
        self.runner = runner
        self.history: list[Any] = []
        self.step = 0

    def model(self) -> dict[str, Any]:
        self.step += 1
        if self.step % 2:
            return {"text": "", "tool_calls": [("noop", {})] * CALLS}
        return {"text": "done", "tool_calls": []}

    def on_receive(self, message: Any) -> str:
        self.history.append(("user", message))
        while True:
            reply = self.model()
            self.history.append(("assistant", reply))
            if not reply["tool_calls"]:
                return str(reply["text"])
            results = self.runner.ask(reply["tool_calls"])
            self.history.extend(("tool", r) for r in results)


# -- measurement ------------------------------------------------------------------------------------


def start_session(system: ActorSystem, sessions: Any, working_dir: str, sid: str) -> Any:
    """Start session ``sid`` under ``sessions`` with the scripted model; returns its agent's ref."""
    config = SessionConfig(sid, working_dir, AgentConfig(model="scripted:bench"), RunnerConfig())
    spec = session_spec(
        config,
        system=system,
        registry=REG,
        provider_factory=lambda _model: ScriptedProvider.from_dict(script(TURNS_PER_SESSION)),
    )
    sessions.proxy().start_child(spec).get(timeout=10)
    return wait_until(lambda: system.whereis(agent_path(sid)))


PHASES = ("model step 1", "10 tool calls", "model step 2", "final flush")


def phases(system: ActorSystem, path: str, turn_id: str) -> list[float] | None:
    """Microseconds in each phase of a turn, from the agent's events (wall-clock times).

    model step 1: from turn start (the prompt and the model's position are
    committed first) to the tool calls; 10 tool calls: until the results are
    in; model step 2: until the turn ends (again after a commit); final flush:
    until the turn's writes are committed and the result is acknowledged.
    """
    events = system.events.recent(400, source=path)

    def find(topic: str) -> int | None:
        return next((i for i, e in enumerate(events) if e.topic == topic and e.data["turn_id"] == turn_id), None)

    start, end = find("agent.turn_start"), find("agent.turn_end")
    if start is None or end is None:
        return None
    states = [e for e in events[start:end] if e.topic == "agent.state"]
    times = {e.data["to"]: e.time for e in states if e.data["to"] in ("executing_tools", "idle")}
    resumed = [e.time for e in states if e.data["from"] == "executing_tools"]
    if len(times) < 2 or not resumed:
        return None
    marks = [events[start].time, times["executing_tools"], resumed[0], times["idle"], events[end].time]
    return [(b - a) * 1e6 for a, b in itertools.pairwise(marks)]


def measure(quick: bool, placement: str | None) -> dict[str, Any]:
    sessions_n = 6 if quick else 20
    res: dict[str, list[float]] = {"loop": [], "foreign": [], "pykka": [], "flush": []}
    split: list[list[float]] = []
    flushes = [0]
    url = os.environ.get("WEALD_BENCH_STORE_URL") or None
    with (
        tempfile.TemporaryDirectory(prefix="weald-bench-agent-") as tmp,
        ActorSystem(store_path=Path(tmp) / "store.db", **({"store_url": url} if url else {})) as system,
    ):
        if url is not None:
            # As a daemon's node: its sessions claimed, so every commit checks the fence.
            system.store.join("bench", lease=30)
            system.store.claim([f"s{i}" for i in range(sessions_n)])
        sessions = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 50}, name="sessions")
        telemetry = _telemetry_on(system) if os.environ.get("WEALD_BENCH_TELEMETRY") else None
        token = system.loop.token
        p_runner = PykkaRunner.start()
        p_agent = PykkaAgent.start(p_runner)

        def new_session(i: int) -> Any:
            return start_session(system, sessions, tmp, f"s{i}")

        async def loop_turns(agent: Any, n: int) -> list[float]:
            proxy = agent.proxy()
            out = []
            for _ in range(n):
                began = time.perf_counter()
                turn = await proxy.prompt("go")
                result = await turn
                out.append((time.perf_counter() - began) * 1e6)
                assert result.ok, result
                parts = phases(system, agent.path, result.turn_id)
                if parts is not None:
                    split.append(parts)
            return out

        async def flush_samples(n: int) -> list[float]:
            # A commit round trip as an agent step makes one: a few queued writes, then flush.
            out = []
            for i in range(n):
                for k in range(3):
                    system.store.enqueue_nowait("bench", f"k{i}.{k}", {"i": i, "text": "x" * 200})
                began = time.perf_counter()
                await system.store.flush()
                out.append((time.perf_counter() - began) * 1e6)
            return out

        def foreign_turns(agent: Any, n: int) -> list[float]:
            proxy = agent.proxy()
            out = []
            for _ in range(n):
                began = time.perf_counter()
                result = proxy.prompt("go").get().get()
                out.append((time.perf_counter() - began) * 1e6)
                assert result.ok, result
            return out

        def pykka_turns(n: int) -> list[float]:
            out = []
            for _ in range(n):
                began = time.perf_counter()
                assert p_agent.ask("go") == "done"
                out.append((time.perf_counter() - began) * 1e6)
            return out

        store_flush = Store.flush

        def counting_flush(self: Store, *args: Any, **kwargs: Any) -> Any:
            flushes[0] += 1
            return store_flush(self, *args, **kwargs)

        pin(placement)
        pykka_turns(20)
        turns = 0
        for i in range(sessions_n):
            pin(placement)
            agent = new_session(i)
            half = (TURNS_PER_SESSION - 1) // 2
            trio.from_thread.run(loop_turns, agent, 1, trio_token=token)  # warms the session up
            Store.flush = counting_flush  # type: ignore[method-assign]
            try:
                # Loop-driven and foreign-driven turns alternate which goes first.
                if i % 2:
                    res["foreign"] += foreign_turns(agent, half)
                    res["loop"] += trio.from_thread.run(loop_turns, agent, half, trio_token=token)
                else:
                    res["loop"] += trio.from_thread.run(loop_turns, agent, half, trio_token=token)
                    res["foreign"] += foreign_turns(agent, half)
            finally:
                Store.flush = store_flush  # type: ignore[method-assign]
            turns += 2 * half
            res["pykka"] += pykka_turns(TURNS_PER_SESSION)
            sessions.proxy().terminate_child(agent_parent(system, i)).get(timeout=10)
        res["flush"] = trio.from_thread.run(flush_samples, 100 if quick else 300, trio_token=token)
        p_agent.stop()
        p_runner.stop()
        if telemetry is not None:
            telemetry.shutdown()
    pin(None)
    out: dict[str, Any] = {k: statistics.median(v) for k, v in res.items()}
    out["phases"] = [statistics.median(p[j] for p in split) for j in range(len(PHASES))] if split else None
    out["flushes_per_turn"] = flushes[0] / turns if turns else 0.0
    return out


def agent_parent(system: ActorSystem, i: int) -> Any:
    return system.whereis(f"/sessions/s{i}")


def tool_own_time() -> float:
    """Microseconds for 10 direct calls of the no-op tool function."""

    async def go() -> float:
        ctx = ToolContext(working_dir=".")
        samples = []
        for _ in range(2000):
            began = time.perf_counter()
            for _ in range(CALLS):
                await noop.fn(ctx)
            samples.append((time.perf_counter() - began) * 1e6)
        return statistics.median(samples)

    result: float = trio.run(go)
    return result


def run(quick: bool = False) -> list[Row]:
    banner("bench_agent: one agent turn with 10 no-op tool calls (scripted model), beside raw pykka")
    own = tool_own_time()
    rows: list[Row] = []
    placements = ["one", "two"]
    print(f"tools' own time (10 direct no-op calls): {own:.1f} us")
    for placement in placements:
        m = measure(quick, placement)
        loop, foreign, raw = m["loop"] - own, m["foreign"] - own, m["pykka"] - own
        where = "1 CPU" if placement == "one" else "2 CPUs"
        print(f"\n--- placement: {PLACEMENTS[placement]} ---")
        print(f"  weald turn, driven from the loop         {m['loop']:>9.0f} us   overhead {loop:>8.0f} us")
        print(f"  weald turn, driven from a foreign thread {m['foreign']:>9.0f} us   overhead {foreign:>8.0f} us")
        print(f"  raw pykka agent loop (foreign thread)    {m['pykka']:>9.0f} us   overhead {raw:>8.0f} us")
        if m["phases"] is not None:
            print("  where a loop-driven turn goes (medians, from the agent's events):")
            for name, us in zip(PHASES, m["phases"], strict=True):
                print(f"    {name:<14} {us:>7.0f} us")
        print(
            f"  store flushes per turn: {m['flushes_per_turn']:.1f}; one commit round trip "
            f"(3 queued writes, then flush): {m['flush']:.0f} us median"
        )
        rows.append(
            Row(
                "agent",
                f"turn overhead, 10 no-op calls [{where}]",
                loop / 1000,
                "ms",
                "<= 2 ms",
                verdict(loop, "<=", 2000),
                f"= {loop / raw:.0f}x raw pykka ({raw:.0f} us); from a foreign thread {foreign / 1000:.2f} ms; "
                f"{m['flushes_per_turn']:.0f} store flushes of ~{m['flush']:.0f} us each",
            )
        )
    return summary(rows)


def _telemetry_on(system: Any) -> Any:
    """Start the daemon's telemetry on ``system``, exporting to an OTLP/HTTP sink on loopback (this process)."""
    import http.server
    import threading

    from weald.runtime.daemon._telemetry import Telemetry
    from weald.runtime.daemon._telemetry_settings import TelemetrySettings

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    settings = TelemetrySettings(
        endpoint=url,
        protocol="http/protobuf",
        service_name="bench",
        traces_url=f"{url}/v1/traces",
        metrics_url=f"{url}/v1/metrics",
        metrics_interval=5.0,
    )
    telemetry = Telemetry(settings, system)
    system.loop.spawn_nowait(telemetry.follow)
    return telemetry


def _worker_measure(
    placement: str, quick: bool, pythonpath: Path | None, telemetry: bool = False, url: str | None = None
) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("WEALD_BENCH_TELEMETRY", None)
    env.pop("WEALD_BENCH_STORE_URL", None)
    if telemetry:
        env["WEALD_BENCH_TELEMETRY"] = "1"
    if url is not None:
        env["WEALD_BENCH_STORE_URL"] = url
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    argv = [sys.executable, __file__, "--worker", placement, *(["--quick"] if quick else [])]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise RuntimeError(f"worker {placement} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(before: str, rounds: int, quick: bool, telemetry: bool = False, postgres: bool = False) -> None:
    """This checkout beside ``before``, each in worker processes, rounds alternating."""
    banner(f"bench_agent: one turn with 10 no-op tool calls, this checkout beside {before}")
    baseline = checkout(before, "bench-agent-before-")
    own = tool_own_time()
    names: dict[str, Any] = {f"before ({before})": baseline / "pkg", "after (this checkout)": None}
    if telemetry:
        names["after, telemetry on"] = "telemetry"
    cluster = None
    if postgres:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from pg_cluster import PgCluster

        cluster = PgCluster(fsync=True).init().start()
        names["after, PostgreSQL"] = "postgres"
    try:
        for placement in ("one", "two"):
            got: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for i in range(rounds):
                order = list(names.items()) if i % 2 == 0 else list(reversed(names.items()))
                for name, path in order:
                    on = path == "telemetry"
                    url = cluster.url(cluster.create_database()) if path == "postgres" and cluster else None
                    plain = None if on or url else path
                    got[name].append(_worker_measure(placement, quick, plain, telemetry=on, url=url))
            print(f"\n--- placement: {PLACEMENTS[placement]} ({rounds} rounds, medians of their medians) ---")
            header = f"  {'':<44}{'before':>10}{'after':>10}{'after/before':>14}"
            extra = [name for name in names if name.startswith("after, ")]
            print(header + "".join(f"{name.removeprefix('after, ')[:12]:>12}{'/before':>9}" for name in extra))
            rows: list[tuple[str, Any]] = [
                ("turn overhead, driven from the loop", "loop"),
                ("turn overhead, from a foreign thread", "foreign"),
            ]
            rows += [(f"phase: {name}", j) for j, name in enumerate(PHASES)]
            rows += [("store flushes per turn", "flushes_per_turn"), ("one commit round trip", "flush")]
            for label, key in rows:
                values = []
                for name in names:
                    if isinstance(key, int):
                        per_round = [r["phases"][key] for r in got[name] if r["phases"] is not None]
                    else:
                        per_round = [r[key] for r in got[name]]
                    value = statistics.median(per_round) if per_round else float("nan")
                    values.append(value - own if key in ("loop", "foreign") else value)
                unit = "" if key == "flushes_per_turn" else " us"
                ratio = values[1] / values[0] if values[0] else float("nan")
                line = f"  {label:<44}{values[0]:>8.1f}{unit:<2}{values[1]:>8.1f}{unit:<2}{ratio:>13.2f}x"
                for value in values[2:]:
                    other = value / values[0] if values[0] else float("nan")
                    line += f"{value:>10.1f}{unit:<2}{other:>8.2f}x"
                print(line)
    finally:
        shutil.rmtree(baseline, ignore_errors=True)
        if cluster is not None:
            cluster.remove()
    print(load_note())


def main() -> None:
    if "--worker" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--worker", choices=["one", "two"])
        parser.add_argument("--quick", action="store_true")
        args = parser.parse_args()
        print(json.dumps(measure(args.quick, args.worker)))
        return
    if "--before" in sys.argv:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--before", default="main", help="the commit to compare with (default main)")
        parser.add_argument("--rounds", type=int, default=4, help="worker runs per contender and placement")
        parser.add_argument("--quick", action="store_true")
        parser.add_argument("--telemetry", action="store_true", help="also this checkout with telemetry on")
        parser.add_argument("--postgres", action="store_true", help="also this checkout with its store on PostgreSQL")
        args = parser.parse_args()
        compare(args.before, args.rounds, args.quick, args.telemetry, args.postgres)
        return
    quick_main(run, __doc__)


if __name__ == "__main__":
    main()
