"""The Agent actor: its states, steering, abort, crash recovery, sub-agents, questions, providers."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from fake_openai import FakeOpenAI
from weald.runtime import ActorSystem, Ref, register_secret
from weald.runtime.agents.agent import AgentConfig, HistoryEntry, TurnRecord, TurnResult
from weald.runtime.agents.session import SessionConfig, agent_path, session_spec
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.llm import ModelRequest, OpenAIProvider, ProviderSettings, ScriptedProvider, StreamEvent, Usage
from weald.runtime.testing import wait_for_event, wait_until
from weald.supervisors import DynamicSupervisor
from weald.tools import ToolContext, default_registry, tool

REG = default_registry.copy()
FLAGS: dict[str, threading.Event] = {}
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}


@tool(
    name="wait_flag",
    description="waits for a flag",
    parameters={"type": "object", "properties": {"flag": {"type": "string"}}, "required": ["flag"]},
    registry=REG,
    timeout=30,
)
async def wait_flag(ctx: ToolContext, flag: str) -> str:
    with trio.move_on_after(20):
        while not FLAGS[flag].is_set():  # noqa: ASYNC110 - set from the test's thread
            await trio.sleep(0.002)
    return f"{flag} done"


@tool(name="needs_ok", description="asks permission", parameters=EMPTY, registry=REG, permission="ask")
def needs_ok(ctx: ToolContext) -> str:
    return "did it"


class Harness:
    def __init__(self, system: ActorSystem, tmp_path: Path) -> None:
        self.system = system
        self.tmp_path = tmp_path
        self.sessions = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 50}, name="sessions")

    def start(
        self,
        session_id: str,
        script: dict[str, Any] | None = None,
        *,
        factory: Callable[[str], Any] | None = None,
        **agent: Any,
    ) -> Ref[Any]:
        project = self.tmp_path / "project"
        project.mkdir(exist_ok=True)
        (project / "notes.txt").write_text("alpha\nbeta\n")
        if factory is None:
            assert script is not None
            factory = lambda model: ScriptedProvider.from_dict(script)  # noqa: E731
        config = SessionConfig(
            session_id,
            str(project),
            AgentConfig(model="scripted:inline", **agent),
            RunnerConfig(permission_timeout=10),
        )
        spec = session_spec(config, system=self.system, registry=REG, provider_factory=factory)
        self.sessions.proxy().start_child(spec).get(timeout=10)
        return self.agent(session_id)

    def agent(self, session_id: str) -> Ref[Any]:
        return wait_until(lambda: self.system.whereis(agent_path(session_id)))

    def prompt(self, agent: Ref[Any], text: str) -> Any:
        return agent.proxy().prompt(text).get(timeout=10)

    def run(self, agent: Ref[Any], text: str, timeout: float = 20) -> TurnResult:
        return self.prompt(agent, text).get(timeout=timeout)


class GatedScript:
    """A scripted model whose call number ``gate_at`` (from 0) waits until ``FLAGS[flag]`` is set."""

    def __init__(self, script: dict[str, Any], gate_at: int, flag: str) -> None:
        self.inner = ScriptedProvider.from_dict(script)
        self.gate_at = gate_at
        self.flag = flag

    @property
    def position(self) -> int:
        return self.inner.position

    def seek(self, position: int) -> None:
        self.inner.seek(position)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if self.inner.position == self.gate_at:
            with trio.move_on_after(20):
                while not FLAGS[self.flag].is_set():  # noqa: ASYNC110 - set from the test's thread
                    await trio.sleep(0.002)
        async for event in self.inner.stream(request):
            yield event

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture
def h(system: ActorSystem, tmp_path: Path) -> Harness:
    return Harness(system, tmp_path)


def states(system: ActorSystem, path: str) -> list[str]:
    return [e.data["to"] for e in system.events.recent(1000, topic="agent.state", source=path)]


def test_a_turn_runs_model_then_tools_then_model_until_an_answer_without_tool_calls(h: Harness) -> None:
    agent = h.start(
        "s1",
        {
            "turns": [
                {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
                {"text": "two lines"},
            ]
        },
    )
    result = h.run(agent, "count the lines")
    assert result.ok
    assert (result.text, result.steps) == ("two lines", 2)
    assert result.usage.output_tokens > 0
    roles = [m.role for m in agent.proxy().history().get()]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert states(h.system, agent.path) == ["streaming", "executing_tools", "streaming", "idle"]


def test_every_message_is_in_the_store_when_the_turn_is_acknowledged(h: Harness) -> None:
    agent = h.start("s1", {"turns": [{"text": "hi"}]})
    h.run(agent, "hello")
    stored = h.system.store.items("history", "s1/", type=HistoryEntry)
    assert [(e.message.role, e.message.content) for _, e in stored] == [("user", "hello"), ("assistant", "hi")]
    turns = h.system.store.items("turns", "s1/", type=TurnRecord)
    assert [t.status for _, t in turns] == ["done"]


def test_the_step_limit_ends_a_turn_with_a_clear_error(h: Harness) -> None:
    call = {"name": "glob", "arguments": {"pattern": "*.txt"}}
    agent = h.start("s1", {"turns": [{"tool_calls": [call]}] * 5}, max_steps=2)
    result = h.run(agent, "loop")
    assert not result.ok
    assert result.steps == 2
    assert result.error == "the turn stopped after 2 model calls (agent.max_steps)"


def test_a_prompt_sent_during_a_turn_is_handed_to_the_model_at_the_next_step(h: Harness, system: ActorSystem) -> None:
    FLAGS["steer"] = threading.Event()
    with FakeOpenAI() as server:
        server.tool_call("wait_flag", {"flag": "steer"}).text("done, and I saw the second message")
        settings = ProviderSettings(base_url=server.url, api_key_required=False)
        agent = h.start("s1", factory=lambda m: OpenAIProvider("fake", settings))
        first = h.prompt(agent, "first")
        wait_until(lambda: agent.proxy().snapshot().get().status == "executing_tools")
        second = h.prompt(agent, "also consider this")
        wait_for_event(system.events, "agent.prompt_queued")
        FLAGS["steer"].set()
        r1, r2 = first.get(timeout=20), second.get(timeout=20)
        assert r1 == r2
        assert r1.text == "done, and I saw the second message"
        sent = server.requests[1]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
        assert sent[-1]["content"] == "also consider this"


def test_abort_when_idle_does_nothing(h: Harness) -> None:
    agent = h.start("s1", {"turns": []})
    assert agent.proxy().abort().get() is False


def test_abort_while_streaming_cancels_the_model_call(h: Harness) -> None:
    agent = h.start("s1", {"turns": [{"text": "slow", "delay": 30}, {"text": "fresh"}]})
    pending = h.prompt(agent, "go")
    wait_until(lambda: agent.proxy().snapshot().get().status == "streaming")
    assert agent.proxy().abort().get() is True
    result = pending.get(timeout=5)
    assert result.aborted
    assert not result.ok
    assert agent.proxy().snapshot().get().status == "idle"
    assert [m.role for m in agent.proxy().history().get()] == ["user"]


def test_abort_while_executing_tools_answers_the_calls_aborted(h: Harness) -> None:
    FLAGS["never"] = threading.Event()
    agent = h.start(
        "s1",
        {"turns": [{"tool_calls": [{"name": "wait_flag", "arguments": {"flag": "never"}}]}, {"text": "after"}]},
    )
    pending = h.prompt(agent, "go")
    wait_until(lambda: agent.proxy().snapshot().get().status == "executing_tools")
    agent.proxy().abort().get()
    assert pending.get(timeout=5).aborted
    history = agent.proxy().history().get()
    assert (history[-1].role, history[-1].content) == ("tool", "[aborted]")
    wait_until(lambda: h.system.registered("/sessions/s1/tool_runner/calls/") == [])
    assert h.run(agent, "again").text == "after"


def test_abort_while_waiting_for_an_answer_withdraws_the_question(h: Harness) -> None:
    agent = h.start("s1", {"turns": [{"tool_calls": [{"name": "ask_user", "arguments": {"question": "colour?"}}]}]})
    pending = h.prompt(agent, "go")
    wait_for_event(h.system.events, "question.asked")
    wait_until(lambda: agent.proxy().snapshot().get().status == "waiting")
    agent.proxy().abort().get()
    assert pending.get(timeout=5).aborted
    assert agent.proxy().snapshot().get().open_questions == ()


def test_abort_while_waiting_for_a_permission_ends_the_request(h: Harness) -> None:
    agent = h.start("s1", {"turns": [{"tool_calls": [{"name": "needs_ok", "arguments": {}}]}]})
    pending = h.prompt(agent, "go")
    wait_for_event(h.system.events, "permission.requested")
    agent.proxy().abort().get()
    assert pending.get(timeout=5).aborted
    runner = h.system.whereis("/sessions/s1/tool_runner")
    wait_until(lambda: runner.proxy().snapshot().get().pending_permissions == ())


def test_an_answered_question_reaches_the_tool_and_the_model(h: Harness) -> None:
    agent = h.start(
        "s1",
        {
            "turns": [
                {
                    "tool_calls": [
                        {"name": "ask_user", "arguments": {"question": "colour?", "choices": ["red", "blue"]}}
                    ]
                },
                {"text": "blue it is"},
            ]
        },
    )
    pending = h.prompt(agent, "go")
    asked = wait_for_event(h.system.events, "question.asked")
    assert asked.data["choices"] == ["red", "blue"]
    assert agent.proxy().answer(asked.data["question_id"], "blue").get() is True
    assert pending.get(timeout=10).text == "blue it is"
    assert agent.proxy().history().get()[2].content == "The user answered: blue"


def test_a_sub_agents_question_is_answered_from_the_top(h: Harness) -> None:
    script = {
        "turns": [
            {"tool_calls": [{"name": "sub_agent", "arguments": {"task": "find out the colour"}}]},
            {"tool_calls": [{"name": "ask_user", "arguments": {"question": "which colour?"}}]},
            {"text": "the user said green"},
            {"text": "my sub-agent says green"},
        ]
    }
    shared = ScriptedProvider.from_dict(script)
    agent = h.start("s1", factory=lambda m: shared)
    pending = h.prompt(agent, "go")
    asked = wait_for_event(h.system.events, "question.asked")
    assert asked.source == agent.path  # the top-level agent asks the user
    assert asked.data["asked_by"].startswith("/sessions/s1/sub_agents/")
    agent.proxy().answer(asked.data["question_id"], "green").get()
    result = pending.get(timeout=10)
    assert result.text == "my sub-agent says green"
    assert agent.proxy().history().get()[2].content == "the user said green"
    forwarded = h.system.events.recent(500, topic="tool.sub_agent")
    assert forwarded
    assert all(e.data["parent_call_id"] == "call_0_0" for e in forwarded)


def test_sub_agents_are_not_offered_past_the_depth_limit(h: Harness) -> None:
    agent = h.start("s1", {"turns": []}, max_depth=0)
    assert "sub_agent" not in agent.proxy().snapshot().get().tools
    other = h.start("s2", {"turns": []})
    assert "sub_agent" in other.proxy().snapshot().get().tools


def test_a_sub_agent_that_runs_too_long_is_stopped(h: Harness) -> None:
    parent = ScriptedProvider.from_dict(
        {
            "turns": [
                {
                    "tool_calls": [
                        {"name": "sub_agent", "arguments": {"task": "slow", "timeout": 0.2, "model": "scripted:sub"}}
                    ]
                },
                {"text": "the sub-agent timed out"},
            ]
        }
    )
    child = ScriptedProvider.from_dict({"turns": [{"text": "never sent", "delay": 30}]})
    agent = h.start("s1", factory=lambda model: child if model == "scripted:sub" else parent)
    result = h.run(agent, "go")
    tool_msg = agent.proxy().history().get()[2]
    assert tool_msg.is_error
    assert "did not finish within 0.2 s" in tool_msg.content
    assert result.text == "the sub-agent timed out"
    wait_until(lambda: h.system.registered("/sessions/s1/sub_agents/") == [])


def test_a_malformed_tool_call_gets_a_clear_error_and_the_loop_goes_on(h: Harness) -> None:
    agent = h.start(
        "s1",
        {"turns": [{"tool_calls": [{"name": "read_file", "arguments": "{not json"}]}, {"text": "fixed it"}]},
    )
    result = h.run(agent, "go")
    assert result.ok
    tool_msg = agent.proxy().history().get()[2]
    assert tool_msg.is_error
    assert "JSON" in tool_msg.content


def test_an_agent_that_crashes_mid_turn_restarts_with_its_history_and_reports_the_turn(h: Harness) -> None:
    FLAGS["crash"] = threading.Event()
    script = {
        "turns": [
            {"text": "working", "tool_calls": [{"name": "wait_flag", "arguments": {"flag": "crash"}}]},
            {"text": "I remember: the last turn was interrupted"},
        ]
    }
    agent = h.start("s1", script)
    pending = h.prompt(agent, "start work")
    wait_until(lambda: agent.proxy().snapshot().get().status == "executing_tools")
    agent.kill()
    interrupted = pending.get(timeout=5)
    assert interrupted.interrupted
    recovered = wait_for_event(h.system.events, "agent.recovered")
    assert recovered.data["interrupted_turn"] == interrupted.turn_id
    assert recovered.data["restarts"] == 1
    new_agent = h.agent("s1")
    assert new_agent is not agent
    history = new_agent.proxy().history().get()
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert history[-1].content.startswith("[interrupted]")
    h.system.store.flush().get(timeout=10)  # the recovered agent queued its writes; wait for their commit
    turns = dict(h.system.store.items("turns", "s1/", type=TurnRecord))
    assert turns[f"s1/{interrupted.turn_id}"].status == "interrupted"
    FLAGS["crash"].set()
    assert h.run(new_agent, "go on").text == "I remember: the last turn was interrupted"


def test_a_provider_that_fails_twice_with_500_then_succeeds(h: Harness) -> None:
    with FakeOpenAI() as server:
        server.status(500).status(500).text("third time lucky")
        settings = ProviderSettings(base_url=server.url, api_key_required=False, backoff_base=0.01, backoff_cap=0.05)
        agent = h.start("s1", factory=lambda m: OpenAIProvider("fake", settings))
        result = h.run(agent, "hi")
        assert (result.ok, result.text) == (True, "third time lucky")
        assert len(server.requests) == 3


def test_a_stream_that_stalls_ends_the_turn_with_a_clear_error(h: Harness) -> None:
    with FakeOpenAI() as server:
        server.stall().text("recovered")
        settings = ProviderSettings(base_url=server.url, api_key_required=False, stall_timeout=0.3)
        agent = h.start("s1", factory=lambda m: OpenAIProvider("fake", settings))
        result = h.run(agent, "hi")
        assert not result.ok
        assert "0.3" in (result.error or "")
        error = wait_for_event(h.system.events, "agent.error")
        assert error.data["kind"] == "StallTimeout"
        server.release_stall.set()
        assert h.run(agent, "again").text == "recovered"


def test_two_sessions_never_see_each_others_messages(h: Harness) -> None:
    a = h.start("a1", {"turns": [{"text": "answer for a"}]})
    b = h.start("b1", {"turns": [{"text": "answer for b"}]})
    sub_a = h.system.events.subscribe("agent.*", source="/sessions/a1/")
    h.run(a, "question from a")
    h.run(b, "question from b")
    assert [m.content for m in a.proxy().history().get()] == ["question from a", "answer for a"]
    assert [m.content for m in b.proxy().history().get()] == ["question from b", "answer for b"]
    seen = sub_a.drain_nowait()
    assert seen
    assert all("/a1/" in e.source for e in seen)
    assert not any("for b" in str(e.data) for e in seen)


def test_debug_state_is_off_by_default_and_never_shows_secrets(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    off = h.start("s1", {"turns": []})
    assert "debug_state" not in off.proxy().snapshot().get().tools
    register_secret("sk-live-DEBUGSECRET-123456")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-DEBUGSECRET-123456")
    on = h.start(
        "s2",
        {"turns": [{"tool_calls": [{"name": "debug_state", "arguments": {"events": 5}}]}, {"text": "ok"}]},
        debug_state=True,
    )
    h.run(on, "my key is sk-live-DEBUGSECRET-123456, inspect yourself")
    report = on.proxy().history().get()[2].content
    assert '"status": "executing_tools"' in report
    assert '"path": "/sessions/s2/agent"' in report
    assert "DEBUGSECRET" not in report


def test_a_restarted_system_restores_a_session_from_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    script = {"turns": [{"text": "first answer"}, {"text": "second answer"}]}
    with ActorSystem(store_path=store) as system:
        h = Harness(system, tmp_path)
        assert h.run(h.start("s1", script), "one").text == "first answer"
    with ActorSystem(store_path=store) as system:
        h = Harness(system, tmp_path)
        agent = h.start("s1", script)
        assert [m.content for m in agent.proxy().history().get()] == ["one", "first answer"]
        assert h.run(agent, "two").text == "second answer"


def test_the_default_step_limit_is_50_model_calls(h: Harness) -> None:
    assert AgentConfig(model="scripted:x").max_steps == 50
    call = {"name": "glob", "arguments": {"pattern": "*.txt"}}
    agent = h.start("s1", {"turns": [{"tool_calls": [call]}] * 51})
    result = h.run(agent, "loop forever", timeout=60)
    assert not result.ok
    assert result.steps == 50
    assert result.error == "the turn stopped after 50 model calls (agent.max_steps)"
    assert len([m for m in agent.proxy().history().get() if m.role == "tool"]) == 50


def test_a_scripted_model_that_runs_out_of_turns_ends_the_turn_with_a_clear_error(h: Harness) -> None:
    agent = h.start("s1", {"turns": [{"text": "the only answer"}]})
    assert h.run(agent, "first").ok
    result = h.run(agent, "second")
    assert not result.ok
    assert result.error == "script inline has 1 turns; model call 2 has none"
    error = wait_for_event(h.system.events, "agent.error")
    assert (error.data["kind"], error.data["turn_id"]) == ("ScriptExhausted", result.turn_id)
    ended = wait_for_event(h.system.events, "agent.turn_end", lambda e: e.data["turn_id"] == result.turn_id)
    assert (ended.data["status"], ended.data["error"]) == ("error", result.error)
    assert agent.proxy().snapshot().get().status == "idle"
    turns = dict(h.system.store.items("turns", "s1/", type=TurnRecord))
    assert turns[f"s1/{result.turn_id}"].status == "error"


def test_message_and_turn_events_carry_token_usage(h: Harness) -> None:
    agent = h.start(
        "s1",
        {
            "turns": [
                {"text": "looking", "tool_calls": [{"name": "glob", "arguments": {"pattern": "*"}}]},
                {"text": "ok"},
            ]
        },
    )
    result = h.run(agent, "list the files")
    ended = wait_for_event(h.system.events, "agent.turn_end", lambda e: e.data["turn_id"] == result.turn_id)
    topics = ("agent.message_start", "agent.message_end", "agent.turn_end")
    events = [e for e in h.system.events.recent(1000, source=agent.path) if e.topic in topics]
    assert [e.topic for e in events] == [*topics[:2], *topics[:2], "agent.turn_end"]
    ends = [e for e in events if e.topic == "agent.message_end"]
    assert [e.data["step"] for e in ends] == [1, 2]
    per_call = [Usage(**e.data["usage"]) for e in ends]
    assert all(u.input_tokens > 0 and u.output_tokens > 0 for u in per_call)
    assert per_call[0] + per_call[1] == result.usage
    assert Usage(**ended.data["usage"]) == result.usage


def test_debug_state_reports_real_queues_usage_and_restarts(h: Harness) -> None:
    FLAGS["gate"] = threading.Event()
    script = {
        "turns": [
            {"text": "warmed up"},
            {"tool_calls": [{"name": "debug_state", "arguments": {"events": 0}}, {"name": "glob", "arguments": {}}]},
            {"text": "seen it all"},
        ]
    }
    agent = h.start("s1", factory=lambda m: GatedScript(script, gate_at=1, flag="gate"), debug_state=True)
    first = h.run(agent, "warm up")
    agent.kill()
    wait_for_event(h.system.events, "agent.recovered")
    agent = h.agent("s1")
    pending = h.prompt(agent, "inspect yourself")
    wait_until(lambda: agent.proxy().snapshot().get().status == "streaming")
    queued = h.prompt(agent, "and then this")
    wait_for_event(h.system.events, "agent.prompt_queued")
    FLAGS["gate"].set()
    result = pending.get(timeout=20)
    assert queued.get(timeout=20) == result
    step_one = wait_for_event(
        h.system.events, "agent.message_end", lambda e: e.data["turn_id"] == result.turn_id and e.data["step"] == 1
    )
    report = json.loads(agent.proxy().history().get()[4].content)
    assert report["queues"]["pending_prompts"] == ["and then this"]
    assert report["queues"]["running_tool_calls"] == ["call_1_0", "call_1_1"]
    expected = first.usage + Usage(**step_one.data["usage"])
    assert report["usage"] == {
        "input_tokens": expected.input_tokens,
        "output_tokens": expected.output_tokens,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert report["context"]["messages"] == 4  # two prompts, an answer, this step's call
    assert report["context"]["calibrated"]
    assert expected.input_tokens > first.usage.input_tokens > 0
    assert report["restarts"] == 1


def write_skill(root: Path, folder: str, name: str, description: str) -> None:
    skill = root / ".weald" / "skills" / folder
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\nThe steps.\n")


def test_the_model_sees_the_skills_names_and_descriptions_once_per_session(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_skill(tmp_path / "project", "release", "release-xyzzy", "Cut a plugh release")
    write_skill(tmp_path / "home", "notes", "notes-frob", "Keep frob notes")
    with FakeOpenAI() as server:
        server.text("noted").text("still noted")
        settings = ProviderSettings(base_url=server.url, api_key_required=False)
        agent = h.start("s1", factory=lambda m: OpenAIProvider("fake", settings), system_prompt="Be brief.")
        h.run(agent, "hi")
        write_skill(tmp_path / "project", "late", "late-skill", "Added after the session started")
        h.run(agent, "again")
        systems = [r["messages"][0] for r in server.requests]
    assert systems[0]["role"] == "system"
    lines = systems[0]["content"].splitlines()
    assert lines[0] == "Be brief."
    assert "- notes-frob: Keep frob notes" in lines
    assert "- release-xyzzy: Cut a plugh release" in lines
    assert "use_skill" in {t["function"]["name"] for t in server.requests[0]["tools"]}
    assert systems[1] == systems[0]  # scanned once for the session, not per model call


def test_an_agent_not_offered_use_skill_is_shown_no_skills(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_skill(tmp_path / "project", "release", "release-xyzzy", "Cut a plugh release")
    with FakeOpenAI() as server:
        server.text("ok").text("ok")
        settings = ProviderSettings(base_url=server.url, api_key_required=False)
        bare = h.start("s1", factory=lambda m: OpenAIProvider("fake", settings), tool_filter=("read_file",))
        h.run(bare, "hi")
        prompted = h.start(
            "s2",
            factory=lambda m: OpenAIProvider("fake", settings),
            tool_filter=("read_file",),
            system_prompt="Be brief.",
        )
        h.run(prompted, "hi")
    assert [m["role"] for m in server.requests[0]["messages"]] == ["user"]
    assert server.requests[1]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert not any("xyzzy" in json.dumps(r) for r in server.requests)
