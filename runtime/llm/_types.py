"""Provider-neutral messages, requests and stream events.

These are the wire values the agent and the providers exchange. They are
msgspec Structs, so the agent can store them and send them over the
event bus with one codec; every provider converts them to and from its own
wire format.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Literal, Protocol

import msgspec

from ._util import excerpt

__all__ = [
    "Completed",
    "Image",
    "Message",
    "ModelRequest",
    "Provider",
    "Role",
    "StreamEvent",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStarted",
    "ToolSpec",
    "Usage",
]

Role = Literal["user", "assistant", "tool"]


class ToolSpec(msgspec.Struct, frozen=True):
    """A tool as the model sees it.

    Attributes:
        name: The tool's name.
        description: What the tool does, for the model.
        parameters: The JSON schema of the tool's arguments (an object schema).
    """

    name: str
    description: str
    parameters: dict[str, object]


class ToolCall(msgspec.Struct, frozen=True):
    """A tool call the model made.

    When the model's arguments are not a JSON object, ``arguments`` is None and
    ``error`` says what was wrong, in words meant for the model; the agent
    sends that back as the tool result and the loop goes on.

    Attributes:
        id: The call's id, which the tool result must quote.
        name: The name of the tool called.
        arguments: The parsed arguments, or None when they are not valid.
        raw_arguments: The arguments exactly as the model sent them.
        error: Why ``arguments`` is None, or None when they parsed.
    """

    id: str
    name: str
    arguments: dict[str, object] | None
    raw_arguments: str
    error: str | None = None

    @classmethod
    def parse(cls, *, id: str, name: str, raw_arguments: str) -> ToolCall:
        """Build a tool call from the model's raw argument text.

        Empty text counts as ``{}``: models send nothing for tools that take
        no arguments.

        Args:
            id: The call's id.
            name: The tool's name.
            raw_arguments: The JSON text the model sent.

        Returns:
            The tool call, with ``error`` set if the text is not a JSON object.
        """
        if not raw_arguments.strip():
            return cls(id=id, name=name, arguments={}, raw_arguments=raw_arguments)
        try:
            value = msgspec.json.decode(raw_arguments)
        except msgspec.DecodeError as exc:
            error = (
                f"The arguments for tool {name!r} are not valid JSON ({exc}): "
                f"{excerpt(raw_arguments)}. Call the tool again with the arguments "
                "as one JSON object."
            )
            return cls(
                id=id,
                name=name,
                arguments=None,
                raw_arguments=raw_arguments,
                error=error,
            )
        if not isinstance(value, dict):
            error = (
                f"The arguments for tool {name!r} must be a JSON object, but they are "
                f"a JSON {_json_kind(value)}: {excerpt(raw_arguments)}. Call the tool "
                "again with the arguments as one JSON object."
            )
            return cls(
                id=id,
                name=name,
                arguments=None,
                raw_arguments=raw_arguments,
                error=error,
            )
        return cls(id=id, name=name, arguments=value, raw_arguments=raw_arguments)


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


class Image(msgspec.Struct, frozen=True):
    """An image the model sees, in a tool result or a user message.

    Attributes:
        mime_type: ``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp``.
        data: The image, base64-encoded.
    """

    mime_type: str
    data: str


class Message(msgspec.Struct, frozen=True):
    """One message of a conversation.

    Attributes:
        role: ``"user"``, ``"assistant"`` or ``"tool"`` (a tool result).
        content: The text. For a tool result, the tool's output.
        tool_calls: The tool calls an assistant message made, in order.
        tool_call_id: For a tool result, the id of the call it answers.
        name: For a tool result, the tool's name; for a user message, an
            optional participant name.
        is_error: For a tool result, whether the tool failed.
        images: For a tool result or a user message, images the model sees
            with the text. Anthropic takes them inside the ``tool_result``;
            OpenAI's tool messages hold text only, so they follow the tool
            results in a user message.
    """

    role: Role
    content: str
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    images: list[Image] = []


class Usage(msgspec.Struct, frozen=True):
    """Token counts of one or more model calls. Usages add up with ``+``.

    Attributes:
        input_tokens: Input tokens billed at the normal rate, that is, not
            read from or written to the prompt cache.
        output_tokens: Generated tokens.
        cache_read_tokens: Input tokens read from the prompt cache.
        cache_write_tokens: Input tokens written to the prompt cache.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_input_tokens(self) -> int:
        """All input tokens, cached or not."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


class ModelRequest(msgspec.Struct, frozen=True):
    """One model call.

    Attributes:
        model: The model to call; empty means the provider's own ``model``.
        messages: The conversation so far.
        system: The system prompt, if any.
        tools: The tools the model may call.
        max_tokens: The most tokens to generate; None leaves it to the
            provider (the Anthropic provider, where it is required, sends 8192).
        temperature: The sampling temperature; None leaves it to the server.
        tool_choice: ``"auto"`` (the model decides), ``"required"`` (it must
            call a tool; llama.cpp and vLLM constrain the output to the tools'
            schemas), ``"none"``; None leaves it to the server (auto).
        purpose: ``"turn"`` for a step of an agent's turn, ``"compaction"``
            when the agent asks for a summary of its conversation. HTTP
            providers ignore it; the scripted provider answers a compaction
            with a summary of its own instead of spending a scripted turn.
    """

    model: str
    messages: list[Message]
    system: str | None = None
    tools: list[ToolSpec] = []
    max_tokens: int | None = None
    temperature: float | None = None
    tool_choice: Literal["auto", "required", "none"] | None = None
    purpose: Literal["turn", "compaction"] = "turn"


class TextDelta(msgspec.Struct, frozen=True, tag="text_delta"):
    """A piece of the assistant's text, in order."""

    text: str


