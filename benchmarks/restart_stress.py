"""The restart hunt: a daemon killed with SIGKILL and restarted on its store, hundreds of times.

What it looks for is a daemon that dies on its own while it restores its
sessions (the SIGSEGV of issue 30, in msgspec's C code on a worker thread
building a provider). Each cycle starts ``weald serve`` (with
``PYTHONFAULTHANDLER=1``, so any fatal signal leaves every thread's stack)
on the same store, holding ``--agents`` sessions: a third on scripted models
(each its own script file), a third on an OpenAI-compatible HTTP model served
on loopback, a third on Anthropic's, so that worker threads build providers
and decode records side by side. Every session is restored awake, so each
start builds them all. The kill falls at a random moment: while the daemon
restores (most cycles) or after it answered and took a few prompts. A cycle
in which the daemon exits by itself (any status, a signal above all) is a
crash: its log is kept and printed.

It also runs the msgspec race on its own (``tests/runtime/codec_race.py``):
through weald's codec and through plain msgspec, counting crashes.

``--switch-interval 1e-6`` makes the daemons hand the GIL over a thousand
times more often than CPython's default (5 ms), which widens every race
between threads: the way to find one that a default daemon hits once in a
few hundred starts.

Run: ``python benchmarks/restart_stress.py [--cycles N] [--agents N] [--seed S] [--race-runs N]
[--switch-interval S]``.
The defaults (300 cycles of 150 sessions) take about 20 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT / "tests"))
sys.path.insert(0, str(_ROOT / "tests" / "daemon"))

from daemon_harness import DaemonProcess  # noqa: E402
from llm._server import LoopbackModel  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402
from weald.runtime.daemon.client import Client, DaemonUnavailableError  # noqa: E402


def _config(model_url: str) -> str:
    return f"""
[providers.openai]
base_url = "{model_url}/v1"
api_key_required = false

[providers.anthropic]
base_url = "{model_url}"
api_key_required = false

