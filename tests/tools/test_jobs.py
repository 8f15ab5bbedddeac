"""Background jobs: the JobTable directly, and through the shell tool's actions."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from weald.runtime.testing import await_until, live_members, process_alive
from weald.tools import SessionServices, ToolConfig, ToolContext, ToolError, ToolResult, invoke
from weald.tools._jobs import JobTable, nursery_spawner
from weald.tools.shell import shell

GRACE = 0.3


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
async def jobs(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[JobTable]:
    table = JobTable(nursery_spawner(nursery), output_dir=tmp_path / "out", kill_grace=GRACE, tail_bytes=64 * 1024)
    yield table
    await table.aclose()


@pytest.fixture
def make_ctx(work: Path, tmp_path: Path, jobs: JobTable) -> Callable[..., ToolContext]:
    def make(**fields: Any) -> ToolContext:
        fields.setdefault("working_dir", work)
        fields.setdefault("session", SessionServices(output_dir=tmp_path / "out", jobs=jobs))
        fields.setdefault("config", ToolConfig(options={"shell": {"kill_grace": GRACE}}))
        return ToolContext(**fields)

    return make


async def start(jobs: JobTable, command: str, cwd: Path) -> str:
    info = await jobs.start(["/bin/bash", "-c", command], command=command, cwd=cwd)
    return info.id


async def call(ctx: ToolContext, **arguments: Any) -> ToolResult:
    return await invoke(shell, ctx, arguments)


# -- JobTable ---------------------------------------------------------------------------


@pytest.mark.trio
async def test_a_job_runs_to_its_end_and_wait_returns_its_output_and_exit_code(jobs: JobTable, work: Path) -> None:
    job_id = await start(jobs, "echo one; echo two >&2; exit 4", work)
    output = await jobs.wait(job_id, 10)
    assert output.job.status == "exited"
    assert output.job.exit_code == 4
    assert sorted(output.text.split()) == ["one", "two"]
    again = await jobs.wait(job_id, 10)
    assert again.text == ""


@pytest.mark.trio
async def test_wait_returns_at_its_timeout_with_the_output_so_far(jobs: JobTable, work: Path) -> None:
    job_id = await start(jobs, "echo started; sleep 1000", work)
    await jobs.wait_output(job_id, 10, after=0)
    output = await jobs.wait(job_id, 0.05)
    assert output.job.status == "running"
    assert output.text == "started\n"


@pytest.mark.trio
async def test_input_reaches_the_job_and_eof_ends_it(jobs: JobTable, work: Path) -> None:
    job_id = await start(jobs, "cat", work)
    await jobs.send_input(job_id, "hello cat\n")
    await jobs.wait_output(job_id, 10, after=0)
    assert jobs.read_nowait(job_id).text == "hello cat\n"
    await jobs.send_input(job_id, "", eof=True)
    output = await jobs.wait(job_id, 10)
    assert output.job.status == "exited"
    assert output.job.exit_code == 0
    with pytest.raises(ToolError, match="not running"):
        await jobs.send_input(job_id, "too late\n")


@pytest.mark.trio
async def test_kill_stops_a_job_that_ignores_sigterm_and_its_children(jobs: JobTable, work: Path) -> None:
    job_id = await start(jobs, "trap '' TERM; sleep 1000 & echo $!; wait", work)
    await jobs.wait_output(job_id, 10, after=0)
    sleeper = int(jobs.read_nowait(job_id).text)
    pgid = jobs.get(job_id).pid
    assert pgid is not None
    output = await jobs.kill(job_id)
    assert output.job.status == "killed"
    assert output.job.exit_code == -9
    assert not process_alive(sleeper)
    assert live_members(pgid) == []


@pytest.mark.trio
async def test_a_job_outlives_the_task_that_started_it(jobs: JobTable, work: Path) -> None:
    async with trio.open_nursery() as caller:
        ids: list[str] = []

        async def starter() -> None:
            ids.append(await start(jobs, "sleep 1000", work))

        caller.start_soon(starter)
    pid = jobs.get(ids[0]).pid
    assert pid is not None
    assert process_alive(pid)
    assert jobs.get(ids[0]).status == "running"


@pytest.mark.trio
async def test_output_is_bounded_in_memory_and_spooled_in_full(jobs: JobTable, work: Path) -> None:
    job_id = await start(jobs, "seq 1 200000", work)
    output = await jobs.wait(job_id, 10)
    assert output.job.status == "exited"
    assert len(output.text.encode()) <= 64 * 1024
    assert output.text.endswith("200000\n")
    assert output.omitted > 0
    assert output.job.output_path is not None
    spooled = await trio.Path(output.job.output_path).read_text()
    assert spooled.splitlines() == [str(n) for n in range(1, 200001)]


@pytest.mark.trio
async def test_snapshot_lists_every_job(jobs: JobTable, work: Path) -> None:
    first = await start(jobs, "true", work)
    second = await start(jobs, "sleep 1000", work)
    await jobs.wait(first, 10)
    states = {info.id: info.status for info in jobs.snapshot()}
    assert states == {first: "exited", second: "running"}


@pytest.mark.trio
async def test_aclose_kills_every_job_and_refuses_new_ones(jobs: JobTable, work: Path) -> None:
    stubborn = await start(jobs, "trap '' TERM; sleep 1000", work)
    plain = await start(jobs, "sleep 1000", work)
    pgids = [jobs.get(job_id).pid for job_id in (stubborn, plain)]
    await jobs.aclose()
    assert all(pgid is not None and live_members(pgid) == [] for pgid in pgids)
    assert {info.status for info in jobs.snapshot()} == {"killed"}
    with pytest.raises(ToolError, match="session is ending"):
        await start(jobs, "true", work)


@pytest.mark.trio
async def test_close_from_another_thread_kills_every_job(jobs: JobTable, work: Path) -> None:
    stubborn = await start(jobs, "trap '' TERM; sleep 1000", work)
    plain = await start(jobs, "sleep 1000", work)
    pgids = [jobs.get(job_id).pid for job_id in (stubborn, plain)]
    await trio.to_thread.run_sync(jobs.close)
    assert all(pgid is not None and live_members(pgid) == [] for pgid in pgids)
    await await_until(lambda: all(not info.running for info in jobs.snapshot()), message="the supervisors to end")
    with pytest.raises(RuntimeError, match="aclose"):
        jobs.close()


@pytest.mark.trio
async def test_close_nowait_kills_at_once(jobs: JobTable, work: Path) -> None:
    job_id = await start(jobs, "trap '' TERM; sleep 1000", work)
    pgid = jobs.get(job_id).pid
    assert pgid is not None
    jobs.close_nowait()
    await await_until(lambda: not jobs.get(job_id).running, message="the job to end")
    assert live_members(pgid) == []
    assert jobs.get(job_id).status == "killed"


ESCAPE = "setsid sleep 1000 & echo $!; sleep 1000"  # the sleeper leaves the job's session


async def _escaped_sleeper(jobs: JobTable, job_id: str) -> int:
    await jobs.wait_output(job_id, 10, after=0)
    sleeper = int(jobs.read_nowait(job_id).text.split()[0])
    pgid = jobs.get(job_id).pid
    assert pgid is not None
    # $! is printed before the child has called setsid: wait until it has left.
    await await_until(
        lambda: process_alive(sleeper) and sleeper not in live_members(pgid), message="the sleeper to leave"
    )
    return sleeper


@pytest.mark.trio
async def test_kill_stops_a_process_that_left_the_jobs_session(jobs: JobTable, work: Path) -> None:
    job_id = await start(jobs, ESCAPE, work)
    sleeper = await _escaped_sleeper(jobs, job_id)
    try:
        await jobs.kill(job_id)
        await await_until(lambda: not process_alive(sleeper), message="the escaped sleeper to be stopped")
    finally:
        if process_alive(sleeper):
            os.kill(sleeper, 9)


@pytest.mark.trio
@pytest.mark.parametrize("how", ["close", "close_nowait", "aclose"])
async def test_closing_the_table_stops_processes_that_left_a_jobs_session(jobs: JobTable, work: Path, how: str) -> None:
    job_id = await start(jobs, ESCAPE, work)
    sleeper = await _escaped_sleeper(jobs, job_id)
    try:
        if how == "close":
            await trio.to_thread.run_sync(jobs.close)
        elif how == "close_nowait":
            jobs.close_nowait()
        else:
            await jobs.aclose()
        await await_until(lambda: not process_alive(sleeper), message="the escaped sleeper to be stopped")
    finally:
        if process_alive(sleeper):
            os.kill(sleeper, 9)


@pytest.mark.trio
async def test_a_job_that_cannot_start_is_an_error(jobs: JobTable, work: Path) -> None:
    with pytest.raises(ToolError, match="did not start"):
        await jobs.start(["/no/such/program"], command="nothing", cwd=work)
    assert jobs.snapshot()[0].status == "failed"


@pytest.mark.trio
async def test_too_many_running_jobs_are_refused(nursery: trio.Nursery, tmp_path: Path, work: Path) -> None:
    table = JobTable(nursery_spawner(nursery), output_dir=tmp_path, max_running=1, kill_grace=GRACE)
    try:
        await start(table, "sleep 1000", work)
        with pytest.raises(ToolError, match="already running"):
            await start(table, "sleep 1000", work)
    finally:
        await table.aclose()


@pytest.mark.trio
async def test_unknown_job_ids_are_errors_that_list_the_jobs(jobs: JobTable, work: Path) -> None:
    job_id = await start(jobs, "true", work)
    with pytest.raises(ToolError, match=f"no background job 'job99'.*{job_id}"):
        await jobs.wait("job99", 1)


# -- through the shell tool ---------------------------------------------------------------


@pytest.mark.trio
async def test_shell_background_returns_a_job_id_at_once(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx()
    started = await call(ctx, command="echo ready; sleep 1000", background=True)
    assert started.ok
    job_id = started.data["job_id"]
    assert job_id in started.output
    assert process_alive(started.data["pid"])
    waited = await call(ctx, action="wait", job_id=job_id, timeout=0.3)
    assert waited.ok
    assert "still running" in waited.output
    assert "ready" in waited.output
    assert any("kill" in hint for hint in waited.hints)
    listed = await call(ctx, action="list")
    assert f"{job_id}: running" in listed.output
    killed = await call(ctx, action="kill", job_id=job_id)
    assert killed.ok
    assert "was killed" in killed.output
    assert not process_alive(started.data["pid"])


@pytest.mark.trio
async def test_shell_input_writes_to_the_job_and_returns_its_reply(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx()
    job_id = (await call(ctx, command="cat", background=True)).data["job_id"]
    replied = await call(ctx, action="input", job_id=job_id, text="ping\n", timeout=5)
    assert replied.ok
    assert "ping" in replied.output
    closed = await call(ctx, action="input", job_id=job_id, eof=True)
    assert "closed its stdin" in closed.output
    ended = await call(ctx, action="wait", job_id=job_id, timeout=5)
    assert ended.ok
    assert "ended" in ended.output
    assert "exit code 0" in ended.output


@pytest.mark.trio
async def test_shell_wait_on_a_failed_job_is_an_error_with_its_exit_code(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx()
    job_id = (await call(ctx, command="echo bad; exit 2", background=True)).data["job_id"]
    ended = await call(ctx, action="wait", job_id=job_id, timeout=5)
    assert not ended.ok
    assert "exit code 2" in ended.output
    assert "bad" in ended.output


@pytest.mark.trio
async def test_shell_job_actions_need_a_job_id(make_ctx: Callable[..., ToolContext]) -> None:
    result = await call(make_ctx(), action="kill")
    assert not result.ok
    assert "job_id is required" in result.output
    listed = await call(make_ctx(), action="list")
    assert listed.ok
    assert "No background jobs" in listed.output


@pytest.mark.trio
async def test_closing_the_table_kills_jobs_started_by_the_tool(
    make_ctx: Callable[..., ToolContext],
    jobs: JobTable,
) -> None:
    ctx = make_ctx()
    pids = [(await call(ctx, command="sleep 1000", background=True)).data["pid"] for _ in range(3)]
    assert all(process_alive(pid) for pid in pids)
    await jobs.aclose()
    assert not any(process_alive(pid) for pid in pids)
    assert os.getpgid(os.getpid())  # this process is untouched
