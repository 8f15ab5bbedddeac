"""Context limits with a real model server: llama.cpp (xllamacpp) serving SmolLM2-135M with a 2,048-token context.

As a user runs it: ``weald.toml`` points a provider at the server. The model
is real but tiny, so these tests check the machinery: a prompt larger than
the server's context is refused and the agent goes on; an agent woken from
hibernation does not compact a context that fits; a file larger than the
context is read a page at a time instead of ending the turn.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from llama_proxy import ToolCallingProxy
from llm.llamacpp import LlamaServer
from weald.runtime.daemon.client import Client
from weald.runtime.testing import wait_until

pytestmark = pytest.mark.timeout(600)

WORDS = "The river carries the silt of the northern hills down to the delta every spring. "  # 16 words


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """The model's own chat template: the server leaves weald's tools out of the prompt (as most small
    local models do), so they cost nothing, though their schemas are ~5,000 tokens at 4 characters a token."""
    server = LlamaServer(tmp_path_factory.mktemp("llama-plain"), ctx_size=2048, n_predict=16, tools=False).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolCallingProxy]:
    """A server with a template that renders tools, behind a proxy that shows the model how to call read_file."""
    server = LlamaServer(tmp_path_factory.mktemp("llama-tools"), ctx_size=2048, n_predict=48, tools=True).start()
    proxy = ToolCallingProxy(server.url).start()
    try:
        yield proxy
    finally:
        proxy.stop()
        server.stop()


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for d in started:
        if d.proc is not None:
            assert d.terminate() == 0, d.log.read_text()
        d.close()


def serve(daemons: list[DaemonProcess], root: Path, base_url: str, extra: str = "") -> DaemonProcess:
    """A daemon whose ``llama:smollm2`` is the server (no window configured) and ``small`` the same, told 2,048."""
    config = (
        f'[providers.llama]\nbase_url = "{base_url}"\napi_key_required = false\n'
        "max_retries = 2\nbackoff_base = 0.5\nbackoff_cap = 2\n"
        '[models]\ndefault = "llama:smollm2"\n'
        '[models.aliases.small]\nmodel = "llama:smollm2"\ncontext_window = 2048\n' + extra
    )
    d = DaemonProcess(root / "daemon", extra_config=config)
    daemons.append(d)
    return d.start()


def events_of(c: Client, agent_id: str, *topics: str) -> list[dict[str, Any]]:
    recent = c.call("debug_state", {"agent_id": agent_id, "events": 1000})["recent_events"]
    return [e for e in recent if e["topic"] in topics]


def test_a_prompt_larger_than_the_servers_context_is_refused_and_the_agent_takes_the_next_one(
    tmp_path: Path, plain: LlamaServer, daemons: list[DaemonProcess]
) -> None:
    d = serve(daemons, tmp_path, plain.base_url)
    long = WORDS * 190  # 3,040 words
    with d.client() as c:
        # The window unknown: the server's refusal names it, and the prompt's size is the error.
        c.call("agent.start", {"working_dir": str(d.project), "agent_id": "unknown", "asleep": False})
        result = c.call("agent.prompt", {"agent_id": "unknown", "text": long}, timeout=300)
        assert not result["ok"]
        assert result["error"].startswith("the prompt is ~"), result["error"]
        assert "a window of 2,048 tokens" in result["error"]
        assert "fewer tools" not in result["error"]
        for _ in range(2):  # before: every later prompt failed with the same error, for good
            again = c.call("agent.prompt", {"agent_id": "unknown", "text": "hello, one word answer"}, timeout=300)
            assert again["ok"], again["error"]
            assert again["text"]
        history = c.call("agent.history", {"agent_id": "unknown"})["messages"]
        (left,) = [m for m in history if m["content"] == long]
        assert left["left_out"].startswith("its turn failed: the request did not fit")
        # The window configured: refused before any model call.
        c.call("agent.start", {"working_dir": str(d.project), "agent_id": "known", "model": "small", "asleep": False})
        refused = c.call("agent.prompt", {"agent_id": "known", "text": long}, timeout=300)
        assert (refused["ok"], refused["steps"], refused["usage"]["input_tokens"]) == (False, 0, 0)
        assert refused["error"].startswith("the prompt is ~"), refused["error"]
        assert events_of(c, "known", "agent.prompt_refused")
        answered = c.call("agent.prompt", {"agent_id": "known", "text": "hello, one word answer"}, timeout=300)
        assert answered["ok"], answered["error"]
        (kept,) = [m for m in c.call("agent.history", {"agent_id": "known"})["messages"] if m["content"] == long]
        assert kept["left_out"].startswith("refused: the prompt is ~")


def test_an_agent_woken_from_hibernation_keeps_its_calibration_and_never_compacts_a_context_that_fits(
    tmp_path: Path, plain: LlamaServer, daemons: list[DaemonProcess]
) -> None:
    # Before: on each wake the ~300-token context was estimated at ~4,500 tokens (the tools' schemas at
    # 4 characters a token, which this server never sees) and summarized by the model: a model call each
    # time, and the conversation replaced.
    d = serve(daemons, tmp_path, plain.base_url, "[limits]\nhibernate_after = 2\n")
    with d.client() as c:
        c.call("agent.start", {"working_dir": str(d.project), "agent_id": "w", "model": "small", "asleep": False})
        for text in ("Say hello.", "Name a colour."):
            assert c.call("agent.prompt", {"agent_id": "w", "text": text}, timeout=300)["ok"]
        awake = c.call("debug_state", {"agent_id": "w"})["context"]
        assert awake["calibrated"]
        assert awake["tokens"] < 1_536
        for wake, text in enumerate(("Name a fruit.", "Name a tree.")):
            wait_until(
                lambda: next(r["state"] for r in c.call("agent.list") if r["agent_id"] == "w") == "hibernated",
                timeout=60,
                message="the session to hibernate",
            )
            woken = c.call("debug_state", {"agent_id": "w"})["context"]
            assert woken["calibrated"], woken
            assert woken["tokens"] < 1_536, woken
            assert (woken["chars_ratio"], woken["last_input_tokens"]) == (
                awake["chars_ratio"],
                awake["last_input_tokens"],
            )
            result = c.call("agent.prompt", {"agent_id": "w", "text": text}, timeout=300)
            assert result["ok"], result["error"]
            assert not events_of(c, "w", "agent.compacting", "agent.pruned"), f"wake {wake + 1}"
            awake = c.call("debug_state", {"agent_id": "w"})["context"]
        history = c.call("agent.history", {"agent_id": "w"})["messages"]
        assert not [m for m in history if "compaction" in m]
        assert [m["content"] for m in history if m["role"] == "user"] == [
            "Say hello.",
            "Name a colour.",
            "Name a fruit.",
            "Name a tree.",
        ]


def test_a_file_larger_than_the_context_is_read_a_page_at_a_time_under_a_2048_window(
    tmp_path: Path, tooled: ToolCallingProxy, daemons: list[DaemonProcess]
) -> None:
    # Before: the 22 KB output (~6,000 tokens) made the next request overflow, and the turn ended.
    d = serve(daemons, tmp_path, tooled.base_url, "[agent]\nmax_steps = 4\n")
    (d.project / "big.txt").write_text(
        "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400))
    )
    shown = tooled.shown
    with d.client() as c:
        start = {"working_dir": str(d.project), "agent_id": "r", "model": "small", "tools": ["read_file"]}
        c.call("agent.start", {**start, "system_prompt": "You answer with a tool call.", "asleep": False})
        began = time.monotonic()
        result = c.call("agent.prompt", {"agent_id": "r", "text": "Read the file big.txt"}, timeout=400)
        assert result["steps"] >= 2, result
        assert result["ok"] or "max_steps" in (result["error"] or ""), result["error"]
        assert tooled.shown > shown  # the requests went through the proxy to the model
        assert not events_of(c, "r", "agent.context_overflow", "agent.compacting")
        history = c.call("agent.history", {"agent_id": "r"})["messages"]
        reads = [m for m in history if m["role"] == "tool" and m["name"] == "read_file"]
        assert reads, [(m["role"], m["content"][:80]) for m in history]
        first = reads[0]
        assert not first["is_error"], first["content"]
        assert first["content"].startswith("1:")
        assert "line 0: the quick brown fox" in first["content"]
        assert "Call read_file with offset=" in first["content"]  # and how to read on
        usage = [e["data"]["usage"] for e in events_of(c, "r", "agent.message_end")]
        assert max(u["input_tokens"] + u["cache_read_tokens"] for u in usage) <= 1_536, usage
        assert time.monotonic() - began < 400
