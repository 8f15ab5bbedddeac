"""One daemon, many projects: each session runs under its own project's configuration.

A real ``weald serve`` started in one project (A, with no ``weald.toml``),
and ``weald run`` / ``agent.start`` in others, each with its own rules and
model; the daemon must judge every session by its own project's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from weald.runtime.daemon.client import RPCCallError

SECRET = "the launch code is 0000"


def write_script(path: Path, turns: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted:{path}"


def reading_project(root: Path, name: str, *, permission: str, answer: str) -> Path:
    """A project whose model reads ``secret.txt`` then says ``answer``, with ``read_file = permission``."""
    project = root / name
    project.mkdir(parents=True)
    (project / "secret.txt").write_text(SECRET + "\n")
    model = write_script(
        project / "scripts" / "model.json",
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "secret.txt"}}]},
            {"text": answer},
        ],
    )
    (project / "weald.toml").write_text(
        f'[models]\ndefault = "{model}"\n[tools.permissions]\nread_file = "{permission}"\n'
    )
    return project


def weald(daemon: DaemonProcess, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``weald ARGS`` run in ``cwd`` against the module's daemon."""
    env = dict(daemon.env(), WEALD_SOCKET=str(daemon.socket))
    return subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def tool_results(daemon: DaemonProcess, agent_id: str) -> list[str]:
    with daemon.client() as client:
        history = client.call("agent.history", {"agent_id": agent_id}, timeout=30)
    return [m["content"] for m in history["messages"] if m["role"] == "tool"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon for the module, started in its own project (A), which has no weald.toml."""
    proc = DaemonProcess(tmp_path_factory.mktemp("daemon"))
    proc.start()
    try:
        yield proc
        assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A directory outside the daemon's tree, for other projects."""
    return tmp_path


def test_a_run_in_another_project_is_judged_by_that_projects_rules_and_uses_its_model(
    daemon: DaemonProcess, elsewhere: Path
) -> None:
    project = reading_project(elsewhere, "b", permission="deny", answer="B's model answered")
    run = weald(daemon, "run", "--json", "read secret.txt", cwd=project)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["text"] == "B's model answered"
    (refusal,) = tool_results(daemon, result["agent_id"])
    assert "read_file is not allowed here" in refusal
    assert SECRET not in run.stdout + run.stderr + refusal


def test_a_project_below_its_weald_toml_is_configured_by_it(daemon: DaemonProcess, elsewhere: Path) -> None:
    project = reading_project(elsewhere, "c", permission="deny", answer="C's model answered")
    deeper = project / "src" / "pkg"
    deeper.mkdir(parents=True)
    (deeper / "secret.txt").write_text(SECRET + "\n")
    run = weald(daemon, "run", "--json", "read secret.txt", cwd=deeper)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["text"] == "C's model answered"
    (refusal,) = tool_results(daemon, result["agent_id"])
    assert "read_file is not allowed here" in refusal


def test_project_names_whose_rules_apply_wherever_the_command_runs(daemon: DaemonProcess, elsewhere: Path) -> None:
    project = reading_project(elsewhere, "d", permission="deny", answer="D's model answered")
    outside = elsewhere / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    run = weald(daemon, "run", "--json", "--project", str(project), "read secret.txt", cwd=outside)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["text"] == "D's model answered"
    (refusal,) = tool_results(daemon, result["agent_id"])
    assert "read_file is not allowed here" in refusal


def test_an_allowing_project_is_not_held_to_another_projects_deny(daemon: DaemonProcess, elsewhere: Path) -> None:
    denying = reading_project(elsewhere, "e", permission="deny", answer="E")
    allowing = reading_project(elsewhere, "f", permission="allow", answer="F read it")
    assert weald(daemon, "run", "--json", "read", cwd=denying).returncode == 0
    run = weald(daemon, "run", "--json", "read secret.txt", cwd=allowing)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["text"] == "F read it"
    (read,) = tool_results(daemon, result["agent_id"])
    assert SECRET in read


def test_agent_start_records_the_files_it_used_and_every_view_shows_them(
    daemon: DaemonProcess, elsewhere: Path
) -> None:
    project = reading_project(elsewhere, "g", permission="deny", answer="G")
    toml = project / "weald.toml"
    digest = "sha256:" + hashlib.sha256(toml.read_bytes()).hexdigest()
    with daemon.client() as client:
        agent_id = client.call("agent.start", {"working_dir": str(project), "asleep": False})["agent_id"]
        rows = {row["agent_id"]: row for row in client.call("agent.list", timeout=30)}
        state = client.call("debug_state", {"agent_id": agent_id}, timeout=30)
    listed = rows[agent_id]["config"]
    assert listed["project"] == str(project)
    files = {(f["path"], f["layer"]): f["digest"] for f in listed["files"]}
    assert files[(str(toml), "project")] == digest
    assert files[(str(daemon.config), "user")] == "sha256:" + hashlib.sha256(daemon.config.read_bytes()).hexdigest()
    assert listed["started_with"] == listed["files"]
    assert state["config"]["files"] == listed["files"]
    assert state["config"]["generation_in_use"] == state["config"]["generation"]
    long = weald(daemon, "agents", "--long", cwd=project)
    assert long.returncode == 0, long.stderr
    text = " ".join(long.stdout.split())
    assert f"{toml} (project, {digest[:19]})" in text


def test_a_project_whose_weald_toml_has_errors_cannot_start_an_agent_and_says_where(
    daemon: DaemonProcess, elsewhere: Path
) -> None:
    project = elsewhere / "broken"
    project.mkdir()
    (project / "weald.toml").write_text('[tools.permissions]\nread_file = "nope"\n')
    with daemon.client() as client, pytest.raises(RPCCallError) as info:
        client.call("agent.start", {"working_dir": str(project)})
    assert info.value.code == -32000
    assert f'{project / "weald.toml"}: tools.permissions.read_file: expected "allow", "ask" or "deny", got "nope"' in (
        info.value.message
    )


def test_a_weald_toml_that_anyone_may_write_configures_nothing(daemon: DaemonProcess, elsewhere: Path) -> None:
    project = reading_project(elsewhere, "h", permission="deny", answer="H")
    toml = project / "weald.toml"
    os.chmod(toml, 0o666)
    run = weald(daemon, "run", "--json", "--keep", "read secret.txt", cwd=project)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["text"] != "H"  # not its model: the file was passed over
    with daemon.client() as client:
        rows = {row["agent_id"]: row for row in client.call("agent.list", timeout=30)}
    assert rows[result["agent_id"]]["config"]["ignored"] == [str(toml)]


def test_a_restored_session_keeps_its_projects_rules(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "daemon")
    project = reading_project(tmp_path, "p", permission="deny", answer="P's model answered")
    daemon.start()
    try:
        with daemon.client() as client:
            agent_id = client.call("agent.start", {"working_dir": str(project), "asleep": False})["agent_id"]
        assert daemon.terminate() == 0
        daemon.start()
        with daemon.client() as client:
            result = client.call("agent.prompt", {"agent_id": agent_id, "text": "read it"}, timeout=60)
        assert result["text"] == "P's model answered"
        (refusal,) = tool_results(daemon, agent_id)
        assert "read_file is not allowed here" in refusal
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_weald_home_alone_puts_the_store_and_the_socket_in_one_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k not in ("WEALD_CONFIG", "WEALD_SOCKET")}
    env.update(HOME=str(tmp_path / "home"), WEALD_HOME=str(state), XDG_RUNTIME_DIR=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    cli = [sys.executable, "-m", "weald.runtime.daemon.cli"]
    log = tmp_path / "daemon.log"
    with (
        log.open("wb") as err,
        subprocess.Popen([*cli, "serve", "--json"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=err) as serve,
    ):
        try:
            assert serve.stdout is not None
            line = json.loads(serve.stdout.readline() or b"null")
            assert line is not None, log.read_text()
            assert line["socket"] == str(state / "weald.sock")
            assert line["store"] == str(state / "store.db")
            status = subprocess.run(
                [*cli, "status", "--json"], cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False
            )
            assert status.returncode == 0, status.stderr
            assert json.loads(status.stdout)["running"] is True
            assert list((tmp_path / "run").iterdir()) == []
            assert not (tmp_path / "home" / ".weald").exists()
            # WEALD_SOCKET still names the socket directly.
            direct = dict(env, WEALD_HOME=str(tmp_path / "nowhere"), WEALD_SOCKET=str(state / "weald.sock"))
            status = subprocess.run(
                [*cli, "status", "--json"],
                cwd=work,
                env=direct,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert json.loads(status.stdout)["running"] is True, status.stderr
        finally:
            serve.terminate()
            assert serve.wait(60) == 0, log.read_text()


def test_state_dir_in_the_user_file_moves_the_daemons_state(tmp_path: Path) -> None:
    home = tmp_path / "wh"
    home.mkdir()
    (home / "weald.toml").write_text(f'[daemon]\nstate_dir = "{tmp_path / "elsewhere"}"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("WEALD_CONFIG", "WEALD_SOCKET")}
    env.update(HOME=str(tmp_path / "home"), WEALD_HOME=str(home))
    work = tmp_path / "work"
    work.mkdir()
    cli = [sys.executable, "-m", "weald.runtime.daemon.cli"]
    shown = subprocess.run(
        [*cli, "config", "--json"], cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr
    config = json.loads(shown.stdout)["config"]
    assert config["daemon"]["state_dir"] == str(tmp_path / "elsewhere")
    assert config["store"]["path"] == str(tmp_path / "elsewhere" / "store.db")
    assert config["server"]["socket"] == str(tmp_path / "elsewhere" / "weald.sock")


def test_config_show_prints_a_projects_configuration_with_where_each_value_came_from(tmp_path: Path) -> None:
    home = tmp_path / "wh"
    home.mkdir()
    user = home / "weald.toml"
    user.write_text('[agent]\nmax_steps = 10\n[tools.permissions]\nshell = "ask"\n')
    project = tmp_path / "p"
    (project / "src").mkdir(parents=True)
    toml = project / "weald.toml"
    toml.write_text('[tools.permissions]\nread_file = "deny"\n[limits]\nmax_agents = 5\n')
    env = {k: v for k, v in os.environ.items() if k not in ("WEALD_CONFIG", "WEALD_SOCKET")}
    env.update(HOME=str(tmp_path / "home"), WEALD_HOME=str(home))
    cli = [sys.executable, "-m", "weald.runtime.daemon.cli", "config", "show"]
    where = ["--project", str(project / "src"), "--tools", "*,!shell"]
    shown = subprocess.run(
        [*cli, *where, "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["project"] == str(project)
    assert report["files"] == [str(user), str(toml)]
    assert [s["layer"] for s in report["sources"]] == ["user", "project"]
    origins = report["origins"]
    assert origins["agent.max_steps"] == f"user: {user}"
    assert origins["tools.permissions.shell"] == f"user: {user}"
    assert origins["tools.permissions.read_file"] == f"project: {toml}"
    assert origins["context.auto"] == "default"
    assert origins["tools.enabled"] == "parameter"
    assert report["config"]["tools"]["enabled"] == ["*", "!shell"]
    assert origins["limits.max_agents"] == f"project: {toml}"
    assert "limits" in report["daemon_wide"]
    text = subprocess.run(
        [*cli, *where],
        cwd=tmp_path,
        env={**env, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert text.returncode == 0, text.stderr
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in text.stdout.splitlines() if line.strip()}
    assert rows["limits.max_agents"] == f"5 project: {toml} (daemon-wide)"
    assert rows["tools.permissions.read_file"] == f'"deny" project: {toml}'
    assert f"a session started in {project / 'src'}: project {project}" in text.stdout
