"""The observer over real HTTP on loopback, against a real daemon: who is let in, one source of truth, its cost.

The page itself is driven in a real browser in test_observer_browser.py.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemon_harness import DaemonProcess, serving
from observer_harness import StreamReader, split_url
from weald.runtime.testing import wait_until

CONFIG = """
[faults]
enabled = true
[tools.permissions]
shell = "ask"
"""


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon serving the observer on a free loopback port, for the tests of this module."""
    with serving(tmp_path_factory.mktemp("observed"), "--http", "127.0.0.1:0", extra_config=CONFIG) as proc:
        yield proc


def observer_url(daemon: DaemonProcess) -> str:
    with daemon.client() as client:
        url: str = client.call("observer.url")["url"]
    return url


def call(base: str, token: str, method: str, params: dict[str, Any] | None = None, **headers: str) -> Any:
    response = httpx.post(
        f"{base}/api/call",
        json={"method": method, "params": params or {}},
        headers={"Authorization": f"Bearer {token}", **headers},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()


def start_agent(daemon: DaemonProcess, agent_id: str, turns: list[dict[str, Any]]) -> None:
    with daemon.client() as client:
        model = daemon.script(agent_id, turns)
        client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": agent_id})


def http_snapshot(daemon: DaemonProcess) -> dict[str, Any]:
    with daemon.client() as client:
        snapshot: dict[str, Any] = client.call("actor.snapshot", {"path": "/http"})["snapshot"]
    return snapshot


def subscribers(daemon: DaemonProcess) -> int:
    with daemon.client() as client:
        count: int = client.call("debug_state", {"events": 0})["events"]["subscribers"]
    return count


def test_the_observer_lets_in_only_requests_with_the_token_from_its_own_address_and_page(
    observed: DaemonProcess,
) -> None:
    url = observer_url(observed)
    base, token = split_url(url)
    refused_before = http_snapshot(observed)["refused"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", base)
    assert len(token) >= 40

    page = httpx.get(url, timeout=30)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "connect-src 'self'" in policy
    assert page.headers["referrer-policy"] == "no-referrer"
    # One document that loads nothing from anywhere: its script and style are inline, under the policy's nonce.
    nonce = re.search(r"'nonce-([^']+)'", policy)
    assert nonce is not None
    assert f'<script nonce="{nonce.group(1)}">' in page.text
    assert re.findall(r"""(?:src|href)\s*=\s*["']?(?!data:)[a-z]+:""", page.text) == []

    refused = [
        httpx.get(base + "/", timeout=30),
        httpx.get(base + "/?token=" + "x" * len(token), timeout=30),
        httpx.post(f"{base}/api/call", json={"method": "tree"}, timeout=30),
        httpx.get(f"{base}/api/stream", headers={"Authorization": "Bearer nope"}, timeout=30),
    ]
    assert [r.status_code for r in refused] == [401, 401, 401, 401]
    assert "weald observe" in refused[0].text
    port = base.rsplit(":", 1)[1]
    rebound = httpx.post(
        f"{base}/api/call",
        json={"method": "tree"},
        headers={"Authorization": f"Bearer {token}", "Host": f"attacker.example:{port}"},
        timeout=30,
    )
    assert rebound.status_code == 403
    assert "Host" in rebound.text
    other = httpx.post(
        f"{base}/api/call",
        json={"method": "tree"},
        headers={"Authorization": f"Bearer {token}", "Origin": "http://attacker.example"},
        timeout=30,
    )
    assert other.status_code == 403
    assert "attacker.example" in other.text
    own = call(base, token, "daemon.status", Origin=base)
    assert own["result"]["pid"] == observed.proc.pid  # type: ignore[union-attr]

    # The page calls the observer's methods only; the rest of the API stays on the socket.
    refused_method = call(base, token, "agent.start", {"working_dir": str(observed.project)})
    assert refused_method["error"]["code"] == -32601
    assert "agent.start" in refused_method["error"]["message"]
    snapshot = http_snapshot(observed)
    assert snapshot["refused"] == refused_before + 6
    assert snapshot["viewers"] == 0


def test_what_the_observer_shows_is_what_the_json_rpc_methods_answer(observed: DaemonProcess) -> None:
    base, token = split_url(observer_url(observed))
    start_agent(observed, "same", [{"text": "hello"}])
    with observed.client() as client:
        client.call("agent.prompt", {"agent_id": "same", "text": "hi"}, timeout=60)
        for method, params in [
            ("agent.list", {}),
            ("agent.history", {"agent_id": "same"}),
            ("tasks.list", {"working_dir": str(observed.project)}),
            ("permission.list", {}),
            ("tree", {"path": "/sessions/same", "depth": 1}),
            ("tree", {"depth": "deep"}),  # the same error, from the same checks
            ("actor.snapshot", {"path": "/nowhere"}),
        ]:
            over_http = call(base, token, method, params)
            try:
                over_socket = {"result": client.call(method, params)}
            except Exception as exc:
                over_socket = {"error": {"code": exc.code, "message": exc.message}}  # type: ignore[attr-defined]
            assert over_http == over_socket, method


def test_nobody_watching_costs_nothing_and_a_viewer_gets_bounded_coalesced_updates(observed: DaemonProcess) -> None:
    base, token = split_url(observer_url(observed))
    idle = subscribers(observed)
    agents = [f"busy{i}" for i in range(4)]
    turns = [
        {"text": "Looking.", "tool_calls": [{"name": "glob", "arguments": {"pattern": "*"}}]},
        {"text": "Reading.", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"text": "Done looking around: notes.txt has three lines."},
    ]
    with StreamReader(base, token) as stream:
        assert subscribers(observed) == idle + 1
        for agent in agents:
            start_agent(observed, agent, turns)
        with observed.client() as client:
            pending = [client.request("agent.prompt", {"agent_id": a, "text": "look"}) for a in agents]
            results = [p.get(timeout=120) for p in pending]
        assert all(r["ok"] for r in results), results

        def turns_seen() -> bool:
            ends = {e["data"].get("agent_id") for e in stream.events() if e["topic"] == "agent.turn_end"}
            return set(agents) <= ends

        wait_until(turns_seen, timeout=30, message="every turn's end on the stream")
        wait_until(
            lambda: set(agents) <= {a for m in stream.named("sessions") for a in m["changed"] or ()},
            timeout=30,
            message="the sessions messages to name the busy sessions",
        )
        wait_until(lambda: len(stream.named("metrics")) >= 2, timeout=30, message="two metrics messages")
    # The stream is gone, and so is its subscription.
    wait_until(lambda: subscribers(observed) == idle, timeout=30, message="the viewer's subscription to end")

    lasted = stream.closed - stream.opened
    events = stream.events()
    topics = {e["topic"] for e in events}
    assert {"tool.started", "tool.finished", "agent.turn_end"} <= topics
    # Text deltas and tool output only of the agent the viewer watches (none here).
    assert not topics & {"agent.message_delta", "tool.output"}
    # Coalesced: at most one tree every 250 ms, one batch of events every 50 ms, one sessions message every
    # 250 ms and one metrics message a second, over the stream's whole life.
    trees = stream.views("tree")
    batches = stream.named("events")
    assert 1 <= len(trees) <= lasted / 0.25 + 1, (len(trees), lasted)
    assert len(batches) <= lasted / 0.05 + 1, (len(batches), lasted)
    assert len(stream.named("sessions")) <= lasted / 0.25 + 1
    assert len(stream.named("metrics")) <= lasted + 1
    assert len(events) > 2 * len(batches)
    # The tree is the daemon's own part, the sessions one collapsed node: the busy agents did not redraw it.
    sessions_node = next(n for n in trees[-1]["result"]["children"] if n["path"] == "/sessions")
    assert sessions_node["children"] == []
    assert sessions_node["children_hidden"] >= len(agents)
    # Each view is sent again only when it changed.
    encoded = [repr(view) for view in trees]
    assert all(a != b for a, b in itertools.pairwise(encoded))
    assert all(batch["dropped"] == 0 for batch in batches)
    # The metrics: the hello has every series so far, each message only the samples after.
    hello = stream.named("hello")[0]
    assert [s["name"] for s in hello["metrics"]["series"]][:2] == ["rss_bytes", "loop_lag_ms"]
    nexts = [hello["metrics"]["next"]] + [m["next"] for m in stream.named("metrics")]
    assert nexts == sorted(nexts)
    assert all(len(m["t"]) == m["next"] - previous for m, previous in zip(stream.named("metrics"), nexts, strict=False))


def test_a_viewer_watching_an_agent_gets_its_text_as_it_streams(observed: DaemonProcess) -> None:
    base, token = split_url(observer_url(observed))
    start_agent(observed, "watched", [{"text": "streamed to the watcher"}])
    start_agent(observed, "unwatched", [{"text": "not streamed to anyone"}])
    with StreamReader(base, token) as stream, observed.client() as client:
        stream_id = stream.named("hello")[0]["stream"]
        watch = httpx.post(
            f"{base}/api/watch",
            json={"stream": stream_id, "agent_id": "watched"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ).json()
        assert watch == {"result": {"stream": stream_id, "agent_id": "watched"}}
        for agent in ("watched", "unwatched"):
            assert client.call("agent.prompt", {"agent_id": agent, "text": "go"}, timeout=60)["ok"]
        wait_until(
            lambda: (
                {e["source"] for e in stream.events() if e["topic"] == "agent.turn_end"}
                >= {"/sessions/watched/agent", "/sessions/unwatched/agent"}
            ),
            timeout=30,
            message="both turns' ends",
        )
    deltas = [e for e in stream.events() if e["topic"] == "agent.message_delta"]
    assert "".join(e["data"]["text"] for e in deltas) == "streamed to the watcher"
    assert {e["source"] for e in deltas} == {"/sessions/watched/agent"}
    unknown = httpx.post(
        f"{base}/api/watch", json={"stream": "gone", "agent_id": None}, headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert unknown["error"]["code"] == -32001
    refused = httpx.post(f"{base}/api/watch", json={"stream": stream_id, "agent_id": None}, timeout=30)
    assert refused.status_code == 401


def test_a_permission_request_is_live_on_the_stream_and_answered_through_the_observer(observed: DaemonProcess) -> None:
    base, token = split_url(observer_url(observed))
    start_agent(
        observed,
        "asker",
        [
            {"text": "Running it.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo from-the-page"}}]},
            {"text": "It printed from-the-page."},
        ],
    )
    with StreamReader(base, token) as stream, observed.client() as client:
        pending = client.request("agent.prompt", {"agent_id": "asker", "text": "go"})

        def request_shown() -> list[dict[str, Any]]:
            views = stream.views("permissions")
            return views[-1]["result"] if views and views[-1]["result"] else []

        requests = wait_until(request_shown, timeout=60, message="the permission request on the stream")
        assert requests[0]["agent_id"] == "asker"
        assert requests[0]["subject"] == "echo from-the-page"
        assert requests[0]["reason"]
        answer = call(base, token, "permission.respond", {"request_id": requests[0]["request_id"], "decision": "allow"})
        assert answer == {"result": {"ok": True}}
        result = pending.get(timeout=60)
        assert result["ok"], result
        history = client.call("agent.history", {"agent_id": "asker"})["messages"]
        assert any(m["role"] == "tool" and "from-the-page" in m["content"] and not m["is_error"] for m in history)
        wait_until(lambda: stream.views("permissions")[-1]["result"] == [], timeout=30, message="the request to go")
        again = call(base, token, "permission.respond", {"request_id": requests[0]["request_id"], "decision": "deny"})
        assert again["error"]["code"] == -32001


def test_weald_observe_prints_the_address_with_its_token(observed: DaemonProcess) -> None:
    url = observer_url(observed)
    run = observed.cli("observe", "--no-browser")
    assert run.returncode == 0, run.stderr
    assert run.stdout == url + "\n"
    as_json = observed.cli("observe", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == {"url": url}


def test_weald_observe_says_how_to_serve_the_observer_when_the_daemon_serves_none(daemon: DaemonProcess) -> None:
    run = daemon.cli("observe", "--no-browser")
    assert run.returncode == 1
    assert run.stdout == ""
    assert "weald serve --http 127.0.0.1:8765" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_observer_refuses_an_address_other_than_loopback_unless_allowed(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--http", "0.0.0.0:0"],
        env=proc.env(),
        cwd=proc.project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    assert "loopback only" in run.stderr
    assert "http_remote" in run.stderr
    assert "Traceback" not in run.stderr
    assert not proc.socket.exists()


def test_weald_serve_refuses_an_http_address_that_is_not_host_port_before_starting(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path)
    run = proc.cli("serve", "--http", "8765")
    assert run.returncode == 2
    assert run.stderr.strip() == (
        'weald serve: --http: expected "HOST:PORT", like "127.0.0.1:8765" (port 0 picks a free one), got "8765"'
    )
