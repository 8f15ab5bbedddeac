"""The tool runner: each call a supervised child, permissions, timeouts, limits, events, abort."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import weald.tools.shell as shell_module
from weald.runtime import ActorSystem, Ref
from weald.runtime.agents.tool_runner import (
    RunnerConfig,
    RunTools,
    ToolCallRequest,
    ToolResults,
    ToolRunner,
    decide_permission,
)
from weald.runtime.daemon.config import parse_config
from weald.runtime.testing import ResultCollector, wait_for_event, wait_until
from weald.tools import ToolConfig, ToolContext, ToolError, ToolRegistry, tool
from weald.tools.shell import shell

ROOT = Path(__file__).resolve().parents[2]

REG = ToolRegistry()
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}
FLAGS: dict[str, threading.Event] = {}


@tool(name="noop", description="does nothing", parameters=EMPTY, registry=REG)
async def noop(ctx: ToolContext) -> str:
    return "ok"


@tool(name="snapshot", description="returns the snapshot it got", parameters=EMPTY, registry=REG)
def snapshot_tool(ctx: ToolContext) -> str:
    return repr(ctx.snapshot)


@tool(
    name="wait_flag",
    description="waits until the flag is set",
    parameters={"type": "object", "properties": {"flag": {"type": "string"}}, "required": ["flag"]},
    registry=REG,
)
async def wait_flag(ctx: ToolContext, flag: str) -> str:
    # Polls rather than blocking a worker thread, so a cancelled call leaves no thread behind.
    with trio.move_on_after(10):
        while not FLAGS[flag].is_set():  # noqa: ASYNC110 - the flag is set from a worker thread
            await trio.sleep(0.002)
    return f"{flag} seen" if FLAGS[flag].is_set() else f"{flag} never set"


@tool(
    name="poll_abort",
    description="a thread tool that polls ctx.abort until it is set",
    parameters={"type": "object", "properties": {"flag": {"type": "string"}}, "required": ["flag"]},
    registry=REG,
)
def poll_abort(ctx: ToolContext, flag: str) -> str:
    # Runs in a worker thread, which a kill abandons: ctx.abort is all it sees.
    FLAGS[f"{flag}-running"].set()
    deadline = time.monotonic() + 10
    while not ctx.abort.is_set() and time.monotonic() < deadline:
        time.sleep(0.002)
    if ctx.abort.is_set():
        FLAGS[flag].set()
    return "done"


@tool(
    name="set_flag",
    description="sets the flag",
    parameters={"type": "object", "properties": {"flag": {"type": "string"}}, "required": ["flag"]},
    registry=REG,
)
def set_flag(ctx: ToolContext, flag: str) -> str:
    FLAGS[flag].set()
    return f"{flag} set"


@tool(name="crash", description="raises", parameters=EMPTY, registry=REG)
def crash(ctx: ToolContext) -> str:
    raise RuntimeError("tool bug")


@tool(name="base_crash", description="raises a BaseException", parameters=EMPTY, registry=REG)
async def base_crash(ctx: ToolContext) -> str:
    raise SystemExit(2)


@tool(name="refuse", description="raises ToolError", parameters=EMPTY, registry=REG)
def refuse(ctx: ToolContext) -> str:
    raise ToolError("cannot do that; try noop instead", hints=["noop works"])


@tool(name="hang", description="never returns", parameters=EMPTY, registry=REG, timeout=0.3)
async def hang(ctx: ToolContext) -> str:
    await trio.sleep_forever()
    return "unreachable"


@tool(
    name="limits",
    description="reports the time limit it was given",
    parameters={"type": "object", "properties": {"timeout": {"type": "number"}}},
    registry=REG,
    timeout=7.0,
    max_timeout=600.0,
)
async def limits(ctx: ToolContext, timeout: float | None = None) -> str:
    return repr(ctx.timeout)


@tool(
    name="stubborn",
    description="enforces no time limit of its own",
    parameters={"type": "object", "properties": {"timeout": {"type": "number"}}},
    registry=REG,
    timeout=0.2,
    max_timeout=60.0,
)
async def stubborn(ctx: ToolContext, timeout: float | None = None) -> str:
    await trio.sleep_forever()
    return "unreachable"


@tool(name="stream", description="emits output", parameters=EMPTY, registry=REG)
async def stream(ctx: ToolContext) -> str:
    for i in range(3):
        ctx.emit("output", {"text": f"chunk {i}"})
    return "streamed"


@tool(name="big", description="prints a lot", parameters=EMPTY, registry=REG)
def big(ctx: ToolContext) -> str:
    return "\n".join(f"line {i}" for i in range(5000))


@tool(
    name="guarded",
    description="needs permission",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    registry=REG,
    permission="ask",
    subject=lambda args: args.get("cmd"),
)
def guarded(ctx: ToolContext, cmd: str) -> str:
    return f"ran {cmd}"


@tool(
    name="typed",
    description="wants an integer",
    parameters={
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    },
    registry=REG,
)
def typed(ctx: ToolContext, n: int) -> str:
    return str(n * 2)


class Session:
    def __init__(self, system: ActorSystem, runner: Ref[Any], agent: Ref[Any]) -> None:
        self.system = system
        self.runner = runner
        self.agent = agent
        self._n = 0

    def send(self, *calls: tuple[str, dict[str, Any] | None], snapshot: Any = None, batch: str | None = None) -> str:
        self._n += 1
        batch_id = batch or f"b{self._n}"
        reqs = tuple(ToolCallRequest(f"{batch_id}-c{i}", name, args) for i, (name, args) in enumerate(calls))
        self.runner.tell(RunTools(batch_id, reqs, snapshot, self.agent, agent_id="a1", agent_path="/agent"))
        return batch_id

    def result(self, batch_id: str, timeout: float = 10) -> ToolResults:
        return wait_until(
            lambda: next((r for r in self.agent.proxy().received().get() if r.batch_id == batch_id), None),
            timeout=timeout,
            message=f"results of {batch_id}",
        )

    def run(self, *calls: tuple[str, dict[str, Any] | None], timeout: float = 10, **kw: Any) -> ToolResults:
        return self.result(self.send(*calls, **kw), timeout=timeout)


def make_session(
    system: ActorSystem,
    tmp_path: Path,
    config: RunnerConfig | None = None,
    registry: ToolRegistry = REG,
    name: str = "runner",
) -> Session:
    runner = system.spawn(
        ToolRunner,
        args=("s1", tmp_path),
        kwargs={
            "registry": registry,
            "config": config or RunnerConfig(permission_timeout=5),
            "output_dir": tmp_path / "out",
        },
        name=name,
    )
    return Session(system, runner, ResultCollector.start())


@pytest.fixture
def session(system: ActorSystem, tmp_path: Path) -> Iterator[Session]:
    return make_session(system, tmp_path)


def test_calls_of_one_response_run_concurrently_and_results_come_back_in_call_order(session: Session) -> None:
    FLAGS["f1"] = threading.Event()
    # Run one at a time, wait_flag would wait for set_flag forever.
    results = session.run(("wait_flag", {"flag": "f1"}), ("set_flag", {"flag": "f1"}), ("noop", {}))
    assert [o.call_id for o in results.outcomes] == ["b1-c0", "b1-c1", "b1-c2"]
    assert [o.result.output for o in results.outcomes] == ["f1 seen", "f1 set", "ok"]


def test_each_call_runs_in_its_own_temporary_child_that_receives_the_snapshot(session: Session) -> None:
    system = session.system
    results = session.run(("snapshot", {}), snapshot=("frozen", 42))
    assert results.outcomes[0].result.output == "('frozen', 42)"
    FLAGS["child"] = threading.Event()
    batch = session.send(("wait_flag", {"flag": "child"}))
    calls = system.whereis("/runner/calls")
    assert calls is not None
    infos = wait_until(lambda: calls.proxy().which_children().get())
    assert [(i.kind, i.restart, i.status) for i in infos] == [("ToolExecution", "temporary", "running")]
    assert infos[0].path.startswith(f"/runner/calls/{batch}-c0")
    FLAGS["child"].set()
    assert session.result(batch).outcomes[0].result.output == "child seen"
    wait_until(lambda: system.registered("/runner/calls/") == [])
    # Each call is reported by the runner (tool.started / tool.finished), not
    # by the supervisor's progress reports, which would flood the event ring.
    assert [e.data["call_id"] for e in system.events.recent(500, topic="tool.finished")] == ["b1-c0", f"{batch}-c0"]
    assert system.events.recent(500, topic="supervisor.*", source="/runner/calls") == []


def test_a_tool_that_raises_becomes_an_error_result_that_says_how_to_recover(session: Session) -> None:
    out = session.run(("crash", {}), ("refuse", {})).outcomes
    assert not out[0].result.ok
    assert "crash failed with RuntimeError: tool bug" in out[0].result.output
    assert "call again" in out[0].result.output
    assert out[1].result.output == "cannot do that; try noop instead"
    assert out[1].result.hints == ("noop works",)
    assert session.runner.is_alive()


def test_a_base_exception_in_a_tool_is_an_error_result_not_a_crash(session: Session) -> None:
    out = session.run(("base_crash", {}), ("noop", {})).outcomes
    assert "crashed with SystemExit" in out[0].result.output
    assert out[1].result.ok
    assert session.runner.is_alive()
    assert session.agent.is_alive()


def test_a_timed_out_call_is_cancelled_and_becomes_an_error_while_the_runner_carries_on(session: Session) -> None:
    out = session.run(("hang", {}), ("noop", {})).outcomes
    assert out[0].result.output == "hang timed out after 0.3 s and was stopped."
    assert out[1].result.ok
    assert session.run(("noop", {})).outcomes[0].result.ok


def test_configured_timeouts_override_the_tools_default(system: ActorSystem, tmp_path: Path) -> None:
    session = make_session(system, tmp_path, RunnerConfig(timeouts={"hang": 0.05}))
    assert "after 0.05 s" in session.run(("hang", {})).outcomes[0].result.output


def test_fifty_calls_in_one_batch_with_one_crashing_and_one_hanging(session: Session) -> None:
    calls: list[tuple[str, dict[str, Any] | None]] = [("noop", {}) for _ in range(50)]
    calls[17] = ("crash", {})
    calls[33] = ("hang", {})
    out = session.run(*calls, timeout=20).outcomes
    assert len(out) == 50
    assert [o.call_id for o in out] == [f"b1-c{i}" for i in range(50)]
    assert "RuntimeError" in out[17].result.output
    assert "timed out" in out[33].result.output
    assert all(o.result.ok for i, o in enumerate(out) if i not in (17, 33))


def test_unknown_tools_bad_json_and_schema_violations_are_clear_errors(session: Session) -> None:
    batch = "bad"
    calls = (
        ToolCallRequest("u", "nope", {}),
        ToolCallRequest("j", "noop", None, error="arguments were not valid JSON: Expecting value at 1"),
        ToolCallRequest("t", "typed", {"n": "seven", "extra": 1}),
    )
    session.runner.tell(RunTools(batch, calls, None, session.agent))
    out = session.result(batch).outcomes
    assert out[0].result.output.startswith("there is no tool named 'nope' available here. Available tools: ")
    assert "noop" in out[0].result.output
    assert out[1].result.output == "arguments were not valid JSON: Expecting value at 1"
    assert "n: expected integer, got 'seven'" in out[2].result.output
    assert "'extra' was unexpected" in out[2].result.output


def test_a_tool_filter_hides_tools_from_an_agent(session: Session) -> None:
    calls = (ToolCallRequest("x", "crash", {}),)
    session.runner.tell(RunTools("f", calls, None, session.agent, tool_filter=("*", "!crash")))
    assert "no tool named 'crash'" in session.result("f").outcomes[0].result.output
    assert [s["name"] for s in session.runner.proxy().tool_specs(["no*"]).get()] == ["noop"]


def test_every_call_publishes_started_output_and_finished_or_failed_events(session: Session) -> None:
    events = session.system.events
    session.run(("stream", {}), ("crash", {}))
    started = list(events.recent(100, topic="tool.started"))
    assert {e.data["tool"] for e in started} == {"stream", "crash"}
    outputs = [e.data["text"] for e in events.recent(100, topic="tool.output")]
    assert outputs == ["chunk 0", "chunk 1", "chunk 2"]
    finished = events.recent(10, topic="tool.finished")[-1]
    assert finished.data["tool"] == "stream"
    assert finished.data["ok"] is True
    assert finished.data["duration_ms"] >= 0
    failed = events.recent(10, topic="tool.failed")[-1]
    assert failed.data["tool"] == "crash"
    assert "tool bug" in failed.data["error"]


def test_ask_sends_a_permission_request_and_waits_for_the_answer(session: Session) -> None:
    batch = session.send(("guarded", {"cmd": "ls"}))
    request = wait_for_event(session.system.events, "permission.requested")
    assert request.data["tool"] == "guarded"
    assert request.data["subject"] == "ls"
    assert request.data["agent_path"] == "/agent"
    assert session.runner.proxy().snapshot().get().pending_permissions == (request.data["request_id"],)
    assert session.runner.proxy().respond_permission(request.data["request_id"], "allow").get() is True
    assert session.result(batch).outcomes[0].result.output == "ran ls"
    assert session.runner.proxy().respond_permission(request.data["request_id"], "allow").get() is False


def test_a_denied_permission_is_an_error_result(session: Session) -> None:
    batch = session.send(("guarded", {"cmd": "rm -rf /"}))
    request = wait_for_event(session.system.events, "permission.requested")
    session.runner.proxy().respond_permission(request.data["request_id"], "deny").get()
    out = session.result(batch).outcomes[0].result
    assert not out.ok
    assert "denied by the user" in out.output


def test_no_answer_within_the_timeout_counts_as_deny(system: ActorSystem, tmp_path: Path) -> None:
    session = make_session(system, tmp_path, RunnerConfig(permission_timeout=0.1))
    out = session.run(("guarded", {"cmd": "ls"})).outcomes[0].result
    assert "within 0.1 s, so it counts as denied" in out.output
    wait_for_event(system.events, "permission.timed_out")


def test_allow_always_allows_later_calls_with_the_same_subject(session: Session) -> None:
    session.send(("guarded", {"cmd": "make"}))
    request = wait_for_event(session.system.events, "permission.requested")
    session.runner.proxy().respond_permission(request.data["request_id"], "allow_always").get()
    assert session.run(("guarded", {"cmd": "make"})).outcomes[0].result.output == "ran make"


def test_permission_rules_deny_beats_ask_beats_allow() -> None:
    rules: dict[str, Any] = {"guarded": {"git *": "allow", "git push*": "ask", "*--force*": "deny"}, "noop": "deny"}
    assert decide_permission(guarded, {"cmd": "git status"}, rules)[0] == "allow"
    assert decide_permission(guarded, {"cmd": "git push origin"}, rules)[0] == "ask"
    perm, why = decide_permission(guarded, {"cmd": "git push --force"}, rules)
    assert perm == "deny"
    assert '"*--force*"' in why
    assert decide_permission(guarded, {"cmd": "ls"}, rules) == ("ask", "default for guarded (no pattern matched)")
    assert decide_permission(noop, {}, rules)[0] == "deny"
    assert decide_permission(noop, {}, {}) == ("allow", "default for noop")


def test_a_configured_deny_refuses_the_call_without_asking(system: ActorSystem, tmp_path: Path) -> None:
    session = make_session(system, tmp_path, RunnerConfig(permissions={"guarded": {"rm *": "deny", "*": "allow"}}))
    out = session.run(("guarded", {"cmd": "rm x"}), ("guarded", {"cmd": "ls"})).outcomes
    assert "not allowed here" in out[0].result.output
    assert 'tools.permissions.guarded "rm *" = deny' in out[0].result.output
    assert out[1].result.output == "ran ls"


def test_long_output_is_cut_and_saved_where_read_file_may_read_it(session: Session, tmp_path: Path) -> None:
    out = session.run(("big", {})).outcomes[0].result
    assert out.full_output_path is not None
    full = Path(out.full_output_path)
    assert full.read_text().count("\n") == 4999
    # At most 2,000 lines and 50 KB reach the model, the notice saying where the rest is included.
    assert len(out.output.splitlines()) == 2000
    assert len(out.output.encode()) <= 50 * 1024
    assert out.output.splitlines()[-1].startswith("[output cut: showing the first 1999 of 5000 lines.")
    assert full.is_relative_to(tmp_path / "out")


def test_abort_stops_running_calls_and_answers_them_aborted(session: Session) -> None:
    FLAGS["never"] = threading.Event()
    batch = session.send(("wait_flag", {"flag": "never"}), ("noop", {}))
    wait_until(lambda: session.runner.proxy().snapshot().get().running_calls)
    assert session.runner.proxy().abort(batch).get() >= 1
    out = session.result(batch).outcomes
    assert out[0].result.output == "[aborted]"
    wait_until(lambda: session.system.registered("/runner/calls/") == [])


def test_abort_also_ends_a_pending_permission_request(session: Session) -> None:
    batch = session.send(("guarded", {"cmd": "ls"}))
    wait_for_event(session.system.events, "permission.requested")
    session.runner.proxy().abort().get()
    assert session.result(batch).outcomes[0].result.output == "[aborted]"
    assert session.runner.proxy().snapshot().get().pending_permissions == ()


def test_an_execution_actor_that_is_killed_from_outside_yields_an_error_result(session: Session) -> None:
    FLAGS["killme"] = threading.Event()
    batch = session.send(("wait_flag", {"flag": "killme"}))
    path = wait_until(lambda: session.system.registered("/runner/calls/"))[0]
    session.system.whereis(path).kill()
    out = session.result(batch).outcomes[0].result
    assert not out.ok
    assert "ended without a result (killed)" in out.output


def test_a_thread_tool_whose_execution_is_killed_sees_its_abort_signal(session: Session) -> None:
    FLAGS["gone"], FLAGS["gone-running"] = threading.Event(), threading.Event()
    batch = session.send(("poll_abort", {"flag": "gone"}))
    assert FLAGS["gone-running"].wait(10)
    path = wait_until(lambda: session.system.registered("/runner/calls/"))[0]
    session.system.whereis(path).kill()
    assert "ended without a result (killed)" in session.result(batch).outcomes[0].result.output
    assert FLAGS["gone"].wait(10), "the abandoned worker thread never saw ctx.abort"


def test_tool_config_reaches_the_tools(system: ActorSystem, tmp_path: Path) -> None:
    @tool(name="opt", description="reads an option", parameters=EMPTY, registry=REG)
    def opt(ctx: ToolContext) -> str:
        return str(ctx.config.option("opt", "colour"))

    session = make_session(system, tmp_path, RunnerConfig(tool_config=ToolConfig(options={"opt": {"colour": "green"}})))
    assert session.run(("opt", {})).outcomes[0].result.output == "green"


@pytest.mark.parametrize("calls", [1, 3])
def test_calls_that_cannot_be_started_become_error_results(session: Session, calls: int) -> None:
    assert session.system.whereis("/runner/calls") is None  # started by the first call
    assert session.run(("noop", {})).outcomes[0].result.ok
    supervisor = wait_until(lambda: session.system.whereis("/runner/calls"))
    supervisor.stop()  # the runner's calls supervisor is gone: nothing can start
    out = session.run(*[("noop", {})] * calls).outcomes
    assert [o.call_id for o in out] == [f"b2-c{i}" for i in range(calls)]
    assert all(not o.result.ok and "the noop call could not run" in o.result.output for o in out)


def test_tool_started_events_carry_the_call_arguments(session: Session) -> None:
    session.run(("typed", {"n": 21}), ("noop", {}))
    started = {e.data["tool"]: e.data for e in session.system.events.recent(100, topic="tool.started")}
    assert started["typed"]["arguments"] == {"n": 21}
    assert started["noop"]["arguments"] == {}
    assert started["typed"]["call_id"] == "b1-c0"


# -- time limits reach the tools ----------------------------------------------------------------


def test_the_call_limit_reaches_the_tool_from_its_default_the_config_or_its_own_argument(
    system: ActorSystem, tmp_path: Path
) -> None:
    session = make_session(system, tmp_path, RunnerConfig(timeouts={"noop": 3.0}))
    out = session.run(
        ("limits", {}), ("limits", {"timeout": 600}), ("limits", {"timeout": 900}), ("limits", {"timeout": 42})
    )
    assert [o.result.output for o in out.outcomes] == ["7.0", "600.0", "600.0", "42.0"]
    configured = make_session(system, tmp_path, RunnerConfig(timeouts={"limits": 250}), name="runner2")
    assert configured.run(("limits", {})).outcomes[0].result.output == "250.0"
    # An argument asked for in the call beats the configured limit, both ways.
    assert configured.run(("limits", {"timeout": 600})).outcomes[0].result.output == "600.0"
    assert configured.run(("limits", {"timeout": 5})).outcomes[0].result.output == "5.0"


def shell_session(
    system: ActorSystem,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    default: float,
    timeouts: dict[str, float] | None = None,
    grace: float = 5.0,
) -> Session:
    """A runner with the real shell tool, its built-in 120 s default scaled down to ``default``."""
    monkeypatch.setattr(shell_module, "DEFAULT_TIMEOUT", default)
    scaled = attrs.evolve(shell, timeout=default)
    config = RunnerConfig(timeouts=timeouts or {}, permissions={"shell": "allow"}, grace=grace)
    return make_session(system, tmp_path, config, registry=ToolRegistry([scaled]))


def test_without_config_the_shell_default_stops_a_command_that_outlives_it(
    system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = shell_session(system, tmp_path, monkeypatch, default=0.5)
    out = session.run(("shell", {"command": "sleep 5; echo finished"})).outcomes[0].result
    assert not out.ok
    assert "The command timed out after 0.5 s and was stopped" in out.output
    assert "finished" not in out.output


def test_a_configured_shell_timeout_longer_than_the_default_lets_a_command_outlive_the_default(
    system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # [tools.timeouts] shell = 600 "for long builds", scaled down: the default is 0.5 s, the config 30 s.
    session = shell_session(system, tmp_path, monkeypatch, default=0.5, timeouts={"shell": 30.0})
    out = session.run(("shell", {"command": "sleep 2; echo finished"}), timeout=30).outcomes[0].result
    assert out.ok, out.output
    assert out.output == "finished"
    assert out.data["duration"] >= 2


def test_the_calls_own_shell_timeout_is_honoured_through_the_runner(
    system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both the default and the configured limit are shorter than the command; the call asks for enough.
    session = shell_session(system, tmp_path, monkeypatch, default=0.5, timeouts={"shell": 0.5}, grace=0.5)
    out = session.run(("shell", {"command": "sleep 2; echo finished", "timeout": 30}), timeout=30).outcomes[0].result
    assert out.ok, out.output
    assert out.output == "finished"


def test_a_shell_timeout_names_the_configured_limit_not_the_runners_grace(
    system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = shell_session(system, tmp_path, monkeypatch, default=120.0, timeouts={"shell": 1.0}, grace=2.0)
    out = session.run(("shell", {"command": "sleep 30"}), timeout=30).outcomes[0].result
    assert not out.ok
    # The shell itself stopped the command at the configured second and said so.
    assert "The command timed out after 1 s and was stopped (its whole process group was killed)." in out.output
    assert out.data["timed_out"] is True
    assert re.findall(r"after ([\d.]+) s", out.output) == ["1"]


def test_a_tool_that_overruns_its_limit_is_stopped_by_the_runner_which_names_the_limit(
    system: ActorSystem, tmp_path: Path
) -> None:
    session = make_session(system, tmp_path, RunnerConfig(grace=0.3))
    out = session.run(("stubborn", {}), ("stubborn", {"timeout": 0.4})).outcomes
    assert [o.result.output for o in out] == [
        "stubborn timed out after 0.2 s and was stopped; ask for more with the timeout argument (up to 60 s).",
        "stubborn timed out after 0.4 s and was stopped; ask for more with the timeout argument (up to 60 s).",
    ]


# -- the documented permission example -----------------------------------------------------------

_SHELL_TABLE = re.compile(r"^\[tools\.permissions\.shell\][^\n]*\n(?:(?!\[|```)[^\n]*\n)*", re.MULTILINE)


@pytest.mark.parametrize("doc", ["README.md", "docs/configuration.md"])
def test_the_documented_shell_permission_examples_allow_deny_and_ask_as_they_claim(doc: str) -> None:
    tables = _SHELL_TABLE.findall((ROOT / doc).read_text(encoding="utf-8"))
    assert tables, f"no [tools.permissions.shell] example in {doc}"
    for table in tables:
        # Read as weald reads a weald.toml, and handed to the runner as the daemon does.
        config = parse_config(table, source=doc)
        rules = RunnerConfig(permissions=dict(config.tools.permissions)).permissions
        decide = [decide_permission(shell, {"command": c}, rules)[0] for c in ("git status", "rm -rf /", "make test")]
        assert decide == ["allow", "deny", "ask"], table


# -- no process outlives the system ------------------------------------------------------------


def _proc_stat(entry: Path) -> list[bytes] | None:
    """State, ppid, pgrp, session... of one /proc entry (the fields after the command name)."""
    try:
        return (entry / "stat").read_bytes().rpartition(b")")[2].split()
    except OSError:
        return None


def live_processes() -> dict[int, tuple[int, int, bytes]]:
    """Every live (not zombie) process: pid -> (process group, session, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        fields = _proc_stat(entry) if entry.name.isdigit() else None
        if fields is None or fields[0] in (b"Z", b"X"):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        found[int(entry.name)] = (int(fields[2]), int(fields[3]), cmdline)
    return found


def in_group(group: int) -> list[int]:
    return [pid for pid, (pgrp, sid, _) in live_processes().items() if group in (pgrp, sid)]


def with_marker(marker: str) -> dict[int, int]:
    """Live processes whose command line holds ``marker``: pid -> process group."""
    return {pid: pgrp for pid, (pgrp, _, cmd) in live_processes().items() if marker.encode() in cmd}


def test_leaving_the_actor_system_leaves_no_shell_process_behind(tmp_path: Path) -> None:
    # A unique fraction in every sleep's length marks this test's processes among everyone else's.
    tag = f".{random.randrange(10**6):06d}"
    with ActorSystem(store_path=tmp_path / "store.db") as system:
        # Process groups, as shell uses them without its OS sandbox (tests/tools/test_shell_sandbox.py
        # and tests/security/test_sandbox_attacks.py check the sandboxed processes).
        options = ToolConfig(options={"shell": {"sandbox": "off"}})
        config = RunnerConfig(permissions={"shell": "allow"}, tool_config=options)
        session = make_session(system, tmp_path, config, registry=ToolRegistry([shell]))
        started = session.run(("shell", {"command": f"sleep 300{tag} & sleep 301{tag}", "background": True}))
        job = started.outcomes[0].result
        assert job.ok, job.output
        # A foreground command, with a child in the background, is still running at the exit.
        session.send(("shell", {"command": f"sleep 302{tag} & sleep 303{tag}"}))
        sleeps = [f"sleep\0{n}{tag}" for n in (300, 301, 302, 303)]
        running = wait_until(lambda: len(m := with_marker(tag)) >= 4 and all(with_marker(s) for s in sleeps) and m)
        groups = set(running.values())
        assert job.data["pid"] in groups
        assert len(groups) == 2  # each command in a process group of its own
    wait_until(
        lambda: not [p for g in groups for p in in_group(g)] and not with_marker(tag),
        timeout=15,
        message=lambda: f"processes left behind: {[p for g in groups for p in in_group(g)]}, {with_marker(tag)}",
    )


@pytest.mark.usefixtures("bubblewrap")
def test_leaving_the_actor_system_leaves_no_sandboxed_shell_process_behind(tmp_path: Path) -> None:
    tag = f".{random.randrange(10**6):06d}"
    with ActorSystem(store_path=tmp_path / "store.db") as system:
        session = make_session(
            system, tmp_path, RunnerConfig(permissions={"shell": "allow"}), registry=ToolRegistry([shell])
        )
        command = f"setsid env -i sleep 300{tag} & sleep 301{tag}"
        assert session.run(("shell", {"command": command, "background": True})).outcomes[0].result.ok
        session.send(("shell", {"command": f"setsid env -i sleep 302{tag} & sleep 303{tag}"}))
        sleeps = [f"sleep\0{n}{tag}" for n in (300, 301, 302, 303)]
        wait_until(lambda: all(with_marker(s) for s in sleeps), message="the four sleepers")
    wait_until(lambda: not with_marker(tag), timeout=15, message=lambda: f"processes left behind: {with_marker(tag)}")
