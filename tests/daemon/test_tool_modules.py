"""Your own tools in the daemon: ``[tools] modules`` and the ``weald.tools`` entry points, through a real daemon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess

TOOL_MODULE = """
from weald.tools import ToolContext, tool


@tool(
    name="{name}",
    description="Say the text louder.",
    parameters={{
        "type": "object",
        "properties": {{"text": {{"type": "string"}}}},
        "required": ["text"],
        "additionalProperties": False,
    }},
)
async def {name}(ctx: ToolContext, text: str) -> str:
    return text.upper() + "!"
"""


def calls(d: DaemonProcess, tool: str) -> str:
    return d.script(f"calls-{tool}", [{"tool_calls": [{"name": tool, "arguments": {"text": "hi"}}]}, {"text": "done"}])


def test_a_module_named_in_tools_modules_brings_its_tools_and_every_view_says_whence(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config='[tools]\nmodules = ["project_tools"]\n')
    (d.project / "project_tools.py").write_text(TOOL_MODULE.format(name="shout"))
    shown = d.cli("config", "show", columns=200)
    assert shown.returncode == 0, shown.stderr
    assert "[tools] modules: project_tools: shout" in shown.stdout
    assert json.loads(d.cli("config", "--json").stdout)["tools"]["shout"] == "[tools] modules: project_tools"
    doctor = d.cli("doctor", "--json")
    (check,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "tools"]
    assert check["status"] == "ok"
    assert "[tools] modules: project_tools: shout" in check["detail"]
    d.start()
    try:
        run = d.cli("run", "--json", "--name", "loud", "--model", calls(d, "shout"), "shout hi")
        assert run.returncode == 0, run.stderr
        history = json.loads(d.cli("history", "loud", "--json").stdout)["messages"]
        assert [m["content"] for m in history if m["role"] == "tool"] == ["HI!"]
        assert d.terminate() == 0
    finally:
        d.close()


def test_an_installed_package_offers_tools_through_the_weald_tools_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"  # what pip leaves in site-packages: the module and the package's metadata
    dist = site / "loud_tools-1.2.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: loud-tools\nVersion: 1.2\n")
    (dist / "entry_points.txt").write_text("[weald.tools]\nloud = loud_tools\n")
    (site / "loud_tools.py").write_text(TOOL_MODULE.format(name="bellow"))
    monkeypatch.setenv("PYTHONPATH", str(site))
    d = DaemonProcess(tmp_path / "d")
    shown = json.loads(d.cli("config", "--json").stdout)["tools"]
    assert shown["bellow"] == "entry point loud (loud-tools 1.2)"
    assert shown["read_file"] == "built-in"
    d.start()
    try:
        run = d.cli("run", "--json", "--name", "bellower", "--model", calls(d, "bellow"), "bellow hi")
        assert run.returncode == 0, run.stderr
        history = json.loads(d.cli("history", "bellower", "--json").stdout)["messages"]
        assert [m["content"] for m in history if m["role"] == "tool"] == ["HI!"]
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_module_that_fails_to_import_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config='[tools]\nmodules = ["broken_tools"]\n')
    (d.project / "broken_tools.py").write_text("import os\nimport no_such_dependency\n")
    serve = d.cli("serve", "--socket", str(d.socket), timeout=60)
    assert serve.returncode == 2, serve.stderr
    lines = serve.stderr.strip().splitlines()
    assert lines[0] == "invalid configuration (1 problem):"
    assert (
        "tools.modules: cannot import 'broken_tools': ModuleNotFoundError: No module named 'no_such_dependency'"
        in lines[1]
    )
    assert f"(at {d.project / 'broken_tools.py'}:2)" in lines[1]
    assert "Traceback" not in serve.stderr
    doctor = json.loads(d.cli("doctor", "--json").stdout)
    (check,) = [c for c in doctor["checks"] if c["name"] == "tools"]
    assert check["status"] == "fail"
    assert "no_such_dependency" in check["detail"]
