"""The observer page in a real headless Chromium, against a real daemon of 10,000 sessions.

One daemon for the module: 10,000 sessions started asleep with ``agents.start``
and four demo-like agents started awake. The page is driven as a person
would: it must stay responsive (its first paint, long tasks while idle, a
tab switch and a filter, measured in the page with the browser's own
performance APIs), answer a permission request and a question, arm a crash
from the fault form and show the restart, chart a load as it runs, sort the
process table by mailbox, stop a session and restart an actor. Screenshots
are taken on the way (into the test's folder; with
``WEALD_UPDATE_SCREENSHOTS=1``, also into docs/, where README and
docs/protocol.md show them). The same figures at 100,000 sessions come from
benchmarks/bench_observer.py.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from observer_harness import split_url
from weald.runtime.faults import KINDS
from weald.runtime.testing import wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs"
SESSIONS = 10_000
CONFIG = """
[faults]
enabled = true
[tools.permissions]
shell = "ask"
"""
#: Installed before the page's own script: every long task (over 50 ms) the page runs, from its start.
LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.__longTasks.push({start: entry.startTime, duration: entry.duration});
}).observe({type: "longtask", buffered: true});
"""
#: Clicks a tab and answers how long until the browser painted the tab: the click's own work, style, layout, paint.
SWITCH = """async (tab) => {
  const started = performance.now();
  document.querySelector(`#tabs button[data-tab=${tab}]`).click();
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  if (document.getElementById("tab-" + tab).hidden) throw new Error(tab + " did not show");
  return performance.now() - started;
}"""
#: Sets the sessions' state filter and answers how long until the list shows only such sessions.
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
    if (performance.now() - started > 30000) throw new Error("the filter did not apply");
  }
}"""


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "explorer": [
        {"text": "Let me look around the project.", "tool_calls": [call("glob", pattern="*")]},
        {
            "text": "I will track the work.",
            "tool_calls": [
                call(
                    "tasks",
                    action="batch",
                    operations=[
                        {"op": "insert", "ref": "fix", "title": "Fix add() in calc.py"},
                        {"op": "insert", "ref": "test", "title": "Run the tests", "blocked_by": ["fix"]},
                        {"op": "insert", "title": "Note the fix in README.md", "blocked_by": ["test"]},
                        {"op": "insert", "title": "Tell the user", "blocked_by": ["fix"]},
                    ],
                )
            ],
        },
        {"text": "Plan: add() subtracts instead of adding. Tasks 1-4 track the fix."},
    ],
    "fixer": [
        {"text": "Reading the notes first.", "tool_calls": [call("read_file", path="notes.txt")]},
        {"text": "Now the command.", "tool_calls": [call("shell", command="echo fixed-from-the-page")]},
        {"text": "The command printed fixed-from-the-page."},
    ],
    "crashy": [
        {"text": "Ready. The next turn will be crashed on purpose, from the observer's fault form."},
        {"text": "I am about to be crashed.", "delay": 0.2},
        {"text": "Back after the restart."},
    ],
    "curious": [
        {"tool_calls": [call("ask_user", question="Which branch?", choices=["main", "dev"])]},
        {"text": "Working on the branch you chose."},
    ],
}


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon with 10,000 asleep sessions (in a project of their own) and the four demo agents, awake."""
    with serving(tmp_path_factory.mktemp("many"), "--http", "127.0.0.1:0", extra_config=CONFIG) as proc:
        bulk = proc.root / "bulk"
        bulk.mkdir()
        load = proc.root / "scripts" / "load.json"
        load.write_text('{"turns": [{"text": "one more turn of load"}], "repeat": true}')
        with proc.client() as client:
            for first in range(0, SESSIONS, 1000):
                starts = [
                    {"working_dir": str(bulk), "agent_id": f"bulk{n:05d}", "model": f"scripted:{load}", "asleep": True}
                    for n in range(first, first + 1000)
                ]
                results = client.call("agents.start", {"agents": starts}, timeout=300)["results"]
                assert all("result" in r for r in results), [r for r in results if "error" in r][:3]
            for agent, turns in SCRIPTS.items():
                model = proc.script(agent, turns)
                params = {"working_dir": str(proc.project), "model": model, "agent_id": agent, "asleep": False}
                client.call("agent.start", params)
        yield proc


