"""Fixtures for the security suite: the real tool runner in an actor system, and a real daemon.

``project`` is the working directory; ``outside`` (next to it) holds
``secret.txt``, which no tool may read, list, change or run in. Helpers of
this directory are named ``sec_*``; `DaemonProcess` comes from
``tests/daemon``, `FakeOpenAI` from ``tests/runtime`` and the attack runs
from ``tests/reliability`` (``rel_guard``), whose directories
are put on ``sys.path`` here as pytest's prepend import mode would.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parents[1]
for _directory in (_TESTS / "daemon", _TESTS / "runtime", _TESTS / "reliability", Path(__file__).resolve().parent):
    if str(_directory) not in sys.path:
        sys.path.insert(0, str(_directory))

from sec_runner import SECRET  # noqa: E402 - importable once the directory is on sys.path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    (path / "notes.txt").write_text("alpha\nbeta\n")
    (path / "sub").mkdir()
    (path / "sub" / "inner.txt").write_text("inner\n")
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text(SECRET)
    return path
