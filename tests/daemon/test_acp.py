"""`weald acp` driven by the PyPI ACP SDK's client (agent-client-protocol), against a real daemon."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import acp
import pytest
from acp.schema import EnvVariable, McpServerStdio
from acp_harness import acp_command
from daemon_harness import DaemonProcess, serving

PERMISSIONS = """
[tools.permissions]
write_file = "ask"
edit_file = "ask"
shell = "ask"
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with serving(tmp_path_factory.mktemp("acp"), extra_config=PERMISSIONS) as proc:
        yield proc


class Editor:
    """An editor's side of ACP: records every update, answers permission requests from a list."""

    def __init__(self, answers: list[str] | None = None) -> None:
        self.updates: list[Any] = []
        self.permissions: list[Any] = []
        self.answers = list(answers or [])
        self.asked = asyncio.Event()

    async def request_permission(self, options: Any, session_id: str, tool_call: Any, **kwargs: Any) -> Any:
        self.permissions.append(tool_call)
        self.asked.set()
        answer = self.answers.pop(0)
        assert answer in {option.option_id for option in options}
        return acp.RequestPermissionResponse(outcome=acp.schema.AllowedOutcome(outcome="selected", option_id=answer))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    def of(self, kind: str) -> list[Any]:
        return [u for u in self.updates if u.session_update == kind]


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


async def wait_for(predicate: Any, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def spawn(editor: Editor, daemon: DaemonProcess, model: str) -> Any:
    command = acp_command(daemon.socket, model)
    return acp.spawn_agent_process(editor, command[0], *command[1:], env=daemon.env(), cwd=str(daemon.project))


def test_a_prompt_streams_tool_calls_and_asks_permission_answered_allow_then_deny(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "allow-deny",
        [
            {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "written\n"}}]},
            {"text": "wrote it"},
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "denied.txt", "content": "no\n"}}]},
            {"text": "it was denied"},
        ],
    )
    editor = Editor(answers=["allow", "deny"])

    async def scenario() -> dict[str, Any]:
        async with spawn(editor, daemon, model) as (conn, _process):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            session = await conn.new_session(cwd=str(daemon.project), mcp_servers=[])
            first = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("write out.txt")])
            second = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("write denied.txt")])
            return {"init": init, "session": session.session_id, "first": first, "second": second}

    out = run(scenario())
    init = out["init"]
    assert init.protocol_version == 1
    assert init.agent_capabilities.load_session is True
    assert init.agent_capabilities.prompt_capabilities.image is True
    assert out["first"].stop_reason == "end_turn"
    assert out["second"].stop_reason == "end_turn"

    calls = editor.of("tool_call")
    assert [(c.kind, c.title) for c in calls] == [
        ("read", "read_file notes.txt"),
        ("edit", "write_file out.txt"),
        ("edit", "write_file denied.txt"),
    ]
    assert calls[0].locations[0].path == str(daemon.project / "notes.txt")
    ends = {u.tool_call_id: u.status for u in editor.of("tool_call_update") if u.status}
    assert [ends[c.tool_call_id] for c in calls] == ["completed", "completed", "failed"]

    # The permission request carried the edit as a diff; the allowed write ran, the denied one did not.
    assert [p.kind for p in editor.permissions] == ["edit", "edit"]
    proposed = editor.permissions[0].content[0]
    assert (proposed.type, proposed.path, proposed.old_text, proposed.new_text) == (
        "diff",
        str(daemon.project / "out.txt"),
        None,
        "written\n",
    )
    assert (daemon.project / "out.txt").read_text() == "written\n"
    assert not (daemon.project / "denied.txt").exists()
    written = next(u for u in editor.of("tool_call_update") if u.tool_call_id == calls[1].tool_call_id and u.content)
    assert any(c.type == "diff" and c.new_text == "written\n" for c in written.content)

    chunks = "".join(u.content.text for u in editor.of("agent_message_chunk"))
    assert "reading" in chunks
    assert "wrote it" in chunks
    assert "it was denied" in chunks


