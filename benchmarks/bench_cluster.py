"""A cluster of weald nodes on one machine: a prompt via the front beside one straight to its node, failover, Ray.

Everything is real: Debian's PostgreSQL as a throwaway cluster
(tests/pg_cluster.py), each node and front a ``weald serve`` process
(tests/daemon/cluster_harness.py), a scripted model. Measured in one run:

1. **A prompt through the front, and sent straight to its node** (three nodes
   plus a front over TCP on loopback). One client sends prompts one after
   another to 20 awake sessions on node n1: on n1's own socket, then through
   the front's. The two alternate in rounds, so load from other work on the
   machine falls on both alike. p50 and p99 are given for each, with the
   difference. Targets: at most 2 ms more at p50 and 15 ms more at p99.
2. **Throughput of scripted turns**: 12 client threads, each prompting its
   own awake session for a fixed time, against one node on its own socket,
   against three nodes behind a front, and against one node behind a front.
   Each node's and the front's CPU time gives a projection for three
   machines: each node on a core of its own, and the front on one more.
   This machine has only 2 cores, so three nodes and a front compete for
   them here, and the measured ratio is expected to be below 1x.
   The front gives every prompt that has no idempotency key a key of its
   own, so that it can send the prompt again safely, and the node writes
   that key with the turn. So one node is also measured straight with a key
   on each prompt (and figure 1 has its p50 too): the gap then splits into
   what the key costs and what the hop through the front costs.
3. **Failover of 1,000 sessions**: 3,000 sessions asleep, 1,000 started on
   each node. Node n2 is killed with SIGKILL. The figures are the time
   until every one of its sessions is placed on a survivor, until the first
   one answers a prompt, and until all of them have answered (8 client
   threads). Target: placed on survivors within the lease + 5 s (10 s).
4. **``weald serve --ray``** on three Ray nodes simulated here
   (``ray.cluster_utils``), with the socket cluster stopped first: the same
   prompt figures as 1, through the launcher's front and straight to a node.
   Target: at most 3 ms more at p50. Also the memory Ray takes per machine:
   the PSS of each Ray node's processes (its raylet and everything under
   it, and on the head the GCS and the rest of Ray's own processes), not
   counting the weald nodes.

Run: ``python benchmarks/bench_cluster.py [--quick] [--no-ray]``
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "daemon"))
from _bench import Row, banner, load_note, summary, verdict
from cluster_harness import Cluster
from pg_cluster import PgCluster
from weald.runtime.daemon.client import Client
from weald.runtime.testing import wait_until

LEASE = 5.0
NODES = ("n1", "n2", "n3")
MiB = 1024 * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pss_bytes(pid: int) -> int:
    """The process's proportional set size (shared pages divided among their users), from /proc."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def script(root: Path) -> str:
    path = root / "answers.json"
    path.write_text(json.dumps({"repeat": True, "turns": [{"text": "done."}]}))
    return f"scripted:{path}"


def start_sessions(client: Client, project: Path, model: str, ids: list[str], *, asleep: bool) -> None:
    for first in range(0, len(ids), 1000):
        starts = [
            {"working_dir": str(project), "model": model, "agent_id": agent_id, "asleep": asleep}
            for agent_id in ids[first : first + 1000]
        ]
        results = client.call("agents.start", {"agents": starts}, timeout=600)["results"]
        failed = [r for r in results if "error" in r]
        if failed:
            raise RuntimeError(f"agents.start failed: {failed[:3]}")


