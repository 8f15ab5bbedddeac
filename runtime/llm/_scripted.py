"""The scripted provider: replays a JSON script, for tests and demos.

A script is a list of turns, one per model call::

    {"turns": [
        {"text": "Let me look.",
         "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
        {"text": "Done.", "delay": 0.5},
        {"error": {"status": 500, "message": "upstream overloaded"}}
    ]}

Each turn may have ``text``; ``tool_calls``, each a ``name`` and
``arguments`` (an object, or a string sent as is, to script a malformed
call), and optionally an ``id``; ``delay``, seconds to wait before answering
(a cancellable ``trio.sleep``); ``stop_reason`` (default ``"tool_use"`` when
the turn calls tools, ``"end_turn"`` otherwise); ``usage``, the token
counts to report; or ``error``, a ``status`` and ``message`` raised as the
error an HTTP provider raises for that status. Unknown fields are errors, so
a typo does not pass silently. With ``"repeat": true`` at the top level, the
turns start over after the last one (for soak runs).

Everything is deterministic: text comes as at most four ``TextDelta``
chunks, tool call ids are ``call_<turn>_<n>`` (both counted from 0) unless
given, and usage, unless given, is estimated as one token per four
characters.

Two things answer without spending a turn. A compaction request (an agent
asking for a summary of its conversation, ``purpose="compaction"``) gets a
summary of its own: the script's ``summary`` text if it has one, else the
first and last lines of the conversation it was given, at most 600
characters; after the script's ``summary_delay`` seconds, if any. And with
``settings.context_window`` set, a request estimated larger than that window
fails as a real server's would (``ContextLengthExceeded``, in OpenAI's
words), so that the script's turn is still there for the retry.

A recording (``weald run --record FILE``, see ``_recording``) is a script
with more: each turn also has ``request``, the digests of the request it
answered (``_digest``), and the provider checks the request it is sent
against them before answering. A request that differs raises
:class:`ReplayDivergence`, saying what differs first, instead of answering a
conversation the recording never had; or, with ``on_divergence`` set (a
replay under fault injection, which is expected to diverge), reports it
there and answers as recorded. A recorded ``error`` has a ``kind`` saying
which error the real provider raised; a turn ``cancelled`` in the recording
(an abort while the model streamed) streams its text and then waits, as the
model did, until it is cancelled again or ``stall_timeout`` passes.
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Annotated, Literal

import msgspec
import trio
from weald.runtime._codec import msgspec_convert, msgspec_decoder
from weald.runtime._errors import UnreadableFileError
from weald.runtime._files import read_regular_file

from ._digest import Difference, RequestDigest, RequestDigester, describe_divergence
from ._exceptions import (
    MalformedResponseError,
    MalformedScriptError,
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderTimeout,
    ReplayDivergence,
    ScriptExhausted,
    StallTimeout,
    StreamError,
)
from ._faults import (
    FaultHook,
    FaultPoint,
    HTTPErrorFault,
    MalformedStreamFault,
    TimeoutFault,
)
from ._http import error_for_status
from ._settings import ProviderSettings
from ._types import (
    Completed,
    Message,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStarted,
    Usage,
)

__all__ = ["MAX_SCRIPT_BYTES", "ScriptedProvider"]

# Text is streamed in at most this many chunks.
_TEXT_CHUNKS = 4

# One estimated token per this many characters.
_CHARS_PER_TOKEN = 4

MAX_SCRIPT_BYTES = 16 * 1024 * 1024
"""The largest script file `ScriptedProvider.from_file` reads."""

# The model calls kept in `ScriptedProvider.requests` (the last ones).
REQUESTS_KEPT = 64

# Input tokens one image is estimated at (about what providers bill for a small one).
_IMAGE_TOKENS = 100

# The longest summary a compaction request gets.
_SUMMARY_CHARS = 600


_Count = Annotated[int, msgspec.Meta(ge=0)]


class _ScriptToolCall(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    name: str
    arguments: dict[str, object] | str = {}
    id: str | None = None


# How a scripted error is raised: "status" maps the status as an HTTP
# provider would, with the message as the server's words; the others replay
# a recorded error as the real provider raised it, message and all.
ErrorKind = Literal["status", "http", "connection", "timeout", "stall", "malformed", "stream", "other"]


class _ScriptError(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    status: Annotated[int, msgspec.Meta(ge=100, le=599)] = 500
    message: str = "scripted provider error"
    kind: ErrorKind = "status"


class _ScriptUsage(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    input_tokens: _Count = 0
    output_tokens: _Count = 0
    cache_read_tokens: _Count = 0
    cache_write_tokens: _Count = 0


class _ScriptRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """The digests of the request a recorded turn answered, each relative to the turn before.

    ``same`` messages at the start are the previous turn's first ``same``;
    ``messages`` are the digests of the rest. ``tools`` is None when the tool
    list is the previous turn's.
    """

    hash: str
    system: str
    tools: dict[str, str] | None = None
    same: _Count = 0
    messages: list[str] = []


class _ScriptTurn(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    text: str = ""
    tool_calls: list[_ScriptToolCall] = []
    delay: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    stop_reason: str | None = None
    usage: _ScriptUsage | None = None
    error: _ScriptError | None = None
    cancelled: bool = False
    request: _ScriptRequest | None = None


class _Script(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    turns: list[_ScriptTurn]
    summary: str | None = None
    summary_delay: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    repeat: bool = False
    recorded_from: str | None = None


def _expected_requests(turns: Sequence[_ScriptTurn], source: str) -> list[RequestDigest | None]:
    """Each turn's recorded request digests, resolved against the turn before.

    Raises:
        MalformedScriptError: a turn refers to a previous request that is not
            there, or its hash does not match its digests (an edited recording).
    """
    expected: list[RequestDigest | None] = []
    previous: RequestDigest | None = None
    for index, turn in enumerate(turns):
        request = turn.request
        if request is None:
            expected.append(None)
            previous = None
            continue
        where = f"script {source}: turns[{index}].request"
        if (request.same or request.tools is None) and previous is None:
            msg = f"{where} refers to the request of the turn before, which has none"
            raise MalformedScriptError(msg)
        if previous is not None and request.same > len(previous.messages):
            msg = f"{where}.same is {request.same}, but the turn before had {len(previous.messages)} messages"
            raise MalformedScriptError(msg)
        tools = request.tools if request.tools is not None else previous.tools if previous is not None else {}
        kept = previous.messages[: request.same] if previous is not None else ()
        digest = RequestDigest.of(request.system, tools, [*kept, *request.messages])
        if digest.hash != request.hash:
            msg = f"{where}.hash does not match its digests (was the recording edited?)"
            raise MalformedScriptError(msg)
        expected.append(digest)
        previous = digest
    return expected


def _tokens(chars: int) -> int:
    return math.ceil(chars / _CHARS_PER_TOKEN)


def _request_chars(request: ModelRequest) -> int:
    chars = len(request.system or "")
    for message in request.messages:
        chars += len(message.content) + len(message.images) * _IMAGE_TOKENS * _CHARS_PER_TOKEN
        for call in message.tool_calls:  # most messages have none: no generator per message
            chars += len(call.raw_arguments)
    return chars


def _summary(request: ModelRequest) -> str:
    """A deterministic stand-in for a model's summary of the conversation in ``request``."""
    lines = [line.strip() for m in request.messages for line in m.content.splitlines() if line.strip()]
    head = " / ".join(lines[:3])[:250]
    tail = " / ".join(lines[-3:])[:250]
    text = f"Scripted summary of {_request_chars(request)} characters. Began: {head}. Ended: {tail}."
    return text[:_SUMMARY_CHARS]


