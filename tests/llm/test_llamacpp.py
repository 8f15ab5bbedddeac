"""The OpenAI-compatible provider against a real llama.cpp server with a tiny real model (SmolLM2-135M).

The model is real but tiny: these tests check what travels on the wire
(streamed deltas, forced tool calls, usage, the server's "too long" error),
never the quality of what it says.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from weald.runtime.llm import (
    Completed,
    ContextLengthExceeded,
    Message,
    ModelRequest,
    OpenAIProvider,
    ProviderSettings,
    TextDelta,
    ToolCall,
    ToolCallStarted,
    ToolSpec,
)

from ._server import collect
from .llamacpp import LlamaServer, model_path

pytestmark = [pytest.mark.trio, pytest.mark.timeout(180)]

READ_FILE = ToolSpec(
    "read_file",
    "Read a file of the project.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": False},
)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(tmp_path_factory.mktemp("llama"), ctx_size=1024, n_predict=48).start()
    try:
        yield server
    finally:
        server.stop()


def provider(llama: LlamaServer) -> OpenAIProvider:
    return OpenAIProvider("smollm2", ProviderSettings(base_url=llama.base_url, api_key_required=False))


async def test_a_plain_turn_streams_deltas_that_add_up_to_the_message(llama: LlamaServer) -> None:
    model = provider(llama)
    request = ModelRequest(model="", messages=[Message(role="user", content="Say hello to the reader.")])
    events = await collect(model, request)
    await model.aclose()
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    completed = events[-1]
    assert isinstance(completed, Completed)
    assert len(deltas) >= 2  # streamed, not one block
    assert "".join(deltas) == completed.message.content != ""
    assert completed.stop_reason in ("end_turn", "max_tokens")
    assert 0 < completed.usage.output_tokens <= 48
    assert completed.usage.total_input_tokens > 5


async def test_tool_choice_required_makes_the_model_call_a_tool_with_schema_shaped_arguments(
    llama: LlamaServer,
) -> None:
    call = ToolCall(
        id="call_1", name="read_file", arguments={"path": "notes.txt"}, raw_arguments='{"path": "notes.txt"}'
    )
    messages = [
        Message(role="user", content="Read the file notes.txt"),
        Message(role="assistant", content="", tool_calls=[call]),
        Message(role="tool", content="hello", tool_call_id="call_1", name="read_file"),
        Message(role="assistant", content="The file says hello."),
        Message(role="user", content="Read the file todo.txt"),
    ]
    model = OpenAIProvider("smollm2", ProviderSettings(base_url=llama.base_url, api_key_required=False))
    request = ModelRequest(
        model="", messages=messages, system="You answer with a tool call.", tools=[READ_FILE], tool_choice="required"
    )
    events = await collect(model, request)
    await model.aclose()
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    completed = events[-1]
    assert isinstance(completed, Completed)
    assert [s.name for s in started] == ["read_file"]
    (made,) = completed.message.tool_calls
    assert made.name == "read_file"
    assert made.error is None
    assert isinstance(made.arguments, dict)
    assert set(made.arguments) == {"path"}
    assert isinstance(made.arguments["path"], str)
    assert completed.stop_reason == "tool_use"


async def test_usage_counts_prompt_tokens_read_from_the_servers_cache_apart(llama: LlamaServer) -> None:
    model = provider(llama)
    prompt = "Here is a list of fruits: apple, banana, cherry, damson, elderberry, fig, grape. Name one."
    request = ModelRequest(model="", messages=[Message(role="user", content=prompt)])
    first = (await collect(model, request))[-1]
    second = (await collect(model, request))[-1]
    await model.aclose()
    assert isinstance(first, Completed)
    assert isinstance(second, Completed)
    # The same prompt twice: the server reads most of it from its prompt cache the second time.
    assert second.usage.cache_read_tokens > 0
    assert second.usage.total_input_tokens == first.usage.total_input_tokens
    assert second.usage.input_tokens < first.usage.total_input_tokens


async def test_a_request_over_the_servers_context_size_is_context_length_exceeded(llama: LlamaServer) -> None:
    model = provider(llama)
    words = " ".join(f"word{i}" for i in range(1500))
    request = ModelRequest(model="", messages=[Message(role="user", content=words)])
    with pytest.raises(ContextLengthExceeded) as info:
        await collect(model, request)
    await model.aclose()
    assert info.value.limit == 1024
    assert info.value.requested is not None
    assert info.value.requested > 1024


async def test_the_model_comes_from_the_wheel_installed_without_its_dependencies(llama: LlamaServer) -> None:
    path = model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000
    assert not (path.parents[1] / "llama_cpp").exists()  # its dependency was not pulled in
    assert llama.slots()[0]["n_ctx"] == 1024  # and this server runs it with the context size asked for
