"""The daemon with many agents: start time, memory per agent, turns per second, prompt latency.

For N = 100, 1,000 and 10,000 agents (``--sizes`` to change), against a real
``weald serve`` process on a Unix socket:

- time to start N agents (``agent.start`` pipelined over 8 connections,
  ``"asleep": false``: each session built at once; with ``--start-asleep``,
  ``"asleep": true``: each added hibernated, built by its first prompt);
- RSS per agent: the daemon's VmRSS growth divided by N, right after the
  starts (sessions awake) and, with ``--hibernate-after S``, once every
  session has hibernated (``daemon.status`` counts them);
- turns per second across N concurrent agents (each one scripted turn with a
  ``read_file`` tool call: two model steps, one supervised tool call); with
  hibernation on, every turn first wakes its session; peak RSS meanwhile;
- ``agent.prompt`` latency through the socket for a one-step scripted turn,
  p50 and p99 over sequential prompts, next to the floor: a JSON line echoed
  by a bare trio server on a Unix socket in the same run, and the ratio;
- with hibernation on, the same prompt to an agent that hibernated just
  before (``p50 asleep``): the difference is the wake-up cost through the
  socket (restoring the session's three actors and its history from the store);
- with ``--restart`` (and hibernation on), the daemon is then stopped cleanly
  and a new one started on the same store: its RSS once the N sessions are
  restored asleep (they are never woken on the way), and the first prompt of
  100 of them, each waking one restored session.

With ``--starts batch --restart``, the batch-started daemon is then stopped
cleanly and started again on its store (hibernation on): the time until all N
are restored asleep, the RSS then, and 100 of the sample prompted.

With ``--starts`` (``--starts awake,asleep,batch``), only the start path, one
fresh daemon per way, side by side in one run: N ``agent.start`` pipelined
over 8 connections with ``"asleep": false`` (every session's actors built),
then with ``"asleep": true`` (the session added hibernated, built by its
first message), then ``agents.start`` requests of 1,000 asleep starts each
(all sent at once); each way's time, its ratio to the first, RSS, and a
sample of the sessions each prompted once (a one-turn script): sequential
prompts give the first prompt's latency (for asleep sessions: the wake plus
the turn), then pipelined ones the turns per second.

Run: ``python benchmarks/bench_daemon.py [--sizes 100,1000,10000] [--samples 300]
[--hibernate-after 1] [--restart] [--starts awake,asleep,batch]``. ``PYTHONPATH`` pointing at another checkout's
``pkg/`` measures that one (see README.md), for side-by-side figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import trio
from rich.console import Console
from rich.table import Table
from weald.runtime.daemon.client import Client


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """The process's resident set (``VmHWM``: its peak so far), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


