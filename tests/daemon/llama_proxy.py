"""A loopback HTTP proxy in front of a llama.cpp server that shows the model how to call a tool.

SmolLM2-135M, the tests' real model, answers in prose when asked to read a
file, even with ``tool_choice: "required"``; shown exchanges where a file
was read with ``read_file`` first, it calls ``read_file`` itself (greedy
sampling: every run alike) once it has seen two. The proxy puts that exchange after the system
prompt of every chat request that offers tools, and passes everything else,
requests and streamed answers, through unchanged. The server counts the
exchange's tokens; weald sees them as part of what its system prompt costs.
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading
import urllib.parse
from typing import Any


def _read(path: str, call_id: str, content: str) -> list[dict[str, Any]]:
    """One exchange where the user asks for a file and the model reads it with read_file (OpenAI's format)."""
    arguments = json.dumps({"path": path})
    call = {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}
    return [
        {"role": "user", "content": f"Read the file {path}"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": content},
        {"role": "assistant", "content": f"The file says {content}."},
    ]


# Two exchanges: with one, the model answers "The file says big.txt." instead of reading it.
EXAMPLE = [*_read("notes.txt", "call_1", "hello"), *_read("todo.txt", "call_2", "buy milk")]


class ToolCallingProxy:
    """Forwards to ``upstream`` (``http://host:port``); `start` binds a free loopback port."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.shown = 0  # requests that got the example
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ToolCallingProxy:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                payload: Any = json.loads(body) if body else None
                messages = payload.get("messages") if isinstance(payload, dict) else None
                if messages and payload.get("tools"):
                    at = 1 if messages[0].get("role") == "system" else 0
                    payload["messages"] = [*messages[:at], *EXAMPLE, *messages[at:]]
                    proxy.shown += 1
                    body = json.dumps(payload).encode()
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=300)
                try:
                    conn.request("POST", self.path, body, {"Content-Type": "application/json"})
                    answer = conn.getresponse()
                    self.send_response(answer.status)
                    for name, value in answer.getheaders():
                        if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(name, value)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    while chunk := answer.read1(65536):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                finally:
                    conn.close()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="llama-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
