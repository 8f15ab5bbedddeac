"""OAuth for Streamable HTTP MCP servers: the MCP authorization spec, through the SDK's client.

The SDK's ``mcp.client.auth`` does the protocol: on HTTP 401 (or 403
``insufficient_scope``) it discovers the protected-resource metadata
(RFC 9728, from ``WWW-Authenticate`` or the well-known paths) and the
authorization server's metadata (RFC 8414 / OpenID), picks the scopes
(``WWW-Authenticate``, then ``scopes_supported``, with step-up unions),
registers the client (a client ID metadata document when the server supports
one and ``client_metadata_url`` is set, else dynamic registration, unless the
client is pre-registered), runs the PKCE authorization-code grant or the
client-credentials grant, and refreshes tokens. This module adds what weald
needs around it:

- `OAuthConfig` (in ``_config``): the ``[mcp.servers.NAME.auth]`` table;
- token storage: `StoreTokenStorage` (the persistent store, namespace
  ``mcp_auth``, keyed by server URL) and `MemoryTokenStorage`; every token
  and client secret they hold is registered with `register_secret`, so it
  is cut from every event, snapshot and log;
- the authorization code's way back (``redirect_mode``): ``browser``
  listens on the loopback ``redirect_uri`` and announces the authorization
  URL for a person to open; ``headless`` requests the authorization URL
  itself and takes the code from the authorization server's redirect, for
  servers that approve without a person (pre-approved clients, test servers,
  the conformance suite).
"""

from __future__ import annotations

import contextlib
import logging
import time
import urllib.parse
import warnings
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Final

import httpx2
import trio
from mcp.client.auth import OAuthClientProvider, OAuthFlowError, TokenStorage
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.utils import union_scopes
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import AnyUrl, ValidationError
from weald.runtime import Store, register_secret

from ._config import OAuthConfig

__all__ = ["AUTH_NAMESPACE", "MemoryTokenStorage", "StoreTokenStorage", "build_oauth"]

logger = logging.getLogger("weald.runtime.mcp")

#: The store namespace holding each server's tokens and client registration.
AUTH_NAMESPACE: Final = "mcp_auth"
# Redirects a headless authorization follows inside the authorization server.
MAX_HEADLESS_REDIRECTS: Final = 10
# Bounds of the loopback callback: one request's head, and the time to read it.
CALLBACK_MAX_HEAD: Final = 16 * 1024
CALLBACK_READ_TIMEOUT: Final = 10.0
HEADLESS_TIMEOUT: Final = httpx2.Timeout(30.0)

# -- token storage -------------------------------------------------------------------------------


def _register_token(tokens: OAuthToken | None) -> None:
    if tokens is not None:
        register_secret(tokens.access_token)
        if tokens.refresh_token:
            register_secret(tokens.refresh_token)


def _register_client(info: OAuthClientInformationFull | None) -> None:
    if info is not None and info.client_secret:
        register_secret(info.client_secret)


def _expiry(tokens: OAuthToken) -> float | None:
    return time.time() + tokens.expires_in if tokens.expires_in is not None else None


class MemoryTokenStorage:
    """Tokens and the client registration for one server, for this process only.

    For `open_connection` used on its own (the conformance client, scripts);
    the daemon keeps them in the store (`StoreTokenStorage`).
    """

    def __init__(self) -> None:
        self._tokens: OAuthToken | None = None
        self._expires_at: float | None = None
        self._client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        """The tokens, if any."""
        return self._tokens

    async def token_expiry(self) -> float | None:
        """When the access token expires (Unix time), if known."""
        return self._expires_at

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Keep new tokens."""
        _register_token(tokens)
        self._tokens = tokens
        self._expires_at = _expiry(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        """The client registration, if any."""
        return self._client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Keep a new client registration."""
        _register_client(client_info)
        self._client = client_info


