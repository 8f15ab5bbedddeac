"""One autogen turn with 10 no-op tool calls, as bench_peers.py measures weald's; run in the peers' virtualenv.

An `AssistantAgent` (autogen-agentchat) with one `FunctionTool` (an async
no-op) and a scripted model client: its first answer calls the tool 10
times, its second (``reflect_on_tool_use``) is the final text, as weald's
`ScriptedProvider` does in bench_agent.py. Nothing is persisted (autogen
keeps its state in memory; ``save_state`` is up to the caller). A turn is
``on_messages([TextMessage("go")])`` until its `Response`. The agent is
made again every 10 turns, as weald's session is.

Prints one JSON line: ``turns`` (wall-clock microseconds of each turn) and
``cpu_per_turn`` (the process's CPU time per turn, microseconds).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import ChatCompletionClient, CreateResult, ModelInfo, RequestUsage
from autogen_core.tools import FunctionTool

CALLS = 10
TURNS_PER_AGENT = 10
USAGE = RequestUsage(prompt_tokens=1, completion_tokens=1)
INFO: ModelInfo = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


class Scripted(ChatCompletionClient):
    """Answers from a script: 10 calls of ``noop``, then ``done`` (what weald's scripted model does)."""

    def __init__(self) -> None:
        self.step = 0

    async def create(self, messages: Any, **_: Any) -> CreateResult:  # noqa: ARG002 - the client's signature
        self.step += 1
        if self.step % 2:
            calls = [FunctionCall(id=f"c{self.step}-{i}", name="noop", arguments="{}") for i in range(CALLS)]
            return CreateResult(finish_reason="function_calls", content=calls, usage=USAGE, cached=False)
        return CreateResult(finish_reason="stop", content="done", usage=USAGE, cached=False)

    def create_stream(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    def actual_usage(self) -> RequestUsage:
        return USAGE

    def total_usage(self) -> RequestUsage:
        return USAGE

    def count_tokens(self, messages: Any, **_: Any) -> int:  # noqa: ARG002
        return 0

    def remaining_tokens(self, messages: Any, **_: Any) -> int:  # noqa: ARG002
        return 1_000_000

    @property
    def capabilities(self) -> Any:
        return INFO

    @property
    def model_info(self) -> ModelInfo:
        return INFO


async def noop() -> str:
    return "ok"


async def measure(agents: int) -> dict[str, Any]:
    tool = FunctionTool(noop, description="does nothing")
    turns: list[float] = []
    cpu = 0.0
    for i in range(agents + 1):
        agent = AssistantAgent("a", model_client=Scripted(), tools=[tool], reflect_on_tool_use=True)
        for _ in range(TURNS_PER_AGENT):
            began, began_cpu = time.perf_counter(), time.process_time()
            response = await agent.on_messages([TextMessage(content="go", source="user")], CancellationToken())
            spent, spent_cpu = time.perf_counter() - began, time.process_time() - began_cpu
            assert response.chat_message.content == "done", response.chat_message
            if i:  # the first agent warms up
                turns.append(spent * 1e6)
                cpu += spent_cpu
    return {"turns": turns, "cpu_per_turn": cpu / len(turns) * 1e6}


def main() -> None:
    agents = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    print(json.dumps(asyncio.run(measure(agents))))


if __name__ == "__main__":
    main()
