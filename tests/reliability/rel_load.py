"""Load: a thousand concurrent clients on a real daemon's socket for a bounded time, then the accounts.

Every client is a trio task in the test process with its own connection: it
connects, makes a few requests one after another (``daemon.status``,
``agent.list``, or ``agent.prompt`` to one of a few shared scripted agents),
disconnects, and connects again, until the time is up. Then:

- ``every_request_answered``: each request sent got its reply (matched by id)
  with a result; none was lost to a dropped connection or a timeout;
- ``acknowledged_turns_in_history``: the prompt of every turn the daemon
  answered ``ok`` is in its agent's history (prompts sent while a turn runs
  join that turn, so several prompts may share one answer);
- ``memory_returns_to_baseline``: the daemon's resident memory (``VmRSS`` in
  ``/proc/<pid>/status``), once it stops moving (three samples half a second
  apart within 1 MB), is back within `RSS_TOLERANCE_MB` (or
  `RSS_TOLERANCE_FRACTION` of the baseline, whichever is larger) of the
  baseline. The baseline is taken the same way after a short warm-up with
  the same load, so that it includes what serving allocates once and keeps
  (sqlite's page caches, the allocator's arenas, the bus's ring of events).
  What the load leaves behind on purpose, the agents' contexts (in memory,
  bounded by their model's window: the histories themselves are in the
  store), is well inside the tolerance.

The requests per second are measured and reported, not asserted.
"""

from __future__ import annotations

import errno
import itertools
import random
import resource
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio
from daemon_harness import DaemonProcess
from rel_chaos import InvariantCheck

RSS_TOLERANCE_MB = 30.0
RSS_TOLERANCE_FRACTION = 0.15
REPLY_BOUND = 60.0
"""Seconds a reply may take under load before it counts as lost."""

LOAD_INVARIANTS = ("every_request_answered", "acknowledged_turns_in_history", "memory_returns_to_baseline")


def rss_mb(pid: int) -> float:
    """The resident memory of a process, in MB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards ``wanted`` (up to the hard limit); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


@attrs.define
class LoadReport:
    """What the load did and what the daemon's memory did."""

    clients: int
    seconds: float = 0.0
    connections: int = 0
    peak_connections: int = 0
    sent: int = 0
    answered: int = 0
    by_method: Counter[str] = attrs.field(factory=Counter)
    acked_prompts: int = 0
    rss_before: float = 0.0
    rss_peak: float = 0.0
    rss_after: float = 0.0
    settle_seconds: float = 0.0
    problems: list[str] = attrs.field(factory=list)
    checks: list[InvariantCheck] = attrs.field(factory=list)

    @property
    def requests_per_second(self) -> float:
        """Answered requests per second of load."""
        return self.answered / self.seconds if self.seconds else 0.0

    @property
    def failures(self) -> list[InvariantCheck]:
        """The invariants that did not hold."""
        return [c for c in self.checks if not c.held]


