"""Soak: many agents prompting continuously on a real daemon; its memory must level off.

Each agent's model is a scripted alias with a small context window, so every
agent's context is pruned and compacted as its conversation grows, while the
whole conversation goes to the store. One client thread per agent prompts it
in a loop until the time is up; a sampler records the daemon's resident
memory (``VmRSS``) and the prompts answered so far. Then:

- ``every_prompt_answered_ok``: each prompt got an ``ok`` result;
- ``history_complete``: each agent's stored history holds a prompt and an
  answer for every turn it answered (compaction summaries aside);
- ``contexts_within_window``: each agent's context, as ``agent.list``
  reports it, is within its model's window;
- ``rss_plateau``: the memory the second half of the run added is at most a
  quarter of what the first half added, plus `PLATEAU_SLACK_MB` (allocator
  and page-cache noise). Before agents bounded their context, memory grew
  by the same amount per prompt all along (about 2.2 KB a prompt).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import attrs
from daemon_harness import DaemonProcess
from rel_chaos import InvariantCheck
from rel_load import rss_mb

PLATEAU_SLACK_MB = 8.0
SOAK_INVARIANTS = ("every_prompt_answered_ok", "history_complete", "contexts_within_window", "rss_plateau")


@attrs.define
class SoakReport:
    """What the soak did, the memory curve, and the invariants."""

    agents: int
    seconds: float
    window: int
    prompts: int = 0
    failed: int = 0
    samples: list[tuple[float, int, float]] = attrs.field(factory=list)  # (seconds, prompts, RSS MB)
    compactions: int = 0
    largest_context: int = 0
    checks: list[InvariantCheck] = attrs.field(factory=list)

    def growth(self) -> tuple[float, float]:
        """MB the first and the second half of the run added (from the first sample)."""
        if len(self.samples) < 3:
            return 0.0, 0.0
        start, middle, end = self.samples[0][2], self.samples[len(self.samples) // 2][2], self.samples[-1][2]
        return middle - start, end - middle


def _script(path: Path, *, seconds: float, repeat: bool) -> None:
    """One short answer a turn; a weald that predates ``repeat`` gets enough turns instead."""
    count = 100 if repeat else int(seconds * 20) + 200
    answers = [{"text": f"Noted, item {i}."} for i in range(count)]
    path.write_text(json.dumps({"turns": answers, "repeat": True} if repeat else {"turns": answers}))


def run_soak(
    root: Path,
    *,
    agents: int = 100,
    seconds: float = 600.0,
    window: int = 4_000,
    interval: float = 10.0,
    prompt_chars: int = 400,
    python_path: str | None = None,
    windowless: bool = False,
) -> SoakReport:
    """Run the soak; ``windowless`` writes a config older weald understands (no window: 128k by default)."""
    root.mkdir(parents=True, exist_ok=True)
    script = root / "soak.json"
    _script(script, seconds=seconds, repeat=not windowless)
    alias = (
        f'[models.aliases]\nsoak = "scripted:{script}"\n'
        if windowless
        else f'[models.aliases.soak]\nmodel = "scripted:{script}"\ncontext_window = {window}\n'
    )
    d = DaemonProcess(root, extra_config=alias + "[limits]\nmax_agents = 20000\n")
    if python_path is not None:
        original = d.env

        def env() -> dict[str, str]:
            return {**original(), "PYTHONPATH": python_path}

        d.env = env  # type: ignore[method-assign]
    report = SoakReport(agents=agents, seconds=seconds, window=window)
    counts = [0] * agents
    failures = [0] * agents
    d.start()
    try:
        assert d.proc is not None
        pid = d.proc.pid
        with d.client() as c:
            for i in range(agents):
                c.call("agent.start", {"working_dir": str(d.project), "model": "soak", "agent_id": f"s{i}"})
        text = ("Please remember this line of the soak test. " * 20)[:prompt_chars]
        deadline = time.monotonic() + seconds

        def prompt(i: int) -> None:
            with d.client() as client:
                while time.monotonic() < deadline:
                    result = client.call("agent.prompt", {"agent_id": f"s{i}", "text": f"{i}: {text}"}, timeout=120)
                    if result["ok"]:
                        counts[i] += 1
                    else:
                        failures[i] += 1

        threads = [threading.Thread(target=prompt, args=(i,), daemon=True) for i in range(agents)]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        while time.monotonic() < deadline:
            report.samples.append((time.monotonic() - began, sum(counts), rss_mb(pid)))
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        for thread in threads:
            thread.join(180)
        report.samples.append((time.monotonic() - began, sum(counts), rss_mb(pid)))
        report.prompts = sum(counts)
        report.failed = sum(failures)
        report.checks.append(
            InvariantCheck("every_prompt_answered_ok", report.failed == 0, f"{report.failed} prompts failed")
        )
        if not windowless:
            _account(d, report, counts)
        first, second = report.growth()
        plateau = second <= first / 4 + PLATEAU_SLACK_MB
        report.checks.append(
            InvariantCheck("rss_plateau", plateau, f"first half +{first:.1f} MB, second half +{second:.1f} MB")
        )
    finally:
        if d.proc is not None:
            d.terminate()
        d.close()
    return report


def _account(d: DaemonProcess, report: SoakReport, counts: list[int]) -> None:
    """The history and context invariants, read through the daemon."""
    short: list[str] = []
    outside: list[str] = []
    with d.client() as c:
        rows: list[dict[str, Any]] = c.call("agent.list", timeout=120)
        for row in rows:
            context = row.get("context") or {}
            report.compactions += context.get("compactions", 0)
            report.largest_context = max(report.largest_context, context.get("tokens", 0))
            if context.get("tokens", 0) > context.get("context_window", 0):
                outside.append(f"{row['agent_id']}: {context}")
        for i, answered in enumerate(counts):
            state = c.call("debug_state", {"agent_id": f"s{i}", "events": 0, "messages": 0}, timeout=60)
            messages = state["message_count"] - state["context"]["compactions"]
            if messages != 2 * answered:
                short.append(f"s{i}: {messages} messages for {answered} turns")
    report.checks.append(InvariantCheck("history_complete", not short, "; ".join(short[:5])))
    report.checks.append(InvariantCheck("contexts_within_window", not outside, "; ".join(outside[:5])))
