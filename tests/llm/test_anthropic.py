"""The Anthropic provider against a real loopback server.

Payloads follow the Messages streaming reference: named SSE events
``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta``, ``message_stop``, with ``ping`` and ``error`` at any time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from weald.runtime.llm import (
    AnthropicProvider,
    AuthenticationError,
    Completed,
    MalformedResponseError,
    Message,
    ModelRequest,
    ProviderSettings,
    StreamError,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStarted,
    ToolSpec,
    Usage,
)

from ._server import FakeServer, Reply, collect, error_reply, sse
from .conftest import KEY_ENV

pytestmark = [pytest.mark.trio, pytest.mark.timeout(20)]

MODEL = "claude-sonnet-4-5"


def event(kind: str, **fields: object) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def message_start(input_tokens: int = 25, cache_read: int = 0) -> bytes:
    return event(
        "message_start",
        message={
            "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": MODEL,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cache_read,
                "output_tokens": 1,
            },
        },
    )


def text_block(index: int, *pieces: str) -> list[bytes]:
    return [
        event("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *[
            event(
                "content_block_delta",
                index=index,
                delta={"type": "text_delta", "text": piece},
            )
            for piece in pieces
        ],
        event("content_block_stop", index=index),
    ]


def tool_block(index: int, tool_id: str, name: str, *fragments: str) -> list[bytes]:
    return [
        event(
            "content_block_start",
            index=index,
            content_block={"type": "tool_use", "id": tool_id, "name": name, "input": {}},
        ),
        event(
            "content_block_delta",
            index=index,
            delta={"type": "input_json_delta", "partial_json": ""},
        ),
        *[
            event(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": fragment},
            )
            for fragment in fragments
        ],
        event("content_block_stop", index=index),
    ]


def message_end(stop_reason: str, output_tokens: int) -> list[bytes]:
    return [
        event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        event("message_stop"),
    ]


@pytest.fixture
async def make(server: FakeServer) -> AsyncIterator[Callable[..., AnthropicProvider]]:
    """Build providers pointed at the test server; close them afterwards."""
    created: list[AnthropicProvider] = []

    def build(**settings: object) -> AnthropicProvider:
        defaults: dict[str, object] = {
            "base_url": server.url,
            "api_key_env": KEY_ENV,
            "backoff_base": 0.01,
            "backoff_cap": 0.05,
            "timeout": 5.0,
            "stall_timeout": 5.0,
        }
        defaults.update(settings)
        created.append(AnthropicProvider(MODEL, ProviderSettings(**defaults)))  # type: ignore[arg-type]
        return created[-1]

    yield build
    for provider in created:
        await provider.aclose()


Make = Callable[..., AnthropicProvider]


def hello() -> ModelRequest:
    return ModelRequest(model="", messages=[Message(role="user", content="Hi")])


async def test_text_and_tool_use_stream_and_complete(make: Make, server: FakeServer, api_key: str) -> None:
    body = [
        message_start(input_tokens=472, cache_read=100),
        event("ping"),
        *text_block(0, "Okay, ", "let me check."),
        *tool_block(1, "toolu_01", "get_weather", '{"location": ', '"San Francisco"}'),
        *tool_block(2, "toolu_02", "get_time"),
        *message_end("tool_use", 89),
    ]
    server.replies.append(Reply(body=body))
    events = await collect(make(), hello())

    assert events[:-1] == [
        TextDelta("Okay, "),
        TextDelta("let me check."),
        ToolCallStarted(index=0, id="toolu_01", name="get_weather"),
        ToolCallDelta(index=0, arguments_fragment='{"location": '),
        ToolCallDelta(index=0, arguments_fragment='"San Francisco"}'),
        ToolCallStarted(index=1, id="toolu_02", name="get_time"),
    ]
    done = events[-1]
    assert isinstance(done, Completed)
    assert done.stop_reason == "tool_use"
    assert done.message.content == "Okay, let me check."
    assert done.message.tool_calls == [
        ToolCall(
            id="toolu_01",
            name="get_weather",
            arguments={"location": "San Francisco"},
            raw_arguments='{"location": "San Francisco"}',
        ),
        ToolCall(id="toolu_02", name="get_time", arguments={}, raw_arguments=""),
    ]
    assert done.usage == Usage(input_tokens=472, output_tokens=89, cache_read_tokens=100)


async def test_request_is_sent_in_the_messages_wire_format(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(Reply(body=[message_start(), *text_block(0, "ok"), *message_end("end_turn", 2)]))
    calls = [
        ToolCall.parse(id="toolu_a", name="read_file", raw_arguments='{"path": "a"}'),
        ToolCall.parse(id="toolu_b", name="read_file", raw_arguments="{bad"),
    ]
    request = ModelRequest(
        model="",
        system="Be brief.",
        messages=[
            Message(role="user", content="Read a and b"),
            Message(role="assistant", content="Reading.", tool_calls=calls),
            Message(role="tool", content="A", tool_call_id="toolu_a"),
            Message(role="tool", content="bad args", tool_call_id="toolu_b", is_error=True),
            Message(role="user", content="Thanks"),
        ],
        tools=[ToolSpec("read_file", "Read a file.", {"type": "object"})],
    )
    await collect(make(), request)

    [seen] = server.requests
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == api_key
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in seen.headers
    body = seen.json()
    assert body["model"] == MODEL
    assert body["stream"] is True
    assert body["system"] == "Be brief."
    assert body["max_tokens"] == 8192
    assert body["tools"] == [{"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Read a and b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "A", "is_error": False},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "content": "bad args",
                    "is_error": True,
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]


async def test_an_error_event_mid_stream_is_a_stream_error(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(
        Reply(
            body=[
                message_start(),
                *text_block(0, "Hal"),
                event("error", error={"type": "overloaded_error", "message": "Overloaded"}),
            ]
        )
    )
    with pytest.raises(StreamError, match="Overloaded") as info:
        await collect(make(), hello())

    assert info.value.kind == "overloaded_error"
    assert len(server.requests) == 1  # text was already yielded: no retry


async def test_an_overloaded_error_before_any_event_is_retried(make: Make, server: FakeServer, api_key: str) -> None:
    overloaded = event("error", error={"type": "overloaded_error", "message": "Overloaded"})
    server.replies += [
        Reply(body=[message_start(), overloaded]),
        Reply(body=[message_start(), *text_block(0, "ok"), *message_end("end_turn", 1)]),
    ]
    events = await collect(make(), hello())

    assert isinstance(events[-1], Completed)
    assert len(server.requests) == 2


async def test_unknown_events_and_blocks_are_skipped(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(
        Reply(
            body=[
                message_start(),
                event(
                    "content_block_start",
                    index=0,
                    content_block={"type": "thinking", "thinking": ""},
                ),
                event(
                    "content_block_delta",
                    index=0,
                    delta={"type": "thinking_delta", "thinking": "hmm"},
                ),
                event("content_block_stop", index=0),
                event("some_future_event", detail=1),
                *text_block(1, "Answer"),
                *message_end("end_turn", 3),
            ]
        )
    )
    events = await collect(make(), hello())

    assert events[0] == TextDelta("Answer")
    assert isinstance(events[-1], Completed)
    assert events[-1].message.content == "Answer"


async def test_403_names_the_env_var_and_never_the_key(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(error_reply(403, f"key {api_key} lacks permission"))
    with pytest.raises(AuthenticationError) as info:
        await collect(make(), hello())

    assert KEY_ENV in str(info.value)
    assert "lacks permission" in str(info.value)
    assert api_key not in str(info.value)
    assert api_key not in repr(info.value)


async def test_an_error_with_status_200_quotes_the_servers_message_and_is_not_retried(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies.append(
        Reply(
            headers=(("content-type", "application/json"),),
            json_body={"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        )
    )
    with pytest.raises(MalformedResponseError) as info:
        await collect(make(), hello())

    assert str(info.value) == (
        f"anthropic: {server.url}/v1/messages answered HTTP 200 with an error "
        "instead of an event stream (overloaded_error): Overloaded"
    )
    assert len(server.requests) == 1


async def test_an_html_page_with_status_200_names_the_content_type(
    make: Make, server: FakeServer, api_key: str
) -> None:
    page = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
    server.replies.append(Reply(headers=(("content-type", "text/html"),), body=[page]))
    with pytest.raises(MalformedResponseError) as info:
        await collect(make(), hello())

    assert str(info.value) == (
        f"anthropic: {server.url}/v1/messages answered HTTP 200 with Content-Type 'text/html' "
        "instead of an event stream: '<html><body><h1>Welcome to nginx!</h1></body></html>'. "
        "Check the base URL, and that the server streams chat responses."
    )
    assert len(server.requests) == 1