class _Load:
    def __init__(self, daemon: DaemonProcess, agents: list[str], clients: int, seconds: float, seed: int) -> None:
        self.daemon = daemon
        self.agents = agents
        self.report = LoadReport(clients)
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.acked: dict[str, set[str]] = {a: set() for a in agents}
        self._ids = itertools.count(1)
        self._texts = itertools.count(1)

    async def run(self) -> None:
        deadline = trio.current_time() + self.seconds
        started = time.monotonic()
        # The sampler's connection is made before the rush, so that a full accept queue cannot refuse it.
        sampler = await trio.open_unix_socket(str(self.daemon.socket))
        async with sampler, trio.open_nursery() as nursery:
            nursery.start_soon(self._sample, sampler, deadline)
            for n in range(self.report.clients):
                nursery.start_soon(self._client, n, deadline, random.Random(self.rng.random()))
        self.report.seconds = time.monotonic() - started

    async def _sample(self, stream: trio.SocketStream, deadline: float) -> None:
        """Every quarter second: the daemon's RSS, and how many connections it serves (besides this one)."""
        assert self.daemon.proc is not None
        buf = bytearray()
        while trio.current_time() < deadline:
            self.report.rss_peak = max(self.report.rss_peak, rss_mb(self.daemon.proc.pid))
            await stream.send_all(b'{"jsonrpc": "2.0", "id": 0, "method": "daemon.status"}\n')
            status = msgspec.json.decode(await _read_line(stream, buf))["result"]
            self.report.peak_connections = max(self.report.peak_connections, status["connections"] - 1)
            await trio.sleep(0.25)  # the sampling period
        self.report.rss_peak = max(self.report.rss_peak, rss_mb(self.daemon.proc.pid))

    async def _client(self, n: int, deadline: float, rng: random.Random) -> None:
        while trio.current_time() < deadline:
            try:
                stream = await trio.open_unix_socket(str(self.daemon.socket))
            except OSError as exc:
                self.report.by_method[f"connect failed: {exc.strerror or exc}"] += 1
                await trio.sleep(rng.uniform(0.01, 0.1))  # the client's backoff, as a real client's
                continue
            async with stream:
                outcome = await self._session(stream, deadline, rng, n)
            if outcome == "refused":
                # Nothing was sent, so nothing is lost: the accept queue was full; back off and retry.
                self.report.by_method["connect failed: accept queue full"] += 1
                await trio.sleep(rng.uniform(0.01, 0.1))
            elif outcome == "lost":
                return

    async def _session(self, stream: trio.SocketStream, deadline: float, rng: random.Random, n: int) -> str:
        """A few requests on one connection: "done", "refused" (never connected) or "lost" (a reply lost)."""
        buf = bytearray()
        for i in range(rng.randint(1, 5)):
            if i and trio.current_time() >= deadline:
                break
            outcome = await self._request(stream, buf, rng, n, first=i == 0)
            if outcome != "answered":
                return outcome
            if i == 0:
                self.report.connections += 1
        return "done"

    async def _request(
        self, stream: trio.SocketStream, buf: bytearray, rng: random.Random, n: int, *, first: bool
    ) -> str:
        kind = rng.random()
        request_id = next(self._ids)
        if kind < 0.4:
            method, params = "daemon.status", {}
        elif kind < 0.7:
            method, params = "agent.list", {}
        else:
            agent_id = rng.choice(self.agents)
            method, params = "agent.prompt", {"agent_id": agent_id, "text": f"load {n}.{next(self._texts)}"}
        line = msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        try:
            await stream.send_all(line + b"\n")
        except trio.BrokenResourceError as exc:
            if first and isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.ENOTCONN:
                # The connect never happened: with the daemon's accept queue full, a non-blocking
                # AF_UNIX connect fails with EAGAIN, which trio takes for "in progress".
                return "refused"
            raise
        self.report.sent += 1
        self.report.by_method[method] += 1
        try:
            with trio.fail_after(REPLY_BOUND):
                reply = await _read_line(stream, buf)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, EOFError) as exc:
            self.report.problems.append(f"{method} {request_id}: lost ({exc!r})")
            return "lost"
        message = msgspec.json.decode(reply)
        if message.get("id") != request_id or "result" not in message:
            self.report.problems.append(f"{method} {request_id}: {message!r:.300}")
            return "answered"
        self.report.answered += 1
        if method == "agent.prompt" and message["result"].get("ok"):
            self.acked[params["agent_id"]].add(params["text"])
            self.report.acked_prompts += 1
        return "answered"


async def _read_line(stream: trio.SocketStream, buf: bytearray) -> bytes:
    while b"\n" not in buf:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError("the daemon closed the connection")
        buf += data
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def _settle(pid: int, *, timeout: float = 60.0) -> tuple[float, float]:
    """Poll RSS until three samples half a second apart are within 1 MB; returns (RSS, seconds waited)."""
    started = time.monotonic()
    samples = [rss_mb(pid)]
    while time.monotonic() - started < timeout:
        time.sleep(0.5)  # a sampling period, not a wait for an event: RSS has no event to wait on
        samples.append(rss_mb(pid))
        last = samples[-3:]
        if len(last) == 3 and max(last) - min(last) < 1.0:
            break
    return samples[-1], time.monotonic() - started


