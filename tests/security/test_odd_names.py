"""A file whose name is not valid UTF-8 breaks no turn: the crash of issue 12, through a real daemon.

The project holds ``bad<0xff>name.txt``. A scripted model greps and globs
(both list it), then reads it back by the name it was shown,
``bad\\xffname.txt``. Before, every such turn crashed the agent with
UnicodeEncodeError and it restarted.
"""

from __future__ import annotations

import os
from pathlib import Path

from daemon_harness import DaemonProcess


def test_grep_and_glob_show_the_name_escaped_and_read_file_takes_it_back(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path)
    raw = os.fsencode(daemon.project) + b"/bad\xffname.txt"
    with open(raw, "wb") as f:
        f.write(b"hello needle\n")
    shown = "bad\\xffname.txt"
    search = [
        {
            "tool_calls": [
                {"name": "grep", "arguments": {"pattern": "needle"}},
                {"name": "glob", "arguments": {"pattern": "*.txt"}},
                {"name": "glob", "arguments": {"pattern": "bad\\xff*"}},
            ]
        },
        {"tool_calls": [{"name": "read_file", "arguments": {"path": shown}}]},
        {"text": "read it"},
    ]
    model = daemon.script("odd", search * 2)
    daemon.start()
    try:
        with daemon.client() as c:
            c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "odd"})
            for _ in range(2):  # every turn, not just the first
                turn = c.call("agent.prompt", {"agent_id": "odd", "text": "find the needle"}, timeout=60)
                assert (turn["ok"], turn["text"]) == (True, "read it"), turn
            history = c.call("agent.history", {"agent_id": "odd"})["messages"]
            (row,) = c.call("agent.list")
        tools = [m["content"] for m in history if m["role"] == "tool"]
        assert len(tools) == 8
        grep_out, glob_out, glob_named, read_out = tools[4:]
        assert f"{shown}:1:" in grep_out
        assert shown in glob_out.splitlines()
        assert glob_named.splitlines()[-1] == shown
        assert read_out.endswith("|hello needle")
        assert row["restarts"] == 0
        assert "UnicodeEncodeError" not in daemon.log.read_text()
        assert daemon.terminate() == 0, daemon.log.read_text()
    finally:
        daemon.close()
