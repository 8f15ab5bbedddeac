"""A small MCP server for the tests, written with the SDK's MCPServer (ex-FastMCP).

Run as ``python scripted_server.py [--fail-at-start MESSAGE] [--silent]
[--spawn-child]``, speaking MCP over stdio:

- ``--fail-at-start MESSAGE``: print MESSAGE to stderr and exit 3 at once.
- ``--silent``: never answer anything (a server hung before the handshake).
- ``--noise``: write a line that is not JSON-RPC to stdout before serving.
- ``--spawn-child``: start a ``sleep`` child that ignores SIGTERM, in the
  server's process group, to prove that closing kills the whole group. Its
  pid is reported by the ``child_pid`` tool.

Tools: ``echo``, ``add_tool`` (registers ``extra_<n>`` and sends
``notifications/tools/list_changed``), ``crash`` (``os._exit`` mid-call),
``hang`` (never returns, the server stays responsive), ``freeze`` (blocks
the server's event loop, so it answers nothing, pings included),
``slow`` (sleeps, reporting progress), ``fail``
(a tool that raises: an isError result), ``reject`` (a JSON-RPC error),
``log`` (sends a log notification), ``announce`` (sends
``resources/list_changed``, ``prompts/list_changed`` and ``resources/updated``
for a URI), ``child_pid``, ``whereami`` (its
working directory and one environment variable), and two that ask the
user during the call (elicitation): ``ask_name`` (a required name and an
optional colour from a list) and ``ask_settings`` (fields that all have
defaults), each answering with what came back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from typing import Literal

import anyio
from mcp import MCPDeprecationWarning, MCPError
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

# The 2025 logging capability is deprecated for 2026-era servers; this one
# speaks 2025 to the client under test and needs it.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

server = MCPServer("scripted")
_children: list[subprocess.Popen[bytes]] = []


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Register a new tool called ``name`` and tell the client the list changed."""

    def extra() -> str:
        return f"I am {name}"

    server.add_tool(extra, name=name, description=f"added at run time: {name}")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
def crash(code: int = 7) -> str:
    """Exit the whole server process in the middle of the call."""
    sys.stderr.write("crashing on purpose\n")
    sys.stderr.flush()
    os._exit(code)


@server.tool()
async def hang() -> str:
    """Never return."""
    await anyio.sleep_forever()
    return "unreachable"


@server.tool()
async def freeze(seconds: float = 3600.0) -> str:
    """Block the event loop (a server that hangs: nothing is answered, not even a ping)."""
    time.sleep(seconds)  # noqa: ASYNC251 - blocking the loop is the point
    return "thawed"


@server.tool()
def whereami(variable: str) -> dict[str, str | None]:
    """The server's working directory and the value of the environment variable ``variable``."""
    return {"cwd": os.getcwd(), "value": os.environ.get(variable)}


@server.tool()
async def slow(seconds: float, steps: int, ctx: Context) -> str:
    """Sleep for ``seconds``, reporting progress ``steps`` times."""
    for step in range(1, steps + 1):
        await anyio.sleep(seconds / steps)
        await ctx.report_progress(step, steps, f"step {step} of {steps}")
    return f"slept {seconds}"


@server.tool()
def fail(reason: str) -> str:
    """Raise, which the server reports as a tool result with isError."""
    raise ValueError(reason)


@server.tool()
def reject(reason: str) -> str:
    """Answer the call with a JSON-RPC error instead of a result."""
    raise MCPError(code=-32602, message=f"rejected: {reason}")


@server.tool()
async def log(message: str, ctx: Context) -> str:
    """Send ``message`` as a warning log notification."""
    await ctx.warning(message, logger_name="scripted")
    return "logged"


@server.tool()
async def announce(uri: str, ctx: Context) -> str:
    """Tell the client the resources and prompts changed, and that ``uri`` was updated."""
    await ctx.session.send_resource_list_changed()
    await ctx.session.send_prompt_list_changed()
    await ctx.session.send_resource_updated(uri)
    return "announced"


class Name(BaseModel):
    name: str = Field(description="Your name")
    colour: Literal["red", "green", "blue"] = Field(default="green", description="Favourite colour")


class Settings(BaseModel):
    units: Literal["metric", "imperial"] = "metric"
    retries: int = 3
    verbose: bool = False


@server.tool()
async def ask_name(ctx: Context) -> str:
    """Ask the user's name and colour, and greet them (or say how the question ended)."""
    result = await ctx.elicit("What is your name?", Name)
    if result.action == "accept":
        return f"Hello {result.data.name} ({result.data.colour})"
    return f"no answer: {result.action}"


@server.tool()
async def ask_settings(ctx: Context) -> str:
    """Ask for settings that all have defaults; return what came back as JSON."""
    result = await ctx.elicit("Which settings?", Settings)
    if result.action == "accept":
        return json.dumps(result.data.model_dump(), sort_keys=True)
    return f"no answer: {result.action}"


@server.tool()
def child_pid() -> int:
    """The pid of the child started by --spawn-child, or 0."""
    return _children[0].pid if _children else 0


def main() -> None:
    args = sys.argv[1:]
    if "--fail-at-start" in args:
        sys.stderr.write(args[args.index("--fail-at-start") + 1] + "\n")
        sys.stderr.flush()
        sys.exit(3)
    if "--silent" in args:
        sys.stderr.write("listening, but never answering\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)
    if "--noise" in args:
        sys.stdout.write("debug: this line is not JSON-RPC\n")
        sys.stdout.flush()
    if "--spawn-child" in args:
        # Ignores SIGTERM, so only the SIGKILL escalation can end it.
        _children.append(subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]))
    server.run("stdio")


if __name__ == "__main__":
    main()
