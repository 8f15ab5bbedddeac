"""The loop guard and the bounded file reader: blocking calls on the loop thread are caught and named."""

from __future__ import annotations

import linecache
import os
import socket
import traceback
from pathlib import Path
from typing import Any

import pytest
import trio
from weald.runtime import ActorSystem, UnreadableFileError, check_regular_file, read_regular_file
from weald.runtime.testing import take_loop_guard_violations

# The suite installs the guard (tests/conftest.py) and fails a test that leaves
# violations behind; these tests take what they provoke themselves.


def test_a_file_read_on_the_loop_thread_is_caught_with_the_line_that_asked(system: ActorSystem, tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("x")

    async def read_on_the_loop() -> str:
        return path.read_text()  # the mistake the guard is for

    assert system.loop.run(read_on_the_loop) == "x"
    (caught,) = take_loop_guard_violations()
    assert caught.event == "open"
    assert caught.target == repr(str(path))
    assert caught.site.startswith(f"{__file__}:")
    assert caught.site.endswith("in read_on_the_loop")


def test_what_cannot_block_is_not_caught(system: ActorSystem, tmp_path: Path) -> None:
    source = tmp_path / "failing_module.py"
    source.write_text("def fail():\n    raise ValueError('logged')\n")
    namespace: dict[str, Any] = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    linecache.checkcache(str(source))

    async def harmless() -> None:
        await trio.to_thread.run_sync((tmp_path / "f").write_text, "in a worker thread")
        os.close(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))  # a path lookup
        with open("/proc/self/stat", "rb") as f:  # noqa: ASYNC230 - answered by the kernel, no device
            f.read()
        os.listdir("/proc")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", 9))
        except OSError:
            pass
        finally:
            sock.close()
        socket.getaddrinfo("127.0.0.1", 80)  # an address: nothing to look up
        # An error logged with its traceback: the source lines it shows are read
        # (once) from a module not read before; the error is the news, not that read.
        try:
            namespace["fail"]()
        except ValueError:
            text = "".join(traceback.format_exc())
        assert "raise ValueError('logged')" in text

    system.loop.run(harmless)
    assert take_loop_guard_violations() == []


def test_a_blocking_connect_and_a_directory_listing_on_the_loop_are_caught(system: ActorSystem, tmp_path: Path) -> None:
    async def blocking() -> None:
        os.listdir(tmp_path)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, pytest.raises(OSError):
            sock.connect(str(tmp_path / "nobody.sock"))

    system.loop.run(blocking)
    assert sorted(v.event for v in take_loop_guard_violations()) == ["os.listdir", "socket.connect"]


def test_a_regular_file_is_read_whole_within_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_bytes(b"x" * 1000)
    assert read_regular_file(path, max_bytes=1000) == b"x" * 1000
    check_regular_file(path, max_bytes=1000)
    with pytest.raises(UnreadableFileError, match=r"^script .* is larger than 999 bytes, the most accepted \(1,000"):
        read_regular_file(path, max_bytes=999, what="script")


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: os.mkfifo(p) or p, "a FIFO (named pipe)"),
        (lambda p: Path("/dev/zero"), "a character device"),
        (lambda p: p.mkdir() or p, "a directory"),
    ],
)
def test_anything_but_a_regular_file_is_refused_at_once_by_name(tmp_path: Path, make, kind: str) -> None:
    path = make(tmp_path / "thing")
    with pytest.raises(UnreadableFileError, match=f"^script {path} is {kind.replace('(', '.').replace(')', '.')}"):
        read_regular_file(path, max_bytes=1 << 20, what="script")
    with pytest.raises(UnreadableFileError, match="not a regular file"):
        check_regular_file(path, max_bytes=1 << 20)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UnreadableFileError, match=f"^cannot read script {tmp_path}/nope: No such file or directory$"):
        read_regular_file(tmp_path / "nope", max_bytes=10, what="script")
    with pytest.raises(UnreadableFileError, match=f"^script {tmp_path}/nope does not exist$"):
        check_regular_file(tmp_path / "nope", max_bytes=10, what="script")
