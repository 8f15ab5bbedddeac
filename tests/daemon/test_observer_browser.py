"""The observer page in a real headless Chromium, against a real daemon with demo-like agents.

The page is driven as a person would: the tree shows every session, a crash
injected from the page shows up as a restart, a permission request is
answered from the page. Screenshots are taken on the way (into the test's
folder; with ``WEALD_UPDATE_SCREENSHOTS=1``, also into docs/, where README
shows them).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from observer_harness import split_url

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIG = """
[faults]
enabled = true
[tools.permissions]
shell = "ask"
"""


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
    "crashy": [{"text": "I am about to be crashed on purpose, from the observer page.", "delay": 0.2}],
    "curious": [
        {"tool_calls": [call("ask_user", question="Which branch?", choices=["main", "dev"])]},
        {"text": "Working on the branch you chose."},
    ],
}


@pytest.fixture
def demo_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with serving(tmp_path, "--http", "127.0.0.1:0", extra_config=CONFIG) as proc:
        with proc.client() as client:
            for agent, turns in SCRIPTS.items():
                model = proc.script(agent, turns)
                client.call("agent.start", {"working_dir": str(proc.project), "model": model, "agent_id": agent})
        yield proc


def shoot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    if os.environ.get("WEALD_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(path, DOCS / name)


def test_the_observer_page_shows_the_tree_answers_a_permission_and_a_question_and_watches_a_crash_recover(
    demo_daemon: DaemonProcess, browser_page: Any, tmp_path: Path
) -> None:
    page = browser_page
    client = demo_daemon.client()
    try:
        explored = client.call("agent.prompt", {"agent_id": "explorer", "text": "plan the fix"}, timeout=60)
        assert explored["ok"], explored
        url = client.call("observer.url")["url"]
        base, _ = split_url(url)

        page.goto(url)
        # The tree shows every session, with its agent.
        for agent in SCRIPTS:
            page.locator(f'.node[data-path="/sessions/{agent}/agent"]').wait_for(timeout=30_000)
        assert page.locator("#live").inner_text() == "live"
        # The agents table: tokens used and context fill, as agent.list reports them.
        explorer = page.locator('#agents tr[data-agent="explorer"]')
        explorer.locator("td.context", has_text="%").wait_for(timeout=30_000)
        usage = explored["usage"]
        assert explorer.locator("td.tokens").inner_text() == f"{usage['input_tokens']} / {usage['output_tokens']}"

        # A permission request appears on the page and is answered there.
        fixing = client.request("agent.prompt", {"agent_id": "fixer", "text": "fix it"})
        request = page.locator(".prompt.permission")
        request.wait_for(timeout=30_000)
        assert "echo fixed-from-the-page" in request.inner_text()
        assert "fixer" in request.inner_text()
        page.locator('#agents tr[data-agent="fixer"] td.running .tool-running').wait_for(timeout=30_000)
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

        # A crash injected from the page: the agent's node shows the restart.
        agent_node = page.locator('.node[data-path="/sessions/crashy/agent"]')
        assert agent_node.get_attribute("data-restarts") == "0"
        agent_node.click()
        page.locator("#detail-body", has_text='"agent": "/sessions/crashy/agent"').wait_for(timeout=30_000)
        page.locator("#detail-crash").click()
        page.locator("#detail-note", has_text="armed").wait_for(timeout=30_000)
        crashed = client.call("agent.prompt", {"agent_id": "crashy", "text": "carry on"}, timeout=60)
        assert crashed["interrupted"], crashed
        page.locator('.node[data-path="/sessions/crashy/agent"][data-restarts="1"]').wait_for(timeout=30_000)
        page.locator('#agents tr[data-agent="crashy"] td.restarts', has_text="1").wait_for(timeout=30_000)
        page.locator("#detail-close").click()
        page.locator("#tabs button[data-tab=faults]").click()
        fired = page.locator("#faults tbody tr td.fires")
        fired.first.wait_for(timeout=30_000)
        assert fired.first.inner_text() == "1"

        # The conversation and the task graph, for the README.
        page.locator("#tabs button[data-tab=agents]").click()
        page.locator('#agents tr[data-agent="explorer"]').click()
        page.locator("#conversation .msg.tool", has_text="notes.txt").wait_for(timeout=30_000)
        shoot(page, tmp_path, "observer-conversation.png")
        page.locator("#tabs button[data-tab=tasks]").click()
        page.select_option("#tasks-project", str(demo_daemon.project))
        page.locator("#tasks-graph .task").nth(3).wait_for(timeout=30_000)
        assert page.locator("#tasks-graph path.edge").count() == 3
        shoot(page, tmp_path, "observer-tasks.png")

        # Everything the page loaded came from the observer itself.
        assert all(u.startswith((base + "/", "data:")) for u in page.weald_requests), page.weald_requests
    finally:
        client.close()
