"""Run every benchmark and print one summary table of figures, ratios and targets.

Runs, in order: ``bench_actors``, ``bench_tools``, ``bench_agent``,
``bench_grep``, ``bench_read_file``, ``bench_store``. Each prints its own
detailed tables as it goes; at the end comes the machine, then one table
with every figure, its ratio to the baselines, its target and PASS or MISS.

Run: ``python benchmarks/run_all.py [--quick] [--only actors,tools,...]``
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, machine_info, print_rows

BENCHMARKS = {
    "actors": "bench_actors",
    "tools": "bench_tools",
    "agent": "bench_agent",
    "grep": "bench_grep",
    "read_file": "bench_read_file",
    "store": "bench_store",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples everywhere")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    args = parser.parse_args()
    chosen = [b.strip() for b in args.only.split(",") if b.strip()] or list(BENCHMARKS)
    unknown = [b for b in chosen if b not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    began = time.monotonic()
    rows: list[Row] = []
    for name in chosen:
        module = importlib.import_module(BENCHMARKS[name])
        rows += module.run(quick=args.quick)
    info = machine_info()
    print("\n\nSUMMARY")
    print("=======")
    for key, value in info.items():
        print(f"{key:>9}: {value}")
    print(f"  elapsed: {time.monotonic() - began:.0f} s\n")
    print_rows(rows, with_bench=True)
    misses = [r for r in rows if r.ok is False]
    passes = [r for r in rows if r.ok]
    print(f"\n{len(passes)} PASS, {len(misses)} MISS")


if __name__ == "__main__":
    main()
