"""The reliability report: chaos schedules, kill -9 cycles, a fuzz burst and a load burst, with every invariant counted.

What it measures is not speed but whether weald keeps its promises under
faults, and how often it was put to the test:

- chaos: seeded fault schedules (actor crashes and delays, tool crashes,
  hangs, delays and subprocess kills, provider errors, stalls and malformed
  streams) against scripted agents doing real tool work in an in-process
  system, and against random supervision trees (checked against a model of
  OTP and replayed); faults fired by kind, restarts, escalations;
- crash: a real ``weald serve`` killed with SIGKILL at seeded points of a
  write-heavy run, restarted each time; acknowledged writes verified;
- fuzz: random bytes and wrong requests to every method of the JSON-RPC
  server of one real daemon; sent, answered, error codes;
- load: a thousand concurrent clients for a bounded time; requests, answers,
  requests per second, and the daemon's RSS before, at its peak and after;
- fd flood: a real ``weald serve`` under ``prlimit --nofile=1024`` flooded by
  2,000 clients at once, twice: with the default ``limits.max_connections``
  and with the limit above the descriptor limit, so that the daemon runs out
  of descriptors; clients served and refused (by the limit each refusal
  names), spells without descriptors, seconds until a new client is served;
- partial-line flood: 60 connections each sending 15 MB of one line and never
  ending it; connections refused and held, the input buffered at most against
  ``limits.max_buffered_bytes``, the daemon's RSS before and at its peak;
- disk full: the state directory on a real 8 MB tmpfs, filled and freed
  round after round under agents that flood their shells and insert tasks;
- second daemon: daemons started on the store of one taking acknowledged
  inserts, then a kill -9;
- blocking path: ``agent.start`` with FIFO, device, huge and missing scripts
  in bursts while another client times ``daemon.status`` (these three in
  ``tests/reliability/rel_store.py``);
- leftovers: kill -9 of a real daemon while its agents' shells run commands
  that leave their session (``setsid``, ``env -i``), the shell's sandbox on
  and off in turn; processes that died with the daemon, that the next start
  stopped and reported, and survivors (``tests/reliability/rel_leftovers.py``);
- guard: attacks on the rules that judge an agent and on what its sandbox
  hides, through a real daemon (plant ``weald.toml`` and skills, rewrite an
  imported ``.mcp.json``, make git run code on the host, read hidden paths
  of a project under ``/tmp``, overwrite the store, swap a recording's
  directory for a link), by the shell, the file tools and the recorder;
  attacks tried and refused (``tests/reliability/rel_guard.py``);
- rule attacks: the shell permission rules talked around (text bash expands
  a second time, programs that run another, ``.git/config`` rewritten into
  ``git status``), each run by a real bash and then decided, and command
  lines drawn from a generator of nested quoting and expansion forms
  (whatever bash ran unallowed must not be allowed); escapes printed to the
  terminal; secrets known by their shape in MCP configs; attacks tried and
  refused (``tests/reliability/rel_rules.py``);
- soak: agents with a small context window prompting continuously on a real
  daemon; prompts, compactions, and the daemon's memory, which must level off
  (the long version is ``benchmarks/bench_soak.py``).

Each part checks the invariants of its test suite (``tests/reliability``,
whose helpers it runs) and the report counts how many were checked and how
many held. The exit code is 1 if any did not hold.

Run: ``python benchmarks/reliability.py [--schedules N] [--trees N] [--crash-cycles N]
[--fuzz N] [--clients N] [--load-seconds S] [--flood-clients N] [--nofile N]
[--line-connections N] [--line-mb MB] [--disk-full-rounds N] [--second-daemons N]
[--blocking-rounds N] [--leftover-cycles N] [--rule-examples N] [--soak-agents N] [--soak-seconds S]
[--seed S]``, as root (the disk-full part mounts a tmpfs). The defaults take four to five minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_TESTS = Path(__file__).resolve().parents[1] / "tests"
for _directory in (_TESTS / "reliability", _TESTS / "supervisors", _TESTS / "daemon", _TESTS / "tools"):
    sys.path.insert(0, str(_directory))

import msgspec  # noqa: E402
from daemon_harness import DaemonProcess  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rel_chaos import InvariantCheck, escalating_plan, random_plan, run_chaos  # noqa: E402
from rel_crash import run_crash_cycles  # noqa: E402
from rel_front import run_fd_flood, run_line_flood  # noqa: E402
from rel_fuzz import FuzzClient  # noqa: E402
from rel_guard import run_guard  # noqa: E402
from rel_leftovers import run_leftovers  # noqa: E402
from rel_load import run_load  # noqa: E402
from rel_rules import run_rule_attacks  # noqa: E402
from rel_soak import run_soak  # noqa: E402
from rel_store import run_blocking_paths, run_disk_full, run_second_daemons  # noqa: E402
from rel_strategies import fuzz_methods, pings, raw_lines, seeds, tree_faults, trees, wrong_requests  # noqa: E402
from rel_trees import run_tree_chaos  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


class Tally:
    """Invariant checks by name (checked, held) and the details of those that broke."""

    def __init__(self) -> None:
        self.checked: Counter[str] = Counter()
        self.held: Counter[str] = Counter()
        self.broken: list[str] = []

    def add(self, part: str, checks: Iterable[InvariantCheck], context: str = "") -> None:
        for check in checks:
            key = f"{part}: {check.name}"
            self.checked[key] += 1
            if check.held:
                self.held[key] += 1
            else:
                self.broken.append(f"{key} ({context}): {check.detail}")

    def add_one(self, part: str, name: str, held: bool, detail: str = "") -> None:
        self.add(part, [InvariantCheck(name, held, detail)])


def run_schedules(count: int, seed: int, tally: Tally, console: Console) -> dict[str, Any]:
    """Seeded chaos schedules against scripted agents."""
    faults: Counter[str] = Counter()
    restarts = escalations = prompts = ok = 0
    for i in range(count):
        # One schedule in twenty drives a session supervisor past its restart intensity.
        if i % 20 == 19:
            plan = escalating_plan(seed + i)
        else:
            plan = random_plan(random.Random(seed + i), sessions=3, prompts=5, faults=4)
        report = run_chaos(plan)
        tally.add("chaos", report.checks, f"schedule {i}, seed {seed + i}")
        faults.update(report.faults_by_kind)
        restarts += report.restarts
        escalations += report.escalations
        prompts += len(report.prompts)
        ok += sum(1 for p in report.prompts if p.result is not None and p.result.ok)
        if report.failures:
            console.print(report.summary(), markup=False)
    return {
        "schedules": count,
        "faults": faults,
        "restarts": restarts,
        "escalations": escalations,
        "prompts": prompts,
        "ok": ok,
    }


def run_trees(count: int, seed: int, tally: Tally) -> dict[str, Any]:
    """Random supervision trees crashed by seeded faults, against the OTP model, each replayed."""
    totals: dict[str, Any] = {"trees": 0, "faults": Counter(), "crashes": 0, "escalations": 0}

    @hypothesis_seed(seed)
    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    # Without lazy workers: the workload pings running workers only (as tests/reliability/test_chaos.py).
    @given(tree=trees(lazy=False), faults=tree_faults(), fault_seed=seeds, picks=pings)
    def one(tree: Any, faults: Any, fault_seed: int, picks: list[int]) -> None:
        report = run_tree_chaos(tree, faults, fault_seed, picks)
        tally.add("trees", report.checks, f"tree {tree!r}, faults {faults!r}, seed {fault_seed}")
        totals["trees"] += 1
        totals["faults"].update(report.faults_by_kind)
        totals["crashes"] += report.restarts
        totals["escalations"] += int(report.escalated)

    one()
    return totals


def run_fuzz(count: int, seed: int, root: Path, tally: Tally) -> dict[str, Any]:
    """A burst of random bytes and wrong requests to one real daemon."""
    daemon = DaemonProcess(root)
    daemon.start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    try:
        with FuzzClient(daemon.socket) as client:

            @hypothesis_seed(seed)
            @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(data=st.data())
            def one(data: st.DataObject) -> None:
                if data.draw(st.integers(0, 3)) == 0:
                    client.exchange(data.draw(raw_lines))
                else:
                    request = data.draw(st.sampled_from(fuzz_methods()).flatmap(wrong_requests))
                    client.exchange(msgspec.json.encode(request), request, what=f"{request!r:.200}")

            one()
            tally.add_one("fuzz", "connection_carries_on", client.probe()["pid"] == pid)
            tally.add_one(
                "fuzz", "replies_well_formed_no_internal_error", not client.problems, "; ".join(client.problems[:3])
            )
            tally.add_one("fuzz", "every_request_due_an_answer_answered", client.due == client.answered)
            figures = {"sent": client.sent, "raw": client.raw, "due": client.due, "answered": client.answered}
        tally.add_one("fuzz", "daemon_same_pid", daemon.proc.poll() is None)
        daemon.terminate()
    finally:
        daemon.close()
    return {**figures, "codes": client.codes}


def machine() -> str:
    """Python, OS and CPU count, for the report."""
    import os

    return (
        f"{platform.python_implementation()} {platform.python_version()}, {platform.platform()}, {os.cpu_count()} CPUs"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=80, help="seeded chaos schedules against agents")
    parser.add_argument("--trees", type=int, default=100, help="random supervision trees under seeded faults")
    parser.add_argument("--crash-cycles", type=int, default=3, help="kill -9 cycles of a real daemon")
    parser.add_argument("--fuzz", type=int, default=1500, help="fuzz requests to a real daemon")
    parser.add_argument("--clients", type=int, default=1000, help="concurrent clients of the load burst")
    parser.add_argument("--load-seconds", type=float, default=20.0, help="how long the load lasts")
    parser.add_argument("--flood-clients", type=int, default=2000, help="clients of each fd flood")
    parser.add_argument("--nofile", type=int, default=1024, help="the daemon's descriptor limit in the fd flood")
    parser.add_argument("--line-connections", type=int, default=60, help="connections of the partial-line flood")
    parser.add_argument("--line-mb", type=float, default=15.0, help="MB each of them sends of its unfinished line")
    parser.add_argument("--disk-full-rounds", type=int, default=5, help="times the store's disk is filled and freed")
    parser.add_argument("--second-daemons", type=int, default=20, help="daemons started on a store in use")
    parser.add_argument("--blocking-rounds", type=int, default=10, help="bursts of agent.start with bad scripts")
    parser.add_argument("--leftover-cycles", type=int, default=4, help="kill -9 cycles with shells running")
    parser.add_argument("--soak-agents", type=int, default=20, help="agents prompting continuously in the soak")
    parser.add_argument("--soak-seconds", type=float, default=60.0, help="how long the soak lasts")
    parser.add_argument("--rule-examples", type=int, default=200, help="generated command lines against the rules")
    parser.add_argument("--seed", type=int, default=2025, help="the seed everything derives from")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # hypothesis outside pytest warns about its database and settings
    console = Console(highlight=False, width=110)
    tally = Tally()
    began = time.monotonic()
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="weald-reliability-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        chaos = run_schedules(args.schedules, args.seed, tally, console)
        timings["chaos"] = time.monotonic() - started
        started = time.monotonic()
        tree_totals = run_trees(args.trees, args.seed, tally)
        timings["trees"] = time.monotonic() - started
        started = time.monotonic()
        crash = run_crash_cycles(root / "crash", cycles=args.crash_cycles, seed=args.seed)
        tally.add("crash", crash.checks, f"seed {args.seed}, kill points {crash.kill_points}")
        timings["crash"] = time.monotonic() - started
        started = time.monotonic()
        fuzz = run_fuzz(args.fuzz, args.seed, root / "fuzz", tally)
        timings["fuzz"] = time.monotonic() - started
        started = time.monotonic()
        load = run_load(root / "load", clients=args.clients, seconds=args.load_seconds, seed=args.seed)
        tally.add("load", load.checks)
        timings["load"] = time.monotonic() - started
        started = time.monotonic()
        floods = {
            "capped": run_fd_flood(root / "fd-capped", clients=args.flood_clients, nofile=args.nofile),
            # A connection limit far above the descriptor limit: the daemon runs out of descriptors.
            "out of fds": run_fd_flood(
                root / "fd-out", clients=args.flood_clients, nofile=args.nofile, max_connections=1 << 20
            ),
        }
        for name, flood in floods.items():
            tally.add("fd flood", flood.checks, name)
        timings["fd flood"] = time.monotonic() - started
        started = time.monotonic()
        lines = run_line_flood(root / "lines", connections=args.line_connections, line_mb=args.line_mb)
        tally.add("line flood", lines.checks)
        timings["line flood"] = time.monotonic() - started
        resources = {}
        for part, run in (
            ("disk full", lambda where: run_disk_full(where, rounds=args.disk_full_rounds)),
            ("second daemon", lambda where: run_second_daemons(where, attempts=args.second_daemons)),
            ("blocking path", lambda where: run_blocking_paths(where, rounds=args.blocking_rounds)),
            ("leftovers", lambda where: run_leftovers(where, cycles=args.leftover_cycles)),
            ("guard", run_guard),
            ("rule attacks", lambda where: run_rule_attacks(where, examples=args.rule_examples, seed=args.seed)),
        ):
            started = time.monotonic()
            resources[part] = run(root / part.replace(" ", "-"))
            tally.add(part, resources[part].checks)
            timings[part] = time.monotonic() - started
        started = time.monotonic()
        soak = run_soak(
            root / "soak", agents=args.soak_agents, seconds=args.soak_seconds, interval=args.soak_seconds / 12
        )
        tally.add("soak", soak.checks)
        timings["soak"] = time.monotonic() - started

    table = Table(title="weald reliability report", show_lines=False)
    table.add_column("part")
    table.add_column("figure")
    table.add_column("value", justify="right")
    faults = chaos["faults"]
    table.add_row("chaos", "schedules run (agents)", str(chaos["schedules"]))
    table.add_row("", "prompts (answered ok / in all)", f"{chaos['ok']} / {chaos['prompts']}")
    for kind, n in sorted(faults.items()):
        table.add_row("", f"faults injected: {kind}", str(n))
    table.add_row("", "restarts", str(chaos["restarts"]))
    table.add_row("", "escalations (supervisor gave up)", str(chaos["escalations"]))
    table.add_row("trees", "trees run (each replayed)", str(tree_totals["trees"]))
    for kind, n in sorted(tree_totals["faults"].items()):
        table.add_row("", f"faults injected: {kind}", str(n))
    table.add_row("", "crashes restarted or escalated", str(tree_totals["crashes"]))
    table.add_row("", "escalations (the top gave up)", str(tree_totals["escalations"]))
    table.add_row(
        "crash", "kill -9 cycles (kill after N acknowledged turns)", f"{len(crash.kill_points)} {crash.kill_points}"
    )
    table.add_row("", "acknowledged turns / agents", f"{crash.acked_turns} / {crash.acked_agents}")
    table.add_row("", "acknowledged writes verified", str(crash.verified_writes))
    table.add_row("fuzz", "lines sent (garbage lines among them)", f"{fuzz['sent']} ({fuzz['raw']})")
    table.add_row("", "requests due an answer / answered", f"{fuzz['due']} / {fuzz['answered']}")
    table.add_row("", "error codes", ", ".join(f"{c}: {n}" for c, n in sorted(fuzz["codes"].items())))
    table.add_row("load", "clients (most connections open at once)", f"{load.clients} ({load.peak_connections})")
    table.add_row("", "connections served", str(load.connections))
    table.add_row("", "requests sent / answered", f"{load.sent} / {load.answered}")
    table.add_row("", "requests/s (measured, not a target)", f"{load.requests_per_second:.0f}")
    table.add_row(
        "", "RSS MB before / peak / after", f"{load.rss_before:.1f} / {load.rss_peak:.1f} / {load.rss_after:.1f}"
    )
    for name, flood in floods.items():
        table.add_row(
            "fd flood" if name == "capped" else "",
            f"{name}: clients (daemon's nofile; max_connections)",
            f"{flood.clients} ({flood.nofile}; {flood.max_connections or 'default'})",
        )
        refused = ", ".join(f"{limit}: {n}" for limit, n in sorted(flood.refused.items())) or "none"
        table.add_row("", f"{name}: served / refused (by limit)", f"{flood.served} / {refused}")
        table.add_row(
            "", f"{name}: unanswered / closed without a word", f"{flood.unanswered} / {flood.closed_without_a_word}"
        )
        table.add_row(
            "",
            f"{name}: spells out of fds (lines logged)",
            f"{flood.fd_exhaustions} ({flood.warnings_logged})",
        )
        table.add_row(
            "",
            f"{name}: flood s / s until a new client is served",
            f"{flood.flood_seconds:.1f} / {flood.recovery_seconds:.2f}",
        )
    table.add_row(
        "line flood",
        "connections x MB of one unfinished line",
        f"{lines.connections} x {lines.line_mb:g}",
    )
    table.add_row("", "refused (limits.max_buffered_bytes) / held", f"{lines.refused} / {lines.held}")
    table.add_row("", "MB buffered at most / budget", f"{lines.buffered_peak_mb:.1f} / {lines.budget_mb:g}")
    table.add_row(
        "", "RSS MB before / peak / after", f"{lines.rss_before:.1f} / {lines.rss_peak:.1f} / {lines.rss_after:.1f}"
    )
    for part, report in resources.items():
        for i, (figure, value) in enumerate(report.figures.items()):
            table.add_row(part if i == 0 else "", figure, str(value))
    table.add_row("soak", "agents / seconds (window, tokens)", f"{soak.agents} / {soak.seconds:.0f} ({soak.window:,})")
    table.add_row("", "prompts answered ok / failed", f"{soak.prompts} / {soak.failed}")
    table.add_row("", "compactions (largest context, tokens)", f"{soak.compactions} ({soak.largest_context:,})")
    first, second = soak.growth()
    table.add_row("", "RSS MB added, first half / second half", f"{first:.1f} / {second:.1f}")
    checked = sum(tally.checked.values())
    held = sum(tally.held.values())
    table.add_row("all", "invariants checked / held", f"{checked} / {held}")
    console.print(table)

    invariants = Table(title="invariants")
    invariants.add_column("invariant")
    invariants.add_column("checked", justify="right")
    invariants.add_column("held", justify="right")
    for name in sorted(tally.checked):
        invariants.add_row(name, str(tally.checked[name]), str(tally.held[name]))
    console.print(invariants)
    console.print(
        f"{machine()}; {time.monotonic() - began:.0f} s in all ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
        + ")"
    )
    if tally.broken:
        console.print(f"[red]{len(tally.broken)} invariant checks did not hold:[/red]")
        for line in tally.broken[:50]:
            console.print(f"  {line}", markup=False)
        return 1
    console.print("[green]every invariant held[/green]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
