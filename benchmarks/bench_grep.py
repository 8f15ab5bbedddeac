"""The grep tool against ripgrep run directly, over a tree of 10,000 files.

Builds a project of 10,000 source-like files (100 directories, ~40 lines
each, a .gitignore) in a temporary directory, then times, for a few
searches:

- ``rg`` run directly (``subprocess.run``, output captured) with the same
  file selection the tool uses (``--no-require-git --hidden --glob '!.git'``)
  and its ordinary ``-n`` text output;
- the ``grep`` tool called through ``weald.tools.invoke`` (argument
  validation, the sandbox check, ``rg --json``, decoding and formatting).

Each is run ``--runs`` times, interleaved, after a warm-up; the medians and
their ratio are printed. The target is a ratio of at most 1.2.

Run: ``python benchmarks/bench_grep.py [--files 10000] [--runs 25]``; ``run_all.py``
calls `run`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from weald.tools import ToolContext, invoke
from weald.tools._process import RIPGREP_FILTERS, find_ripgrep
from weald.tools.grep import grep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, summary, verdict

WORDS = ("alpha", "beta", "gamma", "delta", "value", "result", "index", "count", "item", "node", "parent", "child")

SEARCHES = [
    ("rare (1 file in 500 has it)", r"RARE_MARKER_\d+"),
    ("some (1 file in 20; 500 lines; max_results cuts it)", r"def handle_\w+"),
    ("none", r"no_such_identifier_anywhere"),
    ("dense (every line: 400,000 matching lines)", r"compute"),
]


def build_tree(root: Path, files: int) -> None:
    rng = random.Random(42)
    (root / ".gitignore").write_text("build/\n*.log\n")
    dirs = 100
    for d in range(dirs):
        (root / f"pkg{d:03}").mkdir()
    for i in range(files):
        lines = []
        for n in range(40):
            a, b = rng.choice(WORDS), rng.choice(WORDS)
            lines.append(f"    {a}_{n} = compute({b}, {n})  # line {n} of file {i}")
        if i % 20 == 0:
            lines[10] = f"def handle_{i}(request):"
        if i % 500 == 0:
            lines[20] = f"    RARE_MARKER_{i} = True"
        (root / f"pkg{i % dirs:03}" / f"mod{i:05}.py").write_text("\n".join(lines) + "\n")


def time_rg(rg: str, root: Path, pattern: str) -> float:
    argv = [rg, *RIPGREP_FILTERS, "-n", "--regexp", pattern, "--", "."]
    started = time.perf_counter()
    subprocess.run(argv, cwd=root, capture_output=True, check=False)
    return time.perf_counter() - started


async def time_tool(ctx: ToolContext, pattern: str) -> float:
    started = time.perf_counter()
    result = await invoke(grep, ctx, {"pattern": pattern})
    elapsed = time.perf_counter() - started
    assert result.ok, result.output
    return elapsed


def run(quick: bool = False, files: int = 10_000, runs: int | None = None) -> list[Row]:
    runs = runs if runs is not None else (9 if quick else 25)
    banner(f"bench_grep: the grep tool against rg run directly, {files:,} files")
    rg = find_ripgrep()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="weald-bench-grep-") as tmp:
        root = Path(tmp)
        print(f"building {files:,} files in {root} ...")
        build_tree(root, files)
        ctx = ToolContext(working_dir=root)
        print(f"{'search':55} {'rg direct':>11} {'grep tool':>11} {'ratio':>7}")
        for label, pattern in SEARCHES:
            for _ in range(3):  # warm the page cache and both code paths
                time_rg(rg, root, pattern)
                trio.run(time_tool, ctx, pattern)
            direct, tool = [], []
            for _ in range(runs):
                direct.append(time_rg(rg, root, pattern))
                tool.append(trio.run(time_tool, ctx, pattern))
            d, t = statistics.median(direct), statistics.median(tool)
            print(f"{label:55} {d * 1000:9.1f}ms {t * 1000:9.1f}ms {t / d:7.2f}")
            rows.append(
                Row(
                    "grep",
                    f"grep / rg, {label.split(' (')[0]}",
                    t / d,
                    "x",
                    "<= 1.2x",
                    verdict(t / d, "<=", 1.2),
                    f"tool {t * 1000:.1f} ms, rg {d * 1000:.1f} ms",
                )
            )
    return summary(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=25)
    args = parser.parse_args()
    run(files=args.files, runs=args.runs)


if __name__ == "__main__":
    main()
