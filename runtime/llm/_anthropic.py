"""The Anthropic Messages provider.

Speaks ``POST {base_url}/v1/messages`` with ``stream: true``. The stream is a
series of named SSE events, each with a JSON body whose ``type`` repeats the
name: ``message_start`` (the message shell and input usage), then for each
content block ``content_block_start`` (a ``text`` block, or a ``tool_use``
block with ``id`` and ``name``), ``content_block_delta`` (``text_delta``
text or ``input_json_delta`` ``partial_json``) and ``content_block_stop``;
then ``message_delta`` (``stop_reason`` and cumulative ``usage``) and
``message_stop``. ``ping`` events may come at any time and ``error`` events
report a failure mid-stream. Unknown events and block types (``thinking``,
...) are skipped, as Anthropic's versioning policy asks of clients.
"""

from __future__ import annotations

from collections.abc import Mapping

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

__all__ = ["AnthropicProvider"]

API_VERSION = "2023-06-01"

# Anthropic requires max_tokens; this is what we send when the request has none.
DEFAULT_MAX_TOKENS = 8192

# Error types worth retrying when they come before the first event.
_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _MessageShell(msgspec.Struct):
    usage: _Usage | None = None


class _Block(msgspec.Struct):
    type: str
    id: str | None = None
    name: str | None = None
    text: str | None = None
    input: dict[str, object] | None = None


class _Delta(msgspec.Struct):
    type: str | None = None
    text: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None


class _Error(msgspec.Struct):
    type: str | None = None
    message: str | None = None


class _Event(msgspec.Struct):
    """Any stream event: the fields of all of them, each optional."""

    type: str
    index: int | None = None
    message: _MessageShell | None = None
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: _Error | None = None


_event_decoder = msgspec_decoder(_Event)


class _ToolBlock:
    """A tool_use block being assembled."""

    __slots__ = ("fragments", "id", "initial_input", "name", "ordinal")

    def __init__(self, ordinal: int, block: _Block) -> None:
        self.ordinal = ordinal
        self.id = block.id or f"toolu_{ordinal}"
        self.name = block.name or ""
        self.initial_input = block.input or {}
        self.fragments: list[str] = []

    def tool_call(self) -> ToolCall:
        raw = "".join(self.fragments)
        if not raw.strip() and self.initial_input:
            # A block that came with its input whole and no deltas.
            raw = msgspec.json.encode(self.initial_input).decode()
        return ToolCall.parse(id=self.id, name=self.name, raw_arguments=raw)


def _merge_usage(usage: Usage, wire: _Usage | None) -> Usage:
    """Overlay the counts ``wire`` has on ``usage``.

    ``message_delta`` counts are cumulative, so the latest count wins.
    """
    if wire is None:
        return usage
    return Usage(
        input_tokens=wire.input_tokens if wire.input_tokens is not None else usage.input_tokens,
        output_tokens=(wire.output_tokens if wire.output_tokens is not None else usage.output_tokens),
        cache_read_tokens=(
            wire.cache_read_input_tokens if wire.cache_read_input_tokens is not None else usage.cache_read_tokens
        ),
        cache_write_tokens=(
            wire.cache_creation_input_tokens
            if wire.cache_creation_input_tokens is not None
            else usage.cache_write_tokens
        ),
    )


def _image_block(image: Image) -> dict[str, object]:
    return {"type": "image", "source": {"type": "base64", "media_type": image.mime_type, "data": image.data}}


def _wire_messages(request: ModelRequest) -> list[dict[str, object]]:
    """Our messages as Anthropic ``messages``.

    Tool results become user-role ``tool_result`` blocks, and consecutive
    user-role content (several tool results, then perhaps the user's text)
    is merged into one message, since the API wants the roles to alternate.
    """
    wire: list[dict[str, object]] = []
    blocks: list[dict[str, object]] = []
    role: str | None = None
    for message in request.messages:
        wire_role = "assistant" if message.role == "assistant" else "user"
        if wire_role != role and role is not None and blocks:
            wire.append({"role": role, "content": blocks})
            blocks = []
        role = wire_role
        if message.role == "tool":
            content: object = message.content
            if message.images:
                # Images go inside the tool_result, beside its text (the API rejects empty text blocks).
                text = [{"type": "text", "text": message.content}] if message.content else []
                content = [*text, *map(_image_block, message.images)]
            blocks.append(
                {
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id or "",
                    "content": content,
                    "is_error": message.is_error,
                }
            )
        elif message.role == "user":
            blocks.append({"type": "text", "text": message.content})
            blocks.extend(_image_block(image) for image in message.images)
        else:
            # The API rejects empty text blocks.
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            for call in message.tool_calls:
                # A call whose arguments did not parse is echoed with an empty
                # input; its tool result carries the parse error.
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": call.arguments if call.arguments is not None else {},
                    }
                )
    if role is not None and blocks:
        wire.append({"role": role, "content": blocks})
    return wire


