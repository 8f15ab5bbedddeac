"""The OpenAI-compatible Chat Completions provider.

Speaks ``POST {base_url}/chat/completions`` with ``stream: true``, which
OpenAI, vLLM, the llama.cpp server, Ollama, LM Studio and OpenRouter all
serve. The stream is a series of ``chat.completion.chunk`` objects in
``data:`` lines, ended by ``data: [DONE]``; with ``stream_options:
{"include_usage": true}`` the last chunk carries the usage and no choices.
Tool calls arrive as ``choices[0].delta.tool_calls[i]`` fragments keyed by
``index``: the first fragment of a call has its ``id`` and
``function.name``, later ones append to ``function.arguments``.
"""

from __future__ import annotations

import msgspec
from weald.runtime._codec import msgspec_decoder

from ._exceptions import StreamError
from ._http import HTTPProvider
from ._sse import SSEEvent
from ._types import (
    Completed,
    Image,
    Message,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStarted,
    Usage,
)

__all__ = ["OpenAIProvider"]

# Error types worth retrying when they come before the first event.
_RETRYABLE_ERRORS = frozenset({"server_error", "overloaded_error", "rate_limit_exceeded"})

# finish_reason -> Completed.stop_reason
_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}


class _FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _FunctionDelta | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Error(msgspec.Struct):
    message: str | None = None
    type: str | None = None
    code: str | int | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: _Error | str | None = None


_chunk_decoder = msgspec_decoder(_Chunk)


class _PendingCall:
    """A tool call being assembled from fragments."""

    __slots__ = ("arguments", "id", "name")

    def __init__(self, id: str, name: str) -> None:
        self.id = id
        self.name = name
        self.arguments: list[str] = []


class _PendingCalls:
    """The tool calls of one stream, in the order they started.

    The wire ``index`` normally numbers the calls 0, 1, ...; some servers
    omit it (one call at a time) or reuse it, so a fragment with a new
    ``id`` always starts a new call, and our index is the call's position.
    """

    __slots__ = ("_by_index", "_last_index", "calls")

    def __init__(self) -> None:
        self.calls: list[_PendingCall] = []
        self._by_index: dict[int | None, int] = {}
        self._last_index: int | None = None

    def find(self, index: int | None, id: str | None) -> tuple[int, _PendingCall | None]:
        """The position and call a fragment belongs to; None for a new call."""
        key = index if index is not None else self._last_index
        ordinal = self._by_index.get(key)
        if ordinal is None:
            return len(self.calls), None
        call = self.calls[ordinal]
        if id is not None and id != call.id:
            return len(self.calls), None
        return ordinal, call

    def add(self, index: int | None, call: _PendingCall) -> None:
        self._by_index[index] = len(self.calls)
        self._last_index = index
        self.calls.append(call)


def _usage(wire: _Usage) -> Usage:
    prompt = wire.prompt_tokens or 0
    cached = 0
    if wire.prompt_tokens_details is not None:
        cached = wire.prompt_tokens_details.cached_tokens or 0
    # prompt_tokens counts the cached tokens too; ours does not.
    return Usage(
        input_tokens=max(0, prompt - cached),
        output_tokens=wire.completion_tokens or 0,
        cache_read_tokens=cached,
    )


def _image_part(image: Image) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": f"data:{image.mime_type};base64,{image.data}"}}


def _tool_images(results: list[Message]) -> dict[str, object] | None:
    """The user message carrying the images of a run of tool results, or None if they have none.

    A ``role: tool`` message holds text only, and the tool results must
    directly follow the assistant message that made the calls; so their
    images come after the last of them, each labelled with its call.
    """
    parts: list[dict[str, object]] = []
    for message in results:
        if not message.images:
            continue
        count = len(message.images)
        label = f"{count} image{'s' if count > 1 else ''} returned by tool call {message.tool_call_id or '?'}"
        parts.append({"type": "text", "text": f"[{label} ({message.name or 'tool'})]"})
        parts.extend(_image_part(image) for image in message.images)
    return {"role": "user", "content": parts} if parts else None


def _wire_messages(request: ModelRequest) -> list[dict[str, object]]:
    wire: list[dict[str, object]] = []
    if request.system:
        wire.append({"role": "system", "content": request.system})
    results: list[Message] = []  # the run of tool results just sent
    for message in request.messages:
        if message.role != "tool" and results:
            images = _tool_images(results)
            if images is not None:
                wire.append(images)
            results = []
        if message.role == "user":
            content: object = message.content
            if message.images:
                content = [{"type": "text", "text": message.content}, *map(_image_part, message.images)]
            entry: dict[str, object] = {"role": "user", "content": content}
            if message.name:
                entry["name"] = message.name
            wire.append(entry)
        elif message.role == "assistant":
            entry = {"role": "assistant", "content": message.content or None}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": call.raw_arguments or "{}",
                        },
                    }
                    for call in message.tool_calls
                ]
            wire.append(entry)
        else:
            # The wire format has no error flag for tool results; say it in words.
            content = f"Error: {message.content}" if message.is_error else message.content
            wire.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id or "",
                    "content": content,
                }
            )
            results.append(message)
    images = _tool_images(results)
    if images is not None:
        wire.append(images)
    return wire


