"""A project's own stdio MCP servers in the shell's OS sandbox (`weald.tools._bwrap`).

The daemon runs the stdio servers a project's configuration names (its
``weald.toml``, the files it imports with ``[mcp] import``) for each of the
project's sessions. The configuration is protected from the agent, but the
code a server runs often lives in the project (``python tools/server.py``,
a package in ``node_modules``), where the agent's commands write; run on
the host, a change planted there would run with the user's rights the next
time the server starts. So such a server starts under bubblewrap, with the
sandbox a shell command of the project gets (`MCPSandbox`):

- the project writable except its protected paths (``weald.toml``,
  ``.weald``, git's config and hooks, the imported files), the rest of the
  filesystem read-only, the credential homes and the daemon's state hidden,
  ``[tools.shell] writable``, ``readable`` and ``hidden`` as for commands;
- a private ``/tmp`` (a fresh one per server process);
- a writable cache directory of the project's own, in the daemon's state
  directory, named by ``npm_config_cache``, ``UV_CACHE_DIR``,
  ``XDG_CACHE_HOME`` and ``PIP_CACHE_DIR`` (unless the server's ``env``
  names them), so ``npx -y`` and ``uvx`` can download and unpack while the
  home directory stays read-only;
- the network, unless the project's ``[mcp] network = false`` (servers
  commonly need it: ``npx -y`` downloads, remote APIs);
- its own PID namespace, no capabilities, gone when the daemon is.

``[tools.shell] sandbox`` decides as for commands: ``"auto"`` runs the
server unsandboxed (with a warning) where bubblewrap does not work,
``"required"`` refuses to start it, ``"off"`` runs it as before (the daemon
then sets no launcher at all).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import attrs
from weald.runtime import ProtectedLinks, make_private_dirs
from weald.tools._bwrap import (
    SANDBOX_ENABLE_HINT,
    SandboxPolicy,
    bwrap_options,
    default_hidden_paths,
    expand_paths,
    options_file,
    sandbox_status,
)
from weald.tools._contract import ToolConfig
from weald.tools._protected import Placeholders
from weald.tools.shell import toolchain_in_tmp

__all__ = ["CACHE_VARIABLES", "MCPSandbox", "SandboxedLaunch", "project_sandbox"]

logger = logging.getLogger("weald.tools")

#: The variables that send a server's package managers to the writable cache (unless its ``env`` sets them),
#: and each one's directory there.
CACHE_VARIABLES = {"npm_config_cache": "npm", "UV_CACHE_DIR": "uv", "XDG_CACHE_HOME": "xdg", "PIP_CACHE_DIR": "pip"}


class SandboxedLaunch:
    """One server process's ``bwrap`` command line, and what it holds until the process is gone.

    Attributes:
        argv: ``bwrap --args FD -- COMMAND...``.
        env: the server's environment, with the cache variables and ``TMPDIR``.
        pass_fds: the options file, which bubblewrap reads and closes.
    """

    def __init__(
        self, argv: list[str], env: dict[str, str], options_fd: int, placeholders: Placeholders, links: ProtectedLinks
    ) -> None:
        self.argv = argv
        self.env = env
        self.pass_fds = (options_fd,)
        self._options_fd: int | None = options_fd
        self._placeholders = placeholders
        self._links = links

    def started(self) -> None:
        """Close the options file: bubblewrap has it (idempotent)."""
        fd, self._options_fd = self._options_fd, None
        if fd is not None:
            os.close(fd)

    def ended(self) -> None:
        """Give back the placeholders and put back a protected link the server replaced (blocking)."""
        self.started()
        self._placeholders.release()
        for link in self._links.release():
            logger.warning("%s", link.describe())


@attrs.frozen(kw_only=True)
class MCPSandbox:
    """The OS sandbox of a project's stdio MCP servers (a `weald.runtime.mcp.StdioLauncher`).

    Attributes:
        mode: ``[tools.shell] sandbox``: ``"auto"`` or ``"required"``.
        project: the project directory (writable except its protected paths); None: none.
        cache: the project's writable cache directory (made when a server starts).
        writable: more writable paths (``[tools.shell] writable``, absolute).
        readable: paths shown read-only though hidden (``[tools.shell] readable``).
        hidden: paths the server may not see (the credential homes, ``[tools.shell] hidden``).
        private: paths it may never see (the daemon's state directory, socket, config).
        protected: more files it may not write (the project's configuration files).
        network: whether it may use the network (``[mcp] network``).
    """

    mode: str
    project: str | None
    cache: str
    writable: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    private: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    network: bool = True

    def prepare(self, server: str, argv: list[str], env: dict[str, str], cwd: str | None) -> SandboxedLaunch | None:
        """``argv`` under bubblewrap (blocking: it probes bubblewrap once, looks at files, makes placeholders).

        Returns None where bubblewrap does not work and the mode is ``"auto"``
        (the server then runs as before, and a warning says so).

        Raises:
            RuntimeError: the mode is ``"required"`` and bubblewrap does not work here.
        """
        status = sandbox_status()
        if not status.available or status.bwrap is None:
            if self.mode == "required":
                raise RuntimeError(
                    f'project MCP servers may only run in weald\'s OS sandbox ([tools.shell] sandbox = "required"), '
                    f"and it does not work on this machine: {status.reason}; {SANDBOX_ENABLE_HINT}"
                )
            logger.warning(
                "the project's MCP server %r runs outside the OS sandbox: %s (%s)", server, status.reason, "auto"
            )
            return None
        cache = Path(self.cache)
        make_private_dirs(cache)
        env = dict(env)
        for name, directory in CACHE_VARIABLES.items():
            env.setdefault(name, str(cache / directory))
        env["TMPDIR"] = "/tmp"  # noqa: S108 - the sandbox's own /tmp
        project = None if self.project is None else Path(self.project)
        workdir = Path(cwd) if cwd is not None else Path.cwd()
        policy = SandboxPolicy(
            project=project,
            workdir=workdir,
            writable=(*map(Path, self.writable), cache),
            readable=(*map(Path, self.readable), *toolchain_in_tmp(env.get("PATH", ""))),
            hidden=tuple(map(Path, self.hidden)),
            private=tuple(map(Path, self.private)),
            protected=tuple(map(Path, self.protected)),
            network=self.network,
        )
        placeholders, links = Placeholders(), ProtectedLinks()
        try:
            fd = options_file(bwrap_options(policy, placeholders, links))
        except BaseException:
            placeholders.release()
            links.release()
            raise
        return SandboxedLaunch([status.bwrap, "--args", str(fd), "--", *argv], env, fd, placeholders, links)


def project_sandbox(tool_config: ToolConfig, project: str | None, cache: str, *, network: bool) -> MCPSandbox | None:
    """The sandbox of a project's own stdio servers: its shell commands' (None: ``[tools.shell] sandbox = "off"``).

    Args:
        tool_config: the project's tool configuration (``[tools.shell]``,
            its private and protected paths).
        project: the project directory (writable); relative ``[tools.shell]``
            paths are relative to it.
        cache: the project's writable cache directory.
        network: ``[mcp] network``.
    """
    option = tool_config.option
    mode = str(option("shell", "sandbox", "auto"))
    if mode == "off":
        return None
    base = None if project is None else Path(project)

    def paths(key: str) -> tuple[str, ...]:
        return tuple(map(str, expand_paths(option("shell", key, ()), base=base)))

    return MCPSandbox(
        mode=mode,
        project=project,
        cache=cache,
        writable=paths("writable"),
        readable=paths("readable"),
        hidden=(*map(str, default_hidden_paths()), *paths("hidden")),
        private=tool_config.private_paths,
        protected=tool_config.protected_paths,
        network=network,
    )
