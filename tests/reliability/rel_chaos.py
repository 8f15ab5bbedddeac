"""Chaos runs: scripted agents doing real tool work under a seeded fault schedule, then the invariants.

One run (`run_chaos`) starts an in-process `ActorSystem` with a
``/sessions`` DynamicSupervisor (configured as the daemon's), starts one
session per `SessionPlan` through `session_spec` (tool runner, sub-agents,
agent under ``rest_for_one``), installs a `FaultInjector` with the plan's
faults and seed, and has every session work through its prompts, one at a
time, concurrently with the other sessions. Then it checks what must hold
whatever the faults did:

- ``answered``: every prompt got an answer within `ANSWER_BOUND` seconds: a
  `TurnResult` whose ``ok``/``error``/``aborted``/``interrupted`` agree (ok
  means no error; not ok means an error saying why; interrupted means the
  agent crashed), or a clear refusal of the prompt itself.
- ``acknowledged_turns_stored``: the messages of every turn acknowledged ok
  are in the store's ``history`` namespace, in order: the prompt, then an
  assistant message per step with a tool message answering each of its
  calls, then the answer the caller got.
- ``store_matches_memory``: every agent's live history is exactly what the
  store holds for it (after the write-behind queue is flushed), and the
  sequence numbers have no gap.
- ``histories_valid``: every tool call in every history is answered once,
  before the next assistant message (crashes leave ``[interrupted]`` answers).
- ``acknowledged_tasks_stored``: every task a ``tasks`` tool result reported
  as added is listed by ``list_tasks``.
- ``tree_shape``: every session is back to its spec shape (tool_runner,
  sub_agents and agent running; sub_agents may still be dormant, as it is
  until a session's first sub-agent), and ``/sessions`` is alive.
- ``restart_limits``: a session supervisor gave up exactly when it saw more
  than its ``max_restarts`` (5) crashes, and never otherwise.
- ``no_orphan_processes``: nothing a tool started is left: no process whose
  environment carries this run's mark, no child of this process it did not
  have before.
- ``no_orphan_threads``: no thread is left but trio's idle worker cache.

Everything a run needs is in its `ChaosPlan`, whose repr is the readable
report hypothesis prints for a failing (shrunk) example.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from weald.runtime import ActorDeadError, ActorSystem, Event, Store
from weald.runtime.agents.agent import AgentConfig, HistoryEntry, TurnResult
from weald.runtime.agents.session import SessionConfig, agent_path, session_spec
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.faults import ActorFault, FaultInjector, FaultSpec, ProviderFault, ToolFault
from weald.runtime.llm import Message, ProviderSettings, ScriptedProvider
from weald.runtime.testing import WaitTimeout, wait_until
from weald.supervisors import DynamicSupervisor
from weald.tools import ToolConfig, default_registry
from weald.tools.tasks import list_tasks, scope_for_project

ANSWER_BOUND = 30.0
"""Seconds within which every prompt must be answered, whatever the faults."""

SESSION_MAX_RESTARTS = 5
"""The session supervisor's restart intensity (`weald.runtime.agents.session.session_spec`)."""

MARK_VARIABLE = "WEALD_CHAOS_MARK"
"""Set in the environment of every command the shell tool starts, to find what a run left behind."""

TOOLS = ("tasks", "shell", "read_file", "write_file", "glob", "grep", "memory_set")

# Short limits, so that hung tools and stalled models cost a run little time.
_TOOL_TIMEOUT = 2.0
_STALL_TIMEOUT = 0.3
_SHELL_TIMEOUT = 2.0

INVARIANTS = (
    "answered",
    "acknowledged_turns_stored",
    "store_matches_memory",
    "histories_valid",
    "acknowledged_tasks_stored",
    "tree_shape",
    "restart_limits",
    "no_orphan_processes",
    "no_orphan_threads",
)

