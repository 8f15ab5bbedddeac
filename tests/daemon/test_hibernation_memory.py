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
from weald.runtime import Stub
from weald.runtime.agents.agent import AgentConfig, TurnResult
from weald.runtime.agents.session import SessionConfig, SessionRuntime, agent_path
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
