"""Context management through a real daemon: agent.compact, weald compact, paged agent.history, kill -9 mid-compaction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from weald.runtime.daemon.client import RPCCallError
from weald.runtime.testing import wait_until

LINE = "0123456789 abcdefghij ABCDEFGHIJ klmnopqrst\n"


def reading(count: int, final: str = "read them all") -> list[dict[str, Any]]:
    """``count`` steps that each read big.txt, then an answer."""
    step = {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]}
    return [*([step] * count), {"text": final}]


def small_model(root: Path, script: dict[str, Any], window: int = 6_000) -> tuple[Path, str]:
    """A scripted model behind an alias with a small window; returns the script file and the config."""
    path = root / "small.json"
    path.write_text(json.dumps(script))
    config = f'[models.aliases.small]\nmodel = "scripted:{path}"\ncontext_window = {window}\noutput_reserve = 500\n'
    return path, config


def start_daemon(tmp_path: Path, script: dict[str, Any]) -> tuple[DaemonProcess, Path]:
    path, config = small_model(tmp_path, script)
    d = DaemonProcess(tmp_path, extra_config=config)
    (d.project / "big.txt").write_text(LINE * 150)  # 6,750 characters a read
    return d, path


def test_compaction_history_pages_and_the_context_through_the_daemon(tmp_path: Path) -> None:
    d, _ = start_daemon(tmp_path, {"turns": [*reading(8), {"text": "second"}], "summary": "They read big.txt."})
    try:
        d.start()
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": "small", "agent_id": "a1"})
            assert c.call("agent.prompt", {"agent_id": "a1", "text": "read it"}, timeout=60)["ok"]
            (row,) = c.call("agent.list")
            context = row["context"]
            assert (context["context_window"], context["input_budget"]) == (6_000, 5_500)
            assert context["window_source"] == "configured"
            assert 0 < context["tokens"] <= 5_500
            assert context["compactions"] >= 1 or context["pruned_before"] > 0
            state = c.call("debug_state", {"agent_id": "a1"})
            assert state["context"] == {k: v for k, v in context.items() if k in state["context"]}
            # Pages walk back from the newest; together they are the whole history, in order.
            seqs: list[int] = []
            before = None
            while True:
                params: dict[str, Any] = {"agent_id": "a1", "limit": 5}
                if before is not None:
                    params["before"] = before
                page = c.call("agent.history", params)
                seqs = [m["seq"] for m in page["messages"]] + seqs
                before = page["next_before"]
                if before is None:
                    break
            everything = c.call("agent.history", {"agent_id": "a1"})["messages"]
            assert seqs == [m["seq"] for m in everything] == list(range(len(everything)))
            assert c.call("agent.history", {"agent_id": "a1", "limit": 0})["messages"] == []
            tools = [m for m in everything if m["role"] == "tool"]
            assert len(tools) == 8
            # The store keeps whole outputs, pruned from the context or not.
            assert all(m["content"].count("abcdefghij ABCDEFGHIJ") == 150 for m in tools)
            with pytest.raises(RPCCallError) as info:
                c.call("agent.history", {"agent_id": "a1", "before": -1})
            assert info.value.code == -32602
            # By hand: the CLI and the method.
            done = d.cli("compact", "a1")
            assert done.returncode == 0, done.stderr
            assert "a1: compacted" in done.stdout
            again = c.call("agent.compact", {"agent_id": "a1"}, timeout=30)
            assert (again["agent_id"], again["compacted"]) == ("a1", False)
            assert again["detail"].startswith("nothing to compact")
            summaries = [m for m in c.call("agent.history", {"agent_id": "a1"})["messages"] if "compaction" in m]
            assert summaries[-1]["compaction"]["reason"] == "manual"
            assert summaries[-1]["content"].endswith("They read big.txt.")
            assert c.call("agent.prompt", {"agent_id": "a1", "text": "more"}, timeout=30)["text"] == "second"
            with pytest.raises(RPCCallError) as info:
                c.call("agent.compact", {"agent_id": "nobody"})
            assert info.value.code == -32001
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_daemon_killed_during_a_compaction_restarts_from_the_context_before_it(tmp_path: Path) -> None:
    turns = [*reading(8, final="first done"), *reading(2, final="second done")]
    d, script = start_daemon(tmp_path, {"turns": turns, "summary_delay": 60})
    try:
        d.start()
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": "small", "agent_id": "k9"})
            assert c.call("agent.prompt", {"agent_id": "k9", "text": "read it"}, timeout=60)["ok"]
            c.request("agent.compact", {"agent_id": "k9"})
            wait_until(
                lambda: c.call("debug_state", {"agent_id": "k9"})["status"] == "compacting",
                timeout=60,
                message="the agent to start compacting",
            )
            before = c.call("agent.history", {"agent_id": "k9"})["messages"]
        d.kill9()
        script.write_text(json.dumps({"turns": turns}))  # the restarted model summarizes at once
        d.start()
        with d.client() as c:
            state = c.call("debug_state", {"agent_id": "k9", "events": 100})
            assert state["restarts"] == 1
            assert (state["context"]["summarized"], state["context"]["compactions"]) == (False, 0)
            after = c.call("agent.history", {"agent_id": "k9"})["messages"]
            assert after[: len(before)] == before  # nothing rewritten, nothing half-written
            assert not [m for m in after if "compaction" in m]
            assert c.call("agent.prompt", {"agent_id": "k9", "text": "go on"}, timeout=60)["ok"]
            assert c.call("agent.compact", {"agent_id": "k9"}, timeout=60)["compacted"]
            history = c.call("agent.history", {"agent_id": "k9"})["messages"]
            assert [m["seq"] for m in history] == list(range(len(history)))
            summaries = [m for m in history if "compaction" in m]
            assert summaries
            assert all(m["content"].count("abcdefghij ABCDEFGHIJ") == 150 for m in history if m["role"] == "tool")
            assert c.call("debug_state", {"agent_id": "k9"})["context"]["summarized"]
        assert d.terminate() == 0
    finally:
        d.close()
