"""Context limits that never wedge an agent: oversized prompts and tool outputs, a calibration that survives
restarts, pruning before compacting, and compactions that do not help (runtime/agents/agent.py, context.py).

With the scripted model, which counts no tool schemas (as llama.cpp without a tool template does) and
refuses, as a server would, a request larger than its window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_agent import Harness
from test_context import LINE, Recorder, assistant, start, steps, stored, tool_result
from weald.runtime import ActorSystem
from weald.runtime.agents.agent import AgentRecord
from weald.runtime.agents.context import CompactionMark, Context, ContextConfig, is_summary, summary_message
from weald.runtime.llm import Message, ModelLimits, ProviderSettings, Usage
from weald.runtime.testing import wait_until

WORDS = "The river carries the silt of the northern hills down to the delta every spring. "  # 16 words


@pytest.fixture
def h(system: ActorSystem, tmp_path: Path) -> Harness:
    return Harness(system, tmp_path)


def answered(provider: Recorder) -> list[int]:
    """The input tokens of each turn request the model answered."""
    return [tokens for purpose, tokens in provider.answered if purpose == "turn"]


# -- the arithmetic ----------------------------------------------------------------------------------------


def test_steps_are_pruned_oldest_first_down_to_the_last_one_after_a_summary_too() -> None:
    context = Context(ModelLimits(10_000, 1_000), ContextConfig(keep_tool_results=3))
    # A summary leads with a seq above the messages it kept (it was stored after them).
    context.load(
        [
            (10, Message(role="user", content="go"), None),
            *[
                entry
                for i in range(4)
                for entry in (
                    (11 + 2 * i, assistant(f"step {i}", f"c{i}"), None),
                    (12 + 2 * i, tool_result("r" * 2_000, f"c{i}"), None),
                )
            ],
            (
                20,
                summary_message("earlier"),
                CompactionMark(first_kept=10, replaced=3, tokens_before=9, tokens_after=3, reason="auto"),
            ),
        ]
    )
    assert context.seqs[0] == 20
    floor = context.floor_chars()
    assert floor < context.chars - 4 * 1_500
    assert [context.prune_step() for _ in range(5)] == [0, 1, 1, 1, None]  # the last step's result stays
    assert [m.content.startswith("[big output pruned") for m in context.messages if m.role == "tool"] == [
        True,
        True,
        True,
        False,
    ]
    assert context.prune_all() == 1
    assert context.chars == floor
    assert context.floor_chars() == floor


def test_a_stored_calibration_comes_back_and_a_server_window_only_while_the_configured_one_is_unchanged() -> None:
    measured = Context(ModelLimits(128_000, 16_384))
    measured.append(0, Message(role="user", content="x" * 3_984))
    measured.calibrate(measured.chars + 2_000, Usage(input_tokens=900), fixed_chars=2_000)
    measured.learn_overflow(measured.chars + 2_000, limit=2_048, requested=None)
    stored_calibration = measured.calibration("llama:small")
    assert (stored_calibration.window, stored_calibration.window_of) == (2_048, 128_000)
    again = Context(ModelLimits(128_000, 16_384))
    again.append(0, Message(role="user", content="x" * 3_984))  # the same context, rebuilt from the history
    again.restore(stored_calibration, "llama:small")
    assert (again.calibrated, again.last_input_tokens, again.limits.context_window) == (True, 900, 2_048)
    assert again.tokens_for(again.chars + 2_000) == measured.tokens_for(measured.chars + 2_000)
    # The user configured the true window since: it wins over what the server once said.
    reconfigured = Context(ModelLimits(8_192, 2_048, source="configured"))
    reconfigured.restore(stored_calibration, "llama:small")
    assert (reconfigured.calibrated, reconfigured.limits.context_window) == (True, 8_192)
    # Another model: nothing of it applies.
    other = Context(ModelLimits(128_000, 16_384))
    other.restore(stored_calibration, "openai:gpt-4.1")
    assert (other.calibrated, other.limits.context_window) == (False, 128_000)


# -- oversized prompts ---------------------------------------------------------------------------------


def test_a_prompt_too_large_for_the_window_is_refused_before_its_turn_and_the_next_prompt_works(
    h: Harness,
) -> None:
    agent, providers = start(h, "s1", {"turns": [{"text": "first"}, {"text": "one"}]}, window=4_000, reserve=500)
    assert h.run(agent, "hello").ok  # calibrated: the tools are measured as the server counts them
    events = h.system.events.subscribe(["agent.prompt_refused", "agent.turn_start"], max_buffer=100)
    result = h.run(agent, WORDS * 220)  # 3,520 words, ~4,400 tokens
    assert not result.ok
    assert result.steps == 0
    error = result.error or ""
    assert error.startswith("the prompt is ~4,"), error
    assert "this agent's model takes ~3,4" in error
    assert "after its system prompt and tools" in error
    assert "a window of 4,000 tokens, 500 of them kept for the answer" in error
    seen = events.drain_nowait()
    events.close()
    assert [e.topic for e in seen] == ["agent.prompt_refused"]  # no turn started, no model call
    assert len(providers[0].requests) == 1
    # In the history, marked; not in the context.
    entry = stored(h, "s1")[-1]
    assert entry.message.content.startswith(WORDS)
    assert entry.left_out is not None
    assert entry.left_out.startswith("refused: the prompt is ~")
    assert all(not m.content.startswith(WORDS) for m in agent.proxy().history().get())
    again = h.run(agent, "hello, one word answer")
    assert (again.ok, again.text) == (True, "one")
    assert providers[0].refused == []


def test_a_prompt_the_server_finds_too_large_fails_its_turn_naming_its_size_and_does_not_wedge_the_agent(
    h: Harness,
) -> None:
    # No window configured: the agent assumes a large one until the server (window 2,048) says otherwise.
    # Before: every later prompt failed with the same context-length error, for good.
    providers: list[Recorder] = []

    def factory(model: str) -> Recorder:
        script = {"turns": [{"text": "first"}, {"text": "one"}, {"text": "two"}]}
        recorder = Recorder(script, ProviderSettings(context_window=2_048))
        recorder.settings = ProviderSettings()  # what the agent is told: nothing
        providers.append(recorder)
        return recorder

    agent = h.start("s1", factory=factory)
    assert h.run(agent, "hello").ok
    result = h.run(agent, WORDS * 200)
    assert not result.ok
    error = result.error or ""
    assert "the prompt is ~4," in error, error
    assert "a window of 2,048 tokens" in error, error
    assert "fewer tools" not in error
    history = stored(h, "s1")
    refused = [e for e in history if e.message.content.startswith(WORDS)]
    assert len(refused) == 1
    assert refused[0].left_out is not None
    for text, answer in (("hello, one word answer", "one"), ("and another", "two")):
        turn = h.run(agent, text)
        assert (turn.ok, turn.text) == (True, answer), turn.error
    # The window the server named is remembered: a restart does not have to learn it again.
    agent.kill()
    restarted = wait_until(lambda: (a := h.agent("s1")) is not agent and a)
    context = restarted.proxy().snapshot(0).get().context
    assert (context.context_window, context.window_source) == (2_048, "server")


# -- tool outputs larger than the context ------------------------------------------------------------------


def test_a_file_larger_than_the_context_is_read_a_page_at_a_time_instead_of_ending_the_turn(
    h: Harness,
) -> None:
    project = h.tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "big.txt").write_text("".join(f"{i:05d} {LINE}" for i in range(440)))  # 22 KB
    script = {
        "turns": [
            {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
            {"text": "read it"},
        ]
    }
    agent, providers = start(h, "s1", script, window=4_000, reserve=500)
    result = h.run(agent, "read big.txt")
    assert result.ok, result.error
    provider = providers[0]
    assert provider.refused == []
    assert max(answered(provider)) <= 3_500
    output = agent.proxy().history().get()[-2]
    assert output.name == "read_file"
    assert "1:" in output.content
    assert "00000 0123456789" in output.content
    assert "Call read_file with offset=" in output.content  # how to read the rest
    assert 8_000 < len(output.content) < 14_000


def test_a_tool_output_larger_than_the_context_is_cut_with_where_the_whole_is_and_how_to_read_it(
    h: Harness,
) -> None:
    script = {"turns": [*steps(3, lines=600), {"text": "done"}]}  # 27 KB an output
    agent, providers = start(h, "s1", script, window=4_000, reserve=500)
    result = h.run(agent, "run it")
    assert result.ok, result.error
    provider = providers[0]
    assert provider.refused == []
    assert max(answered(provider)) <= 3_500
    outputs = [e.message for e in stored(h, "s1") if e.message.role == "tool"]
    assert len(outputs) == 3
    for output in outputs:
        assert "[output cut: showing the first " in output.content
        assert "of 601 lines. The full output (601 lines, 26416 bytes) is saved at " in output.content
        assert "read on with read_file(path=" in output.content
        assert len(output.content) < 14_000
        saved = output.content.split("is saved at ", 1)[1].split(":", 1)[0]
        assert Path(saved).read_text().count(LINE) == 600


# -- the calibration survives a restart ----------------------------------------------------------------------


def test_a_restarted_agent_keeps_its_calibration_and_does_not_compact_a_context_that_fits(h: Harness) -> None:
    # The built-in tools' schemas are ~5,000 tokens at 4 characters a token, more than the window, but
    # the model counts none of them: only the measured estimate knows the context fits.
    turns = [*steps(2, lines=20, final="first"), {"text": "second"}, {"text": "third"}, {"text": "fourth"}]
    agent, providers = start(h, "s1", {"turns": turns}, window=4_000, reserve=500)
    assert h.run(agent, "read twice").ok
    before = agent.proxy().snapshot(0).get().context
    assert before.calibrated
    assert before.tokens < 1_000
    events = h.system.events.subscribe(["agent.compacting", "agent.pruned"], max_buffer=100)
    agent.kill()
    restarted = wait_until(lambda: (a := h.agent("s1")) is not agent and a)
    after = restarted.proxy().snapshot(0).get().context
    assert (after.calibrated, after.chars_ratio, after.last_input_tokens) == (
        True,
        before.chars_ratio,
        before.last_input_tokens,
    )
    assert after.tokens == before.tokens
    assert after.fixed_tokens == before.fixed_tokens
    assert h.run(restarted, "go on").text == "second"
    assert events.drain_nowait() == []  # nothing compacted or pruned: it fits
    assert [p for p, _ in providers[1].answered] == ["turn"]
    # A record without a calibration (an agent stored before there was one): its first estimate is a
    # guess, and a guess never compacts on its own; the request is sent, and measured.
    record = h.system.store.get("agents", "s1", type=AgentRecord)
    h.system.store.put("agents", "s1", msgspec.structs.replace(record, calibration=None))
    restarted.kill()
    guessing = wait_until(lambda: (a := h.agent("s1")) not in (agent, restarted) and a)
    guess = guessing.proxy().snapshot(0).get().context
    assert not guess.calibrated
    assert guess.tokens > 4_000  # the guess: the tools' schemas counted at 4 characters a token
    assert h.run(guessing, "and on").text == "third"
    assert events.drain_nowait() == []
    events.close()
    assert guessing.proxy().snapshot(0).get().context.calibrated
    assert [p for p, _ in providers[2].answered] == ["turn"]


# -- compaction churn ---------------------------------------------------------------------------------------------


def test_large_outputs_are_pruned_oldest_first_before_a_compaction_is_spent(h: Harness) -> None:
    # 6 KB outputs under a 4,000 window, the last 3 steps protected: 3 outputs alone exceed the
    # budget. Before: 99 compactions in 104 steps, a model call each.
    events = h.system.events.subscribe(["agent.compacting", "agent.pruned"], max_buffer=10_000)
    agent, providers = start(
        h,
        "s1",
        {"turns": steps(100, lines=130)},
        window=4_000,
        reserve=500,
        context=ContextConfig(keep_tool_results=3),
        max_steps=200,
    )
    result = h.run(agent, "work through the list", timeout=120)
    assert result.ok, result.error
    assert result.steps == 101
    provider = providers[0]
    assert provider.refused == []
    assert max(answered(provider)) <= 3_500
    topics = [e.topic for e in events.drain_nowait()]
    events.close()
    compactions = topics.count("agent.compacting")
    assert compactions <= 5, topics
    assert [p for p, _ in provider.answered].count("compaction") == compactions
    assert topics.count("agent.pruned") >= 90


def test_two_compactions_never_follow_each_other_without_a_step_between_them(h: Harness) -> None:
    long = "a sentence of the answer that goes on. " * 40
    script = {"turns": [{"text": f"{i}: {long}"} for i in range(6)], "summary": "They talked at length."}
    agent, providers = start(h, "s1", script, window=4_000, reserve=500)
    for i in range(4):
        assert h.run(agent, f"prompt {i}").ok
    assert agent.proxy().compact().get(timeout=5).get(timeout=10).compacted
    # ~3,200 tokens: with the compacted context the estimate is over the 3,500 budget (the window,
    # 4,000, still holds it). Before: compacted again at once, before any model step.
    result = h.run(agent, "next: " + "word " * 2_700)
    assert result.ok, result.error
    assert [p for p, _ in providers[0].answered] == ["turn"] * 4 + ["compaction", "turn"]
    assert providers[0].refused == []


def test_a_compaction_that_does_not_shrink_the_context_is_discarded_and_reported(h: Harness) -> None:
    script: dict[str, Any] = {
        "turns": [{"text": "yes"}, {"text": "ok"}, {"text": "after"}],
        "summary": "The user greeted the agent twice and the agent answered both times, briefly. " * 3,
    }
    agent, providers = start(h, "s1", script)
    assert h.run(agent, "hi").ok
    assert h.run(agent, "hi again").ok
    before = agent.proxy().history().get()
    result = agent.proxy().compact().get(timeout=5).get(timeout=10)
    assert not result.compacted
    assert (result.detail or "").startswith("compaction did not help: kept the original (")
    assert result.tokens_after == result.tokens_before
    assert agent.proxy().history().get() == before
    assert not any(e.compaction for e in stored(h, "s1"))
    assert not is_summary(agent.proxy().history().get()[0])
    assert h.run(agent, "then").text == "after"
    assert [p for p, _ in providers[0].answered] == ["turn", "turn", "compaction", "turn"]


def test_recall_reads_a_long_output_back_a_page_the_context_can_hold_at_a_time(h: Harness) -> None:
    script = {
        "turns": [
            *steps(1, lines=250, final="read it"),  # 11 KB: what the context could hold then
            {"text": "again", "tool_calls": [{"name": "recall", "arguments": {"seq": 2}}]},
            {"text": "more", "tool_calls": [{"name": "recall", "arguments": {"seq": 2, "offset": 100, "limit": 50}}]},
            {"text": "done"},
        ]
    }
    agent, providers = start(h, "s1", script, window=4_000, reserve=500, context=ContextConfig(keep_tool_results=1))
    assert h.run(agent, "read it").ok
    # A long prompt now takes much of the window: the output no longer fits whole beside it.
    result = h.run(agent, "read the first output again, with this in mind: " + WORDS * 90)
    assert result.ok, result.error
    assert providers[0].refused == []
    history = stored(h, "s1")
    first, second = [e.message.content for e in history if e.message.name == "recall"]
    whole = len(next(e.message.content for e in history if e.seq == 2))
    header, _, rest = first.partition("\n")
    end = int(header.split("characters 0-", 1)[1].split(" ", 1)[0])
    assert 1_000 < end < whole, header  # a page, not the whole output (which would be cut and spilled)
    assert "[output cut" not in first
    assert f"call recall with seq 2 and offset {end} for the rest" in first
    assert rest.startswith("output call_0_0\n")
    assert second.startswith(f"[message 2 (big), characters 100-150 of {whole}]\n")
