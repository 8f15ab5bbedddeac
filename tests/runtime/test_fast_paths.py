"""The runtime's fast paths keep the meaning of the slow ones they replace."""

from __future__ import annotations

import contextlib
import gc
import logging
import re
import uuid
import weakref
from pathlib import Path
from typing import Any

import pykka
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from pykka._introspection import introspect_attrs
from weald.runtime import Actor, ActorSystem, Future, redact, register_secret
from weald.runtime._events import _redact_payload
from weald.runtime.agents.tool_runner import RunTools, ToolCallRequest, ToolRunner
from weald.runtime.testing import ResultCollector, wait_until
from weald.supervisors import ChildSpec, DynamicSupervisor
from weald.tools import ToolContext, ToolRegistry, tool

REG = ToolRegistry()
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}


@tool(name="noop", description="does nothing", parameters=EMPTY, registry=REG)
async def noop(ctx: ToolContext) -> str:
    return "ok"


@tool(name="slow", description="sleeps past its timeout", parameters=EMPTY, registry=REG, timeout=0.05)
async def slow(ctx: ToolContext) -> str:
    await trio.sleep(10)
    return "unreachable"


@tool(name="stubborn", description="keeps the Cancelled of its deadline", parameters=EMPTY, registry=REG, timeout=0.05)
async def stubborn(ctx: ToolContext) -> str:
    with contextlib.suppress(trio.Cancelled):
        await trio.sleep(10)
    return "kept after the deadline"


@tool(
    name="stubborn_long",
    description="keeps the Cancelled, returns too much",
    parameters=EMPTY,
    registry=REG,
    timeout=0.05,
)
async def stubborn_long(ctx: ToolContext) -> str:
    with contextlib.suppress(trio.Cancelled):
        await trio.sleep(10)
    return "line\n" * 100_000


@tool(name="forever", description="waits until stopped", parameters=EMPTY, registry=REG, timeout=60)
async def forever(ctx: ToolContext) -> str:
    await trio.sleep_forever()
    return "unreachable"


class Echo(Actor):
    def on_receive(self, message: Any) -> Any:
        return message


def test_a_done_callback_runs_when_the_future_completes_or_at_once_if_it_has() -> None:
    seen: list[Any] = []
    future: Future[int] = Future()
    future._on_done(lambda f: seen.append(f.get()))
    assert seen == []
    future.set(7)
    assert seen == [7]
    future._on_done(lambda f: seen.append(f.get() + 1))
    assert seen == [7, 8]


def test_a_failing_done_callback_is_logged_and_never_reaches_the_completer(caplog: pytest.LogCaptureFixture) -> None:
    future: Future[int] = Future()
    future._on_done(lambda f: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="weald.runtime"):
        future.set(1)  # does not raise
    assert future.get() == 1
    assert "callback" in caplog.text


def test_the_urn_is_made_on_first_use_and_is_the_same_for_the_actor_and_its_ref(system: ActorSystem) -> None:
    ref = Echo.start()
    actor = ref._actor_weakref()
    assert actor is not None
    assert ref.actor_urn == actor.actor_urn == ref.actor_urn
    assert re.fullmatch(r"urn:uuid:[0-9a-f-]{36}", ref.actor_urn)
    assert uuid.UUID(ref.actor_urn[9:]).version == 4
    assert Echo.start().actor_urn != ref.actor_urn


