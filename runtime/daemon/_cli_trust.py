"""``weald trust``: review a nested project's ``weald.toml`` (or ``.weald/``) and trust it.

A project file inside another project (``sub/weald.toml`` under a project,
or under a directory a session ran in) may have been written by an agent
working there; the daemon applies it only once it is trusted (see
``docs/configuration.md``, "Nested project configuration"). This command
shows the file (its path, size, SHA-256 and contents, every terminal control
written out) and records its trust in the daemon's store; ``--list`` and
``--revoke PATH`` show and forget trust. ``weald run --trust`` uses
`show_file` to show the file before it trusts it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from weald.runtime.daemon._cli_common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    connect,
    console,
    print_json,
)
from weald.runtime.daemon._render import printable

__all__ = ["add_trust_command", "cmd_trust", "config_target", "show_file"]

#: The most of a file's text shown before the trust question (the digest covers all of it).
_SHOWN_BYTES = 64 * 1024


def add_trust_command(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``weald trust`` to the parser's subcommands."""
    p = sub.add_parser(
        "trust",
        parents=[common],
        help="trust a nested project's weald.toml after reviewing it",
        description=(cmd_trust.__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=cmd_trust, parser=p)
    p.add_argument("path", metavar="PATH", nargs="?", help="the weald.toml (or .weald directory, or their directory)")
    p.add_argument("--yes", action="store_true", help="trust it without asking (after showing it)")
    p.add_argument("--list", action="store_true", help="list the trusted files")
    p.add_argument("--revoke", action="store_true", help="forget the trust of PATH")


def config_target(path: str) -> Path:
    """The file to trust for what the user named: a ``weald.toml``, a ``.weald`` directory, or their directory.

    Raises:
        CommandError: nothing to trust there.
    """
    target = Path(path).expanduser().absolute()
    if target.is_dir() and target.name != ".weald":
        for name in ("weald.toml", ".weald"):
            if (target / name).exists():
                return target / name
        raise CommandError(f"weald trust: {printable(target)} holds no weald.toml or .weald", EXIT_USAGE)
    if not target.exists() and not target.is_symlink():
        raise CommandError(f"weald trust: {printable(target)}: no such file", EXIT_USAGE)
    return target


def _read(target: Path) -> tuple[str, str, int, str]:
    """(real path, sha256, size, text to show) of a file, or of a ``.weald`` directory (its files, listed)."""
    real = os.path.realpath(target)
    if os.path.isdir(real):
        from weald.runtime.daemon._trust import config_digest_blocking

        digest, size = config_digest_blocking(real)
        listing: list[str] = []
        for top, dirs, files in os.walk(real):
            dirs.sort()
            listing.extend(os.path.relpath(os.path.join(top, name), real) for name in sorted(files))
        return real, digest, size, "files:\n" + "\n".join(f"  {name}" for name in listing)
    with open(real, "rb") as file:
        data = file.read()
    text = data[:_SHOWN_BYTES].decode("utf-8", "replace")
    if len(data) > _SHOWN_BYTES:
        text += f"\n[... {len(data) - _SHOWN_BYTES:,} more bytes not shown]"
    return real, hashlib.sha256(data).hexdigest(), len(data), text


def show_file(target: Path, err: Console, *, why: str | None = None) -> tuple[str, str, int, str]:
    """Print a file to trust (path, size, sha256, contents; terminal controls written out); returns `_read`'s."""
    try:
        real, digest, size, text = _read(target)
    except OSError as exc:
        raise CommandError(f"weald trust: cannot read {printable(target)}: {exc.strerror or exc}", EXIT_FAILED) from exc
    if why:
        err.print(printable(why), markup=False, soft_wrap=True)
    err.print(f"file:   {printable(real)}", markup=False, soft_wrap=True)
    err.print(f"size:   {size:,} bytes", markup=False)
    err.print(f"sha256: {digest}", markup=False)
    err.print("-" * 60, markup=False)
    for line in text.splitlines():
        err.print(f"│ {printable(line)}", markup=False, soft_wrap=True)
    err.print("-" * 60, markup=False)
    return real, digest, size, text


def cmd_trust(args: argparse.Namespace) -> int:
    """Trust a project's weald.toml (or .weald/) that lies inside another project, after reviewing it.

    A weald.toml in a subdirectory of a project (or of a directory a session
    ran in) may have been written by an agent working there; the daemon
    starts no session under it until you trust it. weald trust PATH shows the
    file (path, size, SHA-256, contents) and asks; --yes trusts without
    asking (with no terminal to ask, --yes is needed). A trusted file that
    changes is untrusted again. --list shows the trusted files, --revoke PATH
    forgets one. weald run --trust does the same before starting its agent.
    """
    out = console()
    err = console(stderr=True)
    if args.list:
        if args.path or args.revoke:
            raise CommandError("weald trust: --list takes no PATH and no --revoke", EXIT_USAGE)
        with connect(args, embedded=True) as client:
            trusted = client.call("config.trusted", timeout=60)["trusted"]
        if args.json:
            print_json({"trusted": trusted})
        elif not trusted:
            out.print("no trusted nested project files", markup=False)
        else:
            for record in trusted:
                out.print(f"{printable(record['path'])}  sha256:{record['sha256']}", markup=False, soft_wrap=True)
        return EXIT_OK
    if not args.path:
        raise CommandError("weald trust: name the file to trust (PATH), or --list", EXIT_USAGE)
    if args.revoke:
        target = Path(args.path).expanduser().absolute()
        with connect(args, embedded=True) as client:
            removed = client.call("config.untrust", {"path": str(target)}, timeout=60)
        if args.json:
            print_json({"revoked": removed})
        else:
            out.print(f"no longer trusted: {printable(removed['path'])}", markup=False, soft_wrap=True)
        return EXIT_OK
    target = config_target(args.path)
    real, digest, _, _ = show_file(target, err)
    if not args.yes:
        if not sys.stdin.isatty():
            raise CommandError(
                "weald trust: no terminal to ask whether to trust it; review it, then run again with --yes", EXIT_USAGE
            )
        answer = _read_line("trust this file? sessions started under it follow its rules [y/N]: ")
        if answer.strip().lower() not in ("y", "yes"):
            err.print("not trusted", markup=False)
            return EXIT_FAILED
    with connect(args, embedded=True) as client:
        record = client.call("config.trust", {"path": real, "sha256": digest}, timeout=120)
    if args.json:
        print_json({"trusted": record})
    else:
        out.print(f"trusted: {printable(record['path'])} (sha256:{record['sha256']})", markup=False, soft_wrap=True)
        if record.get("nested") is None:
            out.print(
                "(it is not nested in another project now: it applies without trust; the trust is kept)",
                markup=False,
            )
    return EXIT_OK


def _read_line(prompt: str) -> str:
    try:
        return input(prompt)
    except EOFError:
        return ""
