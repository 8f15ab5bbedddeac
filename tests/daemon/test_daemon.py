"""The daemon end to end: a real `weald serve` process, driven over its real socket."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import pytest
from daemon_harness import DaemonProcess, collect_until
from weald.runtime.daemon.client import Client, RPCCallError
from weald.runtime.testing import wait_until


def model_called(c: Client, agent_id: str) -> bool:
    """True once the agent's current turn has called its model (not only queued the prompt)."""
    events = c.call("debug_state", {"agent_id": agent_id, "events": 50})["recent_events"]
    return any(e["topic"] == "agent.message_start" for e in events)


def test_start_prompt_and_read_the_history_over_the_socket(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "count",
        [
            {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"text": "notes.txt has 3 lines"},
        ],
    )
    with daemon.client() as c:
        agent = c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "counter"})
        assert agent == {"agent_id": "counter"}
        turn = c.call("agent.prompt", {"agent_id": "counter", "text": "how many lines?"}, timeout=30)
        assert (turn["ok"], turn["text"], turn["steps"]) == (True, "notes.txt has 3 lines", 2)
        assert turn["usage"]["output_tokens"] > 0
        history = c.call("agent.history", {"agent_id": "counter"})["messages"]
        assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
        assert history[2]["content"].startswith("1:")
        listed = c.call("agent.list")
        assert [(a["agent_id"], a["state"]) for a in listed] == [("counter", "idle")]


def test_events_arrive_as_notifications(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "events",
        [
            {"text": "looking", "tool_calls": [{"name": "glob", "arguments": {"pattern": "*.txt"}}]},
            {"text": "done looking"},
        ],
    )
    with daemon.client() as c:
        c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "ev"})
        sub = c.call("events.subscribe", {"agent_id": "ev"})["subscription"]
        c.call("agent.prompt", {"agent_id": "ev", "text": "go"}, timeout=30)
        notes = collect_until(
            c, lambda ns: any(n[1]["event"]["topic"] == "agent.turn_end" for n in ns if n[0] == "event")
        )
    topics = [n[1]["event"]["topic"] for n in notes if n[0] == "event"]
    assert all(n[1]["subscription"] == sub for n in notes if n[0] == "event")
    for topic in ["agent.turn_start", "agent.message_delta", "tool.started", "tool.finished", "agent.turn_end"]:
        assert topic in topics


def test_a_permission_request_is_answered_by_the_client(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "writer",
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "written\n"}}]},
            {"text": "wrote it"},
        ],
    )
    with daemon.client() as c:
        c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "w"})
        pending = c.request("agent.prompt", {"agent_id": "w", "text": "write"})
        notes = collect_until(c, lambda ns: any(n[0] == "permission.request" for n in ns))
        request = next(n[1] for n in notes if n[0] == "permission.request")
        assert (request["agent_id"], request["tool"]) == ("w", "write_file")
        c.call("permission.respond", {"request_id": request["request_id"], "decision": "allow"})
        assert pending.get(timeout=30)["text"] == "wrote it"
        with pytest.raises(RPCCallError, match="no open permission request"):
            c.call("permission.respond", {"request_id": request["request_id"], "decision": "allow"})
    assert (daemon.project / "out.txt").read_text() == "written\n"


def test_an_ask_user_question_is_answered_by_the_client(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "asker",
        [
            {
                "tool_calls": [
                    {"name": "ask_user", "arguments": {"question": "Which colour?", "choices": ["red", "blue"]}}
                ]
            },
            {"text": "blue, then"},
        ],
    )
    with daemon.client() as c:
        c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "q"})
        pending = c.request("agent.prompt", {"agent_id": "q", "text": "ask me"})
        notes = collect_until(c, lambda ns: any(n[0] == "ask_user.question" for n in ns))
        question = next(n[1] for n in notes if n[0] == "ask_user.question")
        assert question["choices"] == ["red", "blue"]
        c.call("ask_user.respond", {"question_id": question["question_id"], "answer": "blue"})
        assert pending.get(timeout=30)["text"] == "blue, then"


