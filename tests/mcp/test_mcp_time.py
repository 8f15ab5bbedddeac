"""Against mcp-server-time (PyPI), a Python server weald did not write, over stdio."""

from __future__ import annotations

import sys

import pytest
from weald.runtime.mcp import ServerConfig, open_connection

pytestmark = pytest.mark.trio


async def test_get_current_time_in_utc():
    config = ServerConfig(name="time", command=sys.executable, args=["-m", "mcp_server_time"])
    async with open_connection(config) as session:
        assert {"get_current_time", "convert_time"} <= {tool.name for tool in session.tools}
        result = await session.call_tool("mcp__time__get_current_time", {"timezone": "UTC"})
    assert result.is_error is False
    assert result.structured_content is not None
    assert result.structured_content["timezone"] == "UTC"
    assert '"timezone": "UTC"' in result.text


async def test_an_unknown_timezone_is_a_tool_error_result():
    config = ServerConfig(name="time", command=sys.executable, args=["-m", "mcp_server_time"])
    async with open_connection(config) as session:
        result = await session.call_tool("get_current_time", {"timezone": "Mars/Olympus_Mons"})
    assert result.is_error is True
    assert "Mars/Olympus_Mons" in result.text
