"""``weald store migrate | backup``: move a store between sqlite and PostgreSQL, and back up a sqlite store.

``weald store migrate --from sqlite:PATH --to postgresql://...`` (or the
other way, or between two of either) copies every namespace, value for
value, in the order they were written, then counts each namespace on both
sides and fails if any count differs. It refuses a store a live daemon
holds: a sqlite file whose lock a daemon holds (the lock is taken for the
copy, so none starts meanwhile), or a database with a node whose lease is
live. The target must be empty. Memory notes are indexed by the target as
they are written; session placement is not copied (the first node to start
on the target claims the sessions).

``weald store backup TARGET`` copies a sqlite store with sqlite's online
backup API: a daemon may go on writing meanwhile. A PostgreSQL store is
backed up with the server's own tools (``pg_dump``).

Both show their progress (rich) on stderr; a store is named by its file or
its URL with the password masked, never with the password.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["add_store_commands"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
_BATCH = 1000


class CommandError(Exception):
    """The command cannot do what was asked; the message says why (exit status 2)."""


def add_store_commands(sub: Any, common: argparse.ArgumentParser, print_json: Callable[[Any], None]) -> None:
    """Add ``weald store ...`` to the ``weald`` parser's subcommands."""
    store = sub.add_parser("store", help="migrate or back up the store", description=__doc__)
    commands = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND")
    commands.required = True

    p = commands.add_parser(
        "migrate",
        parents=[common],
        help="copy a store into another (sqlite <-> PostgreSQL), counts verified",
        description="Copy every namespace of one store into an empty other, then verify the counts.",
    )
    p.add_argument("--from", dest="source", required=True, metavar="STORE", help="sqlite:PATH or postgresql://...")
    p.add_argument("--to", dest="target", required=True, metavar="STORE", help="sqlite:PATH or postgresql://...")
    p.set_defaults(func=lambda args: _run(_migrate, args, print_json))

    p = commands.add_parser(
        "backup",
        parents=[common],
        help="copy a sqlite store to a file, online",
        description="Copy a sqlite store to TARGET with sqlite's online backup API (a daemon may keep writing).",
    )
    p.add_argument("target", help="the backup file to write (must not exist)")
    p.add_argument("--store", dest="source", metavar="STORE", help="sqlite:PATH (default: [store] path)")
    p.set_defaults(func=lambda args: _run(_backup, args, print_json))


