"""Fixtures for the reliability suite: chaos runs, kill -9 cycles, fuzzing and load against a real daemon.

The suite reuses helpers of other test directories (the supervision model
and strategies in ``tests/supervisors``, `DaemonProcess` in ``tests/daemon``)
by putting those directories on ``sys.path``, as pytest's prepend import mode
does for each test directory; module basenames are unique across the tree,
so nothing is shadowed. Helpers of this directory are named ``rel_*``.
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for _directory in (_TESTS / "supervisors", _TESTS / "daemon", Path(__file__).resolve().parent):
    if str(_directory) not in sys.path:
        sys.path.insert(0, str(_directory))
