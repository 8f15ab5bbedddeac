"""The observer at 100,000 sessions: the page in a real browser, the methods behind it, the sampler's cost.

Against a real ``weald serve --http`` with N sessions (default 100,000)
started asleep with ``agents.start`` (1,000 a request), and a few woken:

- the methods the page stands on, each the median of several calls through
  the socket, beside the ones the page used before on the same daemon (side
  by side, with the ratio): ``tree`` of the whole daemon and ``agent.list``
  (every session) against ``tree`` with ``/sessions`` collapsed and a page
  of ``sessions.page`` (filtered, searched, sorted), and ``actors.list``;
- the page in headless Chromium (Debian's, driven by Playwright): its first
  contentful paint, when the first sessions are drawn, the elements in the
  document, the long tasks (over 50 ms) while it sits idle for 5 s, a tab
  switch (click to painted, the median of three per tab) and a filter (the
  state filter, change to drawn, the median of eight), measured in the page
  with the browser's performance APIs, as tests/daemon/test_observer_browser.py
  does at 10,000;
- the metrics sampler's own cost over an idle minute (its samples' CPU time,
  as ``/metrics`` reports it) next to the whole daemon's CPU meanwhile;
- the memory the sessions index holds for N sessions (tracemalloc, in this
  process: the ids are the supervisor's own strings in the daemon, not counted).

Run: ``python benchmarks/bench_observer.py [--sessions 100000] [--skip-old] [--idle 60]``.
Needs chromium (``apt-get install chromium``) and playwright (the test extras).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from _bench import daemon_client, load_note, machine_info, many_sessions_files, start_asleep
from rich.console import Console
from rich.table import Table
from weald.runtime.daemon._index import SessionIndex
from weald.runtime.daemon.client import Client

CHROMIUM = "/usr/bin/chromium"
LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.__longTasks.push({start: entry.startTime, duration: entry.duration});
}).observe({type: "longtask", buffered: true});
"""
SWITCH = """async (tab) => {
  const started = performance.now();
  document.querySelector(`#tabs button[data-tab=${tab}]`).click();
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  return performance.now() - started;
}"""
FILTER = """async (state) => {
  const started = performance.now();
  const select = document.getElementById("s-state");
  select.value = state;
  select.dispatchEvent(new Event("change"));
  for (;;) {
    await new Promise((resolve) => requestAnimationFrame(resolve));
    const nodes = [...document.querySelectorAll("#session-list .vrow[data-agent] .badge.status")];
    const asleep = nodes.filter((n) => n.textContent === "hibernated").length;
    if (nodes.length && (state === "awake" ? asleep === 0 : asleep > 0)) return performance.now() - started;
    if (performance.now() - started > 60000) throw new Error("the filter did not apply");
  }
}"""


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def timed(client: Client, method: str, params: dict[str, Any], runs: int) -> float:
    """The median time of ``runs`` calls, in ms."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        client.call(method, params, timeout=1800)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def index_memory(n: int) -> float:
    """MiB the sessions index holds for ``n`` sessions of one project and model (ids made beforehand)."""
    ids = [f"a{i}" for i in range(n)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = SessionIndex()
    for session_id in ids:
        index.add(session_id, "/home/me/project", "scripted:/home/me/script.json")
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(index) == n
    return held / 1024 / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--skip-old", action="store_true", help="leave out tree and agent.list of every session")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle for the sampler's cost")
    args = parser.parse_args()
    console = Console()
    console.print(machine_info())
    n = args.sessions
    root, project, script, socket, env = many_sessions_files("bench-observer-", n)
    serve = [
        sys.executable,
        "-m",
        "weald.runtime.daemon.cli",
        "serve",
        "--socket",
        str(socket),
        "--http",
        "127.0.0.1:0",
    ]
    proc = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows: list[tuple[str, str, str]] = []
    try:
        client = daemon_client(socket)
        took = start_asleep(socket, project, script, n)
        console.print(f"{n:,} sessions started asleep in {took:.1f} s; {load_note()}")
        for i in range(0, 50, 5):  # a few awake, prompted once
            assert client.call("agent.prompt", {"agent_id": f"a{i:06d}", "text": "go"}, timeout=120)["ok"]
        rows.append(("daemon RSS with the sessions", f"{rss_mib(proc.pid):.0f} MiB", ""))
        rows.append(("the sessions index (tracemalloc)", f"{index_memory(n):.1f} MiB", f"{n:,} sessions"))

        # The methods, side by side.
        new = {
            "tree, /sessions collapsed": timed(client, "tree", {"collapse": ["/sessions"]}, 7),
            "sessions.page, first 50": timed(client, "sessions.page", {"limit": 50}, 7),
            "sessions.page, awake only": timed(client, "sessions.page", {"state": "awake", "limit": 50}, 7),
            "sessions.page, search": timed(client, "sessions.page", {"search": "a0999", "limit": 50}, 7),
            "sessions.page, sort by id desc": timed(
                client, "sessions.page", {"sort": "id", "order": "desc", "limit": 50}, 7
            ),
            "actors.list, first 50 by mailbox": timed(client, "actors.list", {}, 7),
            "metrics.series, all held": timed(client, "metrics.series", {}, 7),
            "events.query fault.*": timed(client, "events.query", {"topic": "fault.*"}, 7),
        }
        old: dict[str, float] = {}
        if not args.skip_old:
            old["tree, whole (the page before)"] = timed(client, "tree", {}, 3)
            old["agent.list (the page before)"] = timed(client, "agent.list", {}, 3)
        for name, ms in new.items():
            rows.append((name, f"{ms:.1f} ms", ""))
        for name, ms in old.items():
            ratio = ms / new["tree, /sessions collapsed" if name.startswith("tree") else "sessions.page, first 50"]
            rows.append((name, f"{ms:,.0f} ms", f"{ratio:,.0f}x the new call"))

        # The sampler's own cost, and the daemon's, over an idle stretch.
        before = client.call("actor.snapshot", {"path": "/metrics"})["snapshot"]
        cpu0, wall0 = proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(args.idle)
        after = client.call("actor.snapshot", {"path": "/metrics"})["snapshot"]
        wall = time.monotonic() - wall0
        cpu = proc_cpu_s(proc.pid) - cpu0
        samples = after["samples"] - before["samples"]
        cost = after["cost_seconds"] - before["cost_seconds"]
        rows.append(
            (
                "sampler: CPU per sample",
                f"{1e6 * cost / max(samples, 1):.0f} us",
                f"{100 * cost / wall:.3f}% of one core ({samples} samples in {wall:.0f} s)",
            )
        )
        rows.append(("daemon idle CPU, everything", f"{100 * cpu / wall:.2f}% of one core", f"over {wall:.0f} s"))

        # The page, in a real browser.
        from playwright.sync_api import sync_playwright

        url = client.call("observer.url")["url"]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.add_init_script(LONG_TASKS)
            page.goto(url)
            page.locator("#session-list .vrow[data-agent]").first.wait_for(timeout=120_000)
            timing = page.evaluate(
                """() => ({paint: performance.getEntriesByName("first-contentful-paint")[0].startTime,
                           rows: performance.now(), nodes: document.getElementsByTagName("*").length})"""
            )
            page.wait_for_timeout(1000)
            page.evaluate("() => { window.__longTasks = []; }")
            page.wait_for_timeout(5000)
            idle = page.evaluate("() => window.__longTasks")
            switches = {}
            for tab in ["system", "processes", "events", "conversation", "tasks", "mcp", "faults", "agents"]:
                times = []
                for _ in range(3):
                    page.evaluate(SWITCH, "system" if tab == "agents" else "agents")
                    times.append(page.evaluate(SWITCH, tab))
                switches[tab] = statistics.median(times)
            filters = [page.evaluate(FILTER, state) for state in ["awake", "active"] * 4]
            console.print(
                "filters (ms):",
                [round(f) for f in filters],
                "switches (ms):",
                {k: round(v) for k, v in switches.items()},
            )
            started = time.perf_counter()
            page.fill("#s-search", "a099999" if n >= 100_000 else f"a{n - 1:06d}")
            page.locator("#s-count", has_text="1 session match").wait_for(timeout=60_000)
            search = (time.perf_counter() - started) * 1000
            browser.close()
        rows.append(("first contentful paint", f"{timing['paint']:.0f} ms", "target < 2,000 ms"))
        rows.append(("first sessions drawn", f"{timing['rows']:.0f} ms", "from the navigation"))
        rows.append(("elements in the page", f"{timing['nodes']:,}", f"for {n:,} sessions"))
        longest = max((t["duration"] for t in idle), default=0)
        rows.append(
            ("long tasks while idle (5 s)", f"{len(idle)}", f"longest {longest:.0f} ms; target: none over 50 ms")
        )
        worst = max(switches, key=lambda t: switches[t])
        rows.append(
            ("tab switch, median per tab", f"{max(switches.values()):.0f} ms worst ({worst})", "target < 100 ms")
        )
        rows.append(
            (
                "filter (state), click to drawn",
                f"{statistics.median(filters):.0f} ms median",
                f"best {min(filters):.0f}, worst {max(filters):.0f}; target < 100 ms",
            )
        )
        rows.append(("search by id, typed to shown (Playwright)", f"{search:.0f} ms", ""))
    finally:
        proc.terminate()
        proc.wait(600)
        shutil.rmtree(root, ignore_errors=True)  # 100,000 sessions' store: hundreds of MB
    table = Table(title=f"the observer at {n:,} sessions ({load_note()})")
    for column in ("what", "figure", "note"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    main()
