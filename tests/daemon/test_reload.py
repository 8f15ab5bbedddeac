"""Configuration changes without a restart: ``weald reload``, SIGHUP, and a project file changed on disk.

Real daemons, real files and a real MCP server (``mcp_server_time``); each
change is seen through what a session then does, or through ``mcp.servers``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, collect_until
from weald.runtime.testing import wait_until

SECRET = "the launch code is 0000"


def write_script(path: Path, turns: list[dict[str, Any]], *, repeat: bool = False) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"turns": turns, "repeat": repeat}))
    return f"scripted:{path}"


def project_with(root: Path, name: str, permission: str) -> Path:
    """A project whose model reads ``secret.txt`` every turn, with ``read_file = permission``."""
    project = root / name
    project.mkdir(parents=True)
    (project / "secret.txt").write_text(SECRET + "\n")
    model = write_script(
        project / "scripts" / "read.json",
        [{"tool_calls": [{"name": "read_file", "arguments": {"path": "secret.txt"}}]}, {"text": "done"}],
        repeat=True,
    )
    (project / "weald.toml").write_text(
        f'[models]\ndefault = "{model}"\n[tools.permissions]\nread_file = "{permission}"\n'
    )
    return project


def set_permission(project: Path, permission: str) -> None:
    toml = project / "weald.toml"
    toml.write_text(toml.read_text().replace('"allow"', f'"{permission}"').replace('"deny"', f'"{permission}"'))


def last_tool_result(daemon: DaemonProcess, agent_id: str) -> str:
    with daemon.client() as client:
        history = client.call("agent.history", {"agent_id": agent_id}, timeout=30)
    return [m["content"] for m in history["messages"] if m["role"] == "tool"][-1]


def prompt(daemon: DaemonProcess, agent_id: str) -> dict[str, Any]:
    with daemon.client() as client:
        result: dict[str, Any] = client.call("agent.prompt", {"agent_id": agent_id, "text": "read it"}, timeout=60)
    return result


def start(daemon: DaemonProcess, project: Path) -> str:
    with daemon.client() as client:
        agent_id: str = client.call("agent.start", {"working_dir": str(project)})["agent_id"]
    return agent_id


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(tmp_path_factory.mktemp("daemon"))
    proc.start()
    try:
        yield proc
        assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


def test_a_project_file_changed_then_weald_reload_applies_at_the_sessions_next_turn(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = project_with(tmp_path, "b", "allow")
    agent_id = start(daemon, project)
    prompt(daemon, agent_id)
    assert SECRET in last_tool_result(daemon, agent_id)
    set_permission(project, "deny")
    reload = daemon.cli("reload", "--json")
    assert reload.returncode == 0, reload.stderr
    report = json.loads(reload.stdout)
    (mine,) = [p for p in report["projects"] if p["project"] == str(project)]
    assert mine["status"] == "changed"
    text = daemon.cli("reload")
    assert f"project {project}: unchanged" in text.stdout  # read again, nothing new since
    prompt(daemon, agent_id)
    assert "read_file is not allowed here" in last_tool_result(daemon, agent_id)
    with daemon.client() as client:
        state = client.call("debug_state", {"agent_id": agent_id}, timeout=30)
    assert state["config"]["generation_in_use"] == state["config"]["generation"] == mine["generation"]


def test_a_project_file_changed_on_disk_applies_without_any_command(daemon: DaemonProcess, tmp_path: Path) -> None:
    project = project_with(tmp_path, "c", "deny")
    agent_id = start(daemon, project)
    prompt(daemon, agent_id)
    assert "read_file is not allowed here" in last_tool_result(daemon, agent_id)
    with daemon.client() as client:
        client.call("events.subscribe", {"topics": ["config.changed"]})
        set_permission(project, "allow")
        notes = collect_until(
            client,
            lambda notes: any(n[1]["event"]["data"]["project"] == str(project) for n in notes if n[0] == "event"),
            timeout=30,
        )
    assert any(n[1]["event"]["topic"] == "config.changed" for n in notes)
    prompt(daemon, agent_id)
    assert SECRET in last_tool_result(daemon, agent_id)


def test_a_project_file_with_errors_is_refused_whole_and_its_sessions_keep_their_rules(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = project_with(tmp_path, "d", "deny")
    agent_id = start(daemon, project)
    toml = project / "weald.toml"
    good = toml.read_text()
    # A valid change (allow) and a bad key in the same file: nothing of it applies.
    toml.write_text(good.replace('"deny"', '"allow"') + "[agent]\nmax_stepz = 3\n")
    reload = daemon.cli("reload")
    assert reload.returncode == 2
    assert f"project {project}: REFUSED" in reload.stdout
    assert f"{toml}: agent.max_stepz: unknown key; did you mean max_steps?" in reload.stdout
    prompt(daemon, agent_id)
    assert "read_file is not allowed here" in last_tool_result(daemon, agent_id)
    with daemon.client() as client:
        listed = {row["agent_id"]: row for row in client.call("agent.list", timeout=30)}
    assert any("max_stepz" in problem for problem in listed[agent_id]["config"]["refused"])
    toml.write_text(good.replace('"deny"', '"allow"'))
    fixed = daemon.cli("reload")
    assert fixed.returncode == 0, fixed.stdout
    prompt(daemon, agent_id)
    assert SECRET in last_tool_result(daemon, agent_id)


def test_a_session_without_a_model_follows_its_projects_default_from_the_next_turn(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = tmp_path / "e"
    one = write_script(project / "one.json", [{"text": "model one"}], repeat=True)
    two = write_script(project / "two.json", [{"text": "model two"}], repeat=True)
    (project / "weald.toml").write_text(f'[models]\ndefault = "{one}"\n')
    agent_id = start(daemon, project)
    assert prompt(daemon, agent_id)["text"] == "model one"
    (project / "weald.toml").write_text(f'[models]\ndefault = "{two}"\n')
    assert daemon.cli("reload").returncode == 0
    assert prompt(daemon, agent_id)["text"] == "model two"
    # One started with a model keeps it.
    with daemon.client() as client:
        pinned = client.call("agent.start", {"working_dir": str(project), "model": one})["agent_id"]
    (project / "weald.toml").write_text(f'[models]\ndefault = "{one}"\n[agent]\nmax_steps = 9\n')
    assert daemon.cli("reload").returncode == 0
    assert prompt(daemon, pinned)["text"] == "model one"


def test_sighup_reads_the_files_again(daemon: DaemonProcess, tmp_path: Path) -> None:
    project = project_with(tmp_path, "f", "allow")
    agent_id = start(daemon, project)
    prompt(daemon, agent_id)
    with daemon.client() as client:
        client.call("events.subscribe", {"topics": ["config.reloaded"]})
        set_permission(project, "deny")
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        collect_until(client, lambda notes: any(n[0] == "event" for n in notes), timeout=30)
    prompt(daemon, agent_id)
    assert "read_file is not allowed here" in last_tool_result(daemon, agent_id)
    assert daemon.proc.poll() is None  # it went on serving


# -- MCP servers the daemon hosts ---------------------------------------------------------------------------


def servers(daemon: DaemonProcess) -> dict[str, dict[str, Any]]:
    with daemon.client() as client:
        return {row["server"]: row for row in client.call("mcp.servers", timeout=30)}


CLOCK = (
    f'[mcp.servers.clock]\ncommand = "{sys.executable}"\nargs = ["-m", "mcp_server_time", "--local-timezone", "UTC"]\n'
)


def test_mcp_servers_are_started_restarted_and_stopped_by_a_reload(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path)
    base = daemon.config.read_text()
    daemon.start()
    try:
        assert servers(daemon) == {}
        daemon.config.write_text(base + CLOCK)
        reload = json.loads(daemon.cli("reload", "--json").stdout)
        assert reload["daemon"]["mcp"]["started"] == ["clock"]
        daemon.wait_mcp("clock")
        daemon.config.write_text(base + CLOCK.replace('"UTC"', '"Europe/Paris"'))
        text = daemon.cli("reload")
        assert text.returncode == 0, text.stderr
        assert "MCP servers: restarted clock" in text.stdout
        wait_until(lambda: servers(daemon)["clock"]["status"] == "running", timeout=60)
        daemon.config.write_text(base + "[limits]\nmax_agents = 7\n")
        removed = daemon.cli("reload")
        assert "MCP servers: stopped clock" in removed.stdout
        assert "takes effect at the next start of the daemon: limits.max_agents" in removed.stdout
        assert servers(daemon) == {}
        # The daemon's own file with an error: refused whole, nothing changes.
        daemon.config.write_text(base + CLOCK + "[limits]\nmax_agents = -1\n")
        problem = f"{daemon.config}: limits.max_agents: expected a positive integer, got -1"
        here = daemon.cli("reload")  # this command reads the file too, and stops there
        assert (here.returncode, problem in here.stderr) == (2, True)
        refused = daemon.cli("reload", "--socket", str(daemon.socket))  # the daemon's own answer
        assert refused.returncode == 2
        assert "the daemon's configuration was REFUSED (the running one stays):" in refused.stdout
        assert problem in refused.stdout
        assert servers(daemon) == {}
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_an_mcp_server_whose_variable_is_unset_fails_once_with_the_reason_until_a_reload(tmp_path: Path) -> None:
    unset = "WEALD_TEST_UNSET_VARIABLE"
    server = f'[mcp.servers.ghost]\ncommand = "${{{unset}}}"\nargs = ["-m", "mcp_server_time"]\n'
    daemon = DaemonProcess(tmp_path, extra_config=server)
    daemon.start()
    try:
        wait_until(lambda: servers(daemon).get("ghost", {}).get("status") == "failed", timeout=60)
        ghost = servers(daemon)["ghost"]
        assert unset in ghost["last_error"]
        # Not tried again: with the default backoff (0.5 s, doubling) a retry would come within 2 s.
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            now = servers(daemon)["ghost"]
            assert (now["status"], now["failed_starts"], now["retry_at"]) == ("failed", 1, None)
            time.sleep(0.25)
        daemon.config.write_text(daemon.config.read_text().replace(f"${{{unset}}}", f"${{{unset}:-{sys.executable}}}"))
        reload = json.loads(daemon.cli("reload", "--json").stdout)
        assert reload["daemon"]["mcp"]["restarted"] == ["ghost"]
        daemon.wait_mcp("ghost")
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_weald_mcp_add_remove_and_import_say_whether_the_running_daemon_picked_the_change_up(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "d")
    daemon.start()
    try:
        added = daemon.cli("mcp", "add", "clock", "--", sys.executable, "-m", "mcp_server_time")
        assert added.returncode == 0, added.stderr
        assert added.stdout.splitlines() == [
            f"added MCP server 'clock' to {daemon.config}",
            "the running daemon started 'clock'",
        ]
        daemon.wait_mcp("clock")
        source = tmp_path / "claude_desktop_config.json"
        source.write_text(
            json.dumps({"mcpServers": {"other": {"command": sys.executable, "args": ["-m", "mcp_server_time"]}}})
        )
        imported = daemon.cli("mcp", "import", str(source))
        assert "the running daemon started 'other'" in imported.stdout, imported.stderr
        daemon.wait_mcp("clock", "other")
        removed = daemon.cli("mcp", "remove", "clock", "--json")
        assert json.loads(removed.stdout)["daemon"]["mcp"]["stopped"] == ["clock"]
        assert set(servers(daemon)) == {"other"}
        # A project's file is not one of the daemon's own: it says so rather than pretend.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        env = {k: v for k, v in daemon.env().items() if k != "WEALD_CONFIG"}
        env.update(WEALD_SOCKET=str(daemon.socket), HOME=str(tmp_path / "home"))
        other = subprocess.run(
            [sys.executable, "-m", "weald.runtime.daemon.cli", "mcp", "add", "x", "--", "true"],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert other.returncode == 0, other.stderr
        assert f"the running daemon does not host the MCP servers of {elsewhere / 'weald.toml'}" in other.stdout
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_a_projects_own_mcp_servers_run_for_its_sessions_and_follow_its_file(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "d")  # the daemon's own files name no MCP server
    project = tmp_path / "p"
    model = write_script(
        project / "scripts" / "clock.json",
        [
            {"tool_calls": [{"name": "mcp__clock__get_current_time", "arguments": {"timezone": "UTC"}}]},
            {"text": "done"},
        ],
        repeat=True,
    )
    toml = project / "weald.toml"
    toml.write_text(
        f'[models]\ndefault = "{model}"\n[tools.permissions]\n"mcp__clock__get_current_time" = "allow"\n' + CLOCK
    )
    daemon.start()
    try:
        with daemon.client() as client:
            agent_id = client.call("agent.start", {"working_dir": str(project), "asleep": False})["agent_id"]

        def clock_running() -> bool:
            with daemon.client() as client:
                node = client.call("tree", {"path": f"/sessions/{agent_id}/mcp"}, timeout=30)
            return any(child["path"].endswith("/clock") and child["status"] == "running" for child in node["children"])

        wait_until(clock_running, timeout=60, message="the project's clock server to run under the session")
        prompt(daemon, agent_id)
        assert '"timezone": "UTC"' in last_tool_result(daemon, agent_id)
        assert servers(daemon) == {}  # not the daemon's: the session's own
        # The project drops it: the running session loses it (no restart of the session).
        toml.write_text(f'[models]\ndefault = "{model}"\n')
        assert daemon.cli("reload").returncode == 0
        prompt(daemon, agent_id)
        assert "there is no tool named 'mcp__clock__get_current_time'" in last_tool_result(daemon, agent_id)
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_a_change_to_a_file_a_project_imports_mcp_servers_from_applies_to_its_running_sessions(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "d")
    project = tmp_path / "p"
    model = write_script(
        project / "scripts" / "clock.json",
        [
            {"tool_calls": [{"name": "mcp__clock__get_current_time", "arguments": {"timezone": "UTC"}}]},
            {"text": "done"},
        ],
        repeat=True,
    )
    imported = project / ".mcp.json"
    imported.write_text(json.dumps({"mcpServers": {}}))
    (project / "weald.toml").write_text(
        f'[models]\ndefault = "{model}"\n[tools.permissions]\n"mcp__clock__get_current_time" = "allow"\n'
        '[mcp]\nimport = [".mcp.json"]\n'
    )
    daemon.start()
    try:
        with daemon.client() as client:
            agent_id = client.call("agent.start", {"working_dir": str(project), "asleep": False})["agent_id"]
        prompt(daemon, agent_id)
        assert "there is no tool named 'mcp__clock__get_current_time'" in last_tool_result(daemon, agent_id)
        # The imported file gains the server: the running session has it from its next turn.
        clock = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
        imported.write_text(json.dumps({"mcpServers": {"clock": clock}}))
        reloaded = daemon.cli("reload", "--json")
        assert reloaded.returncode == 0, reloaded.stderr
        assert [p["status"] for p in json.loads(reloaded.stdout)["projects"]] == ["changed"]
        # The session goes to sleep to be built anew with servers (if the watcher saw the file first, a moment
        # after the reload answered); a prompt wakes it, and the server's tools are listed a moment after it runs.

        def clock_answers() -> bool:
            prompt(daemon, agent_id)
            return '"timezone": "UTC"' in last_tool_result(daemon, agent_id)

        wait_until(clock_answers, timeout=90, message="the session's turn to call the imported server")
        # And loses it again (the watcher may be applying it as the reload answers).
        imported.write_text(json.dumps({"mcpServers": {}}))
        assert daemon.cli("reload").returncode == 0

        def clock_gone() -> bool:
            prompt(daemon, agent_id)
            return "there is no tool named 'mcp__clock__get_current_time'" in last_tool_result(daemon, agent_id)

        wait_until(clock_gone, timeout=60, message="the session's turn to find the server gone")
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_a_project_gaining_an_mcp_server_never_cuts_a_running_turn_short(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "d")
    project = tmp_path / "p"
    model = write_script(project / "scripts" / "slow.json", [{"text": "finished", "delay": 4}], repeat=True)
    toml = project / "weald.toml"
    toml.write_text(f'[models]\ndefault = "{model}"\n')
    daemon.start()
    try:
        with daemon.client() as client:
            agent_id = client.call("agent.start", {"working_dir": str(project), "asleep": False})["agent_id"]
        reply: dict[str, Any] = {}
        turn = threading.Thread(target=lambda: reply.update(prompt(daemon, agent_id)))
        turn.start()

        def state() -> str:
            with daemon.client() as client:
                return str(client.call("agent.list", {"agent_id": agent_id}, timeout=30)["rows"][0]["state"])

        wait_until(lambda: state() == "streaming", timeout=30, message="the turn to be under way")
        # The session has no MCP supervisor: it is rebuilt with one by going to sleep, once idle, not now.
        toml.write_text(toml.read_text() + CLOCK)
        assert daemon.cli("reload").returncode == 0
        turn.join(60)
        assert reply.get("ok"), reply
        assert reply["text"] == "finished"
        # Once its turn is over it goes to sleep, and wakes with the server.
        wait_until(lambda: state() == "hibernated", timeout=30, message="the session to go to sleep once idle")
        with daemon.client() as client:
            client.call("agent.wake", {"agent_id": agent_id}, timeout=30)
            node = client.call("tree", {"path": f"/sessions/{agent_id}"}, timeout=30)
        assert any(child["path"].endswith("/mcp") for child in node["children"]), node
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_a_weald_toml_created_nearer_a_sessions_directory_takes_over_once_trusted(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    # sub/weald.toml lies inside the project: anyone working there (an agent) may have written it, so it is
    # refused until trusted; the session keeps its project's configuration meanwhile.
    project = project_with(tmp_path, "g", "allow")
    sub = project / "sub"
    sub.mkdir()
    (sub / "secret.txt").write_text(SECRET + "\n")
    agent_id = start(daemon, sub)
    prompt(daemon, agent_id)
    assert SECRET in last_tool_result(daemon, agent_id)
    nested = sub / "weald.toml"
    with daemon.client() as client:
        client.call("events.subscribe", {"topics": ["config.changed", "config.refused"]})
        nested.write_text((project / "weald.toml").read_text().replace('"allow"', '"deny"'))
        notes = collect_until(
            client,
            lambda notes: any(n[1]["event"]["topic"] == "config.refused" for n in notes if n[0] == "event"),
            timeout=30,
        )
    refused = next(
        n[1]["event"]["data"] for n in notes if n[0] == "event" and n[1]["event"]["topic"] == "config.refused"
    )
    assert any(f"weald trust {nested}" in problem for problem in refused["problems"]), refused
    prompt(daemon, agent_id)
    assert SECRET in last_tool_result(daemon, agent_id)  # the nested file is not applied
    with daemon.client() as client:
        client.call("events.subscribe", {"topics": ["config.changed"]})
        trusted = daemon.cli("trust", str(nested), "--yes")
        assert trusted.returncode == 0, trusted.stdout + trusted.stderr
        collect_until(
            client,
            lambda notes: any(n[1]["event"]["data"]["project"] == str(sub) for n in notes if n[0] == "event"),
            timeout=30,
        )
    prompt(daemon, agent_id)
    assert "read_file is not allowed here" in last_tool_result(daemon, agent_id)


def test_a_session_woken_from_hibernation_runs_under_its_projects_configuration_as_it_is(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "d", extra_config="[limits]\nhibernate_after = 0.2\n")
    project = project_with(tmp_path, "h", "allow")
    daemon.start()
    try:
        agent_id = start(daemon, project)
        prompt(daemon, agent_id)
        assert SECRET in last_tool_result(daemon, agent_id)

        def asleep() -> bool:
            with daemon.client() as client:
                rows = {row["agent_id"]: row for row in client.call("agent.list", timeout=30)}
            return bool(rows[agent_id]["state"] == "hibernated")

        wait_until(asleep, timeout=60, message="the session to hibernate")
        set_permission(project, "deny")
        assert daemon.cli("reload").returncode == 0
        assert asleep()  # a reload wakes nothing
        prompt(daemon, agent_id)
        assert "read_file is not allowed here" in last_tool_result(daemon, agent_id)
        assert daemon.terminate() == 0
    finally:
        daemon.close()
