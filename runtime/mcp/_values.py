"""Frozen values the MCP client hands out: tools, results, resources, prompts."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Literal

import attrs
import mcp_types as types
from weald.tools import ToolImage

__all__ = [
    "MCPCapabilities",
    "MCPLogMessage",
    "MCPPrompt",
    "MCPPromptArgument",
    "MCPPromptMessage",
    "MCPPromptResult",
    "MCPResource",
    "MCPResourceContent",
    "MCPServerInfo",
    "MCPSessionStatistics",
    "MCPTool",
    "MCPToolResult",
]

SessionState = Literal["open", "lost", "closed"]

#: The largest image (decoded) a tool result sends to the model: Anthropic's
#: limit is 5 MB of base64, which is this many bytes; larger ones are described.
MAX_IMAGE_BYTES = 3_750_000
#: The most images one tool result sends to the model; the rest are described.
MAX_IMAGES = 8
#: The image types every supported model API takes.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
# Embedded resources of these types (besides text/*) are shown as text when they decode as UTF-8.
_TEXT_TYPES = ("application/json", "application/xml", "application/yaml", "application/javascript")


@attrs.frozen
class MCPTool:
    """One tool a server offers.

    Attributes:
        server: The configured name of the server offering it.
        name: The tool's name on the server (what tools/call sends).
        registered_name: The name offered to the model,
            ``mcp__<server>__<tool>`` sanitised (see `sanitize_tool_name`).
        description: The server's description, empty if it gave none.
        input_schema: The JSON Schema of the tool's arguments, as sent.
    """

    server: str
    name: str
    registered_name: str
    description: str
    input_schema: Mapping[str, object] = attrs.field(hash=False)


@attrs.frozen
class MCPToolResult:
    """The outcome of one tool call.

    Attributes:
        text: Every content block reduced to text for the model: text blocks
            verbatim, embedded resources with a header line (their text, or
            a blob of a text type decoded), and a bracketed line for images,
            audio, other blobs and resource links (their URIs can be read
            with the ``mcp_read_resource`` tool). When the server sent no
            content blocks but structured content, the structured content
            as JSON.
        is_error: The server's ``isError``: the tool ran and failed. The
            text says why; the model should read it.
        structured_content: The result's ``structuredContent``, if any.
        content: The raw content blocks as JSON objects, for callers that
            want images or other non-text blocks.
        images: The images the model sees beside the text: image blocks and
            embedded image resources of the `IMAGE_TYPES`, at most
            `MAX_IMAGES` of at most `MAX_IMAGE_BYTES` each (the text says
            why any other was not shown).
    """

    text: str
    is_error: bool
    structured_content: Mapping[str, object] | None = attrs.field(hash=False)
    content: tuple[Mapping[str, object], ...] = attrs.field(hash=False)
    images: tuple[ToolImage, ...] = attrs.field(default=(), hash=False)


@attrs.frozen
class MCPResource:
    """One resource a server lists.

    Attributes:
        uri: The resource's URI (what `MCPSession.read_resource` takes).
        name: Its name.
        description: Its description, empty if none.
        mime_type: Its MIME type, if the server gave one.
    """

    uri: str
    name: str
    description: str
    mime_type: str | None


@attrs.frozen
class MCPResourceContent:
    """One part of a resource read: either text or bytes.

    Attributes:
        uri: The URI of this part.
        mime_type: Its MIME type, if the server gave one.
        text: The content, for a text part.
        blob: The decoded content, for a binary part.
    """

    uri: str
    mime_type: str | None
    text: str | None
    blob: bytes | None


@attrs.frozen
class MCPPromptArgument:
    """One argument a prompt template takes."""

    name: str
    description: str
    required: bool


@attrs.frozen
class MCPPrompt:
    """One prompt template a server lists."""

    name: str
    description: str
    arguments: tuple[MCPPromptArgument, ...]


@attrs.frozen
class MCPPromptMessage:
    """One message of a rendered prompt, its content reduced to text."""

    role: str
    text: str


@attrs.frozen
class MCPPromptResult:
    """A rendered prompt."""

    description: str
    messages: tuple[MCPPromptMessage, ...]


@attrs.frozen
class MCPCapabilities:
    """What the server said it supports in its initialize result."""

    tools: bool
    tools_list_changed: bool
    resources: bool
    resources_subscribe: bool
    resources_list_changed: bool
    prompts: bool
    prompts_list_changed: bool
    logging: bool
    completions: bool


@attrs.frozen
class MCPServerInfo:
    """Who the server says it is, and the negotiated protocol.

    Attributes:
        name: The server implementation's name.
        version: Its version string.
        title: Its display title, if any.
        protocol_version: The MCP protocol revision both sides agreed on.
        instructions: The server's usage instructions for the model, if any.
    """

    name: str
    version: str
    title: str | None
    protocol_version: str
    instructions: str | None


@attrs.frozen
class MCPLogMessage:
    """A log line from a server: a ``notifications/message`` or a stderr line.

    Attributes:
        server: The configured name of the server.
        source: ``"notification"`` for MCP log notifications, ``"stderr"`` for
            a line the (stdio) server wrote to stderr.
        level: The MCP log level (``"debug"`` ... ``"emergency"``); stderr
            lines are ``"info"``.
        logger: The server-side logger name, if any.
        data: The logged data: any JSON value; a ``str`` for stderr lines.
    """

    server: str
    source: Literal["notification", "stderr"]
    level: str
    logger: str | None
    data: object = attrs.field(hash=False)


@attrs.frozen
class MCPSessionStatistics:
    """A snapshot of one session's counters and state.

    Attributes:
        server: The configured server name.
        transport: ``"stdio"`` or ``"http"``.
        state: ``"open"``, ``"lost"`` (the server broke) or ``"closed"``.
        tools: How many tools the server currently offers.
        calls_started: Tool calls begun.
        calls_in_flight: Tool calls still waiting for their result.
        calls_succeeded: Calls that returned a result without ``isError``.
        calls_tool_errors: Calls that returned a result with ``isError``.
        calls_failed: Calls that raised (timeouts excluded).
        calls_timed_out: Calls that raised `MCPTimeout`.
        tool_list_refreshes: Tool list re-fetches after list_changed.
        tool_list_refresh_failures: Re-fetches that failed (the old list was kept).
        messages_received: JSON-RPC messages received from the server.
        invalid_messages: Lines or events from the server that were not JSON-RPC.
        log_messages_dropped: Log messages dropped because the ``on_log``
            consumer fell behind.
        elicitations: ``elicitation/create`` requests the server sent.
        elicitations_unrouted: Of those, the ones declined because calls of
            different sessions were in flight and stdio does not say whose it was.
        samplings: ``sampling/createMessage`` requests the server sent.
        samplings_refused: Of those, the ones refused (denied, declined,
            unanswered in time, or no agent to run them on).
        legacy_sse: The server speaks the 2024-11-05 HTTP+SSE transport
            (it refused the Streamable HTTP initialize with 404 or 405).
        pings: Pings sent to check that the server still answers (after a
            request timed out, and every ``ping_interval`` seconds).
        pings_unanswered: Pings the server did not answer within
            ``ping_timeout`` (at most 1: the connection ends as not responding).
        pid: The server process id (and process group id), stdio only.
        exit_code: The server process's exit status once it has exited.
        lost_reason: Why the connection was lost, when ``state == "lost"``.
    """

    server: str
    transport: Literal["stdio", "http"]
    state: SessionState
    tools: int
    calls_started: int
    calls_in_flight: int
    calls_succeeded: int
    calls_tool_errors: int
    calls_failed: int
    calls_timed_out: int
    tool_list_refreshes: int
    tool_list_refresh_failures: int
    messages_received: int
    invalid_messages: int
    log_messages_dropped: int
    pid: int | None
    exit_code: int | None
    lost_reason: str | None
    elicitations: int = 0
    elicitations_unrouted: int = 0
    samplings: int = 0
    samplings_refused: int = 0
    legacy_sse: bool = False
    pings: int = 0
    pings_unanswered: int = 0


def _decoded_size(data: str) -> int:
    """Bytes encoded by a base64 string, without decoding it."""
    return len(data.rstrip("=")) * 3 // 4


def image_for_model(mime_type: str, data: str, images: list[ToolImage]) -> str | None:
    """Add the image to ``images`` if a model may see it; else say why not.

    Returns None when it was added, else the reason it was not (for the text).
    """
    size = _decoded_size(data)
    if mime_type not in IMAGE_TYPES:
        return f"{mime_type} is not a type models take ({', '.join(IMAGE_TYPES)})"
    if size > MAX_IMAGE_BYTES:
        return f"over the {MAX_IMAGE_BYTES}-byte limit for an image sent to the model"
    if len(images) >= MAX_IMAGES:
        return f"past the {MAX_IMAGES} images one result sends to the model"
    try:
        base64.b64decode(data, validate=True)
    except binascii.Error:
        return "its data is not valid base64"
    images.append(ToolImage(mime_type, data))
    return None


def _described(kind: str, mime_type: str, data: str, images: list[ToolImage] | None, header: str = "") -> str:
    size = _decoded_size(data)
    if images is None or kind != "image":
        return f"[{header or kind + ': ' + mime_type}, {size} bytes]"
    why = image_for_model(mime_type, data, images)
    label = header or f"image: {mime_type}"
    return f"[{label}, {size} bytes]" if why is None else f"[{label}, {size} bytes; not shown: {why}]"


def _blob_text(mime_type: str | None, blob: str) -> str | None:
    """A blob of a text type, decoded; None if it is not one (or not UTF-8)."""
    if mime_type is None or not (mime_type.startswith("text/") or mime_type in _TEXT_TYPES):
        return None
    try:
        return base64.b64decode(blob, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def content_block_text(block: types.ContentBlock, images: list[ToolImage] | None = None) -> str:
    """Reduce one MCP content block to the text a model should see.

    With ``images``, an image the model may see (see `image_for_model`) is
    added there and described in the text; one it may not is described with
    the reason. Without, every image is only described.
    """
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent):
        return _described("image", block.mime_type, block.data, images)
    if isinstance(block, types.AudioContent):
        return f"[audio: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, types.ResourceLink):
        about = f": {block.description}" if block.description else ""
        mime = f" ({block.mime_type})" if block.mime_type else ""
        return f"[resource link: {block.name} <{block.uri}>{mime}{about}]"
    resource = block.resource
    mime = f" ({resource.mime_type})" if resource.mime_type else ""
    if isinstance(resource, types.TextResourceContents):
        return f"[resource: {resource.uri}{mime}]\n{resource.text}"
    text = _blob_text(resource.mime_type, resource.blob)
    if text is not None:
        return f"[resource: {resource.uri}{mime}]\n{text}"
    kind = "image" if (resource.mime_type or "").startswith("image/") else "resource"
    return _described(kind, resource.mime_type or "", resource.blob, images, header=f"resource: {resource.uri}{mime}")


def _dump(model: types.ContentBlock) -> Mapping[str, object]:
    dumped: dict[str, object] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def tool_result_from_wire(result: types.CallToolResult) -> MCPToolResult:
    """Build an `MCPToolResult` from the SDK's ``CallToolResult``."""
    images: list[ToolImage] = []
    parts = [content_block_text(block, images) for block in result.content]
    structured = result.structured_content
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, sort_keys=True))
    return MCPToolResult(
        text="\n".join(parts),
        is_error=bool(result.is_error),
        structured_content=dict(structured) if structured is not None else None,
        content=tuple(_dump(block) for block in result.content),
        images=tuple(images),
    )