def test_abort_stops_a_running_turn(daemon: DaemonProcess) -> None:
    model = daemon.script("slow", [{"text": "too slow", "delay": 60}, {"text": "after the abort"}])
    with daemon.client() as c:
        c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "s"})
        pending = c.request("agent.prompt", {"agent_id": "s", "text": "go"})
        wait_until(lambda: model_called(c, "s"))
        assert c.call("agent.abort", {"agent_id": "s"}) == {"aborted": True}
        result = pending.get(timeout=10)
        assert (result["ok"], result["aborted"]) == (False, True)
        assert c.call("agent.prompt", {"agent_id": "s", "text": "again"}, timeout=30)["text"] == "after the abort"


def test_a_client_that_disconnects_mid_turn_loses_nothing(daemon: DaemonProcess) -> None:
    model = daemon.script("later", [{"text": "finished without you", "delay": 1.0}])
    with daemon.client() as c:
        c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "d"})
        c.request("agent.prompt", {"agent_id": "d", "text": "work while I am away"})
        wait_until(lambda: [a for a in c.call("agent.list") if a["state"] == "streaming"])
    with daemon.client() as c:
        history = wait_until(
            lambda: (m := c.call("agent.history", {"agent_id": "d"})["messages"]) and len(m) == 2 and m, timeout=20
        )
        assert history[1]["content"] == "finished without you"


def test_bad_input_gets_clear_errors_and_the_connection_carries_on(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        c.send_raw(b"{this is not json\n")
        c.send_raw(b'{"jsonrpc": "2.0", "id": 7}\n')
        c.send_raw(b"[1, 2]\n")
        c.send_raw(b'{"jsonrpc": "2.0", "id": 8, "method": "agent.start", "params": [1]}\n')
        c.send_raw(b"x" * (16 * 1024 * 1024 + 10) + b"\n")
        replies = collect_until(c, lambda ns: any("too large" in str(n) for n in ns), timeout=60)
        flat = [r[1] for r in replies]  # error replies carry id null, so they come as unmatched
        messages = [e["error"]["message"] for e in flat]
        codes = [e["error"]["code"] for e in flat]
        assert -32700 in codes
        assert any('"method" must be a string' in m for m in messages)
        assert any("expected a JSON object" in m for m in messages)
        assert any("params must be an object" in m for m in messages)
        assert any("message too large" in m for m in messages)
        with pytest.raises(RPCCallError, match=r"method not found: 'agent\.fly'") as unknown:
            c.call("agent.fly")
        assert unknown.value.code == -32601
        with pytest.raises(RPCCallError, match="working_dir: expected str, got int") as wrong:
            c.call("agent.start", {"working_dir": 42})
        assert wrong.value.code == -32602
        with pytest.raises(RPCCallError, match="unknown field colour"):
            c.call("agent.start", {"working_dir": "/tmp", "colour": "red"})
        with pytest.raises(RPCCallError, match="missing required field agent_id"):
            c.call("agent.prompt", {"text": "hi"})
        with pytest.raises(RPCCallError, match="no running agent 'ghost'"):
            c.call("agent.prompt", {"agent_id": "ghost", "text": "hi"})
        with pytest.raises(RPCCallError, match="is not a directory"):
            c.call("agent.start", {"working_dir": "/no/such/dir"})
        assert c.call("daemon.status")["pid"] == daemon.proc.pid  # type: ignore[union-attr]


def test_a_batch_of_requests_gets_a_batch_of_replies(daemon: DaemonProcess) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "daemon.status"},
        {"jsonrpc": "2.0", "method": "daemon.status"},
        {"jsonrpc": "2.0", "id": "b", "method": "nope"},
    ]
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(daemon.socket))
        raw.sendall(msgspec.json.encode(batch) + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            data += raw.recv(65536)
    replies = msgspec.json.decode(data)
    assert [r["id"] for r in replies] == ["a", "b"]
    assert "result" in replies[0]
    assert replies[1]["error"]["code"] == -32601


def test_the_tree_shows_every_node_with_kind_status_restarts_and_mailbox(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        c.call("agent.start", {"working_dir": str(daemon.project), "agent_id": "t1", "asleep": False})
        root = c.call("tree")
    assert (root["path"], root["kind"]) == ("/", "Supervisor")
    assert [n["path"] for n in root["children"]] == [
        "/store",
        "/events",
        "/io",
        "/mcp",
        "/sessions",
        "/metrics",
        "/config",
        "/server",
    ]
    session = root["children"][4]["children"][0]
    assert session["path"] == "/sessions/t1"
    assert [n["path"].rsplit("/", 1)[1] for n in session["children"]] == ["tool_runner", "sub_agents", "agent"]
    for node in session["children"]:
        assert {"kind", "status", "restarts", "mailbox"} <= node.keys()


def test_debug_state_and_tasks_through_the_api(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "tasks",
        [
            {"tool_calls": [{"name": "tasks", "arguments": {"action": "insert", "title": "write the docs"}}]},
            {"text": "noted"},
        ],
    )
    with daemon.client() as c:
        c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "tk"})
        c.call("agent.prompt", {"agent_id": "tk", "text": "track it"}, timeout=30)
        tasks = c.call("tasks.list", {"working_dir": str(daemon.project)})["tasks"]
        assert [(t["id"], t["title"], t["status"]) for t in tasks] == [("1", "write the docs", "open")]
        state = c.call("debug_state", {"agent_id": "tk"})
        assert state["status"] == "idle"
        assert state["tree"][-1]["path"] == "/sessions/tk/agent"
        assert c.call("debug_state")["daemon"]["agents"] == 1


