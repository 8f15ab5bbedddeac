"""weald with a real local model server: llama.cpp (xllamacpp) serving SmolLM2-135M on loopback.

As a user runs it: ``weald.toml`` points a provider's ``base_url`` at the
server. The model is real but tiny, so these tests check the machinery (a
streamed turn, abort mid-stream, a server killed mid-stream, the server's
small context size driving a compaction), never what the model says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, collect_until
from llm.llamacpp import LlamaServer
from weald.runtime.daemon.client import Client
from weald.runtime.testing import wait_until

pytestmark = pytest.mark.timeout(300)


def config(server: LlamaServer, *, retries: int = 4) -> str:
    return (
        f'[providers.llama]\nbase_url = "{server.base_url}"\napi_key_required = false\n'
        f"max_retries = {retries}\nbackoff_base = 0.5\nbackoff_cap = 2\n"
        '[models]\ndefault = "llama:smollm2"\n'
    )


@pytest.fixture
def llama(tmp_path: Path) -> Iterator[LlamaServer]:
    # The model's own chat template: llama.cpp leaves the tools out of the prompt, as for most
    # small local models (weald's fifteen tool schemas alone are ~5,000 tokens).
    server = LlamaServer(tmp_path, ctx_size=2048, n_predict=16, tools=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def daemon_for(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for d in started:
        if d.proc is not None:
            assert d.terminate() == 0, d.log.read_text()
        d.close()


def start(daemons: list[DaemonProcess], root: Path, server: LlamaServer) -> DaemonProcess:
    d = DaemonProcess(root / "daemon", extra_config=config(server))
    daemons.append(d)
    return d.start()


def test_weald_run_streams_a_turn_from_the_local_server_with_usage(tmp_path: Path, llama: LlamaServer) -> None:
    llama.start()
    d = DaemonProcess(tmp_path / "daemon", extra_config=config(llama))  # its config only: no daemon is started
    # No daemon running: weald run starts one in its own process, as a user's first run does.
    done = d.cli("run", "Say hello to the reader.", "--json", timeout=180)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"]
    assert result["text"]
    assert result["usage"]["input_tokens"] + result["usage"]["cache_read_tokens"] > 5
    assert 0 < result["usage"]["output_tokens"] <= 16
    assert "blocking call on the trio loop thread" not in done.stderr


def long_answers(daemons: list[DaemonProcess], root: Path, server: LlamaServer) -> DaemonProcess:
    """The server, answering at length, and a daemon using it."""
    server.n_predict = 1500  # long enough that a turn is still streaming when the test acts
    server.start()
    return start(daemons, root, server)


def streaming_prompt(c: Client, d: DaemonProcess, agent_id: str) -> Any:
    """Start an agent, prompt it, and return the pending ``agent.prompt`` once its answer streams."""
    c.call("agent.start", {"working_dir": str(d.project), "agent_id": agent_id})
    c.call("events.subscribe", {"agent_id": agent_id, "topics": ["agent.message_delta"]})
    pending = c.request("agent.prompt", {"agent_id": agent_id, "text": "Tell me a very long story about a river."})
    collect_until(
        c,
        lambda notes: any(n[0] == "event" and n[1]["event"]["topic"] == "agent.message_delta" for n in notes),
        timeout=120,
    )
    return pending


def test_agent_abort_cancels_the_stream_and_the_server_stops_generating(
    tmp_path: Path, llama: LlamaServer, daemon_for: list[DaemonProcess]
) -> None:
    d = long_answers(daemon_for, tmp_path, llama)
    with d.client() as c:
        pending = streaming_prompt(c, d, "ab")
        assert c.call("agent.abort", {"agent_id": "ab"}) == {"aborted": True}
        result = pending.get(timeout=30)
        assert result["aborted"]
        # The connection was closed, so the server gave up the generation at once, not 1,500 tokens later.
        wait_until(lambda: not llama.slots()[0]["is_processing"], timeout=15, message="the server's slot to stop")
        assert c.call("debug_state", {"agent_id": "ab"})["status"] == "idle"


def test_a_server_killed_mid_stream_ends_the_turn_clearly_and_a_later_turn_is_retried_until_it_is_back(
    tmp_path: Path, llama: LlamaServer, daemon_for: list[DaemonProcess]
) -> None:
    d = long_answers(daemon_for, tmp_path, llama)
    with d.client() as c:
        pending = streaming_prompt(c, d, "kill")
        llama.kill()
        result = pending.get(timeout=60)
        assert not result["ok"]
        assert not result["aborted"]
        # After the first event a stream is never retried: the answer was half given.
        error = result["error"]
        assert "broke mid-stream" in error or "ended before the model finished" in error, error
        assert "gave up after" not in error
        state = c.call("debug_state", {"agent_id": "kill", "events": 200})
        errors = [e for e in state["recent_events"] if e["topic"] == "agent.error"]
        assert errors[-1]["data"]["kind"] == "ProviderConnectionError"
        # Down: the next turn's call is retried with backoff; the server comes back on its port meanwhile.
        pending = c.request("agent.prompt", {"agent_id": "kill", "text": "Say hello."})
        wait_until(lambda: "retrying in" in d.log.read_text(), timeout=60, message="a retry in the daemon's log")
        llama.n_predict = 16
        llama.start()
        again = pending.get(timeout=120)
        assert again["ok"], again["error"]
        assert again["text"]


def test_a_conversation_over_the_servers_context_size_is_compacted_and_the_step_sent_again(
    tmp_path: Path, daemon_for: list[DaemonProcess]
) -> None:
    llama = LlamaServer(tmp_path, ctx_size=256, n_predict=16, tools=False).start()
    try:
        # No window configured: the agent assumes 128,000 tokens until the server says otherwise.
        d = start(daemon_for, tmp_path, llama)
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "agent_id": "ctx"})
            # About 140 tokens a prompt: the second turn's request outgrows the 256 the server holds.
            notes = ("The meeting notes say the bridge opens at nine and closes at five. " * 10)[:600]
            compacted = None
            for i in range(4):
                result = c.call("agent.prompt", {"agent_id": "ctx", "text": f"Note {i}: {notes}"}, timeout=180)
                assert result["ok"], result["error"]
                events = c.call("debug_state", {"agent_id": "ctx", "events": 500})["recent_events"]
                compacted = next((e for e in events if e["topic"] == "agent.compacted"), None)
                if compacted is not None:
                    break
            assert compacted is not None, "the conversation never outgrew the server's context"
            assert compacted["data"]["reason"] == "overflow"
            overflow = next(e for e in events if e["topic"] == "agent.context_overflow")
            assert overflow["data"]["limit"] == 256
            context = c.call("debug_state", {"agent_id": "ctx"})["context"]
            assert (context["context_window"], context["window_source"]) == (256, "server")
            assert context["summarized"]
            history = c.call("agent.history", {"agent_id": "ctx"})["messages"]
            assert [m["compaction"]["reason"] for m in history if "compaction" in m] == ["overflow"]
            assert [m["seq"] for m in history] == list(range(len(history)))
    finally:
        llama.stop()
