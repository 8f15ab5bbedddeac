"""`weald acp` under real ACP clients: the PyPI SDK's (agent-client-protocol) and the npm SDK's.

The npm SDK (``@agentclientprotocol/sdk``) is installed once with npm into a
cache directory (``$WEALD_TEST_NPM_CACHE`` or ``~/.cache/weald-test-npm``);
missing npm, node or registry make the tests fail, naming what is missing.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NPM_SDK = "@agentclientprotocol/sdk"
NPM_SDK_VERSION = "2.4.0"
NODE_CLIENT = Path(__file__).with_name("acp_client.mjs")
_NPM_INSTALL_TIMEOUT = 300.0


def acp_command(socket: Path, model: str) -> list[str]:
    """The command line an editor would run: ``weald acp`` against the test daemon's socket."""
    return [sys.executable, "-m", "weald.runtime.daemon.cli", "acp", "--socket", str(socket), "--model", model]


def node_client_prefix() -> tuple[str, Path]:
    """``(node, prefix)``: the npm prefix holding the pinned ACP SDK and the test's client script."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.fail(f"the ACP tests need node and npm on PATH to install {NPM_SDK}@{NPM_SDK_VERSION}", pytrace=False)
    root = Path(os.environ.get("WEALD_TEST_NPM_CACHE") or Path.home() / ".cache" / "weald-test-npm")
    prefix = root / f"acp-sdk-{NPM_SDK_VERSION}"
    prefix.mkdir(parents=True, exist_ok=True)
    manifest = prefix / "node_modules" / NPM_SDK / "package.json"
    with open(prefix / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions install once
        if not _installed(manifest):
            try:
                done = subprocess.run(
                    [
                        npm,
                        "install",
                        "--prefix",
                        str(prefix),
                        "--no-audit",
                        "--no-fund",
                        f"{NPM_SDK}@{NPM_SDK_VERSION}",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=_NPM_INSTALL_TIMEOUT,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                pytest.fail(f"npm install of {NPM_SDK} took over {_NPM_INSTALL_TIMEOUT:g} s", pytrace=False)
            if done.returncode != 0 or not _installed(manifest):
                pytest.fail(f"npm install of {NPM_SDK}@{NPM_SDK_VERSION} failed:\n{done.stderr[-2000:]}", pytrace=False)
        # The script sits in the prefix so that its import finds the SDK in node_modules.
        shutil.copyfile(NODE_CLIENT, prefix / NODE_CLIENT.name)
    return node, prefix


def _installed(manifest: Path) -> bool:
    try:
        return json.loads(manifest.read_text())["version"] == NPM_SDK_VERSION
    except (OSError, ValueError, KeyError):
        return False