def test_sigterm_stops_cleanly_and_the_next_start_restores_the_sessions(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    model = d.script("two", [{"text": "first"}, {"text": "second, after a restart"}])
    try:
        d.start()
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "keep"})
            c.call("agent.prompt", {"agent_id": "keep", "text": "one"}, timeout=30)
        assert d.terminate(signal.SIGTERM) == 0
        assert not d.socket.exists()
        d.start()
        with d.client() as c:
            assert [a["agent_id"] for a in c.call("agent.list")] == ["keep"]
            assert (
                c.call("agent.prompt", {"agent_id": "keep", "text": "two"}, timeout=30)["text"]
                == "second, after a restart"
            )
        assert d.terminate(signal.SIGINT) == 0
    finally:
        d.close()


def test_after_kill_9_the_next_start_restores_sessions_and_reports_the_interrupted_turn(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    model = d.script("crashy", [{"text": "never finished", "delay": 60}, {"text": "back again"}])
    try:
        d.start()
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "k9"})
            c.request("agent.prompt", {"agent_id": "k9", "text": "start something long"})
            wait_until(lambda: model_called(c, "k9"))
        d.kill9()
        assert d.socket.exists()  # a stale socket is left behind...
        d.start()  # ...and the next start replaces it
        with d.client() as c:
            state = c.call("debug_state", {"agent_id": "k9", "events": 50})
            assert state["restarts"] == 1
            recovered = [e for e in state["recent_events"] if e["topic"] == "agent.recovered"]
            assert recovered
            assert recovered[0]["data"]["interrupted_turn"]
            history = c.call("agent.history", {"agent_id": "k9"})["messages"]
            assert [m["content"] for m in history] == ["start something long"]
            assert c.call("agent.prompt", {"agent_id": "k9", "text": "again"}, timeout=30)["text"] == "back again"
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_live_socket_is_refused_and_a_stale_one_replaced(daemon: DaemonProcess) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(daemon.socket)],
        env=daemon.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 1
    assert "already running" in second.stderr