_ADDED_TASK = re.compile(r"^  \[.\] (\d+) (.+)$", re.MULTILINE)


# -- plans -------------------------------------------------------------------------------------------------


@attrs.frozen
class Call:
    """One tool call a scripted model makes."""

    tool: str
    arguments: Mapping[str, Any]


@attrs.frozen
class PromptPlan:
    """One prompt and the model responses scripted for it: rounds of tool calls, then an answer."""

    text: str
    rounds: tuple[tuple[Call, ...], ...]
    answer: str


@attrs.frozen
class SessionPlan:
    """One session: its id and its prompts, sent one after the other."""

    session_id: str
    prompts: tuple[PromptPlan, ...]

    def script(self) -> dict[str, Any]:
        """The scripted model's turns: every prompt's rounds and answer, in order.

        An injected provider fault does not spend a scripted turn, so after
        one the script runs ahead of the prompts; the invariants never
        assume which prompt gets which turn.
        """
        turns: list[dict[str, Any]] = []
        for prompt in self.prompts:
            for calls in prompt.rounds:
                turns.append(
                    {"text": "", "tool_calls": [{"name": c.tool, "arguments": dict(c.arguments)} for c in calls]}
                )
            turns.append({"text": prompt.answer})
        return {"turns": turns}


@attrs.frozen
class ChaosPlan:
    """A whole run: the sessions, the faults and the injector's seed."""

    seed: int
    sessions: tuple[SessionPlan, ...]
    faults: tuple[FaultSpec, ...]


# -- outcomes -------------------------------------------------------------------------------------------------


@attrs.frozen
class PromptOutcome:
    """What one prompt got: a turn result, or why there was none."""

    session_id: str
    text: str
    result: TurnResult | None
    refused: str | None = None
    seconds: float = 0.0


@attrs.frozen
class InvariantCheck:
    """One invariant after one run: held or not, and what broke it."""

    name: str
    held: bool
    detail: str = ""


