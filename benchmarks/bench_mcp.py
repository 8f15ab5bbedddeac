"""MCP servers at daemon start: N stdio servers connecting concurrently, beside the SDK doing the same.

Measured, for N mcp-server-time servers (default 40; ``--servers``):

- **weald, first answer**: a real ``weald serve`` process with the N servers
  (and two more that never answer the handshake, ``/bin/sleep 3600``) in its
  weald.toml: seconds from spawning the daemon to its first ``daemon.status``
  answer. The daemon answers as soon as its own tree is up.
- **weald, first answer with no servers**: the same for a daemon without
  MCP servers, in the same round: the floor the first answer is judged by.
- **weald, all running**: seconds from spawning the daemon until ``mcp.servers``
  reports every one of the N servers ``running`` (handshake and tools/list
  done, tools registered).
- **SDK concurrent**: the official ``mcp`` SDK alone, in one process, starting
  the same N servers with ``stdio_client`` + ``ClientSession`` in one anyio task
  group (initialize and tools/list each): seconds until every one is listed.
  This is the floor a host on the SDK can reach; weald's figure includes its
  own start (Python, imports, store, tree) on top.
- **SDK sequential**: the same, one server after another, as weald connected
  them before (for reference).

Rounds interleave weald and the SDK so that load from other processes hits both.

Run: ``python benchmarks/bench_mcp.py [--servers 40] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from weald.runtime.daemon.client import Client

sys.path.insert(0, str(Path(__file__).parent))
from _bench import Row, banner, load_note, print_rows

TIME_ARGS = ["-m", "mcp_server_time", "--local-timezone", "UTC"]


def weald_round(n: int, work: Path, *, hung: int = 2) -> tuple[float, float]:
    """(seconds to the first answer, seconds until all n servers run) for one fresh daemon."""
    root = Path(tempfile.mkdtemp(dir=work))
    socket = root / "s.sock"
    servers = "".join(
        f'[mcp.servers.time{i}]\ncommand = "{sys.executable}"\nargs = {TIME_ARGS!r}\n'.replace("'", '"')
        for i in range(n)
    )
    sleepers = "".join(f'[mcp.servers.hung{i}]\ncommand = "/bin/sleep"\nargs = ["3600"]\n' for i in range(hung))
    config = root / "weald.toml"
    config.write_text(f'[store]\npath = "{root / "store.db"}"\n{servers}{sleepers}')
    env = dict(os.environ, WEALD_CONFIG=str(config))
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(socket)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first = None
        while first is None:
            if time.monotonic() - began > 120:
                raise RuntimeError("the daemon did not answer within 120 s")
            try:
                with Client.connect(socket, timeout=1) as client:
                    client.call("daemon.status", timeout=10)
                    first = time.monotonic() - began
            except Exception:
                time.sleep(0.02)
        with Client.connect(socket) as client:
            while True:
                states = [s["status"] for s in client.call("mcp.servers", timeout=10) if s["server"].startswith("time")]
                if len(states) == n and all(state == "running" for state in states):
                    return first, time.monotonic() - began
                if time.monotonic() - began > 300:
                    raise RuntimeError(f"not every server ran within 300 s: {states}")
                time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(120)


async def _sdk_one(params: StdioServerParameters) -> int:
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return len((await session.list_tools()).tools)


async def _sdk(n: int, concurrent: bool) -> float:
    params = StdioServerParameters(command=sys.executable, args=TIME_ARGS)
    began = time.monotonic()
    if concurrent:
        async with anyio.create_task_group() as group:
            for _ in range(n):
                group.start_soon(_sdk_one, params)
    else:
        for _ in range(n):
            await _sdk_one(params)
    return time.monotonic() - began


def run(quick: bool = False, servers: int = 40, rounds: int = 3) -> list[Row]:
    rounds = 1 if quick else rounds
    banner(f"MCP: {servers} stdio servers (mcp-server-time) at start, {rounds} rounds")
    empties: list[float] = []
    firsts: list[float] = []
    alls: list[float] = []
    sdk: list[float] = []
    sdk_seq: list[float] = []
    with tempfile.TemporaryDirectory() as work:
        for r in range(rounds):
            empties.append(weald_round(0, Path(work), hung=0)[0])
            first, everything = weald_round(servers, Path(work))
            firsts.append(first)
            alls.append(everything)
            sdk.append(anyio.run(_sdk, servers, True))
            print(
                f"round {r + 1}: weald first answer {first:.2f} s (no servers: {empties[-1]:.2f} s), "
                f"all running {everything:.2f} s; "
                f"SDK concurrent {sdk[-1]:.2f} s  ({load_note()})"
            )
        sdk_seq.append(anyio.run(_sdk, servers, False))
        print(f"SDK sequential (once): {sdk_seq[-1]:.2f} s  ({load_note()})")
    first = statistics.median(firsts)
    everything = statistics.median(alls)
    concurrent = statistics.median(sdk)
    empty = statistics.median(empties)
    rows = [
        Row(
            "mcp",
            f"weald: first answer, {servers} servers + 2 hung",
            first,
            "s",
            "<= 2 s",
            first <= 2.0,
            note=f"{first / empty:.2f}x a daemon without servers",
        ),
        Row("mcp", "weald: first answer, no servers", empty, "s"),
        Row(
            "mcp",
            f"weald: {servers} servers running",
            everything,
            "s",
            "<= 15 s",
            everything <= 15.0,
            note=f"{everything / concurrent:.2f}x the SDK concurrent",
        ),
        Row("mcp", f"SDK concurrent: {servers} servers listed", concurrent, "s"),
        Row(
            "mcp",
            f"SDK sequential: {servers} servers listed",
            sdk_seq[0],
            "s",
            note=f"{sdk_seq[0] / everything:.2f}x weald",
        ),
    ]
    print_rows(rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    run(args.quick, args.servers, args.rounds)


if __name__ == "__main__":
    main()
