"""The HTTP machinery the OpenAI and Anthropic providers share.

One model call is one POST answered by a server-sent-event stream. This
module sends it, retries what is worth retrying, watches the stream for
stalls, maps HTTP failures to the exception tree and decodes the SSE
framing; the provider subclasses only build the payload and turn SSE events
into stream events.

Timeouts are trio cancel scopes rather than httpx's own read timeout, so that
waiting for the response headers (``timeout``) and waiting for each chunk of
the body (``stall_timeout``) are told apart.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import math
import random
import re
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from typing import ClassVar, Protocol

import httpx
import msgspec
import trio
from weald.runtime import environ_value

from ._body import ResponseBody
from ._exceptions import (
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ContextLengthExceeded,
    MalformedResponseError,
    MissingAPIKeyError,
    ModelNotFoundError,
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderTimeout,
    RateLimitError,
    ServerError,
    StallTimeout,
)
from ._faults import (
    FaultHook,
    FaultPoint,
    HTTPErrorFault,
    MalformedStreamFault,
    TimeoutFault,
)
from ._settings import ProviderSettings
from ._sse import SSEDecoder, SSEEvent
from ._types import Completed, ModelRequest, StreamEvent
from ._util import excerpt, redact

__all__ = ["HTTPProvider", "StreamDecoder", "context_overflow", "error_for_status", "parse_retry_after"]

logger = logging.getLogger("weald.runtime.llm")

# The most of an error response body we read, in bytes.
_ERROR_BODY_LIMIT = 64 * 1024

# How long we wait for the end of a body after the last event, so that the
# connection can be reused, before closing it instead.
_DRAIN_TIMEOUT = 1.0
_DRAIN_LIMIT = 64 * 1024

# What a MalformedStreamFault makes the server "send".
_MALFORMED_EVENT = SSEEvent(data='{"injected": malformed')


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Parse a ``Retry-After`` header: delay seconds or an HTTP date.

    Args:
        value: The header's value, or None.
        now: The current Unix time, for tests; defaults to ``time.time()``.

    Returns:
        The delay in seconds (never negative), or None if absent or unparsable.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


# What servers say when a request does not fit the model's context window:
# OpenAI (code context_length_exceeded), Anthropic ("prompt is too long"),
# llama.cpp (type exceed_context_size_error), and the same words elsewhere.
_OVERFLOW_MARKERS = (
    "context_length_exceeded",
    "exceed_context_size",
    "maximum context length",
    "prompt is too long",
    "exceed context limit",
    "exceeds the available context size",
    "exceeds the context window",
    "context length exceeded",
)
# (pattern, which group is the limit, which the request's size; 0: absent)
_OVERFLOW_NUMBERS = (
    (re.compile(r"maximum context length is (\d+) tokens.*?(?:resulted in|requested) (\d+) tokens", re.S), 1, 2),
    (re.compile(r"maximum context length is (\d+) tokens"), 1, 0),
    (re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum"), 2, 1),
    (re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)"), 2, 1),
    (re.compile(r"exceed context limit: (\d+) \+ \d+ > (\d+)"), 2, 1),
)


def context_overflow(status: int, text: str) -> tuple[int | None, int | None] | None:
    """Whether an error response says the request exceeds the context window.

    Args:
        status: The HTTP status (only 400 and 413 can be such an error).
        text: The server's message, or its whole error body.

    Returns:
        None if it does not; else ``(limit, requested)`` in tokens, each
        None when the text does not give it.
    """
    if status not in (400, 413):
        return None
    lowered = text.lower()
    if not any(marker in lowered for marker in _OVERFLOW_MARKERS):
        return None
    for pattern, limit_group, requested_group in _OVERFLOW_NUMBERS:
        found = pattern.search(lowered)
        if found is not None:
            limit = int(found.group(limit_group))
            requested = int(found.group(requested_group)) if requested_group else None
            return limit, requested
    return None, None


def error_for_status(
    status: int,
    server_message: str,
    *,
    provider: str,
    model: str,
    url: str,
    key_env: str | None,
    retry_after: float | None = None,
    body: str = "",
) -> ProviderError:
    """Map an HTTP error status to the matching :class:`ProviderError`.

    Args:
        status: The HTTP status code.
        server_message: What the server said, already redacted.
        provider: The provider's kind, for the message.
        model: The model called.
        url: The URL called.
        key_env: The name of the API key's environment variable, if any.
        retry_after: The server's ``Retry-After`` in seconds, if any.
        body: The whole error body (redacted), read for an error type or
            code the message leaves out (``context_length_exceeded``).

    Returns:
        The exception to raise.
    """
    said = f": {server_message}" if server_message else ""
    overflow = context_overflow(status, f"{server_message}\n{body}")
    if overflow is not None:
        limit, requested = overflow
        window = f" of {limit} tokens" if limit else ""
        return ContextLengthExceeded(
            f"{provider}: the request for model {model!r} does not fit its context window{window} "
            f"(HTTP {status}){said}",
            status=status,
            limit=limit,
            requested=requested,
        )
    if status in (401, 403):
        check = (
            f"Check that the environment variable {key_env} holds a valid key for this server."
            if key_env
            else "Check the API key."
        )
        return AuthenticationError(
            f"{provider} refused the API key for model {model!r} (HTTP {status}){said}. {check}",
            status=status,
        )
    if status == 404:
        return ModelNotFoundError(
            f"{provider} has no model {model!r} at {url} (HTTP 404){said}. Check the model name and the base URL.",
            status=status,
        )
    if status in (400, 422):
        return BadRequestError(
            f"{provider} rejected the request for model {model!r} (HTTP {status}){said}",
            status=status,
        )
    if status == 429:
        return RateLimitError(
            f"{provider} is rate limiting model {model!r} (HTTP 429){said}",
            status=status,
            retry_after=retry_after,
        )
    if 500 <= status <= 599:
        return ServerError(
            f"{provider} failed serving model {model!r} (HTTP {status}){said}",
            status=status,
            retry_after=retry_after,
        )
    return ProviderHTTPError(
        f"{provider} answered HTTP {status} for model {model!r}{said}",
        status=status,
    )


def _error_in(body: bytes) -> tuple[str, str | None] | None:
    """The message and type of the error a JSON body reports, or None if none.

    OpenAI: ``{"error": {"message": ..., "type": ...}}``; Anthropic:
    ``{"type": "error", "error": {"type": ..., "message": ...}}``; Ollama and
    others: ``{"error": "..."}``; some proxies: ``{"message": ...}``.
    """
    try:
        payload = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        kind = error.get("type")
        return str(error["message"]), kind if isinstance(kind, str) and kind else None
    if isinstance(error, str):
        return error, None
    if isinstance(payload.get("message"), str):
        return str(payload["message"]), None
    return None


def _server_message(body: bytes, clean: Callable[[str], str]) -> str:
    """Pull the human-readable message out of an error response body.

    ``clean`` (the key's redaction) runs before a plain-text body is cut
    short, so a key at the cut cannot leak half of itself.
    """
    found = _error_in(body)
    if found is not None:
        return clean(found[0])
    text = body.decode("utf-8", errors="replace").strip()
    return excerpt(clean(text)) if text else ""


def _is_event_stream(content_type: str) -> bool:
    """Whether a ``Content-Type`` value names SSE, parameters and case aside.

    llama.cpp, Ollama and vLLM send variants such as
    ``text/event-stream; charset=utf-8``.
    """
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


class StreamDecoder(Protocol):
    """Turns one response's SSE events into stream events.

    Raises ``MalformedResponseError`` or ``StreamError`` from :meth:`feed`
    for payloads it cannot accept.
    """

    @property
    def done(self) -> bool:
        """Whether the stream's last event has been seen."""
        ...

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        """Take one SSE event; return the stream events it yields."""
        ...

    def finish(self) -> Completed:
        """Return the final event, or raise if the stream ended too early."""
        ...


class _EnvKeyAuth(httpx.Auth):
    """Puts the API key from an environment variable on each request.

    The key is read when the request goes out and lives nowhere else: from
    the environment, or, once the daemon has scrubbed its environment, from
    the copy `weald.runtime.environ_value` keeps in memory.
    """

    def __init__(
        self,
        provider: str,
        env_var: str,
        header: str,
        scheme: str | None,
        required: bool,
    ) -> None:
        self.env_var = env_var
        self._provider = provider
        self._header = header
        self._scheme = scheme
        self._required = required

    def __repr__(self) -> str:
        return f"<{type(self).__name__} from ${self.env_var}>"

    def check(self) -> None:
        """Raise :class:`MissingAPIKeyError` if a required key is absent."""
        if self._required and not environ_value(self.env_var):
            raise MissingAPIKeyError(
                f"{self._provider} needs an API key, but the environment variable "
                f"{self.env_var} is not set or is empty. Set it, or name another "
                "variable with api_key_env under [providers.NAME] in weald.toml "
                "(ProviderSettings(api_key_env=...) in Python).",
                env_var=self.env_var,
            )

    def secret(self) -> str | None:
        """The key, for scrubbing it from server text; never store it."""
        return environ_value(self.env_var) or None

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        key = environ_value(self.env_var)
        if key:
            request.headers[self._header] = f"{self._scheme} {key}" if self._scheme else key
        else:
            self.check()
        yield request


class HTTPProvider:
    """Base class of the providers that speak HTTP + SSE.

    Subclasses set the class attributes and implement :meth:`_payload`,
    :meth:`_headers` and :meth:`_decode`.

    Attributes:
        faults: The fault hook consulted before each request, or None.
        settings: The connection settings.
    """

    name: ClassVar[str]
    _default_base_url: ClassVar[str]
    _default_key_env: ClassVar[str]
    _path: ClassVar[str]
    _auth_header: ClassVar[str]
    _auth_scheme: ClassVar[str | None]

    def __init__(
        self,
        model: str,
        settings: ProviderSettings | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        faults: FaultHook | None = None,
    ) -> None:
        """Create a provider for ``model``.

        Args:
            model: The model to call when a request does not name one.
            settings: Connection settings; None means all defaults.
            client: An ``httpx.AsyncClient`` to share. The provider closes
                only a client it created itself.
            faults: A fault hook, see ``weald.runtime.llm.FaultHook``.
        """
        self.settings = settings if settings is not None else ProviderSettings()
        self.faults = faults
        self._model = model
        base_url = (self.settings.base_url or self._default_base_url).rstrip("/")
        self._url = base_url + self._path
        self._auth = _EnvKeyAuth(
            self.name,
            self.settings.api_key_env or self._default_key_env,
            self._auth_header,
            self._auth_scheme,
            self.settings.api_key_required,
        )
        self._owns_client = client is None
        if client is None:
            # Reads are timed by trio cancel scopes (see the module docstring).
            timeout = httpx.Timeout(
                self.settings.timeout,
                connect=self.settings.connect_timeout,
                read=None,
            )
            client = httpx.AsyncClient(timeout=timeout)
        self._client = client
        self._random = random.Random()  # noqa: S311 - for jitter, not secrets

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}:{self._model} at {self._url}>"

    @property
    def model(self) -> str:
        """The model this provider calls when a request does not name one."""
        return self._model

    @property
    def url(self) -> str:
        """The URL each model call is posted to."""
        return self._url

    async def aclose(self) -> None:
        """Close the HTTP client, if this provider created it. Idempotent."""
        if self._owns_client:
            await self._client.aclose()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        """Call the model and stream its answer; see ``Provider.stream``.

        Retries 429, 500-599, connection failures and response timeouts with
        exponential backoff and jitter, honouring ``Retry-After``, but only
        until the first event has been yielded: after that, a failure is
        raised as it is.

        Raises:
            ProviderError: The call failed; see the exception tree.
        """
        model = request.model or self._model
        self._auth.check()
        try:
            body = msgspec.json.encode(self._payload(request, model))
        except (msgspec.EncodeError, TypeError) as exc:
            raise ConfigurationError(
                f"{self.name}: the request for model {model!r} cannot be encoded as JSON: {exc}"
            ) from exc
        attempt = 0
        yielded = False
        while True:
            try:
                async with contextlib.aclosing(self._attempt(body, model, attempt)) as events:
                    async for event in events:
                        yielded = True
                        yield event
            except ProviderError as exc:
                delay = None if yielded else self._retry_delay(exc, attempt)
                if delay is None:
                    if attempt:
                        exc.add_note(f"{self.name}: gave up after {attempt + 1} attempts")
                    raise
                logger.warning(
                    "%s:%s attempt %d failed (%s); retrying in %.2f s",
                    self.name,
                    model,
                    attempt + 1,
                    exc.message,
                    delay,
                )
                await trio.sleep(delay)
                attempt += 1
            else:
                return

    def _retry_delay(self, exc: ProviderError, attempt: int) -> float | None:
        """Seconds to wait before retrying ``exc``, or None to give up."""
        settings = self.settings
        if not exc.retryable or attempt >= settings.max_retries:
            return None
        if exc.retry_after is not None:
            if exc.retry_after > settings.max_retry_after:
                exc.add_note(
                    f"the server asked to retry after {exc.retry_after:.0f} s, "
                    "more than "
                    f"max_retry_after ({settings.max_retry_after:.0f} s)"
                )
                return None
            return exc.retry_after
        # Exponential backoff with "equal jitter": half fixed, half random,
        # so that many agents failing together do not retry in lockstep.
        ceiling = min(settings.backoff_cap, settings.backoff_base * 2.0**attempt)
        return ceiling / 2 + self._random.uniform(0, ceiling / 2)

    async def _attempt(self, body: bytes, model: str, attempt: int) -> AsyncGenerator[StreamEvent, None]:
        """Send the request once and stream the answer."""
        fault = None
        if self.faults is not None:
            fault = self.faults(FaultPoint(provider=self.name, model=model, attempt=attempt))
        if isinstance(fault, HTTPErrorFault):
            raise self._status_error(fault.status, fault.message, model, fault.retry_after)
        response = await self._send(body, model)
        reader = ResponseBody(
            response,
            stall_timeout=self.settings.stall_timeout,
            stalled=self._stall_error,
            describe=f"{self.name} at {self._url}",
        )
        completed = False
        try:
            if response.status_code >= 300:
                raw = await reader.read(_ERROR_BODY_LIMIT)
                raise self._status_error(
                    response.status_code,
                    _server_message(raw, self._server_text),
                    model,
                    parse_retry_after(response.headers.get("retry-after")),
                    body=self._server_text(raw.decode("utf-8", errors="replace")),
                )
            # A missing Content-Type is read as SSE, as before: some servers
            # stream without one. A declared other type is no stream at all.
            content_type = response.headers.get("content-type", "").strip()
            if content_type and not _is_event_stream(content_type):
                raw = await reader.read(_ERROR_BODY_LIMIT)
                raise self._not_an_event_stream(response.status_code, content_type, raw)
            if isinstance(fault, TimeoutFault):
                await trio.sleep(self.settings.stall_timeout)
                raise self._stall_error()
            decoder = self._decoder()
            sse = SSEDecoder()
            if isinstance(fault, MalformedStreamFault):
                for event in decoder.feed(_MALFORMED_EVENT):
                    yield event
            while not decoder.done:
                chunk = await reader.receive()
                sse_events = sse.feed(chunk) if chunk is not None else sse.close()
                for sse_event in sse_events:
                    for event in decoder.feed(sse_event):
                        yield event
                    if decoder.done:
                        break
                if chunk is None:
                    break
            final = decoder.finish()
            completed = True
            yield final
        finally:
            try:
                if completed:
                    # Let the connection go back to the pool if the server
                    # ends the body promptly, as it does after the last event.
                    await reader.drain(_DRAIN_TIMEOUT, _DRAIN_LIMIT)
            finally:
                await reader.aclose()

    async def _send(self, body: bytes, model: str) -> httpx.Response:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            **self._headers(),
            **self.settings.extra_headers,
        }
        try:
            request = self._client.build_request("POST", self._url, content=body, headers=headers)
        except httpx.InvalidURL as exc:
            raise ConfigurationError(f"{self.name}: invalid base URL {self._url!r}: {exc}") from exc
        try:
            with trio.fail_after(self.settings.timeout):
                return await self._client.send(request, stream=True, auth=self._auth)
        except trio.TooSlowError as exc:
            raise ProviderTimeout(
                f"{self.name} did not answer within {self.settings.timeout} s (model {model!r}, {self._url})"
            ) from exc
        except httpx.UnsupportedProtocol as exc:
            raise ConfigurationError(
                f"{self.name}: unsupported URL {self._url!r}; the base URL must start with http:// or https://"
            ) from exc
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(f"{self.name}: timed out connecting to {self._url} ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ProviderConnectionError(
                f"{self.name}: cannot reach {self._url}: {type(exc).__name__}: {exc}"
            ) from exc

    def _status_error(
        self, status: int, server_message: str, model: str, retry_after: float | None, *, body: str = ""
    ) -> ProviderError:
        return error_for_status(
            status,
            server_message,
            provider=self.name,
            model=model,
            url=self._url,
            key_env=self._auth.env_var,
            retry_after=retry_after,
            body=body,
        )

    def _stall_error(self) -> StallTimeout:
        return StallTimeout(
            f"{self.name}: the stream from {self._url} went silent for {self.settings.stall_timeout} s (stall_timeout)"
        )

    def _malformed(self, what: str, data: str) -> MalformedResponseError:
        """The error for an SSE event we cannot make sense of."""
        return MalformedResponseError(
            f"{self.name}: malformed stream event from {self._url} ({what}): {excerpt(self._server_text(data))}"
        )

    def _not_an_event_stream(self, status: int, content_type: str, body: bytes) -> MalformedResponseError:
        """The error for a success response that is not an event stream.

        Quotes the server's error message when the body is a JSON error,
        else the content type and the start of the body. Not retried: a
        server that answers a streaming request this way will do so again.
        """
        found = _error_in(body)
        if found is not None:
            message, kind = found
            return MalformedResponseError(
                f"{self.name}: {self._url} answered HTTP {status} with an error instead of an event stream"
                f"{f' ({self._server_text(kind)})' if kind else ''}: {self._server_text(message)}"
            )
        # Redact before cutting, so that no piece of a key survives the cut.
        text = self._server_text(body.decode("utf-8", errors="replace").strip())
        return MalformedResponseError(
            f"{self.name}: {self._url} answered HTTP {status} with Content-Type "
            f"{excerpt(self._server_text(content_type))} instead of an event stream: "
            f"{excerpt(text) if text else 'an empty body'}. "
            "Check the base URL, and that the server streams chat responses."
        )

    def _server_text(self, text: str) -> str:
        """``text`` from the server, safe to put in an error message."""
        return redact(text, self._auth.secret())

    def _ended_early(self) -> ProviderConnectionError:
        return ProviderConnectionError(f"{self.name}: the stream from {self._url} ended before the model finished")

    # -- for subclasses ------------------------------------------------------

    def _headers(self) -> Mapping[str, str]:
        """Headers specific to the provider (the API key is added separately)."""
        return {}

    def _payload(self, request: ModelRequest, model: str) -> dict[str, object]:
        """The JSON body for ``request``."""
        raise NotImplementedError

    def _decoder(self) -> StreamDecoder:
        """A decoder for one response stream."""
        raise NotImplementedError
