"""Elicitation: a server asking the user for input during a tool call.

The answer rules (SEP-1034 defaults, parsing a person's answer against the
schema) on their own; then a real server (``scripted_server.py``) eliciting
through `open_connection`; then through a real agent session, where the
question reaches the top as ``question.asked`` and is answered with the
agent's ``answer``, as a client of the daemon would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp_scripted import ScriptedServer
from weald.runtime import ActorSystem, Ref
from weald.runtime.agents.agent import AgentConfig
from weald.runtime.agents.session import SessionConfig, agent_path, session_spec
from weald.runtime.agents.tool_runner import RunnerConfig
from weald.runtime.llm import ScriptedProvider
from weald.runtime.mcp import (
    MCPConnection,
    MCPElicitation,
    MCPElicitationResult,
    open_connection,
)
from weald.runtime.mcp._elicitation import AnswerError, elicitation_defaults, parse_answer, question_choices
from weald.runtime.testing import wait_for_event, wait_mcp_running, wait_until
from weald.supervisors import DynamicSupervisor
from weald.tools import ToolRegistry, default_registry

NAME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "colour": {
            "type": "string",
            "oneOf": [{"const": "r", "title": "Red"}, {"const": "g", "title": "Green"}],
            "default": "g",
        },
    },
    "required": ["name"],
}


def form(schema: dict[str, Any], message: str = "?") -> MCPElicitation:
    return MCPElicitation(server="s", message=message, mode="form", schema=schema)


# -- the answer rules ---------------------------------------------------------------------------


def test_without_a_person_the_defaults_are_accepted_when_every_required_field_has_one():
    schema = {
        "type": "object",
        "properties": {
            "units": {"type": "string", "enum": ["metric", "imperial"], "default": "metric"},
            "retries": {"type": "integer", "default": 3},
            "note": {"type": "string"},
        },
        "required": ["units"],
    }
    assert elicitation_defaults(form(schema)) == MCPElicitationResult("accept", {"units": "metric", "retries": 3})


@pytest.mark.parametrize(
    "request_",
    [
        form(NAME_SCHEMA),  # a required field without a default
        form({"type": "object", "properties": {}}),  # a bare confirmation: nobody may confirm it
        form({"type": "object", "properties": {"note": {"type": "string"}}}),  # nothing to give
        MCPElicitation(server="s", message="log in", mode="url", url="https://example.com/login"),
    ],
    ids=["required-without-default", "confirmation", "no-defaults", "url-mode"],
)
def test_without_a_person_anything_else_is_declined(request_: MCPElicitation):
    assert elicitation_defaults(request_).action == "decline"


@pytest.mark.parametrize(
    ("answer", "content"),
    [
        ('{"name": "Ada", "colour": "r"}', {"name": "Ada", "colour": "r"}),
        ('{"name": "Ada"}', {"name": "Ada", "colour": "g"}),  # the default fills the gap
    ],
)
def test_a_json_object_answer_is_the_content(answer: str, content: dict[str, Any]):
    assert parse_answer(form(NAME_SCHEMA), answer) == MCPElicitationResult("accept", content)


@pytest.mark.parametrize(
    ("prop", "answer", "value"),
    [
        ({"type": "string"}, "  Ada Lovelace ", "Ada Lovelace"),
        ({"type": "boolean"}, "Yes", True),
        ({"type": "boolean"}, "no", False),
        ({"type": "integer"}, "42", 42),
        ({"type": "number"}, "2.5", 2.5),
        ({"type": "string", "oneOf": [{"const": "r", "title": "Red"}, {"const": "g", "title": "Green"}]}, "red", "r"),
        ({"type": "string", "enum": ["low", "high"], "enumNames": ["Low", "High"]}, "High", "high"),
        ({"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}}, "a, c", ["a", "c"]),
    ],
)
def test_a_single_field_takes_a_plain_value(prop: dict[str, Any], answer: str, value: object):
    schema = {"type": "object", "properties": {"field": prop}, "required": ["field"]}
    assert parse_answer(form(schema), answer) == MCPElicitationResult("accept", {"field": value})


@pytest.mark.parametrize(("answer", "action"), [("decline", "decline"), (" Cancel ", "cancel")])
def test_decline_and_cancel_answers_are_those_actions(answer: str, action: str):
    assert parse_answer(form(NAME_SCHEMA), answer) == MCPElicitationResult(action)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schema", "answer", "why"),
    [
        (NAME_SCHEMA, "Ada", "JSON object of the fields name, colour"),  # two fields: a plain value is ambiguous
        (NAME_SCHEMA, '{"colour": "r"}', "'name' is a required property"),
        (NAME_SCHEMA, '{"name": "Ada", "colour": "pink"}', "colour"),
        ({"type": "object", "properties": {"n": {"type": "integer"}}}, "many", "is not an integer"),
        (NAME_SCHEMA, "{oops", "not a valid JSON object"),
    ],
)
def test_an_answer_that_does_not_fit_says_why(schema: dict[str, Any], answer: str, why: str):
    with pytest.raises(AnswerError, match=why):
        parse_answer(form(schema), answer)


def test_in_url_mode_the_answer_is_only_whether_the_person_went_there():
    request = MCPElicitation(server="s", message="Log in", mode="url", url="https://example.com/login")
    assert parse_answer(request, "done") == MCPElicitationResult("accept")
    assert parse_answer(request, "decline") == MCPElicitationResult("decline")
    assert question_choices(request) == ("accept", "decline", "cancel")
    with pytest.raises(AnswerError, match="answer accept once you have opened the URL"):
        parse_answer(request, "my password is hunter2")


def test_one_choice_field_offers_its_options_as_choices():
    single = {"type": "object", "properties": {"c": NAME_SCHEMA["properties"]["colour"]}}
    assert question_choices(form(single)) == ("Red", "Green")
    assert question_choices(form({"type": "object", "properties": {"ok": {"type": "boolean"}}})) == ("yes", "no")
    assert question_choices(form(NAME_SCHEMA)) == ()


# -- a real server ------------------------------------------------------------------------------


def test_outside_an_agent_the_session_answers_with_the_schema_defaults(scripted: ScriptedServer):
    async def main() -> tuple[str, str, int]:
        async with open_connection(scripted.config()) as session:
            settings = await session.call_tool("ask_settings", {})
            name = await session.call_tool("ask_name", {})
            return settings.text, name.text, session.statistics().elicitations

    settings, name, count = trio.run(main)
    assert json.loads(settings) == {"retries": 3, "units": "metric", "verbose": False}
    assert name == "no answer: decline"  # the name is required and has no default
    assert count == 2


def test_a_calls_handler_answers_the_requests_that_come_during_it(scripted: ScriptedServer):
    seen: list[MCPElicitation] = []

    async def answer(request: MCPElicitation) -> MCPElicitationResult:
        seen.append(request)
        return MCPElicitationResult("accept", {"name": "Ada"})

    async def main() -> str:
        async with open_connection(scripted.config()) as session:
            return (await session.call_tool("ask_name", {}, on_elicitation=answer)).text

    assert trio.run(main) == "Hello Ada (green)"
    [request] = seen
    assert (request.server, request.tool, request.mode, request.message) == (
        "scripted",
        "ask_name",
        "form",
        "What is your name?",
    )
    assert set(request.schema["properties"]) == {"name", "colour"}


def test_over_stdio_a_request_is_declined_while_calls_of_different_sessions_are_in_flight(scripted: ScriptedServer):
    # stdio does not say which call a server request belongs to: rather than
    # risk one session's person answering another's question, weald declines.
    async def ada(request: MCPElicitation) -> MCPElicitationResult:
        return MCPElicitationResult("accept", {"name": "Ada"})

    async def bob(request: MCPElicitation) -> MCPElicitationResult:
        return MCPElicitationResult("accept", {"name": "Bob"})

    async def main() -> tuple[str, str, int]:
        async with open_connection(scripted.config()) as session:
            results: dict[str, str] = {}

            async def slow() -> None:
                await session.call_tool("slow", {"seconds": 0.5, "steps": 1}, on_elicitation=bob)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                await wait_calls(session, 1)
                results["mixed"] = (await session.call_tool("ask_name", {}, on_elicitation=ada)).text
            # Alone (or with calls of the same handler) it is routed again.
            results["alone"] = (await session.call_tool("ask_name", {}, on_elicitation=ada)).text
            return results["mixed"], results["alone"], session.statistics().elicitations_unrouted

    assert trio.run(main) == ("no answer: decline", "Hello Ada (green)", 1)


async def wait_calls(session: Any, count: int) -> None:
    while session.statistics().calls_in_flight < count:  # noqa: ASYNC110 - a counter, nothing to wait on
        await trio.sleep(0.005)


def test_an_unanswered_request_is_cancelled_before_its_calls_deadline(scripted: ScriptedServer):
    async def never(request: MCPElicitation) -> MCPElicitationResult:
        await trio.sleep_forever()
        raise AssertionError

    async def main() -> tuple[str, float]:
        async with open_connection(scripted.config(call_timeout=2.0)) as session:
            start = trio.current_time()
            result = await session.call_tool("ask_name", {}, on_elicitation=never)
            return result.text, trio.current_time() - start

    text, took = trio.run(main)
    assert text == "no answer: cancel"  # the server heard "cancel" and finished: no MCPTimeout
    assert took < 2.0


# -- through an agent session ---------------------------------------------------------------------


@pytest.fixture
def sessions(system: ActorSystem, scripted: ScriptedServer) -> tuple[ActorSystem, ToolRegistry, Ref[Any]]:
    registry = default_registry.copy()
    connection = system.spawn(
        MCPConnection, args=(scripted.config(),), kwargs={"registry": registry, "permission": "allow"}, name="scripted"
    )
    connection.started().get(timeout=30)
    wait_mcp_running(connection)
    supervisor = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 10}, name="sessions")
    return system, registry, supervisor


def start_agent(
    sessions: tuple[ActorSystem, ToolRegistry, Ref[Any]], tmp_path: Path, session_id: str, script: dict[str, Any]
) -> Ref[Any]:
    system, registry, supervisor = sessions
    config = SessionConfig(session_id, str(tmp_path), AgentConfig(model="scripted:inline"), RunnerConfig())
    spec = session_spec(
        config, system=system, registry=registry, provider_factory=lambda model: ScriptedProvider.from_dict(script)
    )
    supervisor.proxy().start_child(spec).get(timeout=10)
    return wait_until(lambda: system.whereis(agent_path(session_id)))


def ask_name_turns(count: int) -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    for _ in range(count):
        turns.append({"tool_calls": [{"name": "mcp__scripted__ask_name", "arguments": {}}]})
    return {"turns": [*turns, {"text": "done"}]}


def test_an_agents_call_asks_its_user_and_the_answer_reaches_the_server(sessions, tmp_path: Path):
    system = sessions[0]
    agent = start_agent(sessions, tmp_path, "e1", ask_name_turns(2))
    pending = agent.proxy().prompt("greet me").get(timeout=10)

    asked = wait_for_event(system.events, "question.asked")
    assert asked.source == agent.path
    assert asked.data["question"] == "What is your name?"  # the server's message, as sent
    assert asked.data["origin"] == "mcp:scripted"
    assert asked.data["asked_by"] == agent.path
    assert set(asked.data["schema"]["properties"]) == {"name", "colour"}
    assert asked.data["schema"]["required"] == ["name"]

    # An answer that does not fit is asked again, saying why.
    assert agent.proxy().answer(asked.data["question_id"], '{"colour": "pink"}').get() is True
    again = wait_for_event(system.events, "question.asked", since=asked.seq)
    assert "does not fit" in again.data["question"]
    agent.proxy().answer(again.data["question_id"], '{"name": "Ada", "colour": "blue"}').get()

    # The second call: the person declines.
    third = wait_for_event(system.events, "question.asked", since=again.seq)
    agent.proxy().answer(third.data["question_id"], "decline").get()

    assert pending.get(timeout=20).text == "done"
    results = [m.content for m in agent.proxy().history().get() if m.role == "tool"]
    assert results == ["Hello Ada (blue)", "no answer: decline"]


def test_a_question_nobody_answers_is_withdrawn_before_the_calls_deadline(
    system: ActorSystem, scripted: ScriptedServer, tmp_path: Path
):
    registry = default_registry.copy()
    config = scripted.config(call_timeout=2.0)
    connection = system.spawn(
        MCPConnection, args=(config,), kwargs={"registry": registry, "permission": "allow"}, name="scripted"
    )
    wait_mcp_running(connection)
    supervisor = system.spawn(DynamicSupervisor, kwargs={"max_restarts": 10}, name="sessions")
    agent = start_agent((system, registry, supervisor), tmp_path, "e2", ask_name_turns(1))
    pending = agent.proxy().prompt("greet me").get(timeout=10)
    asked = wait_for_event(system.events, "question.asked")
    withdrawn = wait_for_event(
        system.events, "question.answered", lambda e: e.data["question_id"] == asked.data["question_id"]
    )
    assert withdrawn.data["withdrawn"] is True
    assert pending.get(timeout=20).text == "done"
    assert [m.content for m in agent.proxy().history().get() if m.role == "tool"] == ["no answer: cancel"]
    assert agent.proxy().snapshot().get().open_questions == ()
