"""Resource faults of the store and of request paths, against real daemons: each run counts its invariants.

- `run_disk_full`: the state directory on a real 8 MB tmpfs; agents flood their
  shells and insert tasks, the disk is filled and freed round after round.
  Invariants: ``spill_spares_the_store`` (every turn that floods its shell
  still commits), ``no_ok_turn_while_full`` (every turn while the disk is full ends
  not ok, naming the cause), ``agents_stay_running``,
  ``writes_resume_without_restart``, ``integrity_ok`` (checked while it
  runs) and ``acknowledged_tasks_survive`` (after a restart).
- `run_second_daemons`: while one daemon takes acknowledged task inserts,
  other daemons are started on its store. Invariants: ``second_refused``
  (each exits 1 at once naming the first's pid, and binds nothing),
  ``acknowledged_inserts_survive`` (after a restart) and
  ``lock_released_by_kill_9`` (a daemon starts after the first is killed,
  its stale socket replaced).
- `run_blocking_paths`: ``agent.start`` with scripts that are FIFOs nobody
  writes, devices, huge or missing files, in bursts, while another client
  times ``daemon.status``. Invariants: ``bad_script_refused``,
  ``status_answered_meanwhile`` (every status within a second),
  ``rss_flat`` and ``no_blocking_call_on_the_loop`` (the daemon runs under
  the loop guard, ``WEALD_LOOP_GUARD=1``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
from daemon_harness import DaemonProcess
from rel_chaos import InvariantCheck
from weald.runtime.daemon.client import Client, RPCCallError
from weald.runtime.testing import LOOP_GUARD_ENV, fill_disk

STORE_INVARIANTS = (
    "spill_spares_the_store",
    "no_ok_turn_while_full",
    "agents_stay_running",
    "writes_resume_without_restart",
    "integrity_ok",
    "acknowledged_tasks_survive",
)
SECOND_DAEMON_INVARIANTS = ("second_refused", "acknowledged_inserts_survive", "lock_released_by_kill_9")
BLOCKING_INVARIANTS = ("bad_script_refused", "status_answered_meanwhile", "rss_flat", "no_blocking_call_on_the_loop")

_MiB = 1024 * 1024


@attrs.define
class ResourceReport:
    """Figures of one run, and its invariant checks."""

    figures: dict[str, Any] = attrs.field(factory=dict)
    checks: list[InvariantCheck] = attrs.field(factory=list)

    @property
    def failures(self) -> list[InvariantCheck]:
        """The invariants that did not hold."""
        return [c for c in self.checks if not c.held]

    def check(self, name: str, problems: list[str]) -> None:
        """Record one invariant check."""
        self.checks.append(InvariantCheck(name, not problems, "; ".join(problems[:5])))

    def count(self, name: str, by: int = 1) -> None:
        """Add to a figure."""
        self.figures[name] = self.figures.get(name, 0) + by


def _integrity(store: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    return [] if rows == [("ok",)] else [f"integrity_check: {rows[:3]}"]


def _tasks(client: Client, project: Path) -> list[str]:
    return [t["title"] for t in client.call("tasks.list", {"working_dir": str(project)}, timeout=60)["tasks"]]


def _insert(title: str) -> dict[str, Any]:
    return {"name": "tasks", "arguments": {"action": "insert", "title": title}}


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        msg = f"the disk-full run needs a real tmpfs (run as root): mount failed: {done.stderr.strip()}"
        raise RuntimeError(msg)
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


# -- a full disk ---------------------------------------------------------------------------------


def run_disk_full(root: Path, *, rounds: int = 5, agents: int = 3) -> ResourceReport:
    """Fill and free an 8 MB state directory ``rounds`` times under ``agents`` flooding, inserting agents.

    Spilling keeps 4 MiB free (``spill.min_free_bytes``): the store of this
    run grows to about 2 MB (each flood leaves 50 KB of output in a history,
    and SQLite writes each page twice, to its WAL and back), so a smaller
    reserve would let the spill files take space the store needs, which is
    what the reserve is for (its default is 256 MiB).
    """
    report = ResourceReport()
    with _tmpfs(root / "state", "8m") as state:
        daemon = DaemonProcess(root)
        daemon.config.write_text(
            f'[store]\npath = "{state / "store.db"}"\n[server]\nsocket = "{daemon.socket}"\n'
            '[tools.permissions]\nshell = "allow"\n[spill]\nmin_free_bytes = 4194304\nmax_call_bytes = 262144\n'
        )
        names = [f"d{i}" for i in range(agents)]
        acked: list[str] = []
        try:
            daemon.start()
            with daemon.client() as client:
                for name in names:
                    turns: list[dict[str, Any]] = []
                    for r in range(rounds):
                        flood = {"name": "shell", "arguments": {"command": "yes | head -c 20M"}}
                        turns += [{"tool_calls": [flood, _insert(f"{name} before {r}")]}, {"text": "flooded"}]
                        turns += [{"tool_calls": [_insert(f"{name} after {r}")]}, {"text": "saved"}]
                    model = daemon.script(name, turns)
                    client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": name})
                for r in range(rounds):
                    _disk_full_round(daemon, client, state, names, r, acked, report)
            daemon.terminate()
            daemon.start()
            with daemon.client() as client:
                found = set(_tasks(client, daemon.project))
            report.check(
                "acknowledged_tasks_survive",
                [f"task {t!r} was acknowledged, then lost" for t in acked if t not in found],
            )
            report.figures["tasks acknowledged / found after restart"] = f"{len(acked)} / {len(found & set(acked))}"
            daemon.terminate()
        finally:
            daemon.close()
    return report


def _disk_full_round(
    daemon: DaemonProcess,
    client: Client,
    state: Path,
    names: list[str],
    r: int,
    acked: list[str],
    report: ResourceReport,
) -> None:
    store = state / "store.db"
    starved: list[str] = []
    for name in names:  # each floods 20 MB through shell and inserts a task: the spill files must leave room
        result = client.call("agent.prompt", {"agent_id": name, "text": f"flood {r}"}, timeout=180)
        if result["ok"]:
            acked.append(f"{name} before {r}")
            report.count("turns ok")
        else:
            starved.append(f"{name} round {r}: {result['error']}")
    report.check("spill_spares_the_store", starved)
    spilled = sum(f.stat().st_size for f in (state / "weald-outputs").rglob("*") if f.is_file())
    report.figures["spill files MB (8 MB disk, 4 MB kept free)"] = round(spilled / _MiB, 2)
    filler = fill_disk(state)
    refused: list[str] = []
    for name in names:
        result = client.call("agent.prompt", {"agent_id": name, "text": f"while full {r}"}, timeout=60)
        if result["ok"] or "no space left on the device holding" not in (result["error"] or ""):
            refused.append(f"{name} round {r}: {result}")
        else:
            report.count("turns refused for space")
    report.check("no_ok_turn_while_full", refused)
    states = {a["agent_id"]: a.get("state") for a in client.call("agent.list")}
    report.check("agents_stay_running", [f"{n} is {states.get(n)}" for n in names if states.get(n) != "idle"])
    report.check("integrity_ok", _integrity(store))
    report.count("integrity checks")
    filler.unlink()
    resumed: list[str] = []
    for name in names:  # the script's next turn is the insert the full disk kept from running
        result = client.call("agent.prompt", {"agent_id": name, "text": f"after {r}"}, timeout=60)
        if result["ok"] and result["text"] == "saved":
            acked.append(f"{name} after {r}")
            report.count("turns ok")
        else:
            resumed.append(f"{name} round {r}: {result}")
    report.check("writes_resume_without_restart", resumed)
    report.check("integrity_ok", _integrity(store))
    report.count("integrity checks")
    report.count("rounds")


# -- a second daemon -----------------------------------------------------------------------------


def _serve(daemon: DaemonProcess, socket: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(socket)],
        env=daemon.env(),
        cwd=daemon.project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_second_daemons(root: Path, *, attempts: int = 20, inserts: int = 50) -> ResourceReport:
    """Start ``attempts`` daemons on the store of a daemon taking ``inserts`` acknowledged task inserts."""
    report = ResourceReport()
    daemon = DaemonProcess(root)
    acked: list[str] = []
    try:
        daemon.start()
        assert daemon.proc is not None
        first_pid = daemon.proc.pid
        model = daemon.script(
            "inserter",
            [turn for i in range(inserts) for turn in ({"tool_calls": [_insert(f"task {i}")]}, {"text": "ok"})],
        )
        done = threading.Event()

        def insert_all() -> None:
            with daemon.client() as client:
                client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "ins"})
                for i in range(inserts):
                    if client.call("agent.prompt", {"agent_id": "ins", "text": f"insert {i}"}, timeout=60)["ok"]:
                        acked.append(f"task {i}")
            done.set()

        worker = threading.Thread(target=insert_all, name="inserter")
        worker.start()
        refused: list[str] = []
        slowest = 0.0
        for i in range(attempts):
            other = root / f"other{i}" / "weald.sock"
            began = time.monotonic()
            second = _serve(daemon, other)
            try:
                _, stderr = second.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                second.kill()
                second.communicate(timeout=30)
                refused.append(f"attempt {i}: still running after 60 s")
                continue
            slowest = max(slowest, time.monotonic() - began)
            expected = f"another weald daemon (pid {first_pid}) is using {root}"
            if second.returncode != 1 or expected not in stderr or other.exists():
                refused.append(f"attempt {i}: exit {second.returncode}, {stderr.strip()[:200]!r}")
            else:
                report.count("second daemons refused")
        report.count("second daemons started", attempts)
        report.figures["slowest refusal (s, process start included)"] = round(slowest, 2)
        report.check("second_refused", refused)
        worker.join(600)
        daemon.terminate()
        daemon.start()
        with daemon.client() as client:
            found = set(_tasks(client, daemon.project))
        report.check("acknowledged_inserts_survive", [f"{t!r} lost" for t in acked if t not in found])
        report.figures["inserts acknowledged / found after restart"] = f"{len(acked)} / {len(found & set(acked))}"
        daemon.kill9()
        problems = [] if daemon.socket.exists() else ["kill -9 left no socket behind to replace"]
        try:
            daemon.start()
        except AssertionError as exc:
            problems.append(f"no daemon could start after kill -9: {exc}")
        report.check("lock_released_by_kill_9", problems)
        daemon.terminate()
    finally:
        daemon.close()
    return report


# -- blocking paths ------------------------------------------------------------------------------


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_blocking_paths(root: Path, *, rounds: int = 10, burst: int = 25) -> ResourceReport:
    """Bursts of ``agent.start`` with scripts that must not be waited on, while ``daemon.status`` is timed."""
    report = ResourceReport()
    previous = os.environ.get(LOOP_GUARD_ENV)
    os.environ[LOOP_GUARD_ENV] = "1"  # the daemon names any blocking call on its loop in its log
    daemon = DaemonProcess(root)
    try:
        daemon.start()
        assert daemon.proc is not None
        bad = _bad_scripts(root)
        rss_before = _rss(daemon.proc.pid)
        latencies: list[float] = []
        stop = threading.Event()

        def time_status() -> None:
            with daemon.client() as client:
                while not stop.is_set():
                    began = time.monotonic()
                    client.call("daemon.status", timeout=30)
                    latencies.append(time.monotonic() - began)

        timer = threading.Thread(target=time_status, name="status timer")
        timer.start()
        wrong: list[str] = []
        try:
            with daemon.client() as client:
                for _ in range(rounds):
                    pending = [
                        (
                            expected,
                            client.request(
                                "agent.start", {"working_dir": str(daemon.project), "model": f"scripted:{path}"}
                            ),
                        )
                        for path, expected in bad
                        for _ in range(max(1, burst // len(bad)))
                    ]
                    for expected, request in pending:
                        try:
                            request.get(timeout=60)
                            wrong.append(f"started with a script that is {expected}")
                        except RPCCallError as exc:
                            if expected not in exc.message:
                                wrong.append(f"{exc.message[:200]!r} does not say {expected!r}")
                            else:
                                report.count("bad scripts refused")
        finally:
            stop.set()
            timer.join(60)
        report.check("bad_script_refused", wrong)
        slow = [f"{t:.2f} s" for t in latencies if t > 1.0]
        report.check(
            "status_answered_meanwhile", [f"{len(slow)} of {len(latencies)} took over 1 s: {slow[:5]}"] if slow else []
        )
        report.count("status calls", len(latencies))
        report.figures["slowest status (ms)"] = round(max(latencies, default=0.0) * 1000, 1)
        rss_after = _rss(daemon.proc.pid)
        report.figures["RSS MB before / after"] = f"{rss_before / _MiB:.1f} / {rss_after / _MiB:.1f}"
        report.check(
            "rss_flat", [] if rss_after < rss_before + 64 * _MiB else [f"RSS grew {rss_before} -> {rss_after}"]
        )
        daemon.terminate()
        blocking = [line for line in daemon.log.read_text().splitlines() if "blocking call on the trio loop" in line]
        report.check("no_blocking_call_on_the_loop", blocking)
        daemon.log.write_text("")  # reported here; the harness would raise on it again at close
    finally:
        daemon.close()
        if previous is None:
            os.environ.pop(LOOP_GUARD_ENV, None)
        else:
            os.environ[LOOP_GUARD_ENV] = previous
    return report


def _bad_scripts(root: Path) -> list[tuple[Path, str]]:
    """Paths a script must not be read from, each with what the refusal says."""
    fifo = root / "script.fifo"
    os.mkfifo(fifo)
    huge = root / "huge.json"
    with huge.open("wb") as f:
        f.truncate(1 << 30)  # sparse
    return [
        (fifo, "is a FIFO (named pipe), not a regular file"),
        (Path("/dev/zero"), "is a character device, not a regular file"),
        (huge, "is larger than 16,777,216 bytes"),
        (root, "is a directory, not a regular file"),
        (root / "missing.json", "No such file or directory"),
    ]
