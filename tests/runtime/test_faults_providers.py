"""Provider faults through real providers, and the three scenarios of docs/faults.md on real agent sessions."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from weald.runtime import ActorSystem, Ref
from weald.runtime.agents.agent import AgentConfig, TurnRecord, TurnResult
from weald.runtime.agents.session import SessionConfig, agent_path, session_spec
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.faults import ActorFault, FaultError, FaultInjector, ProviderFault, ToolFault
from weald.runtime.llm import (
    Completed,
    MalformedResponseError,
    Message,
    ModelRequest,
    OpenAIProvider,
    Provider,
    ProviderSettings,
    ScriptedProvider,
    StallTimeout,
)
from weald.runtime.testing import wait_for_event, wait_until
from weald.supervisors import DynamicSupervisor
from weald.tools import ToolContext, default_registry, tool

REG = default_registry.copy()


@tool(name="slow_lookup", description="looks something up", parameters={"type": "object"}, registry=REG, timeout=0.3)
async def slow_lookup(ctx: ToolContext) -> str:
    return "found it"


@pytest.fixture
def injector(system: ActorSystem) -> FaultInjector:
    injector = FaultInjector(seed=99)
    injector.install(system)
    return injector


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:  # one per module: its shutdown polls for 0.5 s
        yield server


@pytest.fixture
def fake(fake_server: FakeOpenAI) -> FakeOpenAI:
    fake_server.behaviours.clear()
    fake_server.requests.clear()
    return fake_server


def settings_for(server: FakeOpenAI, **overrides: Any) -> ProviderSettings:
    values: dict[str, Any] = {
        "base_url": server.url,
        "api_key_required": False,
        "backoff_base": 0.01,
        "backoff_cap": 0.02,
    } | overrides
    return ProviderSettings(**values)


def complete(system: ActorSystem, provider: Provider) -> Completed:
    """One model call on the system's loop, as an agent makes it."""

    async def call() -> Completed:
        request = ModelRequest(model="", messages=[Message(role="user", content="hi")])
        final = None
        try:
            async with contextlib.aclosing(provider.stream(request)) as events:
                async for event in events:
                    if isinstance(event, Completed):
                        final = event
        finally:
            await provider.aclose()
        assert final is not None
        return final

    return system.loop.run(call)


# -- provider faults on a provider ------------------------------------------------------------------


def test_http_errors_twice_then_success_go_through_the_providers_retries(
    system: ActorSystem, injector: FaultInjector, fake: FakeOpenAI
) -> None:
    fake.text("third time lucky")
    provider = OpenAIProvider("gpt-fake", settings_for(fake))
    provider.faults = injector.as_provider_hook("openai:gpt-fake")
    injector.inject(ProviderFault(id="flaky", kind="http_error", status=500, count=2, model="openai:*"))
    assert complete(system, provider).message.content == "third time lucky"
    assert len(fake.requests) == 1  # the injected 500s were never sent
    fired = system.events.recent(topic="fault.injected")
    assert [(e.data["attempt"], e.data["model"], e.data["fire"]) for e in fired] == [
        (0, "openai:gpt-fake", 1),
        (1, "openai:gpt-fake", 2),
    ]


def test_an_injected_retry_after_is_honoured(system: ActorSystem, injector: FaultInjector, fake: FakeOpenAI) -> None:
    fake.text("after the wait")
    provider = OpenAIProvider("gpt-fake", settings_for(fake))
    provider.faults = injector.as_provider_hook()
    injector.inject(ProviderFault(kind="http_error", status=429, retry_after=0.3, count=1))
    started = time.monotonic()
    assert complete(system, provider).message.content == "after the wait"
    assert time.monotonic() - started >= 0.3


def test_a_malformed_stream_and_a_stall_fail_the_call(
    system: ActorSystem, injector: FaultInjector, fake: FakeOpenAI
) -> None:
    fake.text("unused").text("unused")
    provider = OpenAIProvider("gpt-fake", settings_for(fake, stall_timeout=0.2, max_retries=0))
    provider.faults = injector.as_provider_hook()
    injector.inject(ProviderFault(id="garbled", kind="malformed_stream", model="gpt-*", count=1))
    with pytest.raises(MalformedResponseError, match="malformed stream event"):
        complete(system, provider)
    injector.inject(ProviderFault(id="silent", kind="timeout", count=1))
    provider = OpenAIProvider("gpt-fake", settings_for(fake, stall_timeout=0.2, max_retries=0))
    provider.faults = injector.as_provider_hook()
    with pytest.raises(StallTimeout, match=r"went silent for 0\.2 s"):
        complete(system, provider)
    assert injector.statistics().fires_by_kind == {"provider.malformed_stream": 1, "provider.timeout": 1}


def test_a_provider_without_a_faults_attribute_is_refused() -> None:
    class Bare:
        name = "bare"

    factory = FaultInjector().wrap_provider_factory(lambda spec: Bare())  # type: ignore[arg-type, return-value]
    with pytest.raises(FaultError, match="has no faults attribute"):
        factory("bare:x")


# -- agents in sessions -------------------------------------------------------------------------------