def tool_from_wire(server: str, registered_name: str, tool: types.Tool) -> MCPTool:
    """Build an `MCPTool` from the SDK's ``Tool``."""
    schema: dict[str, object] = dict(tool.input_schema)
    return MCPTool(
        server=server,
        name=tool.name,
        registered_name=registered_name,
        description=tool.description or "",
        input_schema=schema,
    )


def resource_from_wire(resource: types.Resource) -> MCPResource:
    """Build an `MCPResource` from the SDK's ``Resource``."""
    return MCPResource(
        uri=str(resource.uri),
        name=resource.name,
        description=resource.description or "",
        mime_type=resource.mime_type,
    )


def resource_content_from_wire(
    content: types.TextResourceContents | types.BlobResourceContents,
) -> MCPResourceContent:
    """Build an `MCPResourceContent`, decoding a base64 blob.

    Raises:
        ValueError: The blob is not valid base64.
    """
    if isinstance(content, types.TextResourceContents):
        return MCPResourceContent(uri=str(content.uri), mime_type=content.mime_type, text=content.text, blob=None)
    try:
        blob = base64.b64decode(content.blob, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"resource {content.uri} has a blob that is not base64: {exc}") from exc
    return MCPResourceContent(uri=str(content.uri), mime_type=content.mime_type, text=None, blob=blob)


