"""Floods at a real daemon's front door: 2,000 clients under a 1,024-descriptor limit, 60 unfinished 15 MB lines.

See `rel_front` for each flood and its invariants; the reliability report
(``benchmarks/reliability.py``) runs the same floods and counts them.
"""

from __future__ import annotations

from pathlib import Path

from rel_front import FD_FLOOD_INVARIANTS, LINE_FLOOD_INVARIANTS, run_fd_flood, run_line_flood


def _failures(report: object) -> str:
    return "\n".join(f"{c.name}: {c.detail}" for c in report.failures)  # type: ignore[attr-defined]


def test_2000_clients_under_prlimit_1024_are_served_or_told_the_limit_and_the_daemon_comes_back(
    tmp_path: Path,
) -> None:
    # The default limits.max_connections (three quarters of 1,024) turns most of the flood away.
    report = run_fd_flood(tmp_path / "capped", clients=2000, nofile=1024)
    print(f"\nfd flood, default max_connections: {report}")
    assert sorted(c.name for c in report.checks) == sorted(FD_FLOOD_INVARIANTS)
    assert not report.failures, _failures(report)
    assert report.served == 768 - 1  # the first client holds one place
    assert report.refused == {"limits.max_connections": 2000 - report.served}


def test_2000_clients_past_the_descriptor_limit_are_refused_through_the_reserve_and_accepting_resumes(
    tmp_path: Path,
) -> None:
    # A connection limit above the descriptor limit: the daemon runs out of descriptors.
    report = run_fd_flood(tmp_path / "exhausted", clients=2000, nofile=1024, max_connections=100_000)
    print(f"\nfd flood, out of descriptors: {report}")
    assert sorted(c.name for c in report.checks) == sorted(FD_FLOOD_INVARIANTS)
    assert not report.failures, _failures(report)
    assert report.fd_exhaustions >= 1
    assert report.refused.get("RLIMIT_NOFILE", 0) > 500
    assert report.served > 500


def test_60_unfinished_15_mb_lines_stay_within_the_input_budget_and_rss_stays_bounded(tmp_path: Path) -> None:
    report = run_line_flood(tmp_path, connections=60, line_mb=15)
    print(f"\npartial-line flood: {report}")
    assert sorted(c.name for c in report.checks) == sorted(LINE_FLOOD_INVARIANTS)
    assert not report.failures, _failures(report)
    assert report.budget_mb == 64  # the default limits.max_buffered_bytes
    # 4 lines of 15 MB fit in 64 MB: while 5 or more grow, the one whose bytes go over is refused.
    assert report.held == 4
    assert report.refused == 56
