"""The daemon's setting of the cyclic garbage collector: set while a daemon runs, put back after it."""

from __future__ import annotations

import gc
from pathlib import Path

from weald.runtime.daemon._gc import DAEMON_THRESHOLDS
from weald.runtime.daemon.config import parse_config
from weald.runtime.daemon.tree import Daemon


def test_a_running_daemon_collects_young_objects_less_often_and_puts_the_setting_back(tmp_path: Path) -> None:
    before = gc.get_threshold()
    assert before != DAEMON_THRESHOLDS
    first = Daemon(parse_config(f'[store]\npath = "{tmp_path / "a" / "store.db"}"\n')).start()
    try:
        assert gc.get_threshold() == DAEMON_THRESHOLDS
        second = Daemon(parse_config(f'[store]\npath = "{tmp_path / "b" / "store.db"}"\n')).start()
        second.shutdown()
        second.shutdown()  # a second stop changes nothing
        assert gc.get_threshold() == DAEMON_THRESHOLDS  # the first still runs
    finally:
        first.shutdown()
    assert gc.get_threshold() == before
