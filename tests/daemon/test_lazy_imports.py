"""A daemon imports the MCP SDK only for a configured MCP server, the observer's web stack only with --http,
and OpenTelemetry only when telemetry is on; Ray never (only `weald serve --ray` does).

Each daemon runs under ``import_probe.py``, which writes every module the
process imported over its life (a turn, an agent list and the shutdown
included) when it exits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from daemon_harness import DaemonProcess

PROBE = Path(__file__).with_name("import_probe.py")
HEAVY = ("mcp", "mcp_types", "starlette", "hypercorn", "opentelemetry")


def imported_by_a_daemon(tmp_path: Path, *args: str, extra_config: str = "") -> set[str]:
    """The top-level packages of ``HEAVY`` that a daemon imported while it hosted one agent's turn."""
    out = tmp_path / "modules.json"
    proc = DaemonProcess(tmp_path, extra_config=extra_config)
    try:
        proc.start(*args, wrapper=(sys.executable, str(PROBE), str(out)))
        model = proc.script("hello", [{"text": "hello"}])
        with proc.client() as client:
            client.call("agent.start", {"working_dir": str(proc.project), "model": model, "agent_id": "a1"})
            assert client.call("agent.prompt", {"agent_id": "a1", "text": "hi"})["text"] == "hello"
            assert [row["agent_id"] for row in client.call("agent.list")] == ["a1"]
            client.call("tree")
        assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()
    modules = json.loads(out.read_text())
    assert "weald.runtime.agents.agent" in modules  # the probe saw the daemon's own imports
    assert "ray" not in modules  # only `weald serve --ray` imports it
    return {name for name in HEAVY if name in modules}


def test_a_daemon_without_mcp_servers_http_or_telemetry_never_imports_the_mcp_sdk_the_web_stack_or_otel(
    tmp_path: Path,
) -> None:
    assert imported_by_a_daemon(tmp_path) == set()


def test_a_configured_mcp_server_and_http_bring_their_imports(tmp_path: Path) -> None:
    # A server whose command does not exist still makes its connection load the SDK.
    config = '[mcp.servers.gone]\ncommand = "/nonexistent/mcp-server"\n[telemetry]\nenabled = true\n'
    assert imported_by_a_daemon(tmp_path, "--http", "127.0.0.1:0", extra_config=config) == set(HEAVY)
