"""Many agents at once: 1,000 concurrent scripted turns with tool calls, nothing lost or crossed."""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

from weald.runtime.daemon.client import Client
from weald.runtime.daemon.config import parse_config
from weald.runtime.daemon.tree import Daemon

AGENTS = 1000
CONNECTIONS = 8


def test_a_thousand_agents_run_turns_with_tool_calls_concurrently_without_losing_or_crossing_messages(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for i in range(AGENTS):
        (project / f"note{i}.txt").write_text(f"secret of agent {i}\n")
        turns = [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": f"note{i}.txt"}}]},
            {"text": f"agent {i} read its note"},
        ]
        (scripts / f"a{i}.json").write_text(json.dumps({"turns": turns}))
    sock_dir = Path(tempfile.mkdtemp(prefix="weald-many-"))  # short: socket paths are limited to 107 bytes
    config = parse_config(f'[store]\npath = "{tmp_path / "store.db"}"\n')
    daemon = Daemon(config, socket_path=sock_dir / "w.sock").start()
    clients: list[Client] = []
    try:
        clients += [Client.connect(daemon.socket_path) for _ in range(CONNECTIONS)]
        starts = [
            clients[i % CONNECTIONS].request(
                "agent.start",
                {"working_dir": str(project), "model": f"scripted:{scripts / f'a{i}.json'}", "agent_id": f"a{i}"},
            )
            for i in range(AGENTS)
        ]
        assert [f.get(timeout=120)["agent_id"] for f in starts] == [f"a{i}" for i in range(AGENTS)]
        turns = [
            clients[i % CONNECTIONS].request("agent.prompt", {"agent_id": f"a{i}", "text": f"prompt {i}"})
            for i in range(AGENTS)
        ]
        results = [f.get(timeout=300) for f in turns]
        assert [(r["ok"], r["text"]) for r in results] == [(True, f"agent {i} read its note") for i in range(AGENTS)]

        errors: list[str] = []

        def check(part: range) -> None:
            client = Client.connect(daemon.socket_path)
            try:
                for i in part:
                    messages = client.call("agent.history", {"agent_id": f"a{i}"}, timeout=60)["messages"]
                    contents = [m["content"] for m in messages]
                    # read_file tags the line "1:hh|...": this agent's own note, and nothing else.
                    if contents[:1] + contents[3:] != [f"prompt {i}", f"agent {i} read its note"] or not (
                        len(contents) == 4
                        and contents[2].startswith("1:")
                        and contents[2].endswith(f"|secret of agent {i}")
                    ):
                        errors.append(f"a{i}: {contents}")
            finally:
                client.close()

        checkers = [threading.Thread(target=check, args=(range(k, AGENTS, 4),)) for k in range(4)]
        for t in checkers:
            t.start()
        for t in checkers:
            t.join()
        assert errors == []
        assert clients[0].call("daemon.status")["agents"] == AGENTS
    finally:
        for client in clients:
            client.close()
        daemon.shutdown()
