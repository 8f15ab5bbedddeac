"""ServerConfig: construction and validation."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from weald.runtime.daemon.config import ConfigError, config_to_dict, parse_config
from weald.runtime.mcp import MCPConfigError, MCPError, OAuthConfig, ServerConfig
from weald.runtime.mcp._config import DEFAULT_REDIRECT_URI


def test_a_stdio_config_keeps_its_fields_and_defaults():
    config = ServerConfig(name="files", command="npx", args=["-y", "server"], env={"TOKEN": "x"}, cwd=Path("/tmp"))
    assert config.transport == "stdio"
    assert config.args == ("-y", "server")
    assert config.env == {"TOKEN": "x"}
    assert config.cwd == "/tmp"
    assert config.enabled is True
    assert config.call_timeout == 60.0
    assert config.connect_timeout == 30.0


def test_an_http_config_keeps_its_url_and_headers():
    config = ServerConfig(name="remote", url="https://example.com/mcp", headers={"Authorization": "Bearer t"})
    assert config.transport == "http"
    assert config.headers == {"Authorization": "Bearer t"}


def test_config_is_frozen_and_copies_its_mappings():
    env = {"A": "1"}
    config = ServerConfig(name="s", command="srv", env=env)
    env["A"] = "2"
    assert config.env == {"A": "1"}
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.name = "other"  # type: ignore[misc]
    assert attrs.evolve(config, call_timeout=5).call_timeout == 5


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({}, "either command (stdio) or url"),
        ({"command": "srv", "url": "http://h/mcp"}, "not both"),
        ({"command": ""}, "command must be a non-empty string"),
        ({"url": "ftp://h/mcp"}, "absolute http:// or https:// URL"),
        ({"url": "/relative"}, "absolute http:// or https:// URL"),
        ({"url": "http://h/mcp", "args": ["x"]}, "stdio servers only"),
        ({"url": "http://h/mcp", "cwd": "/tmp"}, "stdio servers only"),
        ({"command": "srv", "headers": {"A": "b"}}, "HTTP servers only"),
        ({"command": "srv", "env": {"A": 1}}, "env keys and values must be strings"),
        ({"command": "srv", "call_timeout": 0}, "call_timeout must be a positive number"),
        ({"command": "srv", "connect_timeout": -1}, "connect_timeout must be a positive"),
        ({"command": "srv", "call_timeout": float("inf")}, "call_timeout must be a positive"),
        ({"command": "srv", "enabled": "yes"}, "enabled must be true or false"),
    ],
)
def test_invalid_configs_raise_config_error_naming_the_problem(fields, complaint):
    with pytest.raises(MCPConfigError, match="invalid MCP server config 'svc'") as caught:
        ServerConfig(name="svc", **fields)
    assert complaint in str(caught.value)
    assert caught.value.server == "svc"


def test_every_problem_is_reported_at_once():
    with pytest.raises(MCPConfigError) as caught:
        ServerConfig(name="svc", command="srv", url="http://h/mcp", call_timeout=0)
    assert "not both" in str(caught.value)
    assert "call_timeout" in str(caught.value)


def test_an_empty_name_is_refused():
    with pytest.raises(MCPConfigError, match="name must be a non-empty string"):
        ServerConfig(name=" ", command="srv")


def test_args_must_be_a_list_not_a_string():
    with pytest.raises(MCPConfigError, match="args must be a list of strings"):
        ServerConfig(name="svc", command="srv", args="-y server")  # type: ignore[arg-type]


def test_config_error_is_a_value_error_and_an_mcp_error():
    assert issubclass(MCPConfigError, ValueError)
    assert issubclass(MCPConfigError, MCPError)


# -- auth (OAuth) ----------------------------------------------------------------------------------


def test_an_http_config_takes_an_auth_table_as_oauth_config():
    config = ServerConfig(name="r", url="https://h/mcp", auth={"redirect_mode": "headless", "scopes": ["a:read"]})
    assert config.auth == OAuthConfig(redirect_mode="headless", scopes=("a:read",))
    assert config.auth.redirect_uri == DEFAULT_REDIRECT_URI
    assert ServerConfig(name="r", url="https://h/mcp").auth is None


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"grant": "password"}, "auth.grant must be one of authorization_code, client_credentials"),
        ({"grant": "client_credentials"}, "auth.grant = client_credentials needs client_id"),
        ({"grant": "client_credentials", "client_id": "m"}, "needs client_secret_env or private_key_env"),
        ({"client_secret_env": "S_SECRET"}, "belongs to a pre-registered client: give client_id too"),
        ({"client_id": "c", "client_secret_env": "sk-live-123456"}, "must name an environment variable"),
        ({"client_id": "c", "token_endpoint_auth_method": "client_secret_post"}, "needs client_secret_env"),
        ({"client_id": "c", "private_key_env": "KEY"}, "private_key_env applies to grant = client_credentials"),
        ({"redirect_uri": "https://example.com/cb"}, "redirect_uri must be http:// on a loopback address with a port"),
        ({"redirect_uri": "http://127.0.0.1/cb"}, "with a port"),
        ({"redirect_mode": "headless", "redirect_uri": "cb"}, "absolute http:// or https:// URL"),
        ({"redirect_mode": "sideways"}, "redirect_mode must be one of browser, headless"),
        ({"scopes": ["a b"]}, "scopes must be non-empty strings without spaces"),
        ({"client_metadata_url": "http://h/client.json"}, "client_metadata_url must be an https:// URL with a path"),
        ({"authorization_timeout": 0}, "authorization_timeout must be a positive number"),
    ],
)
def test_invalid_auth_is_refused_naming_the_field(fields, complaint):
    with pytest.raises(MCPConfigError, match="invalid MCP server config 'svc'") as caught:
        ServerConfig(name="svc", url="https://h/mcp", auth=fields)
    assert complaint in str(caught.value)


def test_auth_is_for_http_servers_and_excludes_a_static_authorization_header():
    with pytest.raises(MCPConfigError, match="auth applies to HTTP servers only"):
        ServerConfig(name="svc", command="srv", auth={})
    with pytest.raises(MCPConfigError, match="either an Authorization header or auth"):
        ServerConfig(name="svc", url="https://h/mcp", headers={"Authorization": "Bearer t"}, auth={})


def test_weald_toml_auth_problems_are_reported_with_their_paths():
    text = """
