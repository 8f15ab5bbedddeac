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
    Image,
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

from ._server import FakeServer, Reply, collect, error_reply
from ._server import anthropic_event as event
from ._server import anthropic_message_end as message_end
from ._server import anthropic_message_start as message_start
from ._server import anthropic_text_block as text_block
from ._server import anthropic_tool_block as tool_block
from .conftest import KEY_ENV

pytestmark = [pytest.mark.trio, pytest.mark.timeout(20)]

MODEL = "claude-sonnet-4-5"


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


async def test_images_go_inside_the_tool_result_and_beside_user_text(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies.append(Reply(body=[message_start(), *text_block(0, "ok"), *message_end("end_turn", 1)]))
    png = Image("image/png", "iVBORw0KGgo=")
    calls = [ToolCall.parse(id=f"toolu_{n}", name="shot", raw_arguments="{}") for n in (1, 2)]
    request = ModelRequest(
        model="",
        messages=[
            Message(role="user", content="Look", images=[png]),
            Message(role="assistant", content="", tool_calls=calls),
            Message(role="tool", content="a shot", tool_call_id="toolu_1", images=[png]),
            Message(role="tool", content="", tool_call_id="toolu_2", images=[png]),
        ],
    )
    await collect(make(), request)

    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    messages = server.requests[0].json()["messages"]
    assert messages[0] == {"role": "user", "content": [{"type": "text", "text": "Look"}, block]}
    assert messages[2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "a shot"}, block],
                "is_error": False,
            },
            # No empty text block: the API refuses them.
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [block], "is_error": False},
        ],
    }


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
