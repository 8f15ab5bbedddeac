"""The methods the observer stands on at 100,000 sessions, through a real daemon's socket.

Pages of sessions and of actors, the collapsed tree, the operator's actions
(send, hibernate, wake, restart), event queries over the whole history, and
the metrics sampler. The page itself is driven in test_observer_browser.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from weald.runtime.daemon.client import Client, RPCCallError
from weald.runtime.daemon.metrics import POINTS, SERIES, MetricRings
from weald.runtime.testing import wait_until

# Right after the harness's own [server] table: its event_history.
CONFIG = """event_history = 20000
[faults]
enabled = true
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon for the module (faults on); each test works in projects and sessions of its own."""
    with serving(tmp_path_factory.mktemp("methods"), extra_config=CONFIG) as proc:
        yield proc


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with daemon.client() as connected:
        yield connected


def project(daemon: DaemonProcess, name: str) -> str:
    path = daemon.root / name
    path.mkdir(exist_ok=True)
    return str(path)


def start_asleep(client: Client, starts: list[dict[str, Any]]) -> None:
    results = client.call("agents.start", {"agents": [{**start, "asleep": True} for start in starts]})["results"]
    assert all("result" in r for r in results), results


def test_a_page_of_sessions_puts_awake_ones_first_and_filters_searches_and_sorts_over_all_of_them(
    daemon: DaemonProcess, client: Client
) -> None:
    red, blue = project(daemon, "red"), project(daemon, "blue")
    fast = daemon.script("page-fast", [{"text": "ok"}])
    slow = daemon.script("page-slow", [{"text": "ok"}])
    start_asleep(
        client,
        [
            {"working_dir": red if n % 2 else blue, "model": fast if n < 10 else slow, "agent_id": f"page{n:02d}"}
            for n in range(20)
        ],
    )
    for agent in ("page03", "page11", "page07"):  # prompted in this order: woken
        assert client.call("agent.prompt", {"agent_id": agent, "text": "go"}, timeout=60)["ok"]

    red_page = client.call("sessions.page", {"project": red, "limit": 4})
    assert red_page["total"] == 10
    rows = red_page["rows"]
    # Awake first, the most recently woken first, then the asleep ones, the most recently started first.
    assert [r["agent_id"] for r in rows] == ["page07", "page11", "page03", "page19"]
    assert [r["awake"] for r in rows] == [True, True, True, False]
    assert rows[0]["state"] == "idle"
    assert rows[3]["state"] == "hibernated"
    assert rows[0]["usage"]["output_tokens"] > 0
    assert rows[0]["working_dir"] == red
    assert rows[0]["model"] == fast
    assert {"working_dir": red, "sessions": 10} in red_page["projects"]
    assert red_page["counts"]["awake"] >= 3
    assert red_page["counts"]["active"] == red_page["counts"]["awake"] + red_page["counts"]["asleep"]

    # The next page, filters together, a search by id or by project, sorts both ways, a state.
    second = client.call("sessions.page", {"project": red, "limit": 4, "offset": 4})
    assert [r["agent_id"] for r in second["rows"]] == ["page17", "page15", "page13", "page09"]
    both = client.call("sessions.page", {"project": red, "model": slow, "sort": "id", "limit": 50})
    assert [r["agent_id"] for r in both["rows"]] == ["page11", "page13", "page15", "page17", "page19"]
    searched = client.call("sessions.page", {"search": "PAGE1", "project": blue, "sort": "id", "order": "desc"})
    assert [r["agent_id"] for r in searched["rows"]] == ["page18", "page16", "page14", "page12", "page10"]
    by_project = client.call("sessions.page", {"search": Path(red).name, "state": "awake", "sort": "id"})
    assert [r["agent_id"] for r in by_project["rows"]] == ["page03", "page07", "page11"]
    asleep_red = client.call("sessions.page", {"project": red, "state": "asleep", "limit": 0})
    assert asleep_red["total"] == 7
    assert asleep_red["rows"] == []
    assert client.call("sessions.page", {"project": "/nowhere"})["total"] == 0

    # A stopped session leaves the index; the stopped state lists it, from the store.
    assert client.call("agent.stop", {"agent_id": "page19"})["stopped"]
    assert client.call("sessions.page", {"project": red})["total"] == 9
    stopped = client.call("sessions.page", {"project": red, "state": "stopped"})
    assert [(r["agent_id"], r["state"]) for r in stopped["rows"]] == [("page19", "stopped")]

    with pytest.raises(RPCCallError, match="limit") as refused:
        client.call("sessions.page", {"limit": 501})
    assert refused.value.code == -32602


def test_the_tree_collapses_sessions_into_their_counts(daemon: DaemonProcess, client: Client) -> None:
    start_asleep(client, [{"working_dir": project(daemon, "tree"), "agent_id": f"tree{n}"} for n in range(5)])
    tree = client.call("tree", {"collapse": ["/sessions"]})
    nodes = {node["path"]: node for node in tree["children"]}
    counts = client.call("sessions.page", {"limit": 0})["counts"]
    sessions = nodes["/sessions"]
    assert sessions["children"] == []
    assert sessions["children_hidden"] >= 5
    assert sessions["children_hidden"] >= counts["active"]
    assert sessions["children_asleep"] == counts["asleep"]
    assert {"/store", "/events", "/io", "/mcp", "/metrics", "/server"} <= set(nodes)
    # Not collapsed, a session's subtree is there, as before.
    assert client.call("tree", {"path": "/sessions/tree0"})["children"] != []


def test_the_actor_table_sorts_by_mailbox_and_marks_one_that_keeps_growing(
    daemon: DaemonProcess, client: Client
) -> None:
    model = daemon.script("slow", [{"text": "ok"}] * 20)
    client.call("agent.start", {"working_dir": project(daemon, "slow"), "model": model, "agent_id": "jammed"})
    fault = {"target": "actor", "kind": "delay", "path": "/sessions/jammed/agent", "seconds": 2.0}
    fault_id = client.call("fault.inject", {"fault": fault})["id"]
    try:
        growing: list[dict[str, Any]] = []

        def grows() -> bool:
            client.call("agent.send", {"agent_id": "jammed", "text": "more"})
            client.call("agent.send", {"agent_id": "jammed", "text": "more"})
            page = client.call("actors.list", {"sort": "mailbox", "limit": 5})
            growing[:] = page["rows"]
            return page["rows"][0]["path"] == "/sessions/jammed/agent" and page["rows"][0]["growing"]

        wait_until(grows, timeout=60, interval=0.3, message=lambda: f"a growing mailbox first: {growing}")
        top = growing[0]
        assert top["mailbox"] >= 3
        assert top["kind"] == "Agent"
        assert top["status"] == "running"
        assert top["memory"] > 0
        assert top["restarts"] == 0
        assert [r["mailbox"] for r in growing] == sorted((r["mailbox"] for r in growing), reverse=True)
    finally:
        client.call("fault.clear", {"id": fault_id})
        client.call("agent.stop", {"agent_id": "jammed"})
    everything = client.call("actors.list", {"sort": "path", "limit": 500})
    paths = [r["path"] for r in everything["rows"]]
    assert paths == sorted(paths)
    assert everything["total"] == len(paths)
    assert "/metrics" in paths
    assert not any(p.startswith("/sessions/jammed") for p in paths)  # gone with its session; asleep ones never
    narrowed = client.call("actors.list", {"prefix": "/sessions", "search": "dynamic", "sort": "handled"})
    assert [r["path"] for r in narrowed["rows"]] == ["/sessions"]


def test_an_actor_is_restarted_by_its_supervisor_and_the_daemon_itself_is_not(
    daemon: DaemonProcess, client: Client
) -> None:
    model = daemon.script("restarted", [{"text": "first"}, {"text": "after the restart"}])
    client.call("agent.start", {"working_dir": project(daemon, "restart"), "model": model, "agent_id": "restarted"})
    assert client.call("agent.prompt", {"agent_id": "restarted", "text": "one"}, timeout=60)["ok"]
    done = client.call("actor.restart", {"path": "/sessions/restarted/agent"})
    assert done == {"path": "/sessions/restarted/agent", "restarted": True, "restarts": 1}
    row = client.call("actors.list", {"prefix": "/sessions/restarted", "sort": "path"})["rows"]
    assert {r["path"]: r["restarts"] for r in row}["/sessions/restarted/agent"] == 1
    # It carries on from its stored history.
    again = client.call("agent.prompt", {"agent_id": "restarted", "text": "two"}, timeout=60)
    assert again["ok"]
    assert again["text"] == "after the restart"
    for path, code, words in [
        ("/store", -32000, "part of the daemon itself"),
        ("/sessions", -32000, "part of the daemon itself"),
        ("/sessions/nobody/agent", -32001, "no running actor"),
    ]:
        with pytest.raises(RPCCallError, match=words) as refused:
            client.call("actor.restart", {"path": path})
        assert refused.value.code == code


def test_an_operator_sends_a_prompt_and_hibernates_and_wakes_a_session(daemon: DaemonProcess, client: Client) -> None:
    model = daemon.script("operated", [{"text": "sent and answered", "delay": 0.3}])
    start_asleep(client, [{"working_dir": project(daemon, "operated"), "model": model, "agent_id": "operated"}])
    assert client.call("agent.send", {"agent_id": "operated", "text": "hello"}) == {
        "agent_id": "operated",
        "queued": True,
    }
    # Busy with the turn: it stays awake.
    wait_until(lambda: awake(client, "operated"), timeout=30, message="the prompt to wake it")
    busy = client.call("agent.hibernate", {"agent_id": "operated"})
    assert busy["hibernated"] is False
    assert "busy" in busy["reason"]

    def answered() -> bool:
        messages = client.call("agent.history", {"agent_id": "operated"})["messages"]
        return any(m["content"] == "sent and answered" for m in messages)

    wait_until(answered, timeout=30, message="the sent prompt's answer in the history")
    wait_until(
        lambda: client.call("agent.hibernate", {"agent_id": "operated"})["hibernated"],
        timeout=30,
        message="the idle session to hibernate",
    )
    assert not awake(client, "operated")
    already = client.call("agent.hibernate", {"agent_id": "operated"})
    assert already == {"agent_id": "operated", "hibernated": False, "reason": "it is asleep already"}
    assert client.call("agent.wake", {"agent_id": "operated"}) == {"agent_id": "operated", "woken": True}
    assert awake(client, "operated")
    assert client.call("agent.wake", {"agent_id": "operated"})["woken"] is False
    # Its history came back with it: each message with its time, the model's with its tokens.
    messages = client.call("agent.history", {"agent_id": "operated"})["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert all(abs(m["time"] - time.time()) < 600 for m in messages)
    assert messages[1]["usage"]["output_tokens"] > 0
    assert "usage" not in messages[0]
    with pytest.raises(RPCCallError, match="no running agent"):
        client.call("agent.send", {"agent_id": "nobody", "text": "hi"})


def awake(client: Client, agent_id: str) -> bool:
    rows = client.call("sessions.page", {"search": agent_id, "state": "awake"})["rows"]
    return any(r["agent_id"] == agent_id for r in rows)


def test_an_event_query_finds_a_fault_behind_thousands_of_text_deltas(daemon: DaemonProcess, client: Client) -> None:
    script = daemon.scripts / "chatty.json"
    script.write_text('{"turns": [{"text": "a few words streamed in four deltas"}], "repeat": true}')
    agents = [f"chatty{n}" for n in range(8)]
    start_asleep(
        client,
        [{"working_dir": project(daemon, "events"), "model": f"scripted:{script}", "agent_id": a} for a in agents],
    )
    fault = {"target": "actor", "kind": "drop", "path": "/sessions/chatty0/nothing", "count": 1}
    fault_id = client.call("fault.inject", {"fault": fault})["id"]
    client.call("fault.clear", {"id": fault_id})
    for _ in range(35):  # each agent one turn at a time (a prompt sent during a turn would join it)
        turns = [client.request("agent.prompt", {"agent_id": agent, "text": "talk"}) for agent in agents]
        assert all(turn.get(timeout=120)["ok"] for turn in turns)
    deltas = client.call("events.query", {"topic": "agent.message_delta", "source": "/sessions/chatty", "limit": 5000})
    assert len(deltas["events"]) > 1000, "the turns streamed their text in many deltas"
    faults = client.call("events.query", {"topic": "fault.*"})["events"]
    assert any(e["data"].get("id") == fault_id for e in faults)
    # Paged back, newest last, each page before the one after it.
    first = client.call("events.query", {"source": "/sessions/chatty0", "exclude": ["agent.message_delta"], "limit": 3})
    assert len(first["events"]) == 3
    assert first["next_before"] == first["events"][0]["seq"]
    assert not any(e["topic"] == "agent.message_delta" for e in first["events"])
    earlier = client.call(
        "events.query",
        {"source": "/sessions/chatty0", "exclude": ["agent.message_delta"], "before": first["next_before"]},
    )
    assert earlier["events"]
    assert earlier["events"][-1]["seq"] < first["events"][0]["seq"]
    assert first["held"] <= 20000
    assert first["published"] >= first["held"]


def test_the_sampler_keeps_fixed_rings_of_the_daemons_figures(daemon: DaemonProcess, client: Client) -> None:
    model = daemon.script("sampled", [{"text": "ok", "usage": {"input_tokens": 50, "output_tokens": 7}}] * 5)
    client.call("agent.start", {"working_dir": project(daemon, "sampled"), "model": model, "agent_id": "sampled"})
    start = client.call("metrics.series", {})
    assert [s["name"] for s in start["series"]] == [spec.name for spec in SERIES]
    assert start["interval"] == 1.0
    assert start["points"] == POINTS
    for _ in range(5):
        assert client.call("agent.prompt", {"agent_id": "sampled", "text": "go"}, timeout=60)["ok"]
    seen: dict[str, list[Any]] = {}

    def counted() -> bool:
        newer = client.call("metrics.series", {"since": start["next"]})
        for name, values in newer["values"].items():
            seen.setdefault(name, []).extend(values)
        start["next"] = newer["next"]
        return (
            sum(v or 0 for v in seen.get("turns_per_s", [])) > 0
            and sum(v or 0 for v in seen.get("tokens_in_per_s", [])) > 0
        )

    wait_until(counted, timeout=30, message=lambda: f"turns and tokens in the samples: {seen}")
    assert max(v or 0 for v in seen["model_calls_per_s"]) > 0
    assert max(v or 0 for v in seen["commits_per_s"]) > 0
    assert all(v is not None and v > 10_000_000 for v in seen["rss_bytes"])
    assert all(v is not None and v > 0 for v in seen["store_bytes"])
    assert any(v is not None and v >= 1 for v in seen["connections"])
    assert any(v is not None and v >= 1 for v in seen["sessions_awake"])
    snapshot = client.call("actor.snapshot", {"path": "/metrics"})["snapshot"]
    # Its own cost: well under half a percent of one core (measured in benchmarks/bench_observer.py).
    assert snapshot["samples"] >= 1
    assert snapshot["cost_seconds"] < snapshot["samples"] * 0.005


def test_metric_rings_hold_a_fixed_number_of_samples_and_give_what_a_reader_has_not_seen() -> None:
    rings = MetricRings(["a", "b"], points=3)
    assert rings.since(0) == (0, [], {"a": [], "b": []})
    for n in range(5):
        rings.append(100.0 + n, {"a": n, "b": None if n == 3 else 10 * n})
    seq, times, values = rings.since(0)
    assert (seq, times) == (5, [102.0, 103.0, 104.0])  # the two oldest went
    assert values == {"a": [2.0, 3.0, 4.0], "b": [20.0, None, 40.0]}
    assert rings.since(4) == (5, [104.0], {"a": [4.0], "b": [40.0]})
    assert rings.since(5) == (5, [], {"a": [], "b": []})
    assert rings.latest("a") == 4.0
    with pytest.raises(ValueError, match="at least one point"):
        MetricRings(["a"], points=0)
