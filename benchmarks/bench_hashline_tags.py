"""Benchmark: how often a stale line anchor would land on the wrong line, by tag alone and with the ledger.

Two measurements over real source files (Python's standard library, the C
headers in /usr/include, this repository's own code; each corpus that exists):

1. **The tag check alone.** A model holds the anchor ``N:hh`` of a line; an
   edit above it inserts or deletes 1-3 lines, so line ``N`` now holds another
   line. The anchor is falsely accepted when that other line has the same tag.
   Measured for the old tag (two hex digits of the stripped line, weald before
   issue 14), the current one (two hex digits of the whole line) and wider
   whole-line tags (three and four hex digits), split into lines with equal
   text (no tag width helps) and hash collisions.

2. **With the ledger**, through the real tools: read a file, replace 1-3
   lines at a random place with 0-3 new ones by anchor, then reuse the anchor
   of a line read before that edit (half the time one of the five lines just
   below the edit, which moved; half the time any line). Each outcome is counted: applied
   to the line the anchor named (it was followed through the edit), refused,
   or applied elsewhere (the wrong place; it must be 0).

Run: ``python benchmarks/bench_hashline_tags.py [--quick] [--trials N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import sysconfig
import tempfile
import zlib
from collections import Counter
from pathlib import Path

import trio
from weald.tools import SessionServices, ToolContext, invoke
from weald.tools._hashline import line_hash
from weald.tools._ledger import ReadLedger
from weald.tools.edit_file import edit_file
from weald.tools.read_file import read_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, summary

REPO = Path(__file__).resolve().parents[1]


def corpora() -> dict[str, list[Path]]:
    found = {
        "python stdlib": sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")),
        "C headers": sorted(Path("/usr/include").glob("*.h")),
        "weald": sorted(p for d in ("runtime", "tools", "supervisors") for p in (REPO / d).rglob("*.py")),
    }
    return {name: files for name, files in found.items() if files}


def _lines(path: Path) -> list[str] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.split("\n")
    return lines if len(lines) >= 40 else None


def _tag(line: str, *, bits: int, strip: bool) -> int:
    return zlib.crc32((line.strip() if strip else line).encode("utf-8", "surrogatepass")) & ((1 << bits) - 1)


TAGS = {
    "stripped, 2 hex (before)": (8, True),
    "whole line, 2 hex (now)": (8, False),
    "whole line, 3 hex": (12, False),
    "whole line, 4 hex": (16, False),
}


def tag_alone(files: list[Path], samples: int, rng: random.Random) -> tuple[int, int, Counter[str]]:
    """Stale anchors after a shift of 1-3 lines: (trials, equal text, false accepts per tag)."""
    trials = equal = 0
    accepted: Counter[str] = Counter()
    for path in files:
        lines = _lines(path)
        if lines is None:
            continue
        for _ in range(samples):
            n = rng.randrange(10, len(lines) - 10)
            shift = rng.choice((-3, -2, -1, 1, 2, 3))
            old, now = lines[n], lines[n - shift]  # line n now holds what was line n - shift
            trials += 1
            equal += old == now
            for name, (bits, strip) in TAGS.items():
                accepted[name] += _tag(old, bits=bits, strip=strip) == _tag(now, bits=bits, strip=strip)
    return trials, equal, accepted


def with_ledger(files: list[Path], trials: int, rng: random.Random) -> Counter[str]:
    """Reuse of an anchor read before an edit, through read_file and edit_file: outcomes counted."""
    outcomes: Counter[str] = Counter()
    candidates = [(p, lines) for p in files if (lines := _lines(p)) is not None and len(lines) <= 3000]
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        root = Path(tmp)
        for trial in range(trials):
            _, lines = rng.choice(candidates)
            if lines[-1] == "":
                lines = lines[:-1]
            ctx = ToolContext(working_dir=root, session=SessionServices(output_dir=root / ".out", ledger=ReadLedger()))
            name = f"f{trial}.txt"
            (root / name).write_text("".join(line + "\n" for line in lines))
            assert trial_read(ctx, name, len(lines))
            first = rng.randrange(1, len(lines) - 5)
            last = first + rng.randrange(0, 3)
            new = [f"new line {trial}.{i}" for i in range(rng.randrange(0, 4))]
            arguments: dict[str, object] = {
                "path": name,
                "start": f"{first}:{line_hash(lines[first - 1])}",
                "through": f"{last}:{line_hash(lines[last - 1])}",
            }
            if new:
                arguments["new_string"] = "".join(line + "\n" for line in new)
            assert trio.run(invoke, edit_file, ctx, arguments).ok
            current = [*lines[: first - 1], *new, *lines[last:]]
            # The stale anchor: any line read before the edit. Where it points now:
            if rng.random() < 0.5:  # just below the edit, where the lines moved (the case)
                stale = min(last + rng.randrange(1, 6), len(lines))
            else:
                stale = rng.randrange(1, len(lines) + 1)
            if first <= stale <= last:
                meant = None  # the edit replaced it
            else:
                meant = stale if stale < first else stale + len(new) - (last - first + 1)
            tag = line_hash(lines[stale - 1])
            if meant != stale and stale <= len(current) and line_hash(current[stale - 1]) == tag:
                outcomes["(a tag check alone: the wrong line)"] += 1
            before = (root / name).read_text()
            anchor = f"{stale}:{tag}"
            result = trio.run(invoke, edit_file, ctx, {"path": name, "start": anchor, "new_string": "EDITED\n"})
            if not result.ok:
                outcomes["refused"] += 1
                assert (root / name).read_text() == before
                continue
            after = (root / name).read_text().split("\n")[:-1]
            if meant is not None and after == [*current[: meant - 1], "EDITED", *current[meant:]]:
                outcomes["applied at the named line" + (" (followed)" if meant != stale else "")] += 1
            else:
                outcomes["applied elsewhere (wrong place)"] += 1
            (root / name).unlink()
    return outcomes


def trial_read(ctx: ToolContext, name: str, total: int) -> bool:
    offset = 1
    while offset <= total:
        result = trio.run(invoke, read_file, ctx, {"path": name, "offset": offset})
        if not result.ok:
            return False
        offset = result.data["end"] + 1
    return True


def run(quick: bool = False, trials: int | None = None) -> list[Row]:
    banner("bench_hashline_tags: stale anchors, by tag alone and with the ledger")
    rng = random.Random(14)
    samples = 40 if quick else 200
    rows: list[Row] = []
    pooled: list[Path] = []
    for corpus, files in corpora().items():
        pooled += files
        count, equal, accepted = tag_alone(files, samples, rng)
        print(f"\n{corpus}: {len(files)} files, {count:,} stale anchors after a shift of 1-3 lines")
        print(f"  lines with equal text at both places (no tag can tell them apart): {equal / count:.2%}")
        for name in TAGS:
            rate = accepted[name] / count
            print(f"  {name:<26} false accepts {rate:7.2%}   (collisions {(accepted[name] - equal) / count:6.2%})")
            rows.append(Row("tags", f"{corpus}: {name}", round(rate * 100, 2), "%", note="tag check alone"))
    n = trials or (100 if quick else 1000)
    outcomes = with_ledger(pooled, n, rng)
    print(f"\nwith the ledger, {n} stale anchors reused after an edit by anchor (real read_file / edit_file):")
    for outcome, k in sorted(outcomes.items()):
        print(f"  {outcome:<40} {k:6d}  {k / n:7.2%}")
    wrong = outcomes["applied elsewhere (wrong place)"]
    rows.append(Row("tags", "with the ledger: wrong place", round(wrong / n * 100, 2), "%", "== 0", wrong == 0))
    return summary(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--trials", type=int, help="anchors reused through the real tools (default 1000)")
    args = parser.parse_args()
    run(quick=args.quick, trials=args.trials)


if __name__ == "__main__":
    main()
