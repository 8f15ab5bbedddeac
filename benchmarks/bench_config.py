"""Per-project configuration: what it costs a turn, a start, and the watcher, beside the turn itself.

In one process (an embedded daemon, no socket), with P projects, each a
directory holding its own ``weald.toml``, and one session per project:

- **a turn's lookup**: what a session's agent does at each turn's start to
  learn its configuration (`_SessionSettings.__call__`: two dictionary
  lookups and a generation compare; no file is read), beside a whole
  agent turn of the same daemon (a scripted model answering at once, no
  tool call), both medians of many;
- **agent.start**: of a session in a project whose files are known and
  unchanged (its directory stat-ed in a worker thread, nothing parsed)
  beside one in a new project (the files found upward, read, parsed,
  checked and merged);
- **the watcher's pass**: one `Projects.refresh` over every project (each
  file's identity looked at in a worker thread, nothing read when nothing
  changed), the work ``/config`` does once a second; and a reload's (every
  file read, parsed and compared).

Run: ``python benchmarks/bench_config.py [--projects 1000] [--samples 20000]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from weald.runtime.daemon.config import parse_config
from weald.runtime.daemon.tree import Daemon, SessionRecord, _SessionSettings


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _project(root: Path, index: int, model: str) -> Path:
    project = root / f"p{index}"
    project.mkdir()
    rules = '[tools.permissions]\nread_file = "deny"\n'
    (project / "weald.toml").write_text(
        f'[models]\ndefault = "{model}"\n{rules}[agent]\nmax_steps = {10 + index % 7}\n'
    )
    return project


def run(projects: int = 1000, samples: int = 20000) -> dict[str, Any]:
    """Measure; returns the figures (also printed)."""
    with tempfile.TemporaryDirectory(prefix="bench-config-") as tmp:
        root = Path(tmp)
        script = root / "script.json"
        script.write_text(json.dumps({"turns": [{"text": "ok"}], "repeat": True}))
        model = f"scripted:{script}"
        config = parse_config(f'[store]\npath = "{root / "store.db"}"\n[limits]\nhibernate_after = 0\n')
        daemon = Daemon(config)
        daemon.start(restore=False)
        try:
            sessions = daemon.sessions
            assert sessions is not None
            loop = daemon.system.loop
            dirs = [_project(root, index, model) for index in range(projects)]
            figures: dict[str, Any] = {"projects": projects}

            # agent.start: a new project (read, parsed) beside a known one (stat only).
            new_starts, known_starts = [], []
            ids: list[str] = []
            for directory in dirs[: min(200, projects)]:
                began = time.perf_counter()
                ids.append(loop.run(sessions.start, str(directory)))
                new_starts.append(time.perf_counter() - began)
                began = time.perf_counter()
                ids.append(loop.run(sessions.start, str(directory)))
                known_starts.append(time.perf_counter() - began)
            for directory in dirs[min(200, projects) :]:
                ids.append(loop.run(sessions.start, str(directory)))
            figures["start_new_project_us"] = _median_us(new_starts)
            figures["start_known_project_us"] = _median_us(known_starts)

            # A turn's lookup, beside a whole turn.
            record = loop.run(sessions.stored, ids[0])
            assert isinstance(record, SessionRecord)
            settings = _SessionSettings(sessions, record)
            lookups = []
            for _ in range(samples // 1000):
                began = time.perf_counter()
                for _ in range(1000):
                    settings()
                lookups.append((time.perf_counter() - began) / 1000)
            figures["turn_lookup_us"] = _median_us(lookups)
            agent = daemon.system.whereis(f"/sessions/{ids[0]}/agent")
            assert agent is not None
            turns = []
            for _ in range(300):
                began = time.perf_counter()
                agent.proxy().prompt("hi").get().get()
                turns.append(time.perf_counter() - began)
            figures["turn_us"] = _median_us(turns)

            # The watcher's pass over every project (nothing changed), and a reload's (every file read again).
            passes, reloads = [], []
            for _ in range(10):
                began = time.perf_counter()
                loop.run(lambda: sessions.projects.refresh(report=False))
                passes.append(time.perf_counter() - began)
            for _ in range(3):
                began = time.perf_counter()
                loop.run(lambda: sessions.projects.refresh(force=True))
                reloads.append(time.perf_counter() - began)
            figures["watch_pass_ms"] = statistics.median(passes) * 1e3
            figures["reload_pass_ms"] = statistics.median(reloads) * 1e3
        finally:
            daemon.shutdown()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projects", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20000)
    args = parser.parse_args()
    figures = run(args.projects, args.samples)
    table = Table("measure", "figure")
    table.add_row("a turn's configuration lookup", f"{figures['turn_lookup_us']:.2f} us")
    table.add_row("a whole turn (scripted, no tool)", f"{figures['turn_us']:.0f} us")
    share = figures["turn_lookup_us"] / figures["turn_us"] * 100
    table.add_row("lookup / turn", f"{share:.3f} %")
    table.add_row("agent.start, new project (read + parsed)", f"{figures['start_new_project_us']:.0f} us")
    table.add_row("agent.start, known project (stat only)", f"{figures['start_known_project_us']:.0f} us")
    table.add_row(f"watcher pass over {figures['projects']} projects", f"{figures['watch_pass_ms']:.2f} ms")
    table.add_row(f"reload of {figures['projects']} projects (every file read)", f"{figures['reload_pass_ms']:.1f} ms")
    Console().print(table)


if __name__ == "__main__":
    main()
