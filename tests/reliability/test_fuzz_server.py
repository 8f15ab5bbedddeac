"""Fuzzing the JSON-RPC server of one real daemon: garbage and wrong requests never take it down.

One `weald serve` subprocess serves the whole module (started once: fuzzing
is about what the server does with input, not about start-up). After every
example the connection must still answer a probe, the daemon must have the
same pid, and every reply must be a JSON-RPC response; no request may get an
internal error (-32603, an unhandled exception in the daemon).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from daemon_harness import DaemonProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rel_fuzz import INVALID_REQUEST, PARSE_ERROR, FuzzClient, method_table
from rel_strategies import fault_declarations, fuzz_methods, json_values, raw_lines, wrong_requests
from weald.runtime.daemon.client import Client, RPCCallError
from weald.runtime.faults import FaultSpecError, fault_from_dict

_FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon for the module, with one scripted agent ("fz") for requests that name a real agent."""
    daemon = DaemonProcess(tmp_path_factory.mktemp("fuzz"))
    daemon.start()
    model = daemon.script("fz", [{"text": f"answer {i}"} for i in range(2000)])
    try:
        with daemon.client() as client:
            client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "fz"})
        yield daemon
    finally:
        daemon.close()


@pytest.fixture(scope="module")
def connection(fuzzed: DaemonProcess) -> Iterator[FuzzClient]:
    """One connection for every example: it must carry on after each."""
    with FuzzClient(fuzzed.socket) as client:
        yield client


def _pid(daemon: DaemonProcess) -> int:
    assert daemon.proc is not None
    return daemon.proc.pid


def _check(client: FuzzClient, daemon: DaemonProcess) -> None:
    assert client.probe()["pid"] == _pid(daemon)
    assert not client.problems, "\n".join(client.problems[:10])


def test_the_fuzzed_methods_are_every_method_of_the_server() -> None:
    assert len(method_table()) >= 23
    assert {"agent.start", "agent.prompt", "debug_state", "events.subscribe", "daemon.stop"} <= set(method_table())


@settings(_FUZZ, max_examples=200)
@given(line=raw_lines)
def test_random_bytes_get_an_error_and_the_connection_carries_on(
    connection: FuzzClient, fuzzed: DaemonProcess, line: bytes
) -> None:
    connection.exchange(line)
    _check(connection, fuzzed)


@settings(_FUZZ, max_examples=600)
@given(data=st.data())
def test_wrong_params_ids_and_versions_in_every_method_get_the_documented_error(
    connection: FuzzClient, fuzzed: DaemonProcess, data: st.DataObject
) -> None:
    method = data.draw(st.sampled_from(fuzz_methods()), label="method")
    request = data.draw(wrong_requests(method), label="request")
    connection.exchange(msgspec.json.encode(request), request, what=f"{request!r:.300}")
    _check(connection, fuzzed)


@settings(_FUZZ, max_examples=80)
@given(batch=st.lists(st.sampled_from(fuzz_methods()).flatmap(wrong_requests) | json_values, min_size=1, max_size=6))
def test_batches_of_wrong_requests_get_a_batch_of_replies(
    connection: FuzzClient, fuzzed: DaemonProcess, batch: list[object]
) -> None:
    reply = connection.exchange(msgspec.json.encode(batch), batch, what=f"batch {batch!r:.300}")
    if reply is not None:
        assert len(reply) >= sum(1 for r in batch if isinstance(r, dict) and "id" in r and r.get("jsonrpc") == "2.0")
    _check(connection, fuzzed)


@settings(_FUZZ, max_examples=40)
@given(cuts=st.lists(st.integers(1, 60), min_size=1, max_size=6), request_id=st.integers(1, 10**9))
def test_a_request_sent_in_pieces_is_answered(
    connection: FuzzClient, fuzzed: DaemonProcess, cuts: list[int], request_id: int
) -> None:
    request = {"jsonrpc": "2.0", "id": request_id, "method": "agent.list", "params": {}}
    data = msgspec.json.encode(request)
    start = 0
    for cut in sorted(set(cuts)):
        connection.send(data[start:cut])
        start = max(start, cut)
    reply = connection.exchange(data[start:], request)
    assert isinstance(reply["result"], list)
    _check(connection, fuzzed)


