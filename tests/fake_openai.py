"""A real OpenAI-compatible Chat Completions server on loopback, in a thread, for agent and daemon tests.

It speaks the streaming wire format (``text/event-stream`` with ``data:``
chunks, ``finish_reason``, a usage chunk and ``data: [DONE]``), records every
request (its JSON body in `requests`, its headers in `headers`), and plays
queued behaviours: a text reply, a tool call, an HTTP error status, a stream
that stalls after its first chunk, or an error that echoes the request's
headers (as some proxies do in their error messages).
"""

from __future__ import annotations

import json
import secrets
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


class FakeOpenAI:
    """Queue behaviours with `text`, `tool_call`, `tool_calls`, `status`, `stall`, `echo_headers_error`; read `requests`."""

    def __init__(self) -> None:
        self.behaviours: deque[tuple[str, Any]] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # of each request, names lower-cased, in step with `requests`
        self.release_stall = threading.Event()
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, status: int, message: str, kind: str) -> None:
                body = json.dumps({"error": {"message": message, "type": kind}}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                body = json.loads(self.rfile.read(length))
                with owner._lock:
                    owner.requests.append(body)
                    owner.headers.append(headers)
                    number = len(owner.requests)
                    kind, arg = owner.behaviours.popleft() if owner.behaviours else ("text", "(no more replies)")
                if kind == "status":
                    self._json(arg, f"fake error {arg}", "server_error")
                    return
                if kind == "echo_headers_error":
                    self._json(arg, f"bad request; you sent {json.dumps(headers)}", "invalid_request_error")
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                if kind == "stall":
                    self.wfile.write(_chunk({"role": "assistant", "content": "thinking"}))
                    self.wfile.flush()
                    owner.release_stall.wait(30)
                    return
                if kind == "text":
                    self.wfile.write(_chunk({"role": "assistant", "content": arg}))
                    self.wfile.write(_chunk({}, "stop"))
                elif kind == "tool_call":  # (name, arguments)
                    name, arguments = arg
                    call = {
                        "index": 0,
                        "id": f"call_{number}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                    self.wfile.write(_chunk({"role": "assistant", "tool_calls": [call]}))
                    self.wfile.write(_chunk({}, "tool_calls"))
                else:  # tool_calls: (text, [(name, arguments)]), each with a fresh id as OpenAI makes
                    text, calls = arg
                    self.wfile.write(_chunk({"role": "assistant", "content": text}))
                    for index, (name, arguments) in enumerate(calls):
                        call = {
                            "index": index,
                            "id": "call_" + secrets.token_urlsafe(18),
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)},
                        }
                        self.wfile.write(_chunk({"tool_calls": [call]}))
                    self.wfile.write(_chunk({}, "tool_calls"))
                usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openai", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_stall.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def text(self, content: str) -> FakeOpenAI:
        self.behaviours.append(("text", content))
        return self

    def tool_call(self, name: str, arguments: dict[str, Any]) -> FakeOpenAI:
        self.behaviours.append(("tool_call", (name, arguments)))
        return self

    def tool_calls(self, *calls: tuple[str, dict[str, Any]], text: str = "") -> FakeOpenAI:
        """One answer: ``text``, then each call, with a fresh random id (as real servers make them)."""
        self.behaviours.append(("tool_calls", (text, list(calls))))
        return self

    def status(self, code: int) -> FakeOpenAI:
        self.behaviours.append(("status", code))
        return self

    def stall(self) -> FakeOpenAI:
        self.behaviours.append(("stall", None))
        return self

    def echo_headers_error(self, status: int = 400) -> FakeOpenAI:
        self.behaviours.append(("echo_headers_error", status))
        return self
