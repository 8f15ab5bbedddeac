"""``agent.list`` and ``weald agents`` over thousands of sessions, through a real daemon: pages, states, spill.

One daemon for the module, with 3,000 sessions started asleep by
``agents.start``; each test works on sessions of its own beside them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from weald.runtime.daemon.client import Client, RPCCallError

ASLEEP = 3000
CONFIG = """[limits]
max_agents = 4000
[tools.permissions]
shell = "allow"
[spill]
max_call_bytes = 200000
"""
FLOOD = {"name": "shell", "arguments": {"command": "seq 1 100000"}}  # spilled: 200,000 bytes kept


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with serving(tmp_path_factory.mktemp("agent-list"), extra_config=CONFIG) as proc:
        model = proc.script("ok", [{"text": "ok"}])
        with proc.client() as client:
            for first in range(0, ASLEEP, 1000):
                starts = [
                    {"working_dir": str(proc.project), "model": model, "agent_id": f"many{i:05d}", "asleep": True}
                    for i in range(first, first + 1000)
                ]
                results = client.call("agents.start", {"agents": starts}, timeout=120)["results"]
                assert all("result" in r for r in results), [r for r in results if "error" in r][:3]
        yield proc


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with daemon.client() as connected:
        yield connected


def pages(client: Client, limit: int, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of ``agent.list`` with ``limit``, each asked after the last id of the page before."""
    out: list[list[dict[str, Any]]] = []
    after = None
    while True:
        page = client.call("agent.list", {**params, "limit": limit, "after": after}, timeout=60)
        assert page["limit"] == limit
        assert len(page["rows"]) <= limit
        out.append(page["rows"])
        after = page["next_after"]
        if after is None:
            return out
        assert after == page["rows"][-1]["agent_id"]


def test_every_session_started_asleep_is_listed_with_its_fields_as_hibernated(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        rows = {row["agent_id"]: row for row in client.call("agent.list", timeout=60)}
    many = [rows[f"many{i:05d}"] for i in range(ASLEEP)]
    row = many[17]
    assert row["status"] == "active"
    assert row["state"] == "hibernated"
    assert row["working_dir"] == str(daemon.project)
    assert row["model"].startswith("scripted:")
    assert row["path"] == "/sessions/many00017/agent"
    assert row["created"] > 0
    assert {"project", "files", "generation", "refused", "ignored", "started_with"} <= set(row["config"])
    assert "turn_id" not in row  # asking it would have woken it
    assert all(r["state"] == "hibernated" and r["status"] == "active" for r in many)


def test_pages_hold_every_session_exactly_once_in_id_order(client: Client) -> None:
    whole = [row["agent_id"] for row in client.call("agent.list", timeout=60)]
    paged = pages(client, 700)
    ids = [row["agent_id"] for page in paged for row in page]
    assert len(ids) == len(set(ids))  # none twice
    assert ids == whole == sorted(whole)  # the same sessions, in the same order: by id
    assert len(paged) == -(-len(ids) // 700)  # full pages but the last
    # Asked again, the pages are the same: the order is stable.
    assert [row["agent_id"] for page in pages(client, 700) for row in page] == ids
    # A page starting after an id that is no session's starts at the next one.
    page = client.call("agent.list", {"limit": 2, "after": "many00009x"}, timeout=60)
    assert [row["agent_id"] for row in page["rows"]] == ["many00010", "many00011"]
    # The last page says there is no more.
    assert client.call("agent.list", {"limit": 5, "after": ids[-1]}, timeout=60) == {
        "rows": [],
        "next_after": None,
        "limit": 5,
    }


def test_a_session_woken_by_a_prompt_lists_awake_and_a_stopped_one_stopped_or_left_out(
    daemon: DaemonProcess, client: Client
) -> None:
    model = daemon.script("woken", [{"text": "hello"}])
    starts = [
        {"working_dir": str(daemon.project), "model": model, "agent_id": agent_id, "asleep": True}
        for agent_id in ("state-a", "state-b", "state-c")
    ]
    assert all("result" in r for r in client.call("agents.start", {"agents": starts}, timeout=60)["results"])
    assert client.call("agent.prompt", {"agent_id": "state-b", "text": "go"}, timeout=60)["ok"]
    assert client.call("agent.stop", {"agent_id": "state-c"}, timeout=60)["stopped"] is True

    rows = {row["agent_id"]: row for row in client.call("agent.list", {"limit": 10, "after": "state"})["rows"]}
    assert [rows[a]["state"] for a in ("state-a", "state-b", "state-c")] == ["hibernated", "idle", "stopped"]
    assert rows["state-b"]["status"] == "active"
    assert rows["state-b"]["usage"]["output_tokens"] > 0
    assert rows["state-b"]["context"]["messages"] == 2
    assert rows["state-c"]["status"] == "stopped"
    # Without the stopped ones, it is gone; the page is still full.
    page = client.call("agent.list", {"limit": 2, "after": "state", "stopped": False})
    assert [row["agent_id"] for row in page["rows"]] == ["state-a", "state-b"]
    page = client.call("agent.list", {"limit": 2, "after": "state-b", "stopped": False})
    assert "state-c" not in [row["agent_id"] for row in page["rows"]]
    # The whole list, without params, has it as stopped, as it always did.
    whole = {row["agent_id"]: row for row in client.call("agent.list", timeout=60)}
    assert whole["state-c"]["state"] == "stopped"
    assert whole["state-b"]["state"] == "idle"


def test_long_adds_each_sessions_spilled_bytes(daemon: DaemonProcess, client: Client) -> None:
    model = daemon.script("flood", [{"text": "", "tool_calls": [FLOOD]}, {"text": "done"}])
    for agent_id in ("spill-a", "spill-b"):
        client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": agent_id})
    assert client.call("agent.prompt", {"agent_id": "spill-a", "text": "go"}, timeout=60)["ok"]
    rows = client.call("agent.list", {"limit": 3, "after": "spill", "long": True})["rows"]
    assert [(row["agent_id"], row["spill_bytes"]) for row in rows][:2] == [("spill-a", 200_000), ("spill-b", 0)]
    assert client.call("debug_state", {"agent_id": "spill-a"})["spill"]["bytes"] == 200_000
    assert all(row["spill_bytes"] == 0 for row in client.call("agent.list", {"limit": 50, "long": True})["rows"])
    assert "spill_bytes" not in client.call("agent.list", {"limit": 1})["rows"][0]
    shown = daemon.cli("agents", "--long", "--limit", "3", cwd=daemon.project)
    assert shown.returncode == 0, shown.stderr
    assert "spilled output: 0 bytes" in shown.stdout  # many00000...
    after = daemon.cli("agents", "--long", "--json", cwd=daemon.project)
    assert {row["agent_id"]: row["spill_bytes"] for row in json.loads(after.stdout)}["spill-a"] == 200_000


def test_a_page_asked_wrong_is_refused_with_the_field_named(client: Client) -> None:
    wrong = [
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"after": 5}, "after"),
        ({"after": "a\x00"}, "after"),
    ]
    for params, field in wrong:
        with pytest.raises(RPCCallError) as caught:
            client.call("agent.list", params)
        assert caught.value.code == -32602, params
        assert caught.value.message.startswith(f"invalid params for agent.list: {field}"), caught.value.message