def prompt_from_wire(prompt: types.Prompt) -> MCPPrompt:
    """Build an `MCPPrompt` from the SDK's ``Prompt``."""
    return MCPPrompt(
        name=prompt.name,
        description=prompt.description or "",
        arguments=tuple(
            MCPPromptArgument(
                name=argument.name,
                description=argument.description or "",
                required=bool(argument.required),
            )
            for argument in prompt.arguments or ()
        ),
    )


def prompt_result_from_wire(result: types.GetPromptResult) -> MCPPromptResult:
    """Build an `MCPPromptResult`, reducing each message's content to text."""
    return MCPPromptResult(
        description=result.description or "",
        messages=tuple(
            MCPPromptMessage(role=str(message.role), text=content_block_text(message.content))
            for message in result.messages
        ),
    )


def capabilities_from_wire(capabilities: types.ServerCapabilities) -> MCPCapabilities:
    """Flatten the SDK's ``ServerCapabilities``."""
    tools, resources, prompts = capabilities.tools, capabilities.resources, capabilities.prompts
    return MCPCapabilities(
        tools=tools is not None,
        tools_list_changed=bool(tools and tools.list_changed),
        resources=resources is not None,
        resources_subscribe=bool(resources and resources.subscribe),
        resources_list_changed=bool(resources and resources.list_changed),
        prompts=prompts is not None,
        prompts_list_changed=bool(prompts and prompts.list_changed),
        logging=capabilities.logging is not None,
        completions=capabilities.completions is not None,
    )


def server_info_from_wire(result: types.InitializeResult) -> MCPServerInfo:
    """Build an `MCPServerInfo` from the initialize result."""
    info = result.server_info
    return MCPServerInfo(
        name=info.name,
        version=info.version,
        title=info.title,
        protocol_version=result.protocol_version,
        instructions=result.instructions,
    )
