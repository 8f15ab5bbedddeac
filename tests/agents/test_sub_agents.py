"""Sub-agents (runtime/agents/session.py, tools/sub_agent.py): nesting, ids, concurrency, forwarded events, questions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from test_agent import Harness
from weald.runtime import ActorSystem
from weald.runtime.agents.agent import AgentConfig, load_history
from weald.runtime.llm import ModelRequest, ScriptedProvider, StreamEvent
from weald.runtime.testing import wait_for_event


@pytest.fixture
def h(system: ActorSystem, tmp_path: Path) -> Harness:
    return Harness(system, tmp_path)


class Recorder:
    """A scripted model that keeps every request it is sent."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.inner = ScriptedProvider.from_dict({"turns": turns})
        self.requests: list[ModelRequest] = []

    @property
    def tools(self) -> list[str]:
        return [t.name for t in self.requests[0].tools]

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        async for event in self.inner.stream(request):
            yield event

    async def aclose(self) -> None:
        await self.inner.aclose()


def delegate(task: str, model: str, **arguments: Any) -> dict[str, Any]:
    """A scripted turn that calls sub_agent once."""
    return {"tool_calls": [{"name": "sub_agent", "arguments": {"task": task, "model": model, **arguments}}]}


def models(top: Any, **by_name: Any) -> Callable[[str], Any]:
    """A provider factory: ``scripted:<name>`` gets ``by_name[name]``, anything else ``top``."""
    return lambda model: by_name.get(model.removeprefix("scripted:"), top)


def sub_agents(system: ActorSystem) -> list[str]:
    """The store keys of a session s1's sub-agents."""
    system.store.flush().get(timeout=10)
    return sorted(system.store.keys("agents", "s1.sub-"))


def sub_history(h: Harness, agent_id: str) -> list[tuple[str, str]]:
    h.system.store.flush().get(timeout=10)
    return [(e.message.role, e.message.content) for e in load_history(h.system.store, f"s1.{agent_id}")]


def test_sub_agents_nest_to_the_default_depth_and_the_grandchilds_answer_reaches_the_top(h: Harness) -> None:
    assert AgentConfig(model="scripted:x").max_depth == 2
    top = Recorder([delegate("ask your helper", "scripted:child"), {"text": "the top heard: done"}])
    child = Recorder([delegate("say done", "scripted:grandchild"), {"text": "my helper said: done"}])
    grandchild = Recorder(
        [
            {"tool_calls": [{"name": "sub_agent", "arguments": {"task": "deeper"}}]},
            {"text": "done"},
        ]
    )
    agent = h.start("s1", factory=models(top, child=child, grandchild=grandchild))
    result = h.run(agent, "go")
    assert (result.ok, result.text) == (True, "the top heard: done")
    # Both scripts number their first call call_0_0; the ids still differ, in start order.
    assert sub_agents(h.system) == ["s1.sub-1-call_0_0", "s1.sub-2-call_0_0"]
    assert sub_history(h, "sub-2-call_0_0")[-1] == ("assistant", "done")
    assert ("tool", "done") in sub_history(h, "sub-1-call_0_0")
    assert agent.proxy().history().get()[2].content == "my helper said: done"
    # At depth 2 the tool is not offered, and a call to it anyway is refused.
    assert "sub_agent" in top.tools
    assert "sub_agent" in child.tools
    assert "sub_agent" not in grandchild.tools
    refused = sub_history(h, "sub-2-call_0_0")[2]
    assert refused[0] == "tool"
    assert "no tool named 'sub_agent'" in refused[1]


def test_a_sub_agent_id_is_never_reused_after_the_system_restarts(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    script = {"turns": [delegate("first task", "scripted:child"), {"text": "one"}]}
    script["turns"] += [delegate("second task", "scripted:child"), {"text": "two"}]

    def factory(model: str) -> Any:
        chosen = {"turns": [{"text": "child answer"}]} if model == "scripted:child" else script
        return ScriptedProvider.from_dict(chosen)

    with ActorSystem(store_path=store) as system:
        h = Harness(system, tmp_path)
        assert h.run(h.start("s1", factory=factory), "a").ok
    with ActorSystem(store_path=store) as system:
        h = Harness(system, tmp_path)
        result = h.run(h.start("s1", factory=factory), "b")
        assert (result.ok, result.text) == (True, "two")
        assert sub_agents(system) == ["s1.sub-1-call_0_0", "s1.sub-2-call_2_0"]
        assert sub_history(h, "sub-2-call_2_0") == [("user", "second task"), ("assistant", "child answer")]


def test_several_sub_agents_run_at_once(h: Harness) -> None:
    top = ScriptedProvider.from_dict(
        {
            "turns": [
                {
                    "tool_calls": [
                        {"name": "sub_agent", "arguments": {"task": "a", "model": "scripted:a"}},
                        {"name": "sub_agent", "arguments": {"task": "b", "model": "scripted:b"}},
                    ]
                },
                {"text": "both done"},
            ]
        }
    )
    a = ScriptedProvider.from_dict({"turns": [{"text": "A", "delay": 0.5}]})
    b = ScriptedProvider.from_dict({"turns": [{"text": "B", "delay": 0.5}]})
    agent = h.start("s1", factory=models(top, a=a, b=b))
    assert h.run(agent, "go").text == "both done"
    assert [m.content for m in agent.proxy().history().get()[2:4]] == ["A", "B"]

    def seqs(topic: str) -> list[int]:
        return [e.seq for e in h.system.events.recent(1000, topic=topic, source="/sessions/s1/sub_agents/")]

    started, finished = seqs("agent.message_start"), seqs("agent.message_end")
    assert len(started) == len(finished) == 2
    assert max(started) < min(finished)  # both models were called before either answered


def test_a_sub_agent_uses_its_own_tool_filter_and_system_prompt(h: Harness) -> None:
    top = ScriptedProvider.from_dict(
        {
            "turns": [
                delegate("read notes.txt", "scripted:child", tools=["read_file"], system_prompt="You read carefully."),
                {"text": "ok"},
            ]
        }
    )
    child = Recorder(
        [
            {"tool_calls": [{"name": "glob", "arguments": {"pattern": "*"}}]},
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"text": "alpha and beta"},
        ]
    )
    agent = h.start("s1", factory=models(top, child=child))
    assert h.run(agent, "go").ok
    assert child.tools == ["read_file"]
    assert {r.system for r in child.requests} == {"You read carefully."}
    history = sub_history(h, "sub-1-call_0_0")
    assert "no tool named 'glob'" in history[2][1]
    assert "beta" in history[4][1]
    assert agent.proxy().history().get()[2].content == "alpha and beta"