def test_an_execution_child_that_ends_itself_exits_normally_and_quietly(
    system: ActorSystem, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = system.spawn(ToolRunner, args=("s", str(tmp_path)), kwargs={"registry": REG}, name="runner")
    agent = system.spawn(ResultCollector, name="agent")
    calls = (*(ToolCallRequest(f"c{i}", "noop", {}) for i in range(20)), ToolCallRequest("t", "slow", {}))
    with caplog.at_level(logging.WARNING, logger="weald"):
        runner.tell(RunTools("b1", calls, None, agent))
        results = wait_until(lambda: agent.proxy().received().get())
    outcomes = results[0].outcomes
    assert [o.result.output for o in outcomes[:-1]] == ["ok"] * 20
    assert outcomes[-1].result.output.startswith("slow timed out after 0.05 s")
    wait_until(lambda: system.registered("/runner/calls/") == [])
    calls = system.whereis("/runner/calls")
    assert calls is not None
    assert calls.proxy().count_children().get()["specs"] == 0  # temporary children, all removed
    assert system.events.recent(200, topic="supervisor.child_crashed") == []  # every one ended normally
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_tool_that_keeps_its_deadlines_cancelled_to_itself_keeps_its_result(
    system: ActorSystem, tmp_path: Path
) -> None:
    # The deadline is the execution's own task scope's, which stays
    # cancelled: a result that needs cutting (in a worker thread) is still
    # cut and saved, not lost to the deadline.
    runner = system.spawn(ToolRunner, args=("s", str(tmp_path)), kwargs={"registry": REG}, name="runner")
    agent = system.spawn(ResultCollector, name="agent")
    calls = (ToolCallRequest("k", "stubborn", {}), ToolCallRequest("l", "stubborn_long", {}))
    runner.tell(RunTools("b1", calls, None, agent))
    outcomes = wait_until(lambda: agent.proxy().received().get())[0].outcomes
    assert outcomes[0].result.output == "kept after the deadline"
    cut = outcomes[1].result
    assert cut.ok
    assert cut.full_output_path is not None
    assert Path(cut.full_output_path).read_text() == "line\n" * 100_000


def test_calls_that_end_together_reach_the_runner_as_one_message(system: ActorSystem, tmp_path: Path) -> None:
    runner = system.spawn(ToolRunner, args=("s", str(tmp_path)), kwargs={"registry": REG}, name="runner")
    agent = system.spawn(ResultCollector, name="agent")
    runner.tell(RunTools("warm", (ToolCallRequest("w", "noop", {}),), None, agent))
    wait_until(lambda: agent.proxy().received().get())
    actor = runner._actor_weakref()
    assert actor is not None
    before = actor._handled
    calls = tuple(ToolCallRequest(f"c{i}", "noop", {}) for i in range(10))
    runner.tell(RunTools("b1", calls, None, agent))
    results = wait_until(lambda: agent.proxy().received().get()[1:])
    assert [o.result.output for o in results[0].outcomes] == ["ok"] * 10
    # RunTools, then the ten ends: they end in one round of the loop, so
    # one message brings them all (one each made it 11 messages).
    assert actor._handled - before == 2


def test_a_call_aborted_before_its_execution_was_started_is_stopped_once_it_starts(
    system: ActorSystem, tmp_path: Path
) -> None:
    # The abort reaches the runner in the same burst as the batch, before the
    # supervisor has started the execution: it finds nothing to kill, so the
    # execution must be killed as soon as the supervisor reports it started.
    runner = system.spawn(ToolRunner, args=("s", str(tmp_path)), kwargs={"registry": REG}, name="runner")
    agent = system.spawn(ResultCollector, name="agent")
    proxy = runner.proxy()

    def batch_then_abort() -> Any:
        runner.tell(RunTools("b1", (ToolCallRequest("f", "forever", {}),), None, agent))
        return proxy.abort("b1")

    aborted = trio.from_thread.run_sync(batch_then_abort, trio_token=system.loop.token)
    assert aborted.get(timeout=10) == 1
    results = wait_until(lambda: agent.proxy().received().get())
    assert results[0].outcomes[0].result.output == "[aborted]"
    assert system.whereis("/runner/calls") is not None
    wait_until(lambda: system.registered("/runner/calls/") == [], timeout=10)  # not the tool's 60 s


KEYS = st.sampled_from(["call_id", "tool", "api_key", "Authorization", "token", "password", "data", "x_token", 3])
VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.sampled_from(["", "plain", "has sk-fastpath-secret-123 inside", "sk-fastpath-secret-123"]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner), st.dictionaries(KEYS, inner, max_size=3)),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=6))
def test_event_payloads_are_redacted_exactly_as_redact_does(payload: dict[Any, Any]) -> None:
    register_secret("sk-fastpath-secret-123")
    assert _redact_payload(payload) == redact(dict(payload))


@pykka.traversable
class Playback:
    volume = 3

    def play(self) -> bool:
        return True

    def __init__(self) -> None:
        self.inner = pykka.traversable(Inner())


class Inner:
    def stop(self) -> str:
        return "stopped"


class Rich(Actor):
    klass_value = 1
    playback_class_level = Playback()

    def __init__(self) -> None:
        super().__init__()
        self.playback = Playback()
        self.count = 0
        self.handler = len
        self._private = 1

    def method(self) -> int:
        return 1


def test_proxies_know_exactly_the_attributes_pykka_would_find(system: ActorSystem) -> None:
    for ref in (Rich.start(), Echo.start(), ResultCollector.start()):
        proxy = ref.proxy()
        actor = ref._actor_weakref()
        assert isinstance(proxy, pykka.ActorProxy)
        assert proxy._known_attrs == introspect_attrs(root=actor, proxy=proxy)
    rich = Rich.start().proxy()
    assert rich.playback.play().get() is True
    assert rich.playback.inner.stop().get() == "stopped"
    assert rich.count.get() == 0
    assert rich.method().get() == 1
    with pytest.raises(AttributeError):
        _ = rich.nothing_here


class Idle(Actor):
    def on_receive(self, message: Any) -> Any:
        return message


@pytest.mark.parametrize("how", ["stopped", "killed", "a tool call"])
def test_an_ended_actor_is_freed_at_once_not_left_to_the_cyclic_collector(
    system: ActorSystem, tmp_path: Path, how: str
) -> None:
    # A live inbox names its ref, which holds the inbox: a cycle that made every
    # ended actor (each tool call's execution) garbage for the cyclic collector.
    sup = system.spawn(DynamicSupervisor, name="sup")
    runner = system.spawn(ToolRunner, args=("s", str(tmp_path)), kwargs={"registry": REG}, name="runner")
    agent = system.spawn(ResultCollector, name="agent")
    runner.tell(RunTools("warm", (ToolCallRequest("w", "noop", {}),), None, agent))
    wait_until(lambda: agent.proxy().received().get())
    gc.collect()
    gc.disable()
    try:
        if how == "a tool call":
            runner.tell(RunTools("b1", (ToolCallRequest("c", "noop", {}),), None, agent))
            wait_until(lambda: len(agent.proxy().received().get()) == 2)
            wait_until(lambda: system.registered("/runner/calls/") == [])
        else:
            ref = sup.proxy().start_child(ChildSpec("c", Idle, restart="temporary")).get(timeout=5)
            assert ref.ask("hi") == "hi"
            gone = weakref.ref(ref)
            ref.stop() if how == "stopped" else ref.kill()
            del ref
            wait_until(lambda: sup.proxy().which_children().get() == [])
            wait_until(lambda: gone() is None)  # freed by reference counting: the collector is off
        assert gc.collect() == 0
    finally:
        gc.enable()