[mcp.servers.remote]
url = "https://example.com/mcp"

[mcp.servers.remote.auth]
grant = "client_credentials"
client_secret = "sk-abc-123"
redirect_mode = "sideways"

[mcp.servers.machine]
url = "https://example.com/mcp"

[mcp.servers.machine.auth]
grant = "client_credentials"
client_secret_env = "MACHINE_SECRET"
"""
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    found = {(problem.path, problem.message) for problem in caught.value.problems}
    assert ("mcp.servers.remote.auth.redirect_mode", 'expected "browser" or "headless", got "sideways"') in found
    assert any(
        key == "mcp.servers.remote.auth.client_secret" and "client_secret_env" in message for key, message in found
    )
    assert "sk-abc-123" not in str(caught.value)
    assert ("mcp.servers.machine.auth", "grant = client_credentials needs client_id") in found


def test_a_weald_toml_auth_table_becomes_the_servers_oauth_config():
    config = parse_config(
        """
[mcp.servers.remote]
url = "https://example.com/mcp"

[mcp.servers.remote.auth]
client_id = "weald-desktop"
client_secret_env = "REMOTE_MCP_SECRET"
scopes = ["files:read"]
redirect_uri = "http://localhost:8976/callback"
"""
    )
    server = config.mcp.servers["remote"].to_server_config("remote")
    assert server.auth == OAuthConfig(
        client_id="weald-desktop",
        client_secret_env="REMOTE_MCP_SECRET",
        scopes=("files:read",),
        redirect_uri="http://localhost:8976/callback",
    )
    assert config_to_dict(config)["mcp"]["servers"]["remote"]["auth"]["client_secret_env"] == "REMOTE_MCP_SECRET"
