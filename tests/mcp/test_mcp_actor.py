"""MCPConnection: real servers behind a real actor in a real ActorSystem.

Calls go through `weald.tools.invoke` on the system's loop, as the tool
runner will make them; waiting is by condition or event, never by sleeping.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import pytest
import trio
from weald.runtime import REDACTED, ActorSystem, Ref
from weald.runtime.agents.tool_runner import RunnerConfig, RunTools, ToolCallRequest, ToolRunner
from weald.runtime.mcp import (
    MCPConfigError,
    MCPConnection,
    MCPServerError,
    MCPTool,
    ServerConfig,
)
from weald.runtime.mcp._registry import TOOL_TIMEOUT_GRACE, build_tool, tool_parameters
from weald.runtime.testing import wait_for_event, wait_mcp_running, wait_until
from weald.tools import Tool, ToolContext, ToolRegistry, ToolResult, invoke


@pytest.fixture
def registry() -> ToolRegistry:
    """A registry holding one built-in-style tool, as the daemon's would."""

    def word_count(ctx: ToolContext, text: str) -> str:
        return str(len(text.split()))

    builtin = Tool(
        name="word_count",
        description="Count words.",
        parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        fn=word_count,
    )
    return ToolRegistry([builtin])


def connect(system: ActorSystem, config: ServerConfig, registry: ToolRegistry) -> Ref[MCPConnection]:
    ref = system.spawn(MCPConnection, args=(config, registry), name=config.name)
    ref.started().get(timeout=30)
    wait_mcp_running(ref)
    return ref


def call(
    system: ActorSystem,
    registry: ToolRegistry,
    name: str,
    arguments: Mapping[str, Any],
    emitted: list[tuple[str, dict[str, Any]]] | None = None,
) -> ToolResult:
    def emit(kind: str, data: Mapping[str, Any]) -> None:
        if emitted is not None:
            emitted.append((kind, dict(data)))

    registered = registry.get(name)
    assert registered is not None, f"{name} is not registered: {registry.names()}"
    ctx = ToolContext(working_dir=".", emit=emit, tool_name=name)
    return system.loop.run(invoke, registered, ctx, arguments)


@pytest.fixture
def everything(node: str, everything_js) -> ServerConfig:
    return ServerConfig(name="everything", command=node, args=[str(everything_js), "stdio"])


def test_server_tools_register_beside_the_built_in_ones_and_calls_work(system, registry, everything):
    connect(system, everything, registry)
    names = registry.names()
    assert "word_count" in names
    assert {"mcp__everything__echo", "mcp__everything__get-sum"} <= set(names)
    echo = registry.get("mcp__everything__echo")
    assert echo is not None
    assert (echo.kind, echo.permission, echo.is_async) == ("mcp", "ask", True)
    assert echo.timeout == everything.call_timeout + everything.ping_timeout + TOOL_TIMEOUT_GRACE
    assert echo.parameters["type"] == "object"
    assert echo.description

    echoed = call(system, registry, "mcp__everything__echo", {"message": "hello from weald"})
    assert echoed == ToolResult(ok=True, output="Echo: hello from weald")
    summed = call(system, registry, "mcp__everything__get-sum", {"a": 19, "b": 23})
    assert summed.ok
    assert "42" in summed.output
    event = wait_for_event(system.events, "mcp.connected")
    assert event.source == "/everything"
    assert event.data["tools"] == len([n for n in names if n.startswith("mcp__everything__")])
    assert event.data["server_info"]["name"] == "mcp-servers/everything"


def test_progress_notifications_stream_to_ctx_emit_as_output(system, registry, everything):
    connect(system, everything, registry)
    emitted: list[tuple[str, dict[str, Any]]] = []
    result = call(
        system,
        registry,
        "mcp__everything__trigger-long-running-operation",
        {"duration": 0.4, "steps": 4},
        emitted,
    )
    assert result.ok
    assert [kind for kind, _ in emitted] == ["output"] * 4
    assert [(data["progress"], data["total"]) for _, data in emitted] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [data["text"] for _, data in emitted] == [f"progress {n}/4\n" for n in range(1, 5)]
    assert all(data["stream"] == "progress" and "message" in data for _, data in emitted)


