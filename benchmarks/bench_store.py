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

The same store on PostgreSQL (``measure_postgres``), beside sqlite in one run,
on a throwaway cluster of Debian's ``postgresql`` started for the run
(tests/pg_cluster.py: as ``nobody``, fsync on, TCP on loopback): a turn's
group commit without and with the fence (the fence's cost per commit is the
difference), a note written and a search of 10,000 notes (sqlite FTS5 beside
PostgreSQL's ``tsvector``), and claiming 10,000 sessions of a dead node then
reading their records. ``pg_test_fsync``'s figure for the disk under the
cluster is printed too: a commit on PostgreSQL waits for one WAL flush.

Run: ``python benchmarks/bench_store.py [--quick] [--no-postgres]``
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
from _bench import PLACEMENTS, Row, banner, interleave, median, pin, summary

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


def _pg_cluster() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from pg_cluster import PgCluster

    return PgCluster(fsync=True).init().start()


def _samples(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        fn()
        out.append((time.perf_counter() - began) * 1e6)
    return out


def _vocabulary(n: int) -> list[str]:
    """``n`` made-up words (a real notebook's vocabulary is thousands of words, most of them rare)."""
    consonants, vowels = "bcdfghjklmnprstvz", "aeiou"
    words = []
    for i in range(n):
        word, k = "", i + 1
        while k:
            k, c = divmod(k, len(consonants))
            k, v = divmod(k, len(vowels))
            word += consonants[c] + vowels[v]
        words.append(word)
    return words


VOCABULARY = _vocabulary(5000)
COMMON = ["deploy", "build", "release", "test", "the", "and", "with", "for", "notes", "config"]


def _note_text(i: int) -> str:
    """About 60 words: common ones, and rarer ones drawn with a skew toward the first (Zipf-like)."""
    words = []
    for k in range(60):
        if k % 4 == 0:
            words.append(COMMON[(i + k) % len(COMMON)])
        else:
            rank = (i * 7919 + k * 104729) % len(VOCABULARY)
            words.append(VOCABULARY[(rank * rank) // len(VOCABULARY)])
    return " ".join(words)


def _notes(store: Store, n: int) -> None:
    """``n`` notes in one scope (`_note_text`), each with a tag."""
    batch: dict[str, Any] = {}
    for i in range(n):
        batch[f"p1/note-{i:05d}"] = {"key": f"note-{i:05d}", "text": _note_text(i), "tags": [COMMON[i % 10]]}
        if len(batch) == 500:
            store.put_many("memory", batch)
            batch = {}
    if batch:
        store.put_many("memory", batch)


# Searches as an agent makes them: a few words, some rare, some common, one a prefix.
QUERIES = [
    f"{VOCABULARY[400]} {VOCABULARY[900]}",
    f"{VOCABULARY[70]}*",
    f"{VOCABULARY[1200]} {VOCABULARY[30]} deploy",
    f"{VOCABULARY[2500]} {VOCABULARY[150]}",
]


def _matches(store: Store, query: str) -> int:
    """How many notes ``query`` matches (every one of them is ranked by a search)."""
    return len(store.search("p1", query, 100_000))


def measure_backends(quick: bool, url: str, url_fresh: Any) -> dict[str, float]:
    """The store's figures on sqlite and PostgreSQL side by side (microseconds; ``claim`` in seconds)."""
    ops = 60 if quick else 200
    counter = itertools.count()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="weald-bench-store-pg-") as tmp:
        lite = Store(Path(tmp) / "lite.db")
        pg = Store(url=url)
        fenced = Store(url=url_fresh())
        fenced.join("bench", lease=30)
        fenced.claim(["s"])
        for s in (lite, pg, fenced):
            for namespace in NAMESPACES:
                s.put(namespace, "seed", 0)

        def group(store: Store, session: str | None) -> Any:
            def sample(n: int) -> list[float]:
                samples = []
                for _ in range(n):
                    writes = turn_writes(next(counter))
                    began = time.perf_counter()
                    for namespace, values in writes.items():
                        for key, value in values.items():
                            store.enqueue_nowait(namespace, key, value, session=session)
                    store.flush(session).get(timeout=30)
                    samples.append((time.perf_counter() - began) * 1e6)
                return samples

            return sample

        result = interleave(
            {"sqlite": group(lite, None), "pg": group(pg, None), "pg_fenced": group(fenced, "s")},
            ops,
            rounds=3 if quick else 5,
        )
        out.update({f"group_{k}": v for k, v in result.items()})
        notes = 2_000 if quick else 10_000
        for name, store in (("sqlite", lite), ("pg", pg)):
            _notes(store, notes)
            numbers = itertools.count()

            def write(s: Store = store, n: Any = numbers) -> None:
                s.put("memory", f"p1/new-{next(n)}", {"key": "k", "text": "deploy notes"})

            out[f"note_write_{name}"] = median(_samples(write, ops))
            # Each query's own median too: a query with a common word ranks thousands of notes.
            searches: list[float] = []
            for i, query in enumerate(QUERIES):
                samples = _samples(lambda s=store, q=query: s.search("p1", q, 10), ops // len(QUERIES))
                out[f"search_{name}_q{i}"] = median(samples)
                out[f"search_{name}_q{i}_matches"] = float(_matches(store, query))
                searches += samples
            out[f"search_{name}"] = median(searches)
            out[f"search_hits_{name}"] = float(len(store.search("p1", "deploy", 10)))
        for s in (lite, pg, fenced):
            s.close()
    # Claim + read 10,000 sessions of a dead node.
    claim_url = url_fresh()
    dead = Store(url=claim_url)
    dead.join("dead", lease=0.5)
    ids = [f"sess{i:05d}" for i in range(10_000)]
    dead.claim(ids)
    for first in range(0, len(ids), 1000):
        dead.put_many(
            "sessions",
            {sid: {"session_id": sid, "status": "active", "model": "m"} for sid in ids[first : first + 1000]},
        )
    dead.close()  # a clean stop ends its lease; its placements' own leases are short too
    time.sleep(1.0)
    heir = Store(url=claim_url)
    heir.join("heir", lease=30)
    began = time.perf_counter()
    claimed = heir.claim()
    read = heir.items("sessions")
    out["claim_s"] = time.perf_counter() - began
    out["claimed"] = float(len(claimed))
    out["claim_read"] = float(len(read))
    heir.close()
    return out


def fsync_floor(cluster: Any) -> float:
    """Microseconds of one 8 kB write + fdatasync on the disk under the cluster (pg_test_fsync)."""
    import re
    import subprocess

    done = subprocess.run(
        [str(cluster.bin / "pg_test_fsync"), "-s", "1", "-f", str(cluster.dir / "fsync-test")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    found = re.search(r"fdatasync\s+[\d.]+ ops/sec\s+(\d+) usecs/op", done.stdout)
    return float(found.group(1)) if found else float("nan")


def run_postgres(quick: bool) -> list[Row]:
    banner("bench_store: the store on PostgreSQL beside sqlite (one run, interleaved)")
    cluster = _pg_cluster()
    try:
        url = cluster.url(cluster.create_database())

        def fresh() -> str:
            return str(cluster.url(cluster.create_database()))

        m = measure_backends(quick, url, fresh)
        floor = fsync_floor(cluster)
    finally:
        cluster.remove()
    fence = m["group_pg_fenced"] - m["group_pg"]
    print(
        f"  a turn's 15 writes, committed: sqlite {m['group_sqlite']:.0f} us, PostgreSQL {m['group_pg']:.0f} us, "
        f"with the fence {m['group_pg_fenced']:.0f} us (fence {fence:.0f} us); disk flush floor {floor:.0f} us"
    )
    print(f"  note write: sqlite {m['note_write_sqlite']:.0f} us, PostgreSQL {m['note_write_pg']:.0f} us")
    print(
        f"  search of {10_000 if not quick else 2_000} notes: sqlite {m['search_sqlite']:.0f} us, "
        f"PostgreSQL {m['search_pg']:.0f} us"
    )
    for i, query in enumerate(QUERIES):
        print(
            f"    {query!r:<28} matches {m[f'search_pg_q{i}_matches']:>6.0f}: "
            f"sqlite {m[f'search_sqlite_q{i}']:>6.0f} us, PostgreSQL {m[f'search_pg_q{i}']:>6.0f} us"
        )
    print(
        f"  claim + read 10,000 sessions: {m['claim_s'] * 1000:.0f} ms ({m['claimed']:.0f} claimed, "
        f"{m['claim_read']:.0f} read)"
    )
    return [
        Row(
            "store",
            "15 writes committed, PostgreSQL",
            m["group_pg"],
            "us",
            note=(
                f"= {m['group_pg'] / m['group_sqlite']:.1f}x sqlite ({m['group_sqlite']:.0f} us); "
                f"fsync floor {floor:.0f} us"
            ),
        ),
        Row(
            "store",
            "the fence, per commit",
            fence,
            "us",
            target="<= 300 us",
            ok=fence <= 300,
            note=f"with {m['group_pg_fenced']:.0f} us, without {m['group_pg']:.0f} us",
        ),
        Row(
            "store",
            "note write, 10k notes, PostgreSQL",
            m["note_write_pg"],
            "us",
            target="<= 3000 us",
            ok=m["note_write_pg"] <= 3000,
            note=f"sqlite {m['note_write_sqlite']:.0f} us",
        ),
        Row(
            "store",
            "memory search, 10k notes, PostgreSQL",
            m["search_pg"],
            "us",
            target="<= 5000 us",
            ok=m["search_pg"] <= 5000,
            note=f"sqlite FTS5 {m['search_sqlite']:.0f} us",
        ),
        Row("store", "claim + read 10,000 sessions", m["claim_s"], "s", target="<= 0.5 s", ok=m["claim_s"] <= 0.5),
    ]


def run(quick: bool = False, postgres: bool = True) -> list[Row]:
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
    if postgres:
        rows += run_postgres(quick)
    return summary(rows)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--no-postgres", action="store_true", help="sqlite only (no PostgreSQL cluster)")
    args = parser.parse_args()
    run(quick=args.quick, postgres=not args.no_postgres)


if __name__ == "__main__":
    main()
