"""History retention (runtime/daemon/_retention.py): `[history] retention` per project, `weald gc`, the background
pass, the store's size in daemon.status and its warning; nothing a restore needs is ever removed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, recent_events
from weald.runtime import Store
from weald.runtime.agents.agent import AgentRecord, HistoryEntry
from weald.runtime.agents.context import CompactionMark, summary_message
from weald.runtime.daemon._config_model import parse_retention
from weald.runtime.daemon._retention import RetentionJob, collect_blocking
from weald.runtime.daemon.config import Config, ConfigError, parse_config
from weald.runtime.llm import Message
from weald.runtime.testing import wait_until

ANSWER = "an answer long enough that a summary of it is shorter. " * 12


def model(root: Path, turns: int) -> str:
    """A scripted model that answers ``turns`` prompts at length, and summarizes in a line."""
    script = root / "talk.json"
    script.write_text(json.dumps({"turns": [{"text": f"{i}: {ANSWER}"} for i in range(turns)], "summary": "Talk."}))
    return f"scripted:{script}"


def daemon(root: Path, store: str) -> DaemonProcess:
    """A daemon whose config adds ``store`` (lines) to its ``[store]`` table."""
    d = DaemonProcess(root)
    d.config.write_text(d.config.read_text().replace("[server]", f"{store}[server]", 1))
    return d


def converse(c: Any, agent_id: str, prompts: int, start: int = 0) -> None:
    for i in range(start, start + prompts):
        assert c.call("agent.prompt", {"agent_id": agent_id, "text": f"prompt {i}"}, timeout=60)["ok"]


def compact(c: Any, agent_id: str) -> None:
    done = c.call("agent.compact", {"agent_id": agent_id}, timeout=60)
    assert done["compacted"], done


def test_weald_gc_removes_only_what_no_restore_needs_and_only_where_the_project_says(tmp_path: Path) -> None:
    d = daemon(tmp_path, "gc_interval = 0\n")
    kept_project = tmp_path / "keeps-all"
    kept_project.mkdir()
    (d.project / "weald.toml").write_text('[history]\nretention = "1 turns"\n')
    try:
        d.start()
        with d.client() as c:
            for agent_id, directory in (("short", d.project), ("all", kept_project)):
                start = {"working_dir": str(directory), "agent_id": agent_id, "model": model(directory, 8)}
                c.call("agent.start", {**start, "asleep": False})
                converse(c, agent_id, 4)
                compact(c, agent_id)
                converse(c, agent_id, 2, start=4)
                compact(c, agent_id)
            before = {a: c.call("agent.history", {"agent_id": a})["messages"] for a in ("short", "all")}
            context = c.call("debug_state", {"agent_id": "short", "messages": 100})["messages"]
            done = d.cli("gc")
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("removed "), done.stdout
            after = c.call("agent.history", {"agent_id": "short"})["messages"]
            # The other project keeps everything ("all", the default).
            assert c.call("agent.history", {"agent_id": "all"})["messages"] == before["all"]
            summaries = [m for m in before["short"] if "compaction" in m]
            assert [m for m in after if "compaction" in m] == summaries  # every mark stays
            first_kept = summaries[-1]["compaction"]["first_kept"]
            assert [m for m in after if m["seq"] >= first_kept] == [
                m for m in before["short"] if m["seq"] >= first_kept
            ]
            candidates = [m for m in before["short"] if m["seq"] < first_kept and "compaction" not in m]
            older = [m for m in after if m["seq"] < first_kept and "compaction" not in m]
            # "1 turns": the last turn before the mark stays (from its prompt on), the turns before it go.
            last = max(i for i, m in enumerate(candidates) if m["role"] == "user")
            assert older == candidates[last:]
            removed = candidates[:last]
            assert len(before["short"]) - len(after) == len(removed) >= 6
            turns = sum(m["role"] == "user" for m in removed)
            assert done.stdout.startswith(f"removed {len(removed)} messages and {turns} turn records"), done.stdout
            # A restart restores the same context from what is left.
            assert d.terminate() == 0
            d.start()
        with d.client() as c:
            assert c.call("debug_state", {"agent_id": "short", "messages": 100})["messages"] == context
            assert c.call("agent.prompt", {"agent_id": "short", "text": "go on"}, timeout=60)["text"] == f"6: {ANSWER}"
            again = c.call("history.gc", timeout=60)
            assert (again["messages"], again["turns"], again["problems"]) == (0, 0, [])
            status = c.call("daemon.status")
            assert status["store_bytes"] > 0
            assert status["history"]["passes"] == 1
            assert status["history"]["last_pass"]["messages"] == 0
        assert d.terminate() == 0
    finally:
        d.close()


def test_the_background_pass_applies_the_retention_while_agents_run_and_warns_of_a_large_store(
    tmp_path: Path,
) -> None:
    d = daemon(tmp_path, "gc_interval = 1\nwarn_bytes = 1\n")
    (d.project / "weald.toml").write_text('[history]\nretention = "1 turns"\n')
    try:
        d.start()
        with d.client() as c:
            status = c.call("daemon.status")
            assert status["history"]["over_warn_bytes"]
            (warning,) = recent_events(d, "store.size_warning")
            assert warning["source"] == "/"
            assert warning["data"]["bytes"] > warning["data"]["warn_bytes"] == 1
            shown = d.cli("status")
            assert "store_bytes" in shown.stdout
            c.call(
                "agent.start",
                {"working_dir": str(d.project), "agent_id": "bg", "model": model(tmp_path, 9), "asleep": False},
            )
            converse(c, "bg", 4)
            compact(c, "bg")
            # No gc asked for: the daemon's own pass removes what the retention allows, turns going on.
            wait_until(
                lambda: (c.call("daemon.status")["history"]["last_pass"] or {}).get("messages", 0) > 0,
                timeout=60,
                message="a background retention pass to remove messages",
            )
            converse(c, "bg", 2, start=4)
            history = c.call("agent.history", {"agent_id": "bg"})["messages"]
            (summary,) = [m for m in history if "compaction" in m]
            older = [m for m in history if m["seq"] < summary["compaction"]["first_kept"]]
            assert [m["role"] for m in older][:1] == ["user"]  # the last turn before the mark, from its prompt
            assert all(m["role"] != "user" for m in older[1:])
            assert older[0]["content"] != "prompt 0"
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_days_retention_removes_what_is_older_than_that_and_below_the_context(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    day = 86_400.0
    now = 100 * day
    try:
        mark = CompactionMark(first_kept=6, replaced=6, tokens_before=9, tokens_after=3, reason="auto")
        entries = [
            HistoryEntry(seq=0, turn_id="t0", time=now - 40 * day, message=Message(role="user", content="old")),
            HistoryEntry(seq=1, turn_id="t0", time=now - 40 * day, message=Message(role="assistant", content="a")),
            HistoryEntry(seq=2, turn_id="t1", time=now - 31 * day, message=Message(role="user", content="older")),
            HistoryEntry(seq=3, turn_id="t1", time=now - 29 * day, message=Message(role="assistant", content="b")),
            HistoryEntry(seq=4, turn_id="t2", time=now - 35 * day, message=summary_message("early"), compaction=mark),
            HistoryEntry(seq=5, turn_id="t2", time=now - 2 * day, message=Message(role="user", content="new")),
            HistoryEntry(seq=6, turn_id="t3", time=now - 50 * day, message=Message(role="user", content="kept")),
            HistoryEntry(seq=7, turn_id="t3", time=now - 50 * day, message=summary_message("s"), compaction=mark),
        ]
        for entry in entries:
            store.put("history", f"s1/{entry.seq:08d}", entry)
        for turn in ("t0", "t1", "t2", "t3"):
            store.put("turns", f"s1/{turn}", {"turn_id": turn, "status": "done"})
        store.put(
            "agents",
            "s1",
            AgentRecord(key="s1", session_id="s1", agent_id="s1", working_dir="/", model="m", context_from=6),
        )
        report = collect_blocking(store, [RetentionJob("s1", "days", 30)], now=now)
        left = [entry.seq for _, entry in store.items("history", "s1/", type=HistoryEntry)]
        # 30 days: 0 and 1 (t0) and 2 go; 3 is younger; 4 is a mark; 6 and 7 are the context a restore reads.
        assert left == [3, 4, 5, 6, 7]
        assert (report.messages, report.turns) == (3, 1)  # t1 keeps a message, so its record stays
        assert store.get("turns", "s1/t0") is None
        assert store.get("turns", "s1/t1") is not None
        assert report.bytes > 0
        assert report.problems == ()
        # A history never compacted is the context: nothing goes, however old.
        store.put("agents", "s2", AgentRecord(key="s2", session_id="s2", agent_id="s2", working_dir="/", model="m"))
        store.put("history", "s2/00000000", entries[0])
        assert collect_blocking(store, [RetentionJob("s2", "days", 1)], now=now).messages == 0
    finally:
        store.close()


def test_a_retention_is_all_n_days_or_n_turns_and_anything_else_is_an_error_naming_the_key() -> None:
    for value, parsed in (
        ("all", ("all", 0)),
        ("30 days", ("days", 30)),
        ("7d", ("days", 7)),
        ("5 turns", ("turns", 5)),
    ):
        assert parse_retention(parse_config(f'[history]\nretention = "{value}"\n').history.retention) == parsed
    assert Config().history.retention == "all"
    with pytest.raises(ConfigError) as info:
        parse_config('[history]\nretention = "0 days"\n')
    assert 'history.retention: expected "all", "N days" or "N turns" (N at least 1), got "0 days"' in str(info.value)
    with pytest.raises(ConfigError, match=r"store\.warn_bytes: expected an integer, zero or more"):
        parse_config("[store]\nwarn_bytes = -1\n")
