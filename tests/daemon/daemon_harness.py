"""A real `weald serve` in a subprocess, driven over its real Unix socket (shared by the daemon tests)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from weald.runtime import scan_proc
from weald.runtime.daemon.client import Client, DaemonUnavailableError
from weald.runtime.testing import process_alive, wait_until

PERMISSIONS = """
[tools.permissions]
write_file = "ask"
edit_file = "ask"
shell = "ask"
"""
"""The daemon tests' permissions: every tool that writes or runs asks."""


class DaemonProcess:
    """Owns a config dir, a project dir and a daemon process; restartable."""

    def __init__(
        self,
        root: Path,
        *,
        extra_config: str = "",
        faults: Path | None = None,
        socket_dir: Path | None = None,
        store: str = "",
    ) -> None:
        """``store``: more keys of ``[store]`` (``url``, ``node_id``, ``lease``), as TOML lines."""
        self.root = root
        self.project = root / "project"
        self.project.mkdir(parents=True, exist_ok=True)
        (self.project / "notes.txt").write_text("alpha\nbeta\ngamma\n")
        self.scripts = root / "scripts"
        self.scripts.mkdir(exist_ok=True)
        self.socket = (socket_dir or root / "run") / "weald.sock"
        self.config = root / "weald.toml"
        self.config.write_text(
            f'[store]\npath = "{root / "store.db"}"\n{store}\n[server]\nsocket = "{self.socket}"\n' + extra_config
        )
        self.faults = faults
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "serve.out"  # its stdout and stderr; the daemon keeps its own daemon.log in root

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["WEALD_CONFIG"] = str(self.config)
        env.pop("WEALD_SOCKET", None)
        return env

    def start(self, *extra: str, wrapper: tuple[str, ...] = ()) -> DaemonProcess:
        """Start ``weald serve`` (through ``wrapper``, a command that execs the rest, such as prlimit)."""
        serve = [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(self.socket)]
        args = [*wrapper, *serve, *extra]
        if self.faults is not None:
            args += ["--faults", str(self.faults)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(args, env=self.env(), stdout=log, stderr=log, cwd=self.project)
        wait_until(self._answers, timeout=60, message=lambda: f"the daemon to answer; log:\n{self.log.read_text()}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            msg = f"the daemon exited with {self.proc.returncode}:\n{self.log.read_text()}"
            raise AssertionError(msg)
        try:
            with Client.connect(self.socket, timeout=1) as client:
                client.call("daemon.status", timeout=5)
        except (DaemonUnavailableError, OSError):
            return False
        return True

    def client(self) -> Client:
        return Client.connect(self.socket)

    def wait_mcp(self, *servers: str, timeout: float = 60) -> list[dict[str, Any]]:
        """Wait until the named MCP servers are ``running``; returns ``mcp.servers``."""
        seen: list[list[dict[str, Any]]] = [[]]

        def running() -> bool:
            with self.client() as client:
                seen[0] = client.call("mcp.servers", timeout=10)
            states = {s["server"]: s["status"] for s in seen[0]}
            return all(states.get(name) == "running" for name in servers)

        wait_until(running, timeout=timeout, message=lambda: f"MCP servers {servers} to run; mcp.servers: {seen[0]}")
        return seen[0]

    def script(self, name: str, turns: list[dict[str, Any]]) -> str:
        path = self.scripts / f"{name}.json"
        path.write_text(json.dumps({"turns": turns}))
        return f"scripted:{path}"

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None

    def cli(
        self,
        *args: str,
        input_text: str | None = None,
        timeout: float = 120,
        columns: int | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``weald ARGS`` in ``cwd`` (the project) (output not to a terminal: ``columns`` wide, 80 unless given)."""
        env = self.env()
        if columns is not None:
            env["COLUMNS"] = str(columns)
        return subprocess.run(
            [sys.executable, "-m", "weald.runtime.daemon.cli", *args],
            env=env,
            cwd=cwd or self.project,
            capture_output=True,
            text=True,
            input=input_text,
            timeout=timeout,
            check=False,
        )

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        # The daemon runs with WEALD_LOOP_GUARD=1 (tests/conftest.py): it names each blocking call on its loop.
        blocking = [
            line for line in self.log.read_text().splitlines() if "blocking call on the trio loop thread" in line
        ]
        if blocking:
            listed = "\n".join(blocking)
            msg = f"the daemon made blocking calls on its trio loop thread:\n{listed}"
            raise AssertionError(msg)


@contextlib.contextmanager
def serving(root: Path, *args: str, extra_config: str = "") -> Iterator[DaemonProcess]:
    """A daemon started with ``weald serve ARGS``; stopped with SIGTERM (and checked to exit 0) afterwards."""
    proc = DaemonProcess(root, extra_config=extra_config)
    proc.start(*args)
    try:
        yield proc
        if proc.proc is not None:
            assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


def collect_until(client: Client, predicate: Any, timeout: float = 20) -> list[tuple[str, Any]]:
    """Read notifications until ``predicate(notes)`` holds; returns them all."""
    notes: list[tuple[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not predicate(notes):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            msg = f"notifications did not arrive in {timeout} s; got {[n[0] for n in notes]}"
            raise AssertionError(msg)
        note = client.next_notification(timeout=min(remaining, 0.5))
        if note is not None:
            notes.append(note)
    return notes


def sleep_tag() -> str:
    """A unique ``sleep`` duration, findable on the host whatever the process's environment."""
    return f"9{secrets.randbelow(10**6):06d}.{secrets.randbelow(10**6):06d}"


def sleeping(tag: str) -> list[int]:
    """Live host processes running exactly ``sleep <tag>``."""
    argv = f"sleep\0{tag}\0".encode()
    return [pid for pid in scan_proc("cmdline", lambda cmdline: cmdline == argv) or [] if process_alive(pid)]


def recent_events(daemon: DaemonProcess, topic: str) -> list[dict[str, Any]]:
    """The daemon's recent events of ``topic`` (``debug_state``'s ring)."""
    with daemon.client() as client:
        recent = client.call("debug_state", {"events": 500})["recent_events"]
    return [event for event in recent if event["topic"] == topic]
