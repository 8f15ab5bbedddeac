"""Memory over time: N agents prompting continuously on a real daemon, and the daemon's RSS curve.

A real ``weald serve``; each of ``--agents`` agents (default 100) has a
scripted model behind an alias with a small context window (``--window``
tokens, default 4,000), so its context is pruned and compacted as its
conversation grows; one client thread per agent prompts it (``--prompt-chars``
characters a prompt) in a loop for ``--seconds`` (default 600). Every
``--interval`` seconds: the prompts answered so far and the daemon's VmRSS.

Printed: the curve, and how much memory each half of the run added, per
1,000 prompts. A plateau is a second half that adds little; before agents
bounded their context in memory, each prompt added the same (~2.2 KB) for
as long as the run lasted.

``--baseline PATH`` runs the same soak first against another checkout
(``PYTHONPATH=PATH``, as in benchmarks/README.md), with a config it
understands (no window), side by side.

Run: ``python benchmarks/bench_soak.py [--agents 100] [--seconds 600] [--window 4000] [--baseline /tmp/orig/pkg]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1] / "tests"
for _directory in (_TESTS / "reliability", _TESTS / "daemon"):
    sys.path.insert(0, str(_directory))

from rel_soak import SoakReport, run_soak  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


def curve(title: str, report: SoakReport) -> Table:
    table = Table(title=title)
    for column in ("seconds", "prompts", "RSS MB"):
        table.add_column(column, justify="right")
    for seconds, prompts, rss in report.samples:
        table.add_row(f"{seconds:.0f}", f"{prompts:,}", f"{rss:.1f}")
    return table


def halves(report: SoakReport) -> str:
    samples = report.samples
    middle = samples[len(samples) // 2]
    first_mb, second_mb = report.growth()
    first_prompts = max(1, middle[1] - samples[0][1])
    second_prompts = max(1, samples[-1][1] - middle[1])
    return (
        f"first half: +{first_mb:.1f} MB over {first_prompts:,} prompts "
        f"({first_mb * 1024 * 1024 / first_prompts:.0f} B/prompt); "
        f"second half: +{second_mb:.1f} MB over {second_prompts:,} prompts "
        f"({second_mb * 1024 * 1024 / second_prompts:.0f} B/prompt)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--window", type=int, default=4_000)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--prompt-chars", type=int, default=400)
    parser.add_argument("--baseline", help="PYTHONPATH of another checkout to soak first, side by side")
    args = parser.parse_args()
    console = Console(width=140, highlight=False)
    console.print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    runs: list[tuple[str, SoakReport]] = []
    common = {
        "agents": args.agents,
        "seconds": args.seconds,
        "interval": args.interval,
        "prompt_chars": args.prompt_chars,
    }
    with tempfile.TemporaryDirectory(prefix="weald-soak-") as tmp:
        if args.baseline:
            baseline = run_soak(Path(tmp) / "baseline", python_path=args.baseline, windowless=True, **common)
            runs.append((f"baseline ({args.baseline})", baseline))
        now = run_soak(Path(tmp) / "now", window=args.window, **common)
        runs.append((f"this checkout, window {args.window:,} tokens", now))
    for title, report in runs:
        console.print(curve(title, report))
        console.print(halves(report))
        console.print(
            f"prompts {report.prompts:,} ({report.prompts / report.seconds:.0f}/s), failed {report.failed}, "
            f"compactions {report.compactions:,}, largest context {report.largest_context:,} tokens"
        )
        for check in report.checks:
            console.print(f"  {check.name}: {'held' if check.held else 'BROKEN'} {check.detail}", markup=False)
    console.print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


if __name__ == "__main__":
    main()