class Keyed:
    """A client whose prompts each carry a new idempotency key, as the front's do (it adds one when none is given)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def call(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        return self.client.call(method, {**params, "idempotency_key": f"bench-{uuid.uuid4().hex}"}, timeout=timeout)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Keyed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def keyed(connect: Callable[[], Client]) -> Callable[[], Any]:
    return lambda: Keyed(connect())


def prompt(client: Any, agent_id: str) -> None:
    reply = client.call("agent.prompt", {"agent_id": agent_id, "text": "go on"}, timeout=120)
    if not reply.get("ok"):
        raise RuntimeError(f"{agent_id}: {reply}")


def latency(
    ways: dict[str, Callable[[], Client]], agent_ids: list[str], rounds: int, per_round: int
) -> dict[str, list[float]]:
    """Milliseconds per prompt, one client per way, sent one after another; rounds alternate the ways."""
    clients = {name: connect() for name, connect in ways.items()}
    samples: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for agent_id in agent_ids:  # warm: every session awake, every connection made
            for client in clients.values():
                prompt(client, agent_id)
        for _ in range(rounds):
            for name, client in clients.items():
                for i in range(per_round):
                    began = time.perf_counter()
                    prompt(client, agent_ids[i % len(agent_ids)])
                    samples[name].append((time.perf_counter() - began) * 1000)
    finally:
        for client in clients.values():
            client.close()
    return samples


def latency_rows(bench: str, samples: dict[str, list[float]], direct: str, front: str, p50_limit: float) -> list[Row]:
    d50, f50 = statistics.median(samples[direct]), statistics.median(samples[front])
    d99, f99 = percentile(samples[direct], 0.99), percentile(samples[front], 0.99)
    print(f"  {len(samples[direct])} prompts each way")
    for name, values in samples.items():
        print(f"  {name:<34} p50 {statistics.median(values):7.2f} ms   p99 {percentile(values, 0.99):7.2f} ms")
    return [
        Row(bench, f"prompt p50, {direct}", d50, "ms"),
        Row(
            bench,
            f"prompt p50, {front}",
            f50,
            "ms",
            target=f"<= direct + {p50_limit:g} ms",
            ok=verdict(f50 - d50, "<=", p50_limit),
            note=f"+{f50 - d50:.2f} ms, {f50 / d50:.2f}x direct",
        ),
        Row(bench, f"prompt p99, {direct}", d99, "ms"),
        Row(
            bench,
            f"prompt p99, {front}",
            f99,
            "ms",
            target="<= direct + 15 ms",
            ok=verdict(f99 - d99, "<=", 15.0),
            note=f"+{f99 - d99:.2f} ms, {f99 / d99:.2f}x direct",
        ),
    ]


def key_rows(bench: str, samples: dict[str, list[float]], direct: str, keyed: str, front: str) -> list[Row]:
    """The p50 with a key, straight: what the front's own key costs, and what is left for the hop."""
    d50, k50, f50 = (statistics.median(samples[name]) for name in (direct, keyed, front))
    return [
        Row(
            bench,
            f"prompt p50, {keyed}",
            k50,
            "ms",
            note=f"the key +{k50 - d50:.2f} ms; the front +{f50 - k50:.2f} ms over it",
        )
    ]


def throughput(
    connect: Callable[[], Client], agent_ids: list[str], seconds: float, pids: dict[str, int]
) -> tuple[float, dict[str, float]]:
    """Turns per second with one client thread per session for ``seconds``; each process's CPU seconds meanwhile."""
    stop = threading.Event()
    counts = [0] * len(agent_ids)
    errors: list[str] = []

    def run(index: int) -> None:
        with connect() as client:
            prompt(client, agent_ids[index])  # awake and connected before the clock starts
            ready.wait()
            while not stop.is_set():
                try:
                    prompt(client, agent_ids[index])
                except Exception as exc:  # broad: reported after the run
                    errors.append(str(exc))
                    return
                counts[index] += 1

    ready = threading.Event()
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(agent_ids))]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    pids = {**pids, "clients": os.getpid()}  # this process: the client threads
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    began = time.monotonic()
    ready.set()
    time.sleep(seconds)
    done = sum(counts)
    elapsed = time.monotonic() - began
    cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    stop.set()
    for thread in threads:
        thread.join(120)
    if errors:
        raise RuntimeError(f"prompts failed: {errors[:3]}")
    return done / elapsed, {name: value / elapsed for name, value in cpu.items()}


def pids_of(cluster: Cluster, nodes: tuple[str, ...], front: bool) -> dict[str, int]:
    pids = {name: cluster.pid(name) for name in nodes}
    if front:
        assert cluster.front is not None
        assert cluster.front.proc is not None
        pids["front"] = cluster.front.proc.pid
    return pids


@contextlib.contextmanager
def socket_cluster(pg: PgCluster, root: Path, nodes: tuple[str, ...]) -> Iterator[Cluster]:
    cluster = Cluster(root, pg.url(pg.create_database()), lease=LEASE)
    try:
        cluster.start_nodes(*nodes)
        cluster.wait_live(*nodes)
        cluster.start_front()
        yield cluster
    finally:
        cluster.close()


def start_on_each(
    cluster: Cluster, nodes: tuple[str, ...], project: Path, model: str, prefix: str, per_node: int, *, asleep: bool
) -> list[str]:
    """``per_node`` sessions started on each node itself (its placement row names it), ids ``<prefix>-<node>-<n>``."""
    ids = []
    for name in nodes:
        mine = [f"{prefix}-{name}-{i:05d}" for i in range(per_node)]
        with cluster.nodes[name].client() as client:
            start_sessions(client, project, model, mine, asleep=asleep)
        ids += mine
    return ids


