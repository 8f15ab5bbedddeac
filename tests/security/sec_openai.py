"""A loopback OpenAI-compatible server that records every request, headers included.

`tests/runtime/fake_openai.py` records request bodies; the secrets tests also
need the headers (to prove the API key *was* sent to the provider, and only
there), and replies that echo what the server was sent (as some proxies do in
their error messages).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class RecordingOpenAI:
    """Queue replies with `text`, `tool_call` or `echo_headers_error`; read `requests` (headers, body) after."""

    def __init__(self) -> None:
        self.behaviours: deque[tuple[str, Any]] = deque()
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                body = json.loads(self.rfile.read(length))
                with owner._lock:
                    owner.requests.append((headers, body))
                    kind, arg = owner.behaviours.popleft() if owner.behaviours else ("text", "(no more replies)")
                if kind == "echo_headers_error":
                    # A misbehaving proxy: its error message repeats the request's headers.
                    message = f"bad request; you sent {json.dumps(headers)}"
                    data = json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()
                    self.send_response(arg)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                if kind == "text":
                    self.wfile.write(_chunk({"role": "assistant", "content": arg}))
                    self.wfile.write(_chunk({}, "stop"))
                else:  # tool_call: (name, arguments)
                    name, arguments = arg
                    call = {
                        "index": 0,
                        "id": f"call_{len(owner.requests)}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                    self.wfile.write(_chunk({"role": "assistant", "tool_calls": [call]}))
                    self.wfile.write(_chunk({}, "tool_calls"))
                usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="recording-openai", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> RecordingOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def text(self, content: str) -> RecordingOpenAI:
        self.behaviours.append(("text", content))
        return self

    def tool_call(self, name: str, arguments: dict[str, Any]) -> RecordingOpenAI:
        self.behaviours.append(("tool_call", (name, arguments)))
        return self

    def echo_headers_error(self, status: int = 400) -> RecordingOpenAI:
        self.behaviours.append(("echo_headers_error", status))
        return self
