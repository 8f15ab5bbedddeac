"""Decode brand-new msgspec types from four threads at once, round after round (run as a script).

``python codec_race.py weald ROUNDS`` decodes through weald's
`msgspec_decoder` / `msgspec_convert`; ``python codec_race.py plain ROUNDS``
through msgspec's own functions, which crash with SIGSEGV when two threads
build the plan of one type together (see ``runtime/_codec.py``). Prints
``survived N rounds`` and exits 0 when nothing crashed.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
from typing import Any

import attrs
import msgspec
from weald.runtime import msgspec_convert, msgspec_decoder

FIELDS = 24


def fresh_types(n: int) -> tuple[type, type]:
    """A Struct and an attrs class never decoded before, each with nested and optional fields."""
    namespace: dict[str, Any] = {"msgspec": msgspec, "attrs": attrs}
    fields = "".join(f"    f{j}: list[Inner{n}] | None = None\n" for j in range(FIELDS))
    source = (
        f"class Inner{n}(msgspec.Struct):\n    a: dict[str, list[int]] | None = None\n    b: int | str | None = None\n"
        f"class Outer{n}(msgspec.Struct):\n{fields}"
        f"@attrs.frozen\nclass Record{n}:\n{fields}"
    )
    # A new class each round: its plan is built by the first decode. Compiled without this
    # module's `from __future__ import annotations`, so the annotations are real types.
    exec(compile(source, f"<round {n}>", "exec", dont_inherit=True), namespace)
    return namespace[f"Outer{n}"], namespace[f"Record{n}"]


def main() -> None:
    mode, rounds = sys.argv[1], int(sys.argv[2])
    faulthandler.enable()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as CPython allows
    payload = msgspec.json.encode({f"f{j}": [{"a": {"x": [1]}, "b": 1}] for j in range(FIELDS)})
    plain = msgspec.json.decode(payload)
    for n in range(rounds):
        struct, record = fresh_types(n)
        start = threading.Barrier(4)
        failures: list[str] = []

        def work(
            index: int,
            struct: type = struct,
            record: type = record,
            start: threading.Barrier = start,
            failures: list[str] = failures,
        ) -> None:
            start.wait()
            target = struct if index % 2 else record
            try:
                if mode == "weald":
                    msgspec_decoder(target).decode(payload)
                    msgspec_convert(plain, target)
                else:
                    msgspec.json.decode(payload, type=target)
                    msgspec.convert(plain, type=target)
            except Exception as exc:  # a half-built plan may raise instead of crashing: also a failure
                failures.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            print(f"round {n}: {failures[0]}", flush=True)
            sys.exit(1)
    print(f"survived {rounds} rounds", flush=True)


if __name__ == "__main__":
    main()