def test_weald_agents_lists_every_session_and_limit_shows_the_first_n(daemon: DaemonProcess) -> None:
    every = daemon.cli("agents", cwd=daemon.project, columns=200)
    assert every.returncode == 0, every.stderr
    lines = every.stdout.splitlines()
    listed = [line.split()[0] for line in lines[2:]]
    assert listed[:3] == ["many00000", "many00001", "many00002"]
    assert len([i for i in listed if i.startswith("many")]) == ASLEEP
    assert listed == sorted(listed)
    assert "hibernated" in lines[2]

    first = daemon.cli("agents", "--limit", "5", cwd=daemon.project, columns=200)
    assert first.returncode == 0, first.stderr
    shown = [line.split()[0] for line in first.stdout.splitlines() if line.startswith("many")]
    assert shown == [f"many{i:05d}" for i in range(5)]
    assert "the first 5 agents" in first.stderr

    as_json = daemon.cli("agents", "--limit", "1500", "--json", cwd=daemon.project)
    assert as_json.returncode == 0, as_json.stderr
    assert [row["agent_id"] for row in json.loads(as_json.stdout)] == [f"many{i:05d}" for i in range(1500)]

    wrong = daemon.cli("agents", "--limit", "0", cwd=daemon.project)
    assert wrong.returncode == 2
    assert "--limit: expected 1 or more, got 0" in wrong.stderr


def test_one_session_s_row_is_asked_by_its_id_and_weald_agent_stop_looks_up_only_those_it_stops(
    daemon: DaemonProcess, client: Client
) -> None:
    model = daemon.script("one", [{"text": "ok"}])
    for agent_id in ("one-a", "one-ab", "one-b"):
        client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": agent_id})
    page = client.call("agent.list", {"agent_id": "one-a"})
    assert [row["agent_id"] for row in page["rows"]] == ["one-a"]  # not one-ab, which sorts right after it
    assert page["next_after"] is None
    assert page["rows"][0]["state"] in ("hibernated", "idle")
    assert client.call("agent.list", {"agent_id": "one-"})["rows"] == []  # a prefix is not an id
    assert client.call("agent.list", {"agent_id": "many00017"})["rows"][0]["state"] == "hibernated"

    stopped = daemon.cli("agent", "stop", "one-a", "--json", cwd=daemon.project)
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout) == [{"agent_id": "one-a", "stopped": True}]
    assert client.call("agent.list", {"agent_id": "one-a"})["rows"][0]["state"] == "stopped"
    assert client.call("agent.list", {"agent_id": "one-a", "stopped": False})["rows"] == []
    missing = daemon.cli("agent", "stop", "one-b", "one-", cwd=daemon.project)
    assert missing.returncode != 0
    assert "no agent 'one-'" in missing.stderr
    assert client.call("agent.list", {"agent_id": "one-b"})["rows"][0]["status"] == "active"  # nothing stopped
