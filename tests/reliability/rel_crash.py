"""kill -9 cycles: a real daemon killed at seeded random points of a write-heavy run, then checked.

Each agent's scripted model alternates a ``tasks`` call inserting a batch
of tasks (with long notes) and a long answer, so the run writes histories,
turns, agent records and tasks as fast as it can. Client threads (one
connection per agent) prompt their agents one turn after another; another
thread starts new agents meanwhile. Once the clients have been told of a
seeded random number of turns, the daemon gets SIGKILL, wherever its writes
then are. Then, before anything else touches the file:

- ``store_opens``: `Store` opens it (no `StoreCorruptError`) and
  ``PRAGMA integrity_check`` says ``ok`` (on PostgreSQL, ``store_url``: the
  store opens and reads every namespace);
- ``acknowledged_agents``: every agent whose ``agent.start`` was answered
  has its session record;
- ``acknowledged_turns``: every turn answered ``ok`` has all its messages in
  the ``history`` namespace, in order (prompt, the call, its result, the
  answer the client got), and its turn record says ``done``;
- ``acknowledged_tasks``: every task a stored ``tasks`` result of those turns
  reported as added is listed by ``list_tasks``.

"Acknowledged" is what the client was told before the daemon died: a reply
that reached it, and nothing else. The daemon is then restarted, must
restore every acknowledged agent (``restored``), and the next cycle goes on
from there. A last clean stop is checked the same way.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
from daemon_harness import DaemonProcess
from rel_chaos import InvariantCheck
from weald.runtime import Store
from weald.runtime.agents.agent import HistoryEntry, TurnRecord
from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError
from weald.runtime.testing import wait_until
from weald.tools.tasks import list_tasks, scope_for_project

CRASH_INVARIANTS = ("store_opens", "acknowledged_agents", "acknowledged_turns", "acknowledged_tasks", "restored")

# A task line of the tool's report: "  [ ] 7 a3 task 2.1 - <notes>"; titles are "<agent> task <p>.<k>".
_ADDED_TASK = re.compile(r"^  \[.\] (\d+) (\S+ task \d+\.\d+)", re.MULTILINE)
_TASKS_PER_CALL = 4
_NOTES = "n" * 400  # long notes make each task write a real page of data
_ANSWER = "a" * 1500  # and long answers, long histories


@attrs.frozen
class AckedTurn:
    """A turn whose result reached the client: which agent, its prompt, what the client was told."""

    agent_id: str
    prompt: str
    result: dict[str, Any]


@attrs.define
class CrashReport:
    """Every cycle's kill point and the writes verified after it."""

    seed: int
    kill_points: list[int] = attrs.field(factory=list)
    acked_turns: int = 0
    acked_agents: int = 0
    verified_writes: int = 0
    checks: list[InvariantCheck] = attrs.field(factory=list)

    @property
    def failures(self) -> list[InvariantCheck]:
        """The invariants that did not hold."""
        return [c for c in self.checks if not c.held]

    def check(self, name: str, problems: list[str]) -> None:
        """Record one invariant after one cycle."""
        self.checks.append(InvariantCheck(name, not problems, "; ".join(problems[:5])))


def script(agent_id: str, prompts: int) -> list[dict[str, Any]]:
    """The agent's model: per prompt, a batch insert of tasks, then a long answer."""
    turns: list[dict[str, Any]] = []
    for p in range(prompts):
        operations = [
            {"op": "insert", "title": f"{agent_id} task {p}.{k}", "notes": _NOTES} for k in range(_TASKS_PER_CALL)
        ]
        turns.append({"tool_calls": [{"name": "tasks", "arguments": {"action": "batch", "operations": operations}}]})
        turns.append({"text": f"{agent_id} answer {p} " + _ANSWER})
    return turns


