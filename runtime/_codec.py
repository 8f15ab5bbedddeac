"""Typed msgspec decoding that is safe to start from several threads at once.

msgspec (0.22, CPython with the GIL) builds the decoding plan of a Struct,
dataclass or attrs class the first time that type is decoded or converted,
and caches it on the class *before* it has converted the field types (so a
type may refer to itself). Converting the field types runs Python code
(typing introspection), so the GIL can pass to another thread in the
middle; a second thread decoding the same type then finds the cached plan
with its field types still NULL and reads through one: SIGSEGV at address 0
inside ``msgspec._core``. A daemon restoring many sessions hits exactly that:
worker threads decode the same record and script types for the first time
together (the crash of issue 30, in a thread named ``build_in_project``).
``benchmarks/reliability.py --part msgspec-race`` reproduces it with plain
msgspec in a few hundred rounds.

So every typed decode in weald goes through a decoder made here, once per
type, under one lock: the plan is complete before any thread can use it.
`msgspec_convert` does the same before it calls ``msgspec.convert``. Untyped
decoding (``msgspec.json.decode(raw)``) and encoding build no plan and need
none of this. A test checks that no module decodes a type any other way.
"""

from __future__ import annotations

import threading
from typing import Any

import msgspec

__all__ = ["msgspec_convert", "msgspec_decoder"]

_lock = threading.Lock()
# type -> its decoder; read without the lock (a dict lookup is atomic), written under it.
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def msgspec_decoder(type_: Any) -> msgspec.json.Decoder[Any]:
    """The JSON decoder of ``type_``, made once; its decoding plan is complete when it is returned.

    Safe from any thread. Making it builds the plan of ``type_`` and of every
    type it contains, under a lock, so no two threads build one at once.

    Args:
        type_: what to decode into (a Struct, an attrs class, ``list[X]``...).

    Returns:
        A decoder; ``decoder.decode(raw)`` raises ``msgspec.DecodeError``
        (``ValidationError`` when the data is JSON of the wrong shape).
    """
    decoder = _decoders.get(type_)
    if decoder is None:
        with _lock:
            decoder = _decoders.get(type_)
            if decoder is None:
                decoder = msgspec.json.Decoder(type_)
                _decoders[type_] = decoder
    return decoder


def msgspec_convert(obj: Any, type_: Any, **options: Any) -> Any:
    """``msgspec.convert(obj, type=type_, **options)``, once the plan of ``type_`` is complete.

    Raises:
        msgspec.ValidationError: ``obj`` does not have the shape of ``type_``.
    """
    msgspec_decoder(type_)
    return msgspec.convert(obj, type=type_, **options)
