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
from daemon_harness import DaemonProcess, serving, sleep_tag, sleeping
from weald.runtime.testing import wait_until

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


# -- the editor's buffers and terminals ([acp] files / terminal = "editor") ------------------------------------------

EDITOR_PROJECT = """
[acp]
files = "editor"
terminal = "editor"

[tools.permissions]
write_file = "ask"
edit_file = "ask"
shell = "allow"
"""

ALLOWING_PROJECT = EDITOR_PROJECT.replace('"ask"', '"allow"')


class BufferEditor(Editor):
    """An editor with unsaved buffers and terminals of its own, as Zed has: it serves fs/* and terminal/*.

    ``fs/read_text_file`` answers from ``buffers`` (the unsaved text) before the disk;
    ``fs/write_text_file`` changes the buffer only. Terminals are real processes
    started with the editor's own environment (``EDITOR_ONLY_TOKEN`` in it).
    ``disconnect_on``: the path whose read makes the editor go away mid-call.
    """

    def __init__(
        self, buffers: dict[str, str], answers: list[str] | None = None, disconnect_on: str | None = None
    ) -> None:
        super().__init__(answers)
        self.buffers = dict(buffers)
        self.requests: list[tuple[str, str]] = []
        self.terminals: dict[str, tuple[asyncio.subprocess.Process, bytearray, asyncio.Task[None]]] = {}
        self.disconnect_on = disconnect_on
        self.gone = asyncio.Event()

    async def read_text_file(self, session_id: str, path: str, **kwargs: Any) -> Any:
        self.requests.append(("fs/read_text_file", path))
        if path == self.disconnect_on:
            self.gone.set()
            await asyncio.sleep(3600)  # never answers: the editor goes away first
        if path in self.buffers:
            return acp.schema.ReadTextFileResponse(content=self.buffers[path])
        try:
            return acp.schema.ReadTextFileResponse(content=await asyncio.to_thread(Path(path).read_text))
        except FileNotFoundError:
            raise acp.RequestError(-32002, f"no such file: {path}") from None

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> Any:
        self.requests.append(("fs/write_text_file", path))
        self.buffers[path] = content
        return acp.schema.WriteTextFileResponse()

    async def create_terminal(
        self, session_id: str, command: str, args: list[str] | None = None, cwd: str | None = None, **kwargs: Any
    ) -> Any:
        self.requests.append(("terminal/create", command))
        env = {**os.environ, "EDITOR_ONLY_TOKEN": "editor-secret-value"}
        process = await asyncio.create_subprocess_exec(
            command, *(args or []), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        output = bytearray()

        async def read() -> None:
            assert process.stdout is not None
            while chunk := await process.stdout.read(4096):
                output.extend(chunk)

        terminal_id = f"term-{len(self.terminals) + 1}"
        self.terminals[terminal_id] = (process, output, asyncio.ensure_future(read()))
        return acp.schema.CreateTerminalResponse(terminal_id=terminal_id)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.requests.append(("terminal/output", terminal_id))
        process, output, _ = self.terminals[terminal_id]
        status = None if process.returncode is None else acp.schema.TerminalExitStatus(exit_code=process.returncode)
        return acp.schema.TerminalOutputResponse(output=output.decode(), truncated=False, exit_status=status)

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.requests.append(("terminal/wait_for_exit", terminal_id))
        process, _, reader = self.terminals[terminal_id]
        code = await process.wait()
        await reader
        return acp.schema.WaitForTerminalExitResponse(exit_code=code)

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.requests.append(("terminal/kill", terminal_id))
        process, _, _ = self.terminals[terminal_id]
        if process.returncode is None:
            process.kill()
        return acp.schema.KillTerminalResponse()

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.requests.append(("terminal/release", terminal_id))
        process, _, reader = self.terminals.pop(terminal_id)
        if process.returncode is None:
            process.kill()
        await process.wait()
        await reader
        return acp.schema.ReleaseTerminalResponse()


EDITOR_CAPABILITIES = acp.schema.ClientCapabilities(
    fs=acp.schema.FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=True
)


def editor_project(root: Path, config: str = EDITOR_PROJECT) -> Path:
    project = root / "editor-project"
    project.mkdir()
    (project / "weald.toml").write_text(config)
    (project / "app.py").write_text("colour = red\n")
    (project / ".git" / "hooks").mkdir(parents=True)
    (project / ".git" / "config").write_text("[core]\n")
    return project


def history_of(daemon: DaemonProcess, session_id: str) -> list[dict[str, Any]]:
    with daemon.client() as client:
        return client.call("agent.history", {"agent_id": session_id})["messages"]


def tool_results(daemon: DaemonProcess, session_id: str) -> list[dict[str, Any]]:
    return [m for m in history_of(daemon, session_id) if m["role"] == "tool"]


def test_file_tools_read_and_edit_the_editors_unsaved_buffer_not_the_disk(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    from weald.tools._hashline import line_hash

    project = editor_project(tmp_path)
    app = str(project / "app.py")
    unsaved = "colour = green  # unsaved\nsize = 3\n"
    anchored = {"path": "app.py", "start": f"2:{line_hash('size = 3')}", "new_string": "size = 4"}
    model = daemon.script(
        "buffers",
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "app.py"}}]},
            {"tool_calls": [{"name": "edit_file", "arguments": anchored}]},
            {
                "tool_calls": [
                    {"name": "edit_file", "arguments": {"path": "app.py", "old_string": "green", "new_string": "blue"}}
                ]
            },
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "new.txt", "content": "fresh\n"}}]},
            {"text": "edited the buffer"},
        ],
    )
    editor = BufferEditor({app: unsaved}, answers=["allow", "allow", "allow"])

    async def scenario() -> str:
        async with spawn(editor, daemon, model) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=EDITOR_CAPABILITIES)
            session = await conn.new_session(cwd=str(project), mcp_servers=[])
            result = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("edit app.py")])
            assert result.stop_reason == "end_turn"
            return session.session_id

    session_id = run(scenario())
    read, by_anchor, by_text, written = tool_results(daemon, session_id)
    # The model read the buffer, tagged; the anchor from that read named the buffer's line 2.
    assert f"1:{line_hash('colour = green  # unsaved')}|colour = green  # unsaved" in read["content"]
    assert "red" not in read["content"]
    for result in (by_anchor, by_text, written):
        assert not result["is_error"], result["content"]
        assert "in the editor" in result["content"]
    final = "colour = blue  # unsaved\nsize = 4\n"
    assert editor.buffers[app] == final
    assert editor.buffers[str(project / "new.txt")] == "fresh\n"
    # The disk is untouched: the editor decides when its buffers are saved.
    assert (project / "app.py").read_text() == "colour = red\n"
    assert not (project / "new.txt").exists()
    assert [method for method, path in editor.requests if path == app].count("fs/write_text_file") == 2
    # The permission request for the text edit, and the finished call, showed the buffer's change, not the disk's.
    proposed = editor.permissions[1].content[0]
    assert (proposed.type, proposed.old_text, proposed.new_text) == (
        "diff",
        "colour = green  # unsaved\nsize = 4\n",
        final,
    )
    calls = editor.of("tool_call")
    done = [u for u in editor.of("tool_call_update") if u.tool_call_id == calls[1].tool_call_id and u.status]
    diff = next(c for c in done[-1].content if c.type == "diff")
    assert (diff.old_text, diff.new_text) == (unsaved, "colour = green  # unsaved\nsize = 4\n")
    with daemon.client() as client:
        editors = client.call("daemon.status")["editors"]
    assert editors["requests"] >= 6
    assert editors["pending"] == 0


