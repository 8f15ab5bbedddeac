"""The store and its disk, through a real daemon: a full disk, tool output floods, a second daemon."""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from weald.runtime.daemon import DaemonError
from weald.runtime.daemon.tree import lock_state_dir
from weald.runtime.testing import fill_disk, wait_until


def integrity(store: Path) -> list[tuple[str]]:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def task_titles(client: Any, project: Path) -> list[str]:
    return [t["title"] for t in client.call("tasks.list", {"working_dir": str(project)}, timeout=30)["tasks"]]


def insert(title: str) -> dict[str, Any]:
    return {"name": "tasks", "arguments": {"action": "insert", "title": title}}


@pytest.fixture
def on_tmpfs(tmp_path: Path, tmpfs: Callable[[str], Path]) -> Iterator[tuple[DaemonProcess, Path]]:
    """A daemon whose state directory (store and spill files) is a real 3 MB tmpfs."""
    state = tmpfs("3m")
    d = DaemonProcess(tmp_path)
    d.config.write_text(
        f'[store]\npath = "{state / "store.db"}"\n[server]\nsocket = "{d.socket}"\n'
        '[tools.permissions]\nshell = "allow"\n'
        # 1 MiB of the 3 stays free for the store; one call saves at most 256 KiB.
        "[spill]\nmin_free_bytes = 1048576\nmax_call_bytes = 262144\n"
    )
    try:
        yield d, state
    finally:
        d.close()


def test_a_full_disk_never_loses_an_acknowledged_turn_and_writes_resume_when_space_returns(
    on_tmpfs: tuple[DaemonProcess, Path],
) -> None:
    d, state = on_tmpfs
    store = state / "store.db"
    d.start()
    flood = d.script(
        "flood",
        [
            {"text": "flooding", "tool_calls": [{"name": "shell", "arguments": {"command": "yes | head -c 20M"}}]},
            {"text": "saving", "tool_calls": [insert("kept before")]},
            {"text": "flooded"},
            {"text": "saving again", "tool_calls": [insert("kept after")]},
            {"text": "saved"},
        ],
    )
    idle = d.script("idle", [{"text": "still here"}, {"text": "still here after the restart"}])
    with d.client() as c:
        c.call("agent.start", {"working_dir": str(d.project), "model": flood, "agent_id": "flood"}, timeout=60)
        c.call("agent.start", {"working_dir": str(d.project), "model": idle, "agent_id": "bystander"}, timeout=60)

        # 20 MB of output on a 3 MB disk: the spill file stops at its limit, the store keeps its space.
        first = c.call("agent.prompt", {"agent_id": "flood", "text": "flood it"}, timeout=120)
        assert first["ok"], first
        shell_result = c.call("agent.history", {"agent_id": "flood"})["messages"][2]["content"]
        assert "holds the first 262,144 bytes only, as one call saves at most 256 KiB (spill.max_call_bytes)" in (
            shell_result
        )
        assert free_bytes(state) > 1024 * 1024
        assert task_titles(c, d.project) == ["kept before"]

        # Now the disk fills up for real: the turn is not acknowledged as ok, and says why.
        filler = fill_disk(state)
        second = c.call("agent.prompt", {"agent_id": "flood", "text": "save more"}, timeout=60)
        assert not second["ok"]
        assert f"no space left on the device holding {state}" in second["error"]
        agents = {a["agent_id"]: a for a in c.call("agent.list")}
        assert agents["flood"]["state"] == "idle"  # nobody died of it
        # Never prompted, so asleep: listed from its stored record, which the full disk does not hide.
        assert agents["bystander"]["state"] == "hibernated"
        assert integrity(store) == [("ok",)]
        status = c.call("daemon.status")
        assert status["store_write_failure"].startswith(f"no space left on the device holding {state}")

        # Space returns: writes work again, no restart needed.
        filler.unlink()
        assert c.call("agent.prompt", {"agent_id": "bystander", "text": "hello"}, timeout=60)["ok"]
        assert c.call("daemon.status")["store_write_failure"] is None
        assert integrity(store) == [("ok",)]
    assert d.terminate() == 0

    d.start()  # everything acknowledged is still there after a restart
    with d.client() as c:
        history = c.call("agent.history", {"agent_id": "flood"})["messages"]
        contents = [m["content"] for m in history]
        assert contents[-1] == "save more"  # the failed turn's prompt, kept and saved once space returned
        assert not any("[interrupted]" in text for text in contents)
        # The turn the full disk stopped never called the model: its script resumes where it really is.
        third = c.call("agent.prompt", {"agent_id": "flood", "text": "save more, again"}, timeout=60)
        assert third["ok"], third
        assert third["text"] == "saved"
        assert task_titles(c, d.project) == ["kept before", "kept after"]
        assert c.call("agent.prompt", {"agent_id": "bystander", "text": "hi"}, timeout=60)["ok"]
    assert d.terminate() == 0
    assert integrity(store) == [("ok",)]


