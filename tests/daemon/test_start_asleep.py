"""Agents started asleep (``agent.start`` with ``asleep``, ``agents.start``): checked and stored at once, built later."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from weald.runtime.daemon.client import Client, RPCCallError


@pytest.fixture
def proc(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon allowed three agents."""
    with serving(tmp_path, extra_config="[limits]\nmax_agents = 3\n") as proc:
        yield proc


def rows(client: Client) -> dict[str, dict[str, Any]]:
    return {row["agent_id"]: row for row in client.call("agent.list")}


def session_node(client: Client, agent_id: str) -> dict[str, Any]:
    node: dict[str, Any] = client.call("tree", {"path": f"/sessions/{agent_id}"})
    return node


def test_an_agent_started_asleep_is_drawn_hibernated_until_its_first_prompt_wakes_it(proc: DaemonProcess) -> None:
    model = proc.script("talk", [{"text": "first answer"}, {"text": "second answer"}])
    with proc.client() as client:
        start = {"working_dir": str(proc.project), "model": model, "agent_id": "s1", "asleep": True}
        assert client.call("agent.start", start) == {"agent_id": "s1"}
        # Nothing of it runs: agent.list, tree and daemon.status say so, and asking them wakes nothing.
        row = rows(client)["s1"]
        assert (row["state"], row["status"], row["restarts"], row["model"]) == ("hibernated", "active", 0, model)
        node = session_node(client, "s1")
        assert (node["kind"], node["status"]) == ("Supervisor", "hibernated")
        children = {child["path"]: (child["kind"], child["status"]) for child in node["children"]}
        assert children == {
            "/sessions/s1/tool_runner": ("ToolRunner", "hibernated"),
            "/sessions/s1/agent": ("Agent", "hibernated"),
        }
        status = client.call("daemon.status")
        assert (status["agents"], status["hibernated"]) == (1, 1)
        # Its first prompt wakes it, transparently.
        result = client.call("agent.prompt", {"agent_id": "s1", "text": "one"})
        assert (result["ok"], result["text"]) == (True, "first answer")
        assert rows(client)["s1"]["state"] == "idle"
        assert session_node(client, "s1")["status"] == "running"
        # debug_state wakes one too, and finds it as new: no history, no restart.
        client.call("agent.start", {"working_dir": str(proc.project), "model": model, "agent_id": "s2", "asleep": True})
        state = client.call("debug_state", {"agent_id": "s2"})
        assert (state["agent"], state["status"], state["restarts"], state["messages"]) == (
            "/sessions/s2/agent",
            "idle",
            0,
            [],
        )
        assert client.call("agent.prompt", {"agent_id": "s2", "text": "two"})["text"] == "first answer"
        messages = client.call("agent.history", {"agent_id": "s1"})["messages"]
        assert [m["content"] for m in messages] == ["one", "first answer"]


def test_an_asleep_start_reports_every_error_a_start_reports(proc: DaemonProcess) -> None:
    project = str(proc.project)
    wrong = [
        ({"working_dir": "project"}, "working_dir", "must be an absolute path, got 'project'"),
        ({"working_dir": project, "agent_id": "no spaces"}, "agent_id", "'no spaces' is not an agent id"),
        ({"working_dir": project, "model": "nosuchkind:x"}, "model", "cannot use model 'nosuchkind:x'"),
    ]
    with proc.client() as client:
        for params, field, problem in wrong:
            with pytest.raises(RPCCallError) as caught:
                client.call("agent.start", {**params, "asleep": True})
            assert caught.value.code == -32602, params
            assert caught.value.message.startswith(f"invalid params for agent.start: {field}: {problem}")
        with pytest.raises(RPCCallError, match="is not a directory") as caught:
            client.call("agent.start", {"working_dir": f"{project}/missing", "asleep": True})
        assert caught.value.code == -32000
        # An id in use, asleep or awake, and the same id twice in one burst: one start wins.
        client.call("agent.start", {"working_dir": project, "agent_id": "awake", "asleep": False})
        twice = [
            client.request("agent.start", {"working_dir": project, "agent_id": "twin", "asleep": True})
            for _ in range(2)
        ]
        outcomes = []
        for future in twice:
            try:
                outcomes.append(future.get(timeout=30))
            except RPCCallError as exc:
                outcomes.append(exc.message)
        assert {"agent_id": "twin"} in outcomes
        assert any(isinstance(o, str) and "'twin' is already running" in o for o in outcomes), outcomes
        for taken in ("awake", "twin"):
            with pytest.raises(RPCCallError, match=f"an agent '{taken}' is already running"):
                client.call("agent.start", {"working_dir": project, "agent_id": taken, "asleep": True})
        # limits.max_agents counts the agents asleep.
        client.call("agent.start", {"working_dir": project, "agent_id": "third", "asleep": True})
        with pytest.raises(RPCCallError, match=r"limit of 3 agents \(limits\.max_agents") as refused:
            client.call("agent.start", {"working_dir": project, "agent_id": "fourth", "asleep": True})
        assert refused.value.code == -32000
        assert sorted(rows(client)) == ["awake", "third", "twin"]


