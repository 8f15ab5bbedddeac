"""Record a real session through a provider's wire format, replay it with scripted:FILE, and replay it under faults.

The model servers are loopback fakes speaking OpenAI's and Anthropic's
streaming formats (the one part that cannot be real here); the daemon, the
tools (read_file, shell), the files and the recording are real.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from llm._server import Reply
from llm.test_anthropic import message_end, message_start, text_block, tool_block
from test_methods import LoopbackModel
from weald.runtime.daemon.client import RPCCallError

sys.path.append(str(Path(__file__).resolve().parents[1] / "runtime"))
from fake_openai import FakeOpenAI

PROMPT = "how many lines has notes.txt?"
# The sleep is the time a kill_subprocess fault has to find the command's
# process group and kill it: the kill ends it early, so it costs the run
# nothing, and a busy machine (a whole suite at once) still finds it in time.
COMMAND = "sleep 4; wc -l < notes.txt"
CONFIG = """
[tools.permissions]
shell = "allow"
[providers.fake]
kind = "openai"
base_url = "{openai}"
api_key_required = false
[providers.claude]
kind = "anthropic"
base_url = "{anthropic}"
api_key_required = false
"""


def _conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """agent.history's rows without when they were written and the turn's id, which a replay makes anew."""
    return [{k: v for k, v in m.items() if k not in ("time", "turn_id")} for m in messages]


def record_session(server: FakeOpenAI) -> None:
    """Queue what the model says: read the file, count its lines with the shell, answer."""
    server.tool_calls(("read_file", {"path": "notes.txt"}), text="Let me read it.")
    server.tool_calls(("shell", {"command": COMMAND}))
    server.text("notes.txt has 3 lines: alpha, beta and gamma.")


@pytest.fixture(scope="module")
def anthropic() -> Iterator[LoopbackModel]:
    with LoopbackModel() as model:
        yield model


@pytest.fixture(scope="module")
def openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory, anthropic: LoopbackModel, openai: FakeOpenAI
) -> Iterator[tuple[DaemonProcess, Path, list[Any]]]:
    """A daemon with an agent that ran one turn against the OpenAI-format fake, recorded into rec.json."""
    root = tmp_path_factory.mktemp("record")
    d = DaemonProcess(root, extra_config=CONFIG.format(openai=openai.url, anthropic=anthropic.server.url))
    try:
        d.start()
        record_session(openai)
        with d.client() as c:
            c.call(
                "agent.start",
                {"working_dir": str(d.project), "model": "fake:gpt-test", "agent_id": "rec", "record": "rec.json"},
            )
            result = c.call("agent.prompt", {"agent_id": "rec", "text": PROMPT}, timeout=60)
            assert result["ok"], result
            history = c.call("agent.history", {"agent_id": "rec"})["messages"]
            assert len(openai.requests) == 3
        yield d, d.project / "rec.json", history
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_recorded_session_replays_to_the_same_history_without_the_model(
    recorded: tuple[DaemonProcess, Path, list[Any]],
) -> None:
    d, recording, history = recorded
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert history[4]["content"] == "3"  # the shell really ran
    turns = json.loads(recording.read_text())["turns"]
    assert [t.get("tool_calls", [{}])[0].get("name") for t in turns] == ["read_file", "shell", None]
    assert turns[0]["tool_calls"][0]["id"] == history[1]["tool_calls"][0]["id"]  # the server's own ids
    assert turns[0]["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }

    with d.client() as c:
        c.call("agent.start", {"working_dir": str(d.project), "model": f"scripted:{recording}", "agent_id": "again"})
        result = c.call("agent.prompt", {"agent_id": "again", "text": PROMPT}, timeout=60)
        replayed = c.call("agent.history", {"agent_id": "again"})["messages"]
        listed = {a["agent_id"]: a.get("record") for a in c.call("agent.list")}

    assert result["ok"], result
    assert (result["steps"], result["usage"]["input_tokens"]) == (3, 30)
    assert _conversation(replayed) == _conversation(history)
    assert listed["rec"] == str(recording)


def test_a_replay_whose_tool_reads_a_changed_file_stops_at_the_step_that_differs(
    recorded: tuple[DaemonProcess, Path, list[Any]],
) -> None:
    d, recording, _ = recorded
    notes = d.project / "notes.txt"
    before = notes.read_text()
    notes.write_text("alpha\nbeta\ngamma\ndelta\n")
    try:
        with d.client() as c:
            c.call(
                "agent.start", {"working_dir": str(d.project), "model": f"scripted:{recording}", "agent_id": "drift"}
            )
            result = c.call("agent.prompt", {"agent_id": "drift", "text": PROMPT}, timeout=60)
            history = c.call("agent.history", {"agent_id": "drift"})["messages"]
    finally:
        notes.write_text(before)

    assert not result["ok"]
    assert result["steps"] == 2
    assert (
        "diverged from the recording at step 2 of 3: message 3 (the result of tool call read_file) differs"
        in result["error"]
    )
    assert "delta" in result["error"]  # what the file holds now
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]  # nothing answered after it


def test_agent_start_refuses_a_recording_it_cannot_write_or_that_another_agent_writes(
    recorded: tuple[DaemonProcess, Path, list[Any]],
) -> None:
    d, recording, _ = recorded
    (d.project / "adir").mkdir(exist_ok=True)
    with d.client() as c:
        base = {"working_dir": str(d.project), "model": f"scripted:{recording}"}
        with pytest.raises(RPCCallError, match=r"cannot record to .*adir: it exists and is not a regular file"):
            c.call("agent.start", {**base, "record": "adir"})
        with pytest.raises(RPCCallError, match=r"cannot record to .*nowhere/r.json: .*nowhere is not a directory"):
            c.call("agent.start", {**base, "record": "nowhere/r.json"})
        with pytest.raises(RPCCallError, match=r"agent 'rec' records into .*rec.json already"):
            c.call("agent.start", {**base, "record": str(recording)})


def test_a_recording_directory_the_agent_swaps_for_a_link_is_not_written_through(
    recorded: tuple[DaemonProcess, Path, list[Any]], openai: FakeOpenAI, tmp_path: Path
) -> None:
    d = recorded[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    (d.project / "rec").mkdir()
    openai.tool_calls(("shell", {"command": f"mv rec rec.old && ln -s {outside} rec && echo swapped"}))
    openai.text("The recording now lands outside.")
    with d.client() as c:
        start = {"working_dir": str(d.project), "model": "fake:gpt-test", "agent_id": "swap"}
        c.call("agent.start", {**start, "record": "rec/session.json"})
        result = c.call("agent.prompt", {"agent_id": "swap", "text": "go"}, timeout=60)
        history = c.call("agent.history", {"agent_id": "swap"})["messages"]
        c.call("agent.stop", {"agent_id": "swap"})
    assert history[2]["content"].strip() == "swapped"  # the shell really swapped the directory
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert not result["ok"]
    assert "is a symbolic link, which was not followed" in json.dumps(result)
    # What was recorded before the swap stayed where it was written.
    turns = json.loads((d.project / "rec.old" / "session.json").read_text())["turns"]
    assert [t["tool_calls"][0]["name"] for t in turns] == ["shell"]


def test_a_session_recorded_through_the_anthropic_wire_format_replays_to_the_same_history(
    recorded: tuple[DaemonProcess, Path, list[Any]], anthropic: LoopbackModel
) -> None:
    d = recorded[0]
    recording = d.root / "a.json"
    anthropic.server.replies += [
        Reply(
            body=[
                message_start(input_tokens=40, cache_read=8),
                *text_block(0, "I will ", "read it."),
                *tool_block(1, "toolu_01A09q90qw90lq917835lq9", "read_file", '{"path": ', '"notes.txt"}'),
                *message_end("tool_use", 21),
            ]
        ),
        Reply(body=[message_start(input_tokens=90), *text_block(0, "Three lines."), *message_end("end_turn", 4)]),
    ]
    with d.client() as c:
        start = {"working_dir": str(d.project), "agent_id": "claude", "record": str(recording)}
        c.call("agent.start", {**start, "model": "claude:claude-test"})
        real = c.call("agent.prompt", {"agent_id": "claude", "text": PROMPT}, timeout=60)
        history = c.call("agent.history", {"agent_id": "claude"})["messages"]
        c.call("agent.start", {"working_dir": str(d.project), "model": f"scripted:{recording}", "agent_id": "mimic"})
        replay = c.call("agent.prompt", {"agent_id": "mimic", "text": PROMPT}, timeout=60)
        replayed = c.call("agent.history", {"agent_id": "mimic"})["messages"]
    assert len(anthropic.requests()) == 2

    assert real["ok"], real
    assert replay["ok"], replay
    assert _conversation(replayed) == _conversation(history)
    assert history[1]["tool_calls"][0]["id"] == "toolu_01A09q90qw90lq917835lq9"
    assert history[1]["tool_calls"][0]["raw_arguments"] == '{"path": "notes.txt"}'  # spaces and all
    assert replay["usage"] == real["usage"]
    assert real["usage"]["cache_read_tokens"] == 8


FAULTS = """
seed = 3

