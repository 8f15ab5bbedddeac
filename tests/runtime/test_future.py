"""weald's Future: pykka's contract, awaitable from trio, and never blocking the loop."""

from __future__ import annotations

import queue
import threading

import pytest
import trio
from weald.runtime import Future, Timeout


def test_a_value_set_from_another_thread_reaches_a_blocked_getter() -> None:
    future: Future[int] = Future()
    threading.Timer(0.01, future.set, args=(7,)).start()
    assert future.get(timeout=5) == 7
    assert future.get() == 7


def test_an_exception_set_on_the_future_is_raised_by_get() -> None:
    future: Future[int] = Future()
    try:
        raise KeyError("k")
    except KeyError:
        future.set_exception()
    with pytest.raises(KeyError):
        future.get()


def test_setting_twice_is_refused_as_in_pykka() -> None:
    future: Future[int] = Future()
    future.set(1)
    with pytest.raises(queue.Full):
        future.set(2)


def test_get_times_out() -> None:
    with pytest.raises(Timeout):
        Future().get(timeout=0.01)


def test_map_and_join_keep_pykka_meaning() -> None:
    a: Future[int] = Future()
    b: Future[int] = Future()
    joined = a.join(b).map(sum)
    a.set(1)
    b.set(2)
    assert joined.get(timeout=5) == 3


@pytest.mark.trio
async def test_a_trio_task_awaits_a_value_set_from_a_thread() -> None:
    future: Future[str] = Future()
    threading.Timer(0.01, future.set, args=("done",)).start()
    assert await future == "done"


@pytest.mark.trio
async def test_awaiting_can_be_cancelled_and_the_future_still_completes_later() -> None:
    future: Future[int] = Future()
    with trio.move_on_after(0.01):
        await future
    future.set(3)
    assert await future == 3


@pytest.mark.trio
async def test_a_hooked_future_is_awaitable_too() -> None:
    future: Future[int] = Future()
    future.set(20)
    assert await future.map(lambda v: v + 1) == 21
