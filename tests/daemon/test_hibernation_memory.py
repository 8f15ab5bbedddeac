"""What a session keeps once it hibernated after a turn: its stub, nothing of its running self.

In one process (an embedded daemon), so the objects left can be counted:
a woken-then-hibernated session must cost what a session restored asleep
costs, not more (benchmarks/README.md, round 4: the leaks found).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from weald.runtime import Store, Stub
from weald.runtime.agents.agent import AgentConfig, TurnResult
from weald.runtime.agents.session import SessionConfig, SessionRuntime, agent_path
from weald.runtime.daemon import tree as tree_module
from weald.runtime.daemon.config import parse_config
from weald.runtime.daemon.tree import Daemon
from weald.runtime.testing import WaitTimeout, wait_until
from weald.supervisors import ChildSpec

SESSIONS = 20


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    config = parse_config(f'[store]\npath = "{tmp_path / "store.db"}"\n[limits]\nhibernate_after = 0.2\n')
    with Daemon(config) as running:
        yield running


def asleep(daemon: Daemon, agent_id: str) -> bool:
    ref = daemon.system.whereis(f"/sessions/{agent_id}")
    return isinstance(ref, Stub) and ref.successor is None


def live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def holders(kind: type) -> str:
    """What refers to the objects of ``kind`` still alive (for a failure's message)."""
    gc.collect()
    found = [o for o in gc.get_objects() if type(o) is kind]
    lines = []
    for obj in found[:2]:
        for referrer in gc.get_referrers(obj):
            if referrer is not found:
                lines.append(f"{type(referrer).__name__}: {repr(referrer)[:160]}")
    return "; ".join(lines)


def test_a_session_hibernated_after_a_turn_leaves_one_stub_and_no_registry_entry_below_it(
    daemon: Daemon, tmp_path: Path
) -> None:
    sessions = daemon.sessions
    assert sessions is not None
    project = tmp_path / "project"
    project.mkdir()
    ids = [f"s{i}" for i in range(SESSIONS)]

    async def start_and_prompt() -> None:
        for agent_id in ids:
            await sessions.start(str(project), agent_id=agent_id)
            result = await sessions.prompt_nowait(agent_id, "hello")
            assert result.ok, result

    daemon.system.loop.run(start_and_prompt)
    wait_until(lambda: all(asleep(daemon, i) for i in ids), timeout=60)
    # Only the sessions' own paths: the agent's end looked its path up (to hand
    # on what it held, which was nothing) and left a stub registered there, for
    # good, one per session.
    assert daemon.system.registered("/sessions/") == sorted(f"/sessions/{i}" for i in ids)
    assert live(Stub) == SESSIONS


def test_a_sleeping_session_keeps_its_record_not_its_spec_and_configuration(daemon: Daemon, tmp_path: Path) -> None:
    sessions = daemon.sessions
    assert sessions is not None
    project = tmp_path / "project"
    project.mkdir()
    ids = [f"s{i}" for i in range(SESSIONS)]
    daemons_own = live(ChildSpec)  # the tree's (/mcp, /sessions)

    async def start_and_prompt() -> None:
        for agent_id in ids:
            await sessions.start(str(project), agent_id=agent_id)
            assert (await sessions.prompt_nowait(agent_id, "hello")).ok

    daemon.system.loop.run(start_and_prompt)
    wait_until(lambda: all(asleep(daemon, i) for i in ids), timeout=60)

    # Its spec, the configuration objects and the runtime in it are made
    # again at the wake (ChildSpec.rebuild); asleep, none is held. What stays
    # is the project's: its turn settings (an AgentConfig), shared by all of
    # its sessions, awake or asleep, so their number does not grow with them.
    # The last sessions' stubs are registered while their actors' threads still
    # unwind, so the count is awaited (a second at most), not taken at once.
    def held() -> tuple[int, int, int]:
        return (live(ChildSpec) - daemons_own, live(SessionConfig), live(SessionRuntime))

    try:
        wait_until(lambda: held() == (0, 0, 0), timeout=10, interval=0.05)
    except WaitTimeout:
        pytest.fail(f"asleep, still held (spec, config, runtime): {held()}; {holders(SessionConfig)}")
    assert live(AgentConfig) <= 2 < SESSIONS

    async def prompt_again() -> tuple[TurnResult, tuple[int, ...]]:
        result = await sessions.prompt_nowait("s3", "again")
        # Counted on the loop before it runs anything else: the session cannot
        # start hibernating again (0.2 s idle) between its answer and the count.
        return result, (live(ChildSpec) - daemons_own, live(SessionConfig), live(SessionRuntime), live(AgentConfig))

    result, counts = daemon.system.loop.run(prompt_again)
    assert result.ok
    # Awake again: one session's spec (and its three children's), configuration and runtime;
    # its SessionConfig's AgentConfig beside the project's shared one.
    assert counts == (4, 1, 1, 2)

    async def snapshot() -> Any:
        agent = daemon.system.whereis(agent_path("s3"))
        assert agent is not None
        return await agent.proxy().snapshot(10)

    history = daemon.system.loop.run(snapshot)
    assert [m.content for m in history.messages if m.role == "user"] == ["hello", "again"]


def test_sessions_started_asleep_hold_no_stub_until_a_path_of_theirs_is_looked_up(
    daemon: Daemon, tmp_path: Path
) -> None:
    # A session added asleep is its record and a row of /sessions' (no Stub, stub group, signals,
    # wake-up closure or registry entry): a million of them fit in a daemon (benchmarks/README.md).
    sessions = daemon.sessions
    assert sessions is not None
    system = daemon.system
    project = tmp_path / "project"
    project.mkdir()
    ids = [f"z{i}" for i in range(SESSIONS)]

    async def start() -> list[Any]:
        return await sessions.start_all([{"working_dir": str(project), "agent_id": i, "asleep": True} for i in ids])

    assert system.loop.run(start) == ids
    assert live(Stub) == 0
    assert system.registered("/sessions/") == []
    # Whether each sleeps is answered without making its stub (agent.list asks so).
    assert {system.asleep(f"/sessions/{i}") for i in ids} == {"hibernated"}
    assert live(Stub) == 0
    # Its agent's path makes the session's stub and the agent's, which a message wakes.
    agent = system.whereis(agent_path("z3"))
    assert isinstance(agent, Stub)
    assert system.registered("/sessions/") == ["/sessions/z3", "/sessions/z3/agent"]

    async def prompt() -> TurnResult:
        return await sessions.prompt_nowait("z3", "hello")

    assert system.loop.run(prompt).ok
    assert system.asleep("/sessions/z3") is None
    assert [path for path in system.registered("/sessions/") if not path.startswith("/sessions/z3")] == []


def test_a_restart_reads_the_sessions_a_page_at_a_time_and_restores_them_asleep_in_start_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A million sessions are read a page of rows at a time (three here), not all at once; one
    # record that does not decode is reported and skipped; the others come back asleep, in the
    # order they were started (not their keys').
    monkeypatch.setattr(tree_module, "_RECORD_PAGE", 3)
    pages: list[tuple[str, int]] = []
    scan_range = Store.scan_range

    def counted(self: Store, namespace: str, *args: Any, **kwargs: Any) -> Any:
        good, bad = scan_range(self, namespace, *args, **kwargs)
        pages.append((namespace, len(good) + len(bad)))
        return good, bad

    monkeypatch.setattr(Store, "scan_range", counted)
    config = parse_config(f'[store]\npath = "{tmp_path / "store.db"}"\n[limits]\nhibernate_after = 0.2\n')
    project = tmp_path / "project"
    project.mkdir()
    ids = ["p5", "p3", "p9", "p1", "p7", "p2", "p8"]
    with Daemon(config) as first:
        sessions = first.sessions
        assert sessions is not None

        async def start() -> None:
            for agent_id in ids:
                await sessions.start(str(project), agent_id=agent_id, asleep=True)

        first.system.loop.run(start)
        first.system.store.put("sessions", "p4", {"session_id": "p4"})  # not a record: no working_dir
    pages.clear()
    with Daemon(config) as second:
        supervisor = second.system.whereis("/sessions")
        assert supervisor is not None
        infos = supervisor.proxy().which_children().get(timeout=10)
        assert [(info.id, info.status) for info in infos] == [(agent_id, "hibernated") for agent_id in ids]
        bad = second.system.events.recent(10, topic="daemon.bad_session_record")
        assert {event.data["session_id"] for event in bad} == {"p4"}  # (the spill sweep at the start reads them too)
        # The sessions' 8 records and the agents' 7, three at a time.
        assert [n for namespace, n in pages if namespace == "sessions"] == [3, 3, 2]
        assert [n for namespace, n in pages if namespace == "agents"] == [3, 3, 1]
        restored = second.sessions
        assert restored is not None
        assert all(isinstance(info.ref, Stub) for info in infos)

        async def prompt() -> TurnResult:
            return await restored.prompt_nowait("p7", "hello")

        assert second.system.loop.run(prompt).ok
