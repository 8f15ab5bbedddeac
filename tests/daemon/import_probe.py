"""Runs ``python -m MODULE ARGS...`` in this process and, as it exits, writes the names of every module it imported.

Usage: ``python import_probe.py OUT python -m MODULE ARGS...`` (the shape of
`DaemonProcess.start`'s ``wrapper``: the daemon command follows). OUT gets a
JSON list of ``sys.modules``' names, written by an ``atexit`` hook, so it
holds what the daemon imported over its whole life.
"""

from __future__ import annotations

import atexit
import json
import runpy
import sys


def main() -> None:
    out, _python, flag, module, *args = sys.argv[1:]
    if flag != "-m":
        raise SystemExit(f"import_probe: expected python -m MODULE after {out}, got {flag!r}")

    def report() -> None:
        with open(out, "w") as f:
            json.dump(sorted(sys.modules), f)

    atexit.register(report)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
