"""``weald doctor`` through the real command: each check done for real, on this machine and on broken ones.

The broken machines are real too: a PATH without bwrap (bubblewrap missing),
a state directory on a real tmpfs (``/dev/shm``), an MCP server whose
command does not exist.
"""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from test_cli import isolated_env, weald


def checks(run: Any) -> dict[str, dict[str, Any]]:
    report = json.loads(run.stdout)
    return {check["name"]: check for check in report["checks"]}


@pytest.mark.usefixtures("bubblewrap")
def test_doctor_checks_the_sandbox_rg_node_and_the_state_disk_by_running_them(tmp_path: Path) -> None:
    run = weald("doctor", "--json", cwd=tmp_path, env=isolated_env(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    found = checks(run)
    assert set(found) >= {"shell sandbox", "user namespaces", "ripgrep", "node", "npx", "state directory", "python"}
    assert found["shell sandbox"]["status"] == "ok"
    assert "ran a test command in the sandbox" in found["shell sandbox"]["detail"]
    assert found["ripgrep"]["status"] == "ok"
    assert found["ripgrep"]["detail"].startswith("ripgrep ")
    assert str(tmp_path) in found["state directory"]["detail"]
    assert "GiB free" in found["state directory"]["detail"]
    human = weald("doctor", cwd=tmp_path, env=isolated_env(tmp_path))
    assert human.returncode == 0
    assert "shell sandbox" in human.stdout
    assert "ok" in human.stdout


def test_doctor_fails_when_the_sandbox_is_required_and_bwrap_is_missing(
    tmp_path: Path, path_without_bwrap: str
) -> None:
    env = isolated_env(tmp_path, '[tools.shell]\nsandbox = "required"\n')
    env["PATH"] = path_without_bwrap
    run = weald("doctor", "--json", cwd=tmp_path, env=env)
    assert run.returncode == 1
    sandbox = checks(run)["shell sandbox"]
    assert sandbox["status"] == "fail"
    assert "not installed" in sandbox["detail"]
    assert "refuses every command" in sandbox["detail"]
    assert "apt-get install bubblewrap" in sandbox["fix"]
    auto = weald("doctor", "--json", cwd=tmp_path, env={**isolated_env(tmp_path), "PATH": path_without_bwrap})
    assert checks(auto)["shell sandbox"]["status"] == "warn"


def test_doctor_warns_about_a_state_directory_in_memory_and_fails_a_missing_mcp_command(tmp_path: Path) -> None:
    shm = Path(tempfile.mkdtemp(prefix="weald-doctor-", dir="/dev/shm"))
    try:
        config = f'[store]\npath = "{shm / "store.db"}"\n[mcp.servers.ghost]\ncommand = "weald-no-such-mcp-server"\n'
        toml = tmp_path / "doctor.toml"
        toml.write_text(config)
        # From a directory of its own: the weald.toml isolated_env writes would be its project's file.
        here = tmp_path / "elsewhere"
        here.mkdir()
        env = {**isolated_env(here), "WEALD_CONFIG": str(toml)}
        (here / "weald.toml").unlink()
        run = weald("doctor", "--json", cwd=here, env=env)
    finally:
        shm.rmdir()
    assert run.returncode == 1
    found = checks(run)
    assert found["state directory"]["status"] == "warn"
    assert "tmpfs" in found["state directory"]["detail"]
    assert "lost at reboot" in found["state directory"]["detail"]
    assert found["MCP server commands"]["status"] == "fail"
    assert "ghost (weald-no-such-mcp-server)" in found["MCP server commands"]["detail"]


def test_doctor_reports_a_broken_config_as_a_failed_check(tmp_path: Path) -> None:
    run = weald("doctor", "--json", cwd=tmp_path, env=isolated_env(tmp_path, '[tools.shell]\nsandbox = "maybe"\n'))
    assert run.returncode == 1
    assert 'tools.shell.sandbox: expected "auto", "required" or "off"' in checks(run)["configuration"]["detail"]


def test_doctor_reports_telemetry_off_then_its_endpoint_answering_or_not(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    for name in [name for name in env if name.startswith("OTEL_")]:
        del env[name]
    off = checks(weald("doctor", "--json", cwd=tmp_path, env=env))["telemetry"]
    assert (off["status"], off["detail"]) == ("ok", "off (no [telemetry] endpoint, no OTEL_EXPORTER_OTLP_ENDPOINT)")

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        answering = checks(
            weald(
                "doctor", "--json", cwd=tmp_path, env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
            )
        )
    found = answering["telemetry"]
    assert found["status"] == "ok"
    assert f"http/protobuf to http://127.0.0.1:{port}/v1/traces (from environment)" in found["detail"]
    assert "the endpoint answers" in found["detail"]

    # The same port, now closed: nothing answers there.
    down = isolated_env(tmp_path, f'[telemetry]\nendpoint = "http://127.0.0.1:{port}"\nprotocol = "grpc"\n')
    found = checks(weald("doctor", "--json", cwd=tmp_path, env=down))["telemetry"]
    assert found["status"] == "warn"
    assert f"grpc to http://127.0.0.1:{port} (from weald.toml)" in found["detail"]
    assert "does not answer" in found["detail"]


class NoBwrapDaemon(DaemonProcess):
    """A daemon on a machine without bubblewrap (its PATH has none)."""

    def __init__(self, root: Path, path: str, config: str) -> None:
        super().__init__(root, extra_config=config)
        self.path = path

    def env(self) -> dict[str, str]:
        return {**super().env(), "PATH": self.path}


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_a_daemon_without_bubblewrap_says_so_loudly_at_start_and_in_its_status(
    tmp_path: Path, path_without_bwrap: str, mode: str
) -> None:
    config = f'[tools.permissions]\nshell = "allow"\n[tools.shell]\nsandbox = "{mode}"\n'
    daemon = NoBwrapDaemon(tmp_path, path_without_bwrap, config)
    try:
        daemon.start()
        log = daemon.log.read_text()
        assert "WARNING:" in log
        assert "bubblewrap (bwrap) is not installed" in log
        assert "apt-get install bubblewrap" in log
        with daemon.client() as client:
            sandbox = client.call("daemon.status")["sandbox"]
            tree = client.call("tree", {"depth": 1})
        assert (sandbox["mode"], sandbox["active"]) == (mode, False)
        assert tree["sandbox"] == sandbox["summary"]
        model = daemon.script("s", [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo ran > ran"}}]}])
        with daemon.client() as client:
            client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "s"})
            client.call("agent.prompt", {"agent_id": "s", "text": "go"}, timeout=60)
            (output,) = [
                m["content"] for m in client.call("agent.history", {"agent_id": "s"})["messages"] if m["role"] == "tool"
            ]
        if mode == "auto":
            assert "will run WITHOUT weald's OS sandbox" in log
            assert (daemon.project / "ran").exists()  # with process groups only, as configured
        else:
            assert "shell commands will be REFUSED" in log
            assert "Nothing was run" in output
            assert not (daemon.project / "ran").exists()
        assert daemon.terminate() == 0
    finally:
        daemon.close()
