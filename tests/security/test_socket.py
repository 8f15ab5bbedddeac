"""The socket: what ``tests/daemon`` does not cover yet.

``tests/daemon/test_daemon.py`` checks the socket's mode (0600), its
directory's (0700) and that another user's client is refused. Here: what is
at the socket path already is never removed or followed unless it is a dead
daemon's socket, and a client only talks to a daemon of its own user.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess
from weald.runtime import WealdError
from weald.runtime.daemon.client import Client


def _serve(daemon: DaemonProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(daemon.socket)],
        env=daemon.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_regular_file_at_the_socket_path_is_left_alone_and_the_daemon_refuses_to_start(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path)
    daemon.socket.parent.mkdir(parents=True)
    daemon.socket.write_text("precious\n")
    done = _serve(daemon)
    assert done.returncode == 1
    assert "exists and is not a socket" in " ".join(done.stderr.split())
    assert daemon.socket.read_text() == "precious\n"


def test_a_symlink_at_the_socket_path_is_neither_followed_nor_removed(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    daemon.socket.parent.mkdir(parents=True)
    daemon.socket.symlink_to(victim)
    done = _serve(daemon)
    assert done.returncode == 1
    assert "exists and is not a socket" in " ".join(done.stderr.split())
    assert daemon.socket.is_symlink()
    assert victim.read_text() == "precious\n"


def test_a_new_socket_directory_is_owner_only_and_the_socket_0600_whatever_the_umask(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, socket_dir=tmp_path / "deep" / "run")
    old = os.umask(0)  # the loosest umask: what weald sets must not depend on it
    try:
        daemon.start()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(daemon.socket.parent).st_mode) == 0o700
        assert daemon.terminate() == 0
    finally:
        daemon.close()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may write to, as /tmp is."""
    path = Path(tempfile.mkdtemp(prefix="weald-shared-"))
    os.chmod(path, 0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_client_refuses_a_socket_served_by_another_user(shared_dir: Path) -> None:
    if os.getuid() != 0:
        pytest.fail("this test serves a socket as another uid, which needs root (the CI runs as root)")
    interpreter = Path("/usr/bin/python3")
    assert interpreter.exists(), "needs a system python3 that any user may run"
    path = shared_dir / "weald.sock"
    impostor = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.bind(sys.argv[1])\n"
        "s.listen(1)\n"
        "print('ready', flush=True)\n"
        "c, _ = s.accept()\n"
        "c.recv(65536)\n"
    )

    with subprocess.Popen(
        [str(interpreter), "-c", impostor, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        user=65534,  # nobody
        group=65534,
        extra_groups=[],
        cwd="/",
    ) as served:
        try:
            assert served.stdout is not None
            assert served.stdout.readline().strip() == "ready"
            with pytest.raises((WealdError, OSError)):
                Client.connect(path, timeout=5).close()
        finally:
            served.kill()
