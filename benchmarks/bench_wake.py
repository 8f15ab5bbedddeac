"""Hibernation: what a sleeping session costs, and what waking it costs, side by side with an awake one.

In one process (an embedded daemon, no socket), for sessions of the
default configuration:

- memory per session, awake (idle after start, hibernation off) and
  hibernated (a second daemon, ``hibernate_after = 1``), as traced by
  ``tracemalloc`` over N sessions (live Python objects only: no allocator
  slack, no SQLite page cache), and the process's RSS growth (tracemalloc's
  own bookkeeping included, so RSS here is above bench_daemon's);
- a wake-up: an ask (``snapshot``) sent to a hibernated agent's path, from
  the message to the answer (the session's three actors started, its record
  and history read back from the store), beside the same ask to an awake
  agent; for a short history (one turn) and a long one (``--history``
  messages). Rounds interleave the two, medians reported.

Run: ``python benchmarks/bench_wake.py [--sessions 2000] [--rounds 30] [--history 200]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import trio
from rich.console import Console
from rich.table import Table
from weald.runtime import Stub
from weald.runtime.daemon.config import parse_config
from weald.runtime.daemon.tree import Daemon
from weald.runtime.testing import wait_until


def rss_kib() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def asleep(daemon: Daemon, agent_id: str) -> bool:
    ref = daemon.system.whereis(f"/sessions/{agent_id}")
    return isinstance(ref, Stub) and ref.successor is None


def start_many(daemon: Daemon, project: Path, ids: list[str], model: str | None = None) -> None:
    sessions = daemon.sessions
    assert sessions is not None

    async def run() -> None:
        limiter = trio.CapacityLimiter(256)

        async def one(agent_id: str) -> None:
            async with limiter:
                await sessions.start(str(project), agent_id=agent_id, model=model)

        async with trio.open_nursery() as nursery:
            for agent_id in ids:
                nursery.start_soon(one, agent_id)

    daemon.system.loop.run(run)


def ask_ms(daemon: Daemon, agent_id: str) -> float:
    async def ask() -> float:
        t = time.perf_counter()
        ref = daemon.system.whereis(f"/sessions/{agent_id}/agent")
        assert ref is not None
        await ref.proxy().snapshot(0)
        return (time.perf_counter() - t) * 1e3

    return daemon.system.loop.run(ask)


def memory(work: Path, n: int, hibernate_after: float) -> dict[str, float]:
    """Per session: traced bytes, and RSS growth; ``hibernate_after`` 0 keeps them awake."""
    project = work / f"mem{hibernate_after}"
    project.mkdir()
    config = parse_config(
        f'[store]\npath = "{work / f"mem{hibernate_after}.db"}"\n'
        f"[limits]\nmax_agents = 200000\nhibernate_after = {hibernate_after}\n"
    )
    with Daemon(config) as daemon:
        start_many(daemon, project, [f"w{i}" for i in range(50)])  # warm up
        if hibernate_after:
            wait_until(lambda: all(asleep(daemon, f"w{i}") for i in range(50)), timeout=120)
        gc.collect()
        tracemalloc.start()
        base, base_rss = tracemalloc.get_traced_memory()[0], rss_kib()
        ids = [f"m{i}" for i in range(n)]
        start_many(daemon, project, ids)
        if hibernate_after:
            wait_until(lambda: all(asleep(daemon, i) for i in ids), timeout=600, interval=0.1)
        gc.collect()
        traced = (tracemalloc.get_traced_memory()[0] - base) / n
        rss = (rss_kib() - base_rss) / n
        tracemalloc.stop()
    return {"traced": traced / 1024, "rss": rss}


def wake(work: Path, rounds: int, history: int) -> dict[str, Any]:
    project = work / "wake"
    project.mkdir()
    script = work / "long.json"
    script.write_text('{"turns": [' + ",".join(['{"text": "ok"}'] * (history // 2 + 5)) + "]}")
    config = parse_config(f'[store]\npath = "{work / "wake.db"}"\n[limits]\nhibernate_after = 0.05\n')
    out: dict[str, list[float]] = {"awake short": [], "asleep short": [], "awake long": [], "asleep long": []}
    with Daemon(config) as daemon:
        sessions = daemon.sessions
        assert sessions is not None
        start_many(daemon, project, ["short"])
        start_many(daemon, project, ["long"], model=f"scripted:{script}")
        for name, turns in (("short", 1), ("long", history // 2)):
            for _ in range(turns):
                daemon.system.loop.run(lambda n=name: sessions.prompt_nowait(n, "hello").wait())
        for _ in range(rounds):
            for name in ("short", "long"):
                wait_until(lambda n=name: asleep(daemon, n), timeout=30)
                out[f"asleep {name}"].append(ask_ms(daemon, name))  # wakes it
                out[f"awake {name}"].append(ask_ms(daemon, name))  # it is awake now
    return {key: statistics.median(values) for key, values in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--history", type=int, default=200)
    args = parser.parse_args()
    console = Console(width=140)
    with tempfile.TemporaryDirectory(prefix="weald-wake-") as tmp:
        work = Path(tmp)
        load = os.getloadavg()[0]
        awake = memory(work, args.sessions, hibernate_after=0)
        hibernated = memory(work, args.sessions, hibernate_after=1.0)
        w = wake(work, args.rounds, args.history)
        table = Table("figure", "value")
        table.add_row(f"traced per session, awake ({args.sessions:,} sessions)", f"{awake['traced']:.2f} KiB")
        table.add_row("RSS growth per session, awake", f"{awake['rss']:.1f} KiB")
        table.add_row("traced per session, hibernated", f"{hibernated['traced']:.2f} KiB")
        table.add_row("RSS growth per session, hibernated (woke once at start)", f"{hibernated['rss']:.1f} KiB")
        table.add_row("ask to an awake agent (1-turn history)", f"{w['awake short']:.2f} ms")
        table.add_row("ask to a hibernated agent: wake + ask (1-turn history)", f"{w['asleep short']:.2f} ms")
        table.add_row(f"ask to an awake agent ({args.history}-message history)", f"{w['awake long']:.2f} ms")
        table.add_row(f"wake + ask ({args.history}-message history)", f"{w['asleep long']:.2f} ms")
        table.add_row(
            "wake-up cost (short / long history)",
            f"{w['asleep short'] - w['awake short']:.2f} / {w['asleep long'] - w['awake long']:.2f} ms",
        )
        console.print(table)
        console.print(
            f"load {load:.1f} -> {os.getloadavg()[0]:.1f}; targets: <= 10 KiB per idle session, wake-up < 2 ms"
        )


if __name__ == "__main__":
    main()
