"""What counts as a process left running after a command: real processes, read from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from weald.runtime.testing import wait_until
from weald.tools._process import _dying, leftover_processes


def test_a_live_member_of_the_group_is_left_running_and_a_killed_one_is_not() -> None:
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert not _dying(child.pid)
        assert leftover_processes(child.pid, session=True) == [child.pid]
        os.kill(child.pid, signal.SIGKILL)
        # From the kill on (pending, exiting, then a zombie not yet reaped) it is not left running.
        assert leftover_processes(child.pid, session=True) == []
        stat = Path(f"/proc/{child.pid}/stat")
        wait_until(lambda: stat.read_bytes().rpartition(b")")[2].split()[0] == b"Z")
        assert _dying(child.pid)
    finally:
        child.kill()
        child.wait()
    assert _dying(child.pid)  # reaped: gone