class _Workload:
    """Client threads driving the daemon until told to stop (or until it dies)."""

    def __init__(self, daemon: DaemonProcess, agents: list[str], model_of: Callable[[str], str], cycle: int) -> None:
        self.daemon = daemon
        self.cycle = cycle
        self.agents = list(agents)
        self.model_of = model_of
        self.acked_turns: list[AckedTurn] = []
        self.acked_agents: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._prompt_ids = itertools.count(1)

    def start(self, new_agents: list[str]) -> None:
        for agent_id in self.agents:
            self._spawn(self._prompting, agent_id)
        self._spawn(self._starting, new_agents)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"crash-client {args[0]}")
        thread.start()
        self._threads.append(thread)

    def _prompting(self, agent_id: str) -> None:
        with contextlib.suppress(DaemonUnavailableError, OSError), _connect(self.daemon.socket) as client:
            while not self._stop.is_set():
                text = f"{agent_id} prompt {self.cycle}.{next(self._prompt_ids)}"
                try:
                    result = client.call("agent.prompt", {"agent_id": agent_id, "text": text}, timeout=60)
                except RPCCallError:
                    continue
                with self._lock:
                    self.acked_turns.append(AckedTurn(agent_id, text, result))

    def _starting(self, new_agents: list[str]) -> None:
        with contextlib.suppress(DaemonUnavailableError, OSError), _connect(self.daemon.socket) as client:
            for agent_id in new_agents:
                if self._stop.wait(0.05):
                    return
                params = {"working_dir": str(self.daemon.project), "model": self.model_of(agent_id)}
                client.call("agent.start", {**params, "agent_id": agent_id}, timeout=60)
                with self._lock:
                    self.acked_agents.append(agent_id)
                self._spawn(self._prompting, agent_id)

    def told_of(self, turns: int) -> Callable[[], bool]:
        """A condition: the clients have been told of at least ``turns`` turns."""
        return lambda: len(self.acked_turns) >= turns

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(60)


@contextlib.contextmanager
def _connect(path: Path) -> Iterator[Client]:
    """`Client.connect` as a context manager (it closes its socket even after the daemon died)."""
    client = Client.connect(path)
    try:
        yield client
    finally:
        client.close()


def _verify_store(
    path: Path,
    project: Path,
    acked: list[AckedTurn],
    agents: list[str],
    report: CrashReport,
    store_url: str | None = None,
) -> None:
    """Open the store the daemon left behind and look for every acknowledged write."""
    try:
        store = Store(path) if store_url is None else Store(url=store_url)
    except Exception as exc:
        report.check("store_opens", [f"Store({store_url or path}) failed: {exc!r}"])
        return
    try:
        if store_url is None:
            # Closed explicitly: a connection left to the garbage collector keeps the
            # file's locks, and sqlite then trusts a dead writer's stale WAL index.
            with contextlib.closing(sqlite3.connect(path)) as conn:
                integrity = conn.execute("PRAGMA integrity_check").fetchall()
            report.check("store_opens", [] if integrity == [("ok",)] else [f"integrity_check: {integrity[:3]}"])
        else:
            problems = []
            for namespace in store.namespaces():
                _, bad = store.scan(namespace)
                problems += [f"{namespace}/{key}: {exc}" for key, exc in bad]
            report.check("store_opens", problems)
        sessions = set(store.keys("sessions"))
        report.check(
            "acknowledged_agents",
            [f"agent {a} was acknowledged but has no session" for a in agents if a not in sessions],
        )
        report.verified_writes += len(agents)
        histories: dict[str, list[HistoryEntry]] = {}
        turn_problems: list[str] = []
        added: list[tuple[str, str, str]] = []
        for turn in acked:
            entries = histories.get(turn.agent_id)
            if entries is None:
                entries = histories[turn.agent_id] = [
                    e for _, e in store.items("history", f"{turn.agent_id}/", type=HistoryEntry)
                ]
            problem = _turn_problem(store, turn, entries, added)
            if problem:
                turn_problems.append(f"{turn.agent_id} turn {turn.result.get('turn_id')}: {problem}")
            report.verified_writes += 1
        report.check("acknowledged_turns", turn_problems)
        listed = {(t.id, t.title) for t in list_tasks(store, scope_for_project(project))}
        report.check(
            "acknowledged_tasks",
            [
                f"{who}: task {tid} {title!r} was acknowledged but is not stored"
                for who, tid, title in added
                if (tid, title) not in listed
            ],
        )
        report.verified_writes += len(added)
    finally:
        store.close()


