"""``weald observe`` keeps the observer's token off the browser's command line.

Every user of the machine can read a process's command line
(``/proc/PID/cmdline``), and the token lets whoever has it answer permission
requests and read every history. The browser is handed a redirect file only
this user can read, as Jupyter does. Checked with a stub browser (``$BROWSER``)
that holds still while its command line is read, and with a real headless
Chromium that follows the redirect to the observer's page.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from daemon_harness import DaemonProcess, serving
from weald.runtime import scan_proc
from weald.runtime.testing import wait_until


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with serving(tmp_path_factory.mktemp("observed"), "--http", "127.0.0.1:0") as proc:
        yield proc


def observer_url(daemon: DaemonProcess) -> str:
    with daemon.client() as client:
        url: str = client.call("observer.url")["url"]
    return url


def token_of(url: str) -> str:
    return urlsplit(url).query.removeprefix("token=")


def observe(daemon: DaemonProcess, browser: str, runtime: Path) -> subprocess.Popen[str]:
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**daemon.env(), "BROWSER": browser, "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("DISPLAY", None)
    return subprocess.Popen(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "observe"],
        env=env,
        cwd=daemon.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class CmdlineWatch:
    """Every process's command line, read again and again while it runs: who showed ``secret``."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()
        self.seen: set[int] = set()
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cmdline-watch", daemon=True)

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            found = scan_proc("cmdline", lambda cmdline: self._secret in cmdline)
            assert found is not None, "/proc cannot be read"
            self.seen.update(found)
            self.scans += 1
            time.sleep(0.01)


STUB = """#!/bin/sh
printf '%s\\n' "$@" > "{args}"
echo $$ > "{pid}"
while [ ! -e "{release}" ]; do sleep 0.05; done
"""


def test_the_browser_gets_a_private_redirect_file_and_never_the_token(observed: DaemonProcess, tmp_path: Path) -> None:
    url = observer_url(observed)
    token = token_of(url)
    assert len(token) > 20
    pid_file, args_file, release = tmp_path / "pid", tmp_path / "args", tmp_path / "release"
    stub = tmp_path / "browser.sh"
    stub.write_text(STUB.format(args=args_file, pid=pid_file, release=release))
    stub.chmod(0o755)
    runtime = tmp_path / "run"
    with CmdlineWatch(token) as watch:
        proc = observe(observed, f"{stub} %s", runtime)
        try:
            wait_until(pid_file.exists, timeout=60, message="the stub browser to start")
            pid = int(pid_file.read_text())
            wait_until(lambda: watch.scans > 3, timeout=30, message="/proc to be read while the browser runs")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert token.encode() not in cmdline
            release.touch()
            out, err = proc.communicate(timeout=60)
        finally:
            release.touch()  # the stub browser ends, whatever happened
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert watch.seen == set(), f"processes with the token on their command line: {watch.seen}"
    assert proc.returncode == 0, err
    assert out == ""
    assert err.strip() == f"opened the observer in a browser: {url.split('?')[0]}"  # the token is not printed
    (given,) = args_file.read_text().splitlines()
    page = Path(urlsplit(given).path)
    assert given == page.as_uri()
    assert page == runtime / "weald" / "observe.html"
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    assert stat.S_IMODE(page.parent.stat().st_mode) == 0o700
    assert page.stat().st_uid == os.getuid()
    assert f"location.replace({json.dumps(url)})" in page.read_text()
    assert not [p for p in page.parent.iterdir() if p.name != "observe.html"]  # no temporary left over


def test_a_redirect_directory_open_to_others_is_not_used(observed: DaemonProcess, tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    (runtime / "weald").mkdir(parents=True)
    (runtime / "weald").chmod(0o777)
    runtime.chmod(0o700)
    proc = observe(observed, f"{tmp_path / 'never-run.sh'} %s", runtime)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "no private file for the browser to open" in err
    assert "is not a directory only this user can use" in err
    assert out == observer_url(observed) + "\n"  # printed instead, for the user to open
    assert list((runtime / "weald").iterdir()) == []


def test_a_real_headless_chromium_follows_the_redirect_to_the_observer_page(
    observed: DaemonProcess, tmp_path: Path, chromium: Path
) -> None:
    token = token_of(observer_url(observed))
    browser = (
        f"{chromium} --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir={tmp_path / 'profile'} "
        "--virtual-time-budget=10000 --dump-dom %s"
    )
    with CmdlineWatch(token) as watch:
        proc = observe(observed, browser, tmp_path / "run")
        try:
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert proc.returncode == 0, err
    assert watch.scans > 3
    assert watch.seen == set(), f"processes with the token on their command line: {watch.seen}"
    # What Chromium shows after the redirect is the observer's own page, let in with the token.
    assert 'id="daemon-info"' in out, out[-2000:]
