"""``weald serve --ray``: a weald cluster launched on an existing Ray cluster.

Ray is the launcher, nothing more: it starts one weald node on each machine
of the Ray cluster, restarts a node whose process crashed, and starts a node
on a machine that joins. Who runs a session and who may write it stay the
placement rows, the leases and the fence of the shared store: a node Ray
lost track of, or one it restarted too eagerly, can write nothing of a
session another node holds.

What runs where:

- **the launcher** (``weald serve --ray``, on the Ray head): connects to Ray
  as a driver, keeps one node actor on every live Ray node (looked for every
  `WATCH_PERIOD` seconds), and runs the cluster's front on its socket (the
  observer with ``--http``), as ``weald serve --front`` does.
- **a node actor** (`NodeProcess` under ``ray.remote``), pinned to its Ray
  node by a hard `NodeAffinitySchedulingStrategy`, detached and named
  ``weald-node:<node id>`` in the ``weald`` namespace (so a launcher that
  dies or is restarted leaves every session running, and the next one finds
  the nodes by name), ``max_restarts=-1``, no CPU reserved.
- **the node process**: the actor runs ``weald serve --listen IP:PORT
  --node-id ID`` as its child. A child that exits on its own ends the actor's
  process too, so Ray restarts the actor, which starts a new child (a new
  epoch of the same node id: it claims its sessions back at once). A child
  dies with its actor's process (``PR_SET_PDEATHSIG``), so a crashed or killed
  Ray worker never leaves a node running unsupervised.

Why a child process and not the daemon inside the Ray worker: the daemon
owns its process (SIGTERM, SIGHUP and SIGINT on its main thread, which a Ray
worker keeps for its own task loop; faulthandler; an exclusive lock on its
state directory that the kernel drops when it dies), and its tools fork
subprocesses, which a process with Ray's gRPC threads should not do. A child
also keeps a leak or a crash of either side out of the other.

Nothing secret goes through Ray: the launcher sends each actor its node id,
its directory, its port and the path of its configuration file, as a JSON
document (`NodeSpec`); the node reads the cluster's database URL and secret
from that file on its own machine (``[store] url``, ``[cluster] secret`` or
``secret_file``), as a node started by hand does. Ray's runtime environment
variables are shown on its dashboard and written to its logs, so they carry
nothing here; neither does any command line.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec
from weald.runtime import WealdError
from weald.runtime._codec import msgspec_decoder

__all__ = [
    "DEFAULT_NODE_PORT",
    "NAMESPACE",
    "WATCH_PERIOD",
    "NodeProcess",
    "NodeSpec",
    "RayLaunchError",
    "RayLauncher",
    "node_ids",
]

logger = logging.getLogger("weald.runtime")

NAMESPACE: Final = "weald"
"""The Ray namespace of the node actors (named ``weald-node:<node id>``)."""
ACTOR_PREFIX: Final = "weald-node:"
DEFAULT_NODE_PORT: Final = 7400
WATCH_PERIOD: Final = 2.0
"""Seconds between the launcher's looks at the Ray cluster (new machines, nodes lost)."""
START_TIMEOUT: Final = 300.0
"""Seconds a node process has to answer (it restores its sessions first)."""
_STOP_TIMEOUT: Final = 60.0
_CRASH_WINDOW: Final = 60.0  # seconds in which a node's starts count as a crash loop
_CRASH_FREE_STARTS: Final = 3  # starts in the window before the next one waits
_CRASH_MAX_WAIT: Final = 30.0
_MAX_SOCKET_PATH: Final = 100  # a Unix socket's path must fit sun_path (108 bytes) with room to spare
_PR_SET_PDEATHSIG: Final = 1
_NODE_ID_CHARS = re.compile(r"[^A-Za-z0-9_.:@-]")


