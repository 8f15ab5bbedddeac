"""Recording a real session's model responses, for ``scripted:FILE`` to replay.

::

    recorder = Recorder("session.json", project_dir="/work/proj", redact=redact)
    factory = recorder.wrap_factory(make_provider)     # providers that record what they answer
    ...                                                # run the agent on factory("openai:gpt-4.1")
    provider = make_provider("scripted:session.json")  # replays it, checking each request

A :class:`Recorder` writes one file for one agent's model calls, in the
scripted provider's format (``_scripted``): for each call, the answer (its
text, tool calls with their ids, stop reason and usage; or the error the
provider raised; or, for a call cancelled mid-stream, the text streamed so
far, marked ``cancelled``) and the digests of the request it answered
(``_digest``), so a replay can tell where it diverges.

Each response is in the file before the agent sees it: the file is rewritten
whole, atomically (a temporary file beside it, flushed to disk, renamed over
it), in a worker thread, never on the trio loop. So a recording is always a
valid script, even after a kill -9, and holds every answer the agent acted
on. It is created owner-only (0600).

The recording often lies in the agent's own project, which the agent can
change: its path is resolved once, when the agent starts (by the daemon),
and every read and write walks it again without following a symlink
(`weald.runtime.replace_file`). A directory swapped for a link to somewhere
else (``mv rec rec.old && ln -s /elsewhere rec``) makes the write fail with
`RecordingError`; nothing is written through it.

Nothing secret goes in: every text, argument and error message passes
through the ``redact`` function first (the agent layer gives weald's
``redact``, which cuts known secret values and values under secret-looking
keys). Tool results and prompts are not stored at all, only their digests.

A recording is bounded: one that would grow past ``max_bytes``
(`MAX_RECORDING_BYTES` by default, the most a script may be) is not written,
and the model call fails with `RecordingError`, rather than leave a
recording that silently stops.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import msgspec
import trio
from weald.runtime._codec import msgspec_decoder
from weald.runtime._errors import LinkInPathError, UnreadableFileError
from weald.runtime._files import read_regular_file, replace_file

from ._digest import RequestDigest, RequestDigester
from ._exceptions import (
    MalformedResponseError,
    MalformedScriptError,
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderTimeout,
    RecordingError,
    StallTimeout,
    StreamError,
)
from ._faults import FaultHook
from ._scripted import (
    MAX_SCRIPT_BYTES,
    ErrorKind,
    _expected_requests,
    _Script,
    _ScriptError,
    _ScriptRequest,
    _ScriptToolCall,
    _ScriptTurn,
    _ScriptUsage,
)
from ._types import Completed, ModelRequest, Provider, StreamEvent, TextDelta, ToolCall

__all__ = ["MAX_RECORDING_BYTES", "Recorder", "RecordingProvider"]

#: The largest recording written: the most the scripted provider reads as a script.
MAX_RECORDING_BYTES = MAX_SCRIPT_BYTES


def _same(value: Any) -> Any:
    return value


def _error_kind(error: ProviderError) -> ErrorKind:
    if isinstance(error, ProviderHTTPError):
        return "http"
    if isinstance(error, ProviderConnectionError):
        return "connection"
    if isinstance(error, StallTimeout):
        return "stall"
    if isinstance(error, ProviderTimeout):
        return "timeout"
    if isinstance(error, MalformedResponseError):
        return "malformed"
    if isinstance(error, StreamError):
        return "stream"
    return "other"


def _read_recording(path: Path, max_bytes: int) -> bytes | None:
    """The file's bytes; None when there is none. Only a regular file of at most ``max_bytes`` (blocking)."""
    try:
        return read_regular_file(path, max_bytes=max_bytes, what="recording", follow_symlinks=False)
    except UnreadableFileError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None
        raise RecordingError(str(exc)) from exc