[limits]
hibernate_after = 3600
"""


def _populate(daemon: DaemonProcess, agents: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    entries = []
    for n in range(agents):
        kind = n % 3
        if kind == 0:
            turns = [{"text": f"answer {n}.{i}"} for i in range(rng.randint(1, 4))]
            model = daemon.script(f"s{n}", turns)
        elif kind == 1:
            model = "openai:stress-model"
        else:
            model = "anthropic:stress-model"
        entries.append({"agent_id": f"a{n}", "model": model, "working_dir": str(daemon.project)})
    with daemon.client() as client:
        for start in range(0, len(entries), 500):
            client.call("agents.start", {"agents": entries[start : start + 500]}, timeout=300)
        # Every session awake at the next start: each restore builds every provider.
        for entry in entries:
            if entry["model"].startswith("scripted:"):
                client.call("agent.prompt", {"agent_id": entry["agent_id"], "text": "hi"}, timeout=60)
    return [e["agent_id"] for e in entries if e["model"].startswith("scripted:")]


def _answering(daemon: DaemonProcess) -> bool:
    try:
        with Client.connect(daemon.socket, timeout=1) as client:
            client.call("daemon.status", timeout=5)
    except (DaemonUnavailableError, OSError):
        return False
    return True


def _widen_races(root: Path, interval: float) -> None:
    """Make every daemon started from here hand the GIL over each ``interval`` seconds (a sitecustomize)."""
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.setswitchinterval({interval!r})\n")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def run(cycles: int, agents: int, seed: int, console: Console, switch_interval: float | None) -> dict[str, object]:
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    crashes: list[str] = []
    restore_seconds: list[float] = []
    with tempfile.TemporaryDirectory(prefix="weald-restart-stress-") as tmp, LoopbackModel() as model:
        root = Path(tmp)
        daemon = DaemonProcess(root, extra_config=_config(model.server.url))
        os.environ["PYTHONFAULTHANDLER"] = "1"
        if switch_interval is not None:
            _widen_races(root, switch_interval)
        daemon.start()
        scripted = _populate(daemon, agents, seed)
        daemon.kill9()
        # How long a full restore takes, to place the kills inside it.
        began = time.monotonic()
        daemon.start()
        full = time.monotonic() - began
        daemon.kill9()
        with Progress(
            TextColumn("kill -9 and restart"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[crashes]} crashes"),
            console=console,
        ) as progress:
            task = progress.add_task("cycles", total=cycles, crashes=0)
            for cycle in range(cycles):
                during_restore = rng.random() < 0.75
                delay = rng.uniform(0.05, full) if during_restore else 0.0
                serve = [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(daemon.socket)]
                with daemon.log.open("ab") as log:
                    proc = subprocess.Popen(serve, env=daemon.env(), stdout=log, stderr=log, cwd=daemon.project)
                began = time.monotonic()
                deadline = began + (delay if during_restore else 300.0)
                died = None
                while time.monotonic() < deadline:
                    if proc.poll() is not None:
                        died = proc.returncode
                        break
                    if not during_restore and _answering(daemon):
                        restore_seconds.append(time.monotonic() - began)
                        for agent in rng.sample(scripted, min(3, len(scripted))):
                            with daemon.client() as client:
                                client.call("agent.prompt", {"agent_id": agent, "text": "again"}, timeout=60)
                        break
                    time.sleep(0.02)
                if died is None and proc.poll() is not None:
                    died = proc.returncode
                if died is not None:
                    outcomes["died by itself"] += 1
                    name = signal.Signals(-died).name if died < 0 else f"exit {died}"
                    tail = daemon.log.read_text(errors="replace")[-6000:]
                    crashes.append(f"cycle {cycle}: {name}\n{tail}")
                else:
                    proc.kill()
                    proc.wait(30)
                    outcomes["killed while restoring" if during_restore else "killed after serving"] += 1
                daemon.log.write_text("")  # one cycle's output at a time
                progress.update(task, advance=1, crashes=len(crashes))
    return {
        "cycles": cycles,
        "agents": agents,
        "full_restore_s": round(full, 2),
        "restore_s_median": round(sorted(restore_seconds)[len(restore_seconds) // 2], 2) if restore_seconds else None,
        "outcomes": dict(outcomes),
        "crashes": crashes,
    }


def race(runs: int) -> dict[str, Counter[str]]:
    """The msgspec race on its own: ``runs`` processes each way, 200 rounds each."""
    script = _ROOT / "tests" / "runtime" / "codec_race.py"
    results: dict[str, Counter[str]] = {}
    for mode in ("plain", "weald"):
        tally: Counter[str] = Counter()
        for _ in range(runs):
            done = subprocess.run(
                [sys.executable, str(script), mode, "200"], capture_output=True, text=True, timeout=300, check=False
            )
            code = done.returncode
            tally["survived" if code == 0 else (signal.Signals(-code).name if code < 0 else f"exit {code}")] += 1
        results[mode] = tally
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300, help="kill -9 and restart cycles")
    parser.add_argument("--agents", type=int, default=150, help="sessions restored at each start")
    parser.add_argument("--race-runs", type=int, default=10, help="processes of the msgspec race, each way")
    parser.add_argument("--seed", type=int, default=30, help="where the kills fall")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="the daemon's GIL switch interval (sys.setswitchinterval): 1e-6 widens thread races a thousandfold",
    )
    args = parser.parse_args()
    console = Console(highlight=False)
    began = time.monotonic()
    races = race(args.race_runs)
    report = run(args.cycles, args.agents, args.seed, console, args.switch_interval)
    table = Table(title="weald restart hunt")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for mode, tally in races.items():
        table.add_row(f"msgspec race through {mode} ({args.race_runs} x 200 rounds)", json.dumps(dict(tally)))
    table.add_row("cycles (sessions restored each)", f"{report['cycles']} ({report['agents']})")
    table.add_row("daemon's GIL switch interval, s", str(args.switch_interval or sys.getswitchinterval()))
    table.add_row(
        "full restore, s (first / median later)", f"{report['full_restore_s']} / {report['restore_s_median']}"
    )
    outcomes = report["outcomes"]
    assert isinstance(outcomes, dict)
    for name, count in sorted(outcomes.items()):
        table.add_row(name, str(count))
    console.print(table)
    load = os.getloadavg()
    console.print(
        f"{platform.platform()}, {os.cpu_count()} CPUs, load {load[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M')}; "
        f"{time.monotonic() - began:.0f} s"
    )
    crashes = report["crashes"]
    assert isinstance(crashes, list)
    for crash in crashes:
        console.print(crash, markup=False)
    return 1 if crashes or races["weald"]["survived"] != args.race_runs else 0


if __name__ == "__main__":
    sys.exit(main())
