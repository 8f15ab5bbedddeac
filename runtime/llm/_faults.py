"""The fault hook: a seam for injecting provider failures.

Every provider has a ``faults`` attribute, None by default. When set, it is a
:class:`FaultHook`: a callable the provider consults before each HTTP request
(each attempt, retries included; for the scripted provider, before each model
call) with a :class:`FaultPoint` describing the attempt. It returns None to
let the attempt go ahead, or one instruction that the provider acts on as if
the server had done it:

- :class:`HTTPErrorFault` -- the server answers with ``status`` (and an
  optional ``Retry-After``); the provider maps and retries it exactly as a
  real one. No request is sent.
- :class:`TimeoutFault` -- the server accepts the request and then goes
  silent: the call fails with ``StallTimeout`` after ``stall_timeout``
  seconds (the wait is an ordinary cancellable sleep).
- :class:`MalformedStreamFault` -- the server's first stream event is not
  valid JSON: the call fails with ``MalformedResponseError``.

The hook runs on the task that iterates the stream and must not block.
The scripted provider never retries, so there an injected fault reaches the
caller at once, as the error an HTTP provider would raise once its retries
were spent.
"""

from __future__ import annotations

from typing import Protocol

import attrs

__all__ = [
    "Fault",
    "FaultHook",
    "FaultPoint",
    "HTTPErrorFault",
    "MalformedStreamFault",
    "TimeoutFault",
]


@attrs.frozen
class FaultPoint:
    """Where a provider is about to send a request.

    Attributes:
        provider: The provider's kind (``"openai"``, ...).
        model: The model being called.
        attempt: 0 for the first attempt of a model call, 1 for the first retry, ...
    """

    provider: str
    model: str
    attempt: int


@attrs.frozen
class HTTPErrorFault:
    """Act as if the server answered with HTTP ``status``.

    Attributes:
        status: The status code, e.g. 429 or 500.
        retry_after: A ``Retry-After`` value in seconds to go with it, if any.
        message: The error message the server would have sent.
    """

    status: int
    retry_after: float | None = None
    message: str = "injected fault"


@attrs.frozen
class TimeoutFault:
    """Act as if the server went silent after accepting the request."""


@attrs.frozen
class MalformedStreamFault:
    """Act as if the server sent a stream event that is not valid JSON."""


Fault = HTTPErrorFault | TimeoutFault | MalformedStreamFault


class FaultHook(Protocol):
    """Decides, before each request, whether to inject a fault."""

    def __call__(self, point: FaultPoint, /) -> Fault | None:
        """Return the fault to inject at ``point``, or None for none."""
        ...
