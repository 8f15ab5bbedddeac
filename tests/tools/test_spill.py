"""Spill files: the per-call, per-session and free-space bounds, removing old ones, and their rows in the store."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from weald.runtime import Store
from weald.runtime.testing import await_until
from weald.tools import (
    SPILL_NAMESPACE,
    SpillBudget,
    SpillLedger,
    SpillLimits,
    SpillRow,
    ToolResult,
    forget_spill,
    limit_output,
    session_spill,
    spill_key,
    sweep_spill_dirs,
)
from weald.tools._jobs import JobTable, nursery_spawner

MiB = 1024 * 1024


def lines(n: int, width: int = 99) -> str:
    return "".join(f"{i:0{width}d}\n" for i in range(n))


def test_a_call_saves_at_most_its_limit_and_the_model_is_told_where_the_file_stops(tmp_path: Path) -> None:
    spill = SpillBudget(tmp_path / "out", SpillLimits(max_call_bytes=10_000))
    text = lines(1000)  # 100,000 bytes
    cut = limit_output(ToolResult.success(text), keep="head", save_dir=spill.directory, call_id="c1", spill=spill)
    assert cut.full_output_path is not None
    saved = Path(cut.full_output_path).read_bytes()
    assert saved == text.encode()[:10_000]
    assert (
        "The output (1000 lines, 100000 bytes) is saved at "
        f"{cut.full_output_path} up to byte 10000 only, as one call saves at most 9.8 KiB (spill.max_call_bytes)"
    ) in cut.output
    assert spill.used == 10_000


def test_a_session_saves_at_most_its_total_and_then_nothing(tmp_path: Path) -> None:
    spill = SpillBudget(tmp_path / "out", SpillLimits(max_call_bytes=MiB, max_session_bytes=150_000))
    text = lines(1000)
    first = limit_output(ToolResult.success(text), keep="head", save_dir=spill.directory, call_id="a", spill=spill)
    second = limit_output(ToolResult.success(text), keep="tail", save_dir=spill.directory, call_id="b", spill=spill)
    third = limit_output(ToolResult.success(text), keep="head", save_dir=spill.directory, call_id="c", spill=spill)
    assert first.full_output_path is not None
    assert "The full output (1000 lines, 100000 bytes) is saved at" in first.output
    assert second.full_output_path is not None
    assert os.path.getsize(second.full_output_path) == 50_000
    assert "up to byte 50000 only, as this session's saved outputs reached 146 KiB" in second.output
    # Nothing left: no file, and the model is told the output was not saved, and why.
    assert third.full_output_path is None
    assert "The full output (1000 lines, 100000 bytes) was not saved: this session's saved outputs reached" in (
        third.output
    )
    assert sorted(p.name for p in spill.directory.iterdir()) == ["a.txt", "b.txt"]


def test_the_budget_counts_what_a_previous_daemon_left_in_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "out"
    (directory / "jobs").mkdir(parents=True)
    (directory / "jobs" / "old.log").write_bytes(b"x" * 4000)
    spill = SpillBudget(directory, SpillLimits(max_session_bytes=5000))
    assert spill.grant(2000, 0) == (1000, "this session's saved outputs reached 4.9 KiB (spill.max_session_bytes)")


def test_spilling_stops_short_of_the_space_kept_free_for_the_store(tmpfs: Callable[[str], Path]) -> None:
    disk = tmpfs("4m")
    spill = SpillBudget(disk / "out", SpillLimits(max_call_bytes=100 * MiB, min_free_bytes=3 * MiB))
    text = "y\n" * (2 * MiB)  # 4 MiB: all of the device
    cut = limit_output(ToolResult.success(text), keep="tail", save_dir=spill.directory, call_id="flood", spill=spill)
    assert cut.full_output_path is not None
    size = os.path.getsize(cut.full_output_path)
    assert 0 < size <= MiB
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    assert free >= 3 * MiB - 4096  # the reserve is left (less at most a page of file metadata)
    assert f"is free on the device holding {spill.directory}, and 3 MiB is kept free for the store" in cut.output
    # Below the reserve nothing more is written at all.
    again = limit_output(ToolResult.success(text), keep="tail", save_dir=spill.directory, call_id="again", spill=spill)
    assert again.full_output_path is None
    assert "was not saved: only" in again.output


@pytest.mark.trio
async def test_a_flooding_background_job_spools_up_to_its_limit_and_runs_on(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    spill = SpillBudget(tmp_path / "out", SpillLimits(max_call_bytes=256 * 1024))
    jobs = JobTable(nursery_spawner(nursery), output_dir=spill.directory / "jobs", spill=spill, tail_bytes=4096)
    try:
        info = await jobs.start(["/bin/bash", "-c", "yes"], command="yes", cwd=tmp_path)
        # Far past the limit (and the spool's 1 MiB batches): the file stays at it.
        await await_until(lambda: jobs.get(info.id).output_bytes > 8 * MiB, timeout=30, message="8 MiB of output")
        running = jobs.get(info.id)
        assert running.running
        assert running.output_cut == (
            "it holds the first 262,144 bytes only, as one call saves at most 256 KiB (spill.max_call_bytes)"
        )
        assert running.output_path is not None
        assert (await trio.Path(running.output_path).stat()).st_size == 256 * 1024
        output = await jobs.kill(info.id)
        assert output.text.endswith("y\n")  # the tail in memory goes on past the file's end
    finally:
        await jobs.aclose()


def test_old_spill_directories_of_no_active_session_are_swept_and_the_rest_kept(tmp_path: Path) -> None:
    root = tmp_path / "spill"
    for name in ("active", "stopped-old", "stopped-new"):
        (root / name / "jobs").mkdir(parents=True)
        (root / name / "jobs" / "x.log").write_text("x")
    day_ago = time.time() - 86400
    for name in ("active", "stopped-old"):
        for path in (root / name, root / name / "jobs", root / name / "jobs" / "x.log"):
            os.utime(path, (day_ago, day_ago))
    removed = sweep_spill_dirs(root, {"active"}, retention=3600)
    assert removed == [root / "stopped-old"]
    assert sorted(p.name for p in root.iterdir()) == ["active", "stopped-new"]
    assert sweep_spill_dirs(tmp_path / "missing", set(), retention=0) == []


# -- the bookkeeping in the store -----------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "store.db")
    try:
        yield opened
    finally:
        opened.close()


def row_of(store: Store, session: str, node: str) -> SpillRow | None:
    store.flush().get(timeout=30)
    found: SpillRow | None = store.get(SPILL_NAMESPACE, spill_key(session, node), type=SpillRow)
    return found


def test_a_budget_with_a_ledger_goes_by_its_row_in_the_store_not_by_the_directory(tmp_path: Path, store: Store) -> None:
    directory = tmp_path / "out"
    directory.mkdir()  # empty: the files the row counts went behind its back
    store.put(
        SPILL_NAMESPACE,
        spill_key("s", "n1"),
        SpillRow(session="s", node="n1", directory=str(directory), bytes=4000, files=2),
    )
    spill = SpillBudget(directory, SpillLimits(max_session_bytes=5000), ledger=SpillLedger(lambda: store, "s", "n1"))
    assert spill.grant(2000, 0) == (1000, "this session's saved outputs reached 4.9 KiB (spill.max_session_bytes)")
    row = row_of(store, "s", "n1")
    assert row is not None
    assert (row.bytes, row.files, row.directory) == (5000, 3, str(directory))
    assert row.changed >= time.time() - 60
    spill.give_back(600, file=True)  # the write failed: no file either
    row = row_of(store, "s", "n1")
    assert row is not None
    assert (row.bytes, row.files) == (4400, 2)


def test_a_budget_without_a_row_counts_its_directory_once_and_writes_the_row(tmp_path: Path, store: Store) -> None:
    directory = tmp_path / "out"
    (directory / "jobs").mkdir(parents=True)
    (directory / "a.txt").write_bytes(b"x" * 3000)
    (directory / "jobs" / "b.log").write_bytes(b"y" * 1000)
    spill = SpillBudget(directory, SpillLimits(), ledger=SpillLedger(lambda: store, "s", "n1"))
    assert spill.used == 4000
    row = row_of(store, "s", "n1")
    assert row is not None
    assert (row.session, row.node, row.bytes, row.files) == ("s", "n1", 4000, 2)
    (directory / "a.txt").unlink()  # from now on the row is what counts
    assert spill.grant(500, 0) == (500, None)
    assert SpillBudget(directory, SpillLimits(), ledger=SpillLedger(lambda: store, "s", "n1")).used == 4500


def test_the_session_limit_counts_the_rows_of_every_node(tmp_path: Path, store: Store) -> None:
    directory = tmp_path / "out"
    other = SpillRow(session="s", node="n2", directory="/elsewhere/s", bytes=3000, files=1)
    store.put(SPILL_NAMESPACE, spill_key("s", "n2"), other)
    store.put(SPILL_NAMESPACE, spill_key("sx", "n1"), SpillRow(session="sx", node="n1", directory="/x", bytes=9999))
    spill = SpillBudget(directory, SpillLimits(max_session_bytes=5000), ledger=SpillLedger(lambda: store, "s", "n1"))
    granted, why = spill.grant(4000, 0)
    assert granted == 2000
    assert why is not None
    assert "spill.max_session_bytes" in why
    assert spill.used == 5000
    row = row_of(store, "s", "n1")
    assert row is not None
    assert row.bytes == 2000  # its own node's bytes only
    assert [r.node for r in session_spill(store, "s")] == ["n2", "n1"]
    assert forget_spill(store, ["s"]) == 2
    assert session_spill(store, "s") == []
    assert [r.session for r in session_spill(store, "sx")] == ["sx"]
