"""What weald keeps (histories, tasks, tokens, outputs, logs) is its user's alone, whatever the umask.

A real daemon, started under ``umask 022`` on a state directory that does
not exist yet, runs an agent whose shell output is long enough to be
spilled to files; then every directory it made is 0700 and every file 0600
(the store, its WAL and SHM, the lock, the log, the spill files), except
inside the sandbox's ``/tmp`` of the session (0700 itself), which holds what
the commands make. ``weald
doctor`` warns about a state directory made before, with wider permissions.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess

pytestmark = pytest.mark.usefixtures("bubblewrap")

UMASK_022 = ("sh", "-c", 'umask 022; exec "$@"', "sh")


def test_a_new_state_directory_and_everything_in_it_are_owner_only_under_umask_022(tmp_path: Path) -> None:
    state = tmp_path / "home" / "state"
    daemon = DaemonProcess(tmp_path)
    daemon.config.write_text(
        f'[store]\npath = "{state / "store.db"}"\n[server]\nsocket = "{daemon.socket}"\n'
        '[tools.permissions]\nshell = "allow"\n'
    )
    (tmp_path / "run").mkdir()
    try:
        daemon.start(wrapper=UMASK_022)
        model = daemon.script("spiller", [{"tool_calls": [{"name": "shell", "arguments": {"command": "seq 1 40000"}}]}])
        with daemon.client() as client:
            client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "spiller"})
            client.call("agent.prompt", {"agent_id": "spiller", "text": "go"}, timeout=120)
            history = client.call("agent.history", {"agent_id": "spiller"})["messages"]
        assert "full output" in history[2]["content"]  # it was spilled to a file
        made = {path: os.lstat(path) for path in [state, *state.rglob("*")]}
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    names = {p.name for p in made}
    assert {"store.db", "store.db-wal", "store.db-shm", "store.db.lock", "daemon.log"} <= names
    assert any(p.suffix in (".log", ".txt") and "weald-outputs" in p.parts for p in made)  # spill files
    # The sandbox's /tmp of the session is the commands' own (what they make there, and the mount
    # points bubblewrap makes for the project under /tmp, have their modes); the directory is 0700.
    session_tmp = state / "weald-outputs" / "spiller" / "tmp"
    assert stat.S_IMODE(made[session_tmp].st_mode) == 0o700
    ours = {p: s for p, s in made.items() if session_tmp not in p.parents}
    wide = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(s.st_mode)) for p, s in ours.items() if s.st_mode & 0o077}
    assert wide == {}
    assert stat.S_IMODE(made[state].st_mode) == 0o700
    assert stat.S_IMODE(made[state / "store.db"].st_mode) == 0o600


def _doctor(config: Path) -> dict[str, dict[str, str]]:
    env = dict(os.environ, WEALD_CONFIG=str(config))
    done = subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return {check["name"]: check for check in json.loads(done.stdout)["checks"]}


def test_doctor_warns_about_a_state_directory_others_may_read_and_says_how_to_close_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # made by an older weald, under umask 022
    (state / "store.db").write_text("")
    (state / "store.db").chmod(0o644)
    config = tmp_path / "weald.toml"
    config.write_text(f'[store]\npath = "{state / "store.db"}"\n[server]\nsocket = "{tmp_path / "weald.sock"}"\n')
    check = _doctor(config)["state permissions"]
    assert check["status"] == "warn"
    assert f"{state} (755)" in check["detail"]
    assert f"{state / 'store.db'} (644)" in check["detail"]
    assert f"chmod 700 {state}" in check["fix"]
    assert f"chmod 600 {state / 'store.db'}" in check["fix"]
    state.chmod(0o700)
    (state / "store.db").chmod(0o600)
    assert _doctor(config)["state permissions"]["status"] == "ok"