def test_an_edit_of_a_buffer_the_user_changed_since_the_read_is_refused(daemon: DaemonProcess, tmp_path: Path) -> None:
    project = editor_project(tmp_path, ALLOWING_PROJECT)
    app = str(project / "app.py")
    edit = {"path": "app.py", "old_string": "green", "new_string": "blue"}
    model = daemon.script(
        "typed",
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "nowhere.py"}}]},
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "app.py"}}]},
            {"tool_calls": [{"name": "edit_file", "arguments": edit}]},
            {"text": "it changed"},
        ],
    )
    editor = BufferEditor({app: "colour = green\n"})
    original = editor.read_text_file

    async def read_then_type(session_id: str, path: str, **kwargs: Any) -> Any:
        answer = await original(session_id, path, **kwargs)
        editor.buffers[path] = "colour = green\nsize = 9  # typed after the read\n"  # the user goes on typing
        return answer

    editor.read_text_file = read_then_type  # type: ignore[method-assign]

    async def scenario() -> str:
        async with spawn(editor, daemon, model) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=EDITOR_CAPABILITIES)
            session = await conn.new_session(cwd=str(project), mcp_servers=[])
            await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("edit")])
            return session.session_id

    session_id = run(scenario())
    missing, _, refused = tool_results(daemon, session_id)
    assert missing["is_error"]
    assert "nowhere.py does not exist" in missing["content"]  # neither on the disk nor in the editor
    assert refused["is_error"]
    assert "app.py has changed in the editor since you last read it" in refused["content"]
    assert "fs/write_text_file" not in [method for method, _ in editor.requests]
    assert editor.buffers[app] == "colour = green\nsize = 9  # typed after the read\n"