class RayLaunchError(WealdError):
    """The cluster cannot be launched on Ray as asked; the message says why."""


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the launcher tells a node actor (plain values, no secret).

    Attributes:
        node_id: The weald node id.
        state_root: The directory that holds each node's own (``<root>/<node id>``),
            ``~`` expanded on the node's machine.
        host: The address the node serves fronts on: its Ray node's (what the
            other machines of the Ray cluster reach it at).
        port: The port the node serves fronts on (0: any free one).
        config: The configuration file the node reads on its machine (its
            ``[store] url`` and ``[cluster]`` secret); None: the user file
            ``weald serve`` finds there (``$WEALD_CONFIG``, else ``~/.weald/weald.toml``).
        start_timeout: Seconds the node process has to answer.
    """

    node_id: str
    state_root: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_NODE_PORT
    config: str | None = None
    start_timeout: float = START_TIMEOUT


def node_ids(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """The weald node id of each live Ray node (by its Ray node id): its Ray node name, made unique.

    A Ray node's name is ``ray start --node-name``, by default its IP
    address. Characters a weald node id cannot hold become ``-``; names that
    several Ray nodes share get the first 8 digits of each one's Ray id.
    """
    names: dict[str, str] = {}
    for node in nodes:
        raw = str(node.get("NodeName") or node.get("NodeManagerAddress") or "ray")
        name = _NODE_ID_CHARS.sub("-", raw).lstrip("_.:@-")[:110] or "ray"
        names[str(node["NodeID"])] = name
    taken: dict[str, int] = {}
    for name in names.values():
        taken[name] = taken.get(name, 0) + 1
    return {ray_id: (name if taken[name] == 1 else f"{name}-{ray_id[:8]}") for ray_id, name in names.items()}


# -- the node actor ---------------------------------------------------------------------------------------


class NodeProcess:
    """One weald node on this machine: ``weald serve --listen`` as a child process, supervised.

    The launcher wraps this class with ``ray.remote``; each method runs on the
    Ray worker's main thread, one at a time. The constructor returns once the
    node answers (Ray calls it again at each restart).

    Args:
        spec: A `NodeSpec` as JSON.

    Raises:
        RayLaunchError: the node process did not start (the message holds the
            end of its output).
    """

    def __init__(self, spec: bytes) -> None:
        self.spec: NodeSpec = msgspec_decoder(NodeSpec).decode(spec)
        self.dir = Path(self.spec.state_root).expanduser().absolute() / self.spec.node_id
        self.socket = self.dir / "weald.sock"
        if len(str(self.socket)) > _MAX_SOCKET_PATH:
            msg = (
                f"node {self.spec.node_id}: its socket {self.socket} is too long a path for a Unix socket; "
                "give weald serve --ray a shorter --node-state"
            )
            raise RayLaunchError(msg)
        from weald.runtime import make_private_dirs

        make_private_dirs(self.dir)
        self.log = self.dir / "serve.out"
        self._record = self.dir / "ray-node.json"
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._spawn_error: BaseException | None = None
        self.info_line: dict[str, Any] = {}
        record = self._read_record()
        self._end_leftover(record)
        self._wait_out_a_crash_loop(record)
        self._write_layer()
        offset = self.log.stat().st_size if self.log.exists() else 0
        self._supervisor = threading.Thread(target=self._supervise, name="weald node supervisor", daemon=True)
        self._supervisor.start()
        self._started.wait()
        if self._proc is None:
            msg = f"node {self.spec.node_id}: cannot start weald serve: {self._spawn_error}"
            raise RayLaunchError(msg)
        self.info_line = self._wait_answering(offset)
        starts = [t for t in record.get("starts", []) if time.time() - t < _CRASH_WINDOW]
        self._write_record(
            {"pid": self._proc.pid, "since": _start_time(self._proc.pid), "starts": [*starts, time.time()]}
        )

    # Lifecycle -----------------------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Start the node process and wait for it (this thread: the one ``PR_SET_PDEATHSIG`` ties the child to).

        A child that exits while no stop was asked ends this whole process, so
        Ray restarts the actor (and the node with it); `os._exit` because a Ray
        worker's ordinary exit would be taken for an intended one.
        """
        command = [
            sys.executable,
            "-m",
            "weald.runtime.daemon.cli",
            "serve",
            "--json",
            "--node-id",
            self.spec.node_id,
            "--listen",
            _host_port(self.spec.host, self.spec.port),
            "--socket",
            str(self.socket),
            "--project",
            str(self.dir),
        ]
        env = dict(os.environ)
        if self.spec.config is not None:
            env["WEALD_CONFIG"] = str(Path(self.spec.config).expanduser())
        env.pop("WEALD_SOCKET", None)
        try:
            with self.log.open("ab") as out:
                self._proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module, no shell
                    command,
                    cwd=self.dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,  # the node's own process group: signals to the worker's stay there
                    preexec_fn=_die_with_parent(),  # noqa: PLW1509 - one prctl call, looked up before the fork
                )
        except OSError as exc:
            self._spawn_error = exc
            self._started.set()
            return
        self._started.set()
        code = self._proc.wait()
        if self._stopping.is_set():
            return
        sys.stderr.write(f"weald node {self.spec.node_id}: its process exited with {code}; ending the actor\n")
        sys.stderr.flush()
        os._exit(1)

    def _wait_answering(self, offset: int) -> dict[str, Any]:
        """The node's ``--json`` line, once it printed it (it answers on its socket then)."""
        assert self._proc is not None
        deadline = time.monotonic() + self.spec.start_timeout
        while time.monotonic() < deadline:
            line = _json_line(self.log, offset)
            if line is not None:
                return line
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        self._stopping.set()
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
            reason = f"it did not answer in {self.spec.start_timeout:.0f} s"
        else:
            reason = f"it exited with {self._proc.returncode}"
        tail = _tail(self.log, offset)
        msg = f"node {self.spec.node_id} did not start: {reason}" + (f": {tail}" if tail else "")
        raise RayLaunchError(msg)

    def info(self) -> dict[str, Any]:
        """Where the node is: its id, epoch, address, socket, process ids, Ray node, whether Ray restarted it."""
        import ray

        context = ray.get_runtime_context()
        assert self._proc is not None
        return {
            "node_id": self.spec.node_id,
            "epoch": (self.info_line.get("node") or {}).get("epoch"),
            "address": self.info_line.get("listen"),
            "socket": str(self.socket),
            "dir": str(self.dir),
            "pid": self._proc.pid,
            "actor_pid": os.getpid(),
            "ray_node": context.get_node_id(),
            "restarted": context.was_current_actor_reconstructed,
        }

    def stop(self, timeout: float = _STOP_TIMEOUT) -> int | None:
        """Stop the node cleanly (SIGTERM: its turns aborted and saved, its lease ended); its exit code.

        The actor stays until the launcher kills it; a node killed after
        ``timeout`` seconds returns None.
        """
        self._stopping.set()
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None

    # The node's directory -------------------------------------------------------------------------------

    def _write_layer(self) -> None:
        """The node's own ``weald.toml`` in its directory: its state directory, over the machine's configuration.

        ``weald serve --project DIR`` reads it after the user file, so the
        machine's settings (the database, the secret, models, tools) stay
        the user file's, and two nodes on one machine never share a state
        directory.
        """
        store = json.dumps(str(self.dir / "store.db"))
        text = (
            f"# Written by weald serve --ray for node {self.spec.node_id} at each start; edits are lost.\n"
            f"[store]\npath = {store}\n"
        )
        path = self.dir / "weald.toml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)

    def _read_record(self) -> dict[str, Any]:
        try:
            value = json.loads(self._record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def _write_record(self, record: dict[str, Any]) -> None:
        tmp = self._record.with_suffix(".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(self._record)

    def _end_leftover(self, record: dict[str, Any]) -> None:
        """Kill the node process an earlier actor left (where ``PR_SET_PDEATHSIG`` did not reach it).

        The same pid and start time as recorded: the same process, not one that took the pid since.
        """
        pid, since = record.get("pid"), record.get("since")
        if not isinstance(pid, int) or since is None or _start_time(pid) != since:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _start_time(pid) == since and time.monotonic() < deadline:
            time.sleep(0.05)

    def _wait_out_a_crash_loop(self, record: dict[str, Any]) -> None:
        """Wait before a start that follows several within `_CRASH_WINDOW` (1, 2, 4... up to 30 s)."""
        now = time.time()
        recent = [t for t in record.get("starts", []) if isinstance(t, int | float) and now - t < _CRASH_WINDOW]
        extra = len(recent) - _CRASH_FREE_STARTS
        if extra >= 0:
            time.sleep(min(2.0**extra, _CRASH_MAX_WAIT))


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the thread that started it ends (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    prctl = ctypes.CDLL(name, use_errno=True).prctl

    def pdeathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return pdeathsig


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, from /proc), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])  # field 22 of stat(5), counted after "pid (comm)"
    except (IndexError, ValueError):
        return None


