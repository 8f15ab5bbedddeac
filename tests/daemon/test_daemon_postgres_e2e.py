"""The daemon's end-to-end scenarios, unchanged, against a daemon whose store is a PostgreSQL database.

The same scenarios as test_cluster_e2e.py (test_daemon.py's own functions),
here against one daemon on a fresh database of the test's PostgreSQL server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import PERMISSIONS, DaemonProcess
from test_cluster_e2e import SCENARIOS
from test_daemon import (
    test_a_client_that_disconnects_mid_turn_loses_nothing,
    test_a_permission_request_is_answered_by_the_client,
    test_abort_stops_a_running_turn,
    test_bad_input_gets_clear_errors_and_the_connection_carries_on,
    test_debug_state_and_tasks_through_the_api,
    test_events_arrive_as_notifications,
    test_start_prompt_and_read_the_history_over_the_socket,
    test_the_cli_commands_work_against_the_daemon,
    test_the_tree_shows_every_node_with_kind_status_restarts_and_mailbox,
)

HERE = (
    test_a_client_that_disconnects_mid_turn_loses_nothing,
    test_a_permission_request_is_answered_by_the_client,
    test_abort_stops_a_running_turn,
    test_bad_input_gets_clear_errors_and_the_connection_carries_on,
    test_debug_state_and_tasks_through_the_api,
    test_events_arrive_as_notifications,
    test_start_prompt_and_read_the_history_over_the_socket,
    test_the_cli_commands_work_against_the_daemon,
    test_the_tree_shows_every_node_with_kind_status_restarts_and_mailbox,
)


@pytest.fixture
def daemon(tmp_path: Path, pg_cluster: Any) -> Iterator[DaemonProcess]:
    """A daemon on a fresh database; stopped (and checked to exit 0) afterwards."""
    url = pg_cluster.url(pg_cluster.create_database())
    proc = DaemonProcess(tmp_path, store=f'url = {json.dumps(url)}\nnode_id = "solo"', extra_config=PERMISSIONS)
    proc.start()
    try:
        yield proc
        if proc.proc is not None:
            assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


def test_the_same_scenarios_run_here_as_through_a_front() -> None:
    assert {s.__name__ for s in HERE} == {s.__name__ for s in SCENARIOS}
