"""Recording a real provider's answers (OpenAI wire format on loopback) and replaying them with the scripted provider."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from weald.runtime import redact, register_secret
from weald.runtime.llm import (
    BadRequestError,
    Completed,
    Image,
    MalformedScriptError,
    Message,
    ModelRequest,
    OpenAIProvider,
    ProviderSettings,
    Recorder,
    RecordingError,
    ReplayDivergence,
    ScriptedProvider,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)

from ._server import FakeServer, Reply, collect, error_reply, sse

pytestmark = [pytest.mark.trio, pytest.mark.timeout(20)]

READ = ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})
SHELL = ToolSpec("shell", "Run a command.", {"type": "object", "properties": {"command": {"type": "string"}}})


def _chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return sse({**body, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def _usage(prompt: int, completion: int, cached: int = 0) -> bytes:
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    return sse(
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": usage}
    )


def tool_call_reply(call_id: str, name: str, arguments: str, text: str = "") -> Reply:
    call = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return Reply(
        body=[
            _chunk({"role": "assistant", "content": text}),
            _chunk({"tool_calls": [call]}),
            _chunk({}, "tool_calls"),
            _usage(120, 30, cached=64),
            b"data: [DONE]\n\n",
        ]
    )


def text_reply(text: str) -> Reply:
    return Reply(
        body=[_chunk({"role": "assistant", "content": text}), _chunk({}, "stop"), _usage(200, 12), b"data: [DONE]\n\n"]
    )


@pytest.fixture
async def openai(server: FakeServer) -> AsyncIterator[OpenAIProvider]:
    settings = ProviderSettings(base_url=server.url + "/v1", api_key_required=False, timeout=5.0, stall_timeout=5.0)
    provider = OpenAIProvider("gpt-test", settings)
    yield provider
    await provider.aclose()


def conversation(tool_output: str, *, call_id: str = "call_Ab12") -> list[Message]:
    call = ToolCall.parse(id=call_id, name="read_file", raw_arguments='{"path": "notes.txt"}')
    return [
        Message(role="user", content="what is in notes.txt?"),
        Message(role="assistant", content="Let me look.", tool_calls=[call]),
        Message(role="tool", content=tool_output, tool_call_id=call_id, name="read_file"),
    ]


def first_request() -> ModelRequest:
    return ModelRequest(model="", system="Be brief.", messages=conversation("")[:1], tools=[READ, SHELL])


def second_request(tool_output: str = "alpha\nbeta", tools: list[ToolSpec] | None = None) -> ModelRequest:
    return ModelRequest(
        model="", system="Be brief.", messages=conversation(tool_output), tools=tools if tools else [READ, SHELL]
    )


async def record_two_calls(openai: OpenAIProvider, server: FakeServer, path: Path) -> list[Completed]:
    server.replies += [
        tool_call_reply("call_Ab12", "read_file", '{"path": "notes.txt"}', text="Let me look."),
        text_reply("It holds alpha and beta."),
    ]
    recording = Recorder(path).wrap(openai, "openai:gpt-test")
    first = await collect(recording, first_request())
    second = await collect(recording, second_request())
    done = [first[-1], second[-1]]
    assert all(isinstance(event, Completed) for event in done)
    return done  # type: ignore[return-value]


async def test_a_replay_answers_exactly_what_the_real_provider_answered(
    openai: OpenAIProvider, server: FakeServer, tmp_path: Path
) -> None:
    path = tmp_path / "rec.json"
    real = await record_two_calls(openai, server, path)

    replay = ScriptedProvider.from_file(path)
    replayed = [(await collect(replay, first_request()))[-1], (await collect(replay, second_request()))[-1]]

    assert replayed == real  # the same messages (ids, raw arguments), usage and stop reasons
    assert real[0].message.tool_calls[0].id == "call_Ab12"
    assert real[0].usage == Usage(input_tokens=56, output_tokens=30, cache_read_tokens=64)
    saved = json.loads(path.read_text())
    assert saved["recorded_from"] == "openai:gpt-test"
    assert [set(turn["request"]) >= {"hash", "system"} for turn in saved["turns"]] == [True, True]
    # The second request repeats the first's one message: stored once, by reference.
    assert saved["turns"][1]["request"]["same"] == 1
    assert len(saved["turns"][1]["request"]["messages"]) == 2
    assert "tools" not in saved["turns"][1]["request"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["rec.json"]  # no temporary file left


async def test_a_request_that_differs_reports_the_first_differing_step_and_message(
    openai: OpenAIProvider, server: FakeServer, tmp_path: Path
) -> None:
    path = tmp_path / "rec.json"
    await record_two_calls(openai, server, path)
    replay = ScriptedProvider.from_file(path)
    await collect(replay, first_request())

    with pytest.raises(ReplayDivergence) as diverged:
        await collect(replay, second_request("gamma"))

    assert diverged.value.step == 2
    assert diverged.value.part == "messages"
    assert diverged.value.message_index == 3
    assert "at step 2 of 2: message 3 (the result of tool call read_file) differs" in str(diverged.value)
    assert "'gamma'" in str(diverged.value)
    assert replay.position == 1  # the recorded turn is not spent on a request it does not answer
    # The same conversation with other call ids (a provider's volatile ids) still matches.
    other_ids = ModelRequest(model="", system="Be brief.", messages=conversation("alpha\nbeta", call_id="toolu_9"))
    other_ids = ModelRequest(model="", system=other_ids.system, messages=other_ids.messages, tools=[READ, SHELL])
    assert isinstance((await collect(replay, other_ids))[-1], Completed)


async def test_a_changed_tool_list_or_system_prompt_is_named(
    openai: OpenAIProvider, server: FakeServer, tmp_path: Path
) -> None:
    path = tmp_path / "rec.json"
    await record_two_calls(openai, server, path)
    replay = ScriptedProvider.from_file(path)
    await collect(replay, first_request())
    grep = ToolSpec("grep", "Search.", {"type": "object", "properties": {}})
    changed_read = ToolSpec("read_file", "Read a file, now differently.", READ.parameters)

    with pytest.raises(ReplayDivergence, match="the tool list differs from the recording's: added grep; removed shell"):
        await collect(replay, second_request(tools=[READ, grep]))
    with pytest.raises(ReplayDivergence, match="changed read_file"):
        await collect(replay, second_request(tools=[changed_read, SHELL]))
    with pytest.raises(ReplayDivergence, match="the system prompt differs"):
        await collect(replay, ModelRequest(model="", messages=conversation("alpha\nbeta"), tools=[READ, SHELL]))


async def test_with_on_divergence_set_a_replay_reports_each_new_divergence_once_and_answers_as_recorded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rec.json"
    source = ScriptedProvider.from_dict({"turns": [{"text": "one"}, {"text": "two"}, {"text": "three"}]})
    recording = Recorder(path).wrap(source)
    history = [Message(role="user", content="go")]
    for _ in range(3):
        done = (await collect(recording, ModelRequest(model="", messages=history)))[-1]
        assert isinstance(done, Completed)
        history = [*history, done.message, Message(role="user", content="more")]

    replay = ScriptedProvider.from_file(path)
    seen: list[ReplayDivergence] = []
    replay.on_divergence = seen.append
    changed = [Message(role="user", content="GO")]
    texts = []
    for _ in range(3):
        done = (await collect(replay, ModelRequest(model="", messages=changed)))[-1]
        assert isinstance(done, Completed)
        texts.append(done.message.content)
        changed = [*changed, done.message, Message(role="user", content="more")]

    assert texts == ["one", "two", "three"]
    assert [(d.step, d.message_index) for d in seen] == [(1, 1)]  # later steps differ in the same message

    # A tool list that differs from the first step on hides no later difference in the messages.
    replay = ScriptedProvider.from_file(path)
    seen.clear()
    replay.on_divergence = seen.append
    for step in range(3):
        messages = history[: 1 + 2 * step]
        if step == 2:
            messages = [*messages[:-1], Message(role="user", content="less")]
        await collect(replay, ModelRequest(model="", messages=messages, tools=[READ]))
    assert [(d.step, d.part, d.message_index) for d in seen] == [(1, "tools", None), (3, "messages", 5)]
    assert "added read_file" in str(seen[0])


async def test_errors_and_cancelled_calls_are_recorded_and_replayed(
    openai: OpenAIProvider, server: FakeServer, tmp_path: Path
) -> None:
    path = tmp_path / "rec.json"
    recording = Recorder(path).wrap(openai)
    server.replies.append(error_reply(400, "messages: too long"))
    with pytest.raises(BadRequestError) as real_error:
        await collect(recording, first_request())
    server.replies.append(Reply(body=[_chunk({"role": "assistant", "content": "thinking"})], stall=True))
    async with contextlib.aclosing(recording.stream(first_request())) as events:
        async for event in events:
            assert event == TextDelta("thinking")
            break  # the caller stops reading mid-stream, as an abort does

    saved = json.loads(path.read_text())["turns"]
    assert saved[0]["error"] == {"status": 400, "message": real_error.value.message, "kind": "http"}
    assert (saved[1]["text"], saved[1]["cancelled"]) == ("thinking", True)

    replay = ScriptedProvider.from_file(path, settings=ProviderSettings(stall_timeout=30))
    with pytest.raises(BadRequestError) as replayed_error:
        await collect(replay, first_request())
    assert str(replayed_error.value) == str(real_error.value)
    seen: list[object] = []
    with trio.move_on_after(0.3) as waited:  # the replay waits where the model was cut off
        async with contextlib.aclosing(replay.stream(first_request())) as events:
            async for event in events:
                seen.append(event)
    assert waited.cancelled_caught
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "thinking"
    assert all(isinstance(e, TextDelta) for e in seen)
    assert replay.position == 2


async def test_a_recording_holds_no_secret(openai: OpenAIProvider, server: FakeServer, tmp_path: Path) -> None:
    secret = "sk-live-RECORDING-0123456789"
    register_secret(secret)
    path = tmp_path / "rec.json"
    recording = Recorder(path, redact=redact).wrap(openai)
    arguments = json.dumps({"command": f"curl -H 'Authorization: {secret}' x", "api_key": "hunter2-hunter2"})
    server.replies.append(tool_call_reply("call_1", "shell", arguments, text=f"using {secret}"))
    server.replies.append(error_reply(400, f"bad key {secret}"))

    await collect(recording, first_request())
    with pytest.raises(BadRequestError):
        await collect(recording, first_request())

    text = path.read_text()
    assert secret not in text
    assert "hunter2" not in text
    turns = json.loads(text)["turns"]
    assert turns[0]["text"] == "using [redacted]"
    assert turns[0]["tool_calls"][0]["arguments"] == {
        "command": "curl -H 'Authorization: [redacted]' x",
        "api_key": "[redacted]",
    }


async def test_a_recording_past_its_bound_fails_the_call_and_keeps_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    source = ScriptedProvider.from_dict({"turns": [{"text": "short"}, {"text": "x" * 5000}]})
    recording = Recorder(path, max_bytes=2000).wrap(source)
    await collect(recording, ModelRequest(model="", messages=[Message(role="user", content="a")]))
    before = path.read_bytes()

    with pytest.raises(RecordingError, match=r"would grow past 2,000 bytes.*with model call 2"):
        await collect(recording, ModelRequest(model="", messages=[Message(role="user", content="b")]))

    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["rec.json"]


async def test_an_unwritable_recording_fails_the_call_with_the_reason(tmp_path: Path) -> None:
    recording = Recorder(tmp_path / "gone" / "rec.json").wrap(ScriptedProvider.from_dict({"turns": [{"text": "a"}]}))
    with pytest.raises(RecordingError, match=r"cannot write recording .*rec.json: No such file or directory"):
        await collect(recording, ModelRequest(model="", messages=[Message(role="user", content="a")]))


async def test_a_resumed_recorder_goes_on_where_the_file_ends(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    script = {"turns": [{"text": "one"}, {"text": "two"}]}
    history = [Message(role="user", content="go")]
    first = Recorder(path).wrap(ScriptedProvider.from_dict(script))
    await collect(first, ModelRequest(model="", messages=history))
    # A restored session: a new recorder, a new provider seeked past the first turn.
    resumed = Recorder.resume(path)
    assert resumed.turn_count == 1
    history = [*history, Message(role="assistant", content="one"), Message(role="user", content="again")]
    await collect(resumed.wrap(ScriptedProvider.from_dict(script, start_position=1)), ModelRequest("", history))

    assert json.loads(path.read_text())["turns"][1]["request"]["same"] == 1
    replay = ScriptedProvider.from_file(path)
    await collect(replay, ModelRequest(model="", messages=history[:1]))
    assert (await collect(replay, ModelRequest(model="", messages=history)))[-1].message.content == "two"  # type: ignore[union-attr]


async def test_the_project_directory_does_not_count(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    recorder = Recorder(path, project_dir="/home/me/proj")
    await collect(
        recorder.wrap(ScriptedProvider.from_dict({"turns": [{"text": "ok"}]})),
        ModelRequest(model="", messages=[Message(role="user", content="look in /home/me/proj/src")]),
    )
    replay = ScriptedProvider.from_file(path)
    replay.project_dir = "/tmp/ci-checkout"
    events = await collect(
        replay, ModelRequest(model="", messages=[Message(role="user", content="look in /tmp/ci-checkout/src")])
    )
    assert isinstance(events[-1], Completed)


async def test_an_edited_recording_is_refused_with_the_turn_named(
    openai: OpenAIProvider, server: FakeServer, tmp_path: Path
) -> None:
    path = tmp_path / "rec.json"
    await record_two_calls(openai, server, path)
    data = json.loads(path.read_text())
    data["turns"][1]["request"]["messages"][0] = "0" * 16
    path.write_text(json.dumps(data))
    with pytest.raises(MalformedScriptError, match=r"turns\[1\]\.request\.hash does not match its digests"):
        ScriptedProvider.from_file(path)
    data["turns"][1]["request"]["same"] = 9
    path.write_text(json.dumps(data))
    with pytest.raises(MalformedScriptError, match=r"turns\[1\]\.request\.same is 9, but the turn before had 1"):
        ScriptedProvider.from_file(path)


async def test_a_recording_to_go_on_with_is_read_only_when_it_is_a_regular_file_within_the_bound(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # with no writer: a blocking open would wait for ever
    with pytest.raises(RecordingError, match=r"recording .*fifo.json is a FIFO \(named pipe\), not a regular file"):
        Recorder.resume(fifo)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"turns": [{"text": "x" * 3000}]}))
    with pytest.raises(RecordingError, match=r"recording .*big.json is larger than 2,000 bytes"):
        Recorder.resume(big, max_bytes=2000)
    bad = tmp_path / "bad.json"
    bad.write_text('{"turns": [{"txt": "typo"}]}')
    with pytest.raises(RecordingError, match=r"cannot go on with recording .*bad.json: it is not a valid recording"):
        Recorder.resume(bad)
    assert Recorder.resume(tmp_path / "none.json").turn_count == 0


async def test_an_image_a_tool_result_shows_the_model_counts_in_the_request(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"

    def shown(data: str) -> list[Message]:
        return [Message(role="tool", content="a chart", name="render", images=[Image("image/png", data)])]

    await collect(
        Recorder(path).wrap(ScriptedProvider.from_dict({"turns": [{"text": "ok"}]})),
        ModelRequest(model="", messages=shown("iVBORw0KGgoAAAA")),
    )
    with pytest.raises(ReplayDivergence, match=r"message 1 \(the result of tool call render\) differs"):
        await collect(ScriptedProvider.from_file(path), ModelRequest(model="", messages=shown("R0lGODlhAQABAAA")))
    assert isinstance(
        (await collect(ScriptedProvider.from_file(path), ModelRequest("", shown("iVBORw0KGgoAAAA"))))[-1], Completed
    )


async def test_a_recording_whose_directory_became_a_link_is_neither_read_nor_written_through_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "rec").mkdir()
    path = tmp_path / "rec" / "rec.json"
    await collect(
        Recorder(path).wrap(ScriptedProvider.from_dict({"turns": [{"text": "one"}, {"text": "two"}]})),
        ModelRequest(model="", messages=[Message(role="user", content="go")]),
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rec.json").write_text(path.read_text())
    (tmp_path / "rec").rename(tmp_path / "rec.old")
    (tmp_path / "rec").symlink_to(outside)
    with pytest.raises(RecordingError, match=r"rec is a symbolic link, which was not followed"):
        Recorder.resume(path)  # a restored session: not read through the link
    recording = Recorder(path).wrap(ScriptedProvider.from_dict({"turns": [{"text": "one"}]}))
    with pytest.raises(RecordingError, match=r"rec is a symbolic link, which was not followed; the recording's"):
        await collect(recording, ModelRequest(model="", messages=[Message(role="user", content="go")]))
    assert sorted(p.name for p in outside.iterdir()) == ["rec.json"]  # nothing new there