def _json_line(log: Path, offset: int) -> dict[str, Any] | None:
    try:
        with log.open("rb") as f:
            f.seek(offset)
            data = f.read(1 << 20)
    except OSError:
        return None
    for raw in data.splitlines():
        if raw.startswith(b"{") and raw.endswith(b"}"):
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict) and "socket" in line:
                    return line
    return None


def _tail(log: Path, offset: int, lines: int = 5) -> str:
    try:
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:])


# -- the launcher ----------------------------------------------------------------------------------------


class RayLauncher:
    """Keeps one node actor on every live machine of a Ray cluster (the launcher's side of ``weald serve --ray``).

    Args:
        address: The Ray cluster (``ray.init``'s address: ``auto``, ``HOST:PORT``).
        spec: The node spec every node gets (its ``node_id`` is replaced by each machine's).
        report: Called with a line for the launcher's log (a node started, lost, failed).

    All methods run on the launcher's main thread.
    """

    def __init__(self, address: str, spec: NodeSpec, report: Callable[[str], None]) -> None:
        self.address = address
        self.spec = spec
        self.report = report
        self.nodes: dict[str, dict[str, Any]] = {}  # node id -> its info, once it answered
        self._pending: dict[str, tuple[Any, Any, float]] = {}  # node id -> (actor, its info() ref, since)
        self._failed: dict[str, float] = {}  # node id -> when its last start failed
        self._remote: Any = None

    def connect(self) -> None:
        """Connect to the Ray cluster as a driver.

        Raises:
            RayLaunchError: it cannot be reached.
        """
        import ray

        _check_reachable(self.address)
        try:
            ray.init(
                address=self.address,
                namespace=NAMESPACE,
                logging_level=logging.WARNING,
                log_to_driver=False,
                include_dashboard=False if self.address == "local" else None,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            msg = f"cannot connect to the Ray cluster at {self.address}: {' '.join(str(exc).split())}"
            raise RayLaunchError(msg) from exc
        self._remote = ray.remote(NodeProcess)

    def machines(self) -> dict[str, tuple[str, str]]:
        """The live Ray nodes by weald node id: each one's Ray node id and address."""
        import ray

        every: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]  # Ray's own is untyped
        live = {str(node["NodeID"]): node for node in every if node.get("Alive")}
        return {
            node_id: (ray_id, str(live[ray_id]["NodeManagerAddress"]))
            for ray_id, node_id in node_ids(list(live.values())).items()
        }

    def start_missing(self) -> list[str]:
        """Start (or find, by name) a node actor on each live machine that has none; the node ids asked for."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        asked = []
        for node_id, (ray_id, host) in self.machines().items():
            if node_id in self._pending:
                continue
            if node_id in self.nodes and _alive(ACTOR_PREFIX + node_id):
                continue
            failed = self._failed.get(node_id)
            if failed is not None and time.monotonic() - failed < _CRASH_MAX_WAIT:
                continue
            self.nodes.pop(node_id, None)
            spec = msgspec.json.encode(msgspec.structs.replace(self.spec, node_id=node_id, host=host))
            actor = self._remote.options(
                name=ACTOR_PREFIX + node_id,
                namespace=NAMESPACE,
                get_if_exists=True,
                lifetime="detached",
                max_restarts=-1,
                max_task_retries=0,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray_id, soft=False),
            ).remote(spec)
            self._pending[node_id] = (actor, actor.info.remote(), time.monotonic())
            asked.append(node_id)
        return asked

    def collect(self, timeout: float = 0.0) -> list[tuple[str, str | None]]:
        """The nodes whose start ended within ``timeout`` seconds: (node id, None) when it answers, else why not."""
        import ray

        if not self._pending:
            return []
        refs = {ref: node_id for node_id, (_, ref, _) in self._pending.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        ended: list[tuple[str, str | None]] = []
        for ref in ready:
            node_id = refs[ref]
            actor, _, _ = self._pending.pop(node_id)
            try:
                info = ray.get(ref)
            except Exception as exc:  # broad: whatever the node actor raised, or Ray's word that it died
                self._failed[node_id] = time.monotonic()
                with contextlib.suppress(Exception):  # broad: it may be gone already
                    ray.kill(actor, no_restart=True)
                ended.append((node_id, _why(exc)))
                continue
            info["actor"] = actor
            self.nodes[node_id] = info
            self._failed.pop(node_id, None)
            ended.append((node_id, None))
        return ended

    def wait_started(self, timeout: float, progress: Callable[[int, int], None]) -> dict[str, str]:
        """Wait until every node asked for answers or failed; the failures' reasons by node id."""
        total = len(self._pending) + len(self.nodes)
        failures: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            failures.update((node_id, why) for node_id, why in self.collect(timeout=0.5) if why is not None)
            progress(len(self.nodes), total)
        for node_id in list(self._pending):
            failures[node_id] = f"it did not answer in {timeout:.0f} s"
        return failures

    def watch(self) -> None:
        """One look at the Ray cluster: start nodes on machines that have none; report what changed."""
        for node_id, why in self.collect():
            if why is None:
                info = self.nodes[node_id]
                self.report(f"node {node_id} serves fronts on {info['address']} (Ray node {info['ray_node'][:8]})")
            else:
                self.report(f"node {node_id} did not start (tried again in {_CRASH_MAX_WAIT:.0f} s): {why}")
        for node_id in self.start_missing():
            self.report(f"starting node {node_id} on a machine that has none")

    def stop_all(self, timeout: float = _STOP_TIMEOUT) -> dict[str, int | None]:
        """Stop every node cleanly, then end its actor; each node's exit code (None: killed)."""
        import ray

        actors = {node_id: info["actor"] for node_id, info in self.nodes.items()}
        for node_id, (actor, _, _) in self._pending.items():
            actors.setdefault(node_id, actor)
        refs = {node_id: actor.stop.remote(timeout) for node_id, actor in actors.items()}
        codes: dict[str, int | None] = {}
        for node_id, ref in refs.items():
            try:
                codes[node_id] = ray.get(ref, timeout=timeout + 30)
            except Exception:  # broad: a node lost meanwhile has nothing left to stop
                codes[node_id] = None
        for actor in actors.values():
            with contextlib.suppress(Exception):  # broad: it may be gone already
                ray.kill(actor, no_restart=True)
        self.nodes.clear()
        self._pending.clear()
        return codes

    def disconnect(self) -> None:
        import ray

        with contextlib.suppress(Exception):  # broad: the cluster may be gone already
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """Fail at once on a ``HOST:PORT`` nothing answers at (``ray.init`` would retry it for good).

    Raises:
        RayLaunchError: nothing accepts a connection there within 10 s.
    """
    if address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        msg = f"--ray {address}: expected auto or HOST:PORT, the Ray cluster's address (ray start prints it)"
        raise RayLaunchError(msg)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        msg = f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}"
        raise RayLaunchError(msg) from exc


def _alive(name: str) -> bool:
    """Whether the named node actor is alive (or restarting) in the ``weald`` namespace."""
    import ray

    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def _why(exc: BaseException) -> str:
    """One line from what a node actor's start raised (Ray wraps it: the node's own message, when there is one)."""
    cause = getattr(exc, "cause", None) or exc.__cause__
    text = str(cause if isinstance(cause, RayLaunchError) else exc)
    for line in text.splitlines():
        if "did not start" in line or "cannot start" in line or "too long a path" in line:
            return line.strip().removeprefix("weald.runtime.daemon._ray.RayLaunchError: ")
    return " ".join(text.split())[:500]