def measure_sockets(pg: PgCluster, root: Path, quick: bool) -> list[Row]:
    rows: list[Row] = []
    rounds, per_round = (3, 40) if quick else (6, 150)
    seconds = 6.0 if quick else 15.0
    model = script(root)
    project = root / "project"
    project.mkdir(exist_ok=True)
    banner(f"throughput of scripted turns, 12 clients, {seconds:g} s each: one node")
    with socket_cluster(pg, root / "one", ("n1",)) as one:
        ids = start_on_each(one, ("n1",), project, model, "tp1", 12, asleep=False)
        alone, alone_cpu = throughput(one.nodes["n1"].client, ids, seconds, pids_of(one, ("n1",), False))
        print(f"  1 node, straight:       {alone:7.1f} turns/s; CPU (cores): {fmt_cpu(alone_cpu)}   {load_note()}")
        with_keys, keys_cpu = throughput(keyed(one.nodes["n1"].client), ids, seconds, pids_of(one, ("n1",), False))
        print(f"  1 node, with keys:      {with_keys:7.1f} turns/s; CPU (cores): {fmt_cpu(keys_cpu)}   {load_note()}")
        fronted, fronted_cpu = throughput(one.client, ids, seconds, pids_of(one, ("n1",), True))
        print(f"  1 node behind a front:  {fronted:7.1f} turns/s; CPU (cores): {fmt_cpu(fronted_cpu)}   {load_note()}")
    with socket_cluster(pg, root / "three", NODES) as cluster:
        banner(f"throughput of scripted turns, 12 clients, {seconds:g} s: three nodes behind a front")
        ids = start_on_each(cluster, NODES, project, model, "tp", 4, asleep=False)
        three, three_cpu = throughput(cluster.client, ids, seconds, pids_of(cluster, NODES, True))
        print(f"  3 nodes behind a front: {three:7.1f} turns/s; CPU (cores): {fmt_cpu(three_cpu)}   {load_note()}")

        banner("a prompt through the front and straight to its node (3 nodes, TCP on loopback)")
        ids = start_on_each(cluster, ("n1",), project, model, "lat", 20, asleep=False)
        samples = latency(
            {
                "straight to its node": cluster.nodes["n1"].client,
                "straight, with a key": keyed(cluster.nodes["n1"].client),
                "through the front": cluster.client,
            },
            ids,
            rounds,
            per_round,
        )
        rows += latency_rows("cluster", samples, "straight to its node", "through the front", 2.0)
        rows += key_rows("cluster", samples, "straight to its node", "straight, with a key", "through the front")
        failover_rows = measure_failover(cluster, project, model, quick)
    node_per_turn = statistics.mean(three_cpu[n] for n in NODES) * len(NODES) / three  # CPU s of a node per turn
    front_per_turn = three_cpu["front"] / three
    projected = min(len(NODES) / node_per_turn, 1 / front_per_turn)
    bound = "the front" if 1 / front_per_turn < len(NODES) / node_per_turn else "the nodes"
    print(
        f"  per turn: {node_per_turn * 1000:.2f} ms of a node's CPU, {front_per_turn * 1000:.2f} ms of the front's; "
        f"3 machines (a core per node, one for the front): {projected:.0f} turns/s"
    )
    rows += [
        Row("cluster", "turns/s, 1 node straight", alone, "/s"),
        Row(
            "cluster",
            "turns/s, 1 node straight, each prompt with a key",
            with_keys,
            "/s",
            note=f"{with_keys / alone:.2f}x 1 node straight",
        ),
        Row(
            "cluster",
            "turns/s, 1 node behind a front",
            fronted,
            "/s",
            note=f"{fronted / alone:.2f}x 1 node straight, {fronted / with_keys:.2f}x with keys",
        ),
        Row(
            "cluster",
            "turns/s, 3 nodes behind a front (this 2-core machine)",
            three,
            "/s",
            note=f"{three / alone:.2f}x 1 node straight (expected below 1x on 2 cores)",
        ),
        Row(
            "cluster",
            "turns/s, 3 machines, projected from CPU per turn",
            projected,
            "/s",
            note=f"{projected / alone:.2f}x 1 node here; bound by {bound}",
        ),
    ]
    return rows + failover_rows