def test_cancel_during_a_tool_call_stops_the_turn_and_answers_cancelled(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "cancel",
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo started; sleep 60"}}]},
            {"text": "never"},
        ],
    )
    editor = Editor(answers=["allow"])

    async def scenario() -> tuple[Any, float]:
        async with spawn(editor, daemon, model) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            session = await conn.new_session(cwd=str(daemon.project), mcp_servers=[])
            turn = asyncio.ensure_future(conn.prompt(session_id=session.session_id, prompt=[acp.text_block("go")]))
            await wait_for(
                lambda: any(
                    u.content and "started" in u.content[0].content.text for u in editor.of("tool_call_update")
                ),
                what="the command's output",
            )
            began = time.monotonic()
            await conn.cancel(session_id=session.session_id)
            result = await turn
            return result, time.monotonic() - began

    result, took = run(scenario())
    assert result.stop_reason == "cancelled"
    assert took < 30
    call = editor.of("tool_call")[0]
    assert call.kind == "execute"
    assert [u.status for u in editor.of("tool_call_update") if u.status][-1] == "failed"


def test_session_load_after_the_acp_process_was_killed_replays_and_goes_on(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "load",
        [
            {"text": "looking", "tool_calls": [{"name": "glob", "arguments": {"pattern": "*.txt"}}]},
            {"text": "found notes.txt"},
            {"text": "still here"},
        ],
    )
    command = acp_command(daemon.socket, model)
    first = Editor()

    async def before() -> str:
        async with spawn(first, daemon, model) as (conn, process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            session = await conn.new_session(cwd=str(daemon.project), mcp_servers=[])
            await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("which files?")])
            os.kill(process.pid, signal.SIGKILL)  # the editor's agent dies; the session lives in the daemon
            await process.wait()
            return session.session_id

    session_id = run(before())
    second = Editor()

    async def after() -> Any:
        async with acp.spawn_agent_process(
            second, command[0], *command[1:], env=daemon.env(), cwd=str(daemon.project)
        ) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            await conn.load_session(cwd=str(daemon.project), session_id=session_id, mcp_servers=[])
            replayed = list(second.updates)
            result = await conn.prompt(session_id=session_id, prompt=[acp.text_block("again")])
            return replayed, result

    replayed, result = run(after())
    kinds = [u.session_update for u in replayed]
    assert kinds[0] == "user_message_chunk"
    assert replayed[0].content.text == "which files?"
    assert "tool_call" in kinds
    call = next(u for u in replayed if u.session_update == "tool_call")
    assert (call.kind, call.status) == ("search", "completed")
    texts = [u.content.text for u in replayed if u.session_update == "agent_message_chunk"]
    assert texts == ["looking", "found notes.txt"]
    assert result.stop_reason == "end_turn"
    assert "still here" in "".join(u.content.text for u in second.of("agent_message_chunk"))


def test_an_editor_provided_mcp_server_runs_under_the_session(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "mcp",
        [
            {"tool_calls": [{"name": "mcp__time__get_current_time", "arguments": {"timezone": "UTC"}}]},
            {"text": "it is now"},
        ],
    )
    editor = Editor(answers=["allow"])
    server = McpServerStdio(
        name="time", command=sys.executable, args=["-m", "mcp_server_time"], env=[EnvVariable(name="TZ", value="UTC")]
    )

    async def scenario() -> tuple[str, Any]:
        async with spawn(editor, daemon, model) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            session = await conn.new_session(cwd=str(daemon.project), mcp_servers=[server])
            result = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("time?")])
            return session.session_id, result

    session_id, result = run(scenario())
    assert result.stop_reason == "end_turn"
    call = editor.of("tool_call")[0]
    assert call.title.startswith("mcp__time__get_current_time")
    update = [u for u in editor.of("tool_call_update") if u.status][-1]
    assert update.status == "completed"
    with daemon.client() as client:
        tree = client.call("tree", {"path": f"/sessions/{session_id}/mcp"})
        daemon_servers = client.call("mcp.servers")
    assert [child["path"] for child in tree["children"]] == [f"/sessions/{session_id}/mcp/time"]
    assert tree["children"][0]["status"] == "running"
    assert daemon_servers == []  # the session's own, not the daemon's


