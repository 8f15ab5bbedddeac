"""An OAuth-protected MCP server on loopback for the tests: authorization server and resource server in one.

Run as ``python oauth_server.py --port PORT [--expires-in SECONDS]``; it
serves on ``http://127.0.0.1:PORT``:

- the MCP endpoint ``/mcp``, written with the SDK's MCPServer and protected
  with the SDK's own resource-server pieces (``AuthSettings`` and a token
  verifier): HTTP 401 with ``WWW-Authenticate`` naming the protected
  resource metadata (RFC 9728), which the SDK serves too, requiring the
  scope ``mcp:tools``. Tools: ``whoami`` (the token's client and scopes),
  ``ask_name`` (elicits a name, see below);
- a hand-written authorization server (the SDK's has no client-credentials
  grant): RFC 8414 metadata, dynamic registration (RFC 7591),
  ``/authorize`` that approves at once and redirects with the code (as a
  pre-approved client's authorization server does; a client named
  ``needs a person`` gets a consent page instead), and ``/token`` for the
  PKCE authorization-code grant (S256 checked), refresh tokens and the
  client-credentials grant of the pre-registered client ``machine``
  (secret ``machine-secret-1234``, ``client_secret_basic``);
- ``GET /test/log``: ``{"events": [...], "requests": [...]}``, what the
  authorization server did and every request line the server saw, in order;
  ``POST /test/reset`` clears them (and every token and client).

Access tokens live ``--expires-in`` seconds (default 3600).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import secrets
import time
import urllib.parse
import warnings
from typing import Any

import uvicorn
from mcp import MCPDeprecationWarning
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

SCOPE = "mcp:tools"
MACHINE_ID = "machine"
MACHINE_SECRET = "machine-secret-1234"


class State:
    """Everything the authorization server knows; one process, one event loop."""

    def __init__(self, base: str, expires_in: int) -> None:
        self.base = base
        self.expires_in = expires_in
        self.reset()

    def reset(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.requests: list[str] = []
        self.clients: dict[str, dict[str, Any]] = {
            MACHINE_ID: {
                "client_id": MACHINE_ID,
                "client_secret": MACHINE_SECRET,
                "token_endpoint_auth_method": "client_secret_basic",
                "grant_types": ["client_credentials"],
            }
        }
        self.codes: dict[str, dict[str, Any]] = {}
        self.access: dict[str, dict[str, Any]] = {}
        self.refresh: dict[str, dict[str, Any]] = {}

    def issue(self, client_id: str, scopes: list[str]) -> dict[str, Any]:
        access = "at-" + secrets.token_urlsafe(24)
        refresh = "rt-" + secrets.token_urlsafe(24)
        self.access[access] = {"client_id": client_id, "scopes": scopes, "expires_at": time.time() + self.expires_in}
        self.refresh[refresh] = {"client_id": client_id, "scopes": scopes}
        return {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.expires_in,
            "refresh_token": refresh,
            "scope": " ".join(scopes),
        }


def _client_auth(request: Request, form: dict[str, str], state: State) -> dict[str, Any] | None:
    """The client a token request authenticates as (basic, post or none), or None."""
    header = request.headers.get("authorization", "")
    if header.startswith("Basic "):
        client_id, _, secret = base64.b64decode(header[6:]).decode().partition(":")
        client_id, secret = urllib.parse.unquote(client_id), urllib.parse.unquote(secret)
    else:
        client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
    client = state.clients.get(client_id)
    if client is None:
        return None
    expected = client.get("client_secret")
    if expected and not secrets.compare_digest(expected, secret):
        return None
    return client


def build(port: int, expires_in: int) -> Any:
    base = f"http://127.0.0.1:{port}"
    state = State(base, expires_in)

    class Verifier:
        async def verify_token(self, token: str) -> AccessToken | None:
            record = state.access.get(token)
            if record is None or record["expires_at"] < time.time():
                return None
            return AccessToken(
                token=token,
                client_id=record["client_id"],
                scopes=record["scopes"],
                expires_at=int(record["expires_at"]),
            )

    server = MCPServer(
        "oauth-protected",
        token_verifier=Verifier(),
        auth=AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}/mcp",
            required_scopes=[SCOPE],
            validate_token_resource=False,
        ),
    )

    @server.tool()
    def whoami(ctx: Context) -> str:
        """The client the request's token belongs to."""
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        return f"client {token.client_id if token else None} scopes {token.scopes if token else None}"

    class Name(BaseModel):
        name: str = Field(description="Your name")

    @server.tool()
    async def ask_name(ctx: Context) -> str:
        """Ask the user's name (elicitation) and greet them."""
        result = await ctx.elicit("What is your name?", Name)
        if result.action == "accept":
            return f"Hello {result.data.name}"
        return f"no name: {result.action}"

    def record(kind: str, **details: Any) -> None:
        state.log.append({"kind": kind, **details})

    @server.custom_route("/.well-known/oauth-authorization-server", methods=["GET"])
    async def metadata(request: Request) -> Response:
        record("as_metadata")
        return JSONResponse(
            {
                "issuer": base,
                "authorization_endpoint": f"{base}/authorize",
                "token_endpoint": f"{base}/token",
                "registration_endpoint": f"{base}/register",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
                "scopes_supported": [SCOPE],
            }
        )

    @server.custom_route("/register", methods=["POST"])
    async def register(request: Request) -> Response:
        body = await request.json()
        client_id = "dcr-" + secrets.token_urlsafe(8)
        method = body.get("token_endpoint_auth_method") or "client_secret_basic"
        client = {
            "client_id": client_id,
            "client_name": body.get("client_name"),
            "redirect_uris": body.get("redirect_uris") or [],
            "grant_types": body.get("grant_types") or ["authorization_code", "refresh_token"],
            "token_endpoint_auth_method": method,
        }
        if method != "none":
            client["client_secret"] = "cs-" + secrets.token_urlsafe(16)
        state.clients[client_id] = client
        record("register", client_id=client_id, client_name=client["client_name"], grant_types=client["grant_types"])
        return JSONResponse(client, status_code=201)

    @server.custom_route("/authorize", methods=["GET"])
    async def authorize(request: Request) -> Response:
        query = dict(request.query_params)
        client = state.clients.get(query.get("client_id", ""))
        record(
            "authorize",
            client_id=query.get("client_id"),
            scope=query.get("scope"),
            code_challenge_method=query.get("code_challenge_method"),
            has_code_challenge=bool(query.get("code_challenge")),
            resource=query.get("resource"),
        )
        redirect_uri = query.get("redirect_uri", "")
        if client is None or redirect_uri not in client.get("redirect_uris", []):
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        if client.get("client_name") == "needs a person":
            return HTMLResponse("<form>Allow this client?</form>")
        code = "code-" + secrets.token_urlsafe(12)
        state.codes[code] = {
            "client_id": client["client_id"],
            "redirect_uri": redirect_uri,
            "challenge": query.get("code_challenge"),
            "scopes": (query.get("scope") or SCOPE).split(),
        }
        params = {"code": code, "iss": base}
        if "state" in query:
            params["state"] = query["state"]
        return RedirectResponse(f"{redirect_uri}?{urllib.parse.urlencode(params)}", status_code=302)

    @server.custom_route("/token", methods=["POST"])
    async def token(request: Request) -> Response:
        form = {key: str(value) for key, value in (await request.form()).items()}
        grant = form.get("grant_type")
        client = _client_auth(request, form, state)
        if client is None:
            record("token", grant_type=grant, error="invalid_client")
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        if grant == "authorization_code":
            entry = state.codes.pop(form.get("code", ""), None)
            verifier = form.get("code_verifier", "")
            digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
            matches = entry is not None and entry["challenge"] == digest
            record("token", grant_type=grant, client_id=client["client_id"], pkce_ok=matches)
            if entry is None or not matches or entry["client_id"] != client["client_id"]:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            return JSONResponse(state.issue(client["client_id"], entry["scopes"]))
        if grant == "refresh_token":
            entry = state.refresh.pop(form.get("refresh_token", ""), None)
            record("token", grant_type=grant, client_id=client["client_id"], known=entry is not None)
            if entry is None or entry["client_id"] != client["client_id"]:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            return JSONResponse(state.issue(client["client_id"], entry["scopes"]))
        if grant == "client_credentials":
            record("token", grant_type=grant, client_id=client["client_id"], scope=form.get("scope"))
            if "client_credentials" not in client.get("grant_types", []):
                return JSONResponse({"error": "unauthorized_client"}, status_code=400)
            return JSONResponse(state.issue(client["client_id"], (form.get("scope") or SCOPE).split()))
        record("token", grant_type=grant, error="unsupported_grant_type")
        return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)

    @server.custom_route("/test/log", methods=["GET"])
    async def log(request: Request) -> Response:
        return JSONResponse({"events": state.log, "requests": state.requests})

    @server.custom_route("/test/reset", methods=["POST"])
    async def reset(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    app = server.streamable_http_app()

    async def logged(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/test/"):
            state.requests.append(f"{scope['method']} {scope['path']}")
        await app(scope, receive, send)

    return logged


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--expires-in", type=int, default=3600)
    args = parser.parse_args()
    uvicorn.run(build(args.port, args.expires_in), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
