r"""Names that are not valid UTF-8: shown with a visible escape, and accepted back in that form.

A file name is bytes; Python reads one that is not valid UTF-8 with
``surrogateescape``, each undecodable byte becoming a lone surrogate
(U+DC80-U+DCFF). Such a string cannot be encoded as UTF-8, so it must not
reach the model, an event or the store as it is. `show` writes each of those
bytes as ``\xHH`` (``bad\xffname.txt``); `unescape` turns that form back into
the name, so a path the model copies from a listing works as an argument.
A name that really contains the four characters ``\xff`` keeps them: the
tools try the name as given first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["printable", "show", "unescape", "unprintable"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"  # a lone surrogate that is no escaped byte


def show(text: str) -> str:
    r"""``text`` as UTF-8 can carry it: an undecodable byte as ``\xHH``, any other lone surrogate as ``\uXXXX``."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape, text)
    return text


def unescape(text: str) -> str:
    r"""The name a shown form stands for: each ``\x80``-``\xff`` back to the byte it escaped."""
    if "\\x" not in text:
        return text
    named = _ESCAPE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), text)
    return text if named == text else named  # the same object when nothing was escaped


def printable(value: Any) -> Any:
    """``value`` with every string in it (in lists, tuples and mappings too) passed through `show`."""
    if isinstance(value, str):
        return show(value)
    if isinstance(value, list | tuple):
        items = [printable(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, Mapping):
        return {printable(k): printable(v) for k, v in value.items()}
    return value


def unprintable(value: Any) -> bool:
    """True if a string in ``value`` (in lists, tuples and mappings too) holds what UTF-8 cannot encode."""
    if isinstance(value, str):
        return show(value) is not value
    if isinstance(value, list | tuple):
        return any(unprintable(v) for v in value)
    if isinstance(value, Mapping):
        return any(unprintable(k) or unprintable(v) for k, v in value.items())
    return False
