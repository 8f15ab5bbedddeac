"""``weald serve --ray`` on a Ray cluster of three nodes simulated on this machine (``ray.cluster_utils``).

One Ray cluster for the module (Ray is heavy: about 350 MiB a node), its
nodes named m1, m2, m3, all on 127.0.0.1; one throwaway PostgreSQL database;
the launcher (``weald serve --ray``) as a real process, with a node actor on
each Ray node and the front on its socket; 200 sessions asleep on each node.
The tests kill a node's process, kill the Ray worker that supervises it,
lose a whole machine and add one, and check what a client sees (every session
answers, every acknowledged turn once), what the database and each node
hold (never two owners), and that no secret reached a command line or Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Load, check_exactly_once, check_one_owner_each, prompt_all, sessions_of
from weald.runtime import scan_proc
from weald.runtime.daemon.client import Client
from weald.runtime.testing import process_alive, wait_until

NODES = ("m1", "m2", "m3")
PER_NODE = 200
LEASE = 5.0
# Seconds from a node process's SIGKILL until its sessions answer again. The 5 s is
# a speed, measured and printed here (2.9-3.4 s at load 3-7), not asserted: at load 12 (a whole
# suite beside other work) it read 5.41 s. Asserted is that Ray's restart, not a lease
# running out, brought them back: a new node process, well within the failover's lease + 5 s.
BACK_WITHIN = LEASE + 5
# A killed Ray worker: Ray starts a new worker process (it imports Ray) before the node starts again, so
# on a loaded machine (5.9 s once at load 7) it takes longer; bounded by the failover's lease + 5 s.
WORKER_BACK_WITHIN = LEASE + 5
TURNS = 60
RAY_ENV = ("RAY_TMPDIR", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")


class NodeSocket:
    """A node's own Unix socket (the directory the launcher gave it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def client(self) -> Client:
        return Client.connect(self.path)


class RayWeald:
    """The launcher, its front and nodes, as the tests see them (`cluster_harness`'s helpers take it)."""

    def __init__(self, root: Path, short: Path, url: str, ray_address: str) -> None:
        self.root = root
        self.short = short  # a short directory: Unix sockets live under it
        self.url = url
        self.ray_address = ray_address
        self.secret = "test-ray-" + os.urandom(16).hex()
        self.front_socket = short / "front.sock"
        self.node_state = short / "n"
        self.node_config = root / "node.toml"
        self.node_config.write_text(
            f'[store]\nurl = "{url}"\nlease = {LEASE}\n[cluster]\nsecret = "{self.secret}"\n', encoding="utf-8"
        )
        self.node_config.chmod(0o600)
        self.front_config = root / "front.toml"
        self.front_config.write_text(
            f'[store]\nurl = "{url}"\npath = "{root / "front" / "store.db"}"\nlease = {LEASE}\n'
            f'[server]\nsocket = "{self.front_socket}"\n[cluster]\nsecret = "{self.secret}"\n',
            encoding="utf-8",
        )
        self.front_config.chmod(0o600)
        self.project = root / "project"
        self.project.mkdir()
        script = root / "answers.json"
        script.write_text(json.dumps({"turns": [{"text": f"answer {i}"} for i in range(TURNS)]}))
        self.model = f"scripted:{script}"
        self.log = root / "launcher.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started: dict[str, Any] = {}

    @property
    def nodes(self) -> dict[str, NodeSocket]:
        return {name: NodeSocket(self.node_state / name / "weald.sock") for name in self.rows()}

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["WEALD_CONFIG"] = str(self.front_config)
        env.pop("WEALD_SOCKET", None)
        return env

    def start(self, *extra: str) -> dict[str, Any]:
        """Start the launcher; its ``--json`` line, once it prints it (every node answers then)."""
        command = [
            sys.executable,
            "-m",
            "weald.runtime.daemon.cli",
            "serve",
            "--ray",
            self.ray_address,
            "--node-config",
            str(self.node_config),
            "--node-state",
            str(self.node_state),
            "--node-port",
            "0",
            "--json",
            *extra,
        ]
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(command, env=self.env(), stdout=out, stderr=out, cwd=self.root)
        found: dict[str, Any] = {}

        def printed() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the launcher exited with {self.proc.returncode}:\n{self.output(offset)}")
            for line in self.output(offset).splitlines():
                if line.startswith("{") and '"ray"' in line:
                    found.update(json.loads(line))
                    return True
            return False

        wait_until(printed, timeout=300, message=lambda: f"the launcher to start; its output:\n{self.output(offset)}")
        self.started = found
        return found

    def output(self, offset: int = 0) -> str:
        with self.log.open("rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")

    def client(self) -> Client:
        return Client.connect(self.front_socket)

    def rows(self) -> dict[str, dict[str, Any]]:
        from weald.runtime._store_postgres import PostgresBackend

        backend = PostgresBackend(self.url)
        try:
            return {row["node_id"]: row for row in backend.nodes()}
        finally:
            backend.close()

    def placement(self) -> dict[str, str | None]:
        import psycopg

        with psycopg.connect(self.url) as conn:
            return dict(conn.execute("SELECT agent_id, owner FROM weald_placement").fetchall())

    def node_pid(self, name: str) -> int:
        return int(self.rows()[name]["info"]["pid"])

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = None
            self.proc.wait(30)
        self.proc = None
        return code


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def wait_back(ray: RayWeald, name: str, old: dict[str, Any], killed: float) -> float:
    """Wait until node ``name`` runs again (a new epoch, live, another process) and answers; seconds since the kill."""

    def back() -> bool:
        row = ray.rows().get(name)
        return bool(row and row["live"] and row["epoch"] > old["epoch"] and row["info"]["pid"] != old["info"]["pid"])

    wait_until(back, timeout=60, interval=0.05, message=lambda: f"node {name} to come back; rows: {ray.rows()}")
    return time.monotonic() - killed


