"""What remembering and checking protected links costs a sandboxed command: side by side.

Every sandboxed shell command remembers the symbolic links on the way to its
protected paths when its sandbox is set up (`weald.runtime.ProtectedLinks.watch`:
an ``lstat`` per path component, a ``readlink`` per link), and checks them once
it has ended (`ProtectedLinks.release`: an ``lstat`` and a ``readlink`` per
link). Contenders, rounds interleaved so that load hits them alike:

- ``options, no links``: the bubblewrap options of a git project with no
  links (as every command before this change made them: hidden and
  protected paths looked at, placeholders made and removed, options file
  written);
- ``options + watch + check, no links``: the same with the links watched
  and checked (there are none: the walk's ``lstat`` calls only);
- ``options, 3 links`` and ``options + watch + check, 3 links``: a project
  whose ``weald.toml``, imported ``.mcp.json`` and ``.git/hooks`` are links;
- ``watch + check alone, 3 links``: the remembering and checking by
  themselves, for the same project.

Run: ``python benchmarks/bench_protected_links.py [--quick]``
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, interleave, quick_main, samples_us, summary


def _project(root: Path, *, links: bool) -> Path:
    project = root / ("linked" if links else "plain")
    (project / "conf").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    if links:
        (project / "conf" / "weald.toml").write_text("")
        (project / "conf" / "mcp.json").write_text('{"mcpServers": {}}\n')
        (project / "weald.toml").symlink_to("conf/weald.toml")
        (project / ".mcp.json").symlink_to("conf/mcp.json")
        (project / "githooks").mkdir()
        shutil.rmtree(project / ".git" / "hooks")
        (project / ".git" / "hooks").symlink_to("../githooks")
    return project


def run(quick: bool = False) -> list[Row]:
    from weald.runtime import ProtectedLinks
    from weald.tools import _bwrap
    from weald.tools._protected import Placeholders, protected_paths

    banner("protected links: remembered when a command starts, checked when it ends")
    root = Path(tempfile.mkdtemp(prefix="bench-links-"))
    try:
        plain, linked = _project(root, links=False), _project(root, links=True)
        hidden = _bwrap.default_hidden_paths()

        def options(project: Path, watch: bool) -> Callable[[], None]:
            policy = _bwrap.SandboxPolicy(
                project=project,
                workdir=project,
                hidden=hidden,
                private=(root / "state",),
                protected=(project / ".mcp.json",),
            )

            def once() -> None:
                placeholders, links = Placeholders(), ProtectedLinks() if watch else None
                os.close(_bwrap.options_file(_bwrap.bwrap_options(policy, placeholders, links)))
                placeholders.release()
                if links is not None:
                    assert links.release() == []

            return once

        items = protected_paths(linked, (linked / ".mcp.json",))
        writable = [linked]

        def alone() -> None:
            links = ProtectedLinks()
            for item in items:
                links.watch(item.path, writable)
            assert len(links.paths) == 3
            links.release()

        contenders: dict[str, Callable[[], None]] = {
            "options, no links": options(plain, False),
            "options + watch + check, no links": options(plain, True),
            "options, 3 links": options(linked, False),
            "options + watch + check, 3 links": options(linked, True),
            "watch + check alone, 3 links": alone,
        }
        ops = 100 if quick else 400
        medians = interleave(
            {name: lambda n, fn=fn: samples_us(fn, n, warmup=20) for name, fn in contenders.items()}, ops
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for name, value in medians.items():
        note = ""
        if name.startswith("options + watch"):
            base = medians[name.replace(" + watch + check", "")]
            note = f"+{value - base:.1f} us over the same without ({value / base:.3f}x)"
        rows.append(Row("protected_links", name, value, "us", note=note))
    return summary(rows)


def main() -> None:
    quick_main(run, __doc__)


if __name__ == "__main__":
    main()
