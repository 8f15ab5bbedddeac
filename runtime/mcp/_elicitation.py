"""Elicitation: an MCP server asking the user for input in the middle of a tool call.

A server sends ``elicitation/create`` (a message and the JSON Schema of the
answer it wants, or in URL mode a URL for the user to open); the client
answers ``accept`` with content matching the schema, ``decline`` or
``cancel``. This module holds the frozen request and answer values, the
SEP-1034 answer a client gives when no person can be asked
(`elicitation_defaults`), the parsing of a person's free-text answer against
the schema (`parse_answer`), and `AgentElicitor`, which asks whoever drives
the agent whose tool call the request came from, through the agent's
question flow (``question.asked`` / ``Agent.answer``).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal

import attrs
import jsonschema
import trio
from weald.runtime import ActorDeadError, Future

__all__ = [
    "MAX_ASKS",
    "AgentElicitor",
    "AnswerError",
    "ElicitationHandler",
    "MCPElicitation",
    "MCPElicitationResult",
    "answer_with_defaults",
    "ask_through_agent",
    "elicitation_defaults",
    "parse_answer",
    "question_choices",
    "wait_elicitation",
]

ElicitationAction = Literal["accept", "decline", "cancel"]

#: How many times a person is asked before an answer that never fits the
#: schema counts as ``cancel``.
MAX_ASKS: Final = 3

_DECLINE: Final = frozenset({"decline", "declined", "reject"})
_CANCEL: Final = frozenset({"cancel", "cancelled", "canceled", "dismiss"})
_ACCEPT: Final = frozenset({"accept", "accepted", "ok", "okay", "yes", "done", "submit", ""})
_TRUE: Final = frozenset({"true", "yes", "y", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "n", "off", "0"})


@attrs.frozen
class MCPElicitation:
    """One ``elicitation/create`` request from a server.

    Attributes:
        server: The configured name of the server asking.
        message: What the server says to the person.
        mode: ``"form"`` (answer with content matching ``schema``) or
            ``"url"`` (open ``url``; the answer is only accept, decline or cancel).
        schema: The requested schema (a flat object of primitive fields) in
            form mode; empty in URL mode.
        url: The URL to open, in URL mode.
        tool: The tool whose call the request came during, when weald could
            tell; None otherwise.
    """

    server: str
    message: str
    mode: Literal["form", "url"] = "form"
    schema: Mapping[str, Any] = attrs.field(factory=dict, hash=False)
    url: str | None = None
    tool: str | None = None


@attrs.frozen
class MCPElicitationResult:
    """The answer to an elicitation.

    Attributes:
        action: ``"accept"``, ``"decline"`` (the person said no) or
            ``"cancel"`` (no choice was made: dismissed, withdrawn, timed out).
        content: With ``accept`` in form mode, the fields, valid against the
            requested schema; None otherwise.
    """

    action: ElicitationAction
    content: Mapping[str, Any] | None = attrs.field(default=None, hash=False)


ElicitationHandler = Callable[[MCPElicitation], Awaitable[MCPElicitationResult]]

DECLINE: Final = MCPElicitationResult("decline")
CANCEL: Final = MCPElicitationResult("cancel")


class AnswerError(ValueError):
    """A person's answer does not fit the requested schema; the message says why, for asking again."""


# -- SEP-1034: no one to ask ---------------------------------------------------------------


