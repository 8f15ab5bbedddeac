"""The host features servers expect: roots, sampling, logging, list changes and subscriptions.

Against server-everything through a real daemon (roots, sampling, logging,
subscriptions), and the scripted SDK server for the list_changed notifications
server-everything does not send.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from weald.runtime import ActorSystem
from weald.runtime.mcp import mcp_supervisor_spec
from weald.runtime.testing import wait_for_event, wait_mcp_running, wait_until
from weald.tools import ToolContext, ToolRegistry, invoke

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))  # the daemon harness, shared

from daemon_harness import DaemonProcess, collect_until

SAMPLE = "mcp__everything__trigger-sampling-request"
ROOTS = "mcp__everything__get-roots-list"


@pytest.fixture(scope="module")
def everything_daemon(tmp_path_factory: pytest.TempPathFactory, node: str, everything_js: Path):
    """One daemon for the module's tests (each uses its own agents; the roots test counts on none in other dirs)."""
    tmp_path = tmp_path_factory.mktemp("host")
    config = f"""
[mcp.servers.everything]
command = "{node}"
args = ["{everything_js}", "stdio"]
sampling = "ask"
log_level = "debug"

[tools.permissions]
"{SAMPLE}" = "allow"
"{ROOTS}" = "allow"
"mcp__everything__toggle-subscriber-updates" = "allow"
"""
    daemon = DaemonProcess(tmp_path, extra_config=config)
    daemon.start()
    try:
        daemon.wait_mcp("everything")
        yield daemon
        assert daemon.terminate() == 0, daemon.log.read_text()
    finally:
        daemon.close()


def events(client: Any, topic: str) -> list[dict[str, Any]]:
    return [e for e in client.call("debug_state", {"events": 500})["recent_events"] if e["topic"] == topic]


def test_roots_are_the_agents_working_dirs_and_a_change_is_announced(everything_daemon: DaemonProcess, tmp_path: Path):
    d = everything_daemon
    other = tmp_path / "other"
    other.mkdir()
    model = d.script("roots", [{"tool_calls": [{"name": ROOTS, "arguments": {}}]}, {"text": "ok"}])
    with d.client() as c:
        c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "a"})
        # The server asks for the roots again after list_changed, and logs what it got (logging/setLevel debug).
        wait_until(
            lambda: any("1 root(s)" in str(e["data"]["data"]) for e in events(c, "mcp.log")),
            timeout=30,
            message="the server to log 1 root",
        )
        c.call("agent.start", {"working_dir": str(other), "model": model, "agent_id": "b"})
        wait_until(
            lambda: any("2 root(s)" in str(e["data"]["data"]) for e in events(c, "mcp.log")),
            timeout=30,
            message="the server to log 2 roots",
        )
        assert c.call("agent.prompt", {"agent_id": "b", "text": "roots?"}, timeout=60)["ok"]
        listed = c.call("agent.history", {"agent_id": "b"})["messages"][2]["content"]
        assert "Current MCP Roots (2 total)" in listed
        assert f"URI: {d.project.resolve().as_uri()}" in listed
        assert f"URI: {other.resolve().as_uri()}" in listed
        # The log is visible in weald tree too.
        tree = c.call("tree", {"path": "/mcp"})
        (node,) = tree["children"]
        assert any("root(s)" in str(log["data"]) for log in node["mcp"]["recent_logs"])


