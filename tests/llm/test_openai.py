"""The OpenAI-compatible provider against a real loopback server.

Payloads follow the Chat Completions streaming reference: each SSE event is a
``chat.completion.chunk``; with ``stream_options.include_usage`` the last
chunk before ``data: [DONE]`` has empty ``choices`` and the usage.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable

import pytest
import trio
from weald.runtime.llm import (
    AuthenticationError,
    BadRequestError,
    Completed,
    Image,
    MalformedResponseError,
    Message,
    MissingAPIKeyError,
    ModelNotFoundError,
    ModelRequest,
    OpenAIProvider,
    ProviderConnectionError,
    ProviderSettings,
    ProviderTimeout,
    RateLimitError,
    ServerError,
    StallTimeout,
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

MODEL = "gpt-4.1"


def chunk(delta: dict[str, object] | None = None, finish_reason: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": MODEL,
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [
            {
                "index": 0,
                "delta": delta if delta is not None else {},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": None,
    }


def usage_chunk(prompt: int, completion: int, cached: int = 0) -> dict[str, object]:
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
    }


def text_stream(*pieces: str, usage: tuple[int, int, int] = (10, 5, 0)) -> list[bytes]:
    body = [sse(chunk({"role": "assistant", "content": ""}))]
    body += [sse(chunk({"content": piece})) for piece in pieces]
    body.append(sse(chunk({}, finish_reason="stop")))
    body.append(sse(usage_chunk(*usage)))
    body.append(b"data: [DONE]\n\n")
    return body


@pytest.fixture
async def make(server: FakeServer) -> AsyncIterator[Callable[..., OpenAIProvider]]:
    """Build providers pointed at the test server; close them afterwards."""
    created: list[OpenAIProvider] = []

    def build(**settings: object) -> OpenAIProvider:
        defaults: dict[str, object] = {
            "base_url": server.url + "/v1",
            "api_key_env": KEY_ENV,
            "backoff_base": 0.01,
            "backoff_cap": 0.05,
            "timeout": 5.0,
            "stall_timeout": 5.0,
        }
        defaults.update(settings)
        created.append(OpenAIProvider(MODEL, ProviderSettings(**defaults)))  # type: ignore[arg-type]
        return created[-1]

    yield build
    for provider in created:
        await provider.aclose()


Make = Callable[..., OpenAIProvider]


def hello() -> ModelRequest:
    return ModelRequest(model="", messages=[Message(role="user", content="Hi")])


async def test_text_streams_as_deltas_and_completes_with_the_whole_message(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies.append(Reply(body=text_stream("Hel", "lo ", "there")))
    events = await collect(make(), hello())

    assert events[:3] == [TextDelta("Hel"), TextDelta("lo "), TextDelta("there")]
    assert isinstance(events[-1], Completed)
    assert events[-1].message == Message(role="assistant", content="Hello there")
    assert events[-1].stop_reason == "end_turn"
    assert len(events) == 4


async def test_request_is_sent_in_the_chat_completions_wire_format(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies.append(Reply(body=text_stream("ok")))
    call = ToolCall.parse(id="call_1", name="read_file", raw_arguments='{"path": "a"}')
    request = ModelRequest(
        model="",
        system="Be brief.",
        messages=[
            Message(role="user", content="Read a", name="alice"),
            Message(role="assistant", content="", tool_calls=[call]),
            Message(role="tool", content="no such file", tool_call_id="call_1", is_error=True),
        ],
        tools=[ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {}})],
        max_tokens=100,
        temperature=0.5,
    )
    await collect(make(extra_headers={"x-trace": "t1"}), request)

    [seen] = server.requests
    assert seen.method == "POST"
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {api_key}"
    assert seen.headers["x-trace"] == "t1"
    body = seen.json()
    assert body["model"] == MODEL
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 100
    assert body["temperature"] == 0.5
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Read a", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Error: no such file"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]


PNG = Image("image/png", "iVBORw0KGgo=")
JPEG = Image("image/jpeg", "/9j/4AAQ")


async def test_images_of_tool_results_follow_them_in_a_user_message_and_user_images_are_parts(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies.append(Reply(body=text_stream("ok")))
    calls = [ToolCall.parse(id=f"call_{n}", name="shot", raw_arguments="{}") for n in (1, 2, 3)]
    request = ModelRequest(
        model="",
        messages=[
            Message(role="user", content="Look", images=[JPEG]),
            Message(role="assistant", content="", tool_calls=calls),
            Message(role="tool", content="two shots", tool_call_id="call_1", name="shot", images=[PNG, PNG]),
            Message(role="tool", content="none", tool_call_id="call_2", name="shot"),
            Message(role="tool", content="one", tool_call_id="call_3", name="shot", images=[JPEG]),
            Message(role="user", content="and now?"),
        ],
    )
    await collect(make(), request)

    url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    jpeg = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}}
    messages = server.requests[0].json()["messages"]
    assert messages[0] == {"role": "user", "content": [{"type": "text", "text": "Look"}, jpeg]}
    # Every tool result directly after the calls; then their images, each labelled with its call.
    assert [m["role"] for m in messages[1:]] == ["assistant", "tool", "tool", "tool", "user", "user"]
    assert messages[5] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "[2 images returned by tool call call_1 (shot)]"},
            url,
            url,
            {"type": "text", "text": "[1 image returned by tool call call_3 (shot)]"},
            jpeg,
        ],
    }
    assert messages[6] == {"role": "user", "content": "and now?"}


async def test_parallel_tool_calls_are_assembled_in_order(make: Make, server: FakeServer, api_key: str) -> None:
    def tool_delta(index: int, **fields: object) -> dict[str, object]:
        return {"tool_calls": [{"index": index, **fields}]}

    body = [
        sse(chunk({"role": "assistant", "content": None})),
        sse(chunk(tool_delta(0, id="call_a", type="function", function={"name": "read_file", "arguments": ""}))),
        sse(chunk(tool_delta(0, function={"arguments": '{"pa'}))),
        sse(chunk(tool_delta(0, function={"arguments": 'th": "README.md"}'}))),
        sse(chunk(tool_delta(1, id="call_b", type="function", function={"name": "grep", "arguments": ""}))),
        sse(chunk(tool_delta(1, function={"arguments": '{"pattern": '}))),
        sse(chunk(tool_delta(1, function={"arguments": "oops"}))),
        sse(chunk({}, finish_reason="tool_calls")),
        sse(usage_chunk(100, 20, cached=40)),
        b"data: [DONE]\n\n",
    ]
    server.replies.append(Reply(body=body))
    events = await collect(make(), hello())

    assert events[:-1] == [
        ToolCallStarted(index=0, id="call_a", name="read_file"),
        ToolCallDelta(index=0, arguments_fragment='{"pa'),
        ToolCallDelta(index=0, arguments_fragment='th": "README.md"}'),
        ToolCallStarted(index=1, id="call_b", name="grep"),
        ToolCallDelta(index=1, arguments_fragment='{"pattern": '),
        ToolCallDelta(index=1, arguments_fragment="oops"),
    ]
    done = events[-1]
    assert isinstance(done, Completed)
    assert done.stop_reason == "tool_use"
    first, second = done.message.tool_calls
    assert first == ToolCall(
        id="call_a",
        name="read_file",
        arguments={"path": "README.md"},
        raw_arguments='{"path": "README.md"}',
    )
    assert second.arguments is None
    assert second.raw_arguments == '{"pattern": oops'
    assert second.error is not None
    assert "not valid JSON" in second.error
    assert done.usage == Usage(input_tokens=60, output_tokens=20, cache_read_tokens=40)


async def test_two_server_errors_are_retried_then_the_call_succeeds(
    make: Make, server: FakeServer, api_key: str
) -> None:

    server.replies += [
        error_reply(500, "boom"),
        error_reply(503, "busy"),
        Reply(body=text_stream("fine")),
    ]
    events = await collect(make(), hello())

    assert len(server.requests) == 3
    assert isinstance(events[-1], Completed)
    assert events[-1].message.content == "fine"


async def test_retry_after_is_honoured_on_429(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies += [
        error_reply(429, "slow down", headers=[("retry-after", "0.3")]),
        Reply(body=text_stream("ok")),
    ]
    await collect(make(backoff_base=0.0, backoff_cap=0.0), hello())

    first, second = server.requests
    assert second.time - first.time >= 0.3


async def test_retry_after_longer_than_the_cap_raises_at_once(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies.append(error_reply(429, "slow down", headers=[("retry-after", "120")]))
    with pytest.raises(RateLimitError) as info:
        await collect(make(max_retry_after=10.0), hello())

    assert info.value.retry_after == 120.0
    assert info.value.status == 429
    assert len(server.requests) == 1


async def test_retries_give_up_after_max_retries(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies += [error_reply(500, f"boom {n}") for n in range(3)]
    with pytest.raises(ServerError) as info:
        await collect(make(max_retries=2), hello())

    assert len(server.requests) == 3
    assert "boom 2" in str(info.value)
    assert any("gave up after 3 attempts" in note for note in info.value.__notes__)


async def test_a_dropped_connection_is_retried(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies += [Reply(drop=True), Reply(body=text_stream("back"))]
    events = await collect(make(), hello())

    assert isinstance(events[-1], Completed)
    assert events[-1].message.content == "back"
    assert len(server.requests) == 2


async def test_401_names_the_env_var_and_never_the_key(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies.append(error_reply(401, f"Incorrect API key provided: {api_key}. Find yours online."))
    with pytest.raises(AuthenticationError) as info:
        await collect(make(), hello())

    error = info.value
    assert error.status == 401
    assert KEY_ENV in str(error)
    assert "Incorrect API key provided" in str(error)
    rendered = [str(error), repr(error), *getattr(error, "__notes__", [])]
    assert all(api_key not in text for text in rendered)
    assert len(server.requests) == 1  # auth errors are not retried


async def test_a_plain_text_error_is_cut_after_the_key_is_removed(make: Make, server: FakeServer, api_key: str) -> None:
    # The key straddles the 200-character cut: cutting first would leave its first half.
    body = "x" * (200 - len(api_key) // 2) + f" {api_key} " + "y" * 300
    server.replies.append(Reply(status=401, headers=(("content-type", "text/plain"),), body=[body.encode()]))
    with pytest.raises(AuthenticationError) as info:
        await collect(make(), hello())

    rendered = [str(info.value), repr(info.value), *getattr(info.value, "__notes__", [])]
    assert all(api_key[:8] not in text for text in rendered)
    assert f"... ({len(body.replace(api_key, '[redacted]'))} characters)" in str(info.value)


async def test_404_names_the_model_and_the_url(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies.append(error_reply(404, "The model `gpt-4.1` does not exist"))
    with pytest.raises(ModelNotFoundError) as info:
        await collect(make(), hello())

    assert repr(MODEL) in str(info.value)
    assert f"{server.url}/v1/chat/completions" in str(info.value)
    assert "does not exist" in str(info.value)


async def test_400_carries_the_servers_message(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies.append(error_reply(400, "'messages' must not be empty"))
    with pytest.raises(BadRequestError, match="'messages' must not be empty"):
        await collect(make(), hello())


async def test_a_missing_api_key_names_the_variable_and_sends_nothing(
    make: Make, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(MissingAPIKeyError, match=KEY_ENV) as info:
        await collect(make(), hello())

    assert info.value.env_var == KEY_ENV
    assert server.requests == []


async def test_a_local_server_needs_no_key_when_told_so(
    make: Make, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    server.replies.append(Reply(body=text_stream("local")))
    events = await collect(make(api_key_required=False), hello())

    assert isinstance(events[-1], Completed)
    assert "authorization" not in server.requests[0].headers


async def test_a_malformed_json_event_quotes_an_excerpt(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(Reply(body=[sse(chunk({"content": "a"})), b'data: {"choices": [{"delta": \n\n']))
    with pytest.raises(MalformedResponseError, match=r"\{\"choices\": \[\{\"delta\":"):
        await collect(make(), hello())


async def test_an_unexpected_shape_is_malformed(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(Reply(body=[sse({"choices": "not a list"})]))
    with pytest.raises(MalformedResponseError, match="choices"):
        await collect(make(), hello())


async def test_events_split_mid_line_and_mid_utf8_parse_correctly(make: Make, server: FakeServer, api_key: str) -> None:
    text = "naïve café — 日本語 🎉 done"
    whole = b"".join(piece.replace(b"\n", b"\r\n") for piece in text_stream(*text.split(" ")))
    # Cut every 3 bytes: through "data:", through CRLFs, through UTF-8 sequences.
    pieces = [whole[i : i + 3] for i in range(0, len(whole), 3)]
    server.replies.append(Reply(body=[b": keepalive\n\n", *pieces]))
    events = await collect(make(), hello())

    assert isinstance(events[-1], Completed)
    assert events[-1].message.content == "".join(text.split(" "))


async def test_a_stalled_stream_raises_stall_timeout_and_hangs_up(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies.append(Reply(body=[sse(chunk({"content": "a"}))], stall=True))
    with pytest.raises(StallTimeout, match="stall_timeout"):
        await collect(make(stall_timeout=0.3), hello())

    with trio.fail_after(5):
        await server.client_gone.wait()
    assert len(server.requests) == 1  # a stall is not retried


async def test_cancelling_the_call_closes_the_connection_promptly(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(Reply(body=[sse(chunk({"content": "first"}))], stall=True))
    got_first = trio.Event()
    received: list[object] = []

    async def consume() -> None:
        async with contextlib.aclosing(make(stall_timeout=30.0).stream(hello())) as events:
            async for event in events:
                received.append(event)
                got_first.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        with trio.fail_after(5):
            await got_first.wait()
            await server.stalled.wait()
        nursery.cancel_scope.cancel()

    # The stall timeout is 30 s; the server sees the hang-up long before.
    with trio.fail_after(5):
        await server.client_gone.wait()
    assert received == [TextDelta("first")]


async def test_a_stream_that_ends_early_is_an_error(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies += [
        Reply(body=[sse(chunk({"content": "par"}))]),
    ]
    with pytest.raises(ProviderConnectionError, match="ended before the model finished"):
        await collect(make(max_retries=0), hello())


async def test_an_error_object_mid_stream_is_a_stream_error(make: Make, server: FakeServer, api_key: str) -> None:

    server.replies.append(
        Reply(
            body=[
                sse(chunk({"content": "par"})),
                sse({"error": {"message": "context too long", "type": "invalid_request_error"}}),
            ]
        )
    )
    with pytest.raises(StreamError, match="context too long") as info:
        await collect(make(), hello())
    assert info.value.kind == "invalid_request_error"


async def test_request_model_overrides_the_providers(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(Reply(body=text_stream("ok")))
    request = ModelRequest(model="other-model", messages=[Message(role="user", content="x")])
    await collect(make(), request)

    assert json.loads(server.requests[0].body)["model"] == "other-model"


async def test_a_finished_call_leaves_its_connection_for_the_next(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies += [Reply(body=text_stream("one")), Reply(body=text_stream("two"))]
    prov = make()
    await collect(prov, hello())
    await collect(prov, hello())

    assert [seen.connection for seen in server.requests] == [0, 0]


async def test_breaking_off_early_hangs_up_at_once(make: Make, server: FakeServer, api_key: str) -> None:
    server.replies.append(Reply(body=[sse(chunk({"content": "first"}))], stall=True))
    async with contextlib.aclosing(make(stall_timeout=30.0).stream(hello())) as events:
        async for event in events:
            assert event == TextDelta("first")
            break

    with trio.fail_after(5):
        await server.client_gone.wait()


async def test_a_server_that_never_answers_times_out_and_is_retried(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies += [Reply(hang=True), Reply(hang=True)]
    with pytest.raises(ProviderTimeout, match=r"did not answer within 0\.2 s") as info:
        await collect(make(timeout=0.2, max_retries=1), hello())

    assert len(server.requests) == 2
    assert any("gave up after 2 attempts" in note for note in info.value.__notes__)


# A success response that is not an event stream: a quota proxy's JSON error,
# a server that ignored "stream": true, a login page in front of the API.
NOT_A_STREAM_JSON = (("content-type", "application/json"),)


async def test_a_json_error_with_status_200_quotes_the_servers_message_and_is_not_retried(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies.append(
        Reply(headers=NOT_A_STREAM_JSON, json_body={"error": {"message": "budget exceeded", "type": "quota"}})
    )
    with pytest.raises(MalformedResponseError) as info:
        await collect(make(), hello())

    assert str(info.value) == (
        f"openai: {server.url}/v1/chat/completions answered HTTP 200 with an error "
        "instead of an event stream (quota): budget exceeded"
    )
    assert len(server.requests) == 1
    assert not getattr(info.value, "__notes__", [])


async def test_a_non_streamed_completion_names_the_content_type_and_quotes_the_body(
    make: Make, server: FakeServer, api_key: str
) -> None:
    completion = {
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "created": 1694268190,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there, how may I assist you today?"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21},
    }
    server.replies.append(Reply(headers=NOT_A_STREAM_JSON, json_body=completion))
    with pytest.raises(MalformedResponseError) as info:
        await collect(make(), hello())

    message = str(info.value)
    assert "answered HTTP 200 with Content-Type 'application/json' instead of an event stream" in message
    assert '{"id": "chatcmpl-123", "object": "chat.completion"' in message
    assert len(server.requests) == 1


async def test_an_html_page_is_quoted_cut_short_and_without_the_key(
    make: Make, server: FakeServer, api_key: str
) -> None:
    page = f"<!DOCTYPE html><html><head><title>Sign in</title></head><body>token {api_key} {'x' * 5000}</body></html>"
    server.replies.append(Reply(headers=(("content-type", "text/html; charset=utf-8"),), body=[page.encode()]))
    with pytest.raises(MalformedResponseError) as info:
        await collect(make(), hello())

    message = str(info.value)
    assert "with Content-Type 'text/html; charset=utf-8' instead of an event stream" in message
    assert "<title>Sign in</title>" in message
    assert f"... ({len(page.replace(api_key, '[redacted]'))} characters)" in message
    assert len(message) < 600
    assert api_key not in message
    assert api_key[:8] not in message
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "headers",
    [
        (("content-type", "text/event-stream; charset=utf-8"),),
        (("Content-Type", "Text/Event-Stream"),),
        (),
    ],
    ids=["with-charset", "mixed-case", "no-content-type"],
)
async def test_event_stream_variants_and_a_missing_content_type_are_read_as_sse(
    make: Make, server: FakeServer, api_key: str, headers: tuple[tuple[str, str], ...]
) -> None:
    server.replies.append(Reply(headers=headers, body=text_stream("local")))
    events = await collect(make(), hello())

    assert isinstance(events[-1], Completed)
    assert events[-1].message.content == "local"