def _turn_problem(
    store: Store, turn: AckedTurn, entries: list[HistoryEntry], added: list[tuple[str, str, str]]
) -> str | None:
    result = turn.result
    if not result.get("ok"):
        return None  # only turns that ended well promised anything
    mine = [e.message for e in entries if e.turn_id == result["turn_id"]]
    if not mine or (mine[0].role, mine[0].content) != ("user", turn.prompt):
        return f"its prompt is not stored (stored: {[(m.role, m.content[:40]) for m in mine[:2]]})"
    if mine[-1].role != "assistant" or mine[-1].content != result["text"]:
        return "the answer the client got is not stored"
    if sum(1 for m in mine if m.role == "assistant") != result["steps"]:
        return f"{result['steps']} steps acknowledged, not all stored"
    record = store.get("turns", f"{turn.agent_id}/{result['turn_id']}", type=TurnRecord)
    if record is None or record.status != "done":
        return f"its turn record is {record and record.status!r}"
    for m in mine:
        if m.role == "tool" and m.name == "tasks" and not m.is_error:
            added.extend((turn.agent_id, tid, title) for tid, title in _ADDED_TASK.findall(m.content))
    return None


def run_crash_cycles(
    root: Path,
    *,
    cycles: int = 3,
    seed: int = 0,
    agents: int = 6,
    per_cycle_new: int = 2,
    store_url: str | None = None,
    kill_range: tuple[int, int] = (5, 80),
) -> CrashReport:
    """Kill -9 a write-heavy daemon ``cycles`` times at seeded random points; check after each (and a clean stop).

    With ``store_url``, the daemon's store is that PostgreSQL database (the same node id each start).
    """
    rng = random.Random(seed)
    report = CrashReport(seed)
    store = f'url = "{store_url}"\nnode_id = "crash-node"' if store_url else ""
    daemon = DaemonProcess(root, store=store)
    prompts = 400  # more scripted turns than any run spends

    def model_of(agent_id: str) -> str:
        return daemon.script(agent_id, script(agent_id, prompts))

    running = [f"a{i}" for i in range(agents)]
    acked_agents: list[str] = []
    acked_turns: list[AckedTurn] = []
    try:
        daemon.start()
        with daemon.client() as client:
            for agent_id in running:
                client.call(
                    "agent.start",
                    {"working_dir": str(daemon.project), "model": model_of(agent_id), "agent_id": agent_id},
                    timeout=60,
                )
                acked_agents.append(agent_id)
        for cycle in range(cycles + 1):
            last = cycle == cycles
            new = [f"n{cycle}x{i}" for i in range(per_cycle_new)]
            workload = _Workload(daemon, running, model_of, cycle)
            workload.start(new)
            # The kill point: once the clients have been told of a seeded random number of turns,
            # wherever the daemon's writes then are.
            kill_after = rng.randint(*kill_range)
            wait_until(workload.told_of(kill_after), timeout=60, message=f"{kill_after} acknowledged turns")
            if last:
                workload.stop()
                daemon.terminate()
            else:
                report.kill_points.append(kill_after)
                daemon.kill9()
                workload.stop()
            acked_agents += workload.acked_agents
            acked_turns += workload.acked_turns
            running += workload.acked_agents
            _verify_store(root / "store.db", daemon.project, acked_turns, acked_agents, report, store_url)
            if last:
                break
            daemon.start()
            with daemon.client() as client:
                listed = {a["agent_id"]: a for a in client.call("agent.list", timeout=60)}
            report.check(
                "restored",
                [
                    f"{a} was not restored ({listed.get(a, {}).get('state')})"
                    for a in acked_agents
                    if a not in listed or listed[a].get("state") == "not running"
                ],
            )
    finally:
        daemon.close()
    report.acked_turns = len(acked_turns)
    report.acked_agents = len(acked_agents)
    return report
