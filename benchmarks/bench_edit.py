"""Benchmark: read_file and edit_file as they are now, beside an earlier implementation, in one run.

The earlier implementation (by default git ``main``; ``--before REF`` picks
another commit) is loaded from ``git show REF:tools/<module>.py`` as separate
modules (``_hashline``, ``_ledger``, ``_fuzzy``, ``read_file``, ``edit_file``
under other names), so both run in this process, on the same machine load,
in interleaved rounds. Each has its own session ledger and its own copy of
the file, in ``/dev/shm`` when there is one (tmpfs: the fsync of every write
costs nothing there, so the figures are the tools' own work, not the disk's).

Measured, as medians of the CPU time of single calls (the tool functions
called directly; CPU time of the calling thread, so that waiting for a CPU on
a loaded machine does not count):

- ``read_file``: one call on a 10,000-line file (the first page, cut at 50 KB);
- ``read_file, last page``: a call that starts at line 9,500;
- ``edit_file by anchor``: replace one line in the middle, with the tag the
  previous call's result showed (each call flips the line between two texts);
- ``edit_file by text``: an exact old_string of one line, flipped the same way;
- ``edit_file by text, indentation``: an old_string quoted at another
  indentation, so the tolerant cascade runs (same flip).

Each row prints before, after and the ratio; the target is after <= 1.10 x before.

Run: ``python benchmarks/bench_edit.py [--quick] [--before REF]``; ``run_all.py`` calls `run`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import weald.tools  # noqa: F401 - registers the current tools first
from weald.tools import SessionServices, ToolContext, ToolResult, _hashline, _ledger, default_registry
from weald.tools import edit_file as current_edit_module
from weald.tools import read_file as current_read_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, interleave, summary, verdict

REPO = Path(__file__).resolve().parents[1]
MODULES = ("_hashline", "_ledger", "_fuzzy", "read_file", "edit_file")
_IMPORTS = re.compile(r"weald\.tools\.(" + "|".join(MODULES) + r")\b")
LINES = 10_000
MIDDLE = LINES // 2


def load_before(ref: str) -> dict[str, types.ModuleType]:
    """The file tools' modules as of ``ref``, importable side by side with the current ones."""
    loaded: dict[str, types.ModuleType] = {}
    for name in MODULES:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{ref}:tools/{name}.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        qualified = f"weald.tools._before_{name}"
        module = types.ModuleType(qualified)
        module.__file__ = f"<{ref}:tools/{name}.py>"
        sys.modules[qualified] = module
        code = compile(_IMPORTS.sub(r"weald.tools._before_\1", source), module.__file__, "exec")
        exec(code, module.__dict__)  # weald's own code, at another commit
        loaded[name] = module
    # Loading the old tools re-registered their names: the current ones go back.
    for tool in (current_read_module.read_file, current_edit_module.edit_file):
        default_registry.register(tool, replace=True)
    return loaded


class _Side:
    """One implementation with its own file, ledger and tools."""

    def __init__(self, root: Path, name: str, modules: dict[str, Any]) -> None:
        self.dir = root / name
        self.dir.mkdir()
        self.path = self.dir / "module.py"
        self.path.write_text("".join(_line(i, flipped=False) for i in range(LINES)))
        ledger = modules["_ledger"].ReadLedger()
        session = SessionServices(output_dir=self.dir / ".out", ledger=ledger)
        self.ctx = ToolContext(working_dir=self.dir, session=session)
        self.read_tool = modules["read_file"].read_file
        self.edit_tool = modules["edit_file"].edit_file
        self.line_hash: Callable[[str], str] = modules["_hashline"].line_hash
        self.flipped = {"anchor": False, "text": False, "indent": False}
        self.read(1)

    def read(self, offset: int) -> ToolResult:
        result = self.read_tool.fn(self.ctx, path="module.py", offset=offset)
        assert result.ok, result.output
        return result

    def edit(self, **arguments: object) -> ToolResult:
        result = self.edit_tool.fn(self.ctx, path="module.py", **arguments)
        assert isinstance(result, ToolResult)
        assert result.ok, result.output
        return result

    def edit_by_anchor(self) -> None:
        line = MIDDLE + 1
        old = _line(MIDDLE, flipped=self.flipped["anchor"]).rstrip("\n")
        self.flipped["anchor"] = not self.flipped["anchor"]
        new = _line(MIDDLE, flipped=self.flipped["anchor"])
        self.edit(start=f"{line}:{self.line_hash(old)}", new_string=new)

    def edit_by_text(self) -> None:
        at = MIDDLE + 10
        old = _line(at, flipped=self.flipped["text"])
        self.flipped["text"] = not self.flipped["text"]
        self.edit(old_string=old, new_string=_line(at, flipped=self.flipped["text"]))

    def edit_by_text_indented(self) -> None:
        # Two lines quoted without their indentation: not a substring, so the cascade runs.
        at = MIDDLE + 20
        old = _line(at, flipped=self.flipped["indent"]).strip() + "\n" + _line(at + 1, flipped=False).strip() + "\n"
        self.flipped["indent"] = not self.flipped["indent"]
        new = _line(at, flipped=self.flipped["indent"]).strip() + "\n" + _line(at + 1, flipped=False).strip() + "\n"
        self.edit(old_string=old, new_string=new)