def test_the_socket_is_owner_only_and_other_users_are_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.fail("this test connects as another uid, which needs root (the CI runs as root)")
    interpreter = Path("/usr/bin/python3")  # the venv's may live where another user cannot reach
    assert interpreter.exists(), "needs a system python3 that any user may run"
    shared = Path(tempfile.mkdtemp(prefix="weald-uid-"))
    os.chmod(shared, 0o755)  # a directory other users may pass through
    d = DaemonProcess(tmp_path, socket_dir=shared / "run")
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    print('refused-by-mode')\n    sys.exit(0)\n"
        "try:\n"
        '    s.sendall(b\'{"jsonrpc": "2.0", "id": 1, "method": "daemon.status"}\\n\')\n'
        "    print('reply' if s.recv(100) else 'refused-by-uid')\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    print('refused-by-uid')\n"
    )

    def as_nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    def connect_as_nobody() -> str:
        done = subprocess.run(
            [str(interpreter), "-c", probe, str(d.socket)],
            capture_output=True,
            text=True,
            preexec_fn=as_nobody,
            timeout=30,
            check=False,
            cwd="/",
        )
        return done.stdout.strip() or done.stderr

    try:
        d.start()
        assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(d.socket.parent).st_mode) == 0o700
        assert connect_as_nobody() == "refused-by-mode"
        # Even with the file opened up to everyone, the daemon checks the peer's uid and hangs up.
        os.chmod(d.socket.parent, 0o755)
        os.chmod(d.socket, 0o777)
        assert connect_as_nobody() == "refused-by-uid"
        with d.client() as c:
            assert c.call("daemon.status")["pid"] == d.proc.pid  # type: ignore[union-attr]
        assert d.terminate() == 0
    finally:
        d.close()
        shutil.rmtree(shared, ignore_errors=True)


def test_stdio_transport_answers_requests_on_stdout(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    requests = (
        msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "method": "daemon.status"})
        + b"\n"
        + msgspec.json.encode({"jsonrpc": "2.0", "id": 2, "method": "agent.list"})
        + b"\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--stdio"],
        input=requests,
        env=d.env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    replies = [msgspec.json.decode(line) for line in done.stdout.splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    assert replies[0]["result"]["socket"] is None
    assert replies[1]["result"] == []


def test_the_cli_commands_work_against_the_daemon(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "cli",
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo from-shell"}}]},
            {"text": "the shell said from-shell"},
        ],
    )
    run = daemon.cli("run", "--json", "--keep", "--yes", "--model", model, "say hi")
    assert run.returncode == 0, run.stderr
    out = msgspec.json.decode(run.stdout)
    assert out["text"] == "the shell said from-shell"
    agents = msgspec.json.decode(daemon.cli("agents", "--json").stdout)
    assert [a["agent_id"] for a in agents] == [out["agent_id"]]
    tree = daemon.cli("tree")
    assert tree.returncode == 0
    assert "sessions" in tree.stdout
    assert "tool_runner" in tree.stdout
    state = msgspec.json.decode(daemon.cli("debug-state", out["agent_id"], "--json").stdout)
    assert state["agent"] == f"/sessions/{out['agent_id']}/agent"
    tasks = daemon.cli("tasks", "--json")
    assert msgspec.json.decode(tasks.stdout)["tasks"] == []
    assert daemon.cli("status", "--json").returncode == 0
    for command in ["serve", "run", "agents", "tree", "debug-state", "tasks", "demo", "status", "stop", "config"]:
        helped = daemon.cli(command, "--help")
        assert helped.returncode == 0
        assert "--json" in helped.stdout


def test_weald_run_denies_permissions_without_a_terminal_and_the_model_is_told(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "denied",
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi"}}]},
            {"text": "I was not allowed"},
        ],
    )
    run = daemon.cli("run", "--model", model, "try")
    assert "not running shell: echo hi (no terminal to ask" in run.stderr
    assert "I was not allowed" in run.stdout
    assert run.returncode == 0, run.stderr  # the turn itself ended well: the model answered


