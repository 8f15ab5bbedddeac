"""`weald acp` driven by the npm ACP SDK's client connection (@agentclientprotocol/sdk), run by node."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from acp_harness import NODE_CLIENT, acp_command, node_client_prefix
from daemon_harness import serving

PERMISSIONS = """
[tools.permissions]
write_file = "ask"
edit_file = "ask"
"""


def test_the_npm_sdk_client_prompts_and_answers_permission_allow_and_deny(tmp_path: Path) -> None:
    node, prefix = node_client_prefix()
    with serving(tmp_path, extra_config=PERMISSIONS) as daemon:
        (daemon.project / "app.txt").write_text("colour = red\n")
        model = daemon.script(
            "node",
            [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "app.txt"}}]},
                {
                    "text": "editing",
                    "tool_calls": [
                        {
                            "name": "edit_file",
                            "arguments": {"path": "app.txt", "old_string": "red", "new_string": "blue"},
                        }
                    ],
                },
                {"text": "made it blue"},
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "no.txt", "content": "no\n"}}]},
                {"text": "not written"},
            ],
        )
        scenario = {
            "command": acp_command(daemon.socket, model),
            "cwd": str(daemon.project),
            "env": daemon.env(),
            "prompts": ["make it blue", "write no.txt"],
            "answers": ["allow", "deny"],
        }
        done = subprocess.run(
            [node, str(prefix / NODE_CLIENT.name)],
            input=json.dumps(scenario),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert (daemon.project / "app.txt").read_text() == "colour = blue\n"
        assert not (daemon.project / "no.txt").exists()

    assert out["init"]["protocolVersion"] == 1
    assert out["init"]["agentCapabilities"]["loadSession"] is True
    assert [r["stopReason"] for r in out["results"]] == ["end_turn", "end_turn"]
    calls = [u for u in out["updates"] if u["sessionUpdate"] == "tool_call"]
    assert [(c["kind"], c["locations"][0]["path"]) for c in calls] == [
        ("read", str(daemon.project / "app.txt")),
        ("edit", str(daemon.project / "app.txt")),
        ("edit", str(daemon.project / "no.txt")),
    ]
    # The edit was shown as a diff before it ran (in the permission request) and after.
    asked = out["permissions"][0]
    assert [o["kind"] for o in asked["options"]] == ["allow_once", "allow_always", "reject_once"]
    diff = asked["toolCall"]["content"][0]
    assert (diff["type"], diff["oldText"], diff["newText"]) == ("diff", "colour = red\n", "colour = blue\n")
    finals = [u for u in out["updates"] if u["sessionUpdate"] == "tool_call_update" and u.get("status")]
    assert [u["status"] for u in finals] == ["completed", "completed", "failed"]
    after = next(c for c in finals[1]["content"] if c["type"] == "diff")
    assert (after["oldText"], after["newText"]) == ("colour = red\n", "colour = blue\n")
    text = "".join(u["content"]["text"] for u in out["updates"] if u["sessionUpdate"] == "agent_message_chunk")
    assert "made it blue" in text
    assert "not written" in text


EDITOR_PROJECT = """
[acp]
files = "editor"
terminal = "editor"

[tools.permissions]
edit_file = "ask"
shell = "allow"
"""


def test_the_npm_sdk_client_serves_its_buffers_and_terminals_to_the_sessions_tools(tmp_path: Path) -> None:
    node, prefix = node_client_prefix()
    with serving(tmp_path / "daemon") as daemon:
        project = tmp_path / "editor-project"
        project.mkdir()
        (project / "weald.toml").write_text(EDITOR_PROJECT)
        (project / "app.txt").write_text("colour = red\n")
        app = str(project / "app.txt")
        model = daemon.script(
            "node-editor",
            [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "app.txt"}}]},
                {
                    "tool_calls": [
                        {
                            "name": "edit_file",
                            "arguments": {"path": "app.txt", "old_string": "green", "new_string": "blue"},
                        }
                    ]
                },
                {"tool_calls": [{"name": "shell", "arguments": {"command": 'echo "on disk: $(cat app.txt)"'}}]},
                {"text": "done"},
            ],
        )
        scenario = {
            "command": acp_command(daemon.socket, model),
            "cwd": str(project),
            "env": daemon.env(),
            "prompts": ["make it blue"],
            "answers": ["allow"],
            "buffers": {app: "colour = green\n"},
        }
        done = subprocess.run(
            [node, str(prefix / NODE_CLIENT.name)],
            input=json.dumps(scenario),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        with daemon.client() as client:
            history = client.call("agent.history", {"agent_id": out["sessionId"]})["messages"]
        assert (project / "app.txt").read_text() == "colour = red\n"

    read, edited, ran = [m for m in history if m["role"] == "tool"]
    assert "colour = green" in read["content"]
    assert not edited["is_error"], edited["content"]
    assert out["buffers"][app] == "colour = blue\n"
    # The permission request showed the buffer's edit.
    diff = out["permissions"][0]["toolCall"]["content"][0]
    assert (diff["oldText"], diff["newText"]) == ("colour = green\n", "colour = blue\n")
    # The command ran in the editor's terminal; it sees the disk, where the buffer is not saved yet.
    assert "on disk: colour = red" in ran["content"]
    methods = [method for method, _ in out["served"]]
    assert methods.count("fs/write_text_file") == 1
    assert {"terminal/create", "terminal/output", "terminal/wait_for_exit", "terminal/release"} <= set(methods)
    assert out["openTerminals"] == 0
    terminal_blocks = [
        c
        for u in out["updates"]
        if u["sessionUpdate"] == "tool_call_update"
        for c in u.get("content") or []
        if c["type"] == "terminal"
    ]
    assert terminal_blocks
    assert terminal_blocks[0]["terminalId"] == "node-term-1"
    finals = [u for u in out["updates"] if u["sessionUpdate"] == "tool_call_update" and u.get("status")]
    assert [u["status"] for u in finals] == ["completed", "completed", "completed"]