def test_a_protected_path_is_refused_before_any_request_reaches_the_editor(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    # Writes allowed without asking: the refusal is weald's own, whatever the permissions say.
    project = editor_project(tmp_path, ALLOWING_PROJECT)
    model = daemon.script(
        "protected",
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "weald.toml", "content": "[acp]\n"}}]},
            {
                "tool_calls": [
                    {
                        "name": "edit_file",
                        "arguments": {"path": ".git/config", "old_string": "[core]", "new_string": "[x]"},
                    }
                ]
            },
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": ".git/hooks/pre-commit", "content": "boom\n"}}
                ]
            },
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": ".weald/skills/x/SKILL.md", "content": "x\n"}}
                ]
            },
            {"text": "refused"},
        ],
    )
    editor = BufferEditor({str(project / "weald.toml"): "[acp]\nfiles = 'disk'\n"})

    async def scenario() -> str:
        async with spawn(editor, daemon, model) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=EDITOR_CAPABILITIES)
            session = await conn.new_session(cwd=str(project), mcp_servers=[])
            await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("rewrite the rules")])
            return session.session_id

    session_id = run(scenario())
    results = tool_results(daemon, session_id)
    assert len(results) == 4
    for result in results:
        assert result["is_error"]
        assert "is protected" in result["content"]
    assert editor.requests == []  # nothing reached the editor, not even a read
    assert editor.permissions == []
    assert (project / "weald.toml").read_text() == ALLOWING_PROJECT
    assert not (project / ".git" / "hooks" / "pre-commit").exists()


def test_a_shell_command_runs_in_the_editors_terminal_inside_wealds_sandbox(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = editor_project(tmp_path)
    command = 'echo "hello $((6 * 7))"; echo "token: ${EDITOR_ONLY_TOKEN:-absent}"; echo planted >> weald.toml'
    model = daemon.script(
        "terminal",
        [{"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}, {"text": "ran it"}],
    )
    editor = BufferEditor({})

    async def scenario() -> str:
        async with spawn(editor, daemon, model) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=EDITOR_CAPABILITIES)
            session = await conn.new_session(cwd=str(project), mcp_servers=[])
            result = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("run it")])
            assert result.stop_reason == "end_turn"
            return session.session_id

    session_id = run(scenario())
    kinds = [method for method, _ in editor.requests]
    assert kinds[0] == "terminal/create"
    assert editor.requests[0][1] == sys.executable  # weald's launcher, which becomes the sandboxed command
    assert {"terminal/output", "terminal/wait_for_exit", "terminal/release"} <= set(kinds)
    assert editor.terminals == {}  # released
    (result,) = tool_results(daemon, session_id)
    assert "hello 42" in result["content"]
    # The editor's own environment stays out of the command, and the sandbox keeps weald.toml read-only.
    assert "token: absent" in result["content"]
    assert "editor-secret-value" not in result["content"]
    assert result["is_error"]
    assert "Read-only file system" in result["content"]
    assert (project / "weald.toml").read_text() == EDITOR_PROJECT
    # The tool call's content is the editor's terminal, where its output streamed.
    call = editor.of("tool_call")[0]
    contents = [
        c for u in editor.of("tool_call_update") if u.tool_call_id == call.tool_call_id for c in u.content or []
    ]
    assert any(c.type == "terminal" and c.terminal_id == "term-1" for c in contents)
    # As it ran, its output streamed as the call's output events (the observer's, weald run's), from the terminal.
    with daemon.client() as client:
        streamed = client.call("events.query", {"topic": "tool.output", "source": f"/sessions/{session_id}"})["events"]
    assert "hello 42" in "".join(event["data"]["text"] for event in streamed)