def _chunks(text: str) -> list[str]:
    if not text:
        return []
    size = math.ceil(len(text) / _TEXT_CHUNKS)
    return [text[i : i + size] for i in range(0, len(text), size)]


class ScriptedProvider:
    """A provider that replays a script instead of calling a model.

    Build one with :meth:`from_file` or :meth:`from_dict`. Each model call
    answers with the turn at :attr:`position`; the position advances as soon
    as the call gets past fault injection, as a real model call is spent once
    it is sent: a call cancelled mid-turn (an abort) has used its turn, and
    the next call gets the next one. An injected fault does not use the turn,
    so a retry after it replays the same turn. Calls are expected one at a
    time, as an agent makes them.

    The position can be saved and restored, so that an agent restored after a
    crash continues the script where it was: pass ``start_position`` or call
    :meth:`seek`.

    Turns that carry a recorded ``request`` are checked against the request
    sent (after fault injection, before the turn is spent): see the module's
    docstring.

    Attributes:
        faults: The fault hook consulted before each model call, or None.
            Faults are not retried here; see ``weald.runtime.llm.FaultHook``.
        requests: The last `REQUESTS_KEPT` model calls it was sent, oldest
            first, as they came (messages, their images, the tools offered):
            what a test checks the model was shown.
        settings: Only ``stall_timeout`` matters, for ``TimeoutFault`` and
            for a recorded turn that was cancelled.
        on_divergence: None: a request that differs from the recorded one
            raises `ReplayDivergence`. A callable: it is given the
            `ReplayDivergence` instead, one for each part that differs
            that it was not told of before (the system prompt, the tool
            list, the first message that differs: later steps that differ
            only in the same message are not told again), and the recorded
            turn is answered as if the request had matched. It runs on the task that iterates the
            stream and must not block.
    """

    name = "scripted"

    def __init__(
        self,
        turns: Sequence[_ScriptTurn],
        *,
        source: str,
        start_position: int = 0,
        settings: ProviderSettings | None = None,
        faults: FaultHook | None = None,
    ) -> None:
        """Wrap parsed turns; use :meth:`from_file` or :meth:`from_dict` instead."""
        self._turns = tuple(turns)
        self._source = source
        self._summary: str | None = None
        self._summary_delay = 0.0
        self._repeat = False
        self._expected = _expected_requests(self._turns, source)
        self.settings = settings if settings is not None else ProviderSettings()
        self.faults = faults
        self.requests: collections.deque[ModelRequest] = collections.deque(maxlen=REQUESTS_KEPT)
        self.on_divergence: Callable[[ReplayDivergence], None] | None = None
        self._digester = RequestDigester()
        # The differences told to on_divergence: each new one is told once.
        self._reported: set[tuple[str, int | None]] = set()
        self._position = 0
        self.seek(start_position)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        start_position: int = 0,
        settings: ProviderSettings | None = None,
        faults: FaultHook | None = None,
    ) -> ScriptedProvider:
        """Load a script from a JSON file.

        Args:
            path: The script file.
            start_position: The turn the first model call gets (0-based).
            settings: Provider settings (only ``stall_timeout`` is used).
            faults: A fault hook.

        Returns:
            The provider; its ``model`` is ``path`` as given.

        Blocking (it reads the file): call it from a worker thread, not the
        trio loop. Only a regular file of at most `MAX_SCRIPT_BYTES` is read:
        a FIFO, a device or a directory is refused at once.

        Raises:
            MalformedScriptError: The file cannot be read, is not a regular
                file, is too large, or is not a valid script; the message
                names the file and the bad field.
        """
        source = os.fspath(path)
        where = os.path.abspath(source)  # errors name the file where it was looked for
        try:
            data = read_regular_file(source, max_bytes=MAX_SCRIPT_BYTES, what="script")
        except UnreadableFileError as exc:
            raise MalformedScriptError(str(exc)) from exc
        try:
            script = msgspec_decoder(_Script).decode(data)
        except msgspec.ValidationError as exc:
            raise MalformedScriptError(f"script {where} is not valid: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise MalformedScriptError(f"script {where} is not valid JSON: {exc}") from exc
        return cls._of(script, source, start_position, settings, faults)

    @classmethod
    def _of(
        cls,
        script: _Script,
        source: str,
        start_position: int,
        settings: ProviderSettings | None,
        faults: FaultHook | None,
    ) -> ScriptedProvider:
        provider = cls(script.turns, source=source, start_position=start_position, settings=settings, faults=faults)
        provider._summary = script.summary
        provider._summary_delay = script.summary_delay
        provider._repeat = script.repeat and bool(script.turns)
        return provider

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, object],
        *,
        name: str = "inline",
        start_position: int = 0,
        settings: ProviderSettings | None = None,
        faults: FaultHook | None = None,
    ) -> ScriptedProvider:
        """Build a script from plain data, shaped as the JSON file is.

        Args:
            data: ``{"turns": [...]}``.
            name: What to call the script in messages; also the ``model``.
            start_position: The turn the first model call gets (0-based).
            settings: Provider settings (only ``stall_timeout`` is used).
            faults: A fault hook.

        Returns:
            The provider.

        Raises:
            MalformedScriptError: ``data`` is not a valid script.
        """
        try:
            script = msgspec_convert(data, _Script)
        except msgspec.ValidationError as exc:
            raise MalformedScriptError(f"script {name} is not valid: {exc}") from exc
        return cls._of(script, name, start_position, settings, faults)

    def __repr__(self) -> str:
        return f"<ScriptedProvider {self._source} at turn {self._position} of {len(self._turns)}>"

    @property
    def model(self) -> str:
        """The script's source: its path, or the name given to ``from_dict``."""
        return self._source

    @property
    def position(self) -> int:
        """The 0-based index of the turn the next model call gets."""
        return self._position

    @property
    def turn_count(self) -> int:
        """How many turns the script has."""
        return len(self._turns)

    @property
    def project_dir(self) -> str | None:
        """The project directory a recording's texts are compared under (as ``<project>``); None: none."""
        return self._digester.project_dir

    @project_dir.setter
    def project_dir(self, value: str | None) -> None:
        self._digester = RequestDigester(value)

    @property
    def recorded(self) -> bool:
        """Whether any turn carries a recorded request, which replays check."""
        return any(expected is not None for expected in self._expected)

    def seek(self, position: int) -> None:
        """Make the next model call get turn ``position``.

        Args:
            position: 0 to ``turn_count`` (the latter meaning "exhausted");
                any position from 0 for a script that repeats.

        Raises:
            ValueError: ``position`` is out of that range.
        """
        if position < 0 or (position > len(self._turns) and not self._repeat):
            raise ValueError(f"script {self._source} has {len(self._turns)} turns; position {position} is out of range")
        self._position = position

    async def aclose(self) -> None:
        """Nothing to release; here for the ``Provider`` protocol."""

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        """Answer with the next turn; see ``Provider.stream``.

        Raises:
            ScriptExhausted: There is no turn left.
            ProviderError: The turn scripts an error, or a fault was injected.
        """
        model = request.model or self._source
        input_tokens = _tokens(_request_chars(request))
        window = self.settings.context_window
        if window is not None and input_tokens > window:
            await trio.lowlevel.checkpoint()
            raise error_for_status(
                400,
                f"This model's maximum context length is {window} tokens. However, your messages "
                f"resulted in {input_tokens} tokens. Please reduce the length of the messages.",
                provider=self.name,
                model=model,
                url=f"script {self._source}",
                key_env=None,
            )
        if request.purpose == "compaction":
            await self._inject_fault(model)
            if self._summary_delay:
                await trio.sleep(self._summary_delay)
            else:
                await trio.lowlevel.checkpoint()
            summary = self._summary if self._summary is not None else _summary(request)
            for chunk in _chunks(summary):
                yield TextDelta(chunk)
            usage = Usage(input_tokens=input_tokens, output_tokens=_tokens(len(summary)))
            yield Completed(message=Message(role="assistant", content=summary), usage=usage, stop_reason="end_turn")
            return
        index = self._position
        if index >= len(self._turns) and not self._repeat:
            raise ScriptExhausted(
                f"script {self._source} has {len(self._turns)} turns; model call {index + 1} has none"
            )
        turn = self._turns[index % len(self._turns)]
        self.requests.append(request)
        await self._inject_fault(model)
        expected = self._expected[index % len(self._turns)]
        if expected is not None:
            self._check(index, expected, request)
        # The turn is spent from here on, even if this call is cancelled.
        self._position = index + 1
        if turn.delay:
            await trio.sleep(turn.delay)
        else:
            # Always a checkpoint, as trio expects of an async call.
            await trio.lowlevel.checkpoint()
        if turn.error is not None:
            raise self._error(turn.error, model, index)
        for chunk in _chunks(turn.text):
            yield TextDelta(chunk)
        if turn.cancelled:
            # The recorded call was cancelled here (an abort): wait, as the model did.
            await trio.sleep(self.settings.stall_timeout)
            raise StallTimeout(
                f"{self.name}: turn {index} of recording {self._source} was cancelled while the model "
                f"streamed, and this replay was not cancelled there within {self.settings.stall_timeout} s"
            )
        calls: list[ToolCall] = []
        for n, scripted in enumerate(turn.tool_calls):
            raw = (
                scripted.arguments
                if isinstance(scripted.arguments, str)
                else msgspec.json.encode(scripted.arguments).decode()
            )
            call_id = scripted.id or f"call_{index}_{n}"
            yield ToolCallStarted(index=n, id=call_id, name=scripted.name)
            if raw:
                yield ToolCallDelta(index=n, arguments_fragment=raw)
            calls.append(ToolCall.parse(id=call_id, name=scripted.name, raw_arguments=raw))
        if turn.usage is not None:
            usage = Usage(**msgspec.structs.asdict(turn.usage))
        else:
            output_chars = len(turn.text) + sum(len(call.raw_arguments) for call in calls)
            usage = Usage(input_tokens=input_tokens, output_tokens=_tokens(output_chars))
        stop_reason = turn.stop_reason or ("tool_use" if calls else "end_turn")
        message = Message(role="assistant", content=turn.text, tool_calls=calls)
        yield Completed(message=message, usage=usage, stop_reason=stop_reason)

    def _check(self, index: int, expected: RequestDigest, request: ModelRequest) -> None:
        """Compare the request with the recorded one; raise or report what differs."""
        actual = self._digester.digest(request)
        if actual.hash == expected.hash:
            return
        differences = describe_divergence(expected, request, actual)
        step = index + 1
        if self.on_divergence is None:
            raise self._divergence(step, differences)
        for difference in differences:
            key = (difference.part, difference.message)
            if key not in self._reported:
                self._reported.add(key)
                self.on_divergence(self._divergence(step, [difference]))

    def _divergence(self, step: int, differences: Sequence[Difference]) -> ReplayDivergence:
        first = differences[0]
        return ReplayDivergence(
            f"the replay of {self._source} diverged from the recording at step {step} of "
            f"{len(self._turns)}: {'; and '.join(d.text for d in differences)}. The recorded answer is for "
            "another request; find what changed (a file a tool read, a tool's output, the prompt, the "
            "tools offered) or record the session again",
            step=step,
            part=first.part,
            message_index=first.message,
        )

    def _error(self, error: _ScriptError, model: str, index: int) -> ProviderError:
        """The error a turn scripts (or a recording replays)."""
        where = f"script {self._source} turn {index}"
        if error.kind in ("status", "http"):
            mapped = error_for_status(
                error.status, error.message, provider=self.name, model=model, url=where, key_env=None
            )
            if error.kind == "status":
                return mapped
            # Recorded: the same class, with the real provider's own message.
            assert isinstance(mapped, ProviderHTTPError)
            return type(mapped)(error.message, status=error.status)
        classes: dict[str, type[ProviderError]] = {
            "connection": ProviderConnectionError,
            "timeout": ProviderTimeout,
            "stall": StallTimeout,
            "malformed": MalformedResponseError,
            "stream": StreamError,
            "other": ProviderError,
        }
        return classes[error.kind](error.message, retryable=False)

    async def _inject_fault(self, model: str) -> None:
        if self.faults is None:
            return
        fault = self.faults(FaultPoint(provider=self.name, model=model, attempt=0))
        if isinstance(fault, HTTPErrorFault):
            raise error_for_status(
                fault.status,
                fault.message,
                provider=self.name,
                model=model,
                url=f"script {self._source}",
                key_env=None,
                retry_after=fault.retry_after,
            )
        if isinstance(fault, TimeoutFault):
            await trio.sleep(self.settings.stall_timeout)
            raise StallTimeout(
                f"{self.name}: script {self._source} went silent for {self.settings.stall_timeout} s (stall_timeout)"
            )
        if isinstance(fault, MalformedStreamFault):
            raise MalformedResponseError(f"{self.name}: malformed stream event from script {self._source} (injected)")