class Recorder:
    """Writes the model responses of one agent to a recording file.

    Build one per agent (per session), before its provider: the agent's
    providers, one per incarnation of the agent (a crash makes a new one),
    all record into it through :meth:`wrap` or :meth:`wrap_factory`. Its
    state is touched on the trio loop only (the providers' streams); the
    file is written in a worker thread.

    Args:
        path: The recording file; replaced whole at each response. No
            directory on its path may be a symbolic link (the daemon resolves
            it when the agent starts): one is refused, never followed.
        project_dir: The project directory, replaced by ``<project>`` in the
            digests (see ``_digest``); None: texts are digested as they are.
        redact: Applied to every text, argument object and error message
            before it is stored (``weald.runtime.redact`` in the daemon).
        max_bytes: The largest the file may grow.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        project_dir: str | None = None,
        redact: Callable[[Any], Any] | None = None,
        max_bytes: int = MAX_RECORDING_BYTES,
    ) -> None:
        self.path = Path(os.path.abspath(path))
        self._project_dir = project_dir
        self._digester = RequestDigester(project_dir)
        self._redact = redact if redact is not None else _same
        self._max_bytes = max_bytes
        self._model: str | None = None
        # Invariant: every turn here is in the file, or is being written by the newest write.
        self._turns: list[_ScriptTurn] = []
        self._previous: RequestDigest | None = None
        self._generation = 0
        self._write_lock = threading.Lock()
        self._written = 0  # the newest generation on disk; under _write_lock

    def __repr__(self) -> str:
        return f"<Recorder {self.path} with {len(self._turns)} turns>"

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike[str],
        *,
        project_dir: str | None = None,
        redact: Callable[[Any], Any] | None = None,
        max_bytes: int = MAX_RECORDING_BYTES,
    ) -> Recorder:
        """A recorder that goes on after the turns ``path`` already holds (a restored session).

        Blocking: it reads the file (a regular file of at most ``max_bytes``).
        No file is the same as an empty one.

        Raises:
            RecordingError: the file cannot be read, or is not a recording.
        """
        recorder = cls(path, project_dir=project_dir, redact=redact, max_bytes=max_bytes)
        data = _read_recording(recorder.path, max_bytes)
        if data is None:
            return recorder
        try:
            script = msgspec_decoder(_Script).decode(data)
            expected = _expected_requests(script.turns, str(path))
        except (msgspec.DecodeError, msgspec.ValidationError, MalformedScriptError) as exc:
            msg = f"cannot go on with recording {path}: it is not a valid recording ({exc})"
            raise RecordingError(msg) from exc
        recorder._turns = list(script.turns)
        recorder._model = script.recorded_from
        recorder._previous = expected[-1] if expected else None
        return recorder

    @property
    def turn_count(self) -> int:
        """How many model calls are recorded."""
        return len(self._turns)

    def wrap(self, provider: Provider, spec: str | None = None) -> RecordingProvider:
        """``provider``, recording each model call into this recording.

        Args:
            provider: The provider to record.
            spec: The ``provider:model`` it was built from, noted in the
                recording as ``recorded_from`` (the first one given is kept).
        """
        if self._model is None:
            self._model = spec or f"{provider.name}:{provider.model}"
        return RecordingProvider(provider, self)

    def wrap_factory(self, factory: Callable[[str], Provider]) -> Callable[[str], Provider]:
        """A provider factory whose providers record into this recording."""

        def build_recording(spec: str) -> Provider:
            return self.wrap(factory(spec), spec)

        return build_recording

    # -- on the loop, from RecordingProvider ----------------------------------------------------------------

    def digest(self, request: ModelRequest) -> RequestDigest:
        """The digests of a request about to be sent."""
        return self._digester.digest(request)

    def _request(self, digest: RequestDigest) -> _ScriptRequest:
        """``digest`` as stored: relative to the request before."""
        previous = self._previous
        if previous is None:
            return _ScriptRequest(
                hash=digest.hash, system=digest.system, tools=dict(digest.tools), messages=list(digest.messages)
            )
        same = 0
        for mine, theirs in zip(digest.messages, previous.messages, strict=False):
            if mine != theirs:
                break
            same += 1
        tools = None if dict(digest.tools) == dict(previous.tools) else dict(digest.tools)
        return _ScriptRequest(
            hash=digest.hash, system=digest.system, tools=tools, same=same, messages=list(digest.messages[same:])
        )

    def _arguments(self, call: ToolCall) -> dict[str, object] | str:
        """A call's arguments as stored: the object when it round-trips to the same text, else the text."""
        raw = self._redact(call.raw_arguments)
        if call.arguments is None:
            return str(raw)
        arguments = self._redact(call.arguments)
        if arguments != call.arguments or msgspec.json.encode(call.arguments).decode() == call.raw_arguments:
            return dict(arguments)  # redacted: the object, so nothing of the original text is kept
        return str(raw)

    def completed_turn(self, event: Completed) -> _ScriptTurn:
        """What a completed call is recorded as."""
        message = event.message
        calls = [
            _ScriptToolCall(name=call.name, arguments=self._arguments(call), id=call.id) for call in message.tool_calls
        ]
        default_stop = "tool_use" if calls else "end_turn"
        return _ScriptTurn(
            text=str(self._redact(message.content)),
            tool_calls=calls,
            stop_reason=None if event.stop_reason == default_stop else event.stop_reason,
            usage=_ScriptUsage(**msgspec.structs.asdict(event.usage)),
        )

    def error_turn(self, error: ProviderError) -> _ScriptTurn:
        """What a failed call is recorded as."""
        status = error.status if isinstance(error, ProviderHTTPError) else 500
        return _ScriptTurn(
            error=_ScriptError(status=status, message=str(self._redact(error.message)), kind=_error_kind(error))
        )

    def cancelled_turn(self, text: str) -> _ScriptTurn:
        """What a call cancelled mid-stream is recorded as: the text it had streamed."""
        return _ScriptTurn(text=str(self._redact(text)), cancelled=True)

    async def add(self, turn: _ScriptTurn, digest: RequestDigest) -> None:
        """Append a call's turn and write the recording; returns once it is on disk.

        Raises:
            RecordingError: the file cannot be written, or would grow past
                ``max_bytes``; the turn is not recorded.
        """
        entry = msgspec.structs.replace(turn, request=self._request(digest))
        previous = self._previous
        self._turns.append(entry)
        self._previous = digest
        self._generation += 1
        try:
            await trio.to_thread.run_sync(self._write, list(self._turns), self._model, self._generation)
        except RecordingError:
            if self._turns and self._turns[-1] is entry:
                self._turns.pop()
                self._previous = previous
            raise

    # -- in a worker thread -----------------------------------------------------------------------------------

    def _write(self, turns: list[_ScriptTurn], model: str | None, generation: int) -> None:
        data = msgspec.json.format(msgspec.json.encode(_Script(turns=turns, recorded_from=model)), indent=2)
        if len(data) > self._max_bytes:
            msg = (
                f"recording {self.path} would grow past {self._max_bytes:,} bytes, the most a recording may "
                f"be, with model call {len(turns)}; the call's answer is not recorded. Record a shorter session"
            )
            raise RecordingError(msg)
        with self._write_lock:
            if generation <= self._written:
                return  # a newer write, which holds this turn too, got there first
            _write_atomically(self.path, data)
            self._written = generation