def test_a_real_servers_progress_reaches_the_event_bus_as_tool_output_of_its_call(
    system, registry, everything, tmp_path
):
    connect(system, everything, registry)
    name = "mcp__everything__trigger-long-running-operation"
    runner = system.spawn(
        ToolRunner,
        args=("s1", tmp_path),
        kwargs={"registry": registry, "config": RunnerConfig(permissions={name: "allow"}), "output_dir": tmp_path},
        name="runner",
    )
    call = ToolCallRequest("call-7", name, {"duration": 0.4, "steps": 4})
    runner.tell(RunTools("b1", (call,), None, None, agent_id="a1", agent_path="/sessions/s1/agent"))

    finished = wait_for_event(system.events, "tool.finished", lambda e: e.data["call_id"] == "call-7", timeout=30)
    assert finished.data["ok"] is True
    outputs = system.events.recent(100, topic="tool.output", where=lambda e: e.data["call_id"] == "call-7")
    assert [(e.data["progress"], e.data["total"]) for e in outputs] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [e.data["text"] for e in outputs] == [f"progress {n}/4\n" for n in range(1, 5)]
    for event in outputs:
        assert event.source == "/runner"
        assert event.seq < finished.seq
        assert event.data["tool"] == name
        assert event.data["agent"] == "/sessions/s1/agent"
        assert event.data["stream"] == "progress"
        assert event.data["message"] is None  # server-everything sends no message


def test_progress_messages_are_shown_in_the_output_text(system, registry, scripted):
    connect(system, scripted.config(), registry)
    emitted: list[tuple[str, dict[str, Any]]] = []
    assert call(system, registry, "mcp__scripted__slow", {"seconds": 0.2, "steps": 2}, emitted).ok
    assert [data["text"] for _, data in emitted] == ["step 1 of 2 (1/2)\n", "step 2 of 2 (2/2)\n"]
    assert [data["message"] for _, data in emitted] == ["step 1 of 2", "step 2 of 2"]


def test_structured_content_goes_to_data(system, registry, everything):
    connect(system, everything, registry)
    result = call(system, registry, "mcp__everything__get-structured-content", {"location": "New York"})
    assert result.ok
    assert isinstance(result.data, dict)
    assert "temperature" in result.data


def test_resources_and_prompts_come_through_the_proxy(system, registry, everything):
    ref = connect(system, everything, registry)
    proxy = ref.proxy()
    resources = proxy.list_resources().get(timeout=5).get(timeout=30)
    document = next(r for r in resources if r.uri.endswith("architecture.md"))
    (content,) = proxy.read_resource(document.uri).get(timeout=5).get(timeout=30)
    assert content.text is not None
    assert content.text.startswith("# Everything Server")
    prompts = {p.name for p in proxy.list_prompts().get(timeout=5).get(timeout=30)}
    assert "args-prompt" in prompts
    rendered = proxy.get_prompt("args-prompt", {"city": "Lisbon"}).get(timeout=5).get(timeout=30)
    assert "Lisbon" in rendered.messages[0].text
    with pytest.raises(MCPServerError):
        proxy.read_resource("demo://resource/no/such/thing").get(timeout=5).get(timeout=30)


def test_calls_run_concurrently_without_holding_the_mailbox(system, registry, scripted):
    ref = connect(system, scripted.config(), registry)
    slow = registry.get("mcp__scripted__slow")
    assert slow is not None
    results: list[ToolResult] = []

    async def three_slow_calls_and_a_snapshot() -> int:
        ctx = ToolContext(working_dir=".")
        async with trio.open_nursery() as nursery:
            for _ in range(3):

                async def one() -> None:
                    results.append(await invoke(slow, ctx, {"seconds": 1.0, "steps": 2}))

                nursery.start_soon(one)

            # The actor answers while all three calls are waiting on the server.
            seen = 0
            with trio.fail_after(5):
                while seen != 3:
                    seen = (await ref.proxy().snapshot()).calls_in_flight
                    await trio.lowlevel.checkpoint()
            return seen

    assert system.loop.run(three_slow_calls_and_a_snapshot) == 3
    assert [r.output for r in results] == ["slept 1.0"] * 3
    assert ref.proxy().snapshot().get(timeout=5).calls_in_flight == 0


