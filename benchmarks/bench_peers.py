"""A turn with 10 no-op tool calls: weald beside a peer framework (autogen), side by side in one run.

weald: the turn of bench_agent.py (a real session under a ``/sessions``
supervisor, a scripted model calling the no-op tool 10 times and then
answering; every message committed to the store before the result is
acknowledged; each call a supervised ``ToolExecution`` child), driven from
a task on the loop. autogen: `benchmarks/peers/autogen_turn.py`, an
``AssistantAgent`` with the same script and tool, nothing persisted.

Each contender runs in a worker process of its own (autogen in the peers'
virtualenv, ``benchmarks/.peers-venv``, made from
``benchmarks/peers/requirements.txt`` by ``--install``), in rounds that
alternate them, so load hits both alike. Per round: the median turn
(wall clock, p50) and the process's CPU time per turn (which the load of
other processes on a shared machine changes far less than wall time).
Printed: the medians over the rounds and the ratios weald / autogen.
``--before REF`` adds weald at another commit as a third contender.

Run: ``python benchmarks/bench_peers.py [--install] [--rounds N] [--agents N] [--before REF]``
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
VENV = Path(os.environ.get("WEALD_PEERS_VENV", HERE / ".peers-venv"))


def _peer_python() -> Path:
    return VENV / "bin" / "python"


def install() -> None:
    """Make the peers' virtualenv from ``peers/requirements.txt`` (pip's own progress shows)."""
    if not _peer_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    requirements = PEERS / "requirements.txt"
    subprocess.run([str(_peer_python()), "-m", "pip", "install", "-r", str(requirements)], check=True)


def weald_worker(agents: int) -> dict[str, Any]:
    """The weald turn, measured in this process (a worker); returns what autogen_turn.py returns."""
    import trio
    from weald.runtime import ActorSystem
    from weald.supervisors import DynamicSupervisor

    sys.path.insert(0, str(HERE))
    from bench_agent import TURNS_PER_SESSION, start_session

    turns: list[float] = []
    cpu = [0.0]
    with (
        tempfile.TemporaryDirectory(prefix="weald-bench-peers-") as tmp,
        ActorSystem(store_path=Path(tmp) / "store.db") as system,
    ):
        sessions = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 50}, name="sessions")

        async def run(agent: Any, n: int, keep: bool) -> None:
            proxy = agent.proxy()
            for _ in range(n):
                began, began_cpu = time.perf_counter(), time.process_time()
                result = await (await proxy.prompt("go"))
                spent, spent_cpu = time.perf_counter() - began, time.process_time() - began_cpu
                assert result.ok, result
                if keep:
                    turns.append(spent * 1e6)
                    cpu[0] += spent_cpu

        for i in range(agents + 1):  # the first session warms up
            agent = start_session(system, sessions, tmp, f"s{i}")
            trio.from_thread.run(run, agent, TURNS_PER_SESSION, i > 0, trio_token=system.loop.token)
            sessions.proxy().terminate_child(system.whereis(f"/sessions/s{i}")).get(timeout=10)
    return {"turns": turns, "cpu_per_turn": cpu[0] / len(turns) * 1e6}


def _run_worker(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise RuntimeError(f"{argv[1]} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(rounds: int, agents: int, before: str | None) -> None:
    sys.path.insert(0, str(HERE))
    from _bench import banner, checkout, load_note

    if not _peer_python().exists():
        raise SystemExit(f"no peers' virtualenv at {VENV}: run with --install first (needs PyPI)")
    banner("bench_peers: one turn with 10 no-op tool calls, weald beside autogen (rounds alternating)")
    baseline = checkout(before, "bench-peers-before-") if before else None
    here = [sys.executable, __file__, "--worker", str(agents)]
    contenders: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "weald": (here, None),
        "autogen": ([str(_peer_python()), str(PEERS / "autogen_turn.py"), str(agents)], None),
    }
    if baseline is not None:
        contenders[f"weald {before}"] = (here, {**os.environ, "PYTHONPATH": str(baseline / "pkg")})
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    try:
        for i in range(rounds):
            order = list(contenders.items()) if i % 2 == 0 else list(reversed(contenders.items()))
            for name, (argv, env) in order:
                got[name].append(_run_worker(argv, env))
            line = "  ".join(f"{name}: {statistics.median(got[name][-1]['turns']):,.0f} us" for name in contenders)
            print(f"round {i + 1}/{rounds}: {line}   ({load_note()})")
    finally:
        if baseline is not None:
            shutil.rmtree(baseline, ignore_errors=True)
    print(f"\nmedians over {rounds} rounds of {agents * 10} turns each:")
    print(f"  {'':<22}{'turn p50':>12}{'CPU per turn':>15}{'p50 / autogen':>16}{'CPU / autogen':>16}")
    base_p50 = statistics.median(statistics.median(r["turns"]) for r in got["autogen"])
    base_cpu = statistics.median(r["cpu_per_turn"] for r in got["autogen"])
    for name in contenders:
        p50 = statistics.median(statistics.median(r["turns"]) for r in got[name])
        cpu = statistics.median(r["cpu_per_turn"] for r in got[name])
        print(f"  {name:<22}{p50:>9,.0f} us{cpu:>12,.0f} us{p50 / base_p50:>15.2f}x{cpu / base_cpu:>15.2f}x")
    print(load_note())


def main() -> None:
    if "--worker" in sys.argv:
        print(json.dumps(weald_worker(int(sys.argv[sys.argv.index("--worker") + 1]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--install", action="store_true", help="make the peers' virtualenv first")
    parser.add_argument("--rounds", type=int, default=6, help="worker runs per contender")
    parser.add_argument("--agents", type=int, default=10, help="sessions (10 turns each) per worker run")
    parser.add_argument("--before", default=None, help="also weald at this commit")
    args = parser.parse_args()
    if args.install:
        install()
    compare(args.rounds, args.agents, args.before)


if __name__ == "__main__":
    main()