class Sessions:
    def __init__(self, system: ActorSystem, tmp_path: Path, injector: FaultInjector) -> None:
        self.system = system
        self.tmp_path = tmp_path
        self.injector = injector
        self.sup = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 50}, name="sessions")

    def start(self, session_id: str, factory: Callable[[str], Provider], model: str, **runner: Any) -> Ref[Any]:
        project = self.tmp_path / "project"
        project.mkdir(exist_ok=True)
        (project / "notes.txt").write_text("alpha\nbeta\n")
        config = SessionConfig(
            session_id, str(project), AgentConfig(model=model), RunnerConfig(permission_timeout=5, **runner)
        )
        spec = session_spec(
            config,
            system=self.system,
            registry=self.injector.wrap_registry(REG),
            provider_factory=self.injector.wrap_provider_factory(factory),
        )
        self.sup.proxy().start_child(spec).get(timeout=10)
        return self.agent(session_id)

    def agent(self, session_id: str) -> Ref[Any]:
        return wait_until(lambda: self.system.whereis(agent_path(session_id)))

    def run(self, agent: Ref[Any], text: str) -> TurnResult:
        result: TurnResult = agent.proxy().prompt(text).get(timeout=10).get(timeout=20)
        return result


@pytest.fixture
def sessions(system: ActorSystem, tmp_path: Path, injector: FaultInjector) -> Sessions:
    return Sessions(system, tmp_path, injector)


def scripted(turns: list[dict[str, Any]]) -> Callable[[str], Provider]:
    return lambda spec: ScriptedProvider.from_dict({"turns": turns})


def test_scenario_an_agent_that_crashes_mid_turn_recovers(
    system: ActorSystem, injector: FaultInjector, sessions: Sessions
) -> None:
    read = {"name": "read_file", "arguments": {"path": "notes.txt"}}
    agent = sessions.start(
        "s1", scripted([{"text": "reading", "tool_calls": [read]}, {"text": "two lines"}]), "scripted:x"
    )
    injector.inject(
        ActorFault(id="crash-mid-turn", kind="crash", path="/sessions/*/agent", message="ToolResults", count=1)
    )
    interrupted = sessions.run(agent, "count the lines")
    assert interrupted.interrupted
    assert "injected fault 'crash-mid-turn'" in (interrupted.error or "")
    path = agent_path("s1")
    fired = wait_for_event(system.events, "fault.injected")
    crashed = wait_for_event(system.events, "supervisor.child_crashed", lambda e: e.data["path"] == path)
    restarted = wait_for_event(system.events, "supervisor.child_restarted", lambda e: e.data["path"] == path)
    recovered = wait_for_event(system.events, "agent.recovered", lambda e: e.source == path)
    assert fired.source == path
    assert fired.seq < crashed.seq < restarted.seq
    assert crashed.seq < recovered.seq  # published by the new incarnation's on_start
    assert "crash-mid-turn" in crashed.data["error"]
    assert recovered.data["interrupted_turn"] == interrupted.turn_id
    key = f"s1/{interrupted.turn_id}"
    wait_until(lambda: dict(system.store.items("turns", "s1/", type=TurnRecord))[key].status == "interrupted")
    new_agent = sessions.agent("s1")
    assert new_agent is not agent
    history = new_agent.proxy().history().get()
    assert history[-1].content.startswith("[interrupted]")
    assert sessions.run(new_agent, "go on").ok
    assert injector.fault_counts_by_path() == {path: 1}


def test_scenario_a_tool_that_hangs_is_timed_out_and_the_turn_goes_on(
    system: ActorSystem, injector: FaultInjector, sessions: Sessions
) -> None:
    call = {"name": "slow_lookup", "arguments": {}}
    agent = sessions.start(
        "s1", scripted([{"tool_calls": [call]}, {"text": "the lookup timed out, moving on"}]), "scripted:x"
    )
    injector.inject(ToolFault(id="stuck-lookup", kind="hang", tool="slow_lookup", agent="/sessions/s1/agent"))
    result = sessions.run(agent, "look it up")
    assert (result.ok, result.text) == (True, "the lookup timed out, moving on")
    tool_message = agent.proxy().history().get()[2]
    assert tool_message.is_error
    assert tool_message.content.startswith("slow_lookup timed out after 0.3 s")
    failed = wait_for_event(system.events, "tool.failed")
    fired = wait_for_event(system.events, "fault.injected")
    assert fired.source == failed.source == "/sessions/s1/tool_runner"
    assert fired.data["call_id"] == failed.data["call_id"]
    assert injector.fault_counts_by_path() == {"/sessions/s1/tool_runner": 1}


def test_scenario_a_provider_that_returns_500s_is_retried_with_backoff(
    system: ActorSystem, injector: FaultInjector, sessions: Sessions, fake: FakeOpenAI
) -> None:
    fake.text("third time lucky")
    agent = sessions.start("s1", lambda spec: OpenAIProvider("fake", settings_for(fake)), "openai:fake")
    injector.inject(ProviderFault(id="500s", kind="http_error", status=500, count=2, agent="/sessions/*/agent"))
    result = sessions.run(agent, "hi")
    assert (result.ok, result.text) == (True, "third time lucky")
    fired = system.events.recent(topic="fault.injected")
    path = agent_path("s1")
    assert [(e.source, e.data["attempt"], e.data["model"]) for e in fired] == [
        (path, 0, "openai:fake"),
        (path, 1, "openai:fake"),
    ]
    assert injector.fault_counts_by_path() == {path: 2}
    assert len(fake.requests) == 1


def test_a_scripted_provider_does_not_retry_an_injected_error(
    system: ActorSystem, injector: FaultInjector, sessions: Sessions
) -> None:
    agent = sessions.start("s1", scripted([{"text": "never reached"}]), "scripted:x")
    injector.inject(ProviderFault(id="garbled", kind="malformed_stream", model="scripted:*", count=1))
    result = sessions.run(agent, "hi")
    assert not result.ok
    assert "malformed stream event" in (result.error or "")
    error = wait_for_event(system.events, "agent.error")
    assert error.data["kind"] == "MalformedResponseError"
    assert sessions.run(agent, "again").text == "never reached"
