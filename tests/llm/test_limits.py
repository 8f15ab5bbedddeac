"""Model limits and context-length errors: the windows of common models, and each server's "too long" shape."""

from __future__ import annotations

import pytest
from weald.runtime.llm import (
    DEFAULT_CONTEXT_WINDOW,
    AnthropicProvider,
    BadRequestError,
    ContextLengthExceeded,
    Message,
    ModelRequest,
    OpenAIProvider,
    ProviderSettings,
    ScriptedProvider,
    ToolSpec,
    model_limits,
)

from ._server import FakeServer, Reply, collect
from .conftest import KEY_ENV

pytestmark = pytest.mark.timeout(20)

REQUEST = ModelRequest(model="", messages=[Message(role="user", content="hello")])

# The error bodies these servers send for a request over the window, as they send them.
OPENAI_BODY = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in "
        "130412 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
OPENAI_CODE_ONLY = {
    "error": {"message": "Input too long.", "type": "invalid_request_error", "code": "context_length_exceeded"}
}
ANTHROPIC_BODY = {
    "type": "error",
    "error": {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"},
}
LLAMA_CPP_BODY = {
    "error": {
        "code": 400,
        "message": "request (3031 tokens) exceeds the available context size (2048 tokens), try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 3031,
        "n_ctx": 2048,
    }
}


def json_reply(status: int, body: object) -> Reply:
    return Reply(status=status, headers=(("content-type", "application/json"),), json_body=body)


@pytest.mark.parametrize(
    ("provider", "body", "limit", "requested"),
    [
        ("openai", OPENAI_BODY, 128_000, 130_412),
        ("openai", OPENAI_CODE_ONLY, None, None),
        ("anthropic", ANTHROPIC_BODY, 200_000, 208_310),
        ("openai", LLAMA_CPP_BODY, 2_048, 3_031),
    ],
    ids=["openai", "openai-code-only", "anthropic", "llama.cpp"],
)
@pytest.mark.trio
async def test_each_servers_too_long_error_is_context_length_exceeded_with_its_sizes(
    server: FakeServer,
    api_key: str,
    provider: str,
    body: object,
    limit: int | None,
    requested: int | None,
) -> None:
    server.replies.append(json_reply(400, body))
    settings = ProviderSettings(base_url=server.url, api_key_env=KEY_ENV, max_retries=3)
    cls = OpenAIProvider if provider == "openai" else AnthropicProvider
    model = cls("some-model", settings)
    with pytest.raises(ContextLengthExceeded) as info:
        await collect(model, REQUEST)
    await model.aclose()
    assert (info.value.limit, info.value.requested, info.value.status) == (limit, requested, 400)
    assert isinstance(info.value, BadRequestError)
    assert "does not fit its context window" in info.value.message
    assert len(server.requests) == 1  # not retried: the same request would be refused again


@pytest.mark.trio
async def test_an_ordinary_400_is_not_a_context_error(server: FakeServer, api_key: str) -> None:
    server.replies.append(json_reply(400, {"error": {"message": "'messages' must not be empty", "type": "x"}}))
    model = OpenAIProvider("m", ProviderSettings(base_url=server.url, api_key_env=KEY_ENV))
    with pytest.raises(BadRequestError) as info:
        await collect(model, REQUEST)
    await model.aclose()
    assert not isinstance(info.value, ContextLengthExceeded)


@pytest.mark.trio
async def test_tool_choice_goes_on_the_wire_in_each_providers_words(server: FakeServer, api_key: str) -> None:
    tools = [ToolSpec("read_file", "reads", {"type": "object", "properties": {}})]
    request = ModelRequest(model="", messages=REQUEST.messages, tools=tools, tool_choice="required")
    for cls in (OpenAIProvider, AnthropicProvider):
        server.replies.append(json_reply(400, {"error": {"message": "stop here", "type": "x"}}))
        model = cls("m", ProviderSettings(base_url=server.url, api_key_env=KEY_ENV))
        with pytest.raises(BadRequestError):
            await collect(model, request)
        await model.aclose()
    assert server.requests[0].json()["tool_choice"] == "required"
    assert server.requests[1].json()["tool_choice"] == {"type": "any"}


def test_common_models_have_known_windows_and_the_rest_a_default() -> None:
    assert model_limits("gpt-4.1-mini").context_window == 1_047_576
    assert model_limits("openai/gpt-4o-2024-08-06").context_window == 128_000
    assert model_limits("claude-sonnet-4-5-20250929").context_window == 200_000
    assert model_limits("gpt-4").context_window == 8_192
    unknown = model_limits("my-local-model")
    assert (unknown.context_window, unknown.source) == (DEFAULT_CONTEXT_WINDOW, "default")
    assert unknown.output_reserve == 16_384
    configured = model_limits("gpt-4.1", ProviderSettings(context_window=8_000, output_reserve=500))
    assert (configured.context_window, configured.output_reserve, configured.source) == (8_000, 500, "configured")
    assert configured.input_budget == 7_500
    small = model_limits("x", ProviderSettings(context_window=2_048))
    assert small.output_reserve == 512  # a quarter of a small window


@pytest.mark.trio
async def test_the_scripted_model_refuses_a_request_over_its_window_without_spending_a_turn() -> None:
    model = ScriptedProvider.from_dict({"turns": [{"text": "ok"}]}, settings=ProviderSettings(context_window=10))
    too_long = ModelRequest(model="", messages=[Message(role="user", content="x" * 100)])
    with pytest.raises(ContextLengthExceeded) as info:
        await collect(model, too_long)
    assert (info.value.limit, info.value.requested) == (10, 25)
    assert model.position == 0
    events = await collect(model, ModelRequest(model="", messages=[Message(role="user", content="hi")]))
    assert events[-1].message.content == "ok"


@pytest.mark.trio
async def test_the_scripted_model_answers_a_compaction_with_a_summary_and_keeps_its_turns() -> None:
    model = ScriptedProvider.from_dict({"turns": [{"text": "turn"}]})
    request = ModelRequest(
        model="", messages=[Message(role="user", content="first line\nlast line")], purpose="compaction"
    )
    events = await collect(model, request)
    summary = events[-1].message.content
    assert summary.startswith("Scripted summary of")
    assert "first line" in summary
    assert model.position == 0
    fixed = ScriptedProvider.from_dict({"turns": [], "summary": "They fixed the bug."})
    assert (await collect(fixed, request))[-1].message.content == "They fixed the bug."


@pytest.mark.trio
async def test_a_repeating_script_starts_over_and_can_be_resumed_past_its_end() -> None:
    model = ScriptedProvider.from_dict({"turns": [{"text": "one"}, {"text": "two"}], "repeat": True})
    texts = [(await collect(model, REQUEST))[-1].message.content for _ in range(5)]
    assert texts == ["one", "two", "one", "two", "one"]
    model.seek(7)  # where a restarted agent resumes
    assert (await collect(model, REQUEST))[-1].message.content == "two"
