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
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:  # _contract imports this module
    from weald.tools._contract import ToolResult

__all__ = ["printable", "printable_result", "show", "unescape"]

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


def _unprintable(value: Any) -> bool:
    if isinstance(value, str):
        return show(value) is not value
    if isinstance(value, list | tuple):
        return any(_unprintable(v) for v in value)
    if isinstance(value, Mapping):
        return any(_unprintable(k) or _unprintable(v) for k, v in value.items())
    return False


def printable_result(result: ToolResult) -> ToolResult:
    """``result`` with nothing in it that UTF-8 cannot encode (output, hints, data, spool path)."""
    if result.data is None and not result.hints and result.full_output_path is None:
        # The common result, text alone: one check of the text.
        output = result.output
        if output.__class__ is str and show(output) is output:
            return result
    if not _unprintable((result.output, result.hints, result.data, result.full_output_path)):
        return result
    return attrs.evolve(
        result,
        output=show(result.output),
        hints=tuple(show(h) for h in result.hints),
        data=printable(result.data),
        full_output_path=show(result.full_output_path) if result.full_output_path is not None else None,
    )
