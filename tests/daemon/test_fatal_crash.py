"""A daemon that dies of a fatal signal leaves every thread's stack in its log, and the next start says so."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from daemon_harness import DaemonProcess

STATE_LOG = "daemon.log"  # <state dir>/daemon.log; the harness's state dir is its root


def _crashing_daemon(root: Path) -> DaemonProcess:
    faults = root / "faults.toml"
    faults.write_text(
        '[[faults]]\nid = "segv"\ntarget = "actor"\nkind = "fatal_signal"\n'
        'path = "/sessions/*/agent"\nmessage = "call:prompt"\ncount = 1\n'
    )
    return DaemonProcess(root, faults=faults)


def _doctor_previous_run(daemon: DaemonProcess) -> dict[str, str]:
    done = daemon.cli("doctor", "--json")
    checks = {check["name"]: check for check in json.loads(done.stdout)["checks"]}
    return checks["previous run"]


def test_a_segfault_in_the_daemon_logs_every_threads_stack_and_the_next_start_reports_it(tmp_path: Path) -> None:
    daemon = _crashing_daemon(tmp_path)
    daemon.start()
    try:
        model = daemon.script("hello", [{"text": "hi"}])
        with daemon.client() as client:
            agent = client.call("agent.start", {"model": model, "working_dir": str(daemon.project)})["agent_id"]
        crashed_pid = daemon.proc.pid if daemon.proc is not None else 0
        daemon.cli("run", "--agent", agent, "say hi", timeout=60)  # its daemon dies under it
        assert daemon.proc is not None
        assert daemon.proc.wait(60) == -signal.SIGSEGV
        daemon.proc = None

        log = (tmp_path / STATE_LOG).read_text(errors="replace")
        crash = log[log.index(f"--- weald daemon pid {crashed_pid} started") :]
        assert "Fatal Python error: Segmentation fault" in crash
        # Every thread, each with its Python stack: the loop thread fired the fault.
        assert crash.count("Thread 0x") + crash.count("Current thread 0x") >= 3
        current = crash[crash.index("Current thread 0x") :]
        current = current[: current.index("\n\n")]
        assert 'runtime/faults.py", line' in current  # the loop thread fired the fault...
        assert "_loop.py" in current

        report = _doctor_previous_run(daemon)
        assert report["status"] == "warn"
        assert f"pid {crashed_pid}" in report["detail"]
        assert "Segmentation fault" in report["detail"]

        daemon.faults = None
        daemon.start()
        said = daemon.log.read_text(errors="replace")  # the new daemon's stderr
        assert f"weald serve: warning: the previous daemon run (pid {crashed_pid}" in said
        assert f"WARNING the previous daemon run (pid {crashed_pid}" in (tmp_path / STATE_LOG).read_text()
        with daemon.client() as client:
            previous = client.call("daemon.status")["previous_run"]
        assert previous["pid"] == crashed_pid
        assert previous["ended_by"] == "Segmentation fault"
        assert previous["log"] == str(tmp_path / STATE_LOG)
        assert _doctor_previous_run(daemon)["status"] == "warn"  # until a run stops cleanly

        assert daemon.terminate() == 0
        assert _doctor_previous_run(daemon)["status"] == "ok"
    finally:
        daemon.close()


def test_a_daemon_killed_with_sigkill_is_reported_as_killed_and_a_clean_stop_as_nothing(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path)
    daemon.start()
    try:
        killed_pid = daemon.proc.pid if daemon.proc is not None else 0
        daemon.kill9()
        assert _doctor_previous_run(daemon)["status"] == "warn"
        daemon.start()
        with daemon.client() as client:
            previous = client.call("daemon.status")["previous_run"]
        assert previous["pid"] == killed_pid
        assert previous["ended_by"] == "killed"
        assert "was killed or lost power" in previous["description"]
        assert daemon.terminate() == 0

        daemon.start()  # after a clean stop: nothing to report
        with daemon.client() as client:
            assert client.call("daemon.status")["previous_run"] is None
        assert daemon.terminate() == 0
        assert not (tmp_path / "daemon.running").exists()
    finally:
        daemon.close()
