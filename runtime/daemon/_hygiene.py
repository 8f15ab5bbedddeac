"""What a daemon does to its own process before it serves: no secrets, no strays, and a sandbox that says so.

At start (`prepare_process`, before anything is spawned):

- every secret-looking variable leaves the daemon's environment
  (`weald.runtime.scrub_environ`); providers and MCP servers read what the
  configuration names through `weald.runtime.environ_value`;
- the children it spawns are marked as this daemon's, on this state
  directory (`weald.runtime.set_process_owner`);
- whether shell commands will run in the OS sandbox is decided once: the
  mode configured (``[tools.shell] sandbox``) and whether bubblewrap works
  here. When it does not and the mode is ``auto``, a loud warning says so,
  once per process, with how to enable it.

Then, once the bus runs and before MCP servers start (`stop_leftovers`),
processes that a previous daemon process on the same state directory
started and could not stop (it was killed) are stopped and reported in a
``daemon.leftovers_stopped`` event.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import attrs
from weald.runtime import ActorSystem, scrub_environ, set_process_owner, stop_leftover_processes
from weald.runtime.daemon.config import Config
from weald.tools import SANDBOX_ENABLE_HINT, sandbox_status

__all__ = ["SandboxReport", "prepare_process", "stop_leftovers"]

logger = logging.getLogger("weald.runtime")

_warned_lock = threading.Lock()
_warned = False


@attrs.frozen
class SandboxReport:
    """How shell commands of this daemon run, for ``daemon.status``, ``weald tree`` and ``weald doctor``.

    Attributes:
        mode: ``[tools.shell] sandbox``: ``auto``, ``required`` or ``off``.
        active: True when commands run in the bubblewrap sandbox.
        network: ``[tools.shell] network``: true, false, or the patterns allowed.
        bwrap: the bubblewrap program and its version, when found.
        reason: why the sandbox is not active (None when it is).
        warning: the warning given at start, if any.
    """

    mode: str
    active: bool
    network: Any
    bwrap: str | None = None
    reason: str | None = None
    warning: str | None = None

    def describe(self) -> str:
        """One line: ``bwrap`` (and the network), or why not."""
        if self.active:
            network = "network on" if self.network is True else "network off" if not self.network else "network: some"
            return f"bwrap ({network})"
        if self.mode == "off":
            return "off (process groups only)"
        if self.mode == "required":
            return f"required but unavailable: shell refuses to run ({self.reason})"
        return f"unavailable: process groups only ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the JSON-RPC answers."""
        network = list(self.network) if isinstance(self.network, list | tuple) else self.network
        return {**attrs.asdict(self), "network": network, "summary": self.describe()}


def prepare_process(config: Config, state_dir: Path) -> tuple[SandboxReport, list[str]]:
    """Scrub the environment, claim the state directory for marks, learn the sandbox; blocks briefly.

    Returns:
        The sandbox report and the names of the variables scrubbed.
    """
    scrubbed = scrub_environ()
    set_process_owner(state_dir)
    return _sandbox_report(config), scrubbed


def _sandbox_report(config: Config) -> SandboxReport:
    options = config.tools.options.get("shell", {})
    mode = str(options.get("sandbox", "auto"))
    network = options.get("network", False)
    if mode == "off":
        return SandboxReport(mode=mode, active=False, network=network, reason='[tools.shell] sandbox = "off"')
    status = sandbox_status()
    bwrap = f"{status.bwrap} ({status.version})" if status.bwrap and status.version else status.bwrap
    if status.available:
        return SandboxReport(mode=mode, active=True, network=network, bwrap=bwrap)
    if mode == "required":
        warning = (
            f'shell commands will be REFUSED: [tools.shell] sandbox = "required", and {status.reason}. '
            f"To enable the sandbox, {SANDBOX_ENABLE_HINT}."
        )
    else:
        warning = (
            f"shell commands will run WITHOUT weald's OS sandbox: {status.reason}. They can read every file "
            "this user can (~/.ssh, ~/.aws, other projects) and use the network; only process groups and a "
            f"cleaned environment contain them. To enable the sandbox, {SANDBOX_ENABLE_HINT}. "
            'To run without it on purpose, set [tools.shell] sandbox = "off" in weald.toml; '
            'to refuse commands without it, sandbox = "required".'
        )
    global _warned
    with _warned_lock:
        first, _warned = not _warned, True
    if first:
        logger.warning("%s", warning)
    return SandboxReport(mode=mode, active=False, network=network, bwrap=bwrap, reason=status.reason, warning=warning)


def stop_leftovers(system: ActorSystem, state_dir: Path) -> int:
    """Stop what a killed daemon on ``state_dir`` left running; publish ``daemon.leftovers_stopped``; blocks.

    Returns:
        How many processes were found.
    """
    leftovers = stop_leftover_processes(state_dir)
    if leftovers:
        survivors = [p.pid for p in leftovers if not p.stopped]
        logger.warning(
            "stopped %d process(es) a previous daemon on %s left running%s",
            len(leftovers),
            state_dir,
            f"; {survivors} survived SIGKILL" if survivors else "",
        )
        system.events.publish(
            "daemon.leftovers_stopped",
            "/",
            {
                "count": len(leftovers),
                "state_dir": str(state_dir),
                "processes": [attrs.asdict(p) for p in leftovers],
                "survivors": survivors,
            },
        )
    return len(leftovers)
