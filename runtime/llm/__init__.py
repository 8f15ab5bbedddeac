"""Model providers: OpenAI-compatible, Anthropic and scripted.

A provider turns a :class:`ModelRequest` into an async stream of
:class:`TextDelta`, :class:`ToolCallStarted` and :class:`ToolCallDelta`
events ending in one :class:`Completed`, or raises a :class:`ProviderError`::

    provider = make_provider("anthropic:claude-sonnet-4-5")
    request = ModelRequest(model="", messages=[Message(role="user", content="Hi")])
    async with contextlib.aclosing(provider.stream(request)) as events:
        async for event in events:
            ...
    await provider.aclose()

Three providers exist: :class:`OpenAIProvider` (any OpenAI-compatible Chat
Completions server: OpenAI, vLLM, llama.cpp, Ollama, LM Studio, OpenRouter),
:class:`AnthropicProvider` (the Messages API) and :class:`ScriptedProvider`
(replays a JSON script, for tests and demos). :func:`make_provider` builds one
from a ``provider:model`` spec and :class:`ProviderSettings`.

Record and replay: a :class:`Recorder` wraps any provider
(:class:`RecordingProvider`) and writes each answer, with digests of the
request it answered, to a file in the scripted format; ``scripted:FILE``
replays it and raises :class:`ReplayDivergence` at the first request that
differs from the recorded one (or reports it to ``on_divergence``).

The HTTP providers retry 429, 500-599, connection failures and response
timeouts with exponential backoff and jitter, honouring ``Retry-After``, but
only before the first event has been yielded; they fail with
:class:`StallTimeout` when the stream goes silent for ``stall_timeout``
seconds; cancelling a call closes its connection at once. The API key is read
from the environment variable named in the settings when each request is
sent, and appears in no repr, message or log.

Fault injection: every provider has a ``faults`` attribute, None by default.
Set it to a :class:`FaultHook` -- a callable taking a :class:`FaultPoint`
(provider, model, attempt) and returning None or a :class:`Fault` -- and the
provider consults it before each HTTP request (retries included; for the
scripted provider, before each model call). It acts on the instruction as if
the server had done it: :class:`HTTPErrorFault` is an error status, mapped
and retried like a real one; :class:`TimeoutFault` is a server gone silent
(``StallTimeout`` after ``stall_timeout``); :class:`MalformedStreamFault` is
a first event that is not valid JSON (``MalformedResponseError``).

This package stands alone on trio, httpx, msgspec and attrs: it imports
nothing else from ``weald.runtime`` but its bounded reader of regular files
(``read_regular_file``), which reads scripts.
"""

from __future__ import annotations

import logging

from ._anthropic import AnthropicProvider
from ._exceptions import (
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ContextLengthExceeded,
    MalformedResponseError,
    MalformedScriptError,
    MissingAPIKeyError,
    ModelNotFoundError,
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderTimeout,
    RateLimitError,
    RecordingError,
    ReplayDivergence,
    ScriptError,
    ScriptExhausted,
    ServerError,
    StallTimeout,
    StreamError,
    UnknownProviderError,
)
from ._factory import PROVIDERS, make_provider
from ._faults import (
    Fault,
    FaultHook,
    FaultPoint,
    HTTPErrorFault,
    MalformedStreamFault,
    TimeoutFault,
)
from ._limits import DEFAULT_CONTEXT_WINDOW, KNOWN_CONTEXT_WINDOWS, ModelLimits, model_limits
from ._openai import OpenAIProvider
from ._recording import MAX_RECORDING_BYTES, Recorder, RecordingProvider
from ._scripted import MAX_SCRIPT_BYTES, ScriptedProvider
from ._settings import ProviderSettings
from ._sse import SSEDecoder, SSEEvent
from ._types import (
    Completed,
    Image,
    Message,
    ModelRequest,
    Provider,
    Role,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStarted,
    ToolSpec,
    Usage,
)

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "KNOWN_CONTEXT_WINDOWS",
    "MAX_RECORDING_BYTES",
    "MAX_SCRIPT_BYTES",
    "PROVIDERS",
    "AnthropicProvider",
    "AuthenticationError",
    "BadRequestError",
    "Completed",
    "ConfigurationError",
    "ContextLengthExceeded",
    "Fault",
    "FaultHook",
    "FaultPoint",
    "HTTPErrorFault",
    "Image",
    "MalformedResponseError",
    "MalformedScriptError",
    "MalformedStreamFault",
    "Message",
    "MissingAPIKeyError",
    "ModelLimits",
    "ModelNotFoundError",
    "ModelRequest",
    "OpenAIProvider",
    "Provider",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderHTTPError",
    "ProviderSettings",
    "ProviderTimeout",
    "RateLimitError",
    "Recorder",
    "RecordingError",
    "RecordingProvider",
    "ReplayDivergence",
    "Role",
    "SSEDecoder",
    "SSEEvent",
    "ScriptError",
    "ScriptExhausted",
    "ScriptedProvider",
    "ServerError",
    "StallTimeout",
    "StreamError",
    "StreamEvent",
    "TextDelta",
    "TimeoutFault",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStarted",
    "ToolSpec",
    "UnknownProviderError",
    "Usage",
    "make_provider",
    "model_limits",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
