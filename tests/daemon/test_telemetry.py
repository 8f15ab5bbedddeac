"""OpenTelemetry export from a real daemon, received by Arize Phoenix (`phoenix serve`, from PyPI).

Phoenix is installed by the test setup with pip into a virtual environment of
its own in a cache directory (``$WEALD_TEST_PHOENIX_CACHE`` or
``~/.cache/weald-test-phoenix``): its dependencies are many and pinned, and
must not meet weald's. It stores the spans it receives and answers them on
its REST API. Phoenix takes traces only; the metrics go to a loopback OTLP/HTTP
endpoint here that decodes each request with the official protobuf definitions
(opentelemetry-proto) and records the metric names.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from weald.runtime.testing import wait_until

# The first run installs Phoenix (several minutes on a loaded machine); later ones find it in the cache.
pytestmark = pytest.mark.timeout(1800)

PHOENIX = "arize-phoenix==20.26.1"
_INSTALL_TIMEOUT = 900.0
_START_TIMEOUT = 240.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _phoenix_venv() -> Path:
    root = Path(os.environ.get("WEALD_TEST_PHOENIX_CACHE") or Path.home() / ".cache" / "weald-test-phoenix")
    venv = root / PHOENIX.replace("==", "-")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions install once
        if not (venv / ".installed").exists():
            steps = [[sys.executable, "-m", "venv", str(venv)], [str(venv / "bin" / "pip"), "install", "-q", PHOENIX]]
            for step in steps:
                try:
                    done = subprocess.run(step, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT, check=False)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"installing {PHOENIX} took over {_INSTALL_TIMEOUT:g} s", pytrace=False)
                if done.returncode != 0:
                    pytest.fail(
                        f"installing {PHOENIX} failed ({' '.join(step)}):\n{done.stderr[-3000:]}", pytrace=False
                    )
            (venv / ".installed").write_text(PHOENIX)
    return venv


_GRPC_PORTS: dict[str, int] = {}  # Phoenix's HTTP URL -> its OTLP/gRPC port


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running `phoenix serve` on loopback; its base URL (OTLP/HTTP at /v1/traces)."""
    venv = _phoenix_venv()
    work = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = _free_port(), _free_port()
    env = dict(
        os.environ,
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(grpc_port),
        PHOENIX_WORKING_DIR=str(work),
    )
    log = (work / "phoenix.log").open("wb")
    proc = subprocess.Popen([str(venv / "bin" / "phoenix"), "serve"], env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    _GRPC_PORTS[url] = grpc_port

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"phoenix exited with {proc.returncode}:\n{(work / 'phoenix.log').read_text()[-3000:]}"
            )
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        return False

    try:
        wait_until(healthy, timeout=_START_TIMEOUT, interval=0.5, message="phoenix to answer /healthz")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


class MetricsReceiver:
    """OTLP/HTTP metrics on loopback: each request decoded as an ExportMetricsServiceRequest."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.points: dict[str, list[Any]] = {}
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_metrics:
                    for scope in resource.scope_metrics:
                        for metric in scope.metrics:
                            receiver.names.add(metric.name)
                            receiver.points.setdefault(metric.name, []).append(metric)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def metrics() -> Iterator[MetricsReceiver]:
    receiver = MetricsReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, phoenix: str, metrics: MetricsReceiver) -> Iterator[DaemonProcess]:
    config = f"""
