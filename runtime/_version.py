"""weald's installed version, read once when this module is imported (never on the trio loop)."""

from __future__ import annotations

from importlib import metadata
from typing import Final

__all__ = ["VERSION"]


def _installed() -> str:
    try:
        return metadata.version("weald")
    except metadata.PackageNotFoundError:
        return "0"


VERSION: Final = _installed()
"""The version of the installed ``weald`` distribution (``"0"`` when it is not installed)."""
