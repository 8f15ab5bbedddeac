"""``weald cluster status | drain | secret`` and ``weald serve --front``: daemons on several machines.

``weald cluster status`` reads the cluster's database (``[store] url`` or
``--store``) directly: each node (epoch, lease left, address, sessions
awake and asleep, CPU, last commit) and the orphaned sessions, in one
transaction; ``--json`` prints exactly what it read. ``weald cluster drain
NODE`` asks the front (the socket) to move NODE's sessions to the other
nodes and then stop it. ``weald cluster secret`` prints a new secret for
``[cluster] secret``.

``weald serve --front`` runs a front (`_cluster_front.Front`) on the socket
instead of a daemon; ``weald serve --ray`` runs one too, with a node on every
machine of a Ray cluster (`_ray`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

__all__ = ["add_cluster_commands", "serve_front", "serve_ray"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def add_cluster_commands(sub: Any, common: argparse.ArgumentParser, print_json: Callable[[Any], None]) -> None:
    """Add ``weald cluster ...`` to the ``weald`` parser's subcommands."""
    group = sub.add_parser("cluster", help="the nodes of a cluster: status, drain", description=__doc__)
    group.set_defaults(parser=group)
    commands = group.add_subparsers(dest="cluster_command", metavar="COMMAND")
    commands.required = True

    p = commands.add_parser(
        "status",
        parents=[common],
        help="each node and the orphaned sessions, from the database",
        description="Each node of the cluster (epoch, lease, address, sessions, CPU, last commit) and the "
        "sessions no live node holds, read from the cluster's database in one transaction.",
    )
    p.add_argument("--store", metavar="URL", help="the cluster's database (default: [store] url)")
    p.set_defaults(func=lambda args: _status(args, print_json))

    p = commands.add_parser(
        "drain",
        parents=[common],
        help="move a node's sessions to the others, then stop it",
        description="Through the front: mark NODE draining, hand each of its sessions (once idle) to the least "
        "loaded other node, asleep (it wakes there at its next message), then stop NODE.",
    )
    p.add_argument("node", metavar="NODE", help="the node (weald cluster status lists them)")
    p.add_argument("--keep-running", action="store_true", help="leave the node running once drained")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a busy session is waited for (default: 300)")
    p.set_defaults(func=lambda args: _drain(args, print_json))

    p = commands.add_parser(
        "secret",
        parents=[common],
        help="print a new secret for [cluster] secret",
        description="Print a new random secret for [cluster] secret (put it in every node's and front's "
        "configuration, readable by its owner only).",
    )
    p.set_defaults(func=lambda args: _secret(args, print_json))


