"""Workers shared by the supervisor tests (imported by name: tests run in prepend import mode)."""

from __future__ import annotations

import threading
from typing import Any

from weald.runtime import Actor, ThreadActor


class Journal:
    """A thread-safe log of lifecycle steps: ('start'|'stop', path)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[tuple[str, str]] = []

    def add(self, kind: str, path: str) -> None:
        with self._lock:
            self.entries.append((kind, path))

    def of(self, kind: str) -> list[str]:
        with self._lock:
            return [p for k, p in self.entries if k == kind]

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()


JOURNAL = Journal()


class Worker(Actor):
    """Crashes on 'crash' (tell) or raises back on 'fail' (ask); records start and stop."""

    def on_start(self) -> None:
        JOURNAL.add("start", self.path)

    def on_stop(self) -> None:
        JOURNAL.add("stop", self.path)

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError(f"{self.path} crashed")
        if message == "fail":
            raise ValueError("bad request")
        if isinstance(message, BaseException):
            raise message
        return message


class ThreadWorker(ThreadActor):
    def on_start(self) -> None:
        JOURNAL.add("start", self.path)

    def on_stop(self) -> None:
        JOURNAL.add("stop", self.path)

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError(f"{self.path} crashed")
        if message == "fail":
            raise ValueError("bad request")
        if isinstance(message, BaseException):
            raise message
        return message


class FakeClock:
    """Restart intensity measured on a clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
