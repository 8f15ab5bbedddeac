"""The scripted provider: deterministic replay of a JSON script."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import trio
import trio.testing
from weald.runtime.llm import (
    AuthenticationError,
    Completed,
    HTTPErrorFault,
    Image,
    MalformedScriptError,
    Message,
    ModelRequest,
    ScriptedProvider,
    ScriptExhausted,
    ServerError,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStarted,
    make_provider,
)

from ._server import collect

pytestmark = [pytest.mark.trio, pytest.mark.timeout(20)]

SCRIPT = {
    "turns": [
        {
            "text": "Let me read the README first.",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "README.md"}},
                {"name": "grep", "arguments": {"pattern": "TODO"}},
            ],
        },
        {"text": "All done."},
    ]
}


def ask(content: str = "go") -> ModelRequest:
    return ModelRequest(model="", messages=[Message(role="user", content=content)])


async def completed(provider: ScriptedProvider) -> Completed:
    events = await collect(provider, ask())
    last = events[-1]
    assert isinstance(last, Completed)
    return last


async def test_each_call_consumes_the_next_turn_in_order() -> None:
    provider = ScriptedProvider.from_dict(SCRIPT)
    events = await collect(provider, ask())

    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Let me read the README first."
    assert 1 < sum(isinstance(e, TextDelta) for e in events) <= 4
    assert [e for e in events if not isinstance(e, TextDelta | Completed)] == [
        ToolCallStarted(index=0, id="call_0_0", name="read_file"),
        ToolCallDelta(index=0, arguments_fragment='{"path":"README.md"}'),
        ToolCallStarted(index=1, id="call_0_1", name="grep"),
        ToolCallDelta(index=1, arguments_fragment='{"pattern":"TODO"}'),
    ]
    first = events[-1]
    assert isinstance(first, Completed)
    assert first.stop_reason == "tool_use"
    assert [call.arguments for call in first.message.tool_calls] == [
        {"path": "README.md"},
        {"pattern": "TODO"},
    ]
    assert provider.position == 1

    second = await completed(provider)
    assert second.message == Message(role="assistant", content="All done.")
    assert second.stop_reason == "end_turn"
    assert provider.position == 2


async def test_the_provider_records_what_it_was_sent_images_included_the_last_64_calls() -> None:
    provider = ScriptedProvider.from_dict({"turns": [{"text": "seen"}] * 70})
    image = Image("image/png", "iVBORw0KGgo=")
    shown = ModelRequest(model="", messages=[Message(role="user", content="look", images=[image])])
    await collect(provider, shown)
    assert list(provider.requests) == [shown]
    for n in range(69):
        await collect(provider, ask(str(n)))
    assert len(provider.requests) == 64
    assert provider.requests[-1].messages[0].content == "68"


async def test_replays_are_deterministic() -> None:
    runs = []
    for _ in range(2):
        provider = ScriptedProvider.from_dict(SCRIPT)
        runs.append([await collect(provider, ask("same")) for _ in range(2)])
    assert runs[0] == runs[1]
    usage = runs[0][0][-1].usage  # type: ignore[union-attr]
    assert usage.input_tokens == 1  # "same" is 4 characters
    assert usage.output_tokens > 0


async def test_running_out_of_turns_says_how_many_there_were() -> None:
    provider = ScriptedProvider.from_dict(SCRIPT, name="demo.json")
    await collect(provider, ask())
    await collect(provider, ask())
    with pytest.raises(ScriptExhausted) as info:
        await collect(provider, ask())
    assert str(info.value) == "script demo.json has 2 turns; model call 3 has none"
    assert provider.position == 2


async def test_a_script_file_is_loaded_and_named_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"turns": [{"text": "hi"}]}))
    provider = make_provider(f"scripted:{path}")
    assert isinstance(provider, ScriptedProvider)
    assert provider.model == str(path)
    assert (await completed(provider)).message.content == "hi"
    with pytest.raises(ScriptExhausted, match=f"script {path} has 1 turns"):
        await collect(provider, ask())


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"turns": [{"text": 5}]}', r"\$\.turns\[0\]\.text"),
        ('{"turns": [{"txt": "typo"}]}', r"unknown field `txt`.*\$\.turns\[0\]"),
        ('{"turns": [{"tool_calls": [{"arguments": {}}]}]}', r"`name`.*\$\.turns\[0\]\.tool_calls\[0\]"),
        ('{"turns": [{"delay": -1}]}', r"\$\.turns\[0\]\.delay"),
        ('{"turns": [{"error": {"status": 99}}]}', r"\$\.turns\[0\]\.error\.status"),
        ("{}", r"`turns`"),
        ('{"turns": [', r"not valid JSON"),
    ],
)
async def test_a_malformed_script_names_the_file_and_the_bad_field(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(MalformedScriptError, match=expected) as info:
        ScriptedProvider.from_file(path)
    assert str(path) in str(info.value)


async def test_a_missing_script_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MalformedScriptError, match=r"cannot read script .*nope\.json"):
        ScriptedProvider.from_file(tmp_path / "nope.json")


async def test_raw_string_arguments_script_a_malformed_tool_call() -> None:
    provider = ScriptedProvider.from_dict({"turns": [{"tool_calls": [{"name": "edit", "arguments": "{not json"}]}]})
    [call] = (await completed(provider)).message.tool_calls
    assert call.arguments is None
    assert call.raw_arguments == "{not json"
    assert call.error is not None
    assert "edit" in call.error


async def test_a_delay_is_waited_and_a_cancelled_call_spends_its_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = ScriptedProvider.from_dict(
        {"turns": [{"text": "aborted", "delay": 30}, {"text": "slow", "delay": 20}, {"text": "next"}]}
    )
    with trio.move_on_after(10) as scope:
        await collect(provider, ask())
    assert scope.cancelled_caught
    assert provider.position == 1  # like a real model call: sent, then abandoned

    start = trio.current_time()
    assert (await completed(provider)).message.content == "slow"
    assert trio.current_time() - start >= 20
    assert provider.position == 2


async def test_error_turns_raise_the_error_for_their_status() -> None:
    provider = ScriptedProvider.from_dict(
        {
            "turns": [
                {"error": {"status": 500, "message": "upstream overloaded"}},
                {"error": {"status": 401, "message": "bad key"}},
                {"text": "recovered"},
            ]
        }
    )
    with pytest.raises(ServerError, match="upstream overloaded") as info:
        await collect(provider, ask())
    assert info.value.status == 500
    with pytest.raises(AuthenticationError, match="bad key"):
        await collect(provider, ask())
    assert (await completed(provider)).message.content == "recovered"


async def test_a_restored_provider_resumes_at_its_position() -> None:
    provider = ScriptedProvider.from_dict(SCRIPT, start_position=1)
    assert provider.position == 1
    assert (await completed(provider)).message.content == "All done."

    provider.seek(0)
    assert (await completed(provider)).message.tool_calls[0].id == "call_0_0"
    with pytest.raises(ValueError, match="out of range"):
        provider.seek(3)


async def test_a_consumer_that_stops_at_completed_still_advances() -> None:
    provider = ScriptedProvider.from_dict(SCRIPT)
    async with contextlib.aclosing(provider.stream(ask())) as events:
        async for event in events:
            if isinstance(event, Completed):
                break
    assert provider.position == 1


async def test_injected_faults_are_raised_without_consuming_a_turn() -> None:
    faults = [HTTPErrorFault(503, message="injected outage"), None]
    provider = ScriptedProvider.from_dict(SCRIPT, faults=lambda point: faults.pop(0))
    with pytest.raises(ServerError, match="injected outage"):
        await collect(provider, ask())
    assert provider.position == 0
    assert (await completed(provider)).message.tool_calls[0] == ToolCall(
        id="call_0_0",
        name="read_file",
        arguments={"path": "README.md"},
        raw_arguments='{"path":"README.md"}',
    )