class AnthropicProvider(HTTPProvider):
    """A provider for the Anthropic Messages API.

    Authenticates with ``x-api-key`` and the key from ``ANTHROPIC_API_KEY``
    (or ``settings.api_key_env``), and sends ``anthropic-version:
    2023-06-01``. The system prompt goes in the top-level ``system`` field;
    ``max_tokens``, which the API requires, defaults to 8192.
    """

    name = "anthropic"
    _default_base_url = "https://api.anthropic.com"
    _default_key_env = "ANTHROPIC_API_KEY"
    _path = "/v1/messages"
    _auth_header = "x-api-key"
    _auth_scheme = None

    def _headers(self) -> Mapping[str, str]:
        return {"anthropic-version": API_VERSION}

    def _payload(self, request: ModelRequest, model: str) -> dict[str, object]:
        payload: dict[str, object] = {
            "model": model,
            "messages": _wire_messages(request),
            "max_tokens": (request.max_tokens if request.max_tokens is not None else DEFAULT_MAX_TOKENS),
            "stream": True,
        }
        if request.system:
            payload["system"] = request.system
        if request.tools:
            payload["tools"] = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                }
                for tool in request.tools
            ]
            if request.tool_choice is not None:
                # Anthropic calls "required" "any".
                kind = "any" if request.tool_choice == "required" else request.tool_choice
                payload["tool_choice"] = {"type": kind}
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        return payload

    def _decoder(self) -> _Decoder:
        return _Decoder(self)

    def _stream_error(self, error: _Error | None) -> StreamError:
        kind = error.type if error is not None else None
        message = self._server_text((error.message if error is not None else None) or "no message")
        return StreamError(
            f"{self.name}: the server reported an error mid-stream{f' ({kind})' if kind else ''}: {message}",
            kind=kind,
            retryable=kind in _RETRYABLE_ERRORS,
        )


class _Decoder:
    """The state of one Messages stream."""

    def __init__(self, provider: AnthropicProvider) -> None:
        self._provider = provider
        self._text: list[str] = []
        self._tools: dict[int, _ToolBlock] = {}  # by content block index
        self._ordered: list[_ToolBlock] = []
        self._usage = Usage()
        self._stop_reason: str | None = None
        self.done = False

    def feed(self, sse: SSEEvent) -> list[StreamEvent]:
        try:
            event = _event_decoder.decode(sse.data)
        except msgspec.DecodeError as exc:
            raise self._provider._malformed(str(exc), sse.data) from exc
        kind = event.type
        if kind == "message_start":
            if event.message is not None:
                self._usage = _merge_usage(self._usage, event.message.usage)
        elif kind == "content_block_start":
            return self._block_start(event, sse.data)
        elif kind == "content_block_delta":
            return self._block_delta(event, sse.data)
        elif kind == "message_delta":
            if event.delta is not None and event.delta.stop_reason:
                self._stop_reason = event.delta.stop_reason
            self._usage = _merge_usage(self._usage, event.usage)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            raise self._provider._stream_error(event.error)
        # ping, content_block_stop and event types we do not know: nothing to do.
        return []

    def finish(self) -> Completed:
        # A body that ends after message_delta but without message_stop has
        # everything we need.
        if not self.done and self._stop_reason is None:
            raise self._provider._ended_early()
        message = Message(
            role="assistant",
            content="".join(self._text),
            tool_calls=[tool.tool_call() for tool in self._ordered],
        )
        return Completed(
            message=message,
            usage=self._usage,
            stop_reason=self._stop_reason or "end_turn",
        )

    def _block_start(self, event: _Event, data: str) -> list[StreamEvent]:
        block = event.content_block
        if block is None or event.index is None:
            raise self._provider._malformed("content_block_start without a block", data)
        if block.type == "tool_use":
            tool = _ToolBlock(len(self._ordered), block)
            self._tools[event.index] = tool
            self._ordered.append(tool)
            return [ToolCallStarted(index=tool.ordinal, id=tool.id, name=tool.name)]
        if block.type == "text" and block.text:
            self._text.append(block.text)
            return [TextDelta(block.text)]
        return []

    def _block_delta(self, event: _Event, data: str) -> list[StreamEvent]:
        delta = event.delta
        if delta is None or event.index is None:
            raise self._provider._malformed("content_block_delta without a delta", data)
        if delta.type == "text_delta" and delta.text:
            self._text.append(delta.text)
            return [TextDelta(delta.text)]
        if delta.type == "input_json_delta":
            tool = self._tools.get(event.index)
            if tool is None:
                raise self._provider._malformed("input_json_delta for no tool_use block", data)
            if delta.partial_json:
                tool.fragments.append(delta.partial_json)
                return [ToolCallDelta(index=tool.ordinal, arguments_fragment=delta.partial_json)]
        return []
