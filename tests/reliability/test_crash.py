"""kill -9: a real daemon killed at seeded random points of a write-heavy run loses nothing it acknowledged.

See `rel_crash` for the run and its invariants. Each test run uses three
kill points (plus a last clean stop), drawn from a seed that changes with
each test session unless ``WEALD_CRASH_SEED`` fixes it; a failure names its
seed and kill points, so it can be replayed.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

from rel_crash import CRASH_INVARIANTS, run_crash_cycles
from weald.runtime.daemon.client import Client, DaemonUnavailableError
from weald.runtime.testing import wait_until


def test_every_acknowledged_write_survives_kill_9_at_random_points_and_the_store_opens_cleanly(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("WEALD_CRASH_SEED", random.randrange(1 << 32)))
    report = run_crash_cycles(tmp_path, cycles=3, seed=seed)
    failures = "\n".join(f"{c.name}: {c.detail}" for c in report.failures)
    assert not report.failures, f"seed {seed} (WEALD_CRASH_SEED), kill points {report.kill_points}:\n{failures}"
    assert len(report.kill_points) == 3
    assert {c.name for c in report.checks} == set(CRASH_INVARIANTS)
    assert report.acked_turns > 0
    assert report.verified_writes > report.acked_turns


def test_a_client_whose_daemon_went_away_closes_its_socket(tmp_path: Path) -> None:
    path = tmp_path / "daemon.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(1)
        client = Client.connect(path)
        listener.accept()[0].close()  # the daemon goes away
        wait_until(lambda: _eof_seen(client), message="the client to see the connection end")
        client.close()
        try:
            assert client._sock.fileno() == -1
        finally:
            client._sock.close()


def _eof_seen(client: Client) -> bool:
    """The client's reader has seen the connection end: new calls are refused as on a closed client."""
    try:
        client.request("daemon.status")
    except DaemonUnavailableError as exc:
        return "is closed" in str(exc)  # not "broke": that is a send failing before the reader saw the end
    return False