def run_load(
    root: Path,
    *,
    clients: int = 1000,
    seconds: float = 20.0,
    agents: int = 4,
    seed: int = 0,
    warmup: float = 4.0,
    script_turns: int = 20_000,
) -> LoadReport:
    """Start a daemon with ``agents`` scripted agents, load it with ``clients`` clients for ``seconds``; check it.

    The baseline RSS is taken after a warm-up of ``warmup`` seconds of the same load, once RSS is stable.
    """
    raise_fd_limit(clients * 2 + 256)
    daemon = DaemonProcess(root)
    names = [f"l{i}" for i in range(agents)]
    try:
        daemon.start()
        assert daemon.proc is not None
        pid = daemon.proc.pid
        with daemon.client() as client:
            for name in names:
                model = daemon.script(name, [{"text": f"ok {i}"} for i in range(script_turns)])
                client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": name})
        # Warm up with the same load, briefly: the baseline then includes what serving it allocates
        # once and keeps (sqlite's page caches, the allocator's arenas, the bus's ring of events).
        warm = _Load(daemon, names, clients, warmup, seed + 1)
        trio.run(warm.run)
        load = _Load(daemon, names, clients, seconds, seed)
        load.report.rss_before, _ = _settle(pid)
        trio.run(load.run)
        report = load.report
        report.rss_after, report.settle_seconds = _settle(pid)
        lost = warm.report.sent - warm.report.answered + report.sent - report.answered
        problems = warm.report.problems + report.problems
        report.checks.append(
            InvariantCheck(
                "every_request_answered",
                lost == 0 and not problems,
                f"{lost} of {warm.report.sent + report.sent} unanswered (warm-up included); " + "; ".join(problems[:5]),
            )
        )
        acked = {name: load.acked[name] | warm.acked[name] for name in names}
        _check_histories(daemon, acked, report)
        allowed = max(RSS_TOLERANCE_MB, RSS_TOLERANCE_FRACTION * report.rss_before)
        grew = report.rss_after - report.rss_before
        report.checks.append(
            InvariantCheck(
                "memory_returns_to_baseline",
                grew <= allowed,
                f"RSS {report.rss_before:.1f} MB before, {report.rss_peak:.1f} MB peak, {report.rss_after:.1f} MB "
                f"after {report.settle_seconds:.1f} s: {grew:+.1f} MB, {allowed:.1f} MB allowed",
            )
        )
        daemon.terminate()
    finally:
        daemon.close()
    return report


def _check_histories(daemon: DaemonProcess, acked: dict[str, set[str]], report: LoadReport) -> None:
    problems = []
    with daemon.client() as client:
        for agent_id, texts in acked.items():
            messages = client.call("agent.history", {"agent_id": agent_id}, timeout=60)["messages"]
            prompts = {m["content"] for m in messages if m["role"] == "user"}
            missing = texts - prompts
            if missing:
                problems.append(f"{agent_id}: {len(missing)} acknowledged prompts missing, e.g. {sorted(missing)[:3]}")
    report.checks.append(InvariantCheck("acknowledged_turns_in_history", not problems, "; ".join(problems)))


def load_problem_summary(report: LoadReport) -> dict[str, Any]:
    """The figures of a load run, for reports."""
    return {
        "clients": report.clients,
        "connections": report.connections,
        "most connections open at once": report.peak_connections,
        "sent": report.sent,
        "answered": report.answered,
        "requests/s": round(report.requests_per_second, 1),
        "rss MB (before, peak, after)": (
            round(report.rss_before, 1),
            round(report.rss_peak, 1),
            round(report.rss_after, 1),
        ),
    }