class StoreTokenStorage:
    """One server's tokens and client registration in weald's persistent store.

    The record lives in namespace `AUTH_NAMESPACE` under the server's URL, so
    a restarted connection or daemon reuses (and refreshes) its tokens
    instead of asking a person again. Values are read back through the SDK's
    models; every secret in them is registered with `register_secret` as it
    is read or written, so it never appears in events, snapshots or logs.
    Reads and writes run in a worker thread (the store is SQLite).
    """

    def __init__(self, store: Store, server_url: str) -> None:
        self._store = store
        self._key = server_url

    async def _record(self) -> dict[str, Any]:
        record = await trio.to_thread.run_sync(self._store.get, AUTH_NAMESPACE, self._key, None)
        return dict(record) if isinstance(record, Mapping) else {}

    async def _update(self, **fields: Any) -> None:
        record = await self._record()
        record.update(fields)
        await trio.to_thread.run_sync(self._store.put, AUTH_NAMESPACE, self._key, record)

    async def get_tokens(self) -> OAuthToken | None:
        """The stored tokens, or None if there are none or they are unreadable."""
        data = (await self._record()).get("tokens")
        if data is None:
            return None
        try:
            tokens = OAuthToken.model_validate(data)
        except ValidationError:
            logger.warning("stored MCP tokens for %s are unreadable; authorizing afresh", self._key)
            return None
        _register_token(tokens)
        return tokens

    async def token_expiry(self) -> float | None:
        """When the stored access token expires (Unix time), if known: a reloaded token is refreshed in time."""
        expires_at = (await self._record()).get("expires_at")
        return float(expires_at) if isinstance(expires_at, int | float) else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Store new tokens (after a grant or a refresh)."""
        _register_token(tokens)
        await self._update(tokens=tokens.model_dump(mode="json", exclude_none=True), expires_at=_expiry(tokens))

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        """The stored client registration, or None."""
        data = (await self._record()).get("client")
        if data is None:
            return None
        try:
            info = OAuthClientInformationFull.model_validate(data)
        except ValidationError:
            logger.warning("the stored MCP client registration for %s is unreadable; registering afresh", self._key)
            return None
        _register_client(info)
        return info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Store a new client registration; tokens of an earlier client are dropped."""
        _register_client(client_info)
        record = await self._record()
        previous = record.get("client")
        if not isinstance(previous, Mapping) or previous.get("client_id") != client_info.client_id:
            record.pop("tokens", None)
        record["client"] = client_info.model_dump(mode="json", exclude_none=True)
        await trio.to_thread.run_sync(self._store.put, AUTH_NAMESPACE, self._key, record)


class _ConfiguredClient:
    """Storage that presents a pre-registered client, and only the tokens issued to it."""

    def __init__(self, inner: TokenStorage, client: OAuthClientInformationFull) -> None:
        self._inner = inner
        self._client = client

    async def get_tokens(self) -> OAuthToken | None:
        stored = await self._inner.get_client_info()
        if stored is None or stored.client_id != self._client.client_id:
            return None  # issued to another client (the config changed)
        return await self._inner.get_tokens()

    async def set_tokens(self, tokens: OAuthToken) -> None:
        stored = await self._inner.get_client_info()
        if stored is None or stored.client_id != self._client.client_id:
            # Which client the tokens belong to; its secret stays in the environment.
            await self._inner.set_client_info(self._client.model_copy(update={"client_secret": None}))
        await self._inner.set_tokens(tokens)

    async def token_expiry(self) -> float | None:
        expiry = getattr(self._inner, "token_expiry", None)
        return await expiry() if expiry is not None else None

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self._client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        await self._inner.set_client_info(client_info)


# -- the authorization code's way back -------------------------------------------------------------

AuthorizationAnnouncer = Callable[[str], None]
PersonWait = Callable[[], AbstractContextManager[None]]


def _same_endpoint(url: str, redirect_uri: str) -> bool:
    a, b = urllib.parse.urlsplit(url), urllib.parse.urlsplit(redirect_uri)
    default = {"http": 80, "https": 443}
    try:
        ports = (a.port or default.get(a.scheme), b.port or default.get(b.scheme))
    except ValueError:
        return False
    return (
        a.scheme == b.scheme
        and (a.hostname or "") == (b.hostname or "")
        and ports[0] == ports[1]
        and (a.path or "/") == (b.path or "/")
    )


def _code_from(query: str) -> AuthorizationCodeResult:
    params = urllib.parse.parse_qs(query)
    if "error" in params:
        description = params.get("error_description", [""])[0]
        raise OAuthFlowError(
            f"the authorization server refused: {params['error'][0]}" + (f" ({description})" if description else "")
        )
    if "code" not in params:
        raise OAuthFlowError("the authorization server's redirect carries no code")
    return AuthorizationCodeResult(
        code=params["code"][0],
        state=params.get("state", [None])[0],
        iss=params.get("iss", [None])[0],
    )