# -- the module's Ray cluster, database and launcher ---------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """Three Ray nodes on 127.0.0.1, named m1 (the head), m2, m3, with Ray's files in a directory of their own."""
    from ray.cluster_utils import Cluster as RayCluster

    short = Path(tempfile.mkdtemp(prefix="wr", dir="/tmp"))  # Ray's sockets need a short path
    (short / "ray").mkdir()
    saved = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ["RAY_TMPDIR"] = str(short)
    # Ray turns 127.0.0.1 into the machine's address when a driver or a worker looks for its own; this
    # switch (Ray's, for machines where it runs one node) keeps every address of the cluster on loopback.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    common = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    cluster = None
    try:
        cluster = RayCluster(
            initialize_head=True,
            head_node_args={
                **common,
                "node_name": "m1",
                "temp_dir": str(short / "ray"),
                # Ray's own view of a lost machine in 1.5 s; weald's correctness does not depend on it.
                "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
            },
        )
        for name in NODES[1:]:
            cluster.add_node(**common, node_name=name)
        cluster.wait_for_nodes()
        cluster.tmpdir = short  # type: ignore[attr-defined]
        cluster.common = common  # type: ignore[attr-defined]
        yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_weald(tmp_path_factory: pytest.TempPathFactory, pg_cluster: Any, ray_cluster: Any) -> Iterator[RayWeald]:
    root = tmp_path_factory.mktemp("ray")
    url = pg_cluster.url(pg_cluster.create_database())
    ray = RayWeald(root, ray_cluster.tmpdir, url, ray_cluster.address)
    try:
        started = time.monotonic()
        ray.start()
        ray.launched_in = time.monotonic() - started  # type: ignore[attr-defined]
        with ray.client() as client:
            starts = [
                {"working_dir": str(ray.project), "model": ray.model, "agent_id": f"s{i:04d}"}
                for i in range(len(NODES) * PER_NODE)
            ]
            results = client.call("agents.start", {"agents": starts}, timeout=300)["results"]
            assert all("result" in r for r in results), [r for r in results if "error" in r][:3]
        yield ray
    finally:
        ray.stop()
        blocking = []
        for log in ray.node_state.glob("*/serve.out"):
            blocking += [line for line in log.read_text().splitlines() if "blocking call on the trio loop" in line]
        assert not blocking, blocking


def live_nodes(ray: RayWeald) -> tuple[str, ...]:
    return tuple(sorted(name for name, row in ray.rows().items() if row["live"]))


# -- the tests ------------------------------------------------------------------------------------------


