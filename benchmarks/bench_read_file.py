"""Benchmark: read_file on a 10,000-line file, against plain ``open().read()``.

Measures, as medians over many runs:

- ``tag all``: reading the file through the sandbox and tagging all 10,000
  lines (``N:hh|``), the work of paging through the whole file, in one pass
  (decode + split + hash + format; no output limit);
- ``one call``: one ``read_file`` call as a model makes it (default offset and
  limit: the first page, cut at 50 KB), called directly;
- ``one call via invoke``: the same through `weald.tools.invoke` on trio,
  including schema validation and the worker-thread hop;
- ``all pages``: every call needed to page through the whole file;
- ``open().read()``: the floor: reading the file's text with no tool at all.

Each figure is printed with its ratio to ``open().read()``. The target for
``tag all`` and ``one call`` is 20 ms.

Run: ``python benchmarks/bench_read_file.py [lines]``; ``run_all.py`` calls `run`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
from weald.tools import SessionServices, ToolContext, ToolResult, invoke
from weald.tools._hashline import TextFile, format_lines
from weald.tools._ledger import ReadLedger
from weald.tools._sandbox import open_read
from weald.tools.read_file import read_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, summary, verdict

RUNS = 41


def median_ms(fn: Callable[[], object], runs: int = RUNS) -> float:
    fn()  # warm up
    timings = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        timings.append(time.perf_counter() - began)
    return statistics.median(timings) * 1000


def run(quick: bool = False, lines: int = 10_000) -> list[Row]:  # noqa: ARG001 - already quick
    banner(f"bench_read_file: read_file on a {lines:,}-line file")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "module.py"
        path.write_text(
            "".join(f"    result_{i} = transform(values[{i}], scale=2.5)  # step {i}\n" for i in range(lines)),
        )
        ctx = ToolContext(working_dir=root, session=SessionServices(output_dir=root / "out", ledger=ReadLedger()))

        def plain() -> object:
            with open(path, encoding="utf-8") as f:
                return f.read()

        def tag_all() -> object:
            f, _ = open_read(ctx, "module.py")
            with f:
                doc = TextFile.decode(f.read())
            return "\n".join(format_lines(doc.lines(), 1, escaped=False))

        def call_read_file(offset: int = 1) -> ToolResult:
            result = read_file.fn(ctx, path="module.py", offset=offset)
            assert isinstance(result, ToolResult)
            return result

        def one_call() -> object:
            return call_read_file()

        def one_call_invoke() -> object:
            return trio.run(invoke, read_file, ctx, {"path": "module.py"})

        def all_pages() -> object:
            offset = 1
            calls = 0
            while True:
                result = call_read_file(offset)
                calls += 1
                end = result.data["end"]
                if end >= result.data["total_lines"]:
                    return calls
                offset = end + 1

        size = path.stat().st_size
        pages = all_pages()
        first = call_read_file()
        base = median_ms(plain)
        rows = [
            ("open().read()", base),
            (f"tag all {lines} lines", median_ms(tag_all)),
            (f"one call ({first.data['end']} lines)", median_ms(one_call)),
            ("one call via invoke", median_ms(one_call_invoke)),
            (f"all pages ({pages} calls)", median_ms(all_pages, runs=11)),
        ]
    print(f"read_file on a {lines}-line file ({size} bytes), medians of {RUNS} runs")
    for name, ms in rows:
        print(f"  {name:<28} {ms:8.2f} ms   {ms / base:7.1f}x open().read()")
    out = [
        Row(
            "read_file",
            f"{name.split(' (')[0]} ({lines:,} lines)",
            ms,
            "ms",
            "<= 20 ms",
            verdict(ms, "<=", 20),
            f"= {ms / base:.0f}x open().read()",
        )
        for name, ms in rows[1:3]
    ]
    return summary(out)


def main() -> None:
    run(lines=int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)


if __name__ == "__main__":
    main()