@attrs.define
class ChaosReport:
    """Everything a run observed: prompts, faults fired, restarts, escalations, invariants."""

    plan: ChaosPlan
    prompts: list[PromptOutcome] = attrs.field(factory=list)
    faults_by_kind: Counter[str] = attrs.field(factory=Counter)
    restarts: int = 0
    escalations: int = 0
    checks: list[InvariantCheck] = attrs.field(factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[InvariantCheck]:
        """The invariants that did not hold."""
        return [c for c in self.checks if not c.held]

    def check(self, name: str, problems: Sequence[str]) -> None:
        """Record an invariant: held when there is no problem."""
        self.checks.append(InvariantCheck(name, not problems, "; ".join(problems[:5])))

    def summary(self) -> str:
        """A readable account of the run, for a failing test's message."""
        lines = [f"seed {self.plan.seed}, {len(self.plan.sessions)} sessions, {self.seconds:.1f} s"]
        lines += [f"  fault {f!r}" for f in self.plan.faults]
        lines.append(f"  fired: {dict(self.faults_by_kind)}; restarts {self.restarts}; escalations {self.escalations}")
        for p in self.prompts:
            r = p.result
            how = f"refused: {p.refused}" if r is None else f"ok={r.ok} interrupted={r.interrupted} error={r.error!r}"
            lines.append(f"  {p.session_id} {p.text!r}: {how}")
        lines += [f"  BROKEN {c.name}: {c.detail}" for c in self.failures]
        return "\n".join(lines)


# -- processes and threads -------------------------------------------------------------------------------------


def _environ(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def marked_processes(mark: str) -> list[int]:
    """Live processes (any parent) whose environment carries ``MARK_VARIABLE=mark``."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and needle in _environ(pid).split(b"\0")]


def child_processes() -> set[int]:
    """This process's children (zombies included: an unreaped child is a leak too)."""
    me = os.getpid()
    children = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[1]) == me:
            children.add(int(pid))
    return children


def our_threads() -> set[threading.Thread]:
    """Live threads, without trio's cache of idle workers ("Trio thread N"), which exit on their own.

    Nor the process-wide "weald-spawner", which forks every child process and lives as long as the process.
    """
    return {t for t in threading.enumerate() if not t.name.startswith("Trio thread") and t.name != "weald-spawner"}


# -- a run ------------------------------------------------------------------------------------------------------


def _write_project(project: Path) -> None:
    (project / "src").mkdir(parents=True, exist_ok=True)
    (project / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (project / "src" / "app.py").write_text("print('beta')\n")


class _Run:
    def __init__(self, plan: ChaosPlan, root: Path, answer_bound: float) -> None:
        self.plan = plan
        self.answer_bound = answer_bound
        self.root = root
        self.project = root / "project"
        _write_project(self.project)
        self.mark = uuid.uuid4().hex
        self.report = ChaosReport(plan)
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def runner_config(self) -> RunnerConfig:
        options = {"shell": {"env": {MARK_VARIABLE: self.mark}, "kill_grace": 0.2}}
        return RunnerConfig(
            timeouts=dict.fromkeys(TOOLS, _TOOL_TIMEOUT),
            permissions={"shell": "allow", "write_file": "allow", "edit_file": "allow"},
            permission_timeout=1.0,
            tool_config=ToolConfig(options=options),
            grace=0.5,
        )

    def run(self) -> ChaosReport:
        started = time.monotonic()
        threads_before = our_threads()
        children_before = child_processes()
        system = ActorSystem(store_path=self.root / "store.db", ring_size=4096)
        system.start()
        try:
            self._drive(system)
        finally:
            system.shutdown(timeout=30)
        self._check_leftovers(threads_before, children_before)
        self.report.seconds = time.monotonic() - started
        return self.report

    def _drive(self, system: ActorSystem) -> None:
        injector = FaultInjector(seed=self.plan.seed)
        injector.install(system)
        supervision = system.events.subscribe(["supervisor.*"], max_buffer=1 << 16)
        sessions = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 1000, "max_seconds": 10.0}, name="sessions")
        registry = injector.wrap_registry(default_registry)
        scripts = {s.session_id: s.script() for s in self.plan.sessions}
        settings = ProviderSettings(stall_timeout=_STALL_TIMEOUT)

        def provider(model: str) -> ScriptedProvider:
            session_id = model.removeprefix("scripted:")
            return ScriptedProvider.from_dict(scripts[session_id], name=session_id, settings=settings)

        factory = injector.wrap_provider_factory(provider)
        for session in self.plan.sessions:
            config = SessionConfig(
                session.session_id,
                str(self.project),
                AgentConfig(model=f"scripted:{session.session_id}", max_steps=20),
                self.runner_config(),
                output_dir=str(self.root / "outputs"),
            )
            spec = session_spec(config, system=system, registry=registry, provider_factory=factory)
            sessions.proxy().start_child(spec).get(timeout=30)
        # Faults go in once the tree stands: the plan tests the work, not the start-up.
        for fault in self.plan.faults:
            injector.inject(fault)
        workers = [
            threading.Thread(target=self._work, args=(system, s), name=f"chaos {s.session_id}")
            for s in self.plan.sessions
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(self.answer_bound * (1 + max(len(s.prompts) for s in self.plan.sessions)))
        # What is left to check is the system's recovery, not the faults': stop them firing.
        injector.clear()
        self.report.faults_by_kind.update(injector.statistics().fires_by_kind)
        self._check_answers()
        self._check_tree(system)
        self.events = supervision.drain_nowait()
        supervision.close()
        self._check_restart_limits()
        self._check_store(system)
        injector.uninstall()

    # -- the workload ---------------------------------------------------------------------------------------

    def _work(self, system: ActorSystem, session: SessionPlan) -> None:
        for prompt in session.prompts:
            outcome = self._prompt(system, session.session_id, prompt.text)
            with self._lock:
                self.report.prompts.append(outcome)

    def _prompt(self, system: ActorSystem, session_id: str, text: str) -> PromptOutcome:
        started = time.monotonic()
        deadline = started + self.answer_bound
        while True:
            try:
                agent = wait_until(lambda: system.whereis(agent_path(session_id)), timeout=self.answer_bound)
                future = agent.proxy().prompt(text).get(timeout=self.answer_bound)
                break
            except ActorDeadError:
                # The agent died between the lookup and the call; its successor takes the prompt.
                if time.monotonic() > deadline:
                    return PromptOutcome(session_id, text, None, "the agent stayed dead", time.monotonic() - started)
            except WaitTimeout:
                return PromptOutcome(session_id, text, None, "no agent came back", time.monotonic() - started)
            except Exception as exc:
                # An injected crash of ``call:prompt``: the caller is told, with the fault's name.
                return PromptOutcome(session_id, text, None, f"{type(exc).__name__}: {exc}", time.monotonic() - started)
        try:
            result = future.get(timeout=max(deadline - time.monotonic(), 0.1))
        except Exception as exc:
            return PromptOutcome(session_id, text, None, f"unanswered: {exc!r}", time.monotonic() - started)
        return PromptOutcome(session_id, text, result, None, time.monotonic() - started)

    # -- invariants -----------------------------------------------------------------------------------------

    def _check_answers(self) -> None:
        problems = []
        expected = sum(len(s.prompts) for s in self.plan.sessions)
        if len(self.report.prompts) != expected:
            problems.append(f"{expected - len(self.report.prompts)} prompts never returned")
        for p in self.report.prompts:
            r = p.result
            if r is None:
                if p.refused is None or p.refused.startswith(("unanswered", "no agent", "the agent stayed")):
                    problems.append(f"{p.session_id} {p.text!r}: {p.refused}")
                elif "injected fault" not in p.refused:
                    problems.append(f"{p.session_id} {p.text!r} refused without a clear reason: {p.refused}")
            elif r.ok and (r.error is not None or r.aborted or r.interrupted):
                problems.append(f"{p.session_id} {p.text!r}: ok yet {r!r}")
            elif not r.ok and not r.error:
                problems.append(f"{p.session_id} {p.text!r}: not ok and no error says why")
            elif r.interrupted and "crashed" not in (r.error or ""):
                problems.append(f"{p.session_id} {p.text!r}: interrupted, but the error does not say so: {r.error}")
        self.report.check("answered", problems)

    def _check_tree(self, system: ActorSystem) -> None:
        problems: list[str] = []

        def shaped() -> bool:
            problems.clear()
            if system.whereis("/sessions") is None:
                problems.append("/sessions is gone")
                return False
            for s in self.plan.sessions:
                base = f"/sessions/{s.session_id}"
                sup = system.whereis(base)
                if sup is None:
                    problems.append(f"{base} is not running")
                    continue
                try:
                    infos = sup.proxy().which_children().get(timeout=5)
                except Exception as exc:
                    problems.append(f"{base} does not answer: {exc!r}")
                    continue
                # sub_agents starts with the session's first sub-agent: dormant until then.
                shape = [
                    (i.id, "running" if i.id == "sub_agents" and i.status == "dormant" else i.status) for i in infos
                ]
                want = [("tool_runner", "running"), ("sub_agents", "running"), ("agent", "running")]
                if shape != want:
                    problems.append(f"{base} has {shape}")
            return not problems

        with contextlib.suppress(WaitTimeout):
            wait_until(shaped, timeout=20)
        self.report.check("tree_shape", list(problems))

    def _check_restart_limits(self) -> None:
        """Replay each session supervisor's crash and give-up events against its intensity.

        The whole run lies inside the 30 s window, so every crash counts; a
        supervisor that gave up is restarted by ``/sessions`` as a new
        incarnation with a fresh count.
        """
        problems = []
        crashes: Counter[str] = Counter()
        for event in self.events:
            source = event.source
            if source == "/sessions":
                if event.topic == "supervisor.child_restarted":
                    self.report.restarts += 1
                    crashes[event.data["path"]] = 0
                continue
            if event.topic == "supervisor.child_restarted":
                self.report.restarts += 1
            elif event.topic == "supervisor.child_crashed" and source.count("/") == 2:
                crashes[source] += 1
            elif event.topic == "supervisor.gave_up" and source.count("/") == 2:
                self.report.escalations += 1
                if crashes[source] <= SESSION_MAX_RESTARTS:
                    problems.append(f"{source} gave up after only {crashes[source]} crashes")
                crashes[source] = -(1 << 30)  # it is gone until /sessions restarts it
        problems += [
            f"{path} saw {n} crashes and did not give up" for path, n in crashes.items() if n > SESSION_MAX_RESTARTS
        ]
        self.report.check("restart_limits", problems)

    def _check_store(self, system: ActorSystem) -> None:
        # Settle: every agent idle, so its history no longer changes.
        def idle() -> bool:
            for s in self.plan.sessions:
                agent = system.whereis(agent_path(s.session_id))
                try:
                    if agent is None or agent.proxy().snapshot(0).get(timeout=5).status != "idle":
                        return False
                except Exception:
                    return False
            return True

        with contextlib.suppress(WaitTimeout):
            wait_until(idle, timeout=20)
        live: dict[str, list[Message]] = {}
        for s in self.plan.sessions:
            agent = system.whereis(agent_path(s.session_id))
            with contextlib.suppress(Exception):
                live[s.session_id] = agent.proxy().history().get(timeout=5) if agent is not None else []
        store = system.store
        store.flush().get(timeout=30)
        stored = {
            s.session_id: [e for _, e in store.items("history", f"{s.session_id}/", type=HistoryEntry)]
            for s in self.plan.sessions
        }
        self._check_memory(live, stored)
        self._check_turns(stored)
        self._check_valid(stored)
        self._check_tasks(store, stored)

    def _check_memory(self, live: dict[str, list[Message]], stored: dict[str, list[HistoryEntry]]) -> None:
        problems = []
        for session_id, entries in stored.items():
            seqs = [e.seq for e in entries]
            if seqs != list(range(len(seqs))):
                problems.append(f"{session_id}: stored sequence numbers {seqs[:20]} have gaps or disorder")
            if session_id not in live:
                problems.append(f"{session_id}: the live agent did not give its history")
            elif [e.message for e in entries] != live[session_id]:
                memory = [(m.role, m.content[:30]) for m in live[session_id]]
                disk = [(e.message.role, e.message.content[:30]) for e in entries]
                problems.append(f"{session_id}: memory {memory} != store {disk}")
        self.report.check("store_matches_memory", problems)

    def _check_turns(self, stored: dict[str, list[HistoryEntry]]) -> None:
        problems = []
        for p in self.report.prompts:
            r = p.result
            if r is None or not r.ok:
                continue
            turn = [e.message for e in stored[p.session_id] if e.turn_id == r.turn_id]
            problem = _turn_problem(turn, p.text, r)
            if problem:
                problems.append(f"{p.session_id} turn {r.turn_id} ({p.text!r}): {problem}")
        self.report.check("acknowledged_turns_stored", problems)

    def _check_valid(self, stored: dict[str, list[HistoryEntry]]) -> None:
        problems = []
        for session_id, entries in stored.items():
            problem = _validity_problem([e.message for e in entries])
            if problem:
                problems.append(f"{session_id}: {problem}")
        self.report.check("histories_valid", problems)

    def _check_tasks(self, store: Store, stored: dict[str, list[HistoryEntry]]) -> None:
        listed = {(t.id, t.title) for t in list_tasks(store, scope_for_project(self.project))}
        problems = []
        for session_id, entries in stored.items():
            for e in entries:
                m = e.message
                if m.role != "tool" or m.name != "tasks" or m.is_error:
                    continue
                for task_id, title in _ADDED_TASK.findall(m.content):
                    if (task_id, title) not in listed:
                        problems.append(f"{session_id}: task {task_id} {title!r} was acknowledged but is not stored")
        self.report.check("acknowledged_tasks_stored", problems)

    def _check_leftovers(self, threads_before: set[threading.Thread], children_before: set[int]) -> None:
        def processes() -> list[str]:
            marked = marked_processes(self.mark)
            children = child_processes() - children_before
            return [f"pid {pid} carries the run's mark" for pid in marked] + [
                f"pid {pid} is a child of the test process" for pid in sorted(children)
            ]

        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: not processes(), timeout=10)
        self.report.check("no_orphan_processes", processes())

        def threads() -> list[str]:
            return sorted(t.name for t in our_threads() - threads_before)

        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: not threads(), timeout=10)
        self.report.check("no_orphan_threads", [f"thread {name!r} outlived the system" for name in threads()])


