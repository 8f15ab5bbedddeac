"""OTP semantics of Supervisor, one rule per test."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
from sup_workers import JOURNAL, FakeClock, ThreadWorker, Worker
from weald.runtime import Actor, ActorSystem, Ref, StartError, ThreadActor
from weald.runtime.testing import wait_for_event, wait_until
from weald.supervisors import (
    Backoff,
    ChildExistsError,
    ChildInfo,
    ChildNotFoundError,
    ChildRunningError,
    ChildSpec,
    RestartIntensityError,
    Supervisor,
    SupervisorSnapshot,
)

WORKERS = [Worker, ThreadWorker]


def child_ref(sup: Ref[Any], child_id: str) -> Ref[Any] | None:
    for info in sup.proxy().which_children().get(timeout=5):
        if info.id == child_id:
            return info.ref
    return None


def crash_and_wait(sup: Ref[Any], child_id: str) -> Ref[Any]:
    """Crash a child and return its replacement once the supervisor has handled the crash."""
    old = child_ref(sup, child_id)
    assert old is not None
    old.tell("crash")
    old.exited().get(timeout=5)
    return wait_until(lambda: (r := child_ref(sup, child_id)) is not None and r is not old and r)


@pytest.mark.parametrize("worker", WORKERS)
def test_children_start_in_list_order_and_stop_in_reverse_order(system: ActorSystem, worker: type[Actor]) -> None:
    sup = Supervisor.start([ChildSpec(i, worker) for i in "abc"], name="s")
    assert [c.id for c in sup.proxy().which_children().get()] == ["a", "b", "c"]
    assert JOURNAL.of("start") == ["/s/a", "/s/b", "/s/c"]
    sup.stop()
    assert JOURNAL.of("stop") == ["/s/c", "/s/b", "/s/a"]


@pytest.mark.parametrize("worker", WORKERS)
def test_an_exception_escaping_a_tell_handler_is_a_crash_and_a_permanent_child_is_restarted(
    system: ActorSystem, worker: type[Actor]
) -> None:
    sup = Supervisor.start([ChildSpec("w", worker)], name="s")
    new = crash_and_wait(sup, "w")
    assert new.ask("ping") == "ping"
    assert sup.proxy().which_children().get()[0].restarts == 1


@pytest.mark.parametrize("worker", WORKERS)
def test_any_base_exception_is_a_crash(system: ActorSystem, worker: type[Actor]) -> None:
    sup = Supervisor.start([ChildSpec("w", worker)], name="s")
    old = child_ref(sup, "w")
    assert old is not None
    old.tell(SystemExit(1))
    assert old.exited().get(timeout=5).kind == "crashed"
    wait_until(lambda: (r := child_ref(sup, "w")) is not None and r is not old)


@pytest.mark.parametrize("worker", WORKERS)
def test_an_exception_in_an_ask_goes_back_to_the_caller_and_the_child_is_not_restarted(
    system: ActorSystem, worker: type[Actor]
) -> None:
    sup = Supervisor.start([ChildSpec("w", worker)], name="s")
    ref = child_ref(sup, "w")
    assert ref is not None
    with pytest.raises(ValueError, match="bad request"):
        ref.ask("fail")
    assert child_ref(sup, "w") is ref
    assert sup.proxy().which_children().get()[0].restarts == 0


class StartFailsOnRestart(Actor):
    starts = 0

    def on_start(self) -> None:
        StartFailsOnRestart.starts += 1
        if StartFailsOnRestart.starts > 1:
            raise RuntimeError("no second life")

    def on_receive(self, message: Any) -> None:
        raise RuntimeError("crash")


def test_a_failure_in_on_start_during_a_restart_counts_as_a_crash_and_escalates(system: ActorSystem) -> None:
    StartFailsOnRestart.starts = 0
    sup = Supervisor.start([ChildSpec("w", StartFailsOnRestart)], max_restarts=2, name="s")
    child_ref(sup, "w").tell("go")  # type: ignore[union-attr]
    exit_ = sup.exited().get(timeout=5)
    assert exit_.kind == "crashed"
    assert isinstance(exit_.error, RestartIntensityError)
    # OTP counts every restart attempt: the crash (1), a retry after the failed
    # start (2), and the third attempt exceeds max_restarts=2 before starting.
    assert StartFailsOnRestart.starts == 3


@pytest.mark.parametrize("worker", WORKERS)
@pytest.mark.parametrize("restart", ["permanent", "transient", "temporary"])
def test_a_stop_by_anyone_else_is_a_normal_exit_handled_by_restart_type(
    system: ActorSystem, restart: Any, worker: type[Actor]
) -> None:
    sup = Supervisor.start([ChildSpec("w", worker, restart=restart)], name="s")
    old = child_ref(sup, "w")
    assert old is not None
    old.stop()
    if restart == "permanent":
        wait_until(lambda: (r := child_ref(sup, "w")) is not None and r is not old)
    elif restart == "transient":
        wait_until(lambda: sup.proxy().which_children().get()[0].status == "stopped")
        assert sup.proxy().which_children().get()[0].ref is None
    else:
        wait_until(lambda: sup.proxy().which_children().get() == [])


@pytest.mark.parametrize("worker", WORKERS)
def test_a_transient_child_is_restarted_only_after_a_crash(system: ActorSystem, worker: type[Actor]) -> None:
    sup = Supervisor.start([ChildSpec("w", worker, restart="transient")], name="s")
    new = crash_and_wait(sup, "w")
    new.stop()
    wait_until(lambda: sup.proxy().which_children().get()[0].status == "stopped")


@pytest.mark.parametrize("worker", WORKERS)
def test_a_temporary_child_is_never_restarted_and_is_removed(system: ActorSystem, worker: type[Actor]) -> None:
    sup = Supervisor.start([ChildSpec("t", worker, restart="temporary"), ChildSpec("p", worker)], name="s")
    ref = child_ref(sup, "t")
    ref.tell("crash")  # type: ignore[union-attr]
    wait_until(lambda: [c.id for c in sup.proxy().which_children().get()] == ["p"])


@pytest.mark.parametrize("worker", WORKERS)
def test_one_for_all_stops_the_others_in_reverse_order_then_restarts_all_in_order(
    system: ActorSystem, worker: type[Actor]
) -> None:
    sup = Supervisor.start([ChildSpec(i, worker) for i in "abcd"], strategy="one_for_all", name="s")
    before = {c.id: c.ref for c in sup.proxy().which_children().get()}
    JOURNAL.clear()
    crash_and_wait(sup, "b")
    after = {c.id: c.ref for c in sup.proxy().which_children().get()}
    assert all(after[i] is not before[i] for i in "abcd")
    assert JOURNAL.of("stop") == ["/s/d", "/s/c", "/s/a"]
    assert JOURNAL.of("start") == ["/s/a", "/s/b", "/s/c", "/s/d"]


@pytest.mark.parametrize("worker", WORKERS)
def test_rest_for_one_restarts_the_failed_child_and_those_started_after_it(
    system: ActorSystem, worker: type[Actor]
) -> None:
    sup = Supervisor.start([ChildSpec(i, worker) for i in "abcd"], strategy="rest_for_one", name="s")
    before = {c.id: c.ref for c in sup.proxy().which_children().get()}
    JOURNAL.clear()
    crash_and_wait(sup, "b")
    after = {c.id: c.ref for c in sup.proxy().which_children().get()}
    assert after["a"] is before["a"]
    assert all(after[i] is not before[i] for i in "bcd")
    assert JOURNAL.of("stop") == ["/s/d", "/s/c"]
    assert JOURNAL.of("start") == ["/s/b", "/s/c", "/s/d"]


@pytest.mark.parametrize("worker", WORKERS)
def test_temporary_children_stopped_by_a_group_restart_are_not_restarted(
    system: ActorSystem, worker: type[Actor]
) -> None:
    sup = Supervisor.start(
        [ChildSpec("a", worker), ChildSpec("t", worker, restart="temporary"), ChildSpec("c", worker)],
        strategy="one_for_all",
        name="s",
    )
    crash_and_wait(sup, "a")
    assert [c.id for c in sup.proxy().which_children().get()] == ["a", "c"]


@pytest.mark.parametrize("worker", WORKERS)
def test_more_than_max_restarts_in_max_seconds_stops_all_children_in_reverse_and_crashes(
    system: ActorSystem, clock: FakeClock, worker: type[Actor]
) -> None:
    sup = Supervisor.start([ChildSpec(i, worker) for i in "abc"], max_restarts=2, max_seconds=5, name="s")
    crash_and_wait(sup, "b")
    crash_and_wait(sup, "b")
    JOURNAL.clear()
    child_ref(sup, "b").tell("crash")  # type: ignore[union-attr]
    exit_ = sup.exited().get(timeout=5)
    assert exit_.kind == "crashed"
    assert isinstance(exit_.error, RestartIntensityError)
    assert JOURNAL.of("stop") == ["/s/c", "/s/a"]
    event = wait_for_event(system.events, "supervisor.gave_up", lambda e: e.source == "/s")
    assert event.data["max_restarts"] == 2


@pytest.mark.parametrize("worker", WORKERS)
def test_restarts_spread_wider_than_max_seconds_do_not_escalate(
    system: ActorSystem, clock: FakeClock, worker: type[Actor]
) -> None:
    sup = Supervisor.start([ChildSpec("w", worker)], max_restarts=1, max_seconds=5, name="s")
    for _ in range(4):
        crash_and_wait(sup, "w")
        clock.now += 6
    assert sup.is_alive()
    assert sup.proxy().which_children().get()[0].restarts == 4


@pytest.mark.parametrize("worker", WORKERS)
def test_max_restarts_zero_escalates_on_the_first_crash(system: ActorSystem, worker: type[Actor]) -> None:
    sup = Supervisor.start([ChildSpec("w", worker)], max_restarts=0, name="s")
    child_ref(sup, "w").tell("crash")  # type: ignore[union-attr]
    assert isinstance(sup.exited().get(timeout=5).error, RestartIntensityError)


@pytest.mark.parametrize("worker", WORKERS)
def test_an_escalation_is_handled_by_the_supervisors_own_supervisor(
    system: ActorSystem, clock: FakeClock, worker: type[Actor]
) -> None:
    inner = ChildSpec("inner", Supervisor, kwargs={"children": [ChildSpec("w", worker)], "max_restarts": 0})
    top = Supervisor.start([inner, ChildSpec("other", worker)], max_restarts=5, name="top")
    other = child_ref(top, "other")
    inner_ref = child_ref(top, "inner")
    assert inner_ref is not None
    worker = child_ref(inner_ref, "w")
    worker.tell("crash")  # type: ignore[union-attr]
    assert isinstance(inner_ref.exited().get(timeout=5).error, RestartIntensityError)
    new_inner = wait_until(lambda: (r := child_ref(top, "inner")) is not None and r is not inner_ref and r)
    assert child_ref(new_inner, "w") is not None
    assert child_ref(top, "other") is other
    assert system.whereis("/top/inner/w") is not None
    escalations = {c.id: c.escalations for c in top.proxy().which_children().get(timeout=5)}
    assert escalations == {"inner": 1, "other": 0}  # kept across the restart, for `weald tree`


class Stubborn(Actor):
    async def hold(self, release: threading.Event) -> None:
        await trio.to_thread.run_sync(release.wait, 10, abandon_on_cancel=True)


class ThreadStubborn(ThreadActor):
    def hold(self, release: threading.Event) -> None:
        release.wait(10)


@pytest.mark.parametrize(("worker", "kind"), [(Stubborn, "loop"), (ThreadStubborn, "thread")])
def test_a_child_that_outlasts_its_shutdown_time_is_killed_and_reported(
    system: ActorSystem, worker: type[Actor], kind: str
) -> None:
    release = threading.Event()
    sup = Supervisor.start([ChildSpec("w", worker, shutdown=0.2)], name="s")
    ref = child_ref(sup, "w")
    ref.proxy().hold(release)  # type: ignore[union-attr]
    wait_until(lambda: ref.mailbox_size() == 0)  # type: ignore[union-attr]
    sup.proxy().terminate_child("w").get(timeout=5)
    assert ref.exit is not None  # type: ignore[union-attr]
    assert ref.exit.kind == "killed"  # type: ignore[union-attr]
    event = wait_for_event(system.events, "supervisor.child_killed", lambda e: e.source == "/s")
    assert "0.2 s" in event.data["reason"]
    release.set()


@pytest.mark.parametrize("worker", WORKERS)
def test_backoff_delays_each_restart_longer(system: ActorSystem, worker: type[Actor]) -> None:
    spec = ChildSpec("w", worker, backoff=Backoff(initial=0.05, factor=2.0, cap=1.0))
    sup = Supervisor.start([spec], name="s")
    ref = child_ref(sup, "w")
    crashed_at = []
    restarted = []
    for _ in range(3):
        seq = system.events.recent(1)[-1].seq
        ref.tell("crash")  # type: ignore[union-attr]
        crash = wait_for_event(system.events, "supervisor.child_crashed", since=seq)
        crashed_at.append(crash.time)
        info = wait_for_event(system.events, "supervisor.child_restarted", since=crash.seq)
        restarted.append(info.time)
        ref = child_ref(sup, "w")
    delays = [r - c for c, r in zip(crashed_at, restarted, strict=True)]
    assert delays[0] >= 0.05
    assert delays[1] >= 0.1
    assert delays[2] >= 0.2


def test_backoff_grows_by_its_factor_up_to_its_cap() -> None:
    backoff = Backoff(initial=0.01, factor=3.0, cap=0.5)
    assert [backoff.delay(n) for n in range(1, 7)] == pytest.approx([0.01, 0.03, 0.09, 0.27, 0.5, 0.5])
    assert backoff.delay(0) == pytest.approx(0.01)  # before the first attempt: no shorter than initial
    assert Backoff(initial=0.2, cap=0.1).delay(1) == pytest.approx(0.1)  # the cap bounds even the first


@pytest.mark.parametrize("worker", WORKERS)
def test_a_supervisor_waits_exponentially_capped_delays_and_a_child_that_stayed_up_starts_over(
    system: ActorSystem, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, worker: type[Actor]
) -> None:
    chosen: list[float] = []
    real_delay = Backoff.delay

    def recording_delay(self: Backoff, attempt: int) -> float:
        delay = real_delay(self, attempt)
        chosen.append(delay)
        return delay

    monkeypatch.setattr(Backoff, "delay", recording_delay)
    backoff = Backoff(initial=0.05, factor=4.0, cap=0.5, reset_after=60.0)
    sup = Supervisor.start([ChildSpec("w", worker, backoff=backoff)], max_restarts=10, name="s")
    waited = []
    for uptime in (0, 0, 0, 0, 61, 59):
        clock.now += uptime  # how long the child stayed up before this crash, on the supervisor's clock
        ref = child_ref(sup, "w")
        seq = system.events.recent(1)[-1].seq
        ref.tell("crash")  # type: ignore[union-attr]
        crash = wait_for_event(system.events, "supervisor.child_crashed", since=seq)
        restarted = wait_for_event(system.events, "supervisor.child_restarted", since=crash.seq)
        waited.append(restarted.time - crash.time)
    # 0.05, x4, x4 (0.8 capped at 0.5), capped; up for 61 s >= reset_after: back to 0.05; up 59 s: no reset.
    assert chosen == pytest.approx([0.05, 0.2, 0.5, 0.5, 0.05, 0.2])
    assert all(w >= d * 0.9 for w, d in zip(waited, chosen, strict=True)), waited  # it really waited them


@pytest.mark.parametrize("worker", WORKERS)
def test_a_child_is_restarting_while_its_backoff_runs(system: ActorSystem, worker: type[Actor]) -> None:
    sup = Supervisor.start([ChildSpec("w", worker, backoff=Backoff(initial=5.0))], name="s")
    child_ref(sup, "w").tell("crash")  # type: ignore[union-attr]
    info = wait_until(lambda: (c := sup.proxy().which_children().get()[0]).status == "restarting" and c)
    assert info.ref is None
    sup.proxy().terminate_child("w").get(timeout=5)  # cancels the pending restart
    assert sup.proxy().which_children().get()[0].status == "stopped"


@pytest.mark.parametrize("worker", WORKERS)
def test_lifecycle_events_are_published(system: ActorSystem, worker: type[Actor]) -> None:
    sup = Supervisor.start([ChildSpec("w", worker)], name="s")
    started = wait_for_event(system.events, "supervisor.child_started", lambda e: e.source == "/s")
    assert started.data == {"id": "w", "path": "/s/w", "kind": worker.__name__}
    crash_and_wait(sup, "w")
    crashed = wait_for_event(system.events, "supervisor.child_crashed", lambda e: e.source == "/s")
    assert crashed.data["exit"] == "crashed"
    assert "crashed" in crashed.data["error"]
    restarted = wait_for_event(system.events, "supervisor.child_restarted", lambda e: e.source == "/s")
    assert restarted.data["restarts"] == 1


class BadInit(Actor):
    def on_start(self) -> None:
        raise RuntimeError("bad init")


def test_a_child_failing_to_start_stops_the_ones_before_it_and_fails_the_supervisor(system: ActorSystem) -> None:
    sup = Supervisor.start([ChildSpec("a", Worker), ChildSpec("b", Worker), ChildSpec("bad", BadInit)], name="s")
    with pytest.raises(StartError, match="bad init"):
        sup.started().get(timeout=5)
    assert JOURNAL.of("stop") == ["/s/b", "/s/a"]
    assert sup.exited().get(timeout=5).kind == "crashed"


def test_start_child_adds_and_starts_a_child(system: ActorSystem) -> None:
    sup = Supervisor.start([ChildSpec("a", Worker)], name="s")
    ref = sup.proxy().start_child(ChildSpec("b", Worker)).get(timeout=5)
    assert ref.path == "/s/b"
    assert [c.id for c in sup.proxy().which_children().get()] == ["a", "b"]
    with pytest.raises(ChildExistsError, match="'b'"):
        sup.proxy().start_child(ChildSpec("b", Worker)).get(timeout=5)
    with pytest.raises(StartError):
        sup.proxy().start_child(ChildSpec("c", BadInit)).get(timeout=5)
    assert [c.id for c in sup.proxy().which_children().get()] == ["a", "b"]


def test_terminate_restart_and_delete_child(system: ActorSystem) -> None:
    sup = Supervisor.start([ChildSpec("a", Worker)], name="s")
    proxy = sup.proxy()
    with pytest.raises(ChildRunningError):
        proxy.delete_child("a").get(timeout=5)
    with pytest.raises(ChildRunningError):
        proxy.restart_child("a").get(timeout=5)
    proxy.terminate_child("a").get(timeout=5)
    assert proxy.which_children().get() == [ChildInfo("a", None, "stopped", 0, "/s/a", "Worker", "permanent")]
    ref = proxy.restart_child("a").get(timeout=5)
    assert ref.ask("hi") == "hi"
    proxy.terminate_child("a").get(timeout=5)
    proxy.delete_child("a").get(timeout=5)
    assert proxy.which_children().get() == []
    with pytest.raises(ChildNotFoundError, match="'a'"):
        proxy.terminate_child("a").get(timeout=5)


def test_count_children_reports_specs_active_supervisors_and_workers(system: ActorSystem) -> None:
    sup = Supervisor.start(
        [ChildSpec("a", Worker), ChildSpec("sub", Supervisor), ChildSpec("t", Worker, restart="transient")],
        name="s",
    )
    sup.proxy().terminate_child("t").get(timeout=5)
    assert sup.proxy().count_children().get() == {
        "specs": 3,
        "active": 2,
        "supervisors": 1,
        "workers": 2,
        "dormant": 0,
        "hibernated": 0,
    }


def test_snapshot_describes_strategy_and_children(system: ActorSystem) -> None:
    sup = Supervisor.start([ChildSpec("a", Worker)], strategy="rest_for_one", max_restarts=7, name="s")
    snap = sup.proxy().snapshot().get()
    assert isinstance(snap, SupervisorSnapshot)
    assert (snap.strategy, snap.max_restarts, snap.restarts) == ("rest_for_one", 7, 0)
    assert [c.id for c in snap.children] == ["a"]


def test_bad_specs_and_options_are_refused_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="restart must be one of"):
        ChildSpec("a", Worker, restart="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without '/'"):
        ChildSpec("a/b", Worker)
    with pytest.raises(TypeError, match=r"subclass of weald\.runtime\.Actor"):
        ChildSpec("a", object)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seconds >= 0"):
        ChildSpec("a", Worker, shutdown=-1)


def test_a_bad_strategy_or_intensity_is_refused_at_start(system: ActorSystem) -> None:
    with pytest.raises(ValueError, match="strategy must be one of"):
        Supervisor.start([ChildSpec("a", Worker)], strategy="one_for_some", name="s")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_restarts is an integer >= 0"):
        Supervisor.start([], max_restarts=-1)
    with pytest.raises(ValueError, match="max_seconds is a number > 0"):
        Supervisor.start([], max_seconds=0)
    assert system.whereis("/s") is None