def _run(command: Callable[..., int], args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    from weald.runtime import StoreError, WealdError

    err = Console(stderr=True, soft_wrap=True)
    try:
        return command(args, print_json, err)
    except CommandError as exc:
        err.print(f"weald store {args.store_command}: {exc}", style="red", markup=False)
        return EXIT_USAGE
    except (StoreError, WealdError) as exc:
        err.print(f"weald store {args.store_command}: {' '.join(str(exc).split())}", style="red", markup=False)
        return EXIT_FAILED


# -- targets ---------------------------------------------------------------------------------------


def _parse(target: str) -> tuple[str, str]:
    """``("sqlite", path)`` or ``("postgresql", url)``."""
    from weald.runtime._store_backend import is_url

    if is_url(target):
        return "postgresql", target
    path = target.removeprefix("sqlite:")
    if not path:
        raise CommandError(f"{target!r} names no store: give sqlite:PATH or a postgresql:// URL")
    return "sqlite", str(Path(path).expanduser().resolve())


def _shown(kind: str, where: str) -> str:
    from weald.runtime import mask_url

    return mask_url(where) if kind == "postgresql" else where


@contextlib.contextmanager
def _held(kind: str, where: str, *, create: bool) -> Iterator[Any]:
    """The store opened for this command, refused if a live daemon holds it (a sqlite file is locked meanwhile)."""
    from weald.runtime import Store
    from weald.runtime.daemon.tree import DaemonError, lock_state_dir

    if kind == "sqlite":
        path = Path(where)
        if not create and not path.is_file():
            raise CommandError(f"no sqlite store at {path}")
        try:
            fd = lock_state_dir(path)
        except DaemonError as exc:
            raise CommandError(f"{exc}; stop it before migrating its store") from None
        try:
            store = Store(path)
            try:
                yield store
            finally:
                store.close()
        finally:
            os.close(fd)
        return
    store = Store(url=where)
    try:
        live = [node for node in store.backend.nodes() if node["live"]]  # type: ignore[attr-defined]
        if live:
            names = ", ".join(f"{n['node_id']} (epoch {n['epoch']})" for n in live)
            raise CommandError(
                f"store {store.location} is held by a live daemon: node {names}; stop it (or wait for its lease "
                "to run out) before migrating"
            )
        yield store
    finally:
        store.close()


def _migrate(args: argparse.Namespace, print_json: Callable[[Any], None], err: Console) -> int:
    source_kind, source_where = _parse(args.source)
    target_kind, target_where = _parse(args.target)
    if (source_kind, source_where) == (target_kind, target_where):
        raise CommandError("--from and --to name the same store")
    with (
        _held(source_kind, source_where, create=False) as source,
        _held(target_kind, target_where, create=True) as target,
    ):
        namespaces = source.namespaces()
        filled = {ns: n for ns in target.namespaces() if (n := target.count(ns))}
        if filled:
            listed = ", ".join(f"{ns} ({n})" for ns, n in sorted(filled.items()))
            raise CommandError(f"the target store {target.location} is not empty: {listed}; migrate into an empty one")
        counts = {ns: source.count(ns) for ns in namespaces}
        total = sum(counts.values())
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            disable=not err.is_terminal,
        )
        with progress:
            overall = progress.add_task("all namespaces", total=total)
            for namespace in namespaces:
                task = progress.add_task(namespace, total=counts[namespace])
                target.backend.ensure_namespace(namespace)
                for rows in source.backend.dump(namespace, _BATCH):
                    target.backend.transact(namespace, dict(rows), [], f"the copy of namespace {namespace!r}")
                    progress.advance(task, len(rows))
                    progress.advance(overall, len(rows))
        rows_out = []
        mismatched = []
        for namespace in namespaces:
            copied = target.count(namespace)
            rows_out.append({"namespace": namespace, "source": counts[namespace], "target": copied})
            if copied != counts[namespace]:
                mismatched.append(namespace)
        report = {
            "from": source.location,
            "to": target.location,
            "namespaces": rows_out,
            "values": total,
            "verified": not mismatched,
        }
    if args.json:
        print_json(report)
    else:
        table = Table("namespace", "source", "target", box=None, padding=(0, 1))
        for row in rows_out:
            table.add_row(row["namespace"], f"{row['source']:,}", f"{row['target']:,}")
        out = Console(soft_wrap=True)
        out.print(table)
        out.print(f"copied {total:,} values from {report['from']} to {report['to']}", markup=False)
    if mismatched:
        err.print(f"weald store migrate: the counts differ in {', '.join(mismatched)}", style="red", markup=False)
        return EXIT_FAILED
    return EXIT_OK


def _backup(args: argparse.Namespace, print_json: Callable[[Any], None], err: Console) -> int:
    from weald.runtime._store_sqlite import SqliteBackend

    if args.source:
        kind, where = _parse(args.source)
    else:
        from weald.runtime.daemon.config import load_config

        config = load_config(Path(getattr(args, "project", None) or Path.cwd()))
        kind, where = ("postgresql", config.store.url) if config.store.url else ("sqlite", str(config.store.path))
    if kind == "postgresql":
        raise CommandError(
            f"{_shown(kind, where)} is a PostgreSQL store: back it up with the server's tools (pg_dump DBNAME "
            "> FILE, or pg_basebackup), see docs/deployment.md"
        )
    source = Path(where)
    if not source.is_file():
        raise CommandError(f"no sqlite store at {source}")
    target = Path(args.target).expanduser().resolve()
    if target.exists():
        raise CommandError(f"{target} exists; choose a new file for the backup")
    if not target.parent.is_dir():
        raise CommandError(f"{target.parent} is not a directory")
    backend = SqliteBackend(source)
    try:
        progress = Progress(
            TextColumn("[bold]backup"), BarColumn(), MofNCompleteColumn(), console=err, disable=not err.is_terminal
        )
        with progress:
            task = progress.add_task("pages", total=None)

            def step(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            backend.backup(target, step)
    finally:
        backend.close()
    with contextlib.suppress(OSError):
        target.chmod(0o600)  # a copy of the store is as private as the store
    size = target.stat().st_size
    if args.json:
        print_json({"from": str(source), "to": str(target), "bytes": size})
    else:
        Console(soft_wrap=True).print(f"backed up {source} to {target} ({size:,} bytes)", markup=False)
    return EXIT_OK
