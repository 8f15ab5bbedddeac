"""kill -9 on PostgreSQL: a daemon whose store is a real PostgreSQL database, killed 30 times, loses nothing acknowledged.

The same run as test_crash (see `rel_crash`), the store in a database of the
test's PostgreSQL cluster: after each kill, before anything else touches it,
the store opens and every namespace reads back (``store_opens``), and every
acknowledged agent, turn and task is there; each restart (the same node id,
a new epoch) claims and restores every acknowledged agent.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from rel_crash import CRASH_INVARIANTS, run_crash_cycles


@pytest.mark.slow  # thirty daemon starts: 2-4 minutes on a loaded machine
def test_thirty_kill_9s_of_a_daemon_on_postgresql_lose_no_acknowledged_turn(tmp_path: Path, pg_cluster: Any) -> None:
    seed = int(os.environ.get("WEALD_CRASH_SEED", random.randrange(1 << 32)))
    url = pg_cluster.url(pg_cluster.create_database())
    report = run_crash_cycles(
        tmp_path, cycles=30, seed=seed, agents=3, per_cycle_new=1, store_url=url, kill_range=(3, 20)
    )
    failures = "\n".join(f"{c.name}: {c.detail}" for c in report.failures)
    assert not report.failures, f"seed {seed} (WEALD_CRASH_SEED), kill points {report.kill_points}:\n{failures}"
    assert len(report.kill_points) == 30
    assert {c.name for c in report.checks} == set(CRASH_INVARIANTS)
    assert report.acked_turns > 30
    assert report.verified_writes > report.acked_turns
