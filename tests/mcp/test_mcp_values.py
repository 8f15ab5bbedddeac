"""Reducing MCP content to text, and the frozen values built from SDK models."""

from __future__ import annotations

import base64

import mcp_types as types
import pytest
from weald.runtime.mcp._values import (
    content_block_text,
    resource_content_from_wire,
    tool_result_from_wire,
)


def test_text_blocks_are_kept_verbatim():
    assert content_block_text(types.TextContent(type="text", text="hi\nthere")) == "hi\nthere"


def test_images_and_audio_become_placeholders_with_size():
    data = base64.b64encode(b"\x89PNG" * 25).decode()
    image = types.ImageContent(type="image", data=data, mime_type="image/png")
    audio = types.AudioContent(type="audio", data=data, mime_type="audio/wav")
    assert content_block_text(image) == "[image: image/png, 100 bytes]"
    assert content_block_text(audio) == "[audio: audio/wav, 100 bytes]"


def test_resource_links_and_embedded_resources_are_described():
    link = types.ResourceLink(type="resource_link", name="notes", uri="file:///notes.md", description="my notes")
    assert content_block_text(link) == "[resource link: notes <file:///notes.md>: my notes]"
    text = types.EmbeddedResource(
        type="resource",
        resource=types.TextResourceContents(uri="file:///a.txt", mime_type="text/plain", text="A"),
    )
    assert content_block_text(text) == "[resource: file:///a.txt (text/plain)]\nA"
    blob = types.EmbeddedResource(
        type="resource",
        resource=types.BlobResourceContents(uri="file:///b.bin", blob=base64.b64encode(b"1234").decode()),
    )
    assert content_block_text(blob) == "[resource: file:///b.bin, 4 bytes]"


def test_a_result_joins_its_blocks_and_keeps_is_error():
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text="one"), types.TextContent(type="text", text="two")],
        is_error=True,
    )
    reduced = tool_result_from_wire(result)
    assert reduced.text == "one\ntwo"
    assert reduced.is_error is True
    assert reduced.structured_content is None
    assert reduced.content == ({"type": "text", "text": "one"}, {"type": "text", "text": "two"})


def test_a_result_with_only_structured_content_shows_it_as_json():
    result = types.CallToolResult(content=[], structured_content={"b": 1, "a": "x"})
    reduced = tool_result_from_wire(result)
    assert reduced.text == '{"a": "x", "b": 1}'
    assert reduced.structured_content == {"b": 1, "a": "x"}


def test_blob_resource_contents_are_decoded_and_bad_base64_is_refused():
    good = types.BlobResourceContents(uri="file:///b", blob=base64.b64encode(b"\x00\x01").decode())
    assert resource_content_from_wire(good).blob == b"\x00\x01"
    bad = types.BlobResourceContents(uri="file:///b", blob="not base64!")
    with pytest.raises(ValueError, match="not base64"):
        resource_content_from_wire(bad)