def test_a_malformed_message_gets_a_json_rpc_error_and_the_session_goes_on(daemon: DaemonProcess) -> None:
    model = daemon.script("malformed", [{"text": "fine"}])
    proc = subprocess.Popen(
        acp_command(daemon.socket, model),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=daemon.env(),
        cwd=daemon.project,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None

    def send(message: Any) -> None:
        assert proc.stdin is not None
        proc.stdin.write(message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    def read() -> dict[str, Any]:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "weald acp closed its output"
        return json.loads(line)

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
        assert read()["result"]["protocolVersion"] == 1
        send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "session/new",
                "params": {"cwd": str(daemon.project), "mcpServers": []},
            }
        )
        session_id = read()["result"]["sessionId"]

        send(b'{"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {"sessionId": \n')
        error = read()
        assert error["id"] is None
        assert error["error"]["code"] == -32700
        assert "not valid JSON" in error["error"]["message"]

        send({"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": {"sessionId": session_id}})
        error = read()
        assert (error["id"], error["error"]["code"]) == (4, -32602)
        assert "prompt" in error["error"]["message"]

        send({"jsonrpc": "2.0", "id": 5, "method": "session/frobnicate", "params": {}})
        assert read()["error"]["code"] == -32601

        send(
            {
                "jsonrpc": "2.0",
                "id": 6,
                "method": "session/prompt",
                "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "still there?"}]},
            }
        )
        messages = []
        while True:
            message = read()
            messages.append(message)
            if message.get("id") == 6:
                break
        assert message["result"]["stopReason"] == "end_turn"
        chunks = [m["params"]["update"] for m in messages if m.get("method") == "session/update"]
        assert "".join(u["content"]["text"] for u in chunks if u["sessionUpdate"] == "agent_message_chunk") == "fine"
    finally:
        proc.stdin.close()
        assert proc.wait(30) == 0
        proc.stdout.close()


def test_images_and_resource_links_reach_the_model(daemon: DaemonProcess, tmp_path: Path) -> None:
    model = daemon.script("images", [{"text": "a red dot"}])
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
    editor = Editor()

    async def scenario() -> str:
        async with spawn(editor, daemon, model) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            session = await conn.new_session(cwd=str(daemon.project), mcp_servers=[])
            prompt = [
                acp.text_block("what is in this image, and in"),
                acp.resource_link_block(name="notes.txt", uri=f"file://{daemon.project / 'notes.txt'}"),
                acp.image_block(data=png, mime_type="image/png"),
            ]
            result = await conn.prompt(session_id=session.session_id, prompt=prompt)
            assert result.stop_reason == "end_turn"
            return session.session_id

    session_id = run(scenario())
    with daemon.client() as client:
        history = client.call("agent.history", {"agent_id": session_id})["messages"]
    assert history[0]["role"] == "user"
    assert f"[notes.txt](file://{daemon.project / 'notes.txt'})" in history[0]["content"]
    assert history[0]["images"] == [{"mime_type": "image/png", "data": png}]


def test_agent_start_refuses_a_session_mcp_server_without_a_transport(daemon: DaemonProcess) -> None:
    from weald.runtime.daemon.client import RPCCallError

    with daemon.client() as client:
        with pytest.raises(RPCCallError) as caught:
            client.call("agent.start", {"working_dir": str(daemon.project), "mcp_servers": [{"name": "nothing"}]})
        assert caught.value.code == -32602
        assert "mcp_servers" in caught.value.message
        assert all(row["agent_id"] != "nothing" for row in client.call("agent.list"))
