"""docs/protocol.md's event catalogue against the code that publishes and a real turn that is watched.

The turn: a model reply with two tool calls (one succeeds, one fails), then a
shell command that asks permission (answered), then the answer.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
from daemon_harness import DaemonProcess, collect_until

ROOT = Path(__file__).parents[2]
PROTOCOL = ROOT / "docs" / "protocol.md"


@attrs.frozen
class Entry:
    required: frozenset[str]
    optional: frozenset[str]
    open_ended: bool  # "and what the kind adds": more fields may come


def catalogue() -> dict[str, Entry]:
    """The rows of the catalogue's tables: topic -> its data fields."""
    text = PROTOCOL.read_text()
    section = text.split("### The event catalogue", 1)[1].split("\n### ", 1)[0]
    entries: dict[str, Entry] = {}
    for topic, data in re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \| (.*?) \| .*\|$", section, re.MULTILINE):
        names = re.findall(r"`([a-z_]+)(\??)`", data.split(", and what")[0])
        entries[topic] = Entry(
            required=frozenset(n for n, mark in names if not mark),
            optional=frozenset(n for n, mark in names if mark),
            open_ended="what the kind adds" in data,
        )
    assert len(entries) > 40, "the catalogue's tables were not found"
    return entries


def published_in_code() -> set[str]:
    """Every topic the source publishes by name."""
    topics: set[str] = set()
    for path in [*ROOT.glob("runtime/**/*.py"), *ROOT.glob("tools/**/*.py"), *ROOT.glob("supervisors/**/*.py")]:
        source = path.read_text()
        topics.update(re.findall(r'publish\(\s*"([a-z_]+\.[a-z_]+)"', source))
        if "supervisors" in path.parts:
            topics.update(f"supervisor.{t}" for t in re.findall(r'self\._publish\(\s*"([a-z_]+)"', source))
        # Tools stream events as tool.<kind> through ctx.emit / the runner's emit.
        topics.update(f"tool.{kind}" for kind in re.findall(r'\bemit\(\s*"([a-z_]+)"', source))
        topics.update(f"tool.{kind}" for kind in re.findall(r'_emit\(\s*"([a-z_]+)"', source))
        # An MCP server's notifications, as mcp.<kind> (runtime/mcp/_session.py's _NOTICES).
        topics.update(f"mcp.{kind}" for kind in re.findall(r'"notifications/[a-z_/]+": "([a-z_]+)"', source))
    return topics


def test_every_topic_the_code_publishes_is_in_the_catalogue() -> None:
    documented = set(catalogue())
    published = published_in_code()
    assert {"tool.started", "tool.finished", "tool.failed", "tool.output", "supervisor.child_restarted"} <= published
    assert sorted(published - documented) == []


def test_a_real_turn_publishes_what_the_catalogue_says(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, extra_config='[tools.permissions]\nshell = "ask"\n')
    model = daemon.script(
        "cat",
        [
            {
                "text": "Reading two files.",
                "tool_calls": [
                    {"name": "read_file", "arguments": {"path": "notes.txt"}},
                    {"name": "read_file", "arguments": {"path": "missing.txt"}},
                ],
            },
            {"text": "Now a command.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo catalogue"}}]},
            {"text": "notes.txt has three lines; missing.txt is not there."},
        ],
    )
    daemon.start()
    try:
        with daemon.client() as client:
            client.call("events.subscribe", {"topics": ["*"]})
            client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "cat"})
            pending = client.request("agent.prompt", {"agent_id": "cat", "text": "look"})
            notes = collect_until(client, lambda ns: any(n[0] == "permission.request" for n in ns), timeout=60)
            request = next(n[1] for n in notes if n[0] == "permission.request")
            client.call("permission.respond", {"request_id": request["request_id"], "decision": "allow"})
            assert pending.get(timeout=60)["ok"]
            notes += collect_until(
                client,
                lambda ns: any(n[0] == "event" and n[1]["event"]["topic"] == "agent.turn_end" for n in ns),
                timeout=60,
            )
        assert daemon.terminate() == 0, daemon.log.read_text()
    finally:
        daemon.close()

    events: list[dict[str, Any]] = [n[1]["event"] for n in notes if n[0] == "event"]
    seen = {e["topic"] for e in events}
    assert {
        "agent.turn_start",
        "agent.state",
        "agent.message_start",
        "agent.message_delta",
        "agent.tool_call",
        "agent.message_end",
        "tool.started",
        "tool.finished",
        "tool.failed",
        "tool.output",
        "permission.requested",
        "permission.answered",
        "agent.turn_end",
        "supervisor.child_started",
    } <= seen
    entries = catalogue()
    problems = []
    for event in events:
        entry = entries.get(event["topic"])
        if entry is None:
            problems.append(f"{event['topic']} is not in the catalogue")
            continue
        fields = set(event["data"])
        if not entry.required <= fields:
            problems.append(f"{event['topic']} lacks {sorted(entry.required - fields)}")
        if not entry.open_ended and not fields <= entry.required | entry.optional:
            problems.append(f"{event['topic']} has undocumented {sorted(fields - entry.required - entry.optional)}")
    assert sorted(set(problems)) == []
    # A failed call is tool.failed, not tool.finished; each call ends one way only.
    ends = [(e["topic"], e["data"]["call_id"]) for e in events if e["topic"] in ("tool.finished", "tool.failed")]
    started = [e["data"]["call_id"] for e in events if e["topic"] == "tool.started"]
    assert sorted(call for _, call in ends) == sorted(started)
    failed = [e for e in events if e["topic"] == "tool.failed"]
    assert len(failed) == 1
    assert failed[0]["data"]["ok"] is False
    assert "missing.txt" in failed[0]["data"]["error"]