def test_huge_lines_and_floods_of_newlines_leave_the_connection_working(
    connection: FuzzClient, fuzzed: DaemonProcess
) -> None:
    connection.send(b"\n" * 200_000 + b"\r\n \t\n" * 1000)  # blank lines: nothing to answer
    _check(connection, fuzzed)
    connection.send(b"x" * (16 * 1024 * 1024 + 100) + b"\n")
    too_large = connection.next_error(INVALID_REQUEST, "a line over 16 MB")
    assert "message too large" in too_large["error"]["message"]
    cut_off = b'{"jsonrpc": "2.0", "id": 5, "method": "agent.list", "params": {"x": "' + b"y" * (8 * 1024 * 1024)
    connection.send(cut_off + b"\n")
    assert connection.next_error(PARSE_ERROR, "an 8 MB request cut off")["id"] is None
    _check(connection, fuzzed)


def test_daemon_stop_with_wrong_params_is_refused_and_stops_nothing(
    connection: FuzzClient, fuzzed: DaemonProcess
) -> None:
    request = {"jsonrpc": "2.0", "id": "stop-1", "method": "daemon.stop", "params": {"now": True}}
    reply = connection.exchange(msgspec.json.encode(request), request)
    assert reply["error"]["code"] == -32602
    _check(connection, fuzzed)


def test_a_prompt_with_a_negative_timeout_is_refused_and_starts_no_turn(fuzzed: DaemonProcess) -> None:
    model = fuzzed.script("neg", [{"text": "should not run"}])
    with fuzzed.client() as client:
        client.call("agent.start", {"working_dir": str(fuzzed.project), "model": model, "agent_id": "neg"})
        _, refused = _call(client, "agent.prompt", {"agent_id": "neg", "text": "now", "timeout": -1})
        assert refused is not None
        assert refused.code == -32602
        assert client.call("agent.history", {"agent_id": "neg"})["messages"] == []


def test_deeply_nested_json_gets_a_parse_error_and_the_connection_carries_on(fuzzed: DaemonProcess) -> None:
    with FuzzClient(fuzzed.socket) as client:
        reply = client.exchange(b"[" * 100_000, ...)
        assert reply is None
        _check(client, fuzzed)


@pytest.fixture(scope="module")
def fault_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon with fault injection on and no agents: what fault.inject accepts can harm nothing."""
    daemon = DaemonProcess(tmp_path_factory.mktemp("faults"), extra_config="[faults]\nenabled = true\n")
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()


@settings(_FUZZ, max_examples=150)
@given(declaration=fault_declarations())
def test_fault_inject_refuses_every_wrong_declaration_naming_each_problem(
    fault_daemon: DaemonProcess, declaration: dict[str, object]
) -> None:
    try:
        fault_from_dict(declaration)
        problems = None
    except FaultSpecError as exc:
        problems = exc.problems
    with fault_daemon.client() as client:
        result, refused = _call(client, "fault.inject", {"fault": declaration})
        listed = client.call("fault.list", timeout=10)
        assert client.call("daemon.status")["pid"] == _pid(fault_daemon)
    if problems is not None:
        assert refused is not None, f"accepted {declaration!r}, which the spec refuses: {problems}"
        assert refused.code == -32602
        assert len(refused.data["problems"]) == len(problems)  # each problem named, with its key path
    elif refused is not None:
        assert (refused.code, "already injected" in refused.message) == (-32602, True)  # only a taken id
    else:
        assert isinstance(result["id"], str)
    assert listed["statistics"]["active"] == len(listed["faults"])


def _call(client: Client, method: str, params: dict[str, object]) -> tuple[Any, RPCCallError | None]:
    """The result of a call, or the error it got."""
    try:
        return client.call(method, params, timeout=10), None
    except RPCCallError as exc:
        return None, exc


def test_the_daemon_survived_the_fuzzing_with_the_same_pid(connection: FuzzClient, fuzzed: DaemonProcess) -> None:
    assert fuzzed.proc is not None
    assert fuzzed.proc.poll() is None
    with fuzzed.client() as client:
        status = client.call("daemon.status", timeout=10)
    assert status["pid"] == _pid(fuzzed)
    assert connection.sent > 300
    assert connection.answered == connection.due  # every request owed an answer got one
    log = Path(fuzzed.log).read_text()
    assert "Traceback" not in log, log[-3000:]