def test_sampling_runs_on_the_agents_model_once_the_user_allows_it(everything_daemon: DaemonProcess):
    d = everything_daemon
    turns = [
        {"tool_calls": [{"name": SAMPLE, "arguments": {"prompt": "say hi", "maxTokens": 40}}]},
        {"text": "hi from the agent's model"},  # the sampling request's answer, on the agent's own provider
        {"tool_calls": [{"name": SAMPLE, "arguments": {"prompt": "again", "maxTokens": 40}}]},
        {"text": "done"},
    ]
    model = d.script("sampling", turns)
    with d.client() as c:
        c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "s"})
        pending = c.request("agent.prompt", {"agent_id": "s", "text": "sample twice"})
        for answer in ("allow", "deny"):
            notes = collect_until(c, lambda ns: any(n[0] == "ask_user.question" for n in ns), timeout=60)
            question = next(n[1] for n in notes if n[0] == "ask_user.question")
            assert question["origin"] == "mcp:everything"
            assert question["choices"] == ["allow", "deny"]
            assert question["question"].startswith(
                f"MCP server 'everything' asks to use your model during {SAMPLE.rsplit('__', maxsplit=1)[-1]} "
                "(sampling/createMessage, up to 40 tokens). Allow it?"
            )
            assert "System prompt: You are a helpful test server." in question["question"]
            c.call("ask_user.respond", {"question_id": question["question_id"], "answer": answer})
        assert pending.get(timeout=60)["ok"]
        history = c.call("agent.history", {"agent_id": "s"})["messages"]
        sampled = events(c, "agent.sampled")
    allowed, denied = (m for m in history if m["role"] == "tool")
    assert "LLM sampling result:" in allowed["content"]
    assert "hi from the agent's model" in allowed["content"]
    assert '"role": "assistant"' in allowed["content"]
    assert denied["is_error"]
    assert "the user declined the sampling request" in denied["content"]
    # The sampling call is the agent's usage, but not its history.
    assert [e["data"]["ok"] for e in sampled] == [True]
    assert not any(m["content"] == "hi from the agent's model" for m in history if m["role"] == "assistant")


def test_a_subscribed_resource_update_is_an_event(everything_daemon: DaemonProcess):
    d = everything_daemon
    uri = "demo://resource/dynamic/text/1"
    model = d.script(
        "toggle", [{"tool_calls": [{"name": "mcp__everything__toggle-subscriber-updates"}]}, {"text": "ok"}]
    )
    with d.client() as c:
        assert c.call("mcp.resources.subscribe", {"server": "everything", "uri": uri}) == {"subscribed": True}
        c.call("events.subscribe", {"topics": ["mcp.resource_updated"]})
        c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "t"})
        assert c.call("agent.prompt", {"agent_id": "t", "text": "updates on"}, timeout=60)["ok"]
        notes = collect_until(c, lambda ns: any(n[0] == "event" for n in ns), timeout=30)
        event = next(n[1]["event"] for n in notes if n[0] == "event")
        assert event["data"] == {"server": "everything", "uri": uri}
        assert c.call("mcp.resources.unsubscribe", {"server": "everything", "uri": uri}) == {"subscribed": False}


def test_list_changes_and_resource_updates_of_a_server_are_published(system: ActorSystem, scripted) -> None:
    registry = ToolRegistry()
    config = scripted.config(sampling="deny")
    system.root.proxy().start_child(mcp_supervisor_spec([config], registry, permission="allow")).get(timeout=30)
    wait_mcp_running(system.whereis("/mcp/scripted"))
    announce = registry.get("mcp__scripted__announce")
    assert announce is not None
    assert system.loop.run(invoke, announce, ToolContext(working_dir="."), {"uri": "notes://today"}).ok
    assert wait_for_event(system.events, "mcp.resources_changed").data == {"server": "scripted"}
    assert wait_for_event(system.events, "mcp.prompts_changed").data == {"server": "scripted"}
    assert wait_for_event(system.events, "mcp.resource_updated").data == {"server": "scripted", "uri": "notes://today"}
    log = registry.get("mcp__scripted__log")
    assert log is not None
    system.loop.run(invoke, log, ToolContext(working_dir="."), {"message": "disk at 91%"})
    logged = wait_for_event(system.events, "mcp.log")
    assert logged.data == {"server": "scripted", "level": "warning", "logger": "scripted", "data": "disk at 91%"}
