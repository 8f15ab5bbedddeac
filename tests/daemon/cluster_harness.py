"""A cluster on one machine for tests: nodes (``weald serve --listen``) and fronts (``weald serve --front``) as processes.

Every node and front is a real `weald serve` in a subprocess with its own
state directory and configuration; they share one PostgreSQL database (the
``pg_cluster`` fixture's) and one secret. Nodes listen on free loopback
ports; the front finds them through the database.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from daemon_harness import DaemonProcess
from weald.runtime.daemon.client import Client
from weald.runtime.testing import wait_until


class Cluster:
    """Nodes and a front on ``url`` (see the module docstring).

    Args:
        root: where each process gets a directory.
        url: the database.
        lease: the nodes' lease, seconds.
        node_config: more TOML for each node's configuration (tools, limits).
    """

    def __init__(self, root: Path, url: str, *, lease: float = 5.0, node_config: str = "") -> None:
        self.root = root
        self.url = url
        self.lease = lease
        self.secret = "test-" + secrets.token_hex(16)
        self.node_config = node_config
        self.nodes: dict[str, DaemonProcess] = {}
        self.front: DaemonProcess | None = None

    def _cluster_toml(self, labels: dict[str, str] | None = None) -> str:
        text = f'[cluster]\nsecret = "{self.secret}"\n'
        if labels:
            text += "labels = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in labels.items()) + "}\n"
        return text

    def node(self, name: str, *, labels: dict[str, str] | None = None) -> DaemonProcess:
        """Node ``name``'s process (made, not started)."""
        if name not in self.nodes:
            root = self.root / name
            root.mkdir(parents=True, exist_ok=True)
            store = f"url = {json.dumps(self.url)}\nnode_id = {json.dumps(name)}\nlease = {self.lease}"
            self.nodes[name] = DaemonProcess(
                root, store=store, extra_config=self.node_config + "\n" + self._cluster_toml(labels)
            )
        return self.nodes[name]

    def start_nodes(self, *names: str, labels: dict[str, dict[str, str]] | None = None) -> None:
        """Start nodes at once (each waited for until it answers)."""
        procs = [self.node(name, labels=(labels or {}).get(name)) for name in names]
        threads = [threading.Thread(target=proc.start, args=("--listen", "127.0.0.1:0")) for proc in procs]
        errors: list[BaseException] = []

        def run(thread: threading.Thread) -> None:
            thread.start()

        for thread in threads:
            run(thread)
        for thread in threads:
            thread.join(120)
        for proc in procs:
            if proc.proc is None or proc.proc.poll() is not None:
                errors.append(AssertionError(f"node in {proc.root} did not start:\n{proc.log.read_text()[-3000:]}"))
        if errors:
            raise errors[0]

    def start_front(self, name: str = "front", *, extra: str = "") -> DaemonProcess:
        if self.front is None:
            root = self.root / name
            root.mkdir(parents=True, exist_ok=True)
            store = f"url = {json.dumps(self.url)}\nlease = {self.lease}"
            self.front = DaemonProcess(root, store=store, extra_config=extra + "\n" + self._cluster_toml())
        self.front.start("--front")
        return self.front

    def client(self) -> Client:
        assert self.front is not None
        return self.front.client()

    def pid(self, name: str) -> int:
        proc = self.nodes[name].proc
        assert proc is not None
        return proc.pid

    def kill(self, name: str) -> None:
        self.nodes[name].kill9()

    def stop_signal(self, name: str, sig: int) -> None:
        os.kill(self.pid(name), sig)

    def wait_live(self, *names: str, timeout: float = 60) -> None:
        """Wait until each named node's lease is live in the database."""
        from weald.runtime._store_postgres import PostgresBackend

        backend = PostgresBackend(self.url)
        try:

            def live() -> bool:
                rows = {n["node_id"]: n for n in backend.nodes()}
                return all(name in rows and rows[name]["live"] for name in names)

            wait_until(live, timeout=timeout, message=lambda: f"nodes {names} to be live")
        finally:
            backend.close()

    def placement(self) -> dict[str, str | None]:
        """Every placed session's owner, read from the database."""
        from weald.runtime._store_postgres import PostgresBackend

        backend = PostgresBackend(self.url)
        try:
            conn_rows = backend._read("placement", "SELECT agent_id, owner FROM weald_placement", ())
        finally:
            backend.close()
        return dict(conn_rows)

    def close(self) -> None:
        procs = [*self.nodes.values(), *([self.front] if self.front else [])]
        for proc in procs:
            if proc.proc is not None:
                with contextlib.suppress(OSError):
                    os.kill(proc.proc.pid, signal.SIGCONT)
        for proc in procs:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGTERM)
        for proc in procs:
            if proc.proc is not None:
                try:
                    proc.proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.proc.kill()
                    proc.proc.wait(30)
                proc.proc = None
        for proc in procs:
            proc.close()


def weald(*args: str, env: dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``weald ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def result_of(reply: Any) -> Any:
    return reply