[telemetry]
endpoint = "{phoenix}"
metrics_endpoint = "{metrics.url}"
metrics_interval = 1
[faults]
enabled = true
[tools.permissions]
write_file = "ask"
"""
    with serving(tmp_path_factory.mktemp("otel"), extra_config=config) as proc:
        yield proc


def spans_of(phoenix: str, trace_id: str, count: int, name: str | None = None) -> list[dict[str, Any]]:
    """The spans of one trace in Phoenix, once ``count`` of them arrived (one of them called ``name``)."""
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        with urllib.request.urlopen(f"{phoenix}/v1/projects/default/spans?limit=1000", timeout=10) as answer:
            data = json.loads(answer.read())["data"]
        found[:] = [span for span in data if span["context"]["trace_id"] == trace_id]
        return len(found) >= count and (name is None or any(span["name"] == name for span in found))

    wait_until(arrived, timeout=60, interval=0.5, message=lambda: f"{count} spans of trace {trace_id}; got {found}")
    return found


def allow_permissions(client: Any, stop: threading.Event) -> threading.Thread:
    def answer() -> None:
        while not stop.is_set():
            note = client.next_notification(timeout=0.2)
            if note is not None and note[0] == "permission.request":
                client.call("permission.respond", {"request_id": note[1]["request_id"], "decision": "allow"})

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


def test_a_turn_is_one_trace_under_the_callers_traceparent_with_genai_attributes(
    daemon: DaemonProcess, phoenix: str
) -> None:
    model = daemon.script(
        "traced",
        [
            {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "x\n"}}]},
            {"text": "done"},
        ],
    )
    stop = threading.Event()
    with daemon.client() as client:
        client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "traced"})
        client.call("events.subscribe", {"agent_id": "traced", "topics": ["tool.*"]})
        answering = allow_permissions(client, stop)
        traceparent = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
        with daemon.client() as prompter:
            turn = prompter.call("agent.prompt", {"agent_id": "traced", "text": "go", "traceparent": traceparent})
        stop.set()
        answering.join(5)
    assert turn["ok"], turn

    spans = spans_of(phoenix, TRACE_ID, 6, "invoke_agent traced")
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"].split(" ")[0], []).append(span)
    (root,) = by_name["invoke_agent"]
    assert root["name"] == "invoke_agent traced"
    assert root["parent_id"] == PARENT_SPAN
    assert root["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert root["attributes"]["gen_ai.agent.id"] == "traced"
    assert root["attributes"]["weald.turn.id"] == turn["turn_id"]
    root_id = root["context"]["span_id"]

    chats = by_name["chat"]
    assert len(chats) == 3
    for chat in chats:
        assert chat["parent_id"] == root_id
        attributes = chat["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "scripted"
        assert "gen_ai.usage.input_tokens" in attributes
        assert "gen_ai.usage.output_tokens" in attributes
        assert attributes["gen_ai.response.finish_reasons"]
    tools = sorted(by_name["execute_tool"], key=lambda s: s["start_time"])
    assert [t["name"] for t in tools] == ["execute_tool read_file", "execute_tool write_file"]
    for tool in tools:
        assert tool["parent_id"] == root_id
        assert tool["attributes"]["gen_ai.tool.call.id"]
        assert tool["attributes"]["weald.tool.outcome"] == "ok"
        assert tool["attributes"]["weald.actor.path"] == "/sessions/traced/tool_runner"
    # The permission wait, as events on the call that waited.
    events = [event["name"] for event in tools[1]["events"]]
    assert events == ["weald.permission.requested", "weald.permission.answered"]
    # Message contents are off by default.
    assert not any("gen_ai.output.messages" in span["attributes"] for span in spans)


def test_a_restart_during_a_turn_is_an_event_on_its_span(daemon: DaemonProcess, phoenix: str) -> None:
    model = daemon.script(
        "restarted",
        [{"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}, {"text": "x"}],
    )
    with daemon.client() as client:
        client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "crashy"})
        fault = {
            "id": "crash-crashy",
            "target": "actor",
            "kind": "crash",
            "path": "/sessions/crashy/agent",
            "message": "ToolResults",
            "count": 1,
        }
        client.call("fault.inject", {"fault": fault})
        trace_id = "5bf92f3577b34da6a3ce929d0e0e4737"
        turn = client.call(
            "agent.prompt", {"agent_id": "crashy", "text": "go", "traceparent": f"00-{trace_id}-{PARENT_SPAN}-01"}
        )
    assert turn["interrupted"], turn
    spans = spans_of(phoenix, trace_id, 2, "invoke_agent crashy")
    (root,) = [span for span in spans if span["name"] == "invoke_agent crashy"]
    events = {event["name"]: event for event in root["events"]}
    assert "weald.restart" in events
    assert events["weald.restart"]["attributes"]["weald.actor.path"] == "/sessions/crashy/agent"
    assert "weald.fault_injected" in events
    assert root["status_code"] == "ERROR"


def test_metrics_arrive(daemon: DaemonProcess, metrics: MetricsReceiver) -> None:
    model = daemon.script("metered", [{"tool_calls": [{"name": "glob", "arguments": {"pattern": "*"}}]}, {"text": "x"}])
    with daemon.client() as client:
        client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "metered"})
        assert client.call("agent.prompt", {"agent_id": "metered", "text": "go"})["ok"]
    wanted = {
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "weald.turns",
        "weald.turn.duration",
        "weald.tool.calls",
        "weald.tool.duration",
        "weald.sessions",
        "weald.mailbox.length",
        "weald.store.size",
        "weald.store.commits",
        "weald.store.commit.duration",
        "weald.loop.lag",
    }
    wait_until(lambda: wanted <= metrics.names, timeout=30, message=lambda: f"metrics {wanted - metrics.names}")
    usage = metrics.points["gen_ai.client.token.usage"][-1]
    types = {
        attribute.value.string_value
        for point in usage.histogram.data_points
        for attribute in point.attributes
        if attribute.key == "gen_ai.token.type"
    }
    assert types == {"input", "output"}
    # Each store commit is one point of the commit latency histogram, in seconds (cumulative: the last export has all).
    last = metrics.points["weald.store.commit.duration"][-1]
    assert last.unit == "s"
    exported = sum(point.count for point in last.histogram.data_points)
    assert exported >= 1
    assert all(0 <= point.sum < 60 * point.count for point in last.histogram.data_points if point.count)
    with daemon.client() as client:
        latency = client.call("daemon.status")["store_commits"]
    assert latency["count"] >= exported
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]


@pytest.mark.parametrize("collector", ["down", "silent"])
def test_a_collector_down_or_silent_never_slows_a_turn(tmp_path: Path, collector: str) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if collector == "down":
        listener.close()  # nothing listens: connections are refused
    else:
        listener.listen(64)  # accepts, never answers: every export waits for its timeout
    config = f'[telemetry]\nendpoint = "http://127.0.0.1:{port}"\nmetrics_interval = 1\n'
    try:
        with serving(tmp_path, extra_config=config) as daemon:
            model = daemon.script("lone", [{"text": f"turn {n}"} for n in range(20)])
            with daemon.client() as client:
                client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "lone"})
                took = []
                for _ in range(20):
                    began = time.monotonic()
                    assert client.call("agent.prompt", {"agent_id": "lone", "text": "go"}, timeout=30)["ok"]
                    took.append(time.monotonic() - began)
                    time.sleep(0.05)
                # The exports fail (or time out) on their own thread; the turns never waited for them.
                assert max(took) < 2.0, took
                wait_until(
                    lambda: client.call("daemon.status")["telemetry"]["spans_dropped"] > 0,
                    timeout=60,
                    message="the dropped spans to be counted",
                )
                status = client.call("daemon.status")["telemetry"]
                assert status["spans_exported"] == 0
                assert status["export_failures"] >= 1
    finally:
        listener.close()


def test_message_contents_go_on_spans_only_for_a_project_that_opts_in(
    daemon: DaemonProcess, phoenix: str, tmp_path: Path
) -> None:
    project = tmp_path / "open-project"
    project.mkdir()
    (project / "weald.toml").write_text("[telemetry]\ncapture_content = true\n")
    (project / "notes.txt").write_text("one\n")
    model = daemon.script(
        "contents",
        [
            {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"text": "one line"},
        ],
    )
    traces = {"open": "6bf92f3577b34da6a3ce929d0e0e4738", "closed": "7bf92f3577b34da6a3ce929d0e0e4739"}
    with daemon.client() as client:
        for name, directory in (("open", project), ("closed", daemon.project)):
            client.call("agent.start", {"working_dir": str(directory), "model": model, "agent_id": f"c-{name}"})
            traceparent = f"00-{traces[name]}-{PARENT_SPAN}-01"
            assert client.call("agent.prompt", {"agent_id": f"c-{name}", "text": "go", "traceparent": traceparent})[
                "ok"
            ]
    opened = spans_of(phoenix, traces["open"], 4, "invoke_agent c-open")
    chat = next(s for s in opened if s["name"].startswith("chat") and "one line" in str(s["attributes"]))
    assert "one line" in chat["attributes"]["gen_ai.output.messages"]
    (tool,) = [s for s in opened if s["name"] == "execute_tool read_file"]
    assert json.loads(tool["attributes"]["gen_ai.tool.call.arguments"]) == {"path": "notes.txt"}
    closed = spans_of(phoenix, traces["closed"], 4, "invoke_agent c-closed")
    assert not any("gen_ai.output.messages" in s["attributes"] for s in closed)
    assert not any("gen_ai.tool.call.arguments" in s["attributes"] for s in closed)


@pytest.fixture(scope="module")
def trace_mcp_url() -> Iterator[str]:
    """An MCP server over Streamable HTTP whose ``trace`` tool says what trace context it was called with."""
    port = _free_port()
    script = Path(__file__).with_name("trace_mcp_server.py")
    proc = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the MCP server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    try:
        wait_until(listening, timeout=60, interval=0.2, message="the MCP server to listen")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()


def test_an_mcp_call_over_http_carries_its_spans_trace_context(
    daemon: DaemonProcess, phoenix: str, trace_mcp_url: str
) -> None:
    model = daemon.script(
        "mcp-traced", [{"tool_calls": [{"name": "mcp__tracer__trace", "arguments": {}}]}, {"text": "ok"}]
    )
    trace_id = "8bf92f3577b34da6a3ce929d0e0e4740"
    stop = threading.Event()
    with daemon.client() as client:
        start = {
            "working_dir": str(daemon.project),
            "model": model,
            "agent_id": "mcp-traced",
            "mcp_servers": [{"name": "tracer", "url": trace_mcp_url}],
        }
        client.call("agent.start", start, timeout=120)
        client.call("events.subscribe", {"agent_id": "mcp-traced", "topics": ["tool.*"]})
        answering = allow_permissions(client, stop)
        with daemon.client() as prompter:
            traceparent = f"00-{trace_id}-{PARENT_SPAN}-01"
            turn = prompter.call("agent.prompt", {"agent_id": "mcp-traced", "text": "go", "traceparent": traceparent})
        stop.set()
        answering.join(5)
        history = client.call("agent.history", {"agent_id": "mcp-traced"})["messages"]
    assert turn["ok"], turn
    (result,) = [m for m in history if m["role"] == "tool"]
    seen = json.loads(result["content"])
    spans = spans_of(phoenix, trace_id, 5, "tools/call trace")
    (call,) = [s for s in spans if s["name"] == "tools/call trace"]
    (tool,) = [s for s in spans if s["name"] == "execute_tool mcp__tracer__trace"]
    assert call["parent_id"] == tool["context"]["span_id"]
    assert call["attributes"]["mcp.method.name"] == "tools/call"
    assert call["attributes"]["weald.actor.path"] == "/sessions/mcp-traced/mcp/tracer"
    expected = f"00-{trace_id}-{call['context']['span_id']}-01"
    assert seen == {"header": expected, "meta": expected}


def test_traces_go_over_grpc_too(phoenix: str, tmp_path: Path) -> None:
    grpc = f"http://127.0.0.1:{_GRPC_PORTS[phoenix]}"
    config = (
        f'[telemetry]\nendpoint = "{grpc}"\nprotocol = "grpc"\nmetrics_endpoint = "{grpc}"\nmetrics_interval = 60\n'
    )
    trace_id = "9bf92f3577b34da6a3ce929d0e0e4741"
    with serving(tmp_path, extra_config=config) as daemon:
        model = daemon.script("grpc", [{"text": "over grpc"}])
        with daemon.client() as client:
            client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "grpc"})
            traceparent = f"00-{trace_id}-{PARENT_SPAN}-01"
            assert client.call("agent.prompt", {"agent_id": "grpc", "text": "go", "traceparent": traceparent})["ok"]
            assert client.call("daemon.status")["telemetry"]["protocol"] == "grpc"
    spans = spans_of(phoenix, trace_id, 2, "invoke_agent grpc")
    assert {span["name"].split(" ")[0] for span in spans} == {"invoke_agent", "chat"}
