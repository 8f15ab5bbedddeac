"""The daemon's end-to-end scenarios, unchanged, through a cluster's front: two nodes on PostgreSQL behind it.

The scenarios are test_daemon.py's own functions (imported: pytest runs them
here with this module's ``daemon`` fixture); test_daemon.py runs them against
a daemon on sqlite, test_daemon_postgres_e2e.py against a daemon on
PostgreSQL. Here ``daemon`` is a front: the scenarios talk to its socket, its
CLI and its replies exactly as to a daemon's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster
from daemon_harness import PERMISSIONS, DaemonProcess
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

SCENARIOS = (
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
    """The front of two nodes on a fresh database; stopped (and checked to exit 0) afterwards."""
    url = pg_cluster.url(pg_cluster.create_database())
    cluster = Cluster(tmp_path / "cluster", url, node_config=PERMISSIONS)
    try:
        cluster.start_nodes("n1", "n2")
        front = cluster.start_front()
        yield front
        assert front.terminate() == 0, front.log.read_text()
    finally:
        cluster.close()


def test_every_scenario_is_run_here() -> None:
    assert len(SCENARIOS) == len({s.__name__ for s in SCENARIOS}) == 9
