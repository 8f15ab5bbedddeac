"""``agent.list`` and ``weald agents`` at 100,000 sessions, this checkout beside an earlier one.

Against a real ``weald serve`` with N sessions (default 100,000) started
asleep with ``agents.start`` (1,000 a request), 10 of them woken by a prompt
and 5 stopped, for each checkout measured (``--before REF``, default
``c853650``, the commit before ``agent.list`` read from memory; and this one),
one daemon after the other on the same machine:

- ``agent.list`` of every session through the socket (the median of
  ``--runs`` calls; the earlier checkout once: it takes about a minute);
- this checkout only: its first page (``limit`` 100), and every session in
  pages of 1,000 (``after`` the last id of the page before);
- ``agent.list`` with ``long`` (each session's spill bytes added: one pass
  over the store's ``spill`` rows);
- ``weald agents`` (the whole table, to a file) and ``weald agents --limit 50``
  as a person runs them, wall time of the process.

Run: ``python benchmarks/bench_agent_list.py [--sessions 100000] [--before c853650] [--runs 3] [--skip-before]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import checkout, daemon_client, load_note, machine_info, many_sessions_files, start_asleep
from rich.console import Console
from rich.table import Table
from weald.runtime.daemon.client import Client


def timed(client: Client, method: str, params: dict[str, Any], runs: int) -> tuple[float, Any]:
    """The median time of ``runs`` calls in ms, and the last answer."""
    times = []
    answer = None
    for _ in range(runs):
        started = time.perf_counter()
        answer = client.call(method, params, timeout=1800)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), answer


def cli_ms(env: dict[str, str], socket: Path, *args: str) -> float:
    """Wall time of ``weald --socket S agents ARGS`` in ms, its output to a file (it must succeed)."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "weald.runtime.daemon.cli", "agents", "--socket", str(socket), *args],
            env={**env, "COLUMNS": "160"},
            stdout=out,
            stderr=subprocess.PIPE,
            timeout=1800,
            check=False,
        )
        wall = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"weald agents {' '.join(args)} failed: {done.stderr.decode()[-2000:]}")
    return wall


def measure(n: int, runs: int, pythonpath: str | None, console: Console) -> dict[str, float]:
    """One daemon with ``n`` sessions asleep (10 awake, 5 stopped): the listings' times in ms."""
    root, project, script, socket, env = many_sessions_files("bench-agent-list-", n)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    else:
        env.pop("PYTHONPATH", None)
    serve = [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(socket)]
    proc = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    figures: dict[str, float] = {}
    try:
        client = daemon_client(socket)
        took = start_asleep(socket, project, script, n)
        console.print(f"{n:,} sessions started asleep in {took:.1f} s; {load_note()}")
        for i in range(0, 100, 10):
            assert client.call("agent.prompt", {"agent_id": f"a{i:06d}", "text": "go"}, timeout=120)["ok"]
        for i in range(1, 6):
            client.call("agent.stop", {"agent_id": f"a{i:06d}"}, timeout=120)
        console.print(f"listing ({load_note()})")
        whole_runs = runs if pythonpath is None else 1
        figures["agent.list, every session"], rows = timed(client, "agent.list", {}, whole_runs)
        assert len(rows) == n, len(rows)
        if pythonpath is None:
            figures["agent.list, first page (limit 100)"], _ = timed(client, "agent.list", {"limit": 100}, runs)
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                seen, after = 0, None
                while True:
                    page = client.call("agent.list", {"limit": 1000, "after": after}, timeout=1800)
                    seen += len(page["rows"])
                    after = page["next_after"]
                    if after is None:
                        break
                times.append((time.perf_counter() - started) * 1000)
                assert seen == n, seen
            figures["agent.list, every session in pages of 1,000"] = statistics.median(times)
            figures["agent.list long, every session"], _ = timed(client, "agent.list", {"long": True}, runs)
            figures["weald agents --limit 50 (process)"] = cli_ms(env, socket, "--limit", "50")
        figures["weald agents, whole table (process)"] = cli_ms(env, socket)
    finally:
        proc.terminate()
        proc.wait(600)
        shutil.rmtree(root, ignore_errors=True)  # 100,000 sessions' store: hundreds of MB
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", default="c853650", help="the earlier checkout (a git ref of this repository)")
    parser.add_argument("--skip-before", action="store_true", help="measure this checkout only")
    args = parser.parse_args()
    console = Console()
    console.print(machine_info())
    before: dict[str, float] = {}
    if not args.skip_before:
        where = checkout(args.before)
        try:
            before = measure(args.sessions, args.runs, str(where / "pkg"), console)
        finally:
            shutil.rmtree(where, ignore_errors=True)
    now = measure(args.sessions, args.runs, None, console)
    table = Table(title=f"agent.list at {args.sessions:,} sessions, {args.before} and now ({load_note()})")
    for column in ("what", "now", args.before, "ratio"):
        table.add_column(column)
    for name, ms in now.items():
        old = before.get(name)
        table.add_row(
            name,
            f"{ms:,.1f} ms",
            "" if old is None else f"{old:,.0f} ms",
            "" if old is None else f"{old / ms:,.0f}x faster",
        )
    console.print(table)


if __name__ == "__main__":
    main()
