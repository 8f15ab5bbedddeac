"""A reader of the observer's event stream (server-sent events over real HTTP on loopback), for the observer tests."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from weald.runtime.testing import wait_until


def split_url(url: str) -> tuple[str, str]:
    """``http://127.0.0.1:PORT/?token=T`` as (base, token)."""
    parts = urllib.parse.urlsplit(url)
    token = urllib.parse.parse_qs(parts.query)["token"][0]
    return f"{parts.scheme}://{parts.netloc}", token


class StreamReader:
    """Reads ``/api/stream`` in a thread; keeps every message as (arrival time, name, data)."""

    def __init__(self, base: str, token: str) -> None:
        self.messages: list[tuple[float, str, Any]] = []
        self.opened = 0.0
        self.closed = 0.0
        self.error: BaseException | None = None
        parts = urllib.parse.urlsplit(base)
        self._connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
        self._token = token
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sse reader", daemon=True)

    def __enter__(self) -> StreamReader:
        self.opened = time.monotonic()
        self._thread.start()
        wait_until(lambda: self.named("hello") or self.error, timeout=30, message="the stream's hello")
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        sock = self._connection.sock
        if sock is not None:
            # Wakes the reader blocked in recv: the stream ends as when a browser tab closes.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the stream reader did not stop"
        self._connection.close()
        self.closed = time.monotonic()

    def _run(self) -> None:
        try:
            self._connection.request("GET", "/api/stream", headers={"Authorization": f"Bearer {self._token}"})
            response = self._connection.getresponse()
            if response.status != 200:
                self.error = AssertionError(f"the stream answered {response.status}: {response.read()!r}")
                return
            name, data = "message", []
            while not self._stop.is_set():
                raw = response.readline()
                if not raw:
                    return
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
                elif line == "" and data:
                    self.messages.append((time.monotonic(), name, json.loads("\n".join(data))))
                    name, data = "message", []
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if not self._stop.is_set():
                self.error = exc

    def named(self, name: str) -> list[Any]:
        return [data for _, kind, data in list(self.messages) if kind == name]

    def views(self, name: str) -> list[Any]:
        return [data["outcome"] for data in self.named("view") if data["name"] == name]

    def events(self) -> list[dict[str, Any]]:
        hello = self.named("hello")
        out = list(hello[0]["events"]) if hello else []
        for batch in self.named("events"):
            out.extend(batch["events"])
        return out
