"""Fixtures for the end-to-end daemon tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess

# The loopback model server of tests/llm (`llm._server`) serves daemons here too.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

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