def fmt_cpu(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in cpu.items())


def measure_failover(cluster: Cluster, project: Path, model: str, quick: bool) -> list[Row]:
    per_node = 300 if quick else 1000
    banner(f"failover: {per_node:,} sessions asleep on each node, one node killed (kill -9)")
    ids = start_on_each(cluster, NODES, project, model, "fo", per_node, asleep=True)
    victim = "n2"
    victims = [s for s in ids if s.startswith(f"fo-{victim}-")]
    survivors = tuple(n for n in NODES if n != victim)
    first: list[float] = []

    def first_answer() -> None:
        with cluster.client() as client:
            prompt(client, victims[0])
        first.append(time.monotonic() - killed)

    killed = time.monotonic()
    cluster.kill(victim)
    asker = threading.Thread(target=first_answer)
    asker.start()

    def placed() -> bool:
        now = cluster.placement()
        return all(now[s] in survivors for s in victims)

    wait_until(placed, timeout=120, interval=0.05, message="the sessions to be placed on survivors")
    adopted = time.monotonic() - killed
    asker.join(120)
    answered = answer_all(cluster.client, victims)
    everyone = time.monotonic() - killed
    print(
        f"  {len(victims)} sessions of {victim}: on survivors {adopted:.2f} s after the kill, the first answering "
        f"{first[0]:.2f} s, all answering {everyone:.2f} s (slowest prompt {max(answered):.2f} s)   {load_note()}"
    )
    return [
        Row(
            "cluster",
            f"failover of {len(victims):,} sessions: placed on survivors",
            adopted,
            "s",
            target=f"<= lease + 5 s ({LEASE + 5:g} s)",
            ok=verdict(adopted, "<=", LEASE + 5),
            note=f"lease {LEASE:g} s",
        ),
        Row("cluster", "failover: the first prompt to a killed node's session answered", first[0], "s"),
        Row(
            "cluster",
            f"failover: all {len(victims):,} answered a prompt (8 clients)",
            everyone,
            "s",
            note=f"slowest prompt {max(answered):.2f} s",
        ),
    ]