def test_agents_start_answers_each_entry_in_place_and_names_the_bad_one(proc: DaemonProcess) -> None:
    project = str(proc.project)
    with proc.client() as client:
        client.call("agent.start", {"working_dir": project, "agent_id": "b0"})
        reply = client.call(
            "agents.start",
            {
                "agents": [
                    {"working_dir": project, "agent_id": "b1"},
                    {"working_dir": "relative", "agent_id": "b2"},
                    {"working_dir": project, "agent_id": "b3", "colour": "red"},
                    "not an object",
                    {"working_dir": project, "agent_id": "b5"},
                    {"working_dir": project, "agent_id": "b6"},
                ]
            },
        )
        results = reply["results"]
        assert [r.get("result") for r in results] == [{"agent_id": "b1"}, None, None, None, {"agent_id": "b5"}, None]
        assert results[1]["error"]["code"] == -32602
        assert results[1]["error"]["message"].startswith(
            "invalid params for agents.start (agents[1]): working_dir: must be an absolute path"
        )
        assert results[1]["error"]["data"] == {"field": "agents[1].working_dir"}
        assert results[2]["error"]["message"] == "invalid params for agents.start (agents[2]): unknown field colour"
        assert results[3]["error"]["data"] == {"field": "agents[3]"}
        # b6 goes over limits.max_agents (3: b0, b1, b5); it alone is refused.
        assert results[5]["error"]["code"] == -32000
        assert "limit of 3 agents" in results[5]["error"]["message"]
        assert sorted(rows(client)) == ["b0", "b1", "b5"]
        # The bound is named.
        with pytest.raises(RPCCallError) as caught:
            client.call("agents.start", {"agents": [{"working_dir": project}] * 1001})
        assert caught.value.code == -32602
        assert "give 1 to 1,000 starts per agents.start request, got 1,001" in caught.value.message
        client.call("agent.stop", {"agent_id": "b0"})
        assert client.start_agents([{"working_dir": project, "agent_id": "b7"}]) == ["b7"]
        assert sorted(rows(client)) == ["b0", "b1", "b5", "b7"]  # b0 is listed stopped


def test_every_acknowledged_asleep_start_is_in_the_store_after_a_kill_9(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path)
    proc.start()
    try:
        model = proc.script("talk", [{"text": "still here"}])
        project = str(proc.project)
        with proc.client() as client:
            batch = [{"working_dir": project, "model": model, "agent_id": f"k{i}"} for i in range(300)]
            pipelined = [
                client.request(
                    "agent.start", {"working_dir": project, "model": model, "agent_id": f"p{i}", "asleep": True}
                )
                for i in range(100)
            ]
            started = client.start_agents(batch, timeout=120)
            started += [future.get(timeout=120)["agent_id"] for future in pipelined]
            # Killed the moment the last start is acknowledged: nothing had time to go to the store after it.
            proc.kill9()
        assert sorted(started) == sorted([f"k{i}" for i in range(300)] + [f"p{i}" for i in range(100)])
        proc.start()
        with proc.client() as client:
            restored = rows(client)
            assert sorted(restored) == sorted(started)
            # Never run, so cleanly asleep: restored asleep, not built (nor counted as restarts).
            assert {row["state"] for row in restored.values()} == {"hibernated"}
            assert {row["restarts"] for row in restored.values()} == {0}
            assert client.call("daemon.status")["hibernated"] == 400
            assert client.call("agent.prompt", {"agent_id": "k299", "text": "hello"})["text"] == "still here"
        assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


