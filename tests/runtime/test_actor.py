"""The actor core: pykka's meaning kept, weald's crash rules, loop hosting, I/O, registry."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import attrs
import pykka
import pytest
import trio
import trio.lowlevel
from weald.runtime import (
    Actor,
    ActorDeadError,
    ActorSnapshot,
    ActorSystem,
    Down,
    Exit,
    IOCancelledError,
    LoopBlockedError,
    NameTakenError,
    NoSystemError,
    StartError,
    ThreadActor,
    Timeout,
)
from weald.runtime.testing import wait_until


class Echo(Actor):
    def on_receive(self, message: Any) -> Any:
        if message == "boom":
            raise ValueError("boom")
        return message

    def add(self, a: int, b: int) -> int:
        return a + b

    async def slow_add(self, a: int, b: int) -> int:
        await trio.lowlevel.checkpoint()
        return a + b


class ThreadEcho(ThreadActor):
    def on_receive(self, message: Any) -> Any:
        if message == "boom":
            raise ValueError("boom")
        return message


class Recorder(Actor):
    """Collects every message (Down included) it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[Any] = []

    def on_receive(self, message: Any) -> None:
        self.received.append(message)

    def messages(self) -> list[Any]:
        return list(self.received)

    def spawn(self, actor_class: type[Actor], name: str) -> Any:
        return self.spawn_child(actor_class, name=name)


def test_tell_ask_and_proxies_keep_pykka_meaning(system: ActorSystem) -> None:
    ref = Echo.start()
    assert ref.ask("hi") == "hi"
    future = ref.ask("later", block=False)
    assert isinstance(future, pykka.Future)
    assert future.get(timeout=5) == "later"
    proxy = ref.proxy()
    assert proxy.add(2, 3).get() == 5
    assert proxy.slow_add(2, 3).get() == 5
    ref.tell("fire and forget")
    assert ref.ask("still here") == "still here"


def test_thread_actor_is_a_pykka_threading_actor_with_the_same_api(system: ActorSystem) -> None:
    ref = ThreadEcho.start()
    assert issubclass(ThreadEcho, pykka.ThreadingActor)
    assert issubclass(ThreadEcho, Actor)
    assert ref.ask(41) == 41
    assert ref.stop() is True


@pytest.mark.parametrize("actor_class", [Echo, ThreadEcho])
def test_an_exception_in_an_ask_goes_back_to_the_caller_and_the_actor_lives(
    system: ActorSystem, actor_class: type[Actor]
) -> None:
    ref = actor_class.start()
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom")
    assert ref.is_alive()
    assert ref.ask("after") == "after"


@pytest.mark.parametrize("actor_class", [Echo, ThreadEcho])
def test_an_exception_escaping_a_tell_handler_crashes_the_actor_and_its_parent_gets_down(
    system: ActorSystem, actor_class: type[Actor]
) -> None:
    parent = Recorder.start()
    child = parent.proxy().spawn(actor_class, "child").get()
    assert child.path == f"{parent.path}/child"
    child.tell("boom")
    exit_ = child.exited().get(timeout=5)
    assert exit_.kind == "crashed"
    assert isinstance(exit_.error, ValueError)
    downs = wait_until(lambda: [m for m in parent.proxy().messages().get() if isinstance(m, Down)])
    assert downs[0].ref is child
    assert downs[0].path == child.path
    assert downs[0].exit.kind == "crashed"


class BaseRaiser(Actor):
    def on_receive(self, message: Any) -> None:
        raise message


class ThreadBaseRaiser(ThreadActor):
    def on_receive(self, message: Any) -> None:
        raise message


class CustomBase(BaseException):
    pass


@pytest.mark.parametrize("actor_class", [BaseRaiser, ThreadBaseRaiser])
@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt(), CustomBase("x"), GeneratorExit()])
def test_a_base_exception_crashes_only_the_actor_that_raised_it(
    system: ActorSystem, actor_class: type[Actor], error: BaseException
) -> None:
    bystander = Echo.start()
    thread_bystander = ThreadEcho.start()
    victim = actor_class.start()
    victim.tell(error)
    exit_ = victim.exited().get(timeout=5)
    assert exit_.kind == "crashed"
    assert exit_.error is error
    assert bystander.ask("alive") == "alive"
    assert thread_bystander.ask("alive") == "alive"
    assert system.root.is_alive()


@pytest.mark.parametrize("actor_class", [BaseRaiser, ThreadBaseRaiser])
def test_a_base_exception_in_an_ask_crashes_the_actor_and_still_answers_the_caller(
    system: ActorSystem, actor_class: type[Actor]
) -> None:
    victim = actor_class.start()
    with pytest.raises(CustomBase):
        victim.ask(CustomBase("in ask"))
    assert victim.exited().get(timeout=5).kind == "crashed"


