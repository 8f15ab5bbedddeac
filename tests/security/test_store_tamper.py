"""The store holds no pickle, and a tampered store file cannot make the daemon execute code.

A real daemon fills every namespace it uses (sessions, agents, history,
turns, tasks, memory) and is killed with SIGKILL, so that restarting it reads
all of them (an active agent recovers its turns). Then, for each namespace,
a copy of that store gets a pickle in every value of the namespace: a
payload that, unpickled, would create a marker file. The daemon restarted on
it must run nothing (no marker), and must say clearly what is wrong (the
namespace and "cannot be decoded", in a reply, an event, a tool result or
its log), either serving on or refusing to start.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from daemon_harness import DaemonProcess
from weald.runtime.daemon.client import Client, RPCCallError
from weald.runtime.testing import wait_until

NAMESPACES = ("sessions", "agents", "history", "turns", "tasks", "memory")


class _Payload:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _script() -> list[dict[str, object]]:
    reads = {
        "tool_calls": [
            {"name": "tasks", "arguments": {"action": "list"}},
            {"name": "memory_get", "arguments": {"key": "build"}},
            {"name": "memory_search", "arguments": {"query": "make"}},
        ]
    }
    return [
        {
            "tool_calls": [
                {"name": "tasks", "arguments": {"action": "insert", "title": "write the docs"}},
                {"name": "memory_set", "arguments": {"key": "build", "text": "run make"}},
            ]
        },
        {"text": "noted"},
        reads,
        {"text": "read them"},
        reads,
        {"text": "read them again"},
    ]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store file with every namespace filled, left by a daemon killed with SIGKILL."""
    root = tmp_path_factory.mktemp("template")
    daemon = DaemonProcess(root)
    try:
        daemon.start()
        model = daemon.script("p", _script())
        with daemon.client() as client:
            client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "p"})
            assert client.call("agent.prompt", {"agent_id": "p", "text": "remember"}, timeout=30)["ok"]
        daemon.kill9()
    finally:
        daemon.close()
    with contextlib.closing(sqlite3.connect(root / "store.db")) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert set(NAMESPACES) <= tables, tables
    return root


@attrs.frozen
class Outcome:
    """What the daemon did on the tampered store: did it run, and everything it said."""

    started: bool
    said: str
    marker: Path


def _tamper(store: Path, namespace: str, marker: Path) -> int:
    payload = pickle.dumps(_Payload(marker))
    with contextlib.closing(sqlite3.connect(store)) as conn:
        changed = conn.execute(f'UPDATE "{namespace}" SET value = ?', (payload,)).rowcount
        conn.commit()
    return changed


def _probe(client: Client) -> list[str]:
    said = []
    for method, params in [
        ("agent.list", {}),
        ("agent.history", {"agent_id": "p"}),
        ("tasks.list", {"agent_id": "p"}),  # the session's project (the template's)
        ("agent.prompt", {"agent_id": "p", "text": "read everything", "timeout": 20}),
        ("agent.history", {"agent_id": "p"}),
        ("debug_state", {"events": 500}),
    ]:
        try:
            said.append(json.dumps(client.call(method, params, timeout=30)))
        except RPCCallError as exc:
            said.append(f"{method} error {exc.code}: {exc.message}")
    return said


@pytest.fixture(params=NAMESPACES)
def tampered(request: pytest.FixtureRequest, template: Path, tmp_path: Path) -> Iterator[tuple[str, Outcome]]:
    namespace: str = request.param
    daemon = DaemonProcess(tmp_path)
    # The stored session still names the template's project and script, which outlive the module.
    shutil.copy(template / "store.db", tmp_path / "store.db")
    marker = tmp_path / "PWNED"
    assert _tamper(tmp_path / "store.db", namespace, marker) > 0
    said: list[str] = []
    started = True
    try:
        try:
            daemon.start()
        except AssertionError as exc:  # the daemon exited: how it said why is in the log
            started = False
            said.append(str(exc))
        if started:
            with daemon.client() as client:
                said += _probe(client)
                assert client.call("daemon.status")["pid"] == daemon.proc.pid  # type: ignore[union-attr]
            assert daemon.terminate() == 0
        said.append(daemon.log.read_text())
        # Whitespace normalised: the CLI's console wraps long lines of its log.
        yield namespace, Outcome(started, " ".join(" ".join(said).split()), marker)
    finally:
        daemon.close()


def test_a_pickle_in_any_namespace_is_never_executed_and_is_reported_clearly(tampered: tuple[str, Outcome]) -> None:
    namespace, outcome = tampered
    assert not outcome.marker.exists(), f"the pickle in {namespace} was executed"
    # Every read of the namespace fails as a codec error naming the value, whatever reads it.
    assert f"value of {namespace}/" in outcome.said
    assert "cannot be decoded" in outcome.said
    assert "Traceback" not in outcome.said


def test_the_daemon_itself_never_writes_pickle(template: Path) -> None:
    with contextlib.closing(sqlite3.connect(template / "store.db")) as conn:
        for namespace in NAMESPACES:
            for key, value in conn.execute(f'SELECT key, value FROM "{namespace}"'):
                raw = value if isinstance(value, bytes) else str(value).encode()
                assert not raw.startswith(b"\x80"), f"{namespace}/{key} looks like a pickle"
                json.loads(raw)


def test_one_unreadable_session_record_does_not_keep_the_daemon_from_serving(template: Path, tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path)
    shutil.copy(template / "store.db", tmp_path / "store.db")
    with contextlib.closing(sqlite3.connect(tmp_path / "store.db")) as conn:
        conn.execute("INSERT INTO sessions (key, value) VALUES (?, ?)", ("broken", b"\x80\x04not json"))
        conn.commit()
    try:
        daemon.start()
        with daemon.client() as client:
            wait_until(lambda: client.call("daemon.status")["agents"] >= 1, timeout=10)
    finally:
        daemon.close()


@pytest.mark.parametrize("tampered", ["tasks"], indirect=True)
def test_an_undecodable_task_is_not_reported_as_invalid_params(tampered: tuple[str, Outcome]) -> None:
    _, outcome = tampered
    assert "tasks.list error -32602" not in outcome.said