def test_tool_errors_and_rejections_are_error_results(system, registry, scripted):
    connect(system, scripted.config(), registry)
    failed = call(system, registry, "mcp__scripted__fail", {"reason": "no such branch"})
    assert failed.ok is False
    rejected = call(system, registry, "mcp__scripted__reject", {"reason": "bad input"})
    assert rejected.ok is False
    assert "rejected the call to mcp__scripted__reject: rejected: bad input" in rejected.output
    invalid = call(system, registry, "mcp__scripted__echo", {"text": 12})
    assert invalid.ok is False
    assert "text: expected string" in invalid.output


def test_list_changed_refreshes_the_registered_tools(system, registry, scripted):
    connect(system, scripted.config(), registry)
    added = call(system, registry, "mcp__scripted__add_tool", {"name": "extra_1"})
    assert added.output == "added extra_1"
    event = wait_for_event(system.events, "mcp.tools_changed")
    assert event.data["added"] == ["mcp__scripted__extra_1"]
    assert event.data["removed"] == []
    assert "mcp__scripted__extra_1" in event.data["tools"]
    assert call(system, registry, "mcp__scripted__extra_1", {}).output == "I am extra_1"


def test_mcp_server_time_works_through_the_actor(system, registry):
    config = ServerConfig(name="time", command=sys.executable, args=["-m", "mcp_server_time"])
    connect(system, config, registry)
    result = call(system, registry, "mcp__time__get_current_time", {"timezone": "UTC"})
    assert result.ok
    assert result.data["timezone"] == "UTC"
    bad = call(system, registry, "mcp__time__get_current_time", {"timezone": "Mars/Olympus_Mons"})
    assert bad.ok is False
    assert "Mars/Olympus_Mons" in bad.output


def test_stopping_unregisters_the_tools_and_kills_the_process_group(system, registry, scripted, processes):
    ref = connect(system, scripted.config("--spawn-child"), registry)
    snapshot = ref.proxy().snapshot().get(timeout=5)
    assert snapshot.status == "running"
    assert snapshot.session is not None
    pgid = snapshot.session.pid
    child = int(call(system, registry, "mcp__scripted__child_pid", {}).output)
    assert processes.alive(child)
    kept = registry.get("mcp__scripted__echo")

    assert ref.stop(timeout=15) is True
    assert [n for n in registry.names() if n.startswith("mcp__")] == []
    assert "word_count" in registry
    assert not processes.alive(child)
    wait_until(lambda: not processes.group_exists(pgid), timeout=15, message=f"process group {pgid} to go")
    stopped = wait_for_event(system.events, "mcp.disconnected")
    assert (stopped.data["reason"], stopped.data["restarting"]) == ("stopped", False)
    # A tool object kept from before is still safe to call: it says why it cannot run.
    assert kept is not None
    late = system.loop.run(invoke, kept, ToolContext(working_dir="."), {"text": "anyone?"})
    assert late.ok is False
    assert "was stopped; its tools are not available" in late.output


def test_snapshot_redacts_header_values_over_http(system, registry, everything_http_url):
    secret = "sekret-token-0123456789"
    config = ServerConfig(
        name="everything",
        url=everything_http_url,
        headers={"Authorization": f"Bearer {secret}", "X-Trace": "trace-value"},
    )
    ref = connect(system, config, registry)
    assert call(system, registry, "mcp__everything__echo", {"message": "over http"}).output == "Echo: over http"
    snapshot = ref.proxy().snapshot().get(timeout=5)
    assert snapshot.transport == "http"
    assert snapshot.headers == {"Authorization": REDACTED, "X-Trace": REDACTED}
    assert secret not in repr(snapshot)
    assert "trace-value" not in repr(snapshot)
    assert snapshot.endpoint == everything_http_url
    assert snapshot.restarts == 0
    assert "mcp__everything__echo" in snapshot.tools


def test_a_name_taken_by_another_tool_gets_a_hashed_suffix(system, registry, scripted):
    imposter = registry.register(
        Tool(
            name="mcp__scripted__echo",
            description="Someone else's.",
            parameters={"type": "object"},
            fn=lambda ctx: "not the server",
        )
    )
    ref = connect(system, scripted.config(), registry)
    ours = [n for n in registry.names() if n.startswith("mcp__scripted__echo_")]
    assert len(ours) == 1
    assert call(system, registry, ours[0], {"text": "hi"}).output == "hi"
    ref.stop(timeout=15)
    assert registry.get("mcp__scripted__echo") is imposter
    assert ours[0] not in registry