class FailingStart(Actor):
    failures: list[tuple[Any, ...]] = []

    def on_start(self) -> None:
        raise RuntimeError("cannot start")

    def on_failure(self, *exc_info: Any) -> None:
        FailingStart.failures.append(exc_info)


class ThreadFailingStart(ThreadActor):
    failures: list[tuple[Any, ...]] = []

    def on_start(self) -> None:
        raise RuntimeError("cannot start")

    def on_failure(self, *exc_info: Any) -> None:
        ThreadFailingStart.failures.append(exc_info)


@pytest.mark.parametrize("actor_class", [FailingStart, ThreadFailingStart])
def test_a_failure_in_on_start_is_a_crash_and_on_failure_runs_for_it(system: ActorSystem, actor_class: Any) -> None:
    actor_class.failures.clear()
    ref = actor_class.start()
    with pytest.raises(StartError, match="cannot start") as info:
        ref.started().get(timeout=5)
    assert isinstance(info.value.__cause__, RuntimeError)
    exit_ = ref.exited().get(timeout=5)
    assert exit_.kind == "crashed"
    assert isinstance(exit_.error, RuntimeError)
    assert len(actor_class.failures) == 1
    assert actor_class.failures[0][0] is RuntimeError


class AsyncStart(Actor):
    async def on_start(self) -> None:
        await trio.lowlevel.checkpoint()
        self.ready = True

    def is_ready(self) -> bool:
        return self.ready


def test_on_start_may_be_async_and_runs_before_any_message(system: ActorSystem) -> None:
    ref = AsyncStart.start()
    assert ref.proxy().is_ready().get(timeout=5) is True


class Blocker(Actor):
    def block_on(self, other: Any) -> Any:
        return other.ask("x")  # blocking ask from the loop thread


def test_a_blocking_wait_on_the_loop_thread_raises_instead_of_deadlocking(system: ActorSystem) -> None:
    echo = Echo.start()
    blocker = Blocker.start()
    with pytest.raises(LoopBlockedError, match="await"):
        blocker.proxy().block_on(echo).get(timeout=5)
    assert echo.ask("fine") == "fine"


class Asker(Actor):
    async def relay(self, other: Any, message: Any) -> Any:
        return await other.ask(message, block=False)

    async def relay_proxy(self, other: Any) -> int:
        return await other.proxy().add(20, 22)


@pytest.mark.parametrize("target_class", [Echo, ThreadEcho])
def test_an_async_handler_can_await_another_actors_reply(system: ActorSystem, target_class: type[Actor]) -> None:
    target = target_class.start()
    asker = Asker.start()
    assert asker.proxy().relay(target, "ping").get(timeout=5) == "ping"
    if target_class is Echo:
        assert asker.proxy().relay_proxy(target).get(timeout=5) == 42


def test_awaiting_a_reply_that_raises_delivers_the_exception(system: ActorSystem) -> None:
    target = Echo.start()
    asker = Asker.start()
    with pytest.raises(ValueError, match="boom"):
        asker.proxy().relay(target, "boom").get(timeout=5)


class Stuck(Actor):
    async def hang(self) -> None:
        await trio.sleep_forever()


def test_messages_left_in_the_inbox_after_a_stop_get_actor_dead_error(system: ActorSystem) -> None:
    ref = Stuck.start()
    ref.proxy().hang()
    stop = ref.stop(block=False)
    pending = ref.ask("never handled", block=False)
    ref.kill()
    with pytest.raises(ActorDeadError):
        pending.get(timeout=5)
    assert ref.exited().get(timeout=5).kind == "killed"
    stop.get(timeout=5)


def test_stop_returns_true_for_a_running_actor_and_false_for_a_dead_one(system: ActorSystem) -> None:
    ref = Echo.start()
    assert ref.stop() is True
    assert ref.exit == Exit("normal")
    assert ref.stop() is False
    with pytest.raises(ActorDeadError):
        ref.ask("x")
    with pytest.raises(ActorDeadError):
        ref.tell("x")


def test_a_message_sent_while_the_actor_ends_is_answered_not_lost(system: ActorSystem) -> None:
    refs = [Echo.start() for _ in range(50)]
    futures = []
    for ref in refs:
        ref.stop(block=False)
        try:
            futures.append(ref.ask("late", block=False))
        except ActorDeadError:
            continue
    for future in futures:
        with pytest.raises(ActorDeadError):
            future.get(timeout=5)