class DaemonRun:
    def __init__(self, root: Path, hibernate_after: float | None) -> None:
        self.root = root
        self.project = root / "project"
        self.project.mkdir()
        (self.project / "note.txt").write_text("a note\n")
        self.socket = root / "s.sock"
        config = root / "weald.toml"
        limits = "[limits]\nmax_agents = 2000000\n"
        if hibernate_after is not None:
            limits += f"hibernate_after = {hibernate_after}\n"
        config.write_text(f'[store]\npath = "{root / "store.db"}"\n{limits}')
        self.env = dict(os.environ, WEALD_CONFIG=str(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(self.socket)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with Client.connect(self.socket, timeout=1) as client:
                    client.call("daemon.status", timeout=5)
                    return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError("daemon did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(300)


def script(root: Path, name: str, turns: list[dict], *, repeat: bool = False) -> str:
    path = root / f"{name}.json"
    path.write_text(json.dumps({"turns": turns, "repeat": repeat}))
    return f"scripted:{path}"


def spread(clients: list[Client], n: int, method: str, params_of, window: int = 4096) -> list:
    """Pipeline ``n`` requests over the connections, at most ``window`` unanswered at a time."""
    futures: list = []
    results: list = []
    for i in range(n):
        futures.append(clients[i % len(clients)].request(method, params_of(i)))
        if len(futures) - len(results) >= window:
            results.append(futures[len(results)].get(timeout=1800))
    results.extend(f.get(timeout=1800) for f in futures[len(results) :])
    return results


def connect(run: DaemonRun) -> tuple[list[Client], int]:
    """8 clients on the running daemon, and its RSS (KiB) once they settled: the base for per-agent figures."""
    assert run.proc is not None
    clients = [Client.connect(run.socket) for _ in range(8)]
    time.sleep(0.5)
    return clients, rss_kib(run.proc.pid)


def wait_hibernated(client: Client, n: int, timeout: float = 1800) -> float:
    t0 = time.perf_counter()
    while client.call("daemon.status", timeout=60)["hibernated"] < n:
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError("the sessions did not hibernate")
        time.sleep(0.2)
    return time.perf_counter() - t0


def measure(
    n: int,
    samples: int,
    work: Path,
    hibernate_after: float | None,
    prompt_sample: int | None = None,
    restart: bool = False,
    start_asleep: bool = False,
) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(dir=work))
    run = DaemonRun(root, hibernate_after)
    turn_model = script(
        root,
        "turn",
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]},
            {"text": "done"},
        ],
        repeat=True,  # (a restart's sample prompts them again)
    )
    run.start()
    try:
        clients, base = connect(run)
        t0 = time.perf_counter()
        spread(
            clients,
            n,
            "agent.start",
            # Built at once (as before starts were asleep by default) unless --start-asleep:
            # --starts compares the ways.
            lambda i: {
                "working_dir": str(run.project),
                "model": turn_model,
                "agent_id": f"a{i}",
                "asleep": start_asleep,
            },
        )
        start_s = time.perf_counter() - t0
        after = rss_kib(run.proc.pid)
        asleep = after
        if hibernate_after is not None:
            wait_hibernated(clients[0], n)
            asleep = rss_kib(run.proc.pid)
        peak = [0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.05):
                peak[0] = max(peak[0], rss_kib(run.proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        # Every agent answers a prompt, or (--prompt-sample) every k-th one, k = n / sample.
        step = max(1, n // prompt_sample) if prompt_sample else 1
        ids = list(range(0, n, step))
        results = spread(clients, len(ids), "agent.prompt", lambda i: {"agent_id": f"a{ids[i]}", "text": "go"})
        turns_s = (time.perf_counter() - t0) * n / len(ids)
        sampling.set()
        sampler.join()
        assert all(r["ok"] for r in results)
        peak_kib = max(peak[0], rss_kib(run.proc.pid))
        wakes = min(samples, 20) if hibernate_after is not None else 0
        latency_model = script(root, "latency", [{"text": "ok"}] * (samples + 10 + wakes))
        clients[0].call("agent.start", {"working_dir": str(run.project), "model": latency_model, "agent_id": "lat"})
        for _ in range(10):
            clients[0].call("agent.prompt", {"agent_id": "lat", "text": "warm up"})
        lat = []
        for _ in range(samples):
            t = time.perf_counter()
            clients[0].call("agent.prompt", {"agent_id": "lat", "text": "one step"})
            lat.append(time.perf_counter() - t)
        lat.sort()
        asleep_lat = []
        if hibernate_after is not None:
            for _ in range(wakes):
                wait_hibernated(clients[0], n + 1)
                t = time.perf_counter()
                clients[0].call("agent.prompt", {"agent_id": "lat", "text": "wake"})
                asleep_lat.append(time.perf_counter() - t)
        for c in clients:
            c.close()
        restored_kib = restored_p50 = float("nan")
        if restart:
            # A clean stop and a new daemon on the same store: the sessions come back asleep.
            run.stop()
            run.start()
            with Client.connect(run.socket) as client:
                wait_hibernated(client, n + 1)
                time.sleep(0.5)
                restored_kib = (rss_kib(run.proc.pid) - base) / n
                woken = []
                for i in range(0, n, max(1, n // 100)):
                    t = time.perf_counter()
                    assert client.call("agent.prompt", {"agent_id": f"a{i}", "text": "again"}, timeout=120)["ok"]
                    woken.append(time.perf_counter() - t)
                restored_p50 = statistics.median(woken) * 1e3
        return {
            "n": n,
            "start_s": start_s,
            "rss_base_mib": base / 1024,
            "rss_after_mib": after / 1024,
            "rss_asleep_per_agent_kib": (asleep - base) / n,
            "rss_peak_mib": peak_kib / 1024,
            "rss_per_agent_kib": (after - base) / n,
            "asleep_p50_ms": statistics.median(asleep_lat) * 1e3 if asleep_lat else float("nan"),
            "turns_per_s": n / turns_s,
            "p50_ms": statistics.median(lat) * 1e3,
            "p99_ms": lat[int(len(lat) * 0.99) - 1] * 1e3,
            "restored_per_agent_kib": restored_kib,
            "restored_rss_mib": base / 1024 + restored_kib * n / 1024,
            "restored_p50_ms": restored_p50,
        }
    finally:
        run.stop()
        shutil.rmtree(root, ignore_errors=True)


def measure_starts(n: int, way: str, work: Path, samples: int, restart: bool = False) -> dict[str, float]:
    """Start ``n`` agents one way (awake, asleep, batch), then prompt a sample of them once.

    With ``restart`` (batch only), the daemon is then stopped cleanly and
    started again on its store, hibernation on: the time until every session
    is restored asleep, RSS then, and 100 of them prompted (each a wake).
    """
    root = Path(tempfile.mkdtemp(dir=work))
    run = DaemonRun(root, 600.0 if restart else None)
    model = script(root, "once", [{"text": "ok"}], repeat=True)
    run.start()
    try:
        clients, base = connect(run)
        cpu0 = proc_cpu_s(run.proc.pid)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        if way == "batch":
            size = min(1000, -(-n // len(clients)))  # at most 1,000 a request, spread over the connections
            project = str(run.project)

            def batch(first: int) -> list[dict[str, object]]:
                return [
                    {"working_dir": project, "model": model, "agent_id": f"a{i}", "asleep": True}
                    for i in range(first, min(n, first + size))
                ]

            # At most 64 requests unanswered (a million starts are not all encoded at once by this client).
            futures: list = []
            refused: list = []
            answered = 0
            for k, first in enumerate(range(0, n, size)):
                futures.append(clients[k % len(clients)].request("agents.start", {"agents": batch(first)}))
                while len(futures) - answered >= 64:
                    refused += [e for e in futures[answered].get(timeout=1800)["results"] if "error" in e]
                    answered += 1
            for future in futures[answered:]:
                refused += [e for e in future.get(timeout=1800)["results"] if "error" in e]
            assert not refused, refused[:3]
        else:
            asleep = way == "asleep"
            spread(
                clients,
                n,
                "agent.start",
                lambda i: {"working_dir": str(run.project), "model": model, "agent_id": f"a{i}", "asleep": asleep},
            )
        start_s = time.perf_counter() - t0
        cpu_s = proc_cpu_s(run.proc.pid) - cpu0
        after = rss_kib(run.proc.pid)
        peak = rss_kib(run.proc.pid, "VmHWM")
        status = clients[0].call("daemon.status")
        # A random sample: half prompted one by one (for an asleep one, the wake and the turn), half pipelined.
        chosen = random.Random(29).sample(range(n), min(n, samples))
        first = []
        for i in chosen[::2]:
            t = time.perf_counter()
            assert clients[0].call("agent.prompt", {"agent_id": f"a{i}", "text": "go"})["ok"]
            first.append(time.perf_counter() - t)
        ids = chosen[1::2]
        t0 = time.perf_counter()
        results = spread(clients, len(ids), "agent.prompt", lambda i: {"agent_id": f"a{ids[i]}", "text": "go"})
        turns_s = len(ids) / (time.perf_counter() - t0)
        assert all(r["ok"] for r in results)
        for c in clients:
            c.close()
        restored: dict[str, float] = {}
        if restart:
            run.stop()
            t0 = time.perf_counter()
            run.start()
            with Client.connect(run.socket) as client:
                while client.call("daemon.status", timeout=60)["hibernated"] < n:
                    time.sleep(0.1)
                restored["restore_s"] = time.perf_counter() - t0
                restored["restored_rss_mib"] = rss_kib(run.proc.pid) / 1024
                restored["restored_peak_mib"] = rss_kib(run.proc.pid, "VmHWM") / 1024
                woken = []
                for i in chosen[:100]:
                    t = time.perf_counter()
                    assert client.call("agent.prompt", {"agent_id": f"a{i}", "text": "again"}, timeout=120)["ok"]
                    woken.append(time.perf_counter() - t)
                restored["restored_p50_ms"] = statistics.median(woken) * 1e3
        return {
            **restored,
            "start_s": start_s,
            "cpu_s": cpu_s,
            "rss_base_mib": base / 1024,
            "rss_after_mib": after / 1024,
            "rss_peak_mib": peak / 1024,
            "hibernated": status["hibernated"],
            "first_p50_ms": statistics.median(first) * 1e3,
            "first_n": len(first),
            "turns_per_s": turns_s,
            "load": load,
        }
    finally:
        run.stop()
        shutil.rmtree(root, ignore_errors=True)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare_starts(sizes: list[int], ways: list[str], samples: int, console: Console, restart: bool = False) -> None:
    """The start ways side by side (``--starts``), one fresh daemon each, ratios to the first way."""
    work = Path(tempfile.mkdtemp(prefix="weald-bench-"))
    try:
        table = Table(
            "agents",
            "way",
            "start N (s)",
            "per agent (ms)",
            "vs first",
            "daemon CPU (s)",
            "RSS base→after (MiB)",
            "peak (MiB)",
            "asleep",
            "first prompt p50 (ms)",
            "turns/s (sample)",
            "load",
        )
        for n in sizes:
            first = None
            for way in ways:
                r = measure_starts(n, way, work, samples, restart and way == "batch")
                first = first or r["start_s"]
                table.add_row(
                    f"{n:,}",
                    way,
                    f"{r['start_s']:.2f}",
                    f"{r['start_s'] / n * 1e3:.3f}",
                    f"{first / r['start_s']:.2f}x",
                    f"{r['cpu_s']:.1f}",
                    f"{r['rss_base_mib']:.0f}→{r['rss_after_mib']:.0f}",
                    f"{r['rss_peak_mib']:.0f}",
                    f"{r['hibernated']:,}",
                    f"{r['first_p50_ms']:.2f} ({r['first_n']})",
                    f"{r['turns_per_s']:.0f}",
                    f"{r['load']:.1f}",
                )
                console.print(f"done N={n} {way}: {r['start_s']:.2f} s (load {os.getloadavg()[0]:.1f})")
                if "restore_s" in r:
                    console.print(
                        f"  after a clean restart: {n:,} restored asleep in {r['restore_s']:.1f} s, RSS "
                        f"{r['restored_rss_mib']:.0f} MiB (peak {r['restored_peak_mib']:.0f}), a restored agent's "
                        f"first prompt p50 {r['restored_p50_ms']:.2f} ms"
                    )
        console.print(table)
        console.print("target: 10,000 agents started in < 5 s through the socket")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def raw_socket_floor(samples: int, work: Path) -> float:
    """Median round trip of one JSON line through a bare trio server on a Unix socket."""
    path = work / "raw.sock"
    ready = threading.Event()
    stop = threading.Event()

    async def serve() -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX)
        await sock.bind(str(path))
        sock.listen()
        listener = trio.SocketListener(sock)
        ready.set()

        async def echo(stream: trio.SocketStream) -> None:
            buf = b""
            async with stream:
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        request = msgspec.json.decode(line)
                        await stream.send_all(
                            msgspec.json.encode({"jsonrpc": "2.0", "id": request["id"], "result": {}}) + b"\n"
                        )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, echo, [listener])
            await trio.to_thread.run_sync(stop.wait)
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    ready.wait(10)
    with Client.connect(path) as client:
        for _ in range(50):
            client.call("x")
        lat = []
        for _ in range(samples):
            t = time.perf_counter()
            client.call("x")
            lat.append(time.perf_counter() - t)
    stop.set()
    thread.join(5)
    return statistics.median(lat) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--hibernate-after", type=float, default=None, help="limits.hibernate_after (default: off)")
    parser.add_argument("--prompt-sample", type=int, default=None, help="prompt only this many of the N agents")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="then stop the daemon cleanly, start a new one on the store (its sessions restored asleep; "
        "needs --hibernate-after, or --starts batch) and measure it, 100 of them prompted",
    )
    parser.add_argument(
        "--starts",
        default=None,
        help="compare only the ways to start N agents, side by side: awake, asleep, batch (comma-separated)",
    )
    parser.add_argument(
        "--start-asleep",
        action="store_true",
        help='start the agents with "asleep": true (added hibernated; needs --hibernate-after)',
    )
    args = parser.parse_args()
    if args.start_asleep and args.hibernate_after is None:
        parser.error("--start-asleep needs --hibernate-after")
    sizes = [int(s) for s in args.sizes.split(",")]
    console = Console(width=180)
    if args.starts:
        compare_starts(sizes, args.starts.split(","), min(args.samples, 1000), console, args.restart)
        return
    work = Path(tempfile.mkdtemp(prefix="weald-bench-"))
    try:
        floor = raw_socket_floor(args.samples, work)
        table = Table(
            "agents",
            "start N (s)",
            "per agent (ms)",
            "RSS base→after (MiB)",
            "RSS/agent (KiB)",
            "asleep (KiB)",
            "peak (MiB)",
            "turns/s",
            "prompt p50 (ms)",
            "p99 (ms)",
            "p50 / raw socket",
            "p50 asleep (ms)",
        )
        for n in sizes:
            load = os.getloadavg()[0]
            r = measure(
                n, args.samples, work, args.hibernate_after, args.prompt_sample, args.restart, args.start_asleep
            )
            table.add_row(
                f"{n:,}",
                f"{r['start_s']:.1f}",
                f"{r['start_s'] / n * 1e3:.2f}",
                f"{r['rss_base_mib']:.0f}→{r['rss_after_mib']:.0f}",
                f"{r['rss_per_agent_kib']:.1f}",
                f"{r['rss_asleep_per_agent_kib']:.1f}" if args.hibernate_after is not None else "-",
                f"{r['rss_peak_mib']:.0f}",
                f"{r['turns_per_s']:.0f}",
                f"{r['p50_ms']:.2f}",
                f"{r['p99_ms']:.2f}",
                f"{r['p50_ms'] / floor:.1f}x",
                f"{r['asleep_p50_ms']:.2f}" if args.hibernate_after is not None else "-",
            )
            console.print(f"done N={n} (load {load:.1f} -> {os.getloadavg()[0]:.1f})")
            if args.restart:
                console.print(
                    f"  after a restart, {n:,} restored asleep: RSS {r['restored_rss_mib']:.0f} MiB "
                    f"({r['restored_per_agent_kib']:.1f} KiB each over the base), "
                    f"a restored agent's first prompt p50 {r['restored_p50_ms']:.2f} ms"
                )
        console.print(table)
        console.print(f"raw socket floor (bare trio JSON-line echo, same client): p50 {floor:.3f} ms")
        console.print(
            "targets: 100,000 agents under 1 GiB RSS (<= 10 KiB each), 10,000 under 150 MiB, "
            "10,000 started in < 5 s, a wake-up < 2 ms"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
