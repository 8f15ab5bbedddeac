"""Shared helpers for the benchmarks: timing, medians, targets, the machine, result rows.

Every benchmark module exposes ``run(quick: bool = False) -> list[Row]`` (it
prints its own detailed table as it goes) and a ``main()``; ``run_all.py``
calls each ``run`` and prints one summary table of the rows.

Timing: each figure is the median of many single-operation samples, taken in
rounds that interleave the contenders (weald and its baselines), so a burst
of load from another process on this shared machine hits all of them alike
instead of one. ``load_note()`` records the load average next to the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from weald.runtime.daemon.client import Client

__all__ = [
    "PLACEMENTS",
    "Row",
    "banner",
    "checkout",
    "daemon_client",
    "interleave",
    "load_note",
    "machine_info",
    "many_sessions_files",
    "median",
    "pin",
    "print_rows",
    "quick_main",
    "rss_bytes",
    "samples_us",
    "start_asleep",
    "verdict",
]


@dataclass
class Row:
    """One figure of a benchmark, with its target if it has one.

    Attributes:
        bench: the benchmark (``actors``, ``tools``...).
        name: what was measured.
        value: the figure.
        unit: its unit (``us``, ``ms``, ``KB``, ``s``, ``/s``, ``x``).
        target: e.g. ``<= 100 us``; empty when the figure is for comparison only.
        ok: True/False against the target; None without one.
        note: ratios and remarks printed beside it.
    """

    bench: str
    name: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)


def verdict(value: float, op: str, limit: float) -> bool:
    """Whether ``value op limit`` holds (``op`` is ``<=``, ``<``, ``>=``)."""
    if op == "<=":
        return value <= limit
    if op == "<":
        return value < limit
    if op == ">=":
        return value >= limit
    raise ValueError(op)


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def samples_us(fn: Callable[[], object], n: int, warmup: int = 50) -> list[float]:
    """Time ``fn()`` ``n`` times; return the samples in microseconds."""
    for _ in range(warmup):
        fn()
    out = []
    perf = time.perf_counter
    for _ in range(n):
        began = perf()
        fn()
        out.append((perf() - began) * 1e6)
    return out


def interleave(
    contenders: dict[str, Callable[[int], list[float]]],
    ops: int,
    rounds: int = 5,
    before: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Run each contender's sampler for ``ops`` operations per round, rounds interleaved.

    Each sampler takes a count and returns that many samples (microseconds).
    ``before`` runs before each sampler (e.g. to pin new threads to CPUs).
    Returns the median of every sample per contender.
    """
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, sampler in contenders.items():
            gc.collect()
            if before is not None:
                before()
            samples[name].extend(sampler(ops))
    return {name: statistics.median(values) for name, values in samples.items()}


PLACEMENTS = {
    "one": "every thread on CPU 0",
    "two": "the calling thread on CPU 0, every other thread on CPU 1",
}


def pin(placement: str | None) -> None:
    """Pin every live thread of this process for ``placement`` (None: any CPU).

    Cross-thread figures on this VM depend on where the threads run: waking
    a thread parked on another, idle vCPU costs a hypervisor wake-up (tens of
    microseconds) that a hand-off on the same CPU does not. Pinning makes
    both cases explicit and repeatable. Threads started later inherit the
    CPU of the thread that starts them; call again to re-pin.
    """
    every = set(range(os.cpu_count() or 1))
    main = threading.main_thread()
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None:
            continue
        if placement is None:
            cpus = every
        elif placement == "one":
            cpus = {0}
        else:
            cpus = {0} if thread is main else {1}
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            os.sched_setaffinity(tid, cpus)


