"""The front door of a real daemon: bad frames on a busy connection, duplicate ids, the connection limit, history limits.

Each test drives a real ``weald serve`` over its Unix socket. The floods
(descriptor exhaustion under ``prlimit``, unfinished lines against the input
budget) are in ``tests/reliability/test_front_floods.py``.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

import msgspec
import pytest
from daemon_harness import DaemonProcess, collect_until
from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError
from weald.runtime.testing import wait_until


def _unmatched(notes: list[tuple[str, Any]]) -> list[Any]:
    return [n[1] for n in notes if n[0] == "_unmatched"]


def _line(payload: Any) -> bytes:
    return msgspec.json.encode(payload) + b"\n"


def _turn_ends(notes: list[tuple[str, Any]]) -> list[tuple[str, int]]:
    """(subscription, event seq) of each ``agent.turn_end`` event notification."""
    return [
        (n[1]["subscription"], n[1]["event"]["seq"])
        for n in notes
        if n[0] == "event" and n[1]["event"]["topic"] == "agent.turn_end"
    ]


def test_bad_frames_on_a_busy_connection_get_their_errors_and_lose_nothing_in_flight(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    slow = d.script("slow", [{"text": "slow answer", "delay": 1.5}, {"text": "second answer", "delay": 0.2}])
    try:
        d.start()
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": slow, "agent_id": "slow"})
            # Two identical notifications: each is handled (two subscriptions, each told of the turn's end).
            subscribe = {"jsonrpc": "2.0", "method": "events.subscribe", "params": {"topics": ["agent.turn_*"]}}
            c.send_raw(_line(subscribe) + _line(subscribe))
            prompt = c.request("agent.prompt", {"agent_id": "slow", "text": "take your time"})
            collect_until(c, lambda ns: sum(1 for n in ns if n[0] == "event") >= 2)  # the turn started (twice told)

            # Invalid UTF-8 inside a JSON string: -32700, and the connection carries on.
            c.send_raw(b'{"jsonrpc": "2.0", "id": "u", "method": "daemon.status", "x": "caf\xe9"}\n')
            # Two requests with the same id, both in flight (the agent is busy): the second is
            # refused, the first goes on.
            again = {"jsonrpc": "2.0", "id": "p", "method": "agent.prompt", "params": {"agent_id": "slow", "text": "x"}}
            c.send_raw(_line(again) + _line(again))
            # A batch with an id twice: one result, one refusal.
            c.send_raw(_line([{"jsonrpc": "2.0", "id": "b", "method": "agent.list"}] * 2))

            assert prompt.get(timeout=30)["text"] == "slow answer"
            notes = collect_until(
                c,
                lambda ns: (
                    any(isinstance(m, dict) and m.get("id") == "p" for m in _unmatched(ns))
                    and _told_twice(_turn_ends(ns))
                ),
                timeout=30,
            )
            replies = _unmatched(notes)  # the client hands on each reply of a batch on its own
            assert c.call("daemon.status")["connections"] == 1  # the same connection, still served
    finally:
        d.close()

    parse_errors = [r for r in replies if r.get("error", {}).get("code") == -32700]
    assert len(parse_errors) == 1, replies
    assert parse_errors[0]["id"] is None
    assert "not valid UTF-8" in parse_errors[0]["error"]["message"]

    duplicates = {r["error"]["data"]["id"]: r for r in replies if r.get("error", {}).get("code") == -32600}
    assert sorted(duplicates) == ["b", "p"], replies
    for request_id, refusal in duplicates.items():
        assert refusal["id"] is None  # never to be taken for the reply of the request in flight
        assert f"id {request_id!r} is already in flight on this connection" in refusal["error"]["message"]
    firsts = {r["id"]: r for r in replies if r.get("id") is not None}
    assert sorted(firsts) == ["b", "p"], replies
    assert firsts["p"]["result"]["ok"] is True
    assert isinstance(firsts["b"]["result"], list)  # agent.list, once

    # Both subscriptions were made: two subscriptions told of the same event.
    assert _told_twice(_turn_ends(notes))


def _told_twice(ends: list[tuple[str, int]]) -> bool:
    """Some event reached two different subscriptions."""
    seen: dict[int, set[str]] = {}
    for subscription, seq in ends:
        seen.setdefault(seq, set()).add(subscription)
    return any(len(subscriptions) == 2 for subscriptions in seen.values())


def test_an_id_in_flight_is_free_again_once_its_reply_is_sent(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    try:
        d.start()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(d.socket))
            sock.settimeout(30)
            with sock.makefile("rb") as reader:
                for _ in range(3):
                    sock.sendall(_line({"jsonrpc": "2.0", "id": 7, "method": "agent.list"}))
                    reply = msgspec.json.decode(reader.readline())
                    assert reply == {"jsonrpc": "2.0", "id": 7, "result": []}
    finally:
        d.close()


def test_agent_history_refuses_a_negative_limit_and_limit_0_gives_no_messages(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    model = d.script("talk", [{"text": "one"}, {"text": "two"}])
    try:
        d.start()
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "a"})
            for text in ("first", "second"):
                assert c.call("agent.prompt", {"agent_id": "a", "text": text})["ok"]
            for live in (True, False):
                with pytest.raises(RPCCallError) as refused:
                    c.call("agent.history", {"agent_id": "a", "limit": -1})
                assert refused.value.code == -32602
                assert "invalid params for agent.history: limit: expected int >= 0" in refused.value.message
                everything = c.call("agent.history", {"agent_id": "a"})["messages"]
                assert [m["content"] for m in everything if m["role"] == "assistant"] == ["one", "two"]
                assert c.call("agent.history", {"agent_id": "a", "limit": None})["messages"] == everything
                assert c.call("agent.history", {"agent_id": "a", "limit": 0})["messages"] == []
                assert c.call("agent.history", {"agent_id": "a", "limit": 1})["messages"] == everything[-1:]
                assert c.call("agent.history", {"agent_id": "a", "limit": 100})["messages"] == everything
                if live:  # the same from the store, once the agent is stopped
                    assert c.call("agent.stop", {"agent_id": "a"}) == {"stopped": True}
            with pytest.raises(RPCCallError) as unknown:
                c.call("agent.history", {"agent_id": "nobody", "limit": 0})
            assert unknown.value.code == -32001
    finally:
        d.close()


def test_one_connection_over_max_connections_is_told_the_limit_and_closed(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config="[limits]\nmax_connections = 2\n")
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(d.close)
        d.start()
        first = cleanup.enter_context(d.client())
        # The harness's own start-up connection may not be closed on the daemon's side yet.
        wait_until(
            lambda: first.call("daemon.status")["connections"] == 1,
            timeout=30,
            message="the harness's start-up connection to close",
        )
        second = cleanup.enter_context(d.client())
        assert second.call("daemon.status")["connections"] == 2
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(d.socket))
            raw.settimeout(30)
            # Nothing is sent: the daemon may refuse and close before a request could arrive.
            with raw.makefile("rb") as reader:
                lines = reader.read().splitlines()  # the refusal, then the end of the stream
        assert len(lines) == 1, lines
        refusal = msgspec.json.decode(lines[0])
        assert refusal["id"] is None
        assert refusal["error"]["code"] == -32003
        assert "serves at most 2 at once (limits.max_connections)" in refusal["error"]["message"]
        assert refusal["error"]["data"] == {"limit": "limits.max_connections", "value": 2}
        # The client library says why the daemon closed the connection.
        with Client.connect(d.socket) as third, pytest.raises(DaemonUnavailableError, match=r"limits\.max_connections"):
            third.call("daemon.status", timeout=30)
        first.close()

        def served() -> bool:
            try:
                with Client.connect(d.socket) as again:
                    status = again.call("daemon.status", timeout=30)
            except DaemonUnavailableError:
                return False
            assert status["front"]["refused"]["max_connections"] >= 2
            assert status["front"]["max_connections"] == 2
            return True

        wait_until(served, timeout=30, message="a place to free once a client closed its connection")
        assert second.call("daemon.status")["pid"] == d.proc.pid  # type: ignore[union-attr]
        second.close()
        assert d.terminate() == 0
