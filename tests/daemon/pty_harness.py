"""A command on a real pseudo-terminal: its controlling terminal, so that Ctrl-C (``\\x03``) is a real SIGINT."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import subprocess
import termios
import time
from collections.abc import Sequence
from pathlib import Path

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _take_terminal() -> None:
    """In the child, after its new session began: make the pty on stdin its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """``argv`` running on a pty, as a person's terminal runs it (stdin, stdout and stderr are the pty)."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str], cwd: Path) -> None:
        self.primary, secondary = pty.openpty()
        self.proc = subprocess.Popen(
            list(argv),
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_take_terminal,  # noqa: PLW1509 - the tests' own single-threaded child, before exec
        )
        os.close(secondary)
        self.seen = b""

    @property
    def text(self) -> str:
        """What the terminal showed so far, without colours, carriage returns and the echoed ``^C``."""
        text = _ESCAPES.sub("", self.seen.decode(errors="replace")).replace("\r", "")
        return text.replace("^C", "")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.primary], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.primary, 4096)
        except OSError:  # the child closed its side
            return False
        if not chunk:
            return False
        self.seen += chunk
        return True

    def read_until(self, marker: str, timeout: float = 60) -> None:
        """Read until ``marker`` is shown (or fail, saying what was)."""
        deadline = time.monotonic() + timeout
        while marker not in self.text:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {marker!r} on the terminal within {timeout} s; it showed:\n{self.text}"
            if not self._read(min(remaining, 0.5)) and marker not in self.text:
                raise AssertionError(f"the terminal closed before {marker!r}; it showed:\n{self.text}")

    def send(self, data: bytes) -> None:
        os.write(self.primary, data)

    def ctrl_c(self) -> None:
        """Type Ctrl-C: the terminal sends SIGINT to the command's process group."""
        self.send(b"\x03")

    def wait(self, timeout: float = 60) -> int:
        """Read what is left until the command exits; its exit status."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, f"the command did not exit within {timeout} s:\n{self.text}"
            self._read(0.1)
        while self._read(0.05) and select.select([self.primary], [], [], 0)[0]:
            pass
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        os.close(self.primary)
