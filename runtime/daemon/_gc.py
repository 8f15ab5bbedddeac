"""The daemon's setting of CPython's cyclic garbage collector: larger generations.

A daemon's objects are mostly long-lived (sessions, their actors and
configuration) or freed by reference counting the moment they are done
(a turn's messages, events, tool executions: the actor core leaves no
cycle behind an ended actor). With CPython's defaults (700, 10, 10) the
young generation is collected every 700 net allocations, and while many
turns run at once their objects survive one collection after another
into the older generations, whose collections walk the whole daemon.
Measured in one process with 1,000 sessions, one turn each, all at once
(benchmarks/README.md, issue 29): 3.7-3.9 s of CPU for the 1,000 turns,
2.2 s of it in the collector, 2,152 young / 196 middle / 13 full
collections per 3 rounds, and nothing for any of them to free. With
``(50_000, 20, 20)``: 1.6-2.3 s, 0.36 s in the collector, 26 / 1 / 0.

Cyclic garbage still gets collected, later: at most 50,000 net
allocations after it was made. ``gc.freeze()`` was measured too (the
objects of the start moved out of every collection): little more CPU
saved, and whatever it froze that later becomes cyclic garbage (a session
stopped or woken leaves ~130 such objects) could never be freed; not used.

The setting is the process's: applied by the first daemon started in it,
put back by the last one stopped (tests run several in one process).
"""

from __future__ import annotations

import gc
import threading

__all__ = ["DAEMON_THRESHOLDS", "apply_collector_setting", "restore_collector_setting"]

DAEMON_THRESHOLDS: tuple[int, int, int] = (50_000, 20, 20)

_lock = threading.Lock()
_users = 0
_before: tuple[int, int, int] | None = None


def apply_collector_setting() -> None:
    """Set the daemon's thresholds (the first daemon of the process keeps what was there to put back)."""
    global _users, _before
    with _lock:
        if _users == 0:
            _before = gc.get_threshold()
            gc.set_threshold(*DAEMON_THRESHOLDS)
        _users += 1


def restore_collector_setting() -> None:
    """Put the thresholds back once the last daemon of the process has stopped."""
    global _users, _before
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and _before is not None:
            gc.set_threshold(*_before)
            _before = None