def test_each_ray_machine_runs_one_node_under_a_ray_worker_and_the_front_spreads_sessions(
    ray_weald: RayWeald, ray_cluster: Any
) -> None:
    ray = ray_weald
    print(f"launcher: 3 nodes answering {ray.launched_in:.1f} s after it started")  # type: ignore[attr-defined]
    started = {node["node_id"]: node for node in ray.started["nodes"]}
    assert sorted(started) == list(NODES)
    ray_ids = {ray_cluster.head_node.node_id, *(node.node_id for node in ray_cluster.worker_nodes)}
    assert {node["ray_node"] for node in started.values()} == ray_ids  # one per Ray node
    rows = ray.rows()
    for name in NODES:
        assert rows[name]["live"]
        pid = rows[name]["info"]["pid"]
        assert pid == started[name]["pid"]
        assert rows[name]["info"]["address"] == started[name]["address"]
        assert rows[name]["info"]["address"].startswith("127.0.0.1:")
        assert cmdline(parent_of(pid)).startswith(b"ray::NodeProcess")  # supervised by its Ray actor
    by_node = sessions_of(ray)
    assert sorted(by_node) == list(NODES)
    assert all(abs(len(ids) - PER_NODE) <= 10 for ids in by_node.values()), {n: len(i) for n, i in by_node.items()}
    check_one_owner_each(ray, NODES, len(NODES) * PER_NODE)
    # The secret and the database's password are on no command line, and nowhere in Ray's files.
    password = ray.url.split(":")[2].split("@")[0]
    for needle in (ray.secret, password):
        assert scan_proc("cmdline", lambda line, needle=needle: needle.encode() in line) == []
        for path in (ray_cluster.tmpdir / "ray").rglob("*"):
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    assert needle.encode() not in path.read_bytes(), path


def test_a_killed_node_process_is_started_again_by_ray_and_its_sessions_answer_once_each(ray_weald: RayWeald) -> None:
    ray = ray_weald
    wait_until(lambda: live_nodes(ray) == NODES, timeout=60, message="every node live")
    by_node = sessions_of(ray)
    victims = by_node["m2"]
    everyone = [s for ids in by_node.values() for s in ids]
    old = ray.rows()["m2"]
    worker = parent_of(old["info"]["pid"])
    with Load(ray, everyone, threads=3) as load:
        load.wait_for(15)
        killed = time.monotonic()
        os.kill(old["info"]["pid"], signal.SIGKILL)
        running_again = wait_back(ray, "m2", old, killed)
        with ray.client() as client:
            assert client.call("agent.prompt", {"agent_id": victims[0], "text": "back?"}, timeout=60)["ok"]
        answering = time.monotonic() - killed
        answered = prompt_all(ray, victims)
        load.wait_for(10)
    new = ray.rows()["m2"]
    print(
        f"m2 killed: running again {running_again:.2f} s after, its sessions answering {answering:.2f} s after; "
        f"all {len(victims)} answered, slowest {max(answered.values()):.2f} s; load {len(load.acked)} acked"
    )
    assert answering <= BACK_WITHIN, answering
    assert not load.errors, load.errors[:5]
    # Ray restarted the actor (a new worker process), which started the node anew.
    assert parent_of(new["info"]["pid"]) != worker
    assert cmdline(parent_of(new["info"]["pid"])).startswith(b"ray::NodeProcess")
    check_exactly_once(ray, load.acked)
    check_one_owner_each(ray, NODES, len(everyone))


def test_a_killed_ray_worker_takes_its_node_process_with_it_and_both_come_back(ray_weald: RayWeald) -> None:
    ray = ray_weald
    wait_until(lambda: live_nodes(ray) == NODES, timeout=60, message="every node live")
    victims = sessions_of(ray)["m3"]
    old = ray.rows()["m3"]
    node_pid = old["info"]["pid"]
    worker = parent_of(node_pid)
    killed = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: not process_alive(node_pid), timeout=10, message="the node process to die with its worker")
    gone = time.monotonic() - killed
    back = wait_back(ray, "m3", old, killed)
    prompt_all(ray, victims[:50])
    print(f"m3's Ray worker killed: its node process gone {gone:.2f} s after, back {back:.2f} s after")
    assert gone <= 2.0, gone
    assert back <= WORKER_BACK_WITHIN, back
    check_one_owner_each(ray, NODES, len(NODES) * PER_NODE)


