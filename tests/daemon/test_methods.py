"""RPC methods of a real daemon end to end: agent.stop, agent.start's options, and fault injection."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from llm._server import LoopbackModel
from weald.runtime.daemon.client import RPCCallError


@pytest.fixture
def model() -> Iterator[LoopbackModel]:
    with LoopbackModel() as loopback:
        yield loopback


def test_agent_stop_over_the_socket_stops_the_agent_for_good(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    script = d.script("once", [{"text": "before the stop"}, {"text": "after the stop"}])
    try:
        d.start()
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": script, "agent_id": "gone"})
            c.call("agent.start", {"working_dir": str(d.project), "agent_id": "stays"})
            assert c.call("agent.prompt", {"agent_id": "gone", "text": "hi"}, timeout=30)["text"] == "before the stop"
            assert c.call("agent.stop", {"agent_id": "gone"}) == {"stopped": True}
            listed = {a["agent_id"]: (a["status"], a["state"]) for a in c.call("agent.list")}
            # "stays" was never prompted: it started asleep (hibernation is on by default).
            assert listed == {"gone": ("stopped", "stopped"), "stays": ("active", "hibernated")}
            with pytest.raises(RPCCallError, match="no running agent 'gone'") as refused:
                c.call("agent.prompt", {"agent_id": "gone", "text": "are you there?"})
            assert refused.value.code == -32001
            assert c.call("agent.stop", {"agent_id": "gone"}) == {"stopped": False}
            assert [s["path"] for s in c.call("tree", {"path": "/sessions"})["children"]] == ["/sessions/stays"]
            assert len(c.call("agent.history", {"agent_id": "gone"})["messages"]) == 2
        assert d.terminate() == 0
        d.start()  # a stopped agent is not restored; one stopped with the daemon comes back asleep
        with d.client() as c:
            listed = {a["agent_id"]: (a["status"], a["state"]) for a in c.call("agent.list")}
            assert listed == {"gone": ("stopped", "stopped"), "stays": ("active", "hibernated")}
            with pytest.raises(RPCCallError, match="no running agent 'gone'"):
                c.call("agent.prompt", {"agent_id": "gone", "text": "back?"})
        assert d.terminate() == 0
    finally:
        d.close()


def test_agent_start_tools_and_system_prompt_reach_the_model(tmp_path: Path, model: LoopbackModel) -> None:
    provider = f'[providers.loop]\nkind = "openai"\nbase_url = "{model.server.url}/v1"\napi_key_required = false\n'
    d = DaemonProcess(tmp_path, extra_config=provider)
    try:
        d.start()
        with d.client() as c:
            c.call(
                "agent.start",
                {
                    "working_dir": str(d.project),
                    "model": "loop:m",
                    "agent_id": "narrow",
                    "tools": ["read_file", "glob"],
                    "system_prompt": "You are the narrow test agent.",
                },
            )
            c.call("agent.start", {"working_dir": str(d.project), "model": "loop:m", "agent_id": "wide"})
            model.answer("narrow here")
            assert c.call("agent.prompt", {"agent_id": "narrow", "text": "who?"}, timeout=30)["text"] == "narrow here"
            model.answer("wide here")
            assert c.call("agent.prompt", {"agent_id": "wide", "text": "who?"}, timeout=30)["text"] == "wide here"
        assert d.terminate() == 0
    finally:
        d.close()
    narrow, wide = model.requests()
    assert sorted(t["function"]["name"] for t in narrow["tools"]) == ["glob", "read_file"]
    assert narrow["messages"][0] == {"role": "system", "content": "You are the narrow test agent."}
    wide_tools = {t["function"]["name"] for t in wide["tools"]}
    assert {"glob", "read_file", "shell", "write_file"} <= wide_tools
    assert "narrow test agent" not in json.dumps(wide["messages"])


def test_faults_enabled_in_weald_toml_allows_fault_inject_in_a_live_daemon(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config="[faults]\nenabled = true\n")
    script = d.script(
        "reader",
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"text": "the read failed"},
        ],
    )
    try:
        d.start()
        with d.client() as c:
            assert c.call("daemon.status")["faults_enabled"] is True
            assert c.call("fault.list")["faults"] == []
            fault = {"id": "broken-read", "target": "tool", "kind": "crash", "tool": "read_file", "count": 1}
            assert c.call("fault.inject", {"fault": fault}) == {"id": "broken-read"}
            c.call("agent.start", {"working_dir": str(d.project), "model": script, "agent_id": "r"})
            assert c.call("agent.prompt", {"agent_id": "r", "text": "read"}, timeout=30)["text"] == "the read failed"
            tool = c.call("agent.history", {"agent_id": "r"})["messages"][2]
            assert tool["is_error"]
            assert "injected fault 'broken-read'" in tool["content"]
            assert [(f["id"], f["fires"]) for f in c.call("fault.list")["faults"]] == [("broken-read", 1)]
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_faults_file_given_to_weald_serve_fires_and_shows_in_the_tree(tmp_path: Path) -> None:
    faults = tmp_path / "faults.toml"
    faults.write_text(
        'seed = 7\n\n[[faults]]\nid = "glob-crash"\ntarget = "tool"\nkind = "crash"\ntool = "glob"\ncount = 1\n'
    )
    d = DaemonProcess(tmp_path, faults=faults)
    script = d.script(
        "globber",
        [
            {"tool_calls": [{"name": "glob", "arguments": {"pattern": "*.txt"}}]},
            {"text": "glob crashed, carrying on"},
        ],
    )
    try:
        d.start()
        with d.client() as c:
            assert [(f["id"], f["fires"]) for f in c.call("fault.list")["faults"]] == [("glob-crash", 0)]
            c.call("agent.start", {"working_dir": str(d.project), "model": script, "agent_id": "g"})
            turn = c.call("agent.prompt", {"agent_id": "g", "text": "find text files"}, timeout=30)
            assert turn["text"] == "glob crashed, carrying on"
            tool = c.call("agent.history", {"agent_id": "g"})["messages"][2]
            assert tool["is_error"]
            assert "InjectedFault" in tool["content"]
            assert "glob-crash" in tool["content"]
            assert [(f["id"], f["fires"]) for f in c.call("fault.list")["faults"]] == [("glob-crash", 1)]
            # The tree marks the node where the fault fired: the session's tool runner.
            assert _nodes_with_faults(c.call("tree")) == {"/sessions/g/tool_runner": 1}
        assert d.terminate(signal.SIGTERM) == 0
    finally:
        d.close()


def _nodes_with_faults(node: dict[str, Any]) -> dict[str, int]:
    found = {node["path"]: node["faults"]} if node.get("faults") else {}
    for child in node["children"]:
        found.update(_nodes_with_faults(child))
    return found


def test_agent_start_answers_a_wrong_param_with_32602_naming_it_and_a_failure_with_32000(
    daemon: DaemonProcess,
) -> None:
    project = str(daemon.project)
    wrong = [
        ({"working_dir": "project"}, "working_dir", "must be an absolute path, got 'project'"),
        ({"working_dir": project, "agent_id": "no spaces"}, "agent_id", "'no spaces' is not an agent id"),
        ({"working_dir": project, "agent_id": ""}, "agent_id", "an empty agent_id is not an agent id"),
        # A final newline: a pattern ending in "$" would let it through beside "x".
        ({"working_dir": project, "agent_id": "x\n"}, "agent_id", "'x\\n' is not an agent id"),
        ({"working_dir": project, "model": "nosuchkind:x"}, "model", "cannot use model 'nosuchkind:x'"),
    ]
    with daemon.client() as client:
        for params, field, problem in wrong:
            with pytest.raises(RPCCallError) as caught:
                client.call("agent.start", params)
            assert caught.value.code == -32602, params
            assert caught.value.message.startswith(f"invalid params for agent.start: {field}: {problem}")
            assert caught.value.data == {"field": field}
        # Nothing was started or stored for any of them (the empty id is not swapped for a made-up one).
        assert client.call("agent.list") == []
        # Right, but it failed: -32000.
        with pytest.raises(RPCCallError) as caught:
            client.call("agent.start", {"working_dir": str(daemon.project / "missing")})
        assert caught.value.code == -32000
        assert "is not a directory" in caught.value.message
        client.call("agent.start", {"working_dir": project, "agent_id": "taken"})
        with pytest.raises(RPCCallError) as caught:
            client.call("agent.start", {"working_dir": project, "agent_id": "taken"})
        assert caught.value.code == -32000
        assert "already running" in caught.value.message