def test_kill_cancels_a_loop_actor_stuck_in_an_async_handler(system: ActorSystem) -> None:
    ref = Stuck.start()
    hung = ref.proxy().hang()
    ref.kill()
    assert ref.exited().get(timeout=5).kind == "killed"
    with pytest.raises(ActorDeadError):
        hung.get(timeout=5)


class ThreadStuck(ThreadActor):
    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def hang(self) -> None:
        self.release.wait(10)


def test_kill_abandons_a_thread_actor_stuck_in_blocking_code_and_reports_it(system: ActorSystem) -> None:
    release = threading.Event()
    ref = ThreadStuck.start(release)
    ref.proxy().hang()
    wait_until(lambda: ref.mailbox_size() == 0)
    ref.kill()
    assert ref.exited().get(timeout=5).kind == "killed"
    assert system.whereis(ref.path) is None
    release.set()  # the abandoned thread finishes its handler and ends alone


class IOUser(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.results: list[Any] = []
        self.handle: Any = None

    def on_receive(self, message: Any) -> None:
        self.results.append(message)

    def fetch(self, value: int) -> None:
        async def work() -> int:
            await trio.lowlevel.checkpoint()
            return value * 2

        self.run_io(work, reply=lambda outcome: ("done", outcome.unwrap()))

    def fail(self) -> None:
        async def work() -> None:
            raise OSError("network down")

        self.run_io(work, reply=lambda outcome: ("failed", outcome.error))

    def forever(self) -> None:
        self.handle = self.run_io(trio.sleep_forever, reply=lambda outcome: ("ended", outcome.error))

    def cancel(self) -> None:
        self.handle.cancel()

    def seen(self) -> list[Any]:
        return list(self.results)


def test_run_io_results_come_back_as_messages_in_the_actors_own_context(system: ActorSystem) -> None:
    ref = IOUser.start()
    ref.proxy().fetch(21)
    ref.proxy().fail()
    seen = wait_until(lambda: ref.proxy().seen().get() if len(ref.proxy().seen().get()) == 2 else None)
    assert ("done", 42) in seen
    failed = next(m for m in seen if m[0] == "failed")
    assert isinstance(failed[1], OSError)


def test_a_cancelled_io_task_reports_io_cancelled_error(system: ActorSystem) -> None:
    ref = IOUser.start()
    ref.proxy().forever().get()
    ref.proxy().cancel().get()
    seen = wait_until(lambda: ref.proxy().seen().get())
    assert seen[0][0] == "ended"
    assert isinstance(seen[0][1], IOCancelledError)


def test_io_tasks_are_cancelled_when_their_actor_ends(system: ActorSystem) -> None:
    ref = IOUser.start()
    ref.proxy().forever().get()
    tasks_with_io = system.loop.statistics().tasks
    ref.stop()
    wait_until(lambda: system.loop.statistics().tasks < tasks_with_io)


def test_whereis_finds_a_live_actor_and_forgets_it_when_it_dies(system: ActorSystem) -> None:
    ref = system.spawn(Echo, name="echo")
    assert ref.path == "/echo"
    assert system.whereis("/echo") is ref
    ref.tell("boom")
    ref.exited().get(timeout=5)
    assert system.whereis("/echo") is None
    again = system.spawn(Echo, name="echo")
    assert system.whereis("/echo") is again


def test_a_path_held_by_a_live_actor_cannot_be_taken(system: ActorSystem) -> None:
    system.spawn(Echo, name="taken")
    with pytest.raises(NameTakenError, match="/taken"):
        system.spawn(Echo, name="taken")


class Hoarder(Actor):
    """Holds what it is told: a list that grows, and a big shared config it does not own."""

    def __init__(self, shared: Any) -> None:
        super().__init__()
        self.kept: list[str] = []
        self.shared = shared

    def set_kept(self, kept: list[str]) -> None:
        self.kept = kept

    def on_receive(self, message: Any) -> None:
        if message == "wait":
            threading.Event().wait(0.3)  # a slow handler: what is sent meanwhile waits in the mailbox
            return
        self.kept.append(message)


@attrs.frozen
class BigConfig:
    blob: str


def test_statistics_read_status_mailbox_and_handled_without_a_message(system: ActorSystem) -> None:
    ref = system.spawn(Hoarder, kwargs={"shared": None}, name="stats")
    ref.ask("first")
    stats = ref.statistics()
    assert stats is not None
    assert (stats.path, stats.kind, stats.status, stats.mailbox, stats.handled) == (
        "/stats",
        "Hoarder",
        "running",
        0,
        1,
    )
    ref.tell("wait")
    for n in range(5):
        ref.tell(f"queued {n}")
    wait_until(lambda: (s := ref.statistics()) is not None and s.mailbox == 5, timeout=10)
    wait_until(lambda: (s := ref.statistics()) is not None and s.handled == 7, timeout=10)
    # Asking it nothing: its handled count moved only by what it was sent.
    assert ref.proxy().snapshot().get(timeout=5).handled == 7
    ref.stop()
    assert ref.statistics() is None


def test_memory_estimate_grows_with_what_the_actor_holds_and_leaves_out_what_it_shares(system: ActorSystem) -> None:
    config = BigConfig("x" * 1_000_000)
    ref = system.spawn(Hoarder, kwargs={"shared": config}, name="hoard")
    empty = ref.memory_estimate()
    assert empty is not None
    assert empty.complete
    assert empty.bytes < 100_000, "the shared frozen config (1 MB), the system and the loop are not the actor's"
    for n in range(200):
        ref.tell("y" * 1000 + str(n))
    wait_until(lambda: (s := ref.statistics()) is not None and s.handled == 200, timeout=10)
    full = ref.memory_estimate()
    assert full is not None
    assert 200_000 <= full.bytes - empty.bytes <= 300_000
    assert full.objects > 200
    # A bound on the walk: a huge state is under-counted, and says so, never slow.
    cut = ref.memory_estimate(max_objects=10)
    assert cut is not None
    assert cut.objects == 10
    assert not cut.complete
    assert cut.bytes < full.bytes
    ref.stop()
    assert ref.memory_estimate() is None


class Counted(list[object]):
    """A list that counts the items its iterations handed out."""

    handed = 0

    def __iter__(self) -> Iterator[object]:
        for item in super().__iter__():
            Counted.handed += 1
            yield item


def test_a_memory_estimate_stays_in_its_budget_however_large_a_container(system: ActorSystem) -> None:
    ref = system.spawn(Hoarder, kwargs={"shared": None}, name="huge")
    ref.ask("first")
    actor_list = Counted(object() for _ in range(100_000))
    ref.proxy().set_kept(actor_list).get(timeout=5)
    Counted.handed = 0
    huge = ref.memory_estimate(max_objects=1000)
    assert huge is not None
    assert not huge.complete
    assert huge.objects == 1000
    # The 100,000 items were not walked to look at a thousand objects.
    assert Counted.handed <= 1000


def test_snapshot_returns_a_frozen_attrs_value(system: ActorSystem) -> None:
    ref = system.spawn(Echo, name="snap")
    snap = ref.proxy().snapshot().get()
    assert isinstance(snap, ActorSnapshot)
    assert snap.path == "/snap"
    assert snap.kind == "Echo"
    assert snap.status == "running"
    with pytest.raises(AttributeError):
        snap.path = "/other"  # type: ignore[misc]


def test_an_actor_cannot_be_constructed_directly(system: ActorSystem) -> None:
    with pytest.raises(NoSystemError, match=r"\.start\(\)"):
        Echo()


def test_starting_an_actor_without_a_running_system_is_a_clear_error() -> None:
    with pytest.raises(NoSystemError, match="no ActorSystem is running"):
        Echo.start()


class Logged(Actor):
    """Appends (its name, the message) to a log shared by every instance."""

    log: ClassVar[list[tuple[str, Any]]] = []

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def on_receive(self, message: Any) -> None:
        Logged.log.append((self.name, message))


def test_a_busy_actor_does_not_starve_the_others(system: ActorSystem) -> None:
    Logged.log = []
    busy = Logged.start("busy")
    other = Logged.start("other")
    busy.started().get(timeout=5)
    other.started().get(timeout=5)

    def queue_all() -> None:
        # One step of the loop: no actor runs until every message is queued.
        for i in range(20_000):
            busy.tell(i)
        other.tell("quick")

    trio.from_thread.run_sync(queue_all, trio_token=system.loop.token)
    wait_until(lambda: len(Logged.log) == 20_001)
    handled_before = Logged.log.index(("other", "quick"))
    # `other` is served after a burst or two of busy's backlog, not after all 20,000.
    assert handled_before < 200, handled_before
    assert [m for name, m in Logged.log if name == "busy"] == list(range(20_000))


def test_ten_thousand_loop_actors_need_no_extra_threads(system: ActorSystem) -> None:
    threads = threading.active_count()
    refs = [Echo.start() for _ in range(10_000)]
    futures = [r.ask(n, block=False) for n, r in enumerate(refs)]
    assert [f.get(timeout=30) for f in futures] == list(range(10_000))
    assert threading.active_count() <= threads + 1
    for future in [r.stop(block=False) for r in refs]:
        future.get(timeout=30)


def test_get_with_a_timeout_raises_pykka_timeout(system: ActorSystem) -> None:
    ref = Stuck.start()
    future = ref.proxy().hang()
    with pytest.raises(Timeout):
        future.get(timeout=0.01)
    ref.kill()
