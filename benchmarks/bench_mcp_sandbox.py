"""A project's stdio MCP server started in the OS sandbox, beside the same server started unsandboxed.

Measured, for ``mcp_server_time`` (Python) and, when its npm package is
installed in the test suite's npm cache, ``server-everything`` (Node): the
seconds from asking weald's MCP client to connect (`open_connection`) until
the initialize handshake and the first tools/list are done, with the
server's `ServerConfig` as the daemon makes it for a project (a
`weald.tools.mcp_sandbox.MCPSandbox` launcher: bubblewrap, the project
writable, the credential homes hidden, a private cache) and without one.
Rounds alternate the two, so that load from other processes hits both; the
medians and their difference are reported.

Run: ``python benchmarks/bench_mcp_sandbox.py [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attrs
import trio
from weald.runtime.mcp import ServerConfig, open_connection
from weald.tools import sandbox_status
from weald.tools._bwrap import default_hidden_paths
from weald.tools.mcp_sandbox import MCPSandbox

sys.path.insert(0, str(Path(__file__).parent))
from _bench import Row, banner, load_note, print_rows

EVERYTHING = (
    Path.home()
    / ".cache/weald-test-npm/server-everything-2026.8.31/node_modules/@modelcontextprotocol/server-everything"
    / "dist/index.js"
)


async def _connect(config: ServerConfig) -> float:
    began = time.perf_counter()
    async with open_connection(config):
        return time.perf_counter() - began


def _servers(work: Path) -> dict[str, ServerConfig]:
    servers = {
        "mcp_server_time": ServerConfig(
            name="time", command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"], cwd=work
        )
    }
    if EVERYTHING.is_file():
        servers["server-everything (node)"] = ServerConfig(
            name="everything", command="node", args=[str(EVERYTHING), "stdio"], cwd=work
        )
    return servers


def run(rounds: int = 15) -> list[Row]:
    status = sandbox_status()
    if not status.available:
        raise SystemExit(f"the OS sandbox does not work here: {status.reason}")
    banner(f"MCP: a project's stdio server started sandboxed vs unsandboxed, {rounds} rounds each")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "project"
        work.mkdir()
        sandbox = MCPSandbox(
            mode="required",
            project=str(work),
            cache=str(Path(tmp) / "state" / "mcp-cache" / "p"),
            hidden=tuple(map(str, default_hidden_paths())),
            private=(str(Path(tmp) / "state"),),
        )
        for label, plain in _servers(work).items():
            boxed = attrs.evolve(plain, launcher=sandbox)
            trio.run(_connect, boxed)  # warm the caches (imports, the probe) before measuring
            trio.run(_connect, plain)
            bare: list[float] = []
            inside: list[float] = []
            for _ in range(rounds):
                bare.append(trio.run(_connect, plain))
                inside.append(trio.run(_connect, boxed))
            plain_ms, boxed_ms = statistics.median(bare) * 1000, statistics.median(inside) * 1000
            print(f"{label}: unsandboxed {plain_ms:.0f} ms, sandboxed {boxed_ms:.0f} ms ({load_note()})")
            rows += [
                Row("mcp_sandbox", f"{label}: connected, unsandboxed (median)", plain_ms, "ms"),
                Row(
                    "mcp_sandbox",
                    f"{label}: connected, in the sandbox (median)",
                    boxed_ms,
                    "ms",
                    note=f"{boxed_ms - plain_ms:+.0f} ms, {boxed_ms / plain_ms:.2f}x",
                ),
            ]
    print_rows(rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    run(args.rounds)


if __name__ == "__main__":
    main()
