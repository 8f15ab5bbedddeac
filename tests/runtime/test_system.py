"""The actor system: the root tree, the registry, lifecycle and shutdown."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from weald.runtime import (
    Actor,
    ActorSystem,
    LoopBlockedError,
    StartError,
    StoreCorruptError,
    StoreSnapshot,
    ThreadActor,
)
from weald.runtime.testing import wait_for_event, wait_until
from weald.supervisors import ChildSpec, Supervisor


class Logged(Actor):
    log: list[str] = []

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def on_start(self) -> None:
        Logged.log.append(f"start {self.name}")

    def on_stop(self) -> None:
        Logged.log.append(f"stop {self.name}")


def test_the_root_supervisor_owns_store_events_and_io_in_that_order(system: ActorSystem) -> None:
    children = system.root.proxy().which_children().get()
    assert [c.id for c in children] == ["store", "events", "io"]
    assert [c.path for c in children] == ["/store", "/events", "/io"]
    assert all(c.status == "running" for c in children)
    assert system.whereis("/") is system.root
    snap = system.whereis("/store").proxy().snapshot().get()
    assert isinstance(snap, StoreSnapshot)
    assert snap.path == str(system.store_path)


def test_shutdown_stops_top_level_actors_last_started_first_then_the_tree(tmp_path: Path) -> None:
    Logged.log.clear()
    with ActorSystem(store_path=tmp_path / "s.db"):
        # Top-level actors start concurrently (trio picks the order), so
        # wait for each before the next: the start order is then known.
        for name in ["a", "b", "c"]:
            Logged.start(name).started().get(timeout=5)
        sup = Supervisor.start([ChildSpec("d", Logged, args=("d",)), ChildSpec("e", Logged, args=("e",))], name="sup")
        sup.started().get(timeout=5)
    assert Logged.log == [
        "start a",
        "start b",
        "start c",
        "start d",
        "start e",
        "stop e",
        "stop d",
        "stop c",
        "stop b",
        "stop a",
    ]


class Sleeper(ThreadActor):
    def nap(self) -> str:
        return "rested"


def test_shutdown_leaves_no_thread_behind(tmp_path: Path) -> None:
    before = {t for t in threading.enumerate() if not t.name.startswith("Trio thread")}
    with ActorSystem(store_path=tmp_path / "s.db") as system:
        refs = [Sleeper.start() for _ in range(5)]
        assert [r.proxy().nap().get() for r in refs] == ["rested"] * 5
        system.store.put("tasks", "1", 1)
    wait_until(lambda: not ({t for t in threading.enumerate() if not t.name.startswith("Trio thread")} - before))


def test_a_corrupt_store_file_makes_start_fail_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "bad.db"
    path.write_bytes(b"garbage" * 1000)
    system = ActorSystem(store_path=path)
    with pytest.raises(StartError) as info:
        system.start()
    cause: Any = info.value
    while cause is not None and not isinstance(cause, StoreCorruptError):
        cause = cause.__cause__
    assert isinstance(cause, StoreCorruptError)
    assert str(path) in str(cause)
    assert not system.running
    assert path.read_bytes() == b"garbage" * 1000


def test_the_store_actor_reopens_the_store_when_restarted(system: ActorSystem) -> None:
    system.store.put("tasks", "kept", {"v": 1})
    store_ref = system.whereis("/store")
    store_ref.kill()
    wait_for_event(system.events, "supervisor.child_restarted", lambda e: e.data["id"] == "store")
    assert system.store.get("tasks", "kept") == {"v": 1}


class ShutdownFromInside(Actor):
    def shut(self) -> None:
        self.system.shutdown()


def test_shutdown_from_an_actor_is_refused(system: ActorSystem) -> None:
    ref = ShutdownFromInside.start()
    with pytest.raises(LoopBlockedError):
        ref.proxy().shut().get(timeout=5)


def test_the_current_system_is_the_latest_running_one(tmp_path: Path) -> None:
    with ActorSystem(store_path=tmp_path / "a.db") as a:
        assert ActorSystem.current() is a
        with ActorSystem(store_path=tmp_path / "b.db") as b:
            assert ActorSystem.current() is b
        assert ActorSystem.current() is a


def test_a_top_level_crash_is_reported_to_the_system(system: ActorSystem) -> None:
    class Crasher(Actor):
        def on_receive(self, message: Any) -> None:
            raise RuntimeError("top-level crash")

    ref = Crasher.start()
    ref.tell("go")
    event = wait_for_event(system.events, "actor.exited", lambda e: e.source == ref.path)
    assert event.data["exit"] == "crashed"
    assert "top-level crash" in event.data["error"]
    assert system.orphan_exits()[-1].ref is ref


def test_statistics_describe_the_running_system(system: ActorSystem) -> None:
    stats = system.statistics()
    assert stats.actors >= 4
    assert stats.store["path"] == str(system.store_path)
