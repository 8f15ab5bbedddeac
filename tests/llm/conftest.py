from __future__ import annotations

import pytest
import trio

from ._server import FakeServer

# The API key the tests put in the environment; it must never leak.
SECRET_KEY = "sk-test-SECRET-0123456789abcdef"
KEY_ENV = "WEALD_TEST_LLM_KEY"


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeServer:
    """A fresh loopback server; it stops with the test's nursery."""
    fake = FakeServer()
    await nursery.start(fake.serve)
    return fake


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET_KEY)
    return SECRET_KEY