def test_with_hibernation_off_a_start_is_awake_unless_asked_asleep_and_stays_awake_once_woken(
    tmp_path: Path,
) -> None:
    proc = DaemonProcess(tmp_path, extra_config="[limits]\nhibernate_after = 0\n")
    proc.start()
    try:
        model = proc.script("talk", [{"text": "hi"}])
        with proc.client() as client:
            client.call("agent.start", {"working_dir": str(proc.project), "model": model, "agent_id": "on"})
            client.call(
                "agent.start", {"working_dir": str(proc.project), "model": model, "agent_id": "z", "asleep": True}
            )
            assert {a: row["state"] for a, row in rows(client).items()} == {"on": "idle", "z": "hibernated"}
            assert client.call("agent.prompt", {"agent_id": "z", "text": "wake"})["text"] == "hi"
            assert rows(client)["z"]["state"] == "idle"
        assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


def test_a_prompt_that_wakes_a_session_which_cannot_start_is_told_why(proc: DaemonProcess) -> None:
    model = proc.script("gone", [{"text": "never said"}])
    with proc.client() as client:
        client.call("agent.start", {"working_dir": str(proc.project), "model": model, "agent_id": "g1"})
        # Its script goes before its first prompt: it was checked at the start, it is read at the wake.
        Path(model.removeprefix("scripted:")).unlink()
        with pytest.raises(RPCCallError) as caught:
            client.call("agent.prompt", {"agent_id": "g1", "text": "hello"}, timeout=30)
        assert caught.value.code == -32000
        assert caught.value.message.startswith("agent 'g1' could not be started to take the prompt: ")
        assert "cannot read script" in caught.value.message
        assert "agent.stop, then agent.start" in caught.value.message


def test_the_whole_tree_and_agent_list_draw_sessions_started_asleep_whose_stubs_nobody_made(
    proc: DaemonProcess,
) -> None:
    # A session added asleep is a row of /sessions until its path is looked up: the uncollapsed
    # tree draws it (and its children) from the supervisor's answer, agent.list from its record.
    model = proc.script("talk", [{"text": "answer"}])
    with proc.client() as client:
        starts = [
            {"working_dir": str(proc.project), "model": model, "agent_id": f"t{n}", "asleep": True} for n in range(3)
        ]
        results = client.call("agents.start", {"agents": starts})["results"]
        assert [entry["result"]["agent_id"] for entry in results] == ["t0", "t1", "t2"]
        assert {agent_id: row["state"] for agent_id, row in rows(client).items()} == {
            "t0": "hibernated",
            "t1": "hibernated",
            "t2": "hibernated",
        }
        tree = client.call("tree", {"path": "/sessions"})
        drawn = {node["path"]: node for node in tree["children"]}
        assert sorted(drawn) == ["/sessions/t0", "/sessions/t1", "/sessions/t2"]
        for agent_id in ("t0", "t1", "t2"):
            node = drawn[f"/sessions/{agent_id}"]
            assert (node["kind"], node["status"]) == ("Supervisor", "hibernated")
            children = {child["path"]: (child["kind"], child["status"]) for child in node["children"]}
            assert children == {
                f"/sessions/{agent_id}/tool_runner": ("ToolRunner", "hibernated"),
                f"/sessions/{agent_id}/agent": ("Agent", "hibernated"),
            }
        assert client.call("agent.prompt", {"agent_id": "t1", "text": "one"})["text"] == "answer"
        assert rows(client)["t1"]["state"] == "idle"
        status = client.call("daemon.status")
        assert (status["agents"], status["hibernated"]) == (3, 2)