class OpenAIProvider(HTTPProvider):
    """A provider for any OpenAI-compatible Chat Completions server.

    Authenticates with ``Authorization: Bearer`` and the key from
    ``OPENAI_API_KEY`` (or ``settings.api_key_env``). For a local server,
    pass ``ProviderSettings(base_url="http://127.0.0.1:11434/v1",
    api_key_required=False)``.

    Tool results are sent as ``role: tool`` messages; since the format has
    no error flag, a failed tool's output is prefixed with ``"Error: "``.
    Tool messages hold text only, so a result's images follow the run of
    tool results in a user message of ``image_url`` parts (data URLs).
    ``max_tokens`` is sent as ``max_tokens``, which every compatible server
    understands.
    """

    name = "openai"
    _default_base_url = "https://api.openai.com/v1"
    _default_key_env = "OPENAI_API_KEY"
    _path = "/chat/completions"
    _auth_header = "authorization"
    _auth_scheme = "Bearer"

    def _payload(self, request: ModelRequest, model: str) -> dict[str, object]:
        payload: dict[str, object] = {
            "model": model,
            "messages": _wire_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            payload["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        if request.tool_choice is not None and request.tools:
            payload["tool_choice"] = request.tool_choice
        if request.max_tokens is not None:
            payload["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        return payload

    def _decoder(self) -> _Decoder:
        return _Decoder(self)

    def _stream_error(self, error: _Error | str) -> StreamError:
        if isinstance(error, str):
            return StreamError(f"{self.name}: the server reported an error mid-stream: {self._server_text(error)}")
        kind = error.type or (str(error.code) if error.code is not None else None)
        return StreamError(
            f"{self.name}: the server reported an error mid-stream"
            f"{f' ({kind})' if kind else ''}: {self._server_text(error.message or 'no message')}",
            kind=kind,
            retryable=kind in _RETRYABLE_ERRORS,
        )


class _Decoder:
    """The state of one Chat Completions stream."""

    def __init__(self, provider: OpenAIProvider) -> None:
        self._provider = provider
        self._text: list[str] = []
        self._calls = _PendingCalls()
        self._finish_reason: str | None = None
        self._usage = Usage()
        self.done = False

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        try:
            chunk = _chunk_decoder.decode(event.data)
        except msgspec.DecodeError as exc:
            raise self._provider._malformed(str(exc), event.data) from exc
        if chunk.error is not None:
            raise self._provider._stream_error(chunk.error)
        if chunk.usage is not None:
            self._usage = _usage(chunk.usage)
        out: list[StreamEvent] = []
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue  # we never ask for n > 1
            if choice.finish_reason:
                self._finish_reason = choice.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                self._text.append(delta.content)
                out.append(TextDelta(delta.content))
            for fragment in delta.tool_calls or ():
                out += self._tool_fragment(fragment)
        return out

    def finish(self) -> Completed:
        # Some servers end the body without [DONE]; a finish_reason is enough.
        if not self.done and self._finish_reason is None:
            raise self._provider._ended_early()
        tool_calls = [
            ToolCall.parse(id=call.id, name=call.name, raw_arguments="".join(call.arguments))
            for call in self._calls.calls
        ]
        reason = self._finish_reason or "end_turn"
        message = Message(role="assistant", content="".join(self._text), tool_calls=tool_calls)
        return Completed(
            message=message,
            usage=self._usage,
            stop_reason=_STOP_REASONS.get(reason, reason),
        )

    def _tool_fragment(self, fragment: _ToolCallDelta) -> list[StreamEvent]:
        calls = self._calls
        function = fragment.function or _FunctionDelta()
        out: list[StreamEvent] = []
        ordinal, call = calls.find(fragment.index, fragment.id)
        if call is None:
            ordinal = len(calls.calls)
            call = _PendingCall(fragment.id or f"call_{ordinal}", function.name or "")
            calls.add(fragment.index, call)
            out.append(ToolCallStarted(index=ordinal, id=call.id, name=call.name))
        elif function.name and not call.name:
            call.name = function.name
        if function.arguments:
            call.arguments.append(function.arguments)
            out.append(ToolCallDelta(index=ordinal, arguments_fragment=function.arguments))
        return out