class ToolCallStarted(msgspec.Struct, frozen=True, tag="tool_call_started"):
    """The model began a tool call.

    Attributes:
        index: The call's position in the message's ``tool_calls`` (0-based).
        id: The call's id.
        name: The tool's name.
    """

    index: int
    id: str
    name: str


class ToolCallDelta(msgspec.Struct, frozen=True, tag="tool_call_delta"):
    """A piece of a tool call's JSON arguments, in order.

    Attributes:
        index: The call's position, as in :class:`ToolCallStarted`.
        arguments_fragment: The next piece of the raw argument text.
    """

    index: int
    arguments_fragment: str


class Completed(msgspec.Struct, frozen=True, tag="completed"):
    """The model finished; the last event of every successful stream.

    Attributes:
        message: The whole assistant message, with every tool call parsed.
        usage: The call's token counts.
        stop_reason: Why the model stopped, normalised across providers:
            ``"end_turn"``, ``"tool_use"``, ``"max_tokens"``, or the server's
            own word for anything else (``"stop_sequence"``, ``"content_filter"``,
            ``"refusal"``, ...).
    """

    message: Message
    usage: Usage
    stop_reason: str


StreamEvent = TextDelta | ToolCallStarted | ToolCallDelta | Completed


class Provider(Protocol):
    """A model provider: turns a :class:`ModelRequest` into a stream of events.

    A provider instance serves one model call at a time or many concurrent
    ones (the scripted provider is the exception: its calls are sequential by
    nature). Close it with :meth:`aclose` when done.
    """

    @property
    def name(self) -> str:
        """The provider's kind: ``"openai"``, ``"anthropic"`` or ``"scripted"``."""
        ...

    @property
    def model(self) -> str:
        """The model this provider calls when a request does not name one."""
        ...

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        """Call the model and stream its answer.

        The stream yields :class:`TextDelta`, :class:`ToolCallStarted` and
        :class:`ToolCallDelta` events as they arrive and ends with exactly one
        :class:`Completed`, or raises a ``ProviderError``. It is an async
        generator: iterate it inside ``contextlib.aclosing`` (or exhaust it)
        so that breaking off early closes the HTTP response at once.

        Args:
            request: The model call.

        Returns:
            An async generator of stream events.
        """
        ...

    async def aclose(self) -> None:
        """Release the provider's connections. Idempotent."""
        ...