def rss_bytes() -> int:
    """This process's resident set size, from /proc/self/statm."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_note() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, str]:
    """The facts a reader needs to judge the figures."""
    versions = {}
    for dist in ("pykka", "trio", "attrs", "msgspec", "jsonschema", "ripgrep"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "-"
    date = subprocess.run(["date"], capture_output=True, text=True, check=False).stdout.strip()
    return {
        "date": date,
        "uname": " ".join(platform.uname()),
        "cpus": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "python": sys.version.split()[0],
        "packages": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "load": load_note(),
    }


def banner(title: str) -> None:
    print()
    print(title)
    print("=" * len(title))
    print(load_note())


def _fmt(value: float, unit: str) -> str:
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit in ("us", "ms"):
        if value < 10:
            return f"{value:.2f} {unit}"
        return f"{value:,.1f} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "KB":
        return f"{value:.2f} KB"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:g} {unit}"


def print_rows(rows: list[Row], *, with_bench: bool = False) -> None:
    """Print rows as an aligned table: figure, target, PASS/MISS, notes."""
    name_w = max((len(r.name) for r in rows), default=10)
    bench_w = max((len(r.bench) for r in rows), default=5)
    for r in rows:
        status = "" if r.ok is None else ("PASS" if r.ok else "MISS")
        lead = f"{r.bench:<{bench_w}}  " if with_bench else "  "
        target = f"target {r.target}" if r.target else ""
        print(f"{lead}{r.name:<{name_w}}  {_fmt(r.value, r.unit):>14}  {target:<18} {status:<4}  {r.note}")


def summary(rows: list[Row]) -> list[Row]:
    """Print a benchmark's closing table under a ``summary`` heading, and hand the rows back."""
    print("\nsummary")
    print_rows(rows)
    return rows


def quick_main(run: Callable[..., list[Row]], doc: str | None) -> None:
    """The command line of a benchmark whose one option is ``--quick`` (fewer samples)."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    run(quick=parser.parse_args().quick)


def checkout(ref: str, prefix: str = "bench-before-") -> Path:
    """``ref`` of this repository, extracted to a temporary folder, as an importable ``weald`` tree.

    Put ``<returned folder>/pkg`` first on ``PYTHONPATH`` to import that
    commit's ``weald`` (runtime/, tools/, supervisors/) instead of this one;
    remove the folder afterwards.
    """
    repo = Path(__file__).resolve().parents[1]
    where = Path(tempfile.mkdtemp(prefix=prefix))
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    package = where / "pkg" / "weald"
    package.mkdir(parents=True)
    for name in ("runtime", "tools", "supervisors"):
        (package / name).symlink_to(where / name)
    return where


def many_sessions_files(prefix: str, n: int) -> tuple[Path, Path, Path, Path, dict[str, str]]:
    """A temporary folder for a daemon of ``n`` sessions (`start_asleep`): root, project, script, socket, env.

    The script answers "ok" to every turn; the daemon's file (``WEALD_CONFIG``
    in ``env``) puts its store in the folder and lets it hold ``n`` agents.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    project = root / "project"
    project.mkdir()
    script = root / "once.json"
    script.write_text(json.dumps({"turns": [{"text": "ok"}], "repeat": True}))
    config = root / "weald.toml"
    config.write_text(f'[store]\npath = "{root / "store.db"}"\n[limits]\nmax_agents = {max(n + 10, 20000)}\n')
    return root, project, script, root / "s.sock", dict(os.environ, WEALD_CONFIG=str(config))


def daemon_client(socket: Path, timeout: float = 120.0) -> Client:
    """A client of the daemon starting on ``socket``, once it answers ``daemon.status``."""
    from weald.runtime.daemon.client import Client

    deadline = time.monotonic() + timeout
    while True:
        try:
            client = Client.connect(socket, timeout=1)
            client.call("daemon.status", timeout=10)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        else:
            return client


def start_asleep(socket: Path, project: Path, script: Path, n: int) -> float:
    """Start ``n`` sessions asleep (ids ``a000000``...), a thousand per ``agents.start`` on 8 connections; seconds."""
    from weald.runtime.daemon.client import Client

    started = time.perf_counter()
    clients = [Client.connect(socket) for _ in range(8)]
    futures = []
    for k, first in enumerate(range(0, n, 1000)):
        starts = [
            {"working_dir": str(project), "agent_id": f"a{i:06d}", "model": f"scripted:{script}", "asleep": True}
            for i in range(first, min(n, first + 1000))
        ]
        futures.append(clients[k % len(clients)].request("agents.start", {"agents": starts}))
    for future in futures:
        assert all("result" in r for r in future.get(timeout=3600)["results"])
    for client in clients:
        client.close()
    return time.perf_counter() - started