def _secret(args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    from weald.runtime.daemon._cluster import new_secret

    secret = new_secret()
    if args.json:
        print_json({"secret": secret})
    else:
        sys.stdout.write(secret + "\n")
    return EXIT_OK


def _status(args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    from weald.runtime import StoreError
    from weald.runtime._store_postgres import PostgresBackend
    from weald.runtime.daemon._cli_common import console, load_config, print_error
    from weald.runtime.daemon._cluster import cluster_status
    from weald.runtime.daemon._config_model import check_store_url

    err = console(stderr=True)
    url = args.store
    if not url:
        url = load_config(args).store.url
    if not url:
        print_error(err, "weald cluster status: no cluster database: give --store postgresql://... or set [store] url")
        return EXIT_USAGE
    try:
        check_store_url(url)
        backend = PostgresBackend(url)
    except (StoreError, ValueError) as exc:
        print_error(err, f"weald cluster status: {' '.join(str(exc).split())}")
        return EXIT_USAGE
    try:
        status = cluster_status(backend)
    except StoreError as exc:
        print_error(err, f"weald cluster status: {' '.join(str(exc).split())}")
        return EXIT_FAILED
    finally:
        backend.close()
    if args.json:
        print_json(status)
        return EXIT_OK
    out = console()
    table = Table(title=f"cluster on {status['store']}", title_justify="left")
    for column in ("node", "epoch", "lease", "address", "sessions", "awake", "asleep", "cpu", "last commit"):
        table.add_column(column, overflow="fold")
    for node in status["nodes"]:
        lease = f"{node['lease_left']:.1f} s" if node["live"] else "expired"
        if node["draining"]:
            lease += " (draining)"
        commit = node["last_commit"]
        ago = f"{max(0.0, status['as_of'] - commit):.1f} s ago" if isinstance(commit, int | float) else "-"
        cpu = f"{node['cpu'] * 100:.0f}%" if isinstance(node["cpu"], int | float) else "-"
        table.add_row(
            node["node_id"],
            str(node["epoch"]),
            lease,
            node["address"] or "-",
            str(node["sessions"]),
            _count(node["awake"]),
            _count(node["asleep"]),
            cpu,
            ago,
        )
    out.print(table)
    orphaned = status["orphaned"]
    line = f"{status['sessions']} sessions placed; {orphaned['count']} orphaned"
    if orphaned["sessions"]:
        shown = ", ".join(orphaned["sessions"][:10])
        line += f": {shown}{' ...' if orphaned['count'] > 10 else ''}"
    out.print(line, markup=False, soft_wrap=True)
    return EXIT_OK


def _count(value: Any) -> str:
    return str(value) if isinstance(value, int) else "-"


def _drain(args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    from weald.runtime.daemon._cli_common import connect, console

    err = console(stderr=True)
    with connect(args) as client, err.status(f"draining node {args.node}: moving its sessions"):
        report = client.call(
            "cluster.drain",
            {"node": args.node, "stop": not args.keep_running, "timeout": args.timeout},
            timeout=args.timeout + 600,
        )
    if args.json:
        print_json(report)
        return EXIT_OK
    out = console()
    to = ", ".join(f"{count} to {node}" for node, count in report["to"].items()) or "none to move"
    out.print(f"node {report['node']}: {report['moved']} sessions moved ({to}) in {report['seconds']} s", markup=False)
    if report["busy"]:
        out.print(f"still busy, left on it: {', '.join(report['busy'])}", markup=False)
    if report["failed"]:
        out.print(f"not moved (lost meanwhile, or refused): {', '.join(report['failed'])}", markup=False)
    out.print("the node is stopping" if report["stopped"] else "the node keeps running", markup=False)
    return EXIT_OK if not report["busy"] and not report["failed"] else EXIT_FAILED


def serve_front(args: argparse.Namespace, config: Any, path: Any) -> int:
    """``weald serve --front``: serve the cluster's front on the socket until SIGTERM, SIGINT or ``daemon.stop``."""
    from weald.runtime.daemon._cli_common import console

    command = "weald serve --front"
    front = _make_front(args, config, path, console(stderr=True), command)
    return EXIT_USAGE if front is None else _run_front(args, config, path, front, command)


def _make_front(args: argparse.Namespace, config: Any, path: Any, err: Any, command: str) -> Any:
    """The front for ``config`` on socket ``path``; None when the configuration cannot make one (said on ``err``)."""
    from weald.runtime.daemon._cli_common import print_error
    from weald.runtime.daemon._cluster import ClusterError
    from weald.runtime.daemon._cluster_front import Front, check_front_config

    try:
        check_front_config(config)
        return Front(config, socket_path=path, http=args.http)
    except ClusterError as exc:
        print_error(err, f"{command}: {exc}")
        return None


def _run_front(
    args: argparse.Namespace,
    config: Any,
    path: Any,
    front: Any,
    command: str,
    *,
    more: dict[str, Any] | None = None,
    tick: Callable[[], None] | None = None,
    period: float = 0.2,
) -> int:
    """Start ``front``, print where it serves, serve until a signal or ``daemon.stop``, stop it.

    ``more``: what the ``--json`` line holds besides; ``tick``: called every ``period`` seconds meanwhile.
    """
    from weald.runtime import mask_url
    from weald.runtime.daemon._cli_common import console, describe_failure, print_error

    err = console(stderr=True)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        front.start()
    except Exception as exc:
        print_error(err, f"{command}: {describe_failure(exc)}")
        return EXIT_FAILED
    line: dict[str, Any] = {"socket": str(path), "pid": os.getpid(), "store": mask_url(config.store.url), "front": True}
    if front.observer_port is not None:
        line["http"] = f"{front.http.rpartition(':')[0]}:{front.observer_port}"
    line.update(more or {})
    if args.json:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    else:
        err.print(
            f"weald front serving on {path} (pid {os.getpid()}); cluster {line['store']}", markup=False, soft_wrap=True
        )
        if "http" in line:
            err.print(f"observer on http://{line['http']}/ (weald observe opens it)", markup=False)
    while not stop.wait(period):
        if front.stop_requested:
            break
        if tick is not None:
            tick()
    started = time.monotonic()
    front.shutdown()
    if not args.json:
        err.print(f"weald front stopped ({time.monotonic() - started:.1f} s)", markup=False)
    return EXIT_OK


def serve_ray(args: argparse.Namespace, config: Any, path: Any) -> int:
    """``weald serve --ray``: a node on every machine of a Ray cluster (Ray actors), and the front here.

    See `weald.runtime.daemon._ray`. Stops the nodes too on SIGTERM, SIGINT or
    ``daemon.stop`` (``--keep-nodes`` leaves them running, for the next launcher).
    """
    from rich.progress import BarColumn, Progress, TextColumn
    from weald.runtime.daemon._cli_common import console, print_error

    err = console(stderr=True)
    command = "weald serve --ray"
    for given, option in ((args.front, "--front"), (args.listen, "--listen"), (args.stdio, "--stdio")):
        if given:
            print_error(
                err, f"{command}: {option} does not go with --ray (the launcher runs the front; Ray, the nodes)"
            )
            return EXIT_USAGE
    if args.node_id:
        print_error(err, f"{command}: --node-id does not go with --ray (each node is named after its Ray node)")
        return EXIT_USAGE
    front = _make_front(args, config, path, err, command)
    if front is None:
        return EXIT_USAGE
    if args.node_config is not None and not Path(args.node_config).expanduser().is_absolute():
        print_error(err, f"{command}: --node-config {args.node_config}: give an absolute path (one on every machine)")
        return EXIT_USAGE
    try:
        import ray  # noqa: F401 - only to say clearly that it is missing
    except ImportError:
        print_error(err, f"{command}: Ray is not installed: pip install 'weald[ray]' (here and on every machine)")
        return EXIT_USAGE
    from weald.runtime.daemon._ray import NodeSpec, RayLauncher, RayLaunchError

    spec = NodeSpec(node_id="-", state_root=args.node_state, port=args.node_port, config=args.node_config)

    def report(text: str) -> None:
        err.print(f"{command}: {text}", markup=False, soft_wrap=True)

    launcher = RayLauncher(args.ray, spec, report)
    try:
        launcher.connect()
    except RayLaunchError as exc:
        print_error(err, f"{command}: {exc}")
        return EXIT_FAILED
    try:
        with Progress(
            TextColumn("starting weald nodes"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as progress:
            task = progress.add_task("nodes", total=None)
            launcher.start_missing()
            failures = launcher.wait_started(
                spec.start_timeout + 60, lambda done, total: progress.update(task, completed=done, total=total)
            )
        if failures:
            for node_id, why in sorted(failures.items()):
                print_error(err, f"{command}: node {node_id}: {why}")
            if not launcher.nodes:
                return EXIT_FAILED
        nodes = [
            {key: info[key] for key in ("node_id", "address", "ray_node", "pid")} for info in launcher.nodes.values()
        ]
        if not args.json:
            for info in sorted(nodes, key=lambda n: n["node_id"]):
                report(f"node {info['node_id']} serves fronts on {info['address']} (Ray node {info['ray_node'][:8]})")
        last = [time.monotonic()]

        def tick() -> None:
            if time.monotonic() - last[0] >= WATCH_PERIOD:
                last[0] = time.monotonic()
                try:
                    launcher.watch()
                except Exception as exc:  # broad: Ray may be unreachable for a while; the nodes serve on
                    report(f"cannot look at the Ray cluster: {' '.join(str(exc).split())[:300]}")

        from weald.runtime.daemon._ray import WATCH_PERIOD

        return _run_front(args, config, path, front, command, more={"ray": True, "nodes": nodes}, tick=tick)
    finally:
        if args.keep_nodes:
            report("leaving the nodes running (--keep-nodes)")
        else:
            codes = launcher.stop_all()
            if not args.json:
                stopped = ", ".join(
                    f"{n} ({'exit ' + str(c) if c is not None else 'killed'})" for n, c in codes.items()
                )
                report(f"nodes stopped: {stopped or 'none'}")
        launcher.disconnect()