def test_a_question_from_a_depth_2_sub_agent_reaches_the_top_and_the_answer_comes_back_down(h: Harness) -> None:
    top = ScriptedProvider.from_dict({"turns": [delegate("find out", "scripted:child"), {"text": "top: blue"}]})
    child = ScriptedProvider.from_dict({"turns": [delegate("ask", "scripted:grandchild"), {"text": "child: blue"}]})
    grandchild = ScriptedProvider.from_dict(
        {
            "turns": [
                {
                    "tool_calls": [
                        {"name": "ask_user", "arguments": {"question": "colour?", "choices": ["blue", "red"]}}
                    ]
                },
                {"text": "grandchild: blue"},
            ]
        }
    )
    agent = h.start("s1", factory=models(top, child=child, grandchild=grandchild))
    pending = h.prompt(agent, "go")
    asked = wait_for_event(h.system.events, "question.asked")
    assert asked.source == agent.path
    assert asked.data["asked_by"] == "/sessions/s1/sub_agents/sub-2-call_0_0"
    assert agent.proxy().answer(asked.data["question_id"], "blue").get() is True
    assert pending.get(timeout=20).text == "top: blue"
    assert sub_history(h, "sub-2-call_0_0")[2] == ("tool", "The user answered: blue")
    assert ("tool", "grandchild: blue") in sub_history(h, "sub-1-call_0_0")


def test_a_sub_agents_tool_events_are_forwarded_tagged_with_the_parent_call_id(h: Harness) -> None:
    # The top agent's own glob runs beside its sub_agent call: it must not be forwarded.
    look = {"name": "sub_agent", "arguments": {"task": "look", "model": "scripted:child"}}
    glob = {"name": "glob", "arguments": {"pattern": "*"}}
    top = ScriptedProvider.from_dict({"turns": [{"tool_calls": [look, glob]}, {"text": "done"}]})
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}
    child = ScriptedProvider.from_dict({"turns": [read, delegate("look too", "scripted:grandchild"), {"text": "c"}]})
    grandchild = ScriptedProvider.from_dict({"turns": [read, {"text": "g"}]})
    agent = h.start("s1", factory=models(top, child=child, grandchild=grandchild))
    assert h.run(agent, "go").ok
    child_path = "/sessions/s1/sub_agents/sub-1-call_0_0"
    grandchild_path = "/sessions/s1/sub_agents/sub-2-call_1_0"
    forwarded = h.system.events.recent(1000, topic="tool.sub_agent", source="/sessions/s1/tool_runner")
    at_top = [e.data for e in forwarded if e.data["agent"] == agent.path]
    assert {d["parent_call_id"] for d in at_top} == {"call_0_0"}

    def inner(data: dict[str, Any]) -> tuple[str, str | None, str | None]:
        return data["topic"], data["data"].get("agent"), data["data"].get("tool")

    seen = {inner(d) for d in at_top}
    assert ("agent.message_end", None, None) in seen  # the child's own events, as before
    # The child's tool calls...
    assert ("tool.started", child_path, "read_file") in seen
    assert ("tool.finished", child_path, "read_file") in seen
    # ...and, inside its sub_agent call's output, its own sub-agent's, tagged with the child's call id.
    nested = {(*inner(d["data"]), d["data"]["parent_call_id"]) for d in at_top if d["topic"] == "tool.sub_agent"}
    assert ("tool.started", grandchild_path, "read_file", "call_1_0") in nested
    assert ("tool.finished", grandchild_path, "read_file", "call_1_0") in nested
    # Only the child's calls: never the top agent's glob.
    tool_events = [d for d in at_top if d["topic"].startswith("tool.")]
    assert {d["data"]["agent"] for d in tool_events} == {child_path}
