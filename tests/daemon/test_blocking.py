"""Nothing a request names blocks the daemon's loop: FIFOs, devices and huge files, and bad configs at start.

Every daemon of the suite also runs with the loop guard (tests/conftest.py),
which fails a test whose daemon made a blocking file or socket call on its
loop thread; the tests here stall a read for real and time another client.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess
from weald.runtime.daemon.client import RPCCallError


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_script_that_is_a_fifo_is_refused_while_another_client_is_answered(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    fifo = tmp_path / "script.fifo"
    os.mkfifo(fifo)  # nobody writes to it: reading it would wait forever
    with daemon.client() as starter, daemon.client() as other:
        started = starter.request("agent.start", {"working_dir": str(daemon.project), "model": f"scripted:{fifo}"})
        began = time.monotonic()
        assert other.call("daemon.status", timeout=10)["agents"] == 0  # answered while the start is handled
        assert time.monotonic() - began < 10
        with pytest.raises(RPCCallError, match=rf"script {fifo} is a FIFO \(named pipe\), not a regular file"):
            started.get(timeout=30)


def test_a_device_or_a_huge_file_as_a_script_is_refused_at_once_and_memory_stays_flat(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    assert daemon.proc is not None
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse
    before = rss_bytes(daemon.proc.pid)
    with daemon.client() as c:
        with pytest.raises(RPCCallError, match="script /dev/zero is a character device, not a regular file"):
            c.call("agent.start", {"working_dir": str(daemon.project), "model": "scripted:/dev/zero"}, timeout=30)
        with pytest.raises(RPCCallError, match=rf"script {huge} is larger than 16,777,216 bytes"):
            c.call("agent.start", {"working_dir": str(daemon.project), "model": f"scripted:{huge}"}, timeout=30)
        assert c.call("agent.list") == []
    assert rss_bytes(daemon.proc.pid) < before + 64 * 1024 * 1024


def weald(tmp_path: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, WEALD_CONFIG=str(config))
    env.pop("WEALD_SOCKET", None)
    return subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "a." * 3000 + "a = 1\n",
            "a.a.a.a.(...): tables or arrays nest more than 32 levels deep, the most weald reads",
        ),
        ('[models]\ndefault = "scripted:/nonexistent"\n', "models.default: the script /nonexistent does not exist"),
    ],
)
@pytest.mark.parametrize("command", [("serve", "--socket", "weald.sock"), ("run", "hello")])
def test_a_bad_config_is_one_line_from_serve_and_run_not_a_traceback(
    tmp_path: Path, text: str, problem: str, command: tuple[str, ...]
) -> None:
    config = tmp_path / "weald.toml"
    config.write_text(text)
    done = weald(tmp_path, config, *command)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["invalid configuration (1 problem):", f"  {config}: {problem}"]