def _line(i: int, *, flipped: bool) -> str:
    scale = "3.5" if flipped else "2.5"
    return f"    result_{i} = transform(values[{i}], scale={scale})  # step {i}\n"


def _sampler(action: Callable[[], object]) -> Callable[[int], list[float]]:
    """Samples of the CPU time this thread spends in ``action`` (microseconds).

    CPU time, not wall time: on a machine shared with other work, waiting for
    a CPU is most of a wall-clock figure and swamps a 10% difference.
    """

    def sample(n: int) -> list[float]:
        out = []
        clock = time.thread_time_ns
        for _ in range(n):
            began = clock()
            action()
            out.append((clock() - began) / 1000)
        return out

    return sample


def run(quick: bool = False, before: str = "main") -> list[Row]:
    banner(f"bench_edit: read_file and edit_file, {before} (before) beside this tree (after)")
    old = load_before(before)
    ops, rounds = (10, 5) if quick else (20, 15)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        root = Path(tmp)
        current = {
            "_hashline": _hashline,
            "_ledger": _ledger,
            "read_file": current_read_module,
            "edit_file": current_edit_module,
        }
        sides = {"before": _Side(root, "before", old), "after": _Side(root, "after", current)}
        cases: list[tuple[str, Callable[[_Side], Callable[[], object]]]] = [
            ("read_file (first page)", lambda s: lambda: s.read(1)),
            ("read_file (last page)", lambda s: lambda: s.read(LINES - 499)),
            ("edit_file by anchor", lambda s: s.edit_by_anchor),
            ("edit_file by text", lambda s: s.edit_by_text),
            ("edit_file by text, indentation", lambda s: s.edit_by_text_indented),
        ]
        rows = []
        print(f"{LINES:,}-line file ({sides['after'].path.stat().st_size:,} bytes) in {base or tempfile.gettempdir()}")
        print(f"medians of the CPU time of {ops * rounds} calls each, in {rounds} interleaved rounds")
        for name, make in cases:
            medians = interleave({side: _sampler(make(obj)) for side, obj in sides.items()}, ops, rounds)
            ratio = medians["after"] / medians["before"]
            before_ms, after_ms = medians["before"] / 1000, medians["after"] / 1000
            print(f"  {name:<32} before {before_ms:7.2f} ms   after {after_ms:7.2f} ms   {ratio:5.2f}x")
            rows.append(
                Row(
                    "edit",
                    name,
                    medians["after"] / 1000,
                    "ms",
                    "<= 1.10x before",
                    verdict(ratio, "<=", 1.10),
                    f"before {medians['before'] / 1000:.2f} ms = {ratio:.2f}x",
                ),
            )
        assert sides["before"].path.read_bytes() == sides["after"].path.read_bytes()
    return summary(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--before", default="main", help="the git ref of the earlier implementation (default main)")
    args = parser.parse_args()
    run(quick=args.quick, before=args.before)


if __name__ == "__main__":
    main()
