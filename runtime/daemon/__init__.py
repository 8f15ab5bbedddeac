"""The daemon layer: the daemon's tree, its JSON-RPC server, the client, the CLI, the demo and the configuration.

It stands on everything else (core <- supervisors <- tools <- agent layer <- daemon layer) and
nothing below imports it. Its modules::

    tree      Daemon: builds the supervision tree, holds the sessions and the turn gate
    server    the JSON-RPC 2.0 front on a Unix socket or stdio
    client    Client: a blocking JSON-RPC client for the daemon's socket
    cli       the ``weald`` command
    demo      ``weald demo``
    config    ``weald.toml``: loading, structuring, errors

The names below are importable from here; each module is imported when one of its names is first
used, so ``from weald.runtime.daemon import Client`` does not load the agent layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError
    from weald.runtime.daemon.config import Config, ConfigError, load_config, parse_config
    from weald.runtime.daemon.tree import (
        DEMO_MODEL,
        SHUTDOWN_REASON,
        Daemon,
        DaemonError,
        InvalidRequestError,
        SessionRecord,
        Sessions,
        TurnGate,
        TurnGateStatistics,
        demo_script_path,
    )

__all__ = [
    "DEMO_MODEL",
    "SHUTDOWN_REASON",
    "Client",
    "Config",
    "ConfigError",
    "Daemon",
    "DaemonError",
    "DaemonUnavailableError",
    "InvalidRequestError",
    "RPCCallError",
    "SessionRecord",
    "Sessions",
    "TurnGate",
    "TurnGateStatistics",
    "demo_script_path",
    "load_config",
    "parse_config",
]

_HOMES = {
    "Client": "client",
    "DaemonUnavailableError": "client",
    "RPCCallError": "client",
    "Config": "config",
    "ConfigError": "config",
    "load_config": "config",
    "parse_config": "config",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_HOMES.get(name, 'tree')}")
    return getattr(module, name)