def _turn_problem(turn: list[Message], prompt: str, result: TurnResult) -> str | None:
    """Why the stored messages of an acknowledged turn are not what its caller was told, or None."""
    if not turn:
        return "no message of it is stored"
    if (turn[0].role, turn[0].content) != ("user", prompt):
        return f"it starts with {turn[0].role} {turn[0].content!r}, not the prompt"
    assistants = [m for m in turn if m.role == "assistant"]
    if len(assistants) != result.steps:
        return f"{len(assistants)} assistant messages stored for {result.steps} steps"
    last = turn[-1]
    if last.role != "assistant" or last.tool_calls or last.content != result.text:
        return f"it ends with {last.role} {last.content!r}, not the answer {result.text!r}"
    return _validity_problem(turn[1:])


def _validity_problem(messages: Sequence[Message]) -> str | None:
    """Why a history is not valid for a model (a tool call unanswered, or answered twice or late), or None."""
    open_calls: list[str] = []
    for i, m in enumerate(messages):
        if m.role == "tool":
            if m.tool_call_id not in open_calls:
                return f"message {i} answers {m.tool_call_id}, which is not open"
            open_calls.remove(m.tool_call_id)
            continue
        if open_calls:
            return f"message {i} ({m.role}) comes while {open_calls} are unanswered"
        if m.role == "assistant":
            open_calls = [c.id for c in m.tool_calls]
    return None


