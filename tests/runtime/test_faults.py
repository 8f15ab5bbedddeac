"""Fault injection: declarations and fault files, actor faults in real receive loops, the injector's API."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import weald.runtime.faults as faults_module
from weald.runtime import Actor, ActorSystem, Ref, ThreadActor
from weald.runtime.faults import (
    ActorFault,
    FaultError,
    FaultInjector,
    FaultSpecError,
    InjectedFault,
    MCPFault,
    ProviderFault,
    ToolFault,
    UnknownFaultError,
    fault_from_dict,
    fault_to_dict,
    parse_plan,
    read_fault_file,
)
from weald.runtime.testing import wait_for_event, wait_until
from weald.supervisors import ChildSpec, Supervisor
from weald.tools import ToolRegistry


@attrs.frozen
class Ping:
    n: int


class Recorder(Actor):
    """Appends (path, n) for each Ping to a list that outlives restarts; echoes asks."""

    def __init__(self, log: list[tuple[str, int]]) -> None:
        super().__init__()
        self.log = log

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Ping):
            self.log.append((self.path, message.n))

    def echo(self, value: Any) -> Any:
        return value

    def seen(self) -> list[int]:
        return [n for path, n in self.log if path == self.path]


class ThreadRecorder(ThreadActor):
    def __init__(self, log: list[tuple[str, int]]) -> None:
        super().__init__()
        self.log = log

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Ping):
            self.log.append((self.path, message.n))

    def seen(self) -> list[int]:
        return [n for path, n in self.log if path == self.path]


@pytest.fixture
def injector(system: ActorSystem) -> FaultInjector:
    injector = FaultInjector(seed=1234)
    injector.install(system)
    return injector


def send(ref: Ref[Any], numbers: range) -> list[int]:
    """Tell Pings, then return what the actor handled (the ask queues behind them)."""
    for n in numbers:
        ref.tell(Ping(n))
    seen: list[int] = ref.proxy().seen().get(timeout=10)
    return seen


# -- the public surface ----------------------------------------------------------------------------


def test_the_module_exports_exactly_its_sorted_public_names() -> None:
    # Sorted as ruff's RUF022 sorts: constants, then classes, then functions.
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert faults_module.__all__ == sorted(faults_module.__all__, key=kind)
    assert set(faults_module.__all__) == {
        "KINDS",
        "TARGETS",
        "ActorFault",
        "FaultError",
        "FaultInjector",
        "FaultPlan",
        "FaultProblem",
        "FaultSpec",
        "FaultSpecError",
        "FaultStatistics",
        "FaultStatus",
        "InjectedFault",
        "MCPFault",
        "ProviderFault",
        "ToolFault",
        "UnknownFaultError",
        "fault_from_dict",
        "fault_to_dict",
        "parse_plan",
        "read_fault_file",
    }
    for name in faults_module.__all__:
        assert hasattr(faults_module, name)


def test_the_registry_view_forwards_every_public_method_of_the_registry() -> None:
    view = type(FaultInjector().wrap_registry(ToolRegistry()))
    methods = {name for name in vars(ToolRegistry) if not name.startswith("_")} | {"__contains__", "__len__"}
    assert methods <= set(vars(view)), f"not forwarded: {methods - set(vars(view))}"


# -- declarations and files -------------------------------------------------------------------------


def test_a_declaration_round_trips_through_plain_data() -> None:
    spec = fault_from_dict({"target": "provider", "kind": "http_error", "status": 503, "retry_after": 0.5, "count": 2})
    assert spec == ProviderFault(kind="http_error", status=503, retry_after=0.5, count=2)
    data = fault_to_dict(spec)
    assert list(data)[:2] == ["target", "kind"]
    assert fault_from_dict(data) == spec


def test_every_problem_in_a_declaration_is_reported_with_its_key() -> None:
    with pytest.raises(FaultSpecError) as caught:
        fault_from_dict({"target": "actor", "kind": "crash", "nth": 0, "p": 1.5, "pth": "/x", "count": "2"})
    assert [(p.path, p.message) for p in caught.value.problems] == [
        ("nth", "expected a positive integer, got 0"),
        ("p", "expected a probability greater than 0 and at most 1, got 1.5"),
        ("count", 'expected an integer, got "2"'),
        ("pth", "unknown key; did you mean path?"),
    ]
    with pytest.raises(FaultSpecError, match=r'target: expected "actor", "tool", "mcp" or "provider", got "actr"'):
        fault_from_dict({"target": "actr", "kind": "crash"})
    with pytest.raises(FaultSpecError, match=r'kind: missing; a tool fault is one of "hang", "crash"'):
        fault_from_dict({"target": "tool"})


def test_rules_that_involve_several_keys_are_checked_from_files_and_by_hand() -> None:
    with pytest.raises(FaultSpecError) as caught:
        fault_from_dict({"target": "tool", "kind": "delay", "nth": 2, "p": 0.5})
    assert [(p.path, p.message) for p in caught.value.problems] == [
        ("p", "give nth or p, not both"),
        ("seconds", "a delay fault needs seconds, a positive number"),
    ]
    with pytest.raises(ValueError, match="status: only http_error faults take status, not timeout"):
        ProviderFault(kind="timeout", status=500)
    with pytest.raises(ValueError, match='trigger: only kill_server faults take trigger = "now"'):
        MCPFault(kind="hang", trigger="now")
    with pytest.raises(ValueError, match="nth: expected a positive integer, got -1"):
        ActorFault(kind="crash", nth=-1)


def test_a_toml_and_a_json_file_declare_the_same_faults(tmp_path: Path) -> None:
    toml = tmp_path / "faults.toml"
    toml.write_text(
        """
