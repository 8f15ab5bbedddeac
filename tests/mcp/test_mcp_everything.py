"""Against @modelcontextprotocol/server-everything (npm), over stdio and Streamable HTTP."""

from __future__ import annotations

import shutil

import pytest
import trio
from weald.runtime.mcp import MCPConnectionLost, MCPServerError, MCPStartError, ServerConfig, open_connection

pytestmark = pytest.mark.trio


@pytest.fixture(params=["stdio", "http"])
def everything(request: pytest.FixtureRequest, node: str, everything_js) -> ServerConfig:
    if request.param == "stdio":
        return ServerConfig(name="everything", command=node, args=[str(everything_js), "stdio"])
    url = request.getfixturevalue("everything_http_url")
    return ServerConfig(name="everything", url=url)


async def test_tools_are_listed_with_registered_names(everything):
    async with open_connection(everything) as session:
        assert session.server_info.name == "mcp-servers/everything"
        assert session.capabilities.tools_list_changed
        tools = {tool.name: tool for tool in session.tools}
        assert {"echo", "get-sum", "trigger-long-running-operation"} <= set(tools)
        assert tools["get-sum"].registered_name == "mcp__everything__get-sum"
        assert tools["echo"].input_schema["type"] == "object"
        assert tools["echo"].description


async def test_echo_and_get_sum(everything):
    async with open_connection(everything) as session:
        echoed = await session.call_tool("echo", {"message": "hello from weald"})
        assert echoed.text == "Echo: hello from weald"
        summed = await session.call_tool("get-sum", {"a": 19, "b": 23})
        assert "42" in summed.text
        assert summed.is_error is False


async def test_structured_content_comes_through(everything):
    async with open_connection(everything) as session:
        result = await session.call_tool("get-structured-content", {"location": "New York"})
        assert result.structured_content is not None
        assert "temperature" in result.structured_content


async def test_an_image_block_is_reduced_to_a_placeholder(everything):
    async with open_connection(everything) as session:
        result = await session.call_tool("get-tiny-image", {})
        assert "[image: image/png," in result.text
        assert any(block["type"] == "image" for block in result.content)


async def test_a_long_running_operation_reports_progress(everything):
    progress: list[tuple[float, float | None]] = []
    async with open_connection(everything) as session:
        result = await session.call_tool(
            "trigger-long-running-operation",
            {"duration": 1, "steps": 4},
            on_progress=lambda done, total, message: progress.append((done, total)),
        )
    assert "completed" in result.text
    assert progress == [(1.0, 4.0), (2.0, 4.0), (3.0, 4.0), (4.0, 4.0)]


async def test_resources_are_listed_and_read(everything):
    async with open_connection(everything) as session:
        resources = await session.list_resources()
        assert resources
        document = next(r for r in resources if r.uri.endswith("architecture.md"))
        assert document.mime_type == "text/markdown"
        (content,) = await session.read_resource(document.uri)
        assert content.text is not None
        assert content.text.startswith("# Everything Server")
        (blob,) = await session.read_resource("demo://resource/dynamic/blob/1")
        assert blob.text is None
        assert blob.blob


async def test_reading_an_unknown_resource_raises_server_error(everything):
    async with open_connection(everything) as session:
        with pytest.raises(MCPServerError):
            await session.read_resource("demo://resource/no/such/thing")


async def test_prompts_are_listed_and_rendered(everything):
    async with open_connection(everything) as session:
        prompts = {prompt.name: prompt for prompt in await session.list_prompts()}
        assert {"simple-prompt", "args-prompt"} <= set(prompts)
        city = prompts["args-prompt"].arguments[0]
        assert (city.name, city.required) == ("city", True)
        rendered = await session.get_prompt("args-prompt", {"city": "Lisbon"})
        assert [message.role for message in rendered.messages] == ["user"]
        assert "Lisbon" in rendered.messages[0].text


async def test_npx_started_server_leaves_no_node_process_behind(everything_prefix, processes):
    npx = shutil.which("npx")
    assert npx is not None
    # npx resolves the package from node_modules under cwd: no network, but
    # the real npx -> sh -> node chain of processes.
    config = ServerConfig(
        name="everything",
        command=npx,
        args=["--no-install", "mcp-server-everything", "stdio"],
        cwd=everything_prefix,
    )
    async with open_connection(config) as session:
        pgid = session.statistics().pid
        with trio.fail_after(5):
            # Polled: nothing signals that npx has started its node child.
            while True:
                members = processes.group_members(pgid)
                if len(members) >= 3:  # npm exec, sh, node
                    break
                await trio.sleep(0.05)
        nodes = [pid for pid in members if "node" in processes.command_line(pid)]
        assert any("mcp-server-everything" in processes.command_line(pid) for pid in nodes)
        assert (await session.call_tool("echo", {"message": "via npx"})).text == "Echo: via npx"
    assert [pid for pid in members if processes.alive(pid)] == []
    await processes.wait_group_gone(pgid)


async def test_an_http_server_that_dies_mid_call_ends_the_call_with_connection_lost(own_everything_http):
    process, url = own_everything_http

    async def kill_when_the_call_is_running() -> None:
        await trio.sleep(0.3)  # the operation below takes 30 s
        process.kill()

    async with open_connection(ServerConfig(name="everything", url=url, call_timeout=60.0)) as session:
        # The SDK's transport tries to resume the SSE stream twice, a second
        # apart, before it gives the call up; far below the call timeout.
        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_when_the_call_is_running)
                with pytest.raises(MCPConnectionLost, match="response stream"):
                    await session.call_tool("trigger-long-running-operation", {"duration": 30, "steps": 30})
            with pytest.raises(MCPConnectionLost, match="connection lost"):
                await session.call_tool("echo", {"message": "anyone there?"})
        assert session.statistics().state == "lost"


async def test_a_server_that_speaks_only_http_sse_is_reached_by_the_fallback(everything_sse_url: str) -> None:
    """Streamable HTTP's POST gets 404, so the legacy transport's GET opens the event stream (2024-11-05)."""
    async with open_connection(ServerConfig(name="legacy", url=everything_sse_url)) as session:
        assert session.statistics().legacy_sse is True
        assert "echo" in {tool.name for tool in session.tools}
        echoed = await session.call_tool("echo", {"message": "over SSE"})
        assert echoed.text == "Echo: over SSE"
        image = await session.call_tool("get-tiny-image", {})
        assert [i.mime_type for i in image.images] == ["image/png"]
        resources = await session.list_resources()
        assert resources


async def test_a_wrong_url_fails_both_transports_and_says_so(everything_http_url: str) -> None:
    wrong = everything_http_url.replace("/mcp", "/nope")
    with pytest.raises(MCPStartError) as failed:
        async with open_connection(ServerConfig(name="wrong", url=wrong)):
            pass
    assert str(failed.value) == (
        f"MCP server 'wrong' failed to start: could not reach {wrong}: HTTP error: Client error '404 Not Found' "
        f"for url '{wrong}' (the Streamable HTTP initialize was answered HTTP 404, so the legacy HTTP+SSE "
        "transport was tried too)"
    )