def run_chaos(plan: ChaosPlan, root: Path | None = None, *, answer_bound: float = ANSWER_BOUND) -> ChaosReport:
    """Run ``plan`` and check every invariant (see the module docstring); returns the report.

    Args:
        plan: the sessions, faults and seed.
        root: where the project and the store go (a temporary directory by default).
        answer_bound: seconds within which each prompt must be answered.
    """
    if root is not None:
        return _Run(plan, root, answer_bound).run()
    with tempfile.TemporaryDirectory(prefix="weald-chaos-") as tmp:
        return _Run(plan, Path(tmp), answer_bound).run()


# -- generating plans ---------------------------------------------------------------------------------------


def call_menu(session_id: str, prompt: int, round_: int, n: int) -> list[Call]:
    """Every tool call a generated script may make at this place (unique names where they write)."""
    tag = f"{session_id}-p{prompt}-r{round_}-c{n}"
    return [
        Call("tasks", {"action": "insert", "title": f"task {tag}"}),
        Call("shell", {"command": f"echo {tag}", "timeout": _SHELL_TIMEOUT}),
        Call("shell", {"command": "sleep 0.2; echo slept", "timeout": _SHELL_TIMEOUT}),
        Call("shell", {"command": "sleep 30 & echo left-behind", "timeout": _SHELL_TIMEOUT}),
        Call("shell", {"command": "sleep 30", "timeout": 0.3}),
        Call("read_file", {"path": "notes.txt"}),
        Call("write_file", {"path": f"out/{tag}.txt", "content": f"{tag}\n"}),
        Call("glob", {"pattern": "**/*.txt"}),
        Call("grep", {"pattern": "beta"}),
        Call("memory_set", {"key": tag, "text": f"note {tag}"}),
    ]


