"""The transport failures the HTTP providers share, against real sockets.

Each test checks the message a person would read and whether the call was
retried: connection failures are, until the first event has been yielded;
configuration mistakes never are. Attempts are counted with the fault hook,
which the provider consults before every request, so that even a refused
connection, which no server sees, is counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from weald.runtime.llm import (
    Completed,
    ConfigurationError,
    FaultPoint,
    Message,
    ModelRequest,
    OpenAIProvider,
    ProviderConnectionError,
    ProviderSettings,
    ProviderTimeout,
    StreamEvent,
    TextDelta,
)

from ._server import FakeServer, Reply, closed_port, collect, sse, unanswered_listener
from .conftest import KEY_ENV
from .test_openai import chunk, text_stream

pytestmark = [pytest.mark.trio, pytest.mark.timeout(20)]

MODEL = "gpt-4.1"


class Attempts:
    """A fault hook that injects nothing and records every attempt."""

    def __init__(self) -> None:
        self.points: list[FaultPoint] = []

    def __call__(self, point: FaultPoint, /) -> None:
        self.points.append(point)

    def __len__(self) -> int:
        return len(self.points)


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., tuple[OpenAIProvider, Attempts]]]:
    """Build providers for ``base_url`` with fast backoff; close them afterwards."""
    created: list[OpenAIProvider] = []

    def build(base_url: str, **settings: object) -> tuple[OpenAIProvider, Attempts]:
        defaults: dict[str, object] = {
            "base_url": base_url,
            "api_key_env": KEY_ENV,
            "backoff_base": 0.01,
            "backoff_cap": 0.05,
            "timeout": 5.0,
            "stall_timeout": 5.0,
        }
        defaults.update(settings)
        attempts = Attempts()
        created.append(OpenAIProvider(MODEL, ProviderSettings(**defaults), faults=attempts))  # type: ignore[arg-type]
        return created[-1], attempts

    yield build
    for provider in created:
        await provider.aclose()


Make = Callable[..., tuple[OpenAIProvider, Attempts]]


def hello() -> ModelRequest:
    return ModelRequest(model="", messages=[Message(role="user", content="Hi")])


async def collect_into(provider: OpenAIProvider, received: list[StreamEvent]) -> None:
    """Run one model call, keeping each event in ``received`` as it comes."""
    async with contextlib.aclosing(provider.stream(hello())) as events:
        async for event in events:
            received.append(event)


def notes(exc: BaseException) -> list[str]:
    return list(getattr(exc, "__notes__", []))


async def test_a_refused_connection_says_it_cannot_reach_the_url_after_retrying(make: Make, api_key: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    provider, attempts = make(url, max_retries=2)
    with pytest.raises(ProviderConnectionError) as info:
        await collect(provider, hello())

    assert str(info.value).startswith(f"openai: cannot reach {url}/chat/completions: ConnectError: ")
    assert len(attempts) == 3
    assert notes(info.value) == ["openai: gave up after 3 attempts"]


async def test_a_connect_that_never_completes_times_out_connecting_after_retrying(make: Make, api_key: str) -> None:
    with unanswered_listener() as port:
        url = f"http://127.0.0.1:{port}/v1"
        provider, attempts = make(url, connect_timeout=0.3, max_retries=1)
        with pytest.raises(ProviderTimeout) as info:
            await collect(provider, hello())

    assert str(info.value) == f"openai: timed out connecting to {url}/chat/completions (ConnectTimeout)"
    assert len(attempts) == 2
    assert notes(info.value) == ["openai: gave up after 2 attempts"]


async def test_a_connection_broken_after_the_first_event_is_raised_without_retrying(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies += [Reply(body=[sse(chunk({"content": "par"}))], cut=True), Reply(body=text_stream("again"))]
    provider, attempts = make(server.url + "/v1", max_retries=3)
    received: list[StreamEvent] = []
    with pytest.raises(ProviderConnectionError) as info:
        await collect_into(provider, received)

    assert received == [TextDelta("par")]
    assert str(info.value).startswith(
        f"the connection to openai at {server.url}/v1/chat/completions broke mid-stream: RemoteProtocolError: "
    )
    assert len(server.requests) == 1
    assert len(attempts) == 1
    assert notes(info.value) == []


async def test_a_connection_broken_before_the_first_event_is_retried(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies += [Reply(body=[b'data: {"cho'], cut=True), Reply(body=text_stream("again"))]
    provider, attempts = make(server.url + "/v1")
    events = await collect(provider, hello())

    assert isinstance(events[-1], Completed)
    assert events[-1].message.content == "again"
    assert len(server.requests) == 2
    assert len(attempts) == 2


async def test_connections_that_keep_breaking_mid_stream_give_up_with_that_message(
    make: Make, server: FakeServer, api_key: str
) -> None:
    server.replies += [Reply(body=[b": keep-alive\n\n"], cut=True) for _ in range(2)]
    provider, _ = make(server.url + "/v1", max_retries=1)
    with pytest.raises(ProviderConnectionError, match="broke mid-stream: RemoteProtocolError") as info:
        await collect(provider, hello())

    assert len(server.requests) == 2
    assert notes(info.value) == ["openai: gave up after 2 attempts"]


async def test_a_base_url_that_is_not_http_is_an_unsupported_url_and_is_not_retried(make: Make, api_key: str) -> None:
    provider, attempts = make("ftp://127.0.0.1/v1")
    with pytest.raises(ConfigurationError) as info:
        await collect(provider, hello())

    assert str(info.value) == (
        "openai: unsupported URL 'ftp://127.0.0.1/v1/chat/completions'; "
        "the base URL must start with http:// or https://"
    )
    assert len(attempts) == 1
    assert notes(info.value) == []


async def test_a_base_url_that_does_not_parse_is_an_invalid_base_url_and_is_not_retried(
    make: Make, api_key: str
) -> None:
    provider, attempts = make("http://[::1/v1")
    with pytest.raises(ConfigurationError) as info:
        await collect(provider, hello())

    assert str(info.value).startswith("openai: invalid base URL 'http://[::1/v1/chat/completions': ")
    assert len(attempts) == 1
    assert notes(info.value) == []
