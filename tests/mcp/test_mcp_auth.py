"""OAuth against a real authorization server and protected MCP server on loopback (``oauth_server.py``).

Discovery (protected-resource and authorization-server metadata), dynamic
registration, the PKCE authorization-code grant in headless and browser
mode, tokens kept in the store, reused and refreshed, the client-credentials
grant, and that no token ever shows in events, snapshots or logs.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from weald.runtime import REDACTED, ActorSystem, Store, redact_text
from weald.runtime.mcp import (
    MCPConfigError,
    MCPConnection,
    MCPElicitation,
    MCPElicitationResult,
    MCPStartError,
    OAuthConfig,
    ServerConfig,
    open_connection,
)
from weald.runtime.mcp._auth import AUTH_NAMESPACE, StoreTokenStorage
from weald.runtime.testing import wait_for_event, wait_until
from weald.tools import ToolRegistry

SERVER = Path(__file__).with_name("oauth_server.py")
SECRET_ENV = "WEALD_TEST_MACHINE_SECRET"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class OAuthServer:
    """The running ``oauth_server.py``: its URLs and what it saw."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/mcp"

    def log(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(f"{self.base}/test/log", timeout=5).json()
        return data

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.log()["events"] if event["kind"] == kind]

    def reset(self) -> None:
        httpx.post(f"{self.base}/test/reset", timeout=5).raise_for_status()


def _ready(server: OAuthServer) -> bool:
    try:
        return httpx.get(f"{server.base}/.well-known/oauth-authorization-server", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def running_server() -> Iterator[OAuthServer]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = OAuthServer(port)
    try:
        wait_until(lambda: _ready(server) or process.poll() is not None, timeout=20, interval=0.05)
        if process.poll() is not None:
            assert process.stderr is not None
            pytest.fail(f"oauth_server.py exited:\n{process.stderr.read()}", pytrace=False)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()


@pytest.fixture
def oauth(running_server: OAuthServer) -> OAuthServer:
    running_server.reset()
    return running_server


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "auth.db")
    yield store
    store.close()


def config(server: OAuthServer, **auth: Any) -> ServerConfig:
    return ServerConfig(
        name="oauth",
        url=server.url,
        connect_timeout=20.0,
        call_timeout=20.0,
        auth=OAuthConfig(**{"redirect_mode": "headless", **auth}),
    )


def whoami(cfg: ServerConfig, storage: Any = None) -> str:
    async def main() -> str:
        async with open_connection(cfg, auth_storage=storage) as session:
            return (await session.call_tool("whoami", {})).text

    return trio.run(main)


# -- the authorization-code grant ----------------------------------------------------------------


