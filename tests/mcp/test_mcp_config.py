"""ServerConfig: construction and validation."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from weald.runtime.mcp import MCPConfigError, MCPError, ServerConfig


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
