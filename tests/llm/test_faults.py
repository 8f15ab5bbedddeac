"""The fault hook on the HTTP providers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from weald.runtime.llm import (
    Completed,
    Fault,
    FaultPoint,
    HTTPErrorFault,
    MalformedResponseError,
    MalformedStreamFault,
    Message,
    ModelRequest,
    OpenAIProvider,
    ProviderSettings,
    StallTimeout,
    TimeoutFault,
)

from ._server import FakeServer, Reply, collect
from .conftest import KEY_ENV
from .test_openai import text_stream

pytestmark = [pytest.mark.trio, pytest.mark.timeout(20)]


@pytest.fixture
async def providers() -> AsyncIterator[list[OpenAIProvider]]:
    created: list[OpenAIProvider] = []
    yield created
    for prov in created:
        await prov.aclose()


def provider(
    server: FakeServer, created: list[OpenAIProvider], faults: list[Fault | None], **settings: object
) -> OpenAIProvider:
    points: list[FaultPoint] = []

    def hook(point: FaultPoint) -> Fault | None:
        points.append(point)
        return faults.pop(0) if faults else None

    defaults: dict[str, object] = {
        "base_url": server.url + "/v1",
        "api_key_env": KEY_ENV,
        "backoff_base": 0.01,
        "backoff_cap": 0.05,
    }
    defaults.update(settings)
    prov = OpenAIProvider("gpt-4.1", ProviderSettings(**defaults), faults=hook)  # type: ignore[arg-type]
    prov.points = points  # type: ignore[attr-defined]
    created.append(prov)
    return prov


def hello() -> ModelRequest:
    return ModelRequest(model="", messages=[Message(role="user", content="Hi")])


async def test_an_injected_http_error_is_retried_like_a_real_one(
    providers: list[OpenAIProvider], server: FakeServer, api_key: str
) -> None:
    server.replies.append(Reply(body=text_stream("ok")))
    prov = provider(server, providers, [HTTPErrorFault(500), HTTPErrorFault(429, retry_after=0.0)])
    events = await collect(prov, hello())

    assert isinstance(events[-1], Completed)
    assert len(server.requests) == 1  # the faults stood in for two requests
    assert [p.attempt for p in prov.points] == [0, 1, 2]  # type: ignore[attr-defined]
    assert prov.points[0] == FaultPoint(provider="openai", model="gpt-4.1", attempt=0)  # type: ignore[attr-defined]


async def test_an_injected_malformed_stream_fails_the_call(
    providers: list[OpenAIProvider], server: FakeServer, api_key: str
) -> None:
    server.replies.append(Reply(body=text_stream("ok")))
    with pytest.raises(MalformedResponseError, match="injected"):
        await collect(provider(server, providers, [MalformedStreamFault()]), hello())


async def test_an_injected_timeout_is_a_stall(
    providers: list[OpenAIProvider], server: FakeServer, api_key: str
) -> None:
    server.replies.append(Reply(body=text_stream("ok")))
    with pytest.raises(StallTimeout):
        await collect(provider(server, providers, [TimeoutFault()], stall_timeout=0.2), hello())
