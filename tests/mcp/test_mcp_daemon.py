"""MCP servers configured in weald.toml, end to end through a real daemon process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))  # the daemon harness, shared

from daemon_harness import DaemonProcess, collect_until


@pytest.fixture
def mcp_daemon(tmp_path: Path, node: str, everything_js: Path):
    config = f"""
[mcp.servers.time]
command = "{sys.executable}"
args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]

[mcp.servers.everything]
command = "{node}"
args = ["{everything_js}", "stdio"]

[tools.permissions]
mcp__time__get_current_time = "allow"
"""
    daemon = DaemonProcess(tmp_path, extra_config=config)
    daemon.start()
    try:
        yield daemon
        assert daemon.terminate() == 0, daemon.log.read_text()
    finally:
        daemon.close()


def test_configured_mcp_tools_run_beside_the_built_ins_through_the_runner(mcp_daemon: DaemonProcess) -> None:
    model = mcp_daemon.script(
        "mcp",
        [
            {"tool_calls": [{"name": "mcp__time__get_current_time", "arguments": {"timezone": "UTC"}}]},
            {"tool_calls": [{"name": "mcp__everything__echo", "arguments": {"message": "through weald"}}]},
            {"text": "done"},
        ],
    )
    with mcp_daemon.client() as c:
        servers = {s["server"]: s["status"] for s in mcp_daemon.wait_mcp("time", "everything")}
        assert servers == {"time": "running", "everything": "running"}
        c.call("agent.start", {"working_dir": str(mcp_daemon.project), "model": model, "agent_id": "m"})
        tools = c.call("debug_state", {"agent_id": "m"})["tools"]
        assert "mcp__time__get_current_time" in tools
        assert "read_file" in tools
        pending = c.request("agent.prompt", {"agent_id": "m", "text": "what time is it, and echo"})
        # MCP tools ask by default: the echo call waits for a permission answer.
        notes = collect_until(c, lambda ns: any(n[0] == "permission.request" for n in ns), timeout=60)
        request = next(n[1] for n in notes if n[0] == "permission.request")
        assert request["tool"] == "mcp__everything__echo"
        c.call("permission.respond", {"request_id": request["request_id"], "decision": "allow"})
        assert pending.get(timeout=60)["ok"]
        history = c.call("agent.history", {"agent_id": "m"})["messages"]
    time_result, echo_result = history[2], history[4]
    assert not time_result["is_error"]
    assert '"timezone": "UTC"' in time_result["content"] or "UTC" in time_result["content"]
    assert echo_result["content"] == "Echo: through weald"


def test_resources_and_prompts_are_listed_and_read_through_the_daemon(mcp_daemon: DaemonProcess) -> None:
    mcp_daemon.wait_mcp("time", "everything")
    with mcp_daemon.client() as c:
        resources = c.call("mcp.resources.list", {"server": "everything"}, timeout=60)
        assert resources
        first = resources[0]
        read = c.call("mcp.resources.read", {"server": "everything", "uri": first["uri"]}, timeout=60)
        assert read
        prompts = c.call("mcp.prompts.list", {"server": "everything"}, timeout=60)
        names = [p["name"] for p in prompts]
        assert names
        simple = next(p for p in prompts if not any(a.get("required") for a in p.get("arguments", [])))
        rendered = c.call("mcp.prompts.get", {"server": "everything", "name": simple["name"]}, timeout=60)
        assert rendered["messages"]
        tree = c.call("tree", {"path": "/mcp"})
        assert sorted(n["path"] for n in tree["children"]) == ["/mcp/everything", "/mcp/time"]
