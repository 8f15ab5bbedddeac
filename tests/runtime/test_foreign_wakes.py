"""Asks from foreign threads (not the loop's): the loop's door for them (`Loop.wake_soon`).

A burst of messages from many threads costs the loop one kick; none may be
lost, whether the kick is trio's I/O-manager wake-up or ``run_sync_soon``,
and whether the ask races the actor's stop, the system's shutdown or the
loop's end.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
import trio
import trio.lowlevel
from pykka import ActorDeadError
from weald.runtime import Actor, ActorSystem
from weald.runtime import _future as future_module
from weald.runtime import _loop as loop_module
from weald.runtime._loop import Loop

THREADS = 6
ASKS = 300


class Echo(Actor):
    def on_receive(self, message: Any) -> Any:
        return message

    async def later(self, value: int) -> int:
        await trio.lowlevel.checkpoint()
        return value


@pytest.fixture(params=["force_wakeup", "run_sync_soon"])
def kick_system(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ActorSystem]:
    """A system whose loop is kicked the fast way (trio's I/O-manager wake-up) or the public way."""
    monkeypatch.setattr(loop_module, "USE_FORCE_WAKEUP", request.param == "force_wakeup")
    system = ActorSystem(store_path=tmp_path / "store.sqlite")
    system.start()
    try:
        yield system
    finally:
        system.shutdown()


def _hammer(refs: list[Any], results: list[list[Any]], index: int, start: threading.Barrier) -> None:
    start.wait()
    out = results[index]
    for i in range(ASKS):
        ref = refs[(index + i) % len(refs)]
        value = (index, i)
        if i % 3 == 0:
            out.append((value, ref.ask(value, block=False)))
        elif i % 3 == 1:
            out.append((i, ref.proxy().later(i)))
        else:
            out.append((value, ref.ask(value)))


def test_a_burst_of_asks_from_many_threads_is_answered_in_full(kick_system: ActorSystem) -> None:
    refs = [Echo.start() for _ in range(4)]
    for ref in refs:
        ref.started().get(timeout=5)
    results: list[list[Any]] = [[] for _ in range(THREADS)]
    start = threading.Barrier(THREADS)
    threads = [threading.Thread(target=_hammer, args=(refs, results, i, start)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    answered = 0
    for out in results:
        assert len(out) == ASKS
        for expected, reply in out:
            got = reply.get(timeout=10) if hasattr(reply, "get") else reply
            assert got == expected
            answered += 1
    assert answered == THREADS * ASKS


class Spinner(Actor):
    async def spin(self, passes: int) -> None:
        for _ in range(passes):
            await trio.lowlevel.checkpoint()


def test_the_doors_instrument_leaves_a_busy_loop_and_the_next_foreign_ask_brings_it_back(
    kick_system: ActorSystem,
) -> None:
    wakes = kick_system.loop._wakes
    echo = Echo.start()
    assert echo.ask("first") == "first"
    assert wakes.installed
    Spinner.start().proxy().spin(loop_module._IDLE_PASSES * 2).get(timeout=10)  # passes with no foreign work
    assert not wakes.installed
    assert [echo.ask(i) for i in range(50)] == list(range(50))
    assert wakes.installed


class Slow(Actor):
    async def on_receive(self, message: Any) -> Any:
        await trio.sleep(message)
        return message


def test_a_thread_sharing_its_only_cpu_with_the_loop_yields_it_and_still_gets_every_answer(
    kick_system: ActorSystem,
) -> None:
    loop_tid = future_module.LOOP_NATIVE_IDS[kick_system.loop._thread_id]  # type: ignore[index]
    before_loop, before_me = os.sched_getaffinity(loop_tid), os.sched_getaffinity(0)
    if len(before_me) < 2:
        pytest.fail("this test needs a machine with at least 2 CPUs (it compares one CPU with two)")
    echo, slow = Echo.start(), Slow.start()
    assert not future_module._shares_its_only_cpu_with_the_loop()
    cpu = min(before_me)
    try:
        os.sched_setaffinity(0, {cpu})
        assert not future_module._shares_its_only_cpu_with_the_loop()  # the loop may still run elsewhere
        os.sched_setaffinity(loop_tid, {cpu})
        assert future_module._shares_its_only_cpu_with_the_loop()
        assert [echo.ask(i) for i in range(200)] == list(range(200))
        assert slow.ask(0.05) == 0.05  # longer than the yields: then it sleeps on its lock
        with pytest.raises(pykka.Timeout):
            slow.ask(0.5, timeout=0.05)
        with pytest.raises(ValueError, match="7"):
            Recorder.start().proxy().fail(7).get()
    finally:
        os.sched_setaffinity(loop_tid, before_loop)
        os.sched_setaffinity(0, before_me)


class Recorder(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[Any] = []

    def on_receive(self, message: Any) -> Any:
        self.log.append(message)
        return len(self.log)

    async def slow(self, value: Any) -> int:
        await trio.lowlevel.checkpoint()
        self.log.append(value)
        return len(self.log)

    def fail(self, value: Any) -> None:
        self.log.append(value)
        raise ValueError(value)

    def seen(self) -> list[Any]:
        return list(self.log)


def test_a_foreign_threads_mixed_messages_are_handled_in_the_order_sent(kick_system: ActorSystem) -> None:
    ref = Recorder.start()
    proxy = ref.proxy()
    replies: list[Any] = []
    for i in range(200):
        kind = i % 4
        if kind == 0:
            ref.tell(i)
        elif kind == 1:
            replies.append(proxy.slow(i))  # an async handler: its task awaits it
        elif kind == 2:
            replies.append(ref.ask(i, block=False))
        else:
            replies.append(proxy.fail(i))  # an ask's exception goes back; the actor lives
    for reply in replies:
        try:
            reply.get(timeout=10)
        except ValueError:
            continue
    assert proxy.seen().get(timeout=10) == list(range(200))
    assert ref.is_alive()


class NeedsItsTask(Actor):
    serve_foreign_inline = False

    def on_start(self) -> None:
        self.task = trio.lowlevel.current_task()

    def on_receive(self, message: Any) -> Any:
        try:
            return trio.lowlevel.current_task() is self.task
        except RuntimeError:  # no task at all
            return False


def test_an_actor_can_keep_foreign_messages_in_its_own_task(kick_system: ActorSystem) -> None:
    ref = NeedsItsTask.start()
    ref.started().get(timeout=5)
    assert all(ref.ask(i) for i in range(20))


def _ask_until_dead(refs: list[Any], index: int, count: int, futures: list[Any], start: threading.Barrier) -> None:
    start.wait()
    for i in range(count):
        try:
            futures.append((i, refs[(index + i) % len(refs)].ask(i, block=False)))
        except ActorDeadError:
            return


def _answered_or_dead(futures: list[Any]) -> None:
    for i, future in futures:
        try:
            assert future.get(timeout=5) == i
        except ActorDeadError:
            continue


def _race(refs: list[Any], count: int, stop: Any) -> None:
    futures: list[Any] = []
    start = threading.Barrier(4)
    threads = [threading.Thread(target=_ask_until_dead, args=(refs, i, count, futures, start)) for i in range(3)]
    for thread in threads:
        thread.start()
    start.wait()
    stop()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    _answered_or_dead(futures)


def test_asks_racing_the_actors_stop_are_answered_or_told_it_is_dead(kick_system: ActorSystem) -> None:
    for _ in range(20):
        ref = Echo.start()
        ref.started().get(timeout=5)
        _race([ref], 200, lambda ref=ref: ref.stop(block=False))


def test_asks_racing_the_systems_shutdown_are_answered_or_told_it_is_dead(tmp_path: Path) -> None:
    for round_ in range(5):
        system = ActorSystem(store_path=tmp_path / f"store{round_}.sqlite")
        system.start()
        _race([Echo.start() for _ in range(3)], 2000, system.shutdown)


class _Target:
    """Counts how a wake-up ended: woken on the loop, answered after it, or refused to the caller."""

    def __init__(self) -> None:
        self.woken = 0
        self.gone = 0
        self.refused = False

    def _loop_wake(self) -> None:
        self.woken += 1

    def _loop_gone(self) -> None:
        self.gone += 1


def _wake_until_refused(loop: Loop, targets: list[_Target], started: threading.Event) -> None:
    while True:
        target = _Target()
        targets.append(target)
        try:
            loop.wake_soon(target)
        except trio.RunFinishedError:
            target.refused = True
            return
        started.set()


@pytest.mark.parametrize("force_wakeup", [True, False])
def test_a_wake_up_racing_the_loops_end_is_run_answered_or_refused_never_lost(
    force_wakeup: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_module, "USE_FORCE_WAKEUP", force_wakeup)
    for _ in range(10):
        loop = Loop()
        loop.start()
        targets: list[_Target] = []
        started = threading.Event()
        thread = threading.Thread(target=_wake_until_refused, args=(loop, targets, started))
        thread.start()
        assert started.wait(5)
        loop.stop()
        thread.join(10)
        assert not thread.is_alive()
        assert targets[-1].refused
        for target in targets:
            assert target.woken + target.gone <= 1
            assert target.woken or target.gone or target.refused


def test_a_task_spawned_from_a_thread_runs_and_one_spawned_after_the_loop_ended_is_refused() -> None:
    loop = Loop()
    loop.start()
    ran = threading.Event()

    async def mark() -> None:
        ran.set()

    loop.spawn_nowait(mark)
    assert ran.wait(5)
    loop.stop()
    with pytest.raises(trio.RunFinishedError):
        loop.spawn_nowait(mark)
