"""Sampling: an MCP server asking the client's model for a completion (``sampling/createMessage``).

A server sends messages, a system prompt and a token limit; the client runs
them through a model and answers with the assistant's message. In weald the
model is the calling agent's own provider: `AgentSampler` asks whoever drives
that agent to approve first (policy ``ask``, through the agent's question
flow, as an MCP server's elicitation is asked), then has the agent make the
call (``SampleModel``), outside its history, its usage counted as the
agent's. Each server's policy is configured as ``sampling = "ask" | "allow" |
"deny"``; with ``deny`` the capability is not declared at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs
from weald.runtime import ActorDeadError, Future

from ._elicitation import ask_through_agent

__all__ = [
    "AgentSampler",
    "MCPSampling",
    "MCPSamplingMessage",
    "MCPSamplingResult",
    "SamplingHandler",
    "SamplingPolicy",
    "SamplingRefused",
]

SamplingPolicy = Literal["ask", "allow", "deny"]

#: The most characters of the server's messages shown in the approval question.
QUESTION_EXCERPT = 1500


@attrs.frozen
class MCPSamplingMessage:
    """One message of a sampling request: its role, its text, and images (``(mime_type, base64)``)."""

    role: Literal["user", "assistant"]
    text: str
    images: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class MCPSampling:
    """One ``sampling/createMessage`` request from a server.

    Attributes:
        server: The configured name of the server asking.
        messages: The conversation to complete.
        system_prompt: The system prompt it asks for, if any.
        max_tokens: The most tokens to generate.
        temperature: The temperature it asks for, if any.
        tool: The tool whose call the request came during, when weald could tell.
    """

    server: str
    messages: tuple[MCPSamplingMessage, ...]
    system_prompt: str | None
    max_tokens: int
    temperature: float | None = None
    tool: str | None = None


@attrs.frozen
class MCPSamplingResult:
    """The model's answer to a sampling request."""

    text: str
    model: str
    stop_reason: str


class SamplingRefused(Exception):
    """The request was not run (denied, declined by the person, no agent to run it); the message says why."""


SamplingHandler = Callable[[MCPSampling], Awaitable[MCPSamplingResult]]


async def refuse_sampling(request: MCPSampling) -> MCPSamplingResult:
    """The handler outside an agent: no model to run it on."""
    raise SamplingRefused(
        f"weald has no agent to run MCP server {request.server!r}'s sampling request on: it came outside a tool "
        "call of an agent (or during calls of several agents over stdio, which does not say whose it is)"
    )


@attrs.frozen
class AgentSampler:
    """A `SamplingHandler` that runs requests on the calling agent's provider, after approval.

    Two samplers are equal when they act for the same session, as
    `AgentElicitor`s are, so that the MCP session can route a request when
    several calls are in flight.

    Attributes:
        runtime: The session's runtime (``ctx.session.runtime``): ``whereis``.
        agent_path: The path of the agent whose tool call this is.
        session_path: The path of the agent's session.
        policy: ``ask`` (the person approves each request) or ``allow``.
    """

    runtime: Any = attrs.field(eq=False, repr=False)
    agent_path: str = attrs.field(eq=False)
    session_path: str
    policy: SamplingPolicy = "ask"

    async def __call__(self, request: MCPSampling) -> MCPSamplingResult:
        """Approve, then sample; runs in the MCP session's task that answers the server."""
        if self.policy == "deny":
            raise SamplingRefused(f"sampling is denied for MCP server {request.server!r} by weald's configuration")
        if self.policy == "ask":
            answer = await ask_through_agent(
                self.runtime,
                self.agent_path,
                approval_question(request),
                ("allow", "deny"),
                origin=f"mcp:{request.server}",
            )
            if answer is None or answer.strip().casefold() not in ("allow", "yes", "y", "ok"):
                raise SamplingRefused("the user declined the sampling request")
        return await self._sample(request)

    async def _sample(self, request: MCPSampling) -> MCPSamplingResult:
        # Imported here: the agent layer imports the providers and the tool runner.
        from weald.runtime.agents.agent import SampleModel
        from weald.runtime.llm import Completed, Image, Message, ModelRequest

        agent = self.runtime.whereis(self.agent_path)
        if agent is None:
            raise SamplingRefused(f"the agent {self.agent_path} that made the tool call is gone")
        messages = [
            Message(role=m.role, content=m.text, images=[Image(mime, data) for mime, data in m.images])
            for m in request.messages
        ]
        model_request = ModelRequest(
            model="",
            messages=messages,
            system=request.system_prompt,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
        )
        reply: Future[tuple[str, Completed]] = Future()
        try:
            agent.tell(SampleModel(model_request, reply, origin=f"mcp:{request.server}"))
        except ActorDeadError as exc:
            raise SamplingRefused(f"the agent {self.agent_path} that made the tool call is gone") from exc
        model, completed = await reply
        return MCPSamplingResult(text=completed.message.content, model=model, stop_reason=completed.stop_reason)


def approval_question(request: MCPSampling) -> str:
    """What the person is asked before a server's sampling request runs on their model."""
    during = f" during {request.tool}" if request.tool else ""
    lines = [
        f"MCP server {request.server!r} asks to use your model{during} (sampling/createMessage, "
        f"up to {request.max_tokens} tokens). Allow it?"
    ]
    if request.system_prompt:
        lines.append(f"System prompt: {request.system_prompt}")
    for message in request.messages:
        images = f" [+{len(message.images)} image(s)]" if message.images else ""
        lines.append(f"{message.role}: {message.text}{images}")
    text = "\n".join(lines)
    return text if len(text) <= QUESTION_EXCERPT else text[: QUESTION_EXCERPT - 3] + "..."
