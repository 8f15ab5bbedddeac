"""Load: 1,000 concurrent clients on a real daemon; nothing is lost and its memory comes back.

See `rel_load` for the workload and what "near the baseline" means. The
requests per second are printed (run with ``-s`` to see them), not asserted.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

from rel_load import LOAD_INVARIANTS, load_problem_summary, run_load
from weald.runtime.daemon.client import Client


def test_a_thousand_concurrent_clients_get_every_answer_and_memory_returns_to_baseline(tmp_path: Path) -> None:
    report = run_load(tmp_path, clients=1000, seconds=20.0)
    print(f"\nload: {load_problem_summary(report)}")
    assert {c.name for c in report.checks} == set(LOAD_INVARIANTS)
    assert not report.failures, "\n".join(f"{c.name}: {c.detail}" for c in report.failures)
    assert report.answered > 1000
    assert report.acked_prompts > 0


def test_a_client_waits_while_the_daemons_accept_queue_is_full(tmp_path: Path) -> None:
    path = tmp_path / "busy.sock"
    done = threading.Event()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(0)
        listener.settimeout(0.05)
        queued = socket.socket(socket.AF_UNIX)
        queued.connect(str(path))  # fills the accept queue: the daemon is busy, not gone

        def busy_daemon() -> None:
            # Busy for 0.3 s, then it accepts what waits, until the test is done.
            busy_until = time.monotonic() + 0.3
            while not done.wait(0.01):
                if time.monotonic() < busy_until:
                    continue
                with contextlib.suppress(TimeoutError):
                    listener.accept()[0].close()

        thread = threading.Thread(target=busy_daemon, daemon=True)
        thread.start()
        try:
            with Client.connect(path, timeout=5):
                pass
        finally:
            done.set()
            queued.close()
            thread.join(5)