def serve(d: DaemonProcess, socket: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(socket)],
        env=d.env(),
        cwd=d.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_daemon_on_the_same_store_exits_at_once_naming_the_first(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    try:
        d.start()
        assert d.proc is not None
        other = tmp_path / "other" / "weald.sock"
        second = serve(d, other)  # another socket, the same store
        try:
            _, stderr = second.communicate(timeout=60)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate(timeout=30)
        assert second.returncode == 1
        assert stderr.strip() == (
            f"weald serve: another weald daemon (pid {d.proc.pid}) is using {tmp_path}; its store "
            f"{tmp_path / 'store.db'} serves one daemon at a time: stop that daemon first, or give this one "
            "another [store] path"
        )
        assert not other.exists()
        # weald run finds no daemon on that socket and starts one of its own: refused the same way.
        run = d.cli("run", "hello", "--socket", str(other))
        assert run.returncode == 1
        assert run.stderr.startswith(f"weald run: another weald daemon (pid {d.proc.pid}) is using {tmp_path}")
        assert "Traceback" not in run.stderr
        with d.client() as c:  # the first serves on
            assert c.call("daemon.status")["pid"] == d.proc.pid
        # kill -9 leaves the socket behind and the lock with the dead process: the next daemon starts.
        d.kill9()
        assert d.socket.exists()
        d.start()
        assert d.terminate() == 0
    finally:
        d.close()


def test_of_two_daemons_started_together_on_one_store_exactly_one_serves(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    procs = [serve(d, tmp_path / f"run{i}" / "weald.sock") for i in range(2)]
    try:
        wait_until(
            lambda: any(p.poll() is not None for p in procs), timeout=60, message="one of the daemons to give up"
        )
        lost = next(p for p in procs if p.poll() is not None)
        won = next(p for p in procs if p is not lost)
        _, stderr = lost.communicate(timeout=10)
        assert lost.returncode == 1
        assert f"another weald daemon (pid {won.pid}) is using {tmp_path}" in stderr
        winner = tmp_path / f"run{procs.index(won)}" / "weald.sock"
        wait_until(winner.exists, timeout=60, message="the other daemon to serve")
        assert won.poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate(timeout=30)
    assert won.returncode == 0


def test_a_stopped_sessions_spill_files_are_removed_and_orphans_swept_at_start(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config='[tools.permissions]\nshell = "allow"\n[spill]\nretention = 0\n')
    spill = tmp_path / "weald-outputs"
    try:
        d.start()
        model = d.script(
            "long",
            [{"text": "", "tool_calls": [{"name": "shell", "arguments": {"command": "seq 1 100000"}}]}, {"text": "ok"}],
        )
        with d.client() as c:
            for agent_id in ("keep", "gone"):
                c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": agent_id}, timeout=60)
                assert c.call("agent.prompt", {"agent_id": agent_id, "text": "go"}, timeout=60)["ok"]
            assert [p.name for p in (spill / "gone").iterdir()]  # its shell output was spilled
            assert c.call("agent.stop", {"agent_id": "gone"}, timeout=60)["stopped"]
            assert not (spill / "gone").exists()
            assert (spill / "keep").is_dir()
        (spill / "orphan").mkdir()
        (spill / "orphan" / "shell-x.log").write_text("left by a session the store no longer runs")
        assert d.terminate() == 0
        d.start()  # retention 0: the orphan goes at once; an active session keeps its files
        assert sorted(p.name for p in spill.iterdir()) == ["keep"]
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_daemon_refused_in_the_moment_before_the_owner_writes_its_pid_still_names_the_owner(tmp_path: Path) -> None:
    # The owner takes the lock, then writes its pid into the file: a second daemon
    # coming in between read an empty file and said "pid unknown".
    store = tmp_path / "store.db"
    holder = os.open(tmp_path / "store.db.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # held, and the file still empty
        with pytest.raises(DaemonError, match=rf"another weald daemon \(pid {os.getpid()}\) is using {tmp_path}"):
            lock_state_dir(store)
    finally:
        os.close(holder)
    os.close(lock_state_dir(store))  # released with its descriptor