def test_weald_run_starts_an_embedded_daemon_when_none_runs(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    run = d.cli("run", "--quiet", "hello")
    assert run.returncode == 0, run.stderr
    assert "To talk to a real model" in run.stdout  # the demo model's answer
    assert "scripted demo model" not in run.stdout  # --quiet: not its first step's text
    assert not d.socket.exists()


def test_a_wrong_config_is_reported_with_its_path(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config='[tools.shell]\ntimeout = "abc"\n')
    run = d.cli("status")
    assert run.returncode == 2
    assert 'tools.shell.timeout: expected a number, got "abc"' in run.stderr


def test_socket_path_defaults_are_honoured(tmp_path: Path) -> None:
    raw = socket.socket(socket.AF_UNIX)
    raw.close()
    d = DaemonProcess(tmp_path)
    run = d.cli("status", "--json")
    assert run.returncode == 1
    assert str(d.socket) in run.stdout


def test_fault_methods_are_refused_unless_faults_are_enabled(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        for method, params in [
            ("fault.list", {}),
            ("fault.clear", {}),
            ("fault.inject", {"fault": {"target": "actor", "kind": "crash"}}),
        ]:
            with pytest.raises(RPCCallError, match="fault injection is not enabled") as refused:
                c.call(method, params)
            assert refused.value.code == -32002


def test_faults_injected_over_json_rpc_fire_and_show_in_the_tree(tmp_path: Path) -> None:
    faults = tmp_path / "faults.toml"
    faults.write_text("seed = 3\n")
    d = DaemonProcess(tmp_path, faults=faults)
    model = d.script(
        "victim",
        [
            {"tool_calls": [{"name": "glob", "arguments": {"pattern": "*"}}]},
            {"text": "survived"},
        ],
    )
    try:
        d.start()
        with d.client() as c:
            with pytest.raises(RPCCallError, match="kind") as bad:
                c.call("fault.inject", {"fault": {"target": "actor", "kind": "explode"}})
            assert bad.value.code == -32602
            c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "v"})
            fault = {
                "id": "once",
                "target": "actor",
                "kind": "crash",
                "path": "/sessions/v/agent",
                "message": "ToolResults",
                "count": 1,
            }
            assert c.call("fault.inject", {"fault": fault}) == {"id": "once"}
            turn = c.call("agent.prompt", {"agent_id": "v", "text": "go"}, timeout=30)
            assert turn["interrupted"]
            listed = c.call("fault.list")
            assert [(f["id"], f["fires"]) for f in listed["faults"]] == [("once", 1)]
            assert listed["statistics"]["fires_by_kind"] == {"actor.crash": 1} or listed["statistics"]["fires"] == 1
            agent_node = c.call("tree", {"path": "/sessions/v/agent"})
            assert agent_node["faults"] == 1
            session = c.call("tree", {"path": "/sessions/v"})
            assert next(n for n in session["children"] if n["path"] == "/sessions/v/agent")["restarts"] == 1
            assert c.call("fault.clear", {"id": "once"}) == {"cleared": 1}
            assert c.call("fault.list")["faults"] == []
            with pytest.raises(RPCCallError):
                c.call("fault.clear", {"id": "once"})
        assert d.terminate() == 0
    finally:
        d.close()


def test_weald_run_asks_permission_interactively_on_a_terminal(daemon: DaemonProcess) -> None:
    import pty
    import select

    model = daemon.script(
        "tty",
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "tty.txt", "content": "typed yes\n"}}]},
            {"text": "wrote tty.txt"},
        ],
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "run", "--model", model, "write it"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=daemon.env(),
        cwd=daemon.project,
    )
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, timeout: float = 30) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while marker not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {marker!r} on the terminal; it showed: {seen.decode(errors='replace')}"
            ready, _, _ = select.select([master], [], [], remaining)
            if ready:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break

    try:
        read_until(b"allow?")
        assert b"write_file" in seen
        os.write(master, b"y\n")
        read_until(b"wrote tty.txt")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert (daemon.project / "tty.txt").read_text() == "typed yes\n"