seed = 42

[[faults]]
id = "agent-crash"
target = "actor"
kind = "crash"
path = "/sessions/*/agent"
message = "ToolResults"
count = 1

[[faults]]
target = "tool"
kind = "hang"
tool = "shell"
p = 0.25
"""
    )
    data = {
        "seed": 42,
        "faults": [
            {
                "id": "agent-crash",
                "target": "actor",
                "kind": "crash",
                "path": "/sessions/*/agent",
                "message": "ToolResults",
                "count": 1,
            },
            {"target": "tool", "kind": "hang", "tool": "shell", "p": 0.25},
        ],
    }
    (tmp_path / "faults.json").write_text(json.dumps(data))
    from_toml, from_json = read_fault_file(toml), read_fault_file(tmp_path / "faults.json")
    assert from_toml.faults == from_json.faults == parse_plan(data).faults
    assert from_toml.seed == 42
    injector = FaultInjector.from_file(toml)
    assert injector.seed == 42
    assert [(s.id, s.target, s.kind) for s in injector.list()] == [
        ("agent-crash", "actor", "crash"),
        ("tool-hang-1", "tool", "hang"),
    ]


def test_a_bad_file_reports_every_problem_with_the_file_and_key_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        """
seed = "x"
[[faults]]
target = "actor"
kind = "explode"
[[faults]]
id = "a"
target = "provider"
kind = "http_error"
status = 200
[[faults]]
id = "a"
target = "tool"
kind = "hang"
tool = ""
"""
    )
    with pytest.raises(FaultSpecError) as caught:
        read_fault_file(bad)
    assert [str(p) for p in caught.value.problems] == [
        f'{bad}: seed: expected an integer, got "x"',
        f'{bad}: faults[0].kind: expected "crash", "delay", "drop" or "fatal_signal", got "explode"',
        f"{bad}: faults[1].status: expected an HTTP error status from 400 to 599, got 200",
        f'{bad}: faults[2].tool: expected a non-empty glob pattern (use "*" for any), got ""',
    ]
    assert str(caught.value).startswith("invalid fault declarations (4 problems):\n")
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps({"faults": [{"id": "a", "target": "actor", "kind": "drop"}] * 2, "fualts": []}))
    with pytest.raises(FaultSpecError) as caught:
        read_fault_file(dup)
    assert [(p.path, p.message) for p in caught.value.problems] == [
        ("fualts", "unknown key; expected seed or faults"),
        ("faults[1].id", '"a" is already used by faults[0]'),
    ]


def test_syntax_errors_name_the_line_and_other_extensions_are_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"faults": [\n  {"target": "actor",}\n]}')
    with pytest.raises(FaultSpecError, match=r"broken.json: invalid JSON: .* \(at line 2, column 22\)"):
        read_fault_file(broken)
    broken_toml = tmp_path / "broken.toml"
    broken_toml.write_text("[[faults]]\ntarget = \n")
    with pytest.raises(FaultSpecError, match=r"broken.toml: invalid TOML: .*line 2"):
        read_fault_file(broken_toml)
    with pytest.raises(FaultSpecError, match=r"faults.yaml: a fault file must be .toml or .json"):
        read_fault_file(tmp_path / "faults.yaml")
    with pytest.raises(FaultSpecError, match=r"missing.toml: no such file"):
        FaultInjector().load(tmp_path / "missing.toml")


# -- the injector's API -------------------------------------------------------------------------------


def test_inject_clear_and_list_publish_events_and_keep_the_counts(system: ActorSystem, injector: FaultInjector) -> None:
    first = injector.inject({"target": "actor", "kind": "drop", "path": "/nowhere"})
    second = injector.inject(ToolFault(id="slow-shell", kind="delay", tool="shell", seconds=1))
    assert (first, second) == ("actor-drop-1", "slow-shell")
    armed = wait_for_event(system.events, "fault.armed", lambda e: e.data["id"] == "slow-shell")
    assert armed.data["spec"]["seconds"] == 1
    assert armed.data["seed"] == 1234
    with pytest.raises(FaultSpecError, match='id: a fault with the id "slow-shell" is already injected'):
        injector.inject({"id": "slow-shell", "target": "tool", "kind": "crash"})
    with pytest.raises(
        UnknownFaultError, match=r"no injected fault has the id 'nope' \(injected: actor-drop-1, slow-shell\)"
    ):
        injector.clear("nope")
    assert injector.clear(first) == 1
    assert [s.id for s in injector.list()] == ["slow-shell"]
    wait_for_event(system.events, "fault.cleared", lambda e: e.data["id"] == first)
    assert injector.clear() == 1
    assert injector.list() == []
    stats = injector.statistics()
    assert (stats.active, stats.injected, stats.fires, stats.seed) == (0, 2, 0, 1234)


def test_a_system_takes_one_fault_hook_and_uninstall_removes_it(system: ActorSystem, injector: FaultInjector) -> None:
    with pytest.raises(FaultError, match="already has a fault hook"):
        FaultInjector().install(system)
    injector.uninstall()
    assert system._faults is None
    other = FaultInjector()
    other.install(system)
    assert system._faults is other


# -- actor faults -------------------------------------------------------------------------------------


def test_a_crash_on_the_nth_message_restarts_the_actor_under_its_supervisor(
    system: ActorSystem, injector: FaultInjector
) -> None:
    log: list[tuple[str, int]] = []
    system.spawn(Supervisor, kwargs={"children": [ChildSpec("w", Recorder, args=(log,))]}, name="sup")
    worker = wait_until(lambda: system.whereis("/sup/w"))
    injector.inject(ActorFault(id="third-ping", kind="crash", path="/sup/*", message="Ping", nth=3, count=1))
    for n in range(1, 4):  # a tell after the crash would raise ActorDeadError
        worker.tell(Ping(n))
    crashed = wait_for_event(system.events, "supervisor.child_crashed", lambda e: e.data["path"] == "/sup/w")
    assert "InjectedFault" in crashed.data["error"]
    assert "injected fault 'third-ping' (actor crash, fire 1)" in crashed.data["error"]
    restarted = wait_for_event(system.events, "supervisor.child_restarted", lambda e: e.data["path"] == "/sup/w")
    fired = wait_for_event(system.events, "fault.injected")
    assert fired.seq < crashed.seq < restarted.seq
    assert fired.source == "/sup/w"
    assert {k: fired.data[k] for k in ("id", "target", "kind", "path", "message", "fire", "match")} == {
        "id": "third-ping",
        "target": "actor",
        "kind": "crash",
        "path": "/sup/w",
        "message": "Ping",
        "fire": 1,
        "match": 3,
    }
    new = wait_until(lambda: (ref := system.whereis("/sup/w")) is not worker and ref)
    # The fault is exhausted, so the new incarnation handles 4.
    assert send(new, range(4, 5)) == [1, 2, 4]
    assert injector.fault_counts_by_path() == {"/sup/w": 1}
    assert injector.statistics().fires_by_kind == {"actor.crash": 1}
    (status,) = injector.list()
    assert (status.matches, status.fires, status.exhausted) == (4, 1, True)


def test_a_crash_on_an_ask_fails_the_ask_and_the_actor_lives_on(system: ActorSystem, injector: FaultInjector) -> None:
    ref = system.spawn(Recorder, args=([],), name="asked")
    injector.inject(ActorFault(id="no-echo", kind="crash", path="/asked", message="call:echo", count=1))
    with pytest.raises(InjectedFault, match="injected fault 'no-echo'") as caught:
        ref.proxy().echo("hello").get(timeout=5)
    assert (caught.value.fault_id, caught.value.path) == ("no-echo", "/asked")
    assert ref.proxy().echo("again").get(timeout=5) == "again"
    assert ref.is_alive()


def test_a_dropped_message_is_never_handled(system: ActorSystem, injector: FaultInjector) -> None:
    ref = system.spawn(Recorder, args=([],), name="lossy")
    injector.inject(ActorFault(kind="drop", path="/lossy", message="Ping", nth=2))
    assert send(ref, range(1, 7)) == [1, 3, 5]
    assert [e.data["message"] for e in system.events.recent(topic="fault.injected")] == ["Ping"] * 3


def test_after_and_count_bound_when_a_fault_fires(system: ActorSystem, injector: FaultInjector) -> None:
    ref = system.spawn(Recorder, args=([],), name="bounded")
    injector.inject(ActorFault(kind="drop", path="/bounded", message="Ping", after=2, count=2))
    assert send(ref, range(1, 8)) == [1, 2, 5, 6, 7]


def test_a_delay_holds_the_message_before_its_handler_runs(system: ActorSystem, injector: FaultInjector) -> None:
    ref = system.spawn(Recorder, args=([],), name="slow")
    injector.inject(ActorFault(id="slow-echo", kind="delay", path="/slow", message="call:echo", seconds=0.3, count=1))
    started = time.monotonic()
    assert ref.proxy().echo(1).get(timeout=5) == 1
    assert time.monotonic() - started >= 0.3
    assert ref.proxy().echo(2).get(timeout=5) == 2
    fired = wait_for_event(system.events, "fault.injected")
    assert (fired.data["id"], fired.data["seconds"], fired.data["message"]) == ("slow-echo", 0.3, "call:echo")
    assert injector.statistics().fires_by_fault == {"slow-echo": 1}


def test_thread_actors_are_faulted_through_admit_blocking(system: ActorSystem, injector: FaultInjector) -> None:
    log: list[tuple[str, int]] = []
    system.spawn(Supervisor, kwargs={"children": [ChildSpec("t", ThreadRecorder, args=(log,))]}, name="tsup")
    ref = wait_until(lambda: system.whereis("/tsup/t"))
    injector.inject(ActorFault(kind="drop", path="/tsup/t", message="Ping", nth=2))
    injector.inject(ActorFault(kind="delay", path="/tsup/t", message="Ping", seconds=0.05, count=1))
    assert send(ref, range(1, 5)) == [1, 3]
    injector.inject(ActorFault(id="thread-crash", kind="crash", path="/tsup/t", message="Ping", count=1))
    ref.tell(Ping(5))
    crashed = wait_for_event(system.events, "supervisor.child_crashed", lambda e: e.data["path"] == "/tsup/t")
    assert "thread-crash" in crashed.data["error"]
    wait_for_event(system.events, "supervisor.child_restarted", lambda e: e.data["path"] == "/tsup/t")


def run_with_seed(system: ActorSystem, seed: int, name: str) -> tuple[set[int], list[int]]:
    """Send 200 Pings through a p=0.3 drop fault; return the dropped ones and the fired match numbers."""
    injector = FaultInjector(seed=seed)
    injector.install(system)
    try:
        ref = system.spawn(Recorder, args=([],), name=name)
        injector.inject(ActorFault(id="lossy", kind="drop", path=f"/{name}", message="Ping", p=0.3))
        seen = send(ref, range(200))
        fired = [e.data["match"] for e in system.events.recent(1000, topic="fault.injected", source=f"/{name}")]
    finally:
        injector.uninstall()
    return set(range(200)) - set(seen), fired


def test_the_same_seed_drops_the_same_messages_in_two_runs(system: ActorSystem) -> None:
    first, fired_first = run_with_seed(system, 7, "run1")
    second, fired_second = run_with_seed(system, 7, "run2")
    other, _ = run_with_seed(system, 8, "run3")
    assert 20 < len(first) < 100
    assert first == second
    assert fired_first == fired_second == [n + 1 for n in sorted(first)]
    assert other != first


def test_every_fault_file_in_the_guide_is_valid() -> None:
    import re
    import tomllib

    guide = (Path(__file__).parents[2] / "docs" / "faults.md").read_text()
    tomls = re.findall(r"```toml\n(.*?)```", guide, re.S)
    jsons = [block for block in re.findall(r"```json\n(.*?)```", guide, re.S) if block.lstrip().startswith("{")]
    plans = [parse_plan(tomllib.loads(block), source="toml") for block in tomls if "[[faults]]" in block]
    files = [block for block in jsons if '"faults": [' in block and '"statistics"' not in block]  # not fault.list's
    plans += [parse_plan(json.loads(block), source="json") for block in files]
    assert len(plans) == 10  # the file example in TOML and JSON, one per target, three scenarios, a replay
    assert {spec.target for plan in plans for spec in plan.faults} == {"actor", "tool", "mcp", "provider"}
