"""What a recording remembers of each model request, and how a replay tells where it diverged.

A recording (see ``_recording``) keeps, for each model call, digests of the
request: one of the system prompt, one per tool offered, one per message,
and a hash of them all. A replay computes the same digests from the request
its agent sends and compares them with the recorded ones; when the hashes
differ, the per-part digests say what differs first (the system prompt,
the tool list, or which message), as VCR-style cassettes report the first
request that does not match.

What a digest covers, so that a replay of the same conversation matches:

- a message: its role, its text, its tool calls (name and arguments, the
  arguments as sorted-key JSON when they parse, so whitespace and key order
  do not count), a tool result's tool name and error flag, and its images
  (type and content);
- a tool: its description and JSON schema (its name keys the digest);
- the system prompt's text.

What it leaves out, because it changes from run to run without changing the
conversation: tool call ids and the ids that tool results quote (providers
make them up; the order of messages already pairs results with calls), the
model name (a replay runs ``scripted:FILE``, not the recorded model),
``max_tokens`` and ``temperature``, and every timestamp (messages carry
none). The project directory, when known, is replaced by ``<project>`` in
every text before it is digested, so a recording made in one checkout
replays in another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import attrs
import msgspec

from ._types import Message, ModelRequest, ToolSpec
from ._util import excerpt

__all__ = ["PROJECT_PLACEHOLDER", "Difference", "RequestDigest", "RequestDigester", "describe_divergence"]

#: What the project directory is replaced by before texts are digested.
PROJECT_PLACEHOLDER = "<project>"

# Hex digits kept of each part's SHA-256 (64 bits: plenty to tell parts apart).
_PART_CHARS = 16

# Hex digits kept of the whole request's hash.
_HASH_CHARS = 32

_encoder = msgspec.json.Encoder(order="sorted")


def _sha(data: bytes, chars: int) -> str:
    return hashlib.sha256(data).hexdigest()[:chars]


@attrs.frozen
class RequestDigest:
    """The digests of one model request.

    Attributes:
        hash: A hash of everything below.
        system: The system prompt's digest.
        tools: Each tool's digest, by name.
        messages: Each message's digest, in order.
    """

    hash: str
    system: str
    tools: Mapping[str, str]
    messages: tuple[str, ...]

    @classmethod
    def of(cls, system: str, tools: Mapping[str, str], messages: Sequence[str]) -> RequestDigest:
        """Build a digest from its parts, computing the hash."""
        whole = _encoder.encode([system, sorted(tools.items()), list(messages)])
        return cls(_sha(whole, _HASH_CHARS), system, dict(tools), tuple(messages))


class RequestDigester:
    """Computes `RequestDigest` s, reusing the digests of messages it saw in the previous request.

    An agent sends its whole history with every request, so the messages of
    one request are, by identity, mostly those of the one before: only new
    messages are hashed. The digester keeps the previous request's messages
    (which their agent holds anyway) and nothing older.

    Args:
        project_dir: The project directory, replaced by ``<project>`` in
            every text; None: texts are digested as they are.
    """

    def __init__(self, project_dir: str | None = None) -> None:
        self._project_dir = project_dir or None
        self._last_messages: Sequence[Message] = ()
        self._last_digests: list[str] = []

    @property
    def project_dir(self) -> str | None:
        """The directory replaced by ``<project>``."""
        return self._project_dir

    def _text(self, text: str) -> str:
        if self._project_dir is not None and self._project_dir in text:
            return text.replace(self._project_dir, PROJECT_PLACEHOLDER)
        return text

    def message(self, message: Message) -> str:
        """The digest of one message (ids left out; see the module's docstring)."""
        calls = [
            [
                call.name,
                self._text(
                    _encoder.encode(call.arguments).decode() if call.arguments is not None else call.raw_arguments
                ),
            ]
            for call in message.tool_calls
        ]
        canonical: list[object] = [message.role, self._text(message.content), calls, message.name, message.is_error]
        if message.images:  # left out when there are none, so a digest made before images existed still holds
            canonical.append([[image.mime_type, _sha(image.data.encode(), _PART_CHARS)] for image in message.images])
        return _sha(_encoder.encode(canonical), _PART_CHARS)

    def tool(self, spec: ToolSpec) -> str:
        """The digest of one tool: its description and schema."""
        return _sha(_encoder.encode([self._text(spec.description), spec.parameters]), _PART_CHARS)

    def digest(self, request: ModelRequest) -> RequestDigest:
        """The digests of ``request``."""
        last_messages, last_digests = self._last_messages, self._last_digests
        digests = [
            last_digests[i] if i < len(last_messages) and last_messages[i] is message else self.message(message)
            for i, message in enumerate(request.messages)
        ]
        self._last_messages, self._last_digests = list(request.messages), digests
        system = _sha(self._text(request.system or "").encode(), _PART_CHARS)
        tools = {spec.name: self.tool(spec) for spec in request.tools}
        return RequestDigest.of(system, tools, digests)


def _describe_message(message: Message, number: int) -> str:
    if message.role == "tool":
        what = f"the result of tool call {message.name or '?'}"
    elif message.role == "assistant":
        names = ", ".join(call.name for call in message.tool_calls)
        what = f"the model's answer{f' calling {names}' if names else ''}"
    else:
        what = "the user's prompt"
    return f"message {number} ({what})"


@attrs.frozen
class Difference:
    """One part of a request that differs from the recorded one.

    Attributes:
        part: ``"system"``, ``"tools"`` or ``"messages"``.
        message: For ``"messages"``, the number of the first message that
            differs, counted from 1; None for the other parts.
        text: A sentence saying how it differs, quoting the replay's side
            (a recording keeps digests, not texts).
    """

    part: str
    message: int | None
    text: str


def _tools_difference(recorded: Mapping[str, str], actual: Mapping[str, str]) -> str:
    added = sorted(set(actual) - set(recorded))
    removed = sorted(set(recorded) - set(actual))
    changed = sorted(name for name in set(actual) & set(recorded) if actual[name] != recorded[name])
    parts = [
        f"{label} {', '.join(names)}"
        for label, names in (("added", added), ("removed", removed), ("changed", changed))
        if names
    ]
    return f"the tool list differs from the recording's: {'; '.join(parts)}"


def _messages_difference(recorded: Sequence[str], request: ModelRequest, actual: Sequence[str]) -> Difference | None:
    for i, (mine, theirs) in enumerate(zip(actual, recorded, strict=False)):
        if mine != theirs:
            message = request.messages[i]
            text = (
                f"{_describe_message(message, i + 1)} differs from the recording's; "
                f"now it is {excerpt(message.content, 160)}"
            )
            return Difference("messages", i + 1, text)
    counts = f"the request has {len(actual)} messages, the recording's had {len(recorded)}"
    if len(actual) > len(recorded):
        message = request.messages[len(recorded)]
        number = len(recorded) + 1
        text = f"{counts}: {_describe_message(message, number)} is new ({excerpt(message.content, 160)})"
        return Difference("messages", number, text)
    if len(actual) < len(recorded):
        return Difference("messages", len(actual) + 1, f"{counts}: message {len(actual) + 1} is missing")
    return None


def describe_divergence(recorded: RequestDigest, request: ModelRequest, actual: RequestDigest) -> list[Difference]:
    """Say what differs between a recorded request and the one a replay sends.

    Args:
        recorded: The recording's digests of this step's request.
        request: The request the replay sends.
        actual: Its digests.

    Returns:
        Each part that differs, in this order: the system prompt, the tool
        list (the tools added, removed and changed), the first message that
        differs (or is new, or missing). Empty when only the hash differs,
        which the digests rule out.
    """
    differences = []
    if recorded.system != actual.system:
        differences.append(Difference("system", None, "the system prompt differs from the recording's"))
    if dict(recorded.tools) != dict(actual.tools):
        differences.append(Difference("tools", None, _tools_difference(recorded.tools, actual.tools)))
    messages = _messages_difference(recorded.messages, request, actual.messages)
    if messages is not None:
        differences.append(messages)
    return differences
