"""Context management (runtime/agents/context.py and the agent): estimates, pruning, compaction, overflow, memory bound."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_agent import FLAGS, REG, Harness
from weald.runtime import ActorSystem, Ref
from weald.runtime.agents.agent import AgentRecord, HistoryEntry, load_history
from weald.runtime.agents.context import (
    CompactionMark,
    Context,
    ContextConfig,
    is_summary,
    message_chars,
    pruned_stub,
    summary_message,
)
from weald.runtime.llm import (
    Completed,
    ContextLengthExceeded,
    Image,
    Message,
    ModelLimits,
    ModelRequest,
    ProviderSettings,
    ScriptedProvider,
    StreamEvent,
    ToolCall,
    Usage,
)
from weald.runtime.testing import wait_for_event, wait_until
from weald.tools import ToolContext, tool

LINE = "0123456789 abcdefghij ABCDEFGHIJ klmnopqrst\n"  # 45 characters


@tool(
    name="big",
    description="returns n lines of output",
    parameters={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    registry=REG,
)
def big(ctx: ToolContext, n: int) -> str:
    return f"output {ctx.call_id}\n" + LINE * n


class Recorder:
    """A scripted model (refusing requests over its window, as a server would) that records what it answered."""

    def __init__(self, script: dict[str, Any], settings: ProviderSettings | None = None) -> None:
        self.inner = ScriptedProvider.from_dict(script, settings=settings)
        self.settings = self.inner.settings
        self.model = "scripted:test"
        self.answered: list[tuple[str, int]] = []  # (purpose, reported input tokens)
        self.refused: list[str] = []
        self.requests: list[ModelRequest] = []

    @property
    def position(self) -> int:
        return self.inner.position

    def seek(self, position: int) -> None:
        self.inner.seek(position)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        try:
            async for event in self.inner.stream(request):
                if isinstance(event, Completed):
                    self.answered.append((request.purpose, event.usage.input_tokens))
                yield event
        except ContextLengthExceeded:
            self.refused.append(request.purpose)
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()


def steps(count: int, lines: int = 80, final: str = "done") -> list[dict[str, Any]]:
    """A scripted turn of ``count`` steps, each calling ``big`` for ``lines`` lines, then an answer."""
    calls = [{"text": f"step {i}", "tool_calls": [{"name": "big", "arguments": {"n": lines}}]} for i in range(count)]
    return [*calls, {"text": final}]


def start(
    h: Harness,
    session_id: str,
    script: dict[str, Any],
    *,
    window: int | None = None,
    reserve: int | None = None,
    context: ContextConfig | None = None,
    max_steps: int = 50,
) -> tuple[Ref[Any], list[Recorder]]:
    """Start a session whose every provider is a Recorder over ``script`` (one per agent start)."""
    providers: list[Recorder] = []
    settings = ProviderSettings(context_window=window, output_reserve=reserve)

    def factory(model: str) -> Recorder:
        providers.append(Recorder(script, settings))
        return providers[-1]

    extra: dict[str, Any] = {"context": context} if context is not None else {}
    agent = h.start(session_id, factory=factory, max_steps=max_steps, **extra)
    return agent, providers


@pytest.fixture
def h(system: ActorSystem, tmp_path: Path) -> Harness:
    return Harness(system, tmp_path)


def stored(h: Harness, key: str) -> list[HistoryEntry]:
    h.system.store.flush().get(timeout=10)
    return load_history(h.system.store, key)


# -- the arithmetic ------------------------------------------------------------------------------------


def tool_result(text: str, call_id: str = "c") -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id, name="big")


def assistant(text: str = "", call_id: str | None = "c") -> Message:
    calls = [ToolCall(id=call_id, name="big", arguments={}, raw_arguments="{}")] if call_id else []
    return Message(role="assistant", content=text, tool_calls=calls)


def test_the_estimate_is_anchored_on_reported_usage_and_measures_the_ratio_of_what_was_added() -> None:
    context = Context(ModelLimits(context_window=10_000, output_reserve=1_000))
    context.append(0, Message(role="user", content="x" * 3_984))  # 4,000 characters with framing
    assert context.tokens_for(context.chars) == 1_000  # 4 characters per token before any report
    context.calibrate(context.chars, Usage(input_tokens=600, cache_read_tokens=400))
    assert context.tokens_for(context.chars) == 1_000  # anchored: exactly what was reported
    context.append(1, tool_result("y" * 5_984))  # 6,000 more
    context.calibrate(context.chars, Usage(input_tokens=4_000))  # those cost 3,000 tokens: 2 per token
    assert context.chars_per_token == 2.0
    assert context.tokens_for(context.chars + 2_000) == 4_000 + 1_000
    stats = context.stats(None, [])
    assert (stats.tokens, stats.input_budget, stats.calibrated, stats.last_input_tokens) == (4_000, 9_000, True, 4_000)


def test_a_servers_overflow_report_calibrates_the_estimate_and_narrows_the_window() -> None:
    context = Context(ModelLimits(context_window=128_000, output_reserve=16_384))
    context.append(0, Message(role="user", content="z" * 9_984))
    context.learn_overflow(context.chars, limit=2_048, requested=3_000)
    assert context.tokens_for(context.chars) == 3_000
    assert (context.limits.context_window, context.limits.output_reserve, context.limits.source) == (
        2_048,
        512,
        "server",
    )


def test_pruning_stubs_tool_outputs_older_than_the_kept_steps_with_a_way_back() -> None:
    context = Context(ModelLimits(10_000, 1_000), ContextConfig(keep_tool_results=2))
    context.append(0, Message(role="user", content="go"))
    seq = 1
    for step in range(4):
        context.append(seq, assistant(f"step {step}", f"c{step}"))
        context.append(seq + 1, tool_result("r" * 2_000, f"c{step}"))
        seq += 2
    before = context.chars
    assert context.prune() == 2
    stubs = [m for m in context.messages if m.role == "tool" and m.content.startswith("[big output pruned")]
    assert [m.tool_call_id for m in stubs] == ["c0", "c1"]
    assert 'call recall with {"seq": 2}' in stubs[0].content
    assert "2000 characters" in stubs[0].content
    assert context.chars < before - 3_000
    assert context.pruned_before == 5  # the first kept step's assistant message
    assert context.prune() == 0  # nothing new to prune
    assert context.prune_all_but_last_step() == 1  # the last resort spares only the last step


def test_a_compaction_cut_keeps_whole_steps_and_summarizes_the_rest_as_a_transcript() -> None:
    context = Context(ModelLimits(4_000, 1_000), ContextConfig(keep_recent=0.3))  # keeps ~3,600 characters
    context.append(0, Message(role="user", content="please fix the build"))
    for i in range(6):
        context.append(1 + 2 * i, assistant(f"look {i}", f"c{i}"))
        context.append(2 + 2 * i, tool_result(f"result {i} " + "q" * 1_500, f"c{i}"))
    split = context.compaction_split()
    assert split is not None
    assert context.messages[split].role == "assistant"  # never between a call and its result
    assert sum(len(m.content) for m in context.messages[split:]) <= 3_600
    request = context.compaction_request(split)
    assert request.purpose == "compaction"
    assert request.tools == []
    assert [m.role for m in request.messages] == ["user"]
    transcript = request.messages[0].content
    assert "User: please fix the build" in transcript
    assert "[Assistant called big {}]" in transcript
    assert "[Result of big: result 0" in transcript
    first_kept = context.seqs[split]
    context.apply_compaction(split, 99, summary_message("the build was looked at"))
    assert is_summary(context.messages[0])
    assert context.seqs[0] == 99
    assert context.seqs[1] == first_kept
    # A prompt and its answer: nothing worth a summary.
    lone = Context(ModelLimits(4_000, 1_000))
    lone.append(0, Message(role="user", content="hi"))
    lone.append(1, Message(role="assistant", content="hello"))
    assert lone.compaction_split() is None
    # Prompts whose turns all failed (no answer at all) are compacted too, or they would pile up.
    failed = Context(ModelLimits(4_000, 1_000))
    for i in range(3):
        failed.append(i, Message(role="user", content=f"prompt {i} " + "f" * 2_000))
    assert failed.compaction_split() == 2


def test_the_context_is_rebuilt_from_the_last_compaction_mark() -> None:
    entries: list[tuple[int, Message, CompactionMark | None]] = [
        (0, Message(role="user", content="one"), None),
        (1, Message(role="assistant", content="first"), None),
        (2, Message(role="user", content="two"), None),
        (
            3,
            summary_message("old summary"),
            CompactionMark(first_kept=2, replaced=2, tokens_before=9, tokens_after=3, reason="auto"),
        ),
        (4, Message(role="assistant", content="second"), None),
        (5, Message(role="user", content="three"), None),
        (
            6,
            summary_message("new summary"),
            CompactionMark(first_kept=5, replaced=3, tokens_before=9, tokens_after=3, reason="manual"),
        ),
        (7, Message(role="assistant", content="third"), None),
        (8, tool_result("p" * 1_000), None),
    ]
    context = Context(ModelLimits(10_000, 1_000))
    context.load(entries, pruned_before=9)
    assert context.seqs == [6, 5, 7, 8]
    assert context.messages[0].content.endswith("new summary")
    assert context.messages[-1].content.startswith("[big output pruned")
    plain = Context(ModelLimits(10_000, 1_000))
    plain.load(entries[:3])
    assert [m.content for m in plain.messages] == ["one", "first", "two"]


def test_an_image_in_a_tool_result_counts_and_is_pruned_with_its_text() -> None:
    screenshot = Image(mime_type="image/png", data="iVBORw0KGgo=")
    shot = Message(role="tool", content="a screenshot", tool_call_id="c0", name="browser", images=[screenshot])
    assert message_chars(shot) == message_chars(tool_result("a screenshot", "c0")) + 400
    context = Context(ModelLimits(10_000, 1_000), ContextConfig(keep_tool_results=1))
    context.append(0, Message(role="user", content="look"))
    context.append(1, assistant("first", "c0"))
    context.append(2, shot)
    context.append(3, assistant("second", "c1"))
    assert context.prune() == 1  # short text, but an image: worth pruning
    stub = context.messages[2]
    assert (stub.images, stub.tool_call_id) == ([], "c0")
    assert stub.content.startswith("[browser output and its 1 image(s) pruned")


def test_a_pruned_stub_keeps_the_call_it_answers() -> None:
    stub = pruned_stub(tool_result("w" * 500, "call_7"), 42)
    assert (stub.role, stub.tool_call_id, stub.name) == ("tool", "call_7", "big")


# -- agents --------------------------------------------------------------------------------------------


def test_a_long_session_keeps_every_request_under_the_window_by_pruning_and_compacting(h: Harness) -> None:
    window, reserve = 6_000, 1_000
    events = h.system.events.subscribe(["agent.pruned", "agent.compacted", "agent.context_overflow"], max_buffer=10_000)
    agent, providers = start(h, "s1", {"turns": steps(300)}, window=window, reserve=reserve, max_steps=400)
    result = h.run(agent, "work through the whole list", timeout=120)
    assert result.ok, result.error
    assert result.steps == 301
    provider = providers[0]
    turns = [tokens for purpose, tokens in provider.answered if purpose == "turn"]
    assert len(turns) == 301
    assert max(turns) <= window - reserve, f"largest request {max(turns)} tokens"
    assert provider.refused == []
    topics = [e.topic for e in events.drain_nowait()]
    events.close()
    assert topics.count("agent.pruned") >= 10
    assert topics.count("agent.compacted") >= 2
    assert "agent.context_overflow" not in topics
    # The agent holds its context, not its history: the store has every message.
    history = stored(h, "s1")
    assert [e.seq for e in history] == list(range(len(history)))
    context = agent.proxy().history().get()
    assert len(context) < len(history) / 2
    assert is_summary(context[0])
    marks = [e.compaction for e in history if e.compaction is not None]
    assert len(marks) == topics.count("agent.compacted")
    assert [m.first_kept for m in marks] == sorted(m.first_kept for m in marks)
    assert all(m.tokens_after < m.tokens_before for m in marks)
    outputs = [e for e in history if e.message.role == "tool"]
    assert all(e.message.content.startswith("output call_") for e in outputs)  # never rewritten on disk
    snapshot = agent.proxy().snapshot(0).get()
    assert snapshot.context.compactions == len(marks)
    assert snapshot.message_count == len(history)


def test_a_request_refused_as_too_long_is_compacted_once_and_sent_again(h: Harness) -> None:
    # No proactive management: the scripted model, like a server, refuses what exceeds its window.
    agent, providers = start(
        h, "s1", {"turns": steps(12, lines=60, final="all read")}, window=5_000, context=ContextConfig(auto=False)
    )
    result = h.run(agent, "read everything", timeout=60)
    assert result.ok, result.error
    assert result.text == "all read"
    overflow = wait_for_event(h.system.events, "agent.context_overflow")
    assert overflow.data["limit"] == 5_000
    compacted = wait_for_event(h.system.events, "agent.compacted")
    assert compacted.data["reason"] == "overflow"
    provider = providers[0]
    assert provider.refused.count("turn") >= 1
    assert len([p for p, _ in provider.answered if p == "turn"]) == 13  # every scripted step answered once


def test_a_step_refused_again_after_a_compaction_ends_the_turn_with_a_clear_error(h: Harness) -> None:
    too_long = {
        "status": 400,
        "message": "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens.",
    }
    script = {
        "turns": [{"text": "first answer: " + "a detail to remember. " * 100}, {"error": too_long}, {"error": too_long}]
    }
    agent, _ = start(h, "s1", script)
    assert h.run(agent, "one").ok
    result = h.run(agent, "two")
    assert not result.ok
    assert "does not fit its context window of 4096 tokens" in (result.error or "")
    assert "the step was compacted and sent again, and it still does not fit" in (result.error or "")
    # The server counted 9,000 tokens for a request of a few words: the tools are the cause, and it says so.
    assert "the system prompt and the tools' descriptions alone take ~" in (result.error or "")
    assert wait_for_event(h.system.events, "agent.compacted").data["reason"] == "overflow"


def test_compact_between_turns_summarizes_and_the_next_turn_starts_from_the_summary(h: Harness) -> None:
    script = {"turns": [*steps(3, lines=5, final="first"), {"text": "second"}], "summary": "They read three files."}
    agent, providers = start(h, "s1", script)
    assert h.run(agent, "read").ok
    result = agent.proxy().compact().get(timeout=10).get(timeout=10)
    assert result.compacted
    assert result.tokens_after < result.tokens_before
    context = agent.proxy().history().get()
    assert is_summary(context[0])
    assert context[0].content.endswith("They read three files.")
    assert h.run(agent, "again").text == "second"
    last = providers[0].requests[-1]
    assert last.messages[0] == context[0]
    entry = next(e for e in stored(h, "s1") if e.compaction is not None)
    assert entry.compaction.reason == "manual"
    record = h.system.store.get("agents", "s1", type=AgentRecord)
    assert record.context_from == entry.compaction.first_kept
    assert record.compactions == 1


def test_compact_during_a_turn_runs_before_the_next_model_call(h: Harness) -> None:
    FLAGS["compact"] = threading.Event()
    script = {
        "turns": [
            {"text": "first: " + "a detail to remember. " * 40},
            {"text": "wait", "tool_calls": [{"name": "wait_flag", "arguments": {"flag": "compact"}}]},
            {"text": "after"},
        ],
        "summary": "They asked one thing.",
    }
    agent, providers = start(h, "s1", script)
    assert h.run(agent, "one").ok
    pending = h.prompt(agent, "two")
    wait_until(lambda: agent.proxy().snapshot().get().status == "executing_tools")
    compaction = agent.proxy().compact().get(timeout=5)
    FLAGS["compact"].set()
    assert compaction.get(timeout=10).compacted
    assert pending.get(timeout=10).text == "after"
    purposes = [r.purpose for r in providers[0].requests]
    assert purposes == ["turn", "turn", "compaction", "turn"]


def test_a_context_of_one_step_has_nothing_to_compact(h: Harness) -> None:
    agent, _ = start(h, "s1", {"turns": [{"text": "hi"}]})
    assert h.run(agent, "hello").ok
    result = agent.proxy().compact().get(timeout=5).get(timeout=5)
    assert not result.compacted
    assert result.detail.startswith("nothing to compact")


def test_abort_stops_a_compaction_and_leaves_the_context_as_it_was(h: Harness) -> None:
    script = {"turns": steps(2, lines=5), "summary_delay": 30}
    agent, _ = start(h, "s1", script)
    assert h.run(agent, "go").ok
    before = agent.proxy().history().get()
    pending = agent.proxy().compact().get(timeout=5)
    wait_until(lambda: agent.proxy().snapshot().get().status == "compacting")
    assert agent.proxy().abort().get(timeout=5)
    result = pending.get(timeout=5)
    assert (result.compacted, result.detail) == (False, "aborted")
    assert agent.proxy().snapshot().get().status == "idle"
    assert agent.proxy().history().get() == before
    assert all(e.compaction is None for e in stored(h, "s1"))


def test_a_prompt_sent_during_a_compaction_between_turns_runs_after_it(h: Harness) -> None:
    script = {"turns": [*steps(2, lines=5), {"text": "next turn"}], "summary_delay": 0.3}
    agent, providers = start(h, "s1", script)
    assert h.run(agent, "go").ok
    compaction = agent.proxy().compact().get(timeout=5)
    wait_until(lambda: agent.proxy().snapshot().get().status == "compacting")
    turn = h.prompt(agent, "and then")
    assert compaction.get(timeout=10).compacted
    assert turn.get(timeout=10).text == "next turn"
    assert is_summary(providers[0].requests[-1].messages[0])


def test_an_agent_killed_during_a_compaction_restarts_from_the_context_before_it(h: Harness) -> None:
    delays = iter([30.0, 0.0, 0.0])
    providers: list[Recorder] = []

    def factory(model: str) -> Recorder:
        providers.append(Recorder({"turns": [*steps(3, lines=5), {"text": "later"}], "summary_delay": next(delays)}))
        return providers[-1]

    agent = h.start("s1", factory=factory)
    assert h.run(agent, "go").ok
    before = agent.proxy().history().get()
    pending = agent.proxy().compact().get(timeout=5)
    wait_until(lambda: agent.proxy().snapshot().get().status == "compacting")
    agent.kill()
    assert not pending.get(timeout=5).compacted
    restarted = wait_until(lambda: (a := h.agent("s1")) is not agent and a)
    wait_until(lambda: restarted.proxy().snapshot().get().restarts == 1)
    assert restarted.proxy().history().get() == before
    assert all(e.compaction is None for e in stored(h, "s1"))
    # The next compaction completes, and a later restart starts from it.
    assert restarted.proxy().compact().get(timeout=5).get(timeout=10).compacted
    summarized = restarted.proxy().history().get()
    restarted.kill()
    again = wait_until(lambda: (a := h.agent("s1")) not in (agent, restarted) and a)
    wait_until(lambda: again.proxy().snapshot().get().restarts == 2)
    assert again.proxy().history().get() == summarized
    assert again.proxy().snapshot().get().context.summarized


def test_the_context_in_memory_stays_bounded_while_the_history_grows(h: Harness) -> None:
    # Long prompts and no tool output: only compaction (not pruning) can keep the context small.
    agent, _ = start(h, "s1", {"turns": [{"text": f"ok {i}"} for i in range(60)]}, window=4_000, reserve=500)
    sizes = []
    for i in range(60):
        assert h.run(agent, f"prompt {i}: " + "remember this. " * 70).ok
        sizes.append(sum(len(m.content) for m in agent.proxy().history().get()))
    history = stored(h, "s1")
    assert len([e for e in history if e.compaction is None]) == 60 * 2
    assert sum(e.compaction is not None for e in history) >= 3
    stored_chars = sum(len(e.message.content) for e in history if e.compaction is None)
    assert stored_chars > 60_000
    assert max(sizes) < 3_500 * 5  # under the input budget, at most 5 characters per estimated token


def test_recall_reads_a_pruned_output_back_from_the_store(h: Harness) -> None:
    script = {
        "turns": [
            *steps(5, lines=40, final="read"),
            {"text": "recalling", "tool_calls": [{"name": "recall", "arguments": {"seq": 2}}]},
            {"text": "got it"},
        ]
    }
    agent, _ = start(h, "s1", script, window=2_000, reserve=200, context=ContextConfig(keep_tool_results=1))
    assert h.run(agent, "read").ok
    context = agent.proxy().history().get()
    stub = next(m for m in context if m.role == "tool" and m.content.startswith("[big output pruned"))
    assert 'recall with {"seq": 2}' in stub.content
    assert h.run(agent, "what did the first read say?").ok
    recalled = stored(h, "s1")[-2].message
    assert recalled.name == "recall"
    assert recalled.content.startswith("[message 2 (big), characters 0-")
    assert "output call_0_0\n" + LINE in recalled.content


def test_recall_reads_a_message_written_moments_before_while_it_is_still_queued(h: Harness) -> None:
    # Nothing hands the store's gathered writes to its committer but a flush, which a turn makes only
    # at its start and its end: the read_file result is still queued when recall asks for it.
    h.system.store.handover_delay = 60.0
    script = {
        "turns": [
            {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"text": "recalling", "tool_calls": [{"name": "recall", "arguments": {"seq": 2}}]},
            {"text": "got it"},
        ]
    }
    agent, _ = start(h, "s1", script)
    result = h.run(agent, "read, then read it again")
    assert result.ok, result.error
    recalled = agent.proxy().history().get()[-2]
    assert (recalled.name, recalled.is_error) == ("recall", False), recalled.content
    assert recalled.content.startswith("[message 2 (read_file), characters 0-")
    assert "alpha" in recalled.content


def test_a_sub_agent_manages_its_own_context(h: Harness) -> None:
    child = {"turns": steps(30, lines=40, final="child done")}
    children: list[Recorder] = []
    parent = Recorder(
        {
            "turns": [
                {"tool_calls": [{"name": "sub_agent", "arguments": {"task": "read", "model": "scripted:child"}}]},
                {"text": "parent done"},
            ]
        }
    )

    def factory(model: str) -> Any:
        if model == "scripted:child":
            children.append(Recorder(child, ProviderSettings(context_window=3_000, output_reserve=300)))
            return children[-1]
        return parent

    agent = h.start("s1", factory=factory)
    assert h.run(agent, "delegate", timeout=60).text == "parent done"
    assert children[0].refused == []
    assert max(t for p, t in children[0].answered if p == "turn") <= 2_700
    h.system.store.flush().get(timeout=10)
    (key,) = h.system.store.keys("agents", "s1.sub-")
    record = h.system.store.get("agents", key, type=AgentRecord)
    assert record.pruned_before > 0
    last = children[0].requests[-1]
    assert any(m.content.startswith("[big output pruned") for m in last.messages)
    assert max(t for p, t in parent.answered) < 1_000  # the parent sees only the child's answer