[[faults]]
id = "shell-dies"
target = "tool"
kind = "kill_subprocess"
tool = "shell"
count = 1
"""


def test_a_recording_replayed_under_a_fault_gives_the_same_run_every_time(
    recorded: tuple[DaemonProcess, Path, list[Any]],
) -> None:
    d, recording, _ = recorded
    faults = d.root / "faults.toml"
    faults.write_text(FAULTS)
    runs = []
    for _ in range(2):
        done = d.cli("run", PROMPT, "--faults", str(faults), "--model", f"scripted:{recording}", timeout=120)
        assert done.returncode == 0, done.stderr
        # Durations and the new agent's id are what changes from run to run.
        runs.append((done.stdout, re.sub(r"\d+ ms|agent a[0-9a-f]{10}", "*", done.stderr)))

    assert runs[0] == runs[1]
    out, err = runs[0]
    assert "✗ shell" in err
    assert "killed by SIGKILL" in err
    assert (
        "replay diverged (going on as recorded): the replay of "
        f"{recording} diverged from the recording at step 3 of 3: message 5 (the result of tool call shell) differs"
    ) in " ".join(err.split())
    assert "notes.txt has 3 lines" in out  # the recorded answer, given as recorded


def test_a_session_restored_after_a_kill_9_goes_on_recording_where_its_file_ends(
    recorded: tuple[DaemonProcess, Path, list[Any]], openai: FakeOpenAI
) -> None:
    d, recording, _ = recorded
    d.kill9()
    d.start()
    openai.text("Still 3 lines.")
    with d.client() as c:
        result = c.call("agent.prompt", {"agent_id": "rec", "text": "and now?"}, timeout=60)
        history = c.call("agent.history", {"agent_id": "rec"})["messages"]
        c.call("agent.start", {"working_dir": str(d.project), "model": f"scripted:{recording}", "agent_id": "whole"})
        for text in (PROMPT, "and now?"):
            assert c.call("agent.prompt", {"agent_id": "whole", "text": text}, timeout=60)["ok"]
        replayed = c.call("agent.history", {"agent_id": "whole"})["messages"]

    assert result["ok"], result
    turns = json.loads(recording.read_text())["turns"]
    assert len(turns) == 4
    # Relative to the request recorded before the kill: its 5 messages, then the answer and the new prompt.
    assert (turns[3]["request"]["same"], len(turns[3]["request"]["messages"])) == (5, 2)
    assert _conversation(replayed) == _conversation(history)


def test_weald_run_refuses_record_or_faults_with_an_existing_agent_and_a_bad_fault_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from weald.runtime.daemon.cli import EXIT_USAGE, main

    assert main(["run", "hi", "--agent", "a1", "--record", str(tmp_path / "r.json")]) == EXIT_USAGE
    assert "--record starts a new agent; it cannot be used with --agent" in capsys.readouterr().err
    (tmp_path / "bad.toml").write_text('[[faults]]\ntarget = "tool"\nkind = "explode"\n')
    assert main(["run", "hi", "--faults", str(tmp_path / "bad.toml")]) == EXIT_USAGE
    assert "weald run: bad fault file: " in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
