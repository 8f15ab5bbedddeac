"""Exceptions raised by the model providers.

Every error a provider raises is a :class:`ProviderError`; cancellation
(``trio.Cancelled``) is never wrapped, so "it was stopped" stays apart from
"it broke". The tree::

    ProviderError
    ├── ConfigurationError          the provider cannot be set up as asked
    │   ├── UnknownProviderError    the spec names a provider we do not know
    │   └── MissingAPIKeyError      the API key environment variable is unset or empty
    ├── ProviderHTTPError           the server answered with an error status (.status)
    │   ├── AuthenticationError     401 / 403: the key was refused
    │   ├── BadRequestError         400 / 422: the server rejected the request
    │   │   └── ContextLengthExceeded   the request is larger than the model's context window
    │   ├── ModelNotFoundError      404: no such model (or wrong base URL)
    │   ├── RateLimitError          429 (retried first)
    │   └── ServerError             500-599 (retried first)
    ├── ProviderConnectionError     no connection, or it broke (retried first)
    ├── ProviderTimeout             no response within ``timeout`` (retried first)
    │   └── StallTimeout            the stream went silent for ``stall_timeout``
    ├── MalformedResponseError      the server sent something we cannot parse
    ├── StreamError                 the server reported an error inside the stream
    ├── ScriptError                 the scripted provider cannot go on
    │   ├── MalformedScriptError    the script file is not valid
    │   ├── ScriptExhausted         a model call found no turn left
    │   └── ReplayDivergence        a replayed request differs from the recorded one
    └── RecordingError              a recording cannot be written

``retryable`` tells whether the HTTP providers retry the error by themselves
(they do so only before the first stream event has been yielded); when an
error reaches the caller, those retries are already spent and a note on the
exception says how many attempts were made. ``retry_after`` carries the
server's ``Retry-After`` hint, in seconds, when it sent one.

No message ever contains an API key: the providers hold only the *name* of
the environment variable, read the key when they send a request, and scrub it
from any text a server sends back.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ConfigurationError",
    "ContextLengthExceeded",
    "MalformedResponseError",
    "MalformedScriptError",
    "MissingAPIKeyError",
    "ModelNotFoundError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderHTTPError",
    "ProviderTimeout",
    "RateLimitError",
    "RecordingError",
    "ReplayDivergence",
    "ScriptError",
    "ScriptExhausted",
    "ServerError",
    "StallTimeout",
    "StreamError",
    "UnknownProviderError",
]


class ProviderError(Exception):
    """Base class of every error a model provider raises.

    Attributes:
        message: What went wrong, for people and models alike.
        retryable: Whether the HTTP providers retry this error themselves.
        retry_after: The server's ``Retry-After`` hint in seconds, if any.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable
        self.retry_after = retry_after


class ConfigurationError(ProviderError):
    """The provider cannot be set up as asked (bad spec, URL or settings)."""


class UnknownProviderError(ConfigurationError):
    """The provider spec names a provider that does not exist."""


class MissingAPIKeyError(ConfigurationError):
    """The environment variable that should hold the API key is unset or empty.

    Attributes:
        env_var: The name of the variable (never its value).
    """

    def __init__(self, message: str, *, env_var: str) -> None:
        super().__init__(message)
        self.env_var = env_var


class ProviderHTTPError(ProviderError):
    """The server answered with an HTTP error status.

    Attributes:
        status: The HTTP status code.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        retryable: bool | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, retry_after=retry_after)
        self.status = status


class AuthenticationError(ProviderHTTPError):
    """The server refused the API key (HTTP 401 or 403)."""


class BadRequestError(ProviderHTTPError):
    """The server rejected the request as invalid (HTTP 400 or 422)."""


class ContextLengthExceeded(BadRequestError):
    """The request does not fit the model's context window (a 400 that says so).

    Raised for OpenAI's ``context_length_exceeded``, Anthropic's "prompt is
    too long" and llama.cpp's ``exceed_context_size_error``, and for any
    400/413 whose message says the same in those words. An agent that gets
    it compacts its conversation once and retries.

    Attributes:
        limit: The model's context window in tokens, when the server said it.
        requested: How many tokens the request had, when the server said it.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        limit: int | None = None,
        requested: int | None = None,
    ) -> None:
        super().__init__(message, status=status)
        self.limit = limit
        self.requested = requested


class ModelNotFoundError(ProviderHTTPError):
    """The server does not know the model, or the base URL is wrong (HTTP 404)."""


class RateLimitError(ProviderHTTPError):
    """The server is rate limiting us (HTTP 429)."""

    retryable = True


class ServerError(ProviderHTTPError):
    """The server failed (HTTP 500-599)."""

    retryable = True


class ProviderConnectionError(ProviderError):
    """The connection could not be made, or broke before the stream completed."""

    retryable = True


class ProviderTimeout(ProviderError):
    """The server did not start answering within the ``timeout`` setting."""

    retryable = True


class StallTimeout(ProviderTimeout):
    """The response stream went silent for longer than ``stall_timeout``.

    A stall is not retried: the server had accepted the request, and silently
    starting the generation over would hide the stall and double its cost.
    """

    retryable = False


class MalformedResponseError(ProviderError):
    """The server sent a payload we cannot parse (bad JSON, unexpected shape)."""


class StreamError(ProviderError):
    """The server reported an error inside an otherwise healthy stream.

    Attributes:
        kind: The server's error type (``"overloaded_error"``, ...), if it gave one.
    """

    def __init__(self, message: str, *, kind: str | None = None, retryable: bool | None = None) -> None:
        super().__init__(message, retryable=retryable)
        self.kind = kind


class ScriptError(ProviderError):
    """The scripted provider cannot go on."""


class MalformedScriptError(ScriptError):
    """The script is not valid; the message names the file and the bad field."""


class ScriptExhausted(ScriptError):
    """A model call found no turn left in the script."""


class ReplayDivergence(ScriptError):
    """A replayed request differs from the one the recording answered.

    Attributes:
        step: The model call, counted from 1 (``turns[step - 1]`` of the recording).
        part: What differs first: ``"system"``, ``"tools"`` or ``"messages"``.
        message_index: For ``"messages"``, the number of the first message
            that differs, counted from 1; None otherwise.
    """

    def __init__(self, message: str, *, step: int, part: str, message_index: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.part = part
        self.message_index = message_index


class RecordingError(ProviderError):
    """A model response could not be added to its recording (the file cannot be written, or is full)."""