def test_the_editor_going_away_mid_call_fails_the_call_clearly_and_the_session_lives_on(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = editor_project(tmp_path)
    app = str(project / "app.py")
    model = daemon.script(
        "gone",
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "app.py"}}]},
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "app.py"}}]},
            {"text": "read it from the disk"},
            {"text": "still here"},
        ],
    )
    editor = BufferEditor({app: "colour = green\n"}, disconnect_on=app)

    async def scenario() -> str:
        async with spawn(editor, daemon, model) as (conn, process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=EDITOR_CAPABILITIES)
            session = await conn.new_session(cwd=str(project), mcp_servers=[])
            turn = asyncio.ensure_future(conn.prompt(session_id=session.session_id, prompt=[acp.text_block("read")]))
            await asyncio.wait_for(editor.gone.wait(), 60)
            process.stdin.close()  # the editor disconnects while weald waits for the buffer
            await asyncio.wait_for(process.wait(), 60)
            turn.cancel()
            return session.session_id

    session_id = run(scenario())

    def turn_over() -> bool:
        return any(
            m["role"] == "assistant" and m["content"] == "read it from the disk" for m in history_of(daemon, session_id)
        )

    wait_until(turn_over, timeout=60, message="the turn to end after the editor went away")
    failed, again = tool_results(daemon, session_id)
    assert failed["is_error"]
    assert "the editor went away" in failed["content"]
    assert "fs/read_text_file" in failed["content"]
    # With no editor left, the next read is the disk's.
    assert not again["is_error"]
    assert "colour = red" in again["content"]
    with daemon.client() as client:
        answer = client.call("agent.prompt", {"agent_id": session_id, "text": "are you there?"}, timeout=60)
        assert answer["ok"] is True
        assert client.call("daemon.status")["editors"]["pending"] == 0


def test_a_command_in_the_editors_terminal_past_its_timeout_is_killed_and_its_terminal_released(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = editor_project(tmp_path)
    tag = sleep_tag()
    model = daemon.script(
        "terminal-timeout",
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": f"echo waiting; sleep {tag}", "timeout": 2}}]},
            {"text": "it timed out"},
        ],
    )
    editor = BufferEditor({})

    async def scenario() -> tuple[str, float]:
        async with spawn(editor, daemon, model) as (conn, _process):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=EDITOR_CAPABILITIES)
            session = await conn.new_session(cwd=str(project), mcp_servers=[])
            began = time.monotonic()
            result = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("wait")])
            assert result.stop_reason == "end_turn"
            return session.session_id, time.monotonic() - began

    session_id, took = run(scenario())
    assert took < 60
    kinds = [method for method, _ in editor.requests]
    assert kinds.index("terminal/kill") < kinds.index("terminal/release")
    assert editor.terminals == {}
    (result,) = tool_results(daemon, session_id)
    assert result["is_error"]
    assert "waiting" in result["content"]
    assert "timed out after 2 s" in result["content"]
    wait_until(lambda: sleeping(tag) == [], timeout=30, message="the command to be gone")