def answer_all(connect: Callable[[], Client], agent_ids: list[str], threads: int = 8) -> list[float]:
    seconds: list[float] = []
    errors: list[str] = []

    def run(share: list[str]) -> None:
        with connect() as client:
            for agent_id in share:
                began = time.monotonic()
                try:
                    prompt(client, agent_id)
                except Exception as exc:  # broad: reported after the run
                    errors.append(str(exc))
                    continue
                seconds.append(time.monotonic() - began)

    workers = [threading.Thread(target=run, args=(agent_ids[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(600)
    if errors:
        raise RuntimeError(f"prompts failed after the failover: {errors[:3]}")
    return seconds


# -- weald serve --ray ------------------------------------------------------------------------------------------


def measure_ray(pg: PgCluster, root: Path, quick: bool) -> list[Row]:
    from ray.cluster_utils import Cluster as RayCluster

    rounds, per_round = (3, 40) if quick else (6, 150)
    banner("weald serve --ray: 3 Ray nodes simulated here")
    short = Path(tempfile.mkdtemp(prefix="wbr", dir="/tmp"))
    (short / "ray").mkdir()
    os.environ["RAY_TMPDIR"] = str(short)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every address of the cluster on loopback
    common = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    ray_cluster = RayCluster(
        initialize_head=True, head_node_args={**common, "node_name": "m1", "temp_dir": str(short / "ray")}
    )
    launcher: subprocess.Popen[bytes] | None = None
    try:
        for name in ("m2", "m3"):
            ray_cluster.add_node(**common, node_name=name)
        ray_cluster.wait_for_nodes()
        url = pg.url(pg.create_database())
        secret = "bench-" + secrets.token_hex(16)
        node_config = root / "ray-node.toml"
        node_config.write_text(f'[store]\nurl = "{url}"\nlease = {LEASE}\n[cluster]\nsecret = "{secret}"\n')
        node_config.chmod(0o600)
        front_socket = short / "front.sock"
        front_config = root / "ray-front.toml"
        front_config.write_text(
            f'[store]\nurl = "{url}"\npath = "{root / "ray-front" / "store.db"}"\nlease = {LEASE}\n'
            f'[server]\nsocket = "{front_socket}"\n[cluster]\nsecret = "{secret}"\n'
        )
        front_config.chmod(0o600)
        log = root / "launcher.out"
        env = {**os.environ, "WEALD_CONFIG": str(front_config)}
        env.pop("WEALD_SOCKET", None)
        command = [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--ray", ray_cluster.address]
        command += ["--node-config", str(node_config), "--node-state", str(short / "n"), "--node-port", "0", "--json"]
        began = time.monotonic()
        with log.open("wb") as out:
            launcher = subprocess.Popen(command, env=env, stdout=out, stderr=out, cwd=root)
        started: dict[str, Any] = {}

        def printed() -> bool:
            assert launcher is not None
            if launcher.poll() is not None:
                raise RuntimeError(f"the launcher exited with {launcher.returncode}:\n{log.read_text()[-3000:]}")
            for line in log.read_text().splitlines():
                if line.startswith("{") and '"ray"' in line:
                    started.update(json.loads(line))
                    return True
            return False

        wait_until(printed, timeout=300, message="the launcher to start its nodes")
        print(f"  3 nodes answering {time.monotonic() - began:.1f} s after the launcher started")
        node = sorted(started["nodes"], key=lambda n: n["node_id"])[0]
        node_socket = short / "n" / node["node_id"] / "weald.sock"
        project = root / "ray-project"
        project.mkdir()
        model = script(root)
        ids = [f"ray-{i:02d}" for i in range(20)]
        with Client.connect(node_socket) as direct:
            for agent_id in ids:
                direct.call(
                    "agent.start",
                    {"working_dir": str(project), "model": model, "agent_id": agent_id, "asleep": False},
                )
        samples = latency(
            {
                "straight to its node (--ray)": lambda: Client.connect(node_socket),
                "straight, with a key (--ray)": keyed(lambda: Client.connect(node_socket)),
                "through the --ray front": lambda: Client.connect(front_socket),
            },
            ids,
            rounds,
            per_round,
        )
        rows = latency_rows("cluster", samples, "straight to its node (--ray)", "through the --ray front", 3.0)
        rows += key_rows(
            "cluster",
            samples,
            "straight to its node (--ray)",
            "straight, with a key (--ray)",
            "through the --ray front",
        )
        weald_pids = {int(n["pid"]) for n in started["nodes"]}
        memory = ray_memory(ray_cluster, weald_pids)
        for name, (pss, count) in memory.items():
            print(f"  Ray on {name}: {pss / MiB:.0f} MiB PSS in {count} processes (the weald node not counted)")
        head = memory["m1 (head)"][0]
        workers = [pss for name, (pss, _) in memory.items() if "head" not in name]
        rows += [
            Row("cluster", "Ray's memory, the head machine (PSS)", head / MiB, "MiB"),
            Row(
                "cluster",
                "Ray's memory, each other machine (PSS)",
                statistics.mean(workers) / MiB,
                "MiB",
                note=f"{', '.join(f'{w / MiB:.0f}' for w in workers)} MiB",
            ),
        ]
        return rows
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            try:
                launcher.wait(120)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait(30)
        ray_cluster.shutdown()
        shutil.rmtree(short, ignore_errors=True)


def ray_memory(ray_cluster: Any, weald_pids: set[int]) -> dict[str, tuple[int, int]]:
    """Each Ray node's PSS and process count: what Ray started for it and all under it, weald's nodes excepted."""
    found: dict[str, tuple[int, int]] = {}
    for index, node in enumerate([ray_cluster.head_node, *ray_cluster.worker_nodes]):
        roots = [info.process.pid for infos in node.all_processes.values() for info in infos]
        seen: set[int] = set()
        todo = list(roots)
        while todo:
            pid = todo.pop()
            if pid in seen or pid in weald_pids:
                continue
            seen.add(pid)
            todo += children(pid)
        name = f"m{index + 1}" + (" (head)" if index == 0 else "")
        found[name] = (sum(pss_bytes(pid) for pid in seen), len(seen))
    return found


def run(quick: bool = False, ray: bool = True) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="wbc", dir="/tmp"))
    pg = PgCluster(fsync=True).init().start()
    try:
        rows = measure_sockets(pg, root, quick)
        if ray:
            rows += measure_ray(pg, root, quick)
    finally:
        pg.remove()
        shutil.rmtree(root, ignore_errors=True)
    return summary(rows)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, 300 sessions a node for the failover")
    parser.add_argument("--no-ray", action="store_true", help="without the weald serve --ray part")
    args = parser.parse_args()
    run(quick=args.quick, ray=not args.no_ray)


if __name__ == "__main__":
    main()
