"""Processes that outlive their daemon: kill -9 of a real daemon while its shells run, counted.

`run_leftovers` runs ``cycles`` cycles, the shell's OS sandbox on
(``sandbox = "required"``) and off in turn. In each, agents start commands
that try hard to outlive their owner (a background job that leaves its
session, ``setsid env -i bash -c 'sleep N'``, and a foreground call that
starts a ``setsid`` sleeper of its own), then the daemon is killed with
SIGKILL while they run, and started again. With the sandbox off the job
keeps its environment (``setsid bash -c ...``): a process that empties it
drops the mark the next start finds leftovers by, and only the sandbox's
PID namespace contains those (see ``weald.runtime._processes``).

Invariants:

- ``sandboxed_die_with_the_daemon``: with the sandbox on, every process of
  every call and job ends within 10 s of the kill, before any restart
  (bubblewrap's parent-death signal ends each sandbox's PID namespace);
- ``next_start_stops_the_rest``: with the sandbox off, what the daemon's
  direct children started survives the kill (nothing can reach it but its
  mark); the next start stops every one of them;
- ``leftovers_reported``: that start publishes ``daemon.leftovers_stopped``
  naming each process it stopped and no survivor (and publishes nothing
  when there was nothing to stop);
- ``restarted_daemon_serves``: the restarted daemon answers a new prompt.

The figures count the processes started, those that died with the daemon,
those the next start stopped, and the survivors (which must be none).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from daemon_harness import DaemonProcess, recent_events, sleep_tag, sleeping
from rel_store import ResourceReport
from weald.runtime.testing import wait_until

LEFTOVER_INVARIANTS = (
    "sandboxed_die_with_the_daemon",
    "next_start_stops_the_rest",
    "leftovers_reported",
    "restarted_daemon_serves",
)


def _alive(tags: list[str]) -> dict[str, list[int]]:
    return {tag: pids for tag in tags if (pids := sleeping(tag))}


def _one_cycle(root: Path, sandbox: str, agents: int, report: ResourceReport) -> None:
    config = f'[tools.permissions]\nshell = "allow"\n[tools.shell]\nsandbox = "{sandbox}"\nkill_grace = 0.5\n'
    daemon = DaemonProcess(root, extra_config=config)
    (root / "run").mkdir(exist_ok=True)
    tags: list[str] = []
    try:
        daemon.start()
        with daemon.client() as client:
            for i in range(agents):
                job, call, own = sleep_tag(), sleep_tag(), sleep_tag()
                tags += [job, call, own]
                # Only a PID namespace contains a process that empties its environment (`env -i`
                # drops the mark the next start looks for): the sandbox-off cycles keep it.
                escape = "env -i " if sandbox != "off" else ""
                background = f"setsid {escape}bash -c 'sleep {job}' & sleep 1000"
                foreground = f"setsid sleep {own} & sleep {call}"
                model = daemon.script(
                    f"a{i}",
                    [
                        {"tool_calls": [{"name": "shell", "arguments": {"command": background, "background": True}}]},
                        {"text": "job started"},
                        {"tool_calls": [{"name": "shell", "arguments": {"command": foreground}}]},
                    ],
                )
                client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": f"a{i}"})
                client.call("agent.prompt", {"agent_id": f"a{i}", "text": "start the job"}, timeout=60)
                client.request("agent.prompt", {"agent_id": f"a{i}", "text": "run the call"})
            wait_until(
                lambda: len(_alive(tags)) == len(tags),
                timeout=30,
                message=lambda: f"every command to run ({len(_alive(tags))} of {len(tags)})",
            )
        report.count("processes started", len(tags))
        daemon.kill9()
        if sandbox == "off":
            # The daemon's direct children die with it (their parent-death signal); the
            # sleepers are their children, which nothing but their mark can reach.
            survived = _alive(tags)
            report.count("survived the kill (sandbox off)", len(survived))
        else:
            with contextlib.suppress(AssertionError):  # (the check below names what outlived it)
                wait_until(lambda: not _alive(tags), timeout=10)
            survived = _alive(tags)
            report.count("died with the daemon (sandbox on)", len(tags) - len(survived))
            report.check(
                "sandboxed_die_with_the_daemon",
                [f"sleep {tag} (pids {pids}) outlived the daemon by 10 s" for tag, pids in survived.items()],
            )
        expected = {pid for pids in survived.values() for pid in pids}
        daemon.start()
        left = _alive(tags)
        report.count("stopped by the next start", len(survived) - len(left))
        report.count("survivors", len(left))
        if sandbox == "off":
            problems = [f"sleep {tag} (pids {pids}) still runs after the next start" for tag, pids in left.items()]
            if not survived:
                problems.append("nothing survived the kill: the cycle proved nothing about the next start")
            report.check("next_start_stops_the_rest", problems)
        events = recent_events(daemon, "daemon.leftovers_stopped")
        stopped = {entry["pid"] for event in events for entry in event["data"]["processes"] if entry["stopped"]}
        unreported = sorted(expected - stopped)
        problems = [f"pids {unreported} stopped but not reported"] if unreported else []
        problems += [
            f"survivors reported: {event['data']['survivors']}" for event in events if event["data"]["survivors"]
        ]
        if not expected and events:
            problems.append(f"an event with nothing to stop: {events}")
        report.check("leftovers_reported", problems)
        model = daemon.script("after", [{"text": "still here"}])
        with daemon.client() as client:
            client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "after"})
            answer = client.call("agent.prompt", {"agent_id": "after", "text": "still there?"}, timeout=60)
        report.check("restarted_daemon_serves", [] if answer.get("ok") else [f"a new prompt answered {answer}"])
        daemon.terminate()
    finally:
        daemon.close()
        for pids in _alive(tags).values():
            for pid in pids:
                os.kill(pid, signal.SIGKILL)


def run_leftovers(root: Path, *, cycles: int = 4, agents: int = 3) -> ResourceReport:
    """``cycles`` kill -9 cycles of a daemon whose ``agents`` agents run long shells, sandbox on and off in turn."""
    report = ResourceReport()
    for i in range(cycles):
        sandbox = "required" if i % 2 == 0 else "off"
        _one_cycle(root / f"cycle{i}-{sandbox}", sandbox, agents, report)
    return report
