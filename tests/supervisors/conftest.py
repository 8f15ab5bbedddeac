"""Fixtures shared by the supervisor tests."""

from __future__ import annotations

import pytest
from sup_workers import JOURNAL, FakeClock
from weald.supervisors import SupervisorBase


@pytest.fixture(autouse=True)
def _clear_journal() -> None:
    JOURNAL.clear()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(SupervisorBase, "_clock", fake)
    return fake
