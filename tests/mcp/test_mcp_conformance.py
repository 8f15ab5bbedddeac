"""The conformance client entry point (``python -m weald.runtime.mcp.conformance``).

Run as the official suite runs it: ``conformance client --command ...
--scenario NAME`` starts the scenario's server, runs the entry point with its
URL and judges from what the server saw; its ``checks.json`` must hold only
successes. The suite and the Node it needs are installed by the test setup
(``conformance_suite``), as server-everything is.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = [sys.executable, "-m", "weald.runtime.mcp.conformance"]
SUITE_TIMEOUT = 60.0


def run_scenario(suite: tuple[str, Path], scenario: str, output: Path) -> subprocess.CompletedProcess[str]:
    node, script = suite
    command = [node, str(script), "client", "--command", shlex.join(CLIENT), "--scenario", scenario]
    return subprocess.run(
        [*command, "--output-dir", str(output)],
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize(
    "scenario",
    ["initialize", "tools_call", "elicitation-sep1034-client-defaults", "auth/metadata-default"],
)
def test_core_conformance_scenarios_pass_through_the_entry_point(conformance_suite, scenario, tmp_path):
    done = run_scenario(conformance_suite, scenario, tmp_path)
    report = done.stdout + done.stderr  # the suite reports on stderr
    assert done.returncode == 0, report[-4000:]
    assert "OVERALL: PASSED" in report
    (checks_file,) = tmp_path.rglob("checks.json")  # under auth/ for auth/* scenarios
    checks = json.loads(checks_file.read_text())
    verdicts = [check for check in checks if check["status"] != "INFO"]
    assert verdicts, "the scenario judged nothing"
    assert [c["id"] for c in verdicts if c["status"] != "SUCCESS"] == []
    # The client under test was weald's: it named itself in the handshake and connected.
    assert '"weald"' in checks_file.read_text()
    assert (checks_file.parent / "stdout.txt").read_text().startswith("connected to ")


def test_the_entry_point_explains_its_usage_and_a_server_it_cannot_reach():
    usage = subprocess.run(CLIENT, capture_output=True, text=True, timeout=SUITE_TIMEOUT, check=False)
    assert usage.returncode == 2
    assert "usage: python -m weald.runtime.mcp.conformance <server-url>" in usage.stderr

    unreachable = subprocess.run(
        [*CLIENT, "http://127.0.0.1:9/mcp"], capture_output=True, text=True, timeout=SUITE_TIMEOUT, check=False
    )
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith("MCPStartError: MCP server 'conformance' failed to start")


def test_the_entry_point_rejects_a_context_that_is_not_json():
    done = subprocess.run(
        [*CLIENT, "http://127.0.0.1:9/mcp"],
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
        check=False,
        env={**os.environ, "MCP_CONFORMANCE_CONTEXT": "{not json"},
    )
    assert done.returncode == 2
    assert "MCP_CONFORMANCE_CONTEXT is not JSON" in done.stderr
