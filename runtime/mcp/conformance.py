"""Client under test for the official MCP conformance suite.

Run by ``@modelcontextprotocol/conformance client --command "python -m
weald.runtime.mcp.conformance"``: the suite starts a scenario's server,
appends its URL as the last argument, names the scenario in the
``MCP_CONFORMANCE_SCENARIO`` environment variable and, for some, passes
credentials as JSON in ``MCP_CONFORMANCE_CONTEXT``. This client connects with
`open_connection` (Streamable HTTP), which runs the initialize handshake and
tools/list, and then does what the scenario asks:

- ``tools_call``: call ``add_numbers`` with two numbers.
- ``sse-retry``: call ``test_reconnection`` (the server drops the SSE stream
  and the SDK's transport must reconnect as the ``retry`` field says).
- anything else: call every listed tool with empty arguments. An
  elicitation during a call gets weald's answer when nobody can be asked
  (SEP-1034: the schema's defaults).

``auth/*`` scenarios connect with ``auth`` configured as a user would:

- ``auth/client-credentials-*``: ``grant = "client_credentials"`` with the
  context's ``client_id`` and its secret (``client_secret_env``) or private
  key (``private_key_env``), put in this process's environment;
- any other: the authorization-code grant in ``redirect_mode = "headless"``
  (the suite's authorization server approves at once and redirects),
  ``client_metadata_url`` set to the suite's test document (used where the
  server supports client ID metadata documents; dynamic registration
  otherwise), and the context's pre-registered ``client_id``/secret if any.

Exit status 0 when every step succeeded, 1 otherwise (the error goes to
stderr); the suite judges conformance from what the server saw.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import trio

from ._config import OAuthConfig, ServerConfig
from ._exceptions import MCPError
from ._session import MCPSession, open_connection

__all__ = ["main"]

_TIMEOUT = 20.0  # the suite gives a client 30 s per scenario
# The suite's client ID metadata document URL and redirect URI (its
# authorization server redirects there; nothing needs to listen in headless mode).
_CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
_REDIRECT_URI = "http://localhost:3000/callback"
_SECRET_ENV = "WEALD_CONFORMANCE_CLIENT_SECRET"  # noqa: S105 - the name of a variable
_KEY_ENV = "WEALD_CONFORMANCE_PRIVATE_KEY"


def _auth_config(scenario: str, context: dict[str, object]) -> OAuthConfig | None:
    if not scenario.startswith("auth/"):
        return None
    client_id = context.get("client_id")
    secret = context.get("client_secret")
    key = context.get("private_key_pem")
    # The config names environment variables, never secrets: put them there.
    if isinstance(secret, str) and secret:
        os.environ[_SECRET_ENV] = secret
    if isinstance(key, str) and key:
        os.environ[_KEY_ENV] = key
    secret_env = _SECRET_ENV if isinstance(secret, str) and secret else None
    client = client_id if isinstance(client_id, str) and client_id else None
    if scenario.startswith("auth/client-credentials"):
        algorithm = context.get("signing_algorithm")
        return OAuthConfig(
            grant="client_credentials",
            client_id=client,
            client_secret_env=None if key else secret_env,
            private_key_env=_KEY_ENV if key else None,
            signing_algorithm=algorithm if isinstance(algorithm, str) else "ES256",
        )
    return OAuthConfig(
        redirect_mode="headless",
        redirect_uri=_REDIRECT_URI,
        client_metadata_url=_CLIENT_METADATA_URL,
        client_id=client,
        client_secret_env=secret_env,
    )


async def _exercise(session: MCPSession, scenario: str) -> None:
    if scenario == "tools_call":
        result = await session.call_tool("add_numbers", {"a": 5, "b": 3})
    elif scenario == "sse-retry":
        result = await session.call_tool("test_reconnection", {})
    else:
        for tool in session.tools:
            result = await session.call_tool(tool.name, {})
            print(f"{tool.name}: {result.text}")
        return
    print(result.text)


async def _run(url: str, scenario: str, context: dict[str, object]) -> None:
    config = ServerConfig(
        name="conformance",
        url=url,
        call_timeout=_TIMEOUT,
        connect_timeout=_TIMEOUT,
        auth=_auth_config(scenario, context),
    )
    async with open_connection(config) as session:
        info = session.server_info
        print(f"connected to {info.name} {info.version} ({info.protocol_version})")
        print("tools:", ", ".join(tool.name for tool in session.tools) or "(none)")
        await _exercise(session, scenario)


def main(argv: list[str] | None = None) -> int:
    """Run one conformance scenario against the server at the URL in ``argv``.

    Returns:
        The process exit status.
    """
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m weald.runtime.mcp.conformance <server-url>", file=sys.stderr)
        return 2
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "initialize")
    try:
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    except ValueError as exc:
        print(f"MCP_CONFORMANCE_CONTEXT is not JSON: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        trio.run(_run, args[-1], scenario, context if isinstance(context, dict) else {})
    except MCPError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