def _properties(schema: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return {}
    return {name: prop for name, prop in properties.items() if isinstance(prop, Mapping)}


def _required(schema: Mapping[str, Any]) -> list[str]:
    required = schema.get("required")
    return [name for name in required if isinstance(name, str)] if isinstance(required, list) else []


def _defaults(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {name: prop["default"] for name, prop in _properties(schema).items() if "default" in prop}


def elicitation_defaults(request: MCPElicitation) -> MCPElicitationResult:
    """The answer when no person can be asked (SEP-1034 defaults).

    Accept with the schema's default values when they alone make a valid
    answer: every required field has a default, and there is at least one
    default to give. Otherwise decline: a form with no defaults (a bare
    confirmation, say) must not be accepted on a person's behalf. URL mode
    is always declined, since nobody can open the URL.
    """
    if request.mode != "form":
        return DECLINE
    defaults = _defaults(request.schema)
    if not defaults or any(name not in defaults for name in _required(request.schema)):
        return DECLINE
    try:
        _validate(request.schema, defaults)
    except AnswerError:
        return DECLINE
    return MCPElicitationResult("accept", defaults)


async def answer_with_defaults(request: MCPElicitation) -> MCPElicitationResult:
    """`elicitation_defaults` as an `ElicitationHandler`: the default outside an agent."""
    return elicitation_defaults(request)


# -- a person's answer ------------------------------------------------------------------------


def _options(prop: Mapping[str, Any]) -> list[tuple[Any, str]]:
    """``(value, title)`` of each option of an enum field (plain, titled ``oneOf``/``anyOf``, legacy ``enumNames``)."""
    for key in ("oneOf", "anyOf"):
        variants = prop.get(key)
        if isinstance(variants, list):
            options = [
                (variant["const"], str(variant.get("title", variant["const"])))
                for variant in variants
                if isinstance(variant, Mapping) and "const" in variant
            ]
            if options:
                return options
    enum = prop.get("enum")
    if isinstance(enum, list):
        names = prop.get("enumNames")
        titles = names if isinstance(names, list) and len(names) == len(enum) else enum
        return [(value, str(title)) for value, title in zip(enum, titles, strict=True)]
    return []


def _pick(options: list[tuple[Any, str]], text: str) -> Any:
    for value, title in options:
        if text == str(value) or text == title:
            return value
    folded = text.casefold()
    for value, title in options:
        if folded in (str(value).casefold(), title.casefold()):
            return value
    shown = ", ".join(title for _, title in options)
    raise AnswerError(f"{text!r} is not one of: {shown}")


def _coerce(prop: Mapping[str, Any], text: str) -> Any:
    """A plain-text answer as the value of one field of type ``prop``."""
    kind = prop.get("type")
    if kind == "boolean":
        word = text.casefold()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise AnswerError(f"{text!r} is not yes or no")
    if kind in ("integer", "number"):
        try:
            return int(text)
        except ValueError:
            pass
        if kind == "number":
            try:
                return float(text)
            except ValueError:
                pass
        raise AnswerError(f"{text!r} is not {'an integer' if kind == 'integer' else 'a number'}")
    if kind == "array":
        if text.startswith("["):
            try:
                items = json.loads(text)
            except ValueError as exc:
                raise AnswerError(f"not a valid JSON array: {exc}") from exc
        else:
            items = [item.strip() for item in text.split(",") if item.strip()]
        item_schema = prop.get("items")
        options = _options(item_schema) if isinstance(item_schema, Mapping) else []
        if options and isinstance(items, list):
            return [_pick(options, str(item)) for item in items]
        return items
    options = _options(prop)
    return _pick(options, text) if options else text


def _validate(schema: Mapping[str, Any], content: Mapping[str, Any]) -> None:
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(dict(content)))
    if error is not None:
        where = ".".join(str(part) for part in error.absolute_path)
        raise AnswerError(f"{where}: {error.message}" if where else error.message)


def parse_answer(request: MCPElicitation, answer: str) -> MCPElicitationResult:
    """Turn a person's free-text answer into the result sent to the server.

    ``decline`` and ``cancel`` (any case) are those actions. In form mode an
    answer starting with ``{`` is a JSON object of the fields; for a schema
    with a single field, a plain value is that field's value (``yes``/``no``
    for a boolean, a number, an option's value or title, a comma-separated
    list for a multi-select); ``accept`` (or ``ok``, or nothing) takes the
    defaults. Fields left out get their defaults; the whole is validated
    against the requested schema. In URL mode, ``accept`` (or ``ok``,
    ``done``) says the person went to the URL.

    Raises:
        AnswerError: The answer does not fit; its message says why.
    """
    text = answer.strip()
    word = text.casefold()
    if word in _DECLINE:
        return DECLINE
    if word in _CANCEL:
        return CANCEL
    if request.mode == "url":
        if word in _ACCEPT:
            return MCPElicitationResult("accept")
        raise AnswerError("answer accept once you have opened the URL, or decline, or cancel")
    schema = request.schema
    properties = _properties(schema)
    content: dict[str, Any]
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise AnswerError(f"not a valid JSON object: {exc}") from exc
        if not isinstance(value, dict):
            raise AnswerError("not a JSON object")
        content = value
    elif len(properties) == 1 and text:
        name, prop = next(iter(properties.items()))
        content = {name: _coerce(prop, text)}
    elif word in _ACCEPT:
        content = {}
    else:
        names = ", ".join(properties) or "(none)"
        raise AnswerError(f"answer with a JSON object of the fields {names}, or decline, or cancel")
    content = {**_defaults(schema), **content}
    _validate(schema, content)
    return MCPElicitationResult("accept", content)


def question_choices(request: MCPElicitation) -> tuple[str, ...]:
    """Answers to offer for a request whose answer is one of a few (one enum or boolean field, or URL mode)."""
    if request.mode == "url":
        return ("accept", "decline", "cancel")
    properties = _properties(request.schema)
    if len(properties) != 1:
        return ()
    prop = next(iter(properties.values()))
    if prop.get("type") == "boolean":
        return ("yes", "no")
    return tuple(title for _, title in _options(prop))


# -- asking the person behind an agent ------------------------------------------------------------


@attrs.frozen
class AgentElicitor:
    """An `ElicitationHandler` that asks whoever drives an agent, through its question flow.

    The question goes to the agent at ``agent_path`` as an ``AskUser``
    (up to the top-level agent from a sub-agent, and out to clients as
    ``question.asked``, then ``ask_user.question``): its text is the server's
    message (in URL mode, followed by the URL), its ``schema`` the requested
    schema, its ``origin`` ``mcp:<server>``. The answer is parsed with
    `parse_answer`; one that does not fit is asked again with the reason, up
    to `MAX_ASKS` times in all, then counts as ``cancel``. If the request ends
    first (its tool call's deadline, a cancellation), the question is
    withdrawn. A question withdrawn by the agent (an abort), or an agent that
    is gone, is ``cancel``.

    Two elicitors are equal when they ask in the same session: whoever drives
    it answers for all its agents. The MCP session uses that to tell whom to
    ask when several calls are in flight (see `MCPSession.call_tool`).

    Attributes:
        runtime: The session's runtime (``ctx.session.runtime``): ``whereis``.
        agent_path: The path of the agent whose tool call this is.
        session_path: The path of the agent's session.
    """

    runtime: Any = attrs.field(eq=False, repr=False)
    agent_path: str = attrs.field(eq=False)
    session_path: str

    async def __call__(self, request: MCPElicitation) -> MCPElicitationResult:
        """Ask, wait, parse; runs in the MCP session's task that answers the server."""
        question = _question_text(request)
        for _attempt in range(MAX_ASKS):
            answer = await self._ask(request, question)
            if answer is None:
                return CANCEL
            try:
                return parse_answer(request, answer)
            except AnswerError as exc:
                question = (
                    f"{_question_text(request)}\n\n(The answer {answer.strip()!r} does not fit: {exc}. "
                    "Please answer again, or answer decline or cancel.)"
                )
        return CANCEL

    async def _ask(self, request: MCPElicitation, question: str) -> str | None:
        return await ask_through_agent(
            self.runtime,
            self.agent_path,
            question,
            question_choices(request),
            origin=f"mcp:{request.server}",
            schema=dict(request.schema) if request.mode == "form" else None,
        )


async def ask_through_agent(
    runtime: Any,
    agent_path: str,
    question: str,
    choices: tuple[str, ...],
    *,
    origin: str,
    schema: Mapping[str, Any] | None = None,
) -> str | None:
    """Ask whoever drives the agent at ``agent_path`` (its question flow); the answer, or None.

    None when the agent is gone, or withdrew the question (an abort). If the
    caller is cancelled first, the question is withdrawn and the cancellation
    goes on.
    """
    # Imported here: weald.runtime.agents.agent imports the tool runner and the
    # model providers, which a client of open_connection alone never needs.
    from weald.runtime.agents.agent import AskUser, WithdrawQuestion

    agent = runtime.whereis(agent_path)
    if agent is None:
        return None
    question_id = uuid.uuid4().hex[:12]
    reply: Future[str] = Future()
    ask = AskUser(question, choices, reply, agent_path, schema=schema, question_id=question_id, origin=origin)
    try:
        agent.tell(ask)
    except ActorDeadError:
        return None
    try:
        return await reply
    except (RuntimeError, ActorDeadError):
        return None  # withdrawn by the agent (an abort), or the agent crashed
    except BaseException:
        # Cancelled: the call's deadline, or the server gave up. Nobody waits any more.
        with contextlib.suppress(ActorDeadError):
            agent.tell(WithdrawQuestion(question_id, "the MCP server's request ended before it was answered"))
        raise


def _question_text(request: MCPElicitation) -> str:
    if request.mode == "url" and request.url:
        return f"{request.message}\n\n{request.url}"
    return request.message


async def wait_elicitation(
    handler: ElicitationHandler, request: MCPElicitation, deadline: float
) -> MCPElicitationResult:
    """Run ``handler``, answering ``cancel`` if it has not answered by ``deadline`` (trio time)."""
    with trio.move_on_at(deadline):
        return await handler(request)
    return CANCEL