def fault_menu() -> list[FaultSpec]:
    """The kinds of fault a schedule draws from (each then gets a schedule: nth or p, and a count)."""
    return [
        ActorFault(kind="crash", path="/sessions/*/agent", message="ToolResults"),
        ActorFault(kind="crash", path="/sessions/*/agent", message="_ModelDone"),
        ActorFault(kind="crash", path="/sessions/*/agent", message="_Flushed"),
        ActorFault(kind="crash", path="/sessions/*/agent", message="_ModelEvent"),
        ActorFault(kind="crash", path="/sessions/*/agent", message="call:prompt"),
        ActorFault(kind="crash", path="/sessions/*/tool_runner", message="RunTools"),
        ActorFault(kind="delay", path="/sessions/*/agent", seconds=0.05),
        ToolFault(kind="crash", tool="*"),
        ToolFault(kind="hang", tool="*"),
        ToolFault(kind="delay", tool="*", seconds=0.1),
        ToolFault(kind="kill_subprocess", tool="shell"),
        ToolFault(kind="crash", tool="tasks"),
        ProviderFault(kind="http_error", status=500),
        ProviderFault(kind="http_error", status=429),
        ProviderFault(kind="timeout"),
        ProviderFault(kind="malformed_stream"),
    ]


def escalating_plan(seed: int = 7) -> ChaosPlan:
    """A session whose agent crashes on every other prompt until its supervisor gives up, beside a calm one.

    Each crash spends the scripted turn that called the tool, so the next
    prompt gets the answer turn and succeeds; 14 prompts make 7 crashes, one
    more than the session supervisor's intensity allows (5 restarts).
    """
    prompts = tuple(
        PromptPlan(f"prompt {i}", ((Call("read_file", {"path": "notes.txt"}),),), f"answer {i}") for i in range(14)
    )
    crash = ActorFault(id="f0", kind="crash", path="/sessions/s0/agent", message="ToolResults", count=8)
    return ChaosPlan(seed, (SessionPlan("s0", prompts), SessionPlan("s1", prompts[:3])), (crash,))


