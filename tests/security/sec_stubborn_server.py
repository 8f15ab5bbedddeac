"""An MCP stdio server (the official SDK's) that outlives its client unless something kills it.

Run as ``python sec_stubborn_server.py SECONDS``: it starts a child, ``sleep
SECONDS`` (a unique number lets a test find it), serves MCP on stdio, and
when stdin reaches end of file it does not exit: it waits for ever. So the
only things that end it are signals: its process group being stopped, its
parent-death signal, or the next daemon's sweep of leftovers.
"""

from __future__ import annotations

import subprocess
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("stubborn")


@server.tool()
def ping() -> str:
    """Answer pong."""
    return "pong"


def main() -> None:
    subprocess.Popen(["sleep", sys.argv[1]])
    server.run("stdio")
    # stdin is closed: a well-behaved server would exit here.
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