async def _follow_headless(authorization_url: str, redirect_uri: str) -> AuthorizationCodeResult:
    """Request the authorization URL and follow the server's redirects until one leads to ``redirect_uri``."""
    async with httpx2.AsyncClient(timeout=HEADLESS_TIMEOUT, follow_redirects=False) as http:
        url = authorization_url
        for _ in range(MAX_HEADLESS_REDIRECTS):
            response = await http.get(url)
            location = response.headers.get("location")
            if not (response.is_redirect and location):
                raise OAuthFlowError(
                    f"the authorization endpoint answered HTTP {response.status_code} instead of redirecting to "
                    f"{redirect_uri}: it wants a person to approve. Use redirect_mode = browser for this server"
                )
            target = urllib.parse.urljoin(str(response.url), location)
            if _same_endpoint(target, redirect_uri):
                return _code_from(urllib.parse.urlsplit(target).query)
            url = target
    raise OAuthFlowError(f"the authorization server redirected more than {MAX_HEADLESS_REDIRECTS} times")


_PAGE = "<!doctype html><meta charset=utf-8><title>weald</title><p>{text}</p><p>You can close this window.</p>"
# One listener per loopback port at a time: two servers sharing a redirect_uri
# authorize one after the other.
_port_locks: dict[tuple[str, int], trio.Lock] = {}


async def _respond(stream: trio.abc.Stream, status: str, text: str) -> None:
    body = _PAGE.format(text=text).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)


async def _read_head(stream: trio.abc.Stream) -> bytes | None:
    data = b""
    with trio.move_on_after(CALLBACK_READ_TIMEOUT):
        while b"\r\n\r\n" not in data and len(data) < CALLBACK_MAX_HEAD:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return None
            data += chunk
        return data
    return None


async def _wait_callback(listeners: list[trio.SocketListener], path: str) -> AuthorizationCodeResult:
    """Serve the loopback redirect until the authorization server's callback arrives."""
    outcome: list[AuthorizationCodeResult | OAuthFlowError] = []
    arrived = trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        # A browser's stray request (favicon, a reload) must not end the wait.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError):
            async with stream:
                head = await _read_head(stream)
                if head is None:
                    return
                method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
                parts = urllib.parse.urlsplit(target)
                query = urllib.parse.parse_qs(parts.query)
                if method != "GET" or parts.path != path or not ("code" in query or "error" in query):
                    await _respond(stream, "404 Not Found", "Nothing here.")
                    return
                try:
                    result: AuthorizationCodeResult | OAuthFlowError = _code_from(parts.query)
                except OAuthFlowError as exc:
                    result = exc
                    await _respond(stream, "400 Bad Request", "The authorization was refused.")
                else:
                    await _respond(stream, "200 OK", "weald is authorized.")
                if not arrived.is_set():
                    outcome.append(result)
                    arrived.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        await arrived.wait()
        nursery.cancel_scope.cancel()
    result = outcome[0]
    if isinstance(result, OAuthFlowError):
        raise result
    return result


class _Authorizer:
    """The SDK's redirect and callback handlers: gets the authorization code one way or the other."""

    def __init__(self, config: OAuthConfig, server: str, announce: AuthorizationAnnouncer, wait: PersonWait) -> None:
        self._config = config
        self._server = server
        self._announce = announce
        self._wait = wait
        self._result: AuthorizationCodeResult | None = None

    async def redirect(self, authorization_url: str) -> None:
        """Get the code for ``authorization_url``; runs in the request's task that met the 401."""
        self._result = None
        if self._config.redirect_mode == "headless":
            self._result = await _follow_headless(authorization_url, self._config.redirect_uri)
        else:
            self._result = await self._through_browser(authorization_url)

    async def callback(self) -> AuthorizationCodeResult:
        """The code `redirect` got."""
        result, self._result = self._result, None
        if result is None:
            raise OAuthFlowError("no authorization code was received")
        return result

    async def _through_browser(self, authorization_url: str) -> AuthorizationCodeResult:
        parts = urllib.parse.urlsplit(self._config.redirect_uri)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        lock = _port_locks.setdefault((host, port), trio.Lock())
        async with lock:
            try:
                listeners = await trio.open_tcp_listeners(port, host=host)
            except OSError as exc:
                raise OAuthFlowError(
                    f"cannot listen on {host}:{port} for the authorization code ({exc.strerror or exc}); "
                    "give this server another redirect_uri port"
                ) from exc
            timeout = self._config.authorization_timeout
            try:
                # Listening before announcing: the browser cannot come back too early.
                self._announce(authorization_url)
                with self._wait(), trio.move_on_after(timeout):
                    return await _wait_callback(listeners, parts.path or "/")
            finally:
                for listener in listeners:
                    await listener.aclose()
        raise OAuthFlowError(f"nobody completed the authorization of MCP server {self._server!r} within {timeout:g} s")


# -- the providers ----------------------------------------------------------------------------------

AuthErrorRecorder = Callable[[Exception], None]


