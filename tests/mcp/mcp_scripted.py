"""The scripted test server's configs, importable by name from any test module.

(Test modules cannot import from ``conftest``: with several test folders on
``sys.path``, ``conftest`` names whichever folder's file was imported first.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from weald.runtime.mcp import ServerConfig

SCRIPTED_SERVER = Path(__file__).with_name("scripted_server.py")


class ScriptedServer:
    """Builds configs for ``scripted_server.py`` (fixture ``scripted``)."""

    path = SCRIPTED_SERVER

    def config(self, *flags: str, **overrides: Any) -> ServerConfig:
        """Config for the scripted server with the given command-line flags.

        ``overrides`` are other `ServerConfig` fields (timeouts, ``env``, ``cwd``).
        """
        fields: dict[str, Any] = {"call_timeout": 30.0, "connect_timeout": 20.0} | overrides
        return ServerConfig(name="scripted", command=sys.executable, args=[str(SCRIPTED_SERVER), *flags], **fields)