def test_a_disabled_server_is_refused(system, registry):
    config = ServerConfig(name="off", command=sys.executable, enabled=False)
    with pytest.raises(MCPConfigError, match="disabled"):
        system.spawn(MCPConnection, args=(config, registry), name="off")


def test_a_server_that_cannot_start_crashes_its_actor_just_after_start_with_the_stderr_tail(system, registry, scripted):
    config = scripted.config("--fail-at-start", "no API token configured")
    ref = system.spawn(MCPConnection, args=(config, registry), name="bad")
    # on_start returns at once (so a supervisor backs off); the crash follows.
    ref.started().get(timeout=30)
    exit_ = ref.exited().get(timeout=15)
    assert exit_.kind == "crashed"
    assert "no API token configured" in str(exit_.error)
    event = wait_for_event(system.events, "mcp.disconnected")
    assert (event.data["during"], event.data["attempt"], event.data["exit_code"]) == ("start", 1, 3)
    assert "no API token configured" in event.data["stderr_tail"]
    assert "failed to start" in event.data["reason"]
    assert [n for n in registry.names() if n.startswith("mcp__")] == []


def test_an_invalid_input_schema_is_registered_permissively_with_a_note():
    parameters, validator, note = tool_parameters({"type": "object", "properties": {"a": {"type": 12}}})
    assert parameters == {"type": "object"}
    assert note is not None
    assert "not valid JSON Schema" in note
    assert validator.is_valid({"anything": [1, 2]})

    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}},
    }
    parameters, validator, note = tool_parameters(draft7)
    assert (parameters, note) == (draft7, None)
    assert not validator.is_valid({"n": 0})

    parameters, _, note = tool_parameters({"properties": {"x": {"type": "string"}}})
    assert parameters["type"] == "object"
    assert note is None

    broken = MCPTool(
        server="s", name="t", registered_name="mcp__s__t", description="Does t.", input_schema={"type": "string"}
    )
    registered = build_tool(broken, "mcp__s__t", lambda ctx: "", permission="ask", call_timeout=5.0)  # type: ignore[arg-type]
    assert registered.parameters == {"type": "object"}
    assert registered.description.startswith("Does t.\n\nNote: the server's input schema")


def test_killing_the_connection_answers_the_call_in_flight_and_still_ends_the_server(
    system, registry, scripted, processes
):
    ref = connect(system, scripted.config(), registry)
    pgid = ref.proxy().snapshot().get(timeout=5).session.pid
    slow = registry.get("mcp__scripted__slow")
    assert slow is not None

    async def call_then_kill() -> ToolResult:
        results: list[ToolResult] = []
        with trio.fail_after(10):  # the call is answered at once, not when the 30 s tool ends
            async with trio.open_nursery() as nursery:

                async def one() -> None:
                    results.append(await invoke(slow, ToolContext(working_dir="."), {"seconds": 30, "steps": 1}))

                nursery.start_soon(one)
                while (await ref.proxy().snapshot()).calls_in_flight != 1:
                    await trio.lowlevel.checkpoint()
                ref.kill()
        return results[0]

    result = system.loop.run(call_then_kill)
    assert result.ok is False
    assert "the call did not complete" in result.output
    assert ref.exited().get(timeout=10).kind == "killed"
    wait_until(lambda: not processes.group_exists(pgid), timeout=15, message=f"process group {pgid} to go")


def test_a_server_that_never_answers_the_handshake_fails_its_start_after_connect_timeout(system, registry, scripted):
    # 5 s: the server writes its stderr line after importing the SDK, which takes seconds on a loaded machine.
    ref = system.spawn(MCPConnection, args=(scripted.config("--silent", connect_timeout=5.0), registry), name="mute")
    ref.started().get(timeout=10)
    assert ref.exited().get(timeout=30).kind == "crashed"
    event = wait_for_event(system.events, "mcp.disconnected")
    assert event.data["during"] == "start"
    assert "did not complete the handshake within 5 s" in event.data["reason"]
    assert "listening, but never answering" in event.data["stderr_tail"]
