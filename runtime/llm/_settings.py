"""Connection settings shared by the HTTP providers."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["ProviderSettings"]


def _to_headers(value: Mapping[str, str]) -> dict[str, str]:
    return dict(value)


def _header_names(value: dict[str, str]) -> str:
    # Header values may hold credentials, so the repr shows names only.
    return repr(dict.fromkeys(value, "..."))


@attrs.frozen(kw_only=True)
class ProviderSettings:
    """How a provider reaches its server; every field has a sensible default.

    The API key itself is never stored: ``api_key_env`` names the environment
    variable that holds it, and the provider reads the variable each time it
    sends a request, so a rotated key is picked up without a restart and the
    key appears in no repr, message or log.

    Attributes:
        base_url: The API root, e.g. ``"http://127.0.0.1:11434/v1"`` for
            Ollama. None means the provider's public endpoint
            (``https://api.openai.com/v1``, ``https://api.anthropic.com``).
        api_key_env: The name of the environment variable holding the key.
            None means the provider's usual one (``OPENAI_API_KEY``,
            ``ANTHROPIC_API_KEY``).
        api_key_required: Whether a missing key is an error. Set it to False
            for local servers that need none (Ollama, llama.cpp, vLLM): then
            the key is sent only if the variable is set.
        extra_headers: Headers added to every request (their values are
            hidden in the repr).
        timeout: Seconds to wait for the server to start answering (the
            response headers), and for each write.
        connect_timeout: Seconds to wait for a connection.
        stall_timeout: Seconds the response stream may stay silent before
            the call fails with ``StallTimeout``.
        max_retries: How many times to retry a retryable failure (429,
            500-599, connection errors, timeouts) before the first stream
            event; 0 disables retries.
        backoff_base: Seconds before the first retry; doubles each time.
        backoff_cap: The longest wait between retries, before jitter.
        max_retry_after: The longest ``Retry-After`` we honour, in seconds.
            A server asking for more gets its error raised at once instead,
            since waiting less than it asks would only fail again.
        context_window: The model's context window in tokens; None: from
            the table of common models (``weald.runtime.llm.model_limits``).
            The scripted provider refuses a request larger than it, as a
            real server would.
        output_reserve: Tokens of the window kept free for the answer;
            None: a quarter of the window, at most 16,384.
    """

    base_url: str | None = None
    api_key_env: str | None = None
    api_key_required: bool = True
    extra_headers: dict[str, str] = attrs.field(factory=dict, converter=_to_headers, repr=_header_names, hash=False)
    timeout: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    connect_timeout: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    stall_timeout: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    max_retries: int = attrs.field(default=4, validator=attrs.validators.ge(0))
    backoff_base: float = attrs.field(default=0.5, validator=attrs.validators.ge(0))
    backoff_cap: float = attrs.field(default=8.0, validator=attrs.validators.ge(0))
    max_retry_after: float = attrs.field(default=60.0, validator=attrs.validators.ge(0))
    context_window: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.gt(0)))
    output_reserve: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(0)))