def test_a_lost_machine_s_sessions_go_to_the_others_and_a_new_machine_gets_a_node(
    ray_weald: RayWeald, ray_cluster: Any
) -> None:
    ray = ray_weald
    wait_until(lambda: live_nodes(ray) == NODES, timeout=60, message="every node live")
    by_node = sessions_of(ray)
    # The worker machine (the head cannot go) holding more sessions: a node the tests before kept down past
    # its lease has had its sessions adopted by the others, rightly, and holds none.
    name = max(("m2", "m3"), key=lambda n: len(by_node.get(n, [])))
    survivors = tuple(n for n in NODES if n != name)
    victims = by_node[name]
    assert victims
    total = len(ray.placement())
    ray_id = next(node["ray_node"] for node in ray.started["nodes"] if node["node_id"] == name)
    machine = next(node for node in ray_cluster.worker_nodes if node.node_id == ray_id)
    node_pid = ray.node_pid(name)
    lost = time.monotonic()
    # The machine goes: its Ray node and everything on it.
    os.kill(node_pid, signal.SIGKILL)
    ray_cluster.remove_node(machine, allow_graceful=False)
    answered = prompt_all(ray, victims)
    all_answered = time.monotonic() - lost
    placement = ray.placement()
    assert all(placement[s] in survivors for s in victims)
    print(f"machine {name} lost: its {len(victims)} sessions all answered from the others {all_answered:.1f} s after")
    assert max(answered.values()) <= LEASE + 5
    # A machine joins: the launcher gives it a node, which takes new sessions.
    ray_cluster.add_node(**ray_cluster.common, node_name="m4")
    joined = time.monotonic()
    wait_until(lambda: ray.rows().get("m4", {}).get("live"), timeout=120, message="node m4 to start on the new machine")
    print(f"machine m4 joined: its node live {time.monotonic() - joined:.1f} s after")
    wait_until(lambda: "node m4 serves fronts" in ray.output(), timeout=30, message="the launcher to report node m4")
    # Its first lease renewal with its load: a front compares nodes by what their rows say.
    wait_until(lambda: "awake" in (ray.rows().get("m4", {}).get("info") or {}), timeout=60, message="node m4's load")
    with ray.client() as client:
        client.call("agent.start", {"working_dir": str(ray.project), "model": ray.model, "agent_id": "t-new"})
    rows = {
        name: {key: row["info"].get(key) for key in ("awake", "asleep", "cpu", "address")} | {"live": row["live"]}
        for name, row in ray.rows().items()
    }
    assert ray.placement()["t-new"] == "m4", json.dumps(rows)  # the fewest sessions
    check_one_owner_each(ray, (*survivors, "m4"), total + 1)


def test_a_launcher_killed_and_started_again_finds_the_nodes_running(ray_weald: RayWeald) -> None:
    ray = ray_weald
    nodes = live_nodes(ray)
    before = {name: (row["epoch"], row["info"]["pid"]) for name, row in ray.rows().items() if row["live"]}
    assert ray.proc is not None
    ray.proc.kill()  # kill -9: it stops nothing
    ray.proc.wait(30)
    ray.proc = None
    time.sleep(2 * LEASE / 3 + 0.5)  # a lease renewal later: the nodes (detached actors) serve on
    assert live_nodes(ray) == nodes
    started = ray.start()
    assert {n["node_id"]: n["pid"] for n in started["nodes"]} == {name: pid for name, (_, pid) in before.items()}
    after = {name: (row["epoch"], row["info"]["pid"]) for name, row in ray.rows().items() if row["live"]}
    assert after == before  # the same processes, the same epochs: found by name, not started again
    prompt_all(ray, [s for ids in sessions_of(ray).values() for s in ids[:10]])


def test_sigterm_stops_the_front_and_every_node_cleanly(ray_weald: RayWeald) -> None:
    ray = ray_weald
    rows = ray.rows()
    pids = [row["info"]["pid"] for row in rows.values() if row["live"]]
    assert pids
    assert ray.stop() == 0, ray.output()[-3000:]
    rows = ray.rows()
    assert not any(row["live"] for row in rows.values()), rows  # each lease ended at its clean stop
    assert not [pid for pid in pids if process_alive(pid)]


def test_bad_ray_options_are_one_line_each(tmp_path: Path) -> None:
    config = tmp_path / "weald.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "s.db"}"\n[server]\nsocket = "{tmp_path / "s.sock"}"\n')
    env = {**os.environ, "WEALD_CONFIG": str(config)}
    cases = [
        (("--ray", "--listen", "127.0.0.1:0"), "--listen does not go with --ray"),
        (("--ray", "--node-id", "x"), "--node-id does not go with --ray"),
        (("--ray",), "a front needs the cluster's database"),
        (("--ray", "--node-port", "70000"), "expected a port"),
    ]
    for args, expected in cases:
        done = subprocess.run(
            [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert expected in done.stderr, (args, done.stderr)
        if "expected a port" not in expected:
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
