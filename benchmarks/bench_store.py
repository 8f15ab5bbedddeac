"""The store's group commit: one transaction for a turn's writes, beside sqlitedict and raw sqlite3.

An agent turn with 10 tool calls queues about 15 writes in 3 namespaces (13
history entries, the turn record, the agent record) and then waits for a
flush. Measured here, each as the time from the first write to the commit
being done (median, microseconds), rounds interleaved:

- ``weald group commit``: ``Store.enqueue_nowait`` for the 15 values, then
  ``flush().get()``: the committer thread writes them in one transaction
  through its own SQLite connection (what every agent turn does, twice);
- ``sqlitedict, a transaction per namespace``: ``Store.put_many`` per
  namespace, the synchronous path through sqlitedict's own connections
  (one per table, each served by a thread of sqlitedict's): what the
  committer did before it had its own connection;
- ``raw sqlite3, one transaction``: the floor, on the calling thread.

All three write the same encoded values to the same kind of file (WAL,
``synchronous=NORMAL``); the ratios say what the committer's hand-offs cost
over the floor and what it saves over sqlitedict.

Run: ``python benchmarks/bench_store.py [--quick]``
"""

from __future__ import annotations

import itertools
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from weald.runtime import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PLACEMENTS, Row, banner, interleave, pin, quick_main, summary

NAMESPACES = ("history", "turns", "agents")


def turn_writes(n: int) -> dict[str, dict[str, Any]]:
    """A turn's writes: 13 history entries, its turn record, the agent record."""
    entry = {"seq": 0, "turn_id": f"t{n}", "time": 0.0, "message": {"role": "tool", "content": "ok", "name": "noop"}}
    return {
        "history": {f"s/{n:08d}/{k:04d}": {**entry, "seq": k} for k in range(13)},
        "turns": {f"s/t{n}": {"turn_id": f"t{n}", "status": "done", "steps": 2}},
        "agents": {"s": {"session_id": "s", "next_seq": 13 * n, "status": "idle"}},
    }


def measure(quick: bool, placement: str | None) -> dict[str, float]:
    ops = 60 if quick else 200
    counter = itertools.count()
    with tempfile.TemporaryDirectory(prefix="weald-bench-store-") as tmp:
        store = Store(Path(tmp) / "weald.db")
        legacy = Store(Path(tmp) / "sqlitedict.db")
        for s in (store, legacy):
            for namespace in NAMESPACES:
                s.put(namespace, "seed", 0)  # open every table before timing
        raw = sqlite3.connect(Path(tmp) / "raw.db", isolation_level=None)
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=NORMAL")
        for namespace in NAMESPACES:
            raw.execute(f'CREATE TABLE "{namespace}" (key TEXT PRIMARY KEY, value BLOB)')

        def group(n: int) -> list[float]:
            out = []
            for _ in range(n):
                writes = turn_writes(next(counter))
                began = time.perf_counter()
                for namespace, values in writes.items():
                    for key, value in values.items():
                        store.enqueue_nowait(namespace, key, value)
                store.flush().get(timeout=10)
                out.append((time.perf_counter() - began) * 1e6)
            return out

        def per_namespace(n: int) -> list[float]:
            out = []
            for _ in range(n):
                writes = turn_writes(next(counter))
                began = time.perf_counter()
                for namespace, values in writes.items():
                    legacy.put_many(namespace, values)
                out.append((time.perf_counter() - began) * 1e6)
            return out

        def floor(n: int) -> list[float]:
            out = []
            for _ in range(n):
                writes = turn_writes(next(counter))
                began = time.perf_counter()
                encoded = {ns: [(k, msgspec.json.encode(v)) for k, v in vals.items()] for ns, vals in writes.items()}
                raw.execute("BEGIN IMMEDIATE")
                for namespace, pairs in encoded.items():
                    raw.executemany(f'REPLACE INTO "{namespace}" (key, value) VALUES (?,?)', pairs)
                raw.execute("COMMIT")
                out.append((time.perf_counter() - began) * 1e6)
            return out

        pin(placement)
        result = interleave(
            {"group": group, "per_namespace": per_namespace, "floor": floor},
            ops,
            rounds=3 if quick else 5,
            before=lambda: pin(placement),
        )
        pin(None)
        raw.close()
        store.close()
        legacy.close()
    return result


def run(quick: bool = False) -> list[Row]:
    banner("bench_store: a turn's 15 writes in 3 namespaces, committed (weald vs sqlitedict vs raw sqlite3)")
    rows = []
    for key, label in (("one", "1 CPU"), ("two", "2 CPUs")):
        m = measure(quick, key)
        print(f"\n--- placement: {PLACEMENTS[key]} ---")
        print(f"  weald group commit (enqueue x15, flush)       {m['group']:8.1f} us")
        print(f"  sqlitedict, a transaction per namespace       {m['per_namespace']:8.1f} us")
        print(f"  raw sqlite3, one transaction (the floor)      {m['floor']:8.1f} us")
        rows.append(
            Row(
                "store",
                f"a turn's 15 writes, committed [{label}]",
                m["group"],
                "us",
                note=(
                    f"= {m['per_namespace'] / m['group']:.1f}x faster than sqlitedict per namespace "
                    f"({m['per_namespace']:.0f} us); {m['group'] / m['floor']:.1f}x raw sqlite3 ({m['floor']:.0f} us)"
                ),
            )
        )
    return summary(rows)


def main() -> None:
    quick_main(run, __doc__)


if __name__ == "__main__":
    main()
