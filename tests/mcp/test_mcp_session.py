"""open_connection and MCPSession against scripted_server.py (the SDK's MCPServer) over stdio."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
import trio.testing
from weald.runtime.mcp import (
    MCPClosedError,
    MCPConfigError,
    MCPConnectionLost,
    MCPHandshakeTimeout,
    MCPLogMessage,
    MCPNotResponding,
    MCPProtocolError,
    MCPStartError,
    MCPTimeout,
    MCPTool,
    MCPToolError,
    ServerConfig,
    open_connection,
)
from weald.runtime.mcp._session import _paginate

pytestmark = pytest.mark.trio


async def test_session_opens_with_the_handshake_done_and_the_tools_listed(scripted):
    async with open_connection(scripted.config()) as session:
        assert session.server_info.name == "scripted"
        assert session.server_info.protocol_version == "2025-11-25"
        assert session.capabilities.tools
        names = {tool.name: tool for tool in session.tools}
        assert {"echo", "crash", "hang", "slow", "add_tool"} <= set(names)
        echo = names["echo"]
        assert echo.server == "scripted"
        assert echo.registered_name == "mcp__scripted__echo"
        assert echo.input_schema["properties"] == {"text": {"title": "Text", "type": "string"}}
        stats = session.statistics()
        assert stats.state == "open"
        assert stats.transport == "stdio"
        assert stats.pid is not None
        assert stats.tools == len(session.tools)


async def test_call_tool_returns_text_and_structured_content(scripted):
    async with open_connection(scripted.config()) as session:
        result = await session.call_tool("echo", {"text": "hello"})
        assert result.text == "hello"
        assert result.is_error is False
        assert result.structured_content == {"result": "hello"}
        assert result.content == ({"type": "text", "text": "hello"},)
        assert session.statistics().calls_succeeded == 1


async def test_call_tool_accepts_the_registered_name(scripted):
    async with open_connection(scripted.config()) as session:
        result = await session.call_tool("mcp__scripted__echo", {"text": "by registered name"})
        assert result.text == "by registered name"


async def test_a_tool_that_fails_comes_back_as_a_result_with_is_error(scripted):
    async with open_connection(scripted.config()) as session:
        result = await session.call_tool("fail", {"reason": "disk full"})
        assert result.is_error is True
        assert "fail" in result.text
        assert session.statistics().calls_tool_errors == 1


async def test_a_json_rpc_error_raises_mcp_tool_error_with_the_servers_message(scripted):
    async with open_connection(scripted.config()) as session:
        with pytest.raises(MCPToolError) as caught:
            await session.call_tool("reject", {"reason": "bad input"})
        assert caught.value.code == -32602
        assert caught.value.error_message == "rejected: bad input"
        assert caught.value.tool == "reject"
        assert caught.value.server == "scripted"
        assert "rejected: bad input" in str(caught.value)
        # The connection is fine afterwards.
        assert (await session.call_tool("echo", {"text": "ok"})).text == "ok"


async def test_progress_notifications_reach_on_progress_in_order(scripted):
    seen: list[tuple[float, float | None, str | None]] = []
    async with open_connection(scripted.config()) as session:
        result = await session.call_tool(
            "slow",
            {"seconds": 0.2, "steps": 4},
            on_progress=lambda progress, total, message: seen.append((progress, total, message)),
        )
    assert result.text == "slept 0.2"
    assert seen == [(float(step), 4.0, f"step {step} of 4") for step in range(1, 5)]


async def test_an_exception_from_on_progress_propagates_from_call_tool(scripted):
    class Stop(Exception):
        pass

    def on_progress(progress: float, total: float | None, message: str | None) -> None:
        raise Stop

    async with open_connection(scripted.config()) as session:
        with pytest.raises(Stop):
            await session.call_tool("slow", {"seconds": 5, "steps": 50}, on_progress=on_progress)
        assert (await session.call_tool("echo", {"text": "still usable"})).text == "still usable"


async def test_a_hung_call_raises_mcp_timeout_and_the_session_stays_usable(scripted):
    async with open_connection(scripted.config()) as session:
        with pytest.raises(MCPTimeout) as caught:
            await session.call_tool("hang", timeout=0.5)
        assert caught.value.timeout == 0.5
        assert (await session.call_tool("echo", {"text": "alive"})).text == "alive"
        stats = session.statistics()
        assert stats.calls_timed_out == 1
        assert stats.calls_in_flight == 0
        assert stats.state == "open"


async def test_a_timed_out_call_pings_the_server_and_a_server_that_answers_keeps_the_session(scripted):
    async with open_connection(scripted.config(ping_timeout=5.0, ping_interval=600.0)) as session:
        with pytest.raises(MCPTimeout):
            await session.call_tool("slow", {"seconds": 30, "steps": 1}, timeout=0.5)
        stats = session.statistics()
        assert (stats.pings, stats.pings_unanswered, stats.state) == (1, 0, "open")


async def test_a_server_that_answers_no_ping_is_not_responding_and_the_session_is_lost(scripted, processes):
    config = scripted.config(ping_timeout=0.5, ping_interval=600.0)
    seen: dict[str, Any] = {}

    async def freeze_the_server() -> None:
        async with open_connection(config) as session:
            seen["session"] = session
            with pytest.raises(MCPNotResponding) as caught:
                await session.call_tool("freeze", timeout=0.5)
            seen["call"] = caught.value
            await session.wait_lost()

    with pytest.raises(MCPNotResponding) as lost:
        await freeze_the_server()
    for error in (seen["call"], lost.value):
        assert isinstance(error, MCPConnectionLost)
        assert error.ping_timeout == 0.5
        assert error.server == "scripted"
    assert str(seen["call"]) == (
        "MCP server 'scripted' is not responding: it did not answer a ping within 0.5 s; "
        "tools/call 'freeze' did not complete, so its connection was closed"
    )
    stats = seen["session"].statistics()
    assert (stats.state, stats.pings, stats.pings_unanswered) == ("lost", 1, 1)
    assert stats.lost_reason == "the server is not responding: it did not answer a ping within 0.5 s"
    await processes.wait_group_gone(stats.pid)


@pytest.fixture
def server_home(tmp_path: Path) -> Path:
    """An empty directory for a server to run in, its path resolved as os.getcwd() gives it."""
    home = tmp_path / "server home"
    home.mkdir()
    return home.resolve()


async def test_the_configured_env_and_cwd_reach_the_server_process(scripted, server_home, monkeypatch):
    monkeypatch.setenv("WEALD_TEST_PARENT_ONLY", "not for servers")
    config = scripted.config(env={"WEALD_TEST_MARKER": "from weald.toml"}, cwd=server_home)
    async with open_connection(config) as session:
        marker = await session.call_tool("whereami", {"variable": "WEALD_TEST_MARKER"})
        parent = await session.call_tool("whereami", {"variable": "WEALD_TEST_PARENT_ONLY"})
    assert json.loads(marker.text) == {"cwd": str(server_home), "value": "from weald.toml"}
    # Only the configured variables and a small safe base are passed on, not the parent's whole environment.
    assert json.loads(parent.text) == {"cwd": str(server_home), "value": None}


async def test_the_config_call_timeout_applies_when_no_timeout_is_given(scripted):
    async with open_connection(scripted.config(call_timeout=0.5)) as session:
        with pytest.raises(MCPTimeout):
            await session.call_tool("hang")


async def test_a_crash_mid_call_ends_the_call_with_connection_lost_at_once(scripted):
    async with open_connection(scripted.config(call_timeout=60.0)) as session:
        with trio.fail_after(10):  # far below call_timeout: not ended by the timeout
            with pytest.raises(MCPConnectionLost) as caught:
                await session.call_tool("crash", {"code": 7})
        assert caught.value.server == "scripted"
        assert caught.value.exit_code == 7
        assert "crashing on purpose" in caught.value.stderr_tail
        assert "'scripted'" in str(caught.value)
        stats = session.statistics()
        assert stats.state == "lost"
        assert stats.exit_code == 7
        assert stats.lost_reason == "the server process exited with code 7"
        with pytest.raises(MCPConnectionLost):
            await session.call_tool("echo", {"text": "too late"})
        with pytest.raises(MCPConnectionLost):
            await session.wait_lost()


async def test_every_in_flight_call_ends_when_the_server_dies(scripted):
    outcomes: list[BaseException] = []

    async def hang_and_record(session) -> None:
        try:
            await session.call_tool("hang")
        except MCPConnectionLost as exc:
            outcomes.append(exc)

    async with open_connection(scripted.config(call_timeout=60.0)) as session:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(hang_and_record, session)
                await trio.testing.wait_all_tasks_blocked()
                os.kill(session.statistics().pid, signal.SIGKILL)
    assert len(outcomes) == 3
    assert all(exc.exit_code == -signal.SIGKILL for exc in outcomes)


async def test_wait_lost_raises_when_an_idle_server_dies(scripted):
    async with open_connection(scripted.config()) as session:
        os.kill(session.statistics().pid, signal.SIGTERM)
        with trio.fail_after(10), pytest.raises(MCPConnectionLost) as caught:
            await session.wait_lost()
        assert "killed by SIGTERM" in str(caught.value)


async def test_a_line_of_stdout_noise_is_counted_and_skipped(scripted):
    async with open_connection(scripted.config("--noise")) as session:
        assert (await session.call_tool("echo", {"text": "fine"})).text == "fine"
        assert session.statistics().invalid_messages == 1


async def test_a_server_that_never_starts_raises_start_error_with_its_stderr(scripted):
    config = scripted.config("--fail-at-start", "config file /etc/nowhere not found")
    with pytest.raises(MCPStartError) as caught:
        async with open_connection(config):
            pytest.fail("the session must not open")
    assert caught.value.exit_code == 3
    assert caught.value.stderr_tail == "config file /etc/nowhere not found"
    assert "config file /etc/nowhere not found" in str(caught.value)
    assert "exited with code 3" in str(caught.value)


async def test_a_command_that_does_not_exist_raises_start_error():
    config = ServerConfig(name="ghost", command="/nonexistent/mcp-server")
    with pytest.raises(MCPStartError, match="could not be started"):
        async with open_connection(config):
            pytest.fail("the session must not open")


async def test_a_server_that_never_answers_the_handshake_times_out(scripted):
    # Long enough for the server to import the SDK and say it listens on a loaded machine.
    with pytest.raises(MCPHandshakeTimeout) as caught:
        async with open_connection(scripted.config("--silent", connect_timeout=5.0)):
            pytest.fail("the session must not open")
    assert caught.value.timeout == 5.0
    assert isinstance(caught.value, MCPStartError)
    assert isinstance(caught.value, MCPTimeout)
    assert "never answering" in caught.value.stderr_tail


async def test_list_changed_refreshes_the_tools_and_calls_on_tools_changed(scripted):
    changes: list[tuple[MCPTool, ...]] = []
    changed = trio.Event()

    def on_tools_changed(tools: tuple[MCPTool, ...]) -> None:
        changes.append(tools)
        changed.set()

    async with open_connection(scripted.config(), on_tools_changed=on_tools_changed) as session:
        assert "extra_1" not in {tool.name for tool in session.tools}
        await session.call_tool("add_tool", {"name": "extra_1"})
        with trio.fail_after(10):
            await changed.wait()
        assert "extra_1" in {tool.name for tool in changes[-1]}
        assert session.tools == changes[-1]
        assert (await session.call_tool("mcp__scripted__extra_1")).text == "I am extra_1"
        assert session.statistics().tool_list_refreshes >= 1


async def test_an_exception_from_on_tools_changed_propagates_from_the_block(scripted):
    class Broken(Exception):
        pass

    def on_tools_changed(tools: tuple[MCPTool, ...]) -> None:
        raise Broken

    async def use_session() -> None:
        async with open_connection(scripted.config(), on_tools_changed=on_tools_changed) as session:
            await session.call_tool("add_tool", {"name": "extra_2"})
            with trio.fail_after(10):
                await trio.sleep_forever()  # cancelled when the callback fails

    with pytest.raises(Broken):
        await use_session()


async def test_log_notifications_and_stderr_lines_reach_on_log(scripted):
    messages: list[MCPLogMessage] = []
    got_log = trio.Event()

    def on_log(message: MCPLogMessage) -> None:
        messages.append(message)
        if message.source == "notification":
            got_log.set()

    async with open_connection(scripted.config(), on_log=on_log) as session:
        await session.call_tool("log", {"message": "disk almost full"})
        with trio.fail_after(10):
            await got_log.wait()
        with pytest.raises(MCPConnectionLost):
            await session.call_tool("crash")  # writes to stderr, then exits
    notification = next(m for m in messages if m.source == "notification")
    assert (notification.level, notification.logger, notification.data) == (
        "warning",
        "scripted",
        "disk almost full",
    )
    assert any(m.source == "stderr" and m.data == "crashing on purpose" for m in messages)


async def test_calls_after_the_block_raise_closed_error(scripted):
    async with open_connection(scripted.config()) as session:
        pass
    assert session.statistics().state == "closed"
    with pytest.raises(MCPClosedError):
        await session.call_tool("echo", {"text": "late"})


async def test_a_call_in_flight_when_the_block_ends_raises_closed_error(scripted):
    errors: list[BaseException] = []

    async def call_in_background(session) -> None:
        try:
            await session.call_tool("hang")
        except MCPClosedError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        async with open_connection(scripted.config()) as session:
            nursery.start_soon(call_in_background, session)
            await trio.testing.wait_all_tasks_blocked()
    assert len(errors) == 1


async def test_an_exception_in_the_block_propagates_unwrapped(scripted):
    with pytest.raises(KeyError):
        async with open_connection(scripted.config()):
            raise KeyError("mine")


async def test_a_disabled_config_is_refused():
    config = ServerConfig(name="off", command="true", enabled=False)
    with pytest.raises(MCPConfigError, match="disabled"):
        async with open_connection(config):
            pytest.fail("the session must not open")


@pytest.mark.parametrize("exit_by", ["normal", "error", "cancellation"])
async def test_closing_leaves_no_process_of_the_servers_group(scripted, processes, exit_by):
    pgid = None
    with trio.CancelScope() as scope:
        try:
            async with open_connection(scripted.config()) as session:
                pgid = session.statistics().pid
                assert processes.group_exists(pgid)
                if exit_by == "error":
                    raise RuntimeError("the body failed")
                if exit_by == "cancellation":
                    scope.cancel()
                    await trio.sleep_forever()
        except RuntimeError:
            assert exit_by == "error"
    assert pgid is not None
    await processes.wait_group_gone(pgid)


async def test_closing_kills_children_that_ignore_sigterm(scripted, processes):
    async with open_connection(scripted.config("--spawn-child")) as session:
        pgid = session.statistics().pid
        child = int((await session.call_tool("child_pid")).text)
        assert child in processes.group_members(pgid)
        assert processes.alive(child)
    # The child ignores SIGTERM, so only the SIGKILL escalation ends it.
    assert not processes.alive(child)
    await processes.wait_group_gone(pgid)


class _FakeClient:
    """Serves tools/list pages from a dict: cursor -> (tool names, next cursor)."""

    def __init__(self, pages: dict[str | None, tuple[list[str], str | None]]) -> None:
        self.pages = pages


async def _fetch_page(client: _FakeClient, cursor: str | None) -> types.ListToolsResult:
    names, next_cursor = client.pages[cursor]
    tools = [types.Tool(name=name, input_schema={"type": "object"}) for name in names]
    return types.ListToolsResult(tools=tools, next_cursor=next_cursor)


async def test_pagination_follows_cursors_to_the_end():
    client = _FakeClient({None: (["a", "b"], "p2"), "p2": (["c"], "p3"), "p3": (["d"], None)})
    items = await _paginate(client, _fetch_page, "tools/list")  # type: ignore[arg-type]
    assert [item.name for item in items] == ["a", "b", "c", "d"]


async def test_a_repeated_cursor_is_a_protocol_error():
    client = _FakeClient({None: (["a"], "p2"), "p2": (["b"], "p2")})
    with pytest.raises(MCPProtocolError, match="repeated the pagination cursor"):
        await _paginate(client, _fetch_page, "tools/list")  # type: ignore[arg-type]