def shoot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    if os.environ.get("WEALD_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(path, DOCS / name)


def open_page(page: Any, daemon: DaemonProcess) -> str:
    with daemon.client() as client:
        url: str = client.call("observer.url")["url"]
    page.add_init_script(LONG_TASKS)
    page.goto(url)
    page.locator("#session-list .vrow[data-agent]").first.wait_for(timeout=30_000)
    return url


def row(page: Any, agent: str) -> Any:
    return page.locator(f'#agents .vrow[data-agent="{agent}"]')


def test_the_page_stays_responsive_at_ten_thousand_sessions(many: DaemonProcess, browser_page: Any) -> None:
    page = browser_page
    with many.client() as client:
        counts = client.call("sessions.page", {"limit": 0})["counts"]
    open_page(page, many)
    timing = page.evaluate(
        """() => ({
            paint: performance.getEntriesByName("first-contentful-paint")[0].startTime,
            rows: performance.now(),
            nodes: document.getElementsByTagName("*").length,
        })"""
    )
    # First paint, and the first sessions listed, within 2 s of the navigation.
    assert timing["paint"] < 2000, timing
    assert timing["rows"] < 2000, timing
    # A summary and pages, not everything: a few hundred elements for 10,004 sessions.
    assert timing["nodes"] < 1500, timing
    assert counts["active"] >= SESSIONS
    assert page.locator("#s-count").inner_text() == f"{counts['active']:,} sessions"
    tree = page.locator('.node[data-path="/sessions"]').inner_text()
    assert f"{counts['active']:,} sessions · {counts['awake']:,} awake" in tree
    # Awake first: the awake sessions (the four demo agents among them) lead the list.
    states = page.locator("#session-list .vrow[data-agent] .badge.status").all_inner_texts()
    assert "hibernated" not in states[: counts["awake"]]
    assert states[counts["awake"]] == "hibernated"
    leading = page.locator("#session-list .vrow[data-agent]").evaluate_all("(rows) => rows.map((r) => r.dataset.agent)")
    assert set(SCRIPTS) <= set(leading[: counts["awake"]])

    # Idle: nothing in the page runs 50 ms or more (the stream's updates, the metrics each second included).
    page.wait_for_timeout(1000)
    page.evaluate("() => { window.__longTasks = []; }")
    page.wait_for_timeout(3000)
    idle = page.evaluate("() => window.__longTasks")
    assert idle == [], f"long tasks while idle: {idle}"

    # On a machine with more runnable processes than cores, the daemon and the browser wait for a core in
    # turn and no median says what the page costs: then the best of the tries must meet the figure.
    loaded = os.getloadavg()[0] > (os.cpu_count() or 1)

    def figure(times: list[float]) -> float:
        return min(times) if loaded else statistics.median(times)

    # A tab switch, painted within 100 ms (each tab, the median of three switches).
    switches: dict[str, float] = {}
    for tab in ["system", "processes", "events", "conversation", "tasks", "mcp", "faults", "agents"]:
        times = []
        for _ in range(3):
            page.evaluate(SWITCH, "system" if tab == "agents" else "agents")
            times.append(page.evaluate(SWITCH, tab))
        switches[tab] = figure(times)
    assert max(switches.values()) < 100, (switches, os.getloadavg())
    # A filter over the 10,004 sessions, fetched from the daemon and drawn within 100 ms: the median of eight.
    filters = [page.evaluate(FILTER, state) for state in ["awake", "active"] * 4]
    assert figure(filters) < 100, (filters, os.getloadavg())
    assert max(filters) < 1000, filters
    # A search by id finds one session among them.
    page.fill("#s-search", "bulk09999")
    page.locator("#s-count", has_text="1 session match").wait_for(timeout=30_000)
    shown = page.locator("#session-list .vrow[data-agent]").evaluate_all("(rows) => rows.map((r) => r.dataset.agent)")
    assert shown == ["bulk09999"]
    page.fill("#s-search", "")
    page.locator("#session-list .vrow[data-agent=explorer]").wait_for(timeout=30_000)
    # The virtual list draws only the rows on screen, wherever it is scrolled.
    page.locator("#session-list").evaluate("(box) => { box.scrollTop = box.scrollHeight / 2; }")
    page.locator("#session-list .vrow[data-agent^=bulk04]").first.wait_for(timeout=30_000)
    assert page.locator("#session-list .vrow").count() < 80


def test_the_page_answers_a_permission_and_a_question_and_arms_a_crash_that_restarts(
    many: DaemonProcess, browser_page: Any, tmp_path: Path
) -> None:
    page = browser_page
    client = many.client()
    try:
        explored = client.call("agent.prompt", {"agent_id": "explorer", "text": "plan the fix"}, timeout=60)
        assert explored["ok"], explored
        url = open_page(page, many)
        base, _ = split_url(url)
        assert page.locator("#live").inner_text() == "live"
        # The agents grid: tokens used and the context's fill, as sessions.page reports them.
        explorer = row(page, "explorer")
        explorer.locator(".c-context", has_text="%").wait_for(timeout=30_000)
        usage = explored["usage"]
        assert explorer.locator(".c-tokens").inner_text() == f"{usage['input_tokens']:,} / {usage['output_tokens']:,}"

        # A permission request appears on the page and is answered there.
        fixing = client.request("agent.prompt", {"agent_id": "fixer", "text": "fix it"})
        request = page.locator(".prompt.permission")
        request.wait_for(timeout=30_000)
        assert "echo fixed-from-the-page" in request.inner_text()
        assert "fixer" in request.inner_text()
        row(page, "fixer").locator(".c-running", has_text="shell").wait_for(timeout=30_000)
        row(page, "fixer").locator(".c-waiting", has_text="permission").wait_for(timeout=30_000)
        shoot(page, tmp_path, "observer-tree.png")
        request.locator("button", has_text="allow").first.click()
        request.wait_for(state="detached", timeout=30_000)
        fixed = fixing.get(timeout=60)
        assert fixed["ok"], fixed
        history = client.call("agent.history", {"agent_id": "fixer"})["messages"]
        assert any(m["role"] == "tool" and "fixed-from-the-page" in m["content"] for m in history)

        # A question, answered from the page with one of its choices.
        asking = client.request("agent.prompt", {"agent_id": "curious", "text": "start"})
        question = page.locator(".prompt.question")
        question.wait_for(timeout=30_000)
        assert "Which branch?" in question.inner_text()
        question.locator("button", has_text="dev").click()
        question.wait_for(state="detached", timeout=30_000)
        assert asking.get(timeout=60)["ok"]
        history = client.call("agent.history", {"agent_id": "curious"})["messages"]
        assert any(m["role"] == "tool" and m["content"] == "The user answered: dev" for m in history)

        # The fault form: its default is the agent last active, a crash at its next turn, said before arming.
        assert client.call("agent.prompt", {"agent_id": "crashy", "text": "get ready"}, timeout=60)["ok"]
        page.locator("#tabs button[data-tab=faults]").click()
        wait_until(
            lambda: page.locator("#fault-where").input_value() == "/sessions/crashy/agent",
            timeout=30,
            message="the fault form to default to the agent last active",
        )
        assert page.locator("#fault-kind").input_value() == "crash"
        assert page.locator("#fault-kind option").all_inner_texts() == list(KINDS["actor"])
        explained = page.locator("#fault-explain").inner_text()
        assert "crashes" in explained
        assert "restarts it" in explained
        assert "prompt" in explained
        page.select_option("#fault-target", "tool")
        assert "hang" in page.locator("#fault-kind option").all_inner_texts()
        page.select_option("#fault-target", "actor")
        assert page.locator("#fault-where").input_value() == "/sessions/crashy/agent"
        restarts = page.locator('#session-list .vrow[data-agent="crashy"] .node')
        assert restarts.get_attribute("data-restarts") == "0"
        page.locator("#fault-inject").click()
        page.locator("#fault-result", has_text="prompted crashy").wait_for(timeout=30_000)
        page.locator('#session-list .vrow[data-agent="crashy"] .node[data-restarts="1"]').wait_for(timeout=30_000)
        page.locator("#faults tbody tr td.fires", has_text="1").first.wait_for(timeout=30_000)
        assert client.call("sessions.page", {"search": "crashy", "state": "awake"})["rows"][0]["restarts"] == 1

        # The conversation: times to the millisecond and each step's tokens; the tabs stay on screen.
        page.locator("#tabs button[data-tab=agents]").click()
        row(page, "explorer").click()
        page.locator("#conversation .msg.tool", has_text="notes.txt").wait_for(timeout=30_000)
        times = page.locator("#conversation .msg .time").all_inner_texts()
        assert times
        assert all(re.fullmatch(r"\d\d:\d\d:\d\d\.\d\d\d", t) for t in times), times
        assert page.locator("#conversation .msg.assistant .tokens").first.inner_text().startswith("in ")
        assert page.locator("#tabs").bounding_box()["y"] >= 0  # type: ignore[index]
        assert page.locator("#tabs button[data-tab=conversation]").is_visible()
        shoot(page, tmp_path, "observer-conversation.png")
        # Tasks open on the project of the agent last active: no choosing needed.
        page.locator("#tabs button[data-tab=tasks]").click()
        page.locator("#tasks-graph .task").nth(3).wait_for(timeout=30_000)
        assert page.locator("#tasks-project").input_value() == str(many.project)
        assert page.locator("#tasks-graph path.edge").count() == 3
        shoot(page, tmp_path, "observer-tasks.png")

        # Everything the page loaded came from the observer itself.
        assert all(u.startswith((base + "/", "data:")) for u in page.weald_requests), page.weald_requests
    finally:
        client.close()


def test_an_operator_watches_a_load_sorts_the_processes_stops_a_session_and_restarts_an_actor(
    many: DaemonProcess, browser_page: Any, tmp_path: Path
) -> None:
    page = browser_page
    open_page(page, many)
    client = many.client()
    stop = threading.Event()
    loaders = [f"bulk{n:05d}" for n in range(100, 108)]

    def load() -> None:
        with many.client() as loading:
            while not stop.is_set():
                turns = [loading.request("agent.prompt", {"agent_id": a, "text": "go"}) for a in loaders]
                for turn in turns:
                    turn.get(timeout=120)

    loader = threading.Thread(target=load, name="load")
    try:
        # The system charts move while a load runs: turns, model calls and tokens each second.
        page.locator("#tabs button[data-tab=system]").click()
        loader.start()
        for series in ["turns_per_s", "model_calls_per_s", "tokens_in_per_s", "commits_per_s"]:
            chart = page.locator(f'#charts .chart[data-chart="{series}"] canvas')
            wait_until(
                lambda chart=chart: float(chart.get_attribute("data-last") or 0) > 0,
                timeout=60,
                message=f"the {series} chart to show the load",
            )
        drawn = int(page.locator('#charts .chart[data-chart="rss_bytes"] canvas').get_attribute("data-points") or 0)
        wait_until(
            lambda: (
                int(page.locator('#charts .chart[data-chart="rss_bytes"] canvas').get_attribute("data-points") or 0)
                > drawn
            ),
            timeout=30,
            message="the charts to take the next sample",
        )
        awake = page.locator('#sys-cards .card[data-metric="sessions_awake"] .value')
        wait_until(lambda: int(awake.inner_text().replace(",", "")) >= len(loaders), timeout=30)
        shoot(page, tmp_path, "observer-system.png")
    finally:
        stop.set()
        loader.join(180)
    assert not loader.is_alive()

    try:
        # The process table, sorted by mailbox: an agent held up by a delay fault comes first, marked growing.
        fault = {"target": "actor", "kind": "delay", "path": "/sessions/bulk00200/agent", "seconds": 1.5}
        fault_id = client.call("fault.inject", {"fault": fault})["id"]
        page.locator("#tabs button[data-tab=processes]").click()
        page.locator("#processes th[data-sort=path]").click()
        wait_until(
            lambda: page.locator("#processes tbody tr").first.get_attribute("data-path") == "/",
            timeout=30,
            message="the actors sorted by path",
        )
        page.locator("#processes th[data-sort=mailbox]").click()

        def held_up() -> bool:
            for _ in range(3):
                client.call("agent.send", {"agent_id": "bulk00200", "text": "more"})
            first = page.locator("#processes tbody tr").first
            return first.get_attribute("data-path") == "/sessions/bulk00200/agent" and "growing" in (
                first.get_attribute("class") or ""
            )

        wait_until(held_up, timeout=60, interval=0.5, message="the jammed agent first, growing")
        mailboxes = [int(t.replace(",", "")) for t in page.locator("#processes tbody td.mailbox").all_inner_texts()]
        assert mailboxes == sorted(mailboxes, reverse=True)
        assert mailboxes[0] >= 3
        shoot(page, tmp_path, "observer-processes.png")
        client.call("fault.clear", {"id": fault_id})

        # An actor restarted from the page: a supervised restart, confirmed first.
        page.locator("#p-search").fill("fixer/agent")
        target = page.locator('#processes tbody tr[data-path="/sessions/fixer/agent"]')
        target.wait_for(timeout=30_000)
        before = client.call("actors.list", {"prefix": "/sessions/fixer", "sort": "path"})["rows"]
        restarts = {r["path"]: r["restarts"] for r in before}["/sessions/fixer/agent"]
        target.click()
        page.locator("#detail-actions button[data-action=restart]").click()
        assert "its supervisor restarts it" in page.locator("#confirm-text").inner_text()
        page.locator("#confirm-ok").click()
        page.locator("#detail-note", has_text=f"restarted (restarts {restarts + 1})").wait_for(timeout=30_000)
        after = client.call("actors.list", {"prefix": "/sessions/fixer", "sort": "path"})["rows"]
        assert {r["path"]: r["restarts"] for r in after}["/sessions/fixer/agent"] == restarts + 1
        page.locator("#detail-close").click()

        # A session stopped from the page: found among the 10,004, confirmed, gone from the active ones.
        page.fill("#s-search", "bulk04242")
        session = page.locator('#session-list .vrow[data-agent="bulk04242"] .node')
        session.wait_for(timeout=30_000)
        session.click()
        page.locator("#detail-body", has_text="asleep").wait_for(timeout=30_000)
        page.locator("#detail-actions button[data-action=stop]").click()
        assert "for good" in page.locator("#confirm-text").inner_text()
        page.locator("#confirm-cancel").click()  # cancelled: nothing happens
        assert client.call("sessions.page", {"search": "bulk04242"})["total"] == 1
        page.locator("#detail-actions button[data-action=stop]").click()
        page.locator("#confirm-ok").click()
        page.locator("#detail-note", has_text="bulk04242 stopped").wait_for(timeout=30_000)
        page.locator("#s-count", has_text="no sessions").wait_for(timeout=30_000)
        assert client.call("sessions.page", {"search": "bulk04242"})["total"] == 0
        stopped = client.call("sessions.page", {"search": "bulk04242", "state": "stopped"})["rows"]
        assert [r["agent_id"] for r in stopped] == ["bulk04242"]
    finally:
        client.close()
