"""What a server sends reaches the model: images, embedded resources, resource links, and resources read on demand.

Against the real server-everything, under the real ``mcp`` supervisor.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from weald.runtime import ActorSystem
from weald.runtime.agents.agent import AgentConfig
from weald.runtime.agents.session import SessionConfig, agent_path, session_spec
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.llm import ScriptedProvider
from weald.runtime.mcp import ServerConfig, mcp_supervisor_spec
from weald.runtime.mcp._values import MAX_IMAGE_BYTES, MAX_IMAGES, tool_result_from_wire
from weald.runtime.testing import wait_mcp_running, wait_until
from weald.supervisors import DynamicSupervisor
from weald.tools import ToolContext, ToolImage, ToolRegistry, ToolResult, invoke

sys.path.append(str(Path(__file__).parents[1]))  # tests/llm's loopback model
sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))  # the daemon harness, shared
sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))  # the OpenAI-format fake
from daemon_harness import DaemonProcess
from fake_openai import FakeOpenAI
from llm._server import (
    LoopbackModel,
    Reply,
    anthropic_message_end,
    anthropic_message_start,
    anthropic_text_block,
    anthropic_tool_block,
)


@pytest.fixture
def everything(system: ActorSystem, node: str, everything_js: Path) -> ToolRegistry:
    registry = ToolRegistry()
    config = ServerConfig(name="everything", command=node, args=[str(everything_js), "stdio"])
    system.root.proxy().start_child(mcp_supervisor_spec([config], registry, permission="allow")).get(timeout=30)
    wait_mcp_running(system.whereis("/mcp/everything"))
    return registry


def call(system: ActorSystem, registry: ToolRegistry, name: str, arguments: Mapping[str, Any]) -> ToolResult:
    registered = registry.get(name)
    assert registered is not None, f"{name} is not registered: {registry.names()}"
    return system.loop.run(invoke, registered, ToolContext(working_dir="."), arguments)


def test_an_image_in_a_tool_result_comes_back_as_an_image(system: ActorSystem, everything: ToolRegistry) -> None:
    result = call(system, everything, "mcp__everything__get-tiny-image", {})
    assert result.ok
    (image,) = result.images
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.data).startswith(b"\x89PNG\r\n\x1a\n")
    assert "[image: image/png, 4033 bytes]" in result.output
    assert "not shown" not in result.output


def test_embedded_resources_and_resource_links_reach_the_model_as_text(
    system: ActorSystem, everything: ToolRegistry
) -> None:
    # An embedded blob of a text type is decoded for the model.
    embedded = call(
        system, everything, "mcp__everything__get-resource-reference", {"resourceType": "Blob", "resourceId": 2}
    )
    assert "[resource: demo://resource/dynamic/blob/2 (text/plain)]\nResource 2: This is a base64 blob" in (
        embedded.output
    )
    links = call(system, everything, "mcp__everything__get-resource-links", {"count": 2})
    assert "[resource link: Blob Resource 1 <demo://resource/dynamic/blob/1> (text/plain)" in links.output


def test_the_model_lists_and_reads_resources_with_the_built_in_tools(
    system: ActorSystem, everything: ToolRegistry
) -> None:
    assert {"mcp_list_resources", "mcp_read_resource"} <= set(everything.names())
    listed = call(system, everything, "mcp_list_resources", {})
    assert listed.ok
    assert listed.output.startswith("everything: 7 resources\n")
    assert "- demo://resource/static/document/architecture.md  architecture.md (text/markdown)" in listed.output
    uris = [r["uri"] for r in listed.data["resources"]["everything"]]
    assert "demo://resource/static/document/features.md" in uris

    read = call(
        system,
        everything,
        "mcp_read_resource",
        {"server": "everything", "uri": "demo://resource/static/document/architecture.md"},
    )
    assert read.ok
    assert read.output.startswith("# Everything Server")
    # A resource a link pointed at (a template, not listed): its text-typed blob decoded.
    blob = call(
        system, everything, "mcp_read_resource", {"server": "everything", "uri": "demo://resource/dynamic/blob/1"}
    )
    assert blob.ok
    assert blob.output.startswith("Resource 1:")

    missing = call(system, everything, "mcp_read_resource", {"server": "everything", "uri": "demo://no/such/thing"})
    assert missing.ok is False
    assert missing.output.startswith("could not read demo://no/such/thing from MCP server 'everything': ")
    unknown = call(system, everything, "mcp_list_resources", {"server": "nosuch"})
    assert unknown.ok is False
    assert "there is no MCP server named 'nosuch'; the configured servers are: everything" in unknown.output


def test_the_resource_tools_leave_with_the_mcp_subtree(system: ActorSystem, everything: ToolRegistry) -> None:
    system.root.proxy().terminate_child("mcp").get(timeout=30)
    assert [name for name in everything.names() if name.startswith("mcp")] == []


def png(size: int) -> str:
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * (size - 8)).decode()


def test_images_past_the_caps_or_of_other_types_are_described_not_sent() -> None:
    def image(data: str, mime: str = "image/png") -> types.ImageContent:
        return types.ImageContent(type="image", data=data, mime_type=mime)

    blocks: list[types.ContentBlock] = [
        image(png(MAX_IMAGE_BYTES + 1)),
        image(png(100), "image/tiff"),
        *[image(png(100)) for _ in range(MAX_IMAGES + 1)],
        types.EmbeddedResource(
            type="resource",
            resource=types.BlobResourceContents(uri="file:///shot.png", mime_type="image/png", blob=png(50)),
        ),
    ]
    result = tool_result_from_wire(types.CallToolResult(content=blocks))
    lines = result.text.splitlines()
    assert lines[0] == (
        f"[image: image/png, {MAX_IMAGE_BYTES + 1} bytes; not shown: over the {MAX_IMAGE_BYTES}-byte limit "
        "for an image sent to the model]"
    )
    assert lines[1].startswith("[image: image/tiff, 100 bytes; not shown: image/tiff is not a type models take")
    assert lines[2 : 2 + MAX_IMAGES] == ["[image: image/png, 100 bytes]"] * MAX_IMAGES
    assert lines[2 + MAX_IMAGES] == (
        f"[image: image/png, 100 bytes; not shown: past the {MAX_IMAGES} images one result sends to the model]"
    )
    assert lines[-1].startswith("[resource: file:///shot.png (image/png), 50 bytes; not shown: past the")
    assert result.images == (ToolImage("image/png", png(100)),) * MAX_IMAGES


# -- through a real daemon to a real model wire format --------------------------------------------------


def test_an_image_reaches_the_model_request_in_both_wire_formats(
    tmp_path: Path, node: str, everything_js: Path
) -> None:
    """get-tiny-image through a real daemon: an OpenAI-format and an Anthropic-format loopback model see the PNG."""
    image_tool = "mcp__everything__get-tiny-image"
    with FakeOpenAI() as openai, LoopbackModel() as anthropic:
        openai.tool_call(image_tool, {}).text("a small logo")
        anthropic.server.replies.append(
            Reply(
                body=[
                    anthropic_message_start(),
                    *anthropic_tool_block(0, "toolu_1", image_tool, "{}"),
                    *anthropic_message_end("tool_use", 9),
                ]
            )
        )
        anthropic.server.replies.append(
            Reply(
                body=[
                    anthropic_message_start(),
                    *anthropic_text_block(0, "a small logo"),
                    *anthropic_message_end("end_turn", 4),
                ]
            )
        )
        config = f"""