def _write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a temporary file beside it, on disk, renamed over it (0600), no link followed."""
    try:
        replace_file(path, data, mode=0o600)
    except LinkInPathError as exc:
        msg = (
            f"cannot write recording {path}: {exc}; the recording's directory was replaced by a link since "
            "the recording began, and nothing is written through it"
        )
        raise RecordingError(msg) from exc
    except OSError as exc:
        msg = f"cannot write recording {path}: {exc.strerror or exc}"
        raise RecordingError(msg) from exc


class RecordingProvider:
    """A provider that records each model call of the provider it wraps; see :class:`Recorder`.

    Everything else (``position`` and ``seek`` of a scripted provider, its
    settings) is the wrapped provider's. Setting ``faults`` sets the wrapped
    provider's, so fault injection acts on the real calls and the recording
    keeps what they gave.
    """

    def __init__(self, inner: Provider, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def __repr__(self) -> str:
        return f"<RecordingProvider {self._inner!r} into {self._recorder.path}>"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def name(self) -> str:
        """The wrapped provider's kind."""
        return self._inner.name

    @property
    def model(self) -> str:
        """The wrapped provider's model."""
        return self._inner.model

    @property
    def faults(self) -> FaultHook | None:
        """The wrapped provider's fault hook."""
        hook: FaultHook | None = getattr(self._inner, "faults", None)
        return hook

    @faults.setter
    def faults(self, hook: FaultHook | None) -> None:
        self._inner.faults = hook  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        """Close the wrapped provider."""
        await self._inner.aclose()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        """The wrapped provider's stream; its outcome is recorded before it is passed on.

        Raises:
            RecordingError: the answer could not be recorded.
            ProviderError: the wrapped provider's error (recorded first).
        """
        recorder = self._recorder
        digest = recorder.digest(request)
        text: list[str] = []
        recorded = False
        try:
            async with contextlib.aclosing(self._inner.stream(request)) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        text.append(event.text)
                    elif isinstance(event, Completed):
                        recorded = True
                        await recorder.add(recorder.completed_turn(event), digest)
                    yield event
        except RecordingError:
            raise
        except ProviderError as exc:
            if not recorded:
                recorded = True
                await recorder.add(recorder.error_turn(exc), digest)
            raise
        except BaseException:
            # Cancelled (an abort) or closed early: the call was spent as far as it went.
            if not recorded:
                with trio.CancelScope(shield=True):
                    await recorder.add(recorder.cancelled_turn("".join(text)), digest)
            raise