def test_a_401_leads_through_discovery_registration_and_pkce_to_a_token(
    oauth: OAuthServer, store: Store, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    answer = whoami(config(oauth, scopes=["extra:read"]), StoreTokenStorage(store, oauth.url))
    [registered] = oauth.events("register")
    assert answer.startswith(f"client {registered['client_id']} ")
    assert registered["grant_types"] == ["authorization_code", "refresh_token"]

    log = oauth.log()
    requests = log["requests"]
    # RFC 9728 from the WWW-Authenticate of the first 401, then RFC 8414.
    assert requests.index("GET /.well-known/oauth-protected-resource/mcp") < requests.index(
        "GET /.well-known/oauth-authorization-server"
    )
    [authorize] = oauth.events("authorize")
    assert authorize["has_code_challenge"]
    assert authorize["code_challenge_method"] == "S256"
    assert authorize["scope"].split() == ["mcp:tools", "extra:read"]  # the server's scope, then ours
    assert authorize["resource"] == oauth.url  # RFC 8707
    assert [(t["grant_type"], t["pkce_ok"]) for t in oauth.events("token")] == [("authorization_code", True)]

    record = store.get(AUTH_NAMESPACE, oauth.url)
    access, refresh = record["tokens"]["access_token"], record["tokens"]["refresh_token"]
    assert record["client"]["client_id"] == registered["client_id"]
    # Registered as secrets as soon as they arrived: cut from anything weald prints.
    assert redact_text(f"a {access} b {refresh}") == f"a {REDACTED} b {REDACTED}"
    assert access not in caplog.text
    assert refresh not in caplog.text


def test_stored_tokens_are_reused_and_refreshed_once_they_expire(oauth: OAuthServer, store: Store):
    storage = StoreTokenStorage(store, oauth.url)
    first = whoami(config(oauth), storage)
    assert len(oauth.events("authorize")) == 1

    assert whoami(config(oauth), storage) == first  # a new connection: the stored token, no new grant
    assert len(oauth.events("authorize")) == 1
    assert len(oauth.events("token")) == 1

    record = store.get(AUTH_NAMESPACE, oauth.url)
    old_access = record["tokens"]["access_token"]
    record["expires_at"] = time.time() - 1  # as if the daemon came back after the token expired
    store.put(AUTH_NAMESPACE, oauth.url, record)

    assert whoami(config(oauth), storage) == first
    assert len(oauth.events("authorize")) == 1  # nobody was sent through the authorization again
    assert [(t["grant_type"], t.get("known")) for t in oauth.events("token")][-1] == ("refresh_token", True)
    assert store.get(AUTH_NAMESPACE, oauth.url)["tokens"]["access_token"] != old_access


def test_headless_mode_says_so_when_the_authorization_server_wants_a_person(oauth: OAuthServer):
    with pytest.raises(MCPStartError, match=r"wants a person to approve\. Use redirect_mode = browser"):
        whoami(config(oauth, client_name="needs a person"))


def test_browser_mode_announces_the_url_and_registers_the_tools_once_a_person_authorized(
    system: ActorSystem, oauth: OAuthServer
):
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"
    cfg = config(oauth, redirect_mode="browser", redirect_uri=redirect_uri, authorization_timeout=30.0)
    registry = ToolRegistry()
    ref = system.spawn(MCPConnection, args=(cfg, registry), name="oauth")
    ref.started().get(timeout=30)  # starts at once: a person may take minutes

    required = wait_for_event(system.events, "mcp.auth_required")
    assert required.source == ref.path
    assert required.data["redirect_uri"] == redirect_uri
    assert ref.proxy().snapshot().get().status == "authorizing"
    assert registry.names() == []

    # The person: opens the URL; the authorization server sends the browser back to weald.
    page = httpx.get(required.data["url"], follow_redirects=True, timeout=20)
    assert page.status_code == 200
    assert "weald is authorized" in page.text

    wait_for_event(system.events, "mcp.connected")
    assert sorted(registry.names()) == ["mcp__oauth__ask_name", "mcp__oauth__whoami"]
    snapshot = ref.proxy().snapshot().get()
    assert snapshot.status == "running"

    # The tokens are in the store, and nowhere else.
    tokens = system.store.get(AUTH_NAMESPACE, oauth.url)["tokens"]
    secrets = [tokens["access_token"], tokens["refresh_token"]]
    events = [(e.topic, e.source, e.data) for e in system.events.recent(100000)]
    shown = json.dumps(events, default=str) + repr(snapshot)
    assert not [secret for secret in secrets if secret in shown]


# -- client credentials ---------------------------------------------------------------------------


def test_client_credentials_use_the_secret_in_the_named_environment_variable(
    oauth: OAuthServer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(SECRET_ENV, "machine-secret-1234")
    cfg = config(oauth, grant="client_credentials", client_id="machine", client_secret_env=SECRET_ENV)
    assert whoami(cfg) == "client machine scopes ['mcp:tools']"
    assert [t["grant_type"] for t in oauth.events("token")] == ["client_credentials"]
    assert not oauth.events("authorize")
    assert redact_text("machine-secret-1234") == REDACTED


def test_an_unset_secret_variable_is_a_config_error_naming_it(oauth: OAuthServer, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    cfg = config(oauth, grant="client_credentials", client_id="machine", client_secret_env=SECRET_ENV)
    with pytest.raises(MCPConfigError, match=f"names the environment variable {SECRET_ENV}, which is not set"):
        whoami(cfg)


def test_wrong_client_credentials_fail_the_start_with_the_servers_answer(
    oauth: OAuthServer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(SECRET_ENV, "not-the-secret")
    cfg = config(oauth, grant="client_credentials", client_id="machine", client_secret_env=SECRET_ENV)
    with pytest.raises(MCPStartError, match=r"authorization failed: .*invalid_client"):
        whoami(cfg)


# -- elicitation over HTTP ----------------------------------------------------------------------


def test_over_http_each_calls_elicitation_goes_to_its_own_handler(oauth: OAuthServer):
    # Streamable HTTP sends a call's server requests on that call's stream: no guessing.
    def answering(name: str) -> Any:
        async def handler(request: MCPElicitation) -> MCPElicitationResult:
            return MCPElicitationResult("accept", {"name": name})

        return handler

    async def main() -> tuple[dict[str, str], int]:
        async with open_connection(config(oauth)) as session:
            results: dict[str, str] = {}

            async def call(name: str) -> None:
                results[name] = (await session.call_tool("ask_name", {}, on_elicitation=answering(name))).text

            async with trio.open_nursery() as nursery:
                for name in ("Ada", "Bob", "Cy"):
                    nursery.start_soon(call, name)
            return results, session.statistics().elicitations_unrouted

    results, unrouted = trio.run(main)
    assert results == {"Ada": "Hello Ada", "Bob": "Hello Bob", "Cy": "Hello Cy"}
    assert unrouted == 0
