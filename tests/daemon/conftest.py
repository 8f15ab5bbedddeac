"""Fixtures for the end-to-end daemon tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess

PERMISSIONS = """
[tools.permissions]
write_file = "ask"
edit_file = "ask"
shell = "ask"
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A running daemon in a subprocess; stopped with SIGTERM (and checked to exit 0) afterwards."""
    proc = DaemonProcess(tmp_path, extra_config=PERMISSIONS)
    proc.start()
    try:
        yield proc
        if proc.proc is not None:
            assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()