[providers.oai]
kind = "openai"
base_url = "{openai.url}"
api_key_required = false

[providers.ant]
kind = "anthropic"
base_url = "{anthropic.server.url}"
api_key_required = false

[mcp.servers.everything]
command = "{node}"
args = ["{everything_js}", "stdio"]

[tools.permissions]
"{image_tool}" = "allow"
"""
        daemon = DaemonProcess(tmp_path, extra_config=config)
        try:
            daemon.start()
            daemon.wait_mcp("everything")
            with daemon.client() as c:
                for agent, model in (("o", "oai:gpt-test"), ("a", "ant:claude-test")):
                    c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": agent})
                    result = c.call("agent.prompt", {"agent_id": agent, "text": "show me the logo"}, timeout=60)
                    assert result["ok"], result
                history = c.call("agent.history", {"agent_id": "o"})["messages"]
            assert daemon.terminate() == 0, daemon.log.read_text()
        finally:
            daemon.close()

    # agent.history keeps the image with its tool result.
    tool_message = next(m for m in history if m["role"] == "tool")
    (kept,) = tool_message["images"]
    assert kept["mime_type"] == "image/png"
    assert base64.b64decode(kept["data"]).startswith(b"\x89PNG")

    # OpenAI: the tool message holds the text; a user message after it carries the image as a data URL.
    messages = openai.requests[1]["messages"]
    tool_at = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    assert messages[tool_at]["tool_call_id"] == "call_1"
    assert "[image: image/png, 4033 bytes]" in messages[tool_at]["content"]
    carrier = messages[tool_at + 1]
    assert carrier["role"] == "user"
    label, part = carrier["content"]
    assert label == {"type": "text", "text": f"[1 image returned by tool call call_1 ({image_tool})]"}
    assert part["type"] == "image_url"
    assert part["image_url"]["url"] == f"data:image/png;base64,{kept['data']}"

    # Anthropic: the image block sits inside the tool_result, after its text.
    sent = anthropic.requests()[1]["messages"]
    (result_block,) = sent[-1]["content"]
    assert result_block["type"] == "tool_result"
    assert result_block["tool_use_id"] == "toolu_1"
    text, image = result_block["content"]
    assert text["type"] == "text"
    assert "[image: image/png, 4033 bytes]" in text["text"]
    assert image == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": kept["data"]}}


def test_the_scripted_provider_records_the_image_an_agent_sent_it(
    system: ActorSystem, everything: ToolRegistry, tmp_path: Path
) -> None:
    script = {"turns": [{"tool_calls": [{"name": "mcp__everything__get-tiny-image", "arguments": {}}]}, {"text": "ok"}]}
    providers: list[ScriptedProvider] = []

    def provider_factory(model: str) -> ScriptedProvider:
        providers.append(ScriptedProvider.from_dict(script))
        return providers[-1]

    sessions = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 10}, name="sessions")
    config = SessionConfig("s1", str(tmp_path), AgentConfig(model="scripted:inline"), RunnerConfig())
    spec = session_spec(config, system=system, registry=everything, provider_factory=provider_factory)
    sessions.proxy().start_child(spec).get(timeout=10)
    agent = wait_until(lambda: system.whereis(agent_path("s1")))
    turn = agent.proxy().prompt("the logo, please").get(timeout=10).get(timeout=60)
    assert turn.ok, turn
    (provider,) = providers
    seen = provider.requests[1].messages[-1]
    assert seen.role == "tool"
    (image,) = seen.images
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.data).startswith(b"\x89PNG")
    (kept,) = [m for m in agent.proxy().history().get(timeout=10) if m.role == "tool"]
    assert kept.images == seen.images