def random_plan(rng: Any, *, sessions: int = 3, prompts: int = 3, faults: int = 3) -> ChaosPlan:
    """A plan drawn from a `random.Random` (for the report script; the tests draw with hypothesis)."""
    plans = []
    for s in range(rng.randint(1, sessions)):
        sid = f"s{s}"
        prompt_plans = []
        for p in range(rng.randint(1, prompts)):
            rounds = []
            for r in range(rng.randint(0, 2)):
                rounds.append(tuple(rng.choice(call_menu(sid, p, r, n)) for n in range(rng.randint(1, 3))))
            prompt_plans.append(PromptPlan(f"prompt {p} of {sid}", tuple(rounds), f"answer {p} of {sid}"))
        plans.append(SessionPlan(sid, tuple(prompt_plans)))
    chosen = []
    for i in range(rng.randint(0, faults)):
        base = rng.choice(fault_menu())
        schedule: dict[str, Any] = {"id": f"f{i}", "count": rng.randint(1, 3)}
        if rng.random() < 0.5:
            schedule["nth"] = rng.randint(1, 3)
        else:
            schedule["p"] = rng.choice([0.25, 0.5, 1.0])
        chosen.append(attrs.evolve(base, **schedule))
    return ChaosPlan(rng.randrange(1 << 32), tuple(plans), tuple(chosen))