class _WealdFlow:
    """What weald adds to each SDK provider.

    Configured scopes on top of the server's; the expiry of stored tokens,
    which the SDK does not reload (so a token reloaded after a restart is
    refreshed when it expires instead of failing with 401 and sending a
    person through the authorization again); and the last error, kept for
    start errors.
    """

    _weald_scopes: str | None
    _weald_on_error: AuthErrorRecorder
    context: Any

    async def _initialize(self) -> None:
        await super()._initialize()  # type: ignore[misc]
        expiry = getattr(self.context.storage, "token_expiry", None)
        if self.context.current_tokens is not None and expiry is not None:
            self.context.token_expiry_time = await expiry()

    async def _perform_authorization(self) -> httpx2.Request:
        # The SDK has just chosen the scopes the server asked for; add ours.
        self.context.client_metadata.scope = union_scopes(self.context.client_metadata.scope, self._weald_scopes)
        request: httpx2.Request = await super()._perform_authorization()  # type: ignore[misc]
        return request

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        flow = super().async_auth_flow(request)  # type: ignore[misc]
        try:
            outgoing = await flow.__anext__()
            while True:
                response = yield outgoing
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        except Exception as exc:
            self._weald_on_error(exc)
            raise
        finally:
            await flow.aclose()


class _AuthorizationCodeProvider(_WealdFlow, OAuthClientProvider):
    pass


class _ClientCredentialsProvider(_WealdFlow, ClientCredentialsOAuthProvider):
    pass


class _PrivateKeyJWTProvider(_WealdFlow, PrivateKeyJWTOAuthProvider):
    pass


def build_oauth(
    config: OAuthConfig,
    *,
    server: str,
    server_url: str,
    storage: TokenStorage,
    announce: AuthorizationAnnouncer,
    wait: PersonWait,
    on_error: AuthErrorRecorder,
) -> httpx2.Auth:
    """The ``httpx2.Auth`` that authorizes every request to ``server_url``.

    Args:
        config: The server's ``auth`` table.
        server: The server's configured name (for messages).
        server_url: The MCP endpoint.
        storage: Where tokens and the client registration live.
        announce: Called with the authorization URL a person must open
            (``browser`` mode), once weald listens for the code.
        wait: A context manager held while waiting for that person, so the
            start-up deadline does not run meanwhile.
        on_error: Called with whatever ends an authorization flow in an
            error, before it propagates (the SDK's transport loses the reason).

    Raises:
        MCPConfigError: An environment variable the config names is not set.
    """
    scopes = " ".join(config.scopes) or None
    provider: _WealdFlow
    if config.grant == "client_credentials":
        assert config.client_id is not None  # OAuthConfig.problems
        with warnings.catch_warnings():
            # Omitting issuer is deprecated by the SDK (it warns); weald documents
            # the choice in the config instead.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            key = config.read_env("private_key_env", server)
            if key is not None:
                signer = SignedJWTParameters(
                    issuer=config.client_id,
                    subject=config.client_id,
                    signing_key=key,
                    signing_algorithm=config.signing_algorithm,
                )
                provider = _PrivateKeyJWTProvider(
                    server_url,
                    storage,
                    config.client_id,
                    signer.create_assertion_provider(),
                    scope=scopes,
                    issuer=config.issuer,
                )
            else:
                secret = config.read_env("client_secret_env", server)
                assert secret is not None  # OAuthConfig.problems
                method = config.token_auth_method()
                assert method != "none"
                provider = _ClientCredentialsProvider(
                    server_url,
                    storage,
                    config.client_id,
                    secret,
                    token_endpoint_auth_method=method,
                    scope=scopes,
                    issuer=config.issuer,
                )
    else:
        authorizer = _Authorizer(config, server, announce, wait)
        redirect_uris = [AnyUrl(config.redirect_uri)]
        if config.client_id is not None:
            storage = _ConfiguredClient(
                storage,
                OAuthClientInformationFull(
                    client_id=config.client_id,
                    client_secret=config.read_env("client_secret_env", server),
                    redirect_uris=redirect_uris,
                    token_endpoint_auth_method=config.token_auth_method(),
                    grant_types=["authorization_code", "refresh_token"],
                    client_name=config.client_name,
                ),
            )
        provider = _AuthorizationCodeProvider(
            server_url,
            OAuthClientMetadata(
                client_name=config.client_name,
                redirect_uris=redirect_uris,
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
            ),
            storage,
            redirect_handler=authorizer.redirect,
            callback_handler=authorizer.callback,
            client_metadata_url=config.client_metadata_url,
        )
    provider._weald_scopes = scopes
    provider._weald_on_error = on_error
    assert isinstance(provider, httpx2.Auth)
    return provider
