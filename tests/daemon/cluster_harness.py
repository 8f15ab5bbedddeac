"""A cluster on one machine for tests: nodes (``weald serve --listen``) and fronts (``weald serve --front``) as processes.

Every node and front is a real `weald serve` in a subprocess with its own
state directory and configuration; they share one PostgreSQL database (the
``pg_cluster`` fixture's) and one secret. Nodes listen on free loopback
ports; the front finds them through the database.

`Load`, `check_exactly_once` and `check_one_owner_each` take any cluster
with ``url``, ``client()`` (the front), ``placement()`` and ``nodes`` (each
with ``client()``, on the node's own socket): this module's `Cluster` and the
one ``weald serve --ray`` launches (tests/daemon/test_cluster_ray.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from daemon_harness import DaemonProcess
from weald.runtime import Store
from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError
from weald.runtime.testing import wait_until


class Cluster:
    """Nodes and a front on ``url`` (see the module docstring).

    Args:
        root: where each process gets a directory.
        url: the database.
        lease: the nodes' lease, seconds.
        node_config: more TOML for each node's configuration (tools, limits).
        commit_log: the nodes log each fenced commit (``[store] commit_log``).
    """

    def __init__(
        self, root: Path, url: str, *, lease: float = 5.0, node_config: str = "", commit_log: bool = False
    ) -> None:
        self.root = root
        self.url = url
        self.lease = lease
        self.commit_log = commit_log
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
            if self.commit_log:
                store += "\ncommit_log = true"
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

    def commit_log_owners(self) -> tuple[int, dict[str, set[str]]]:
        """Check the nodes' commit log: no session ever had two owners. Returns the rows read and each session's writers.

        In the log's order (a takeover's epoch + 1 waits for the commits that
        share-locked the placement row before it), a session's commits never go
        back to an older epoch, and all those of one epoch are one node's.
        """
        import psycopg

        with psycopg.connect(self.url) as conn:
            rows = conn.execute("SELECT node_id, agent_ids, epochs FROM weald_commit_log ORDER BY seq").fetchall()
        last: dict[str, tuple[int, str]] = {}  # session -> (epoch, node) of its latest commit so far
        writers: dict[str, set[str]] = {}
        for node, ids, epochs in rows:
            for session, epoch in zip(ids, epochs, strict=True):
                seen = last.get(session)
                if seen is not None:
                    assert epoch >= seen[0], (
                        f"{session}: {node} wrote under epoch {epoch} after {seen[1]} under {seen[0]}"
                    )
                    assert epoch > seen[0] or node == seen[1], (
                        f"{session}: epoch {epoch} written by {seen[1]} and {node}"
                    )
                last[session] = (epoch, node)
                writers.setdefault(session, set()).add(node)
        return len(rows), writers

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


def sessions_of(cluster: Any) -> dict[str, list[str]]:
    by_node: dict[str, list[str]] = {}
    for agent_id, owner in cluster.placement().items():
        if agent_id.startswith("s"):  # the module's sessions (a test's own have other names)
            by_node.setdefault(str(owner), []).append(agent_id)
    return by_node


def running_on(cluster: Any, name: str) -> set[str]:
    """The sessions node ``name`` runs (awake or asleep), asked directly on its own socket."""
    with cluster.nodes[name].client() as client:
        rows = client.call("agent.list", timeout=120)
    return {r["agent_id"] for r in rows if r["state"] not in ("not running", "stopped")}


class Load:
    """Client threads prompting random sessions through the front, each prompt with its own text and key.

    A thread whose connection breaks (the front restarted) connects again and goes on.
    """

    def __init__(self, cluster: Any, agent_ids: list[str], threads: int = 4) -> None:
        self.cluster = cluster
        self.agent_ids = agent_ids
        self.acked: list[dict[str, Any]] = []  # {"agent_id", "text", "turn_id", "at"}
        self.errors: list[str] = []
        self.reconnects = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(seed,), daemon=True) for seed in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        client: Client | None = None
        while not self._stop.is_set():
            if client is None or client.broken:
                if client is not None:
                    client.close()
                try:
                    client = self.cluster.client()
                except (DaemonUnavailableError, OSError):
                    self.reconnects += 1
                    time.sleep(0.2)
                    continue
            agent_id = rng.choice(self.agent_ids)
            text = f"load-{uuid.uuid4().hex}"
            try:
                reply = client.call(
                    "agent.prompt", {"agent_id": agent_id, "text": text, "idempotency_key": text}, timeout=120
                )
            except (DaemonUnavailableError, OSError):
                client.close()
                client = None
                continue
            except RPCCallError as exc:
                if client.broken:  # the front went away mid-call: the prompt may have run; not acknowledged
                    client.close()
                    client = None
                    continue
                with self._lock:
                    self.errors.append(f"{agent_id}: {exc}")
                continue
            with self._lock:
                if reply.get("ok"):
                    self.acked.append(
                        {"agent_id": agent_id, "text": text, "turn_id": reply["turn_id"], "at": time.time()}
                    )
                else:
                    self.errors.append(f"{agent_id}: {reply.get('error')}")
        if client is not None:
            client.close()

    def wait_for(self, count: int, timeout: float = 120) -> None:
        start = len(self.acked)
        wait_until(lambda: len(self.acked) >= start + count, timeout=timeout, message=lambda: f"{count} more acks")


def prompt_all(cluster: Any, agent_ids: list[str], threads: int = 8, text: str = "still there?") -> dict[str, float]:
    """Prompt each session once through the front, from ``threads`` clients; each one's seconds (fails on any error)."""
    answered: dict[str, float] = {}
    failures: list[str] = []
    lock = threading.Lock()

    def run(share: list[str]) -> None:
        with cluster.client() as client:
            for agent_id in share:
                sent = time.monotonic()
                try:
                    reply = client.call("agent.prompt", {"agent_id": agent_id, "text": text}, timeout=120)
                except RPCCallError as exc:
                    with lock:
                        failures.append(f"{agent_id}: {exc}")
                    continue
                with lock:
                    if reply.get("ok"):
                        answered[agent_id] = time.monotonic() - sent
                    else:
                        failures.append(f"{agent_id}: {reply}")

    workers = [threading.Thread(target=run, args=(agent_ids[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(600)
    assert not failures, failures[:5]
    assert len(answered) == len(agent_ids)
    return answered


def check_exactly_once(cluster: Any, acked: list[dict[str, Any]]) -> None:
    """Each acknowledged prompt: its user message once in its session's history, its turn once and done."""
    store = Store(url=cluster.url)
    try:
        by_agent: dict[str, list[dict[str, Any]]] = {}
        for ack in acked:
            by_agent.setdefault(ack["agent_id"], []).append(ack)
        for agent_id, acks in by_agent.items():
            texts = [
                entry["message"]["content"]
                for _, entry in store.items("history", f"{agent_id}/")
                if isinstance(entry, dict) and entry.get("message", {}).get("role") == "user"
            ]
            turns = {key.rpartition("/")[2]: turn for key, turn in store.items("turns", f"{agent_id}/")}
            done_prompts = [t for t in turns.values() if t.get("status") == "done"]
            for ack in acks:
                assert ack["turn_id"] in turns, ack
                assert turns[ack["turn_id"]]["status"] == "done", ack
                ran = texts.count(ack["text"])
                interrupted = sum(1 for t in turns.values() if t.get("status") == "interrupted")
                # Once, or once more in a turn its node's death interrupted (the retry then ran it, once).
                assert 1 <= ran <= 1 + interrupted, (ack, ran)
            assert len(done_prompts) >= len(acks)
    finally:
        store.close()


def check_one_owner_each(cluster: Any, nodes: tuple[str, ...], expected: int) -> None:
    """Each session has one owner, a live node, and is run by that node alone."""
    placement = cluster.placement()
    assert len(placement) == expected
    assert set(placement.values()) <= set(nodes), set(placement.values())
    seen: dict[str, str] = {}
    for name in nodes:
        for agent_id in running_on(cluster, name):
            assert agent_id not in seen, f"{agent_id} runs on {seen[agent_id]} and {name}"
            seen[agent_id] = name
    assert seen == placement


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
