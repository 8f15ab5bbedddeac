"""DynamicSupervisor: children added at run time, addressed by ref."""

from __future__ import annotations

import gc
from typing import Any

import pykka
import pytest
import trio
from sup_workers import JOURNAL, ThreadWorker, Worker
from weald.runtime import Actor, ActorSystem, StartError, Stub
from weald.runtime.testing import wait_for_event, wait_until
from weald.supervisors import (
    ChildExistsError,
    ChildNotFoundError,
    ChildSpec,
    DynamicSupervisor,
    MaxChildrenError,
    RestartIntensityError,
)


@pytest.mark.parametrize("worker", [Worker, ThreadWorker])
def test_children_are_started_at_run_time_and_restarted_by_their_spec(system: ActorSystem, worker: type[Actor]) -> None:
    sup = DynamicSupervisor.start(name="dyn")
    a = sup.proxy().start_child(ChildSpec("a", worker)).get(timeout=5)
    t = sup.proxy().start_child(ChildSpec("t", worker, restart="temporary")).get(timeout=5)
    assert (a.path, t.path) == ("/dyn/a", "/dyn/t")
    a.tell("crash")
    new_a = wait_until(
        lambda: next(
            (c.ref for c in sup.proxy().which_children().get() if c.id == "a" and c.ref not in (None, a)), None
        )
    )
    assert new_a.ask("x") == "x"
    t.tell("crash")
    wait_until(lambda: [c.id for c in sup.proxy().which_children().get()] == ["a"])


def test_terminate_child_by_ref_stops_and_forgets_it(system: ActorSystem) -> None:
    sup = DynamicSupervisor.start()
    ref = sup.proxy().start_child(ChildSpec("w", Worker)).get(timeout=5)
    sup.proxy().terminate_child(ref).get(timeout=5)
    assert not ref.is_alive()
    assert sup.proxy().which_children().get() == []
    with pytest.raises(ChildNotFoundError):
        sup.proxy().terminate_child(ref).get(timeout=5)


def test_max_children_is_enforced(system: ActorSystem) -> None:
    sup = DynamicSupervisor.start(max_children=2)
    for i in range(2):
        sup.proxy().start_child(ChildSpec(f"w{i}", Worker)).get(timeout=5)
    with pytest.raises(MaxChildrenError, match="maximum of 2"):
        sup.proxy().start_child(ChildSpec("w2", Worker)).get(timeout=5)
    assert sup.proxy().count_children().get() == {
        "specs": 2,
        "active": 2,
        "supervisors": 0,
        "workers": 2,
        "dormant": 0,
        "hibernated": 0,
    }


class BadInit(Actor):
    def on_start(self) -> None:
        raise RuntimeError("refuses to start")


def test_a_child_that_fails_to_start_is_not_kept(system: ActorSystem) -> None:
    sup = DynamicSupervisor.start()
    with pytest.raises(StartError, match="refuses to start"):
        sup.proxy().start_child(ChildSpec("bad", BadInit)).get(timeout=5)
    assert sup.proxy().which_children().get() == []


def test_children_stop_in_reverse_start_order(system: ActorSystem) -> None:
    sup = DynamicSupervisor.start(name="d")
    for i in "xyz":
        sup.proxy().start_child(ChildSpec(i, Worker)).get(timeout=5)
    sup.stop()
    assert JOURNAL.of("stop") == ["/d/z", "/d/y", "/d/x"]


@pytest.mark.parametrize("worker", [Worker, ThreadWorker])
def test_too_many_restarts_stop_the_other_children_in_reverse_and_escalate(
    system: ActorSystem, worker: type[Actor]
) -> None:
    sup = DynamicSupervisor.start(max_restarts=1, name="dyn")
    for i in "ab":
        sup.proxy().start_child(ChildSpec(i, worker)).get(timeout=5)
    ref = sup.proxy().start_child(ChildSpec("w", worker)).get(timeout=5)
    ref.tell("crash")
    ref = wait_until(
        lambda: next(
            (c.ref for c in sup.proxy().which_children().get() if c.id == "w" and c.ref not in (None, ref)), None
        )
    )
    JOURNAL.clear()
    ref.tell("crash")
    exit_ = sup.exited().get(timeout=5)
    assert exit_.kind == "crashed"
    assert isinstance(exit_.error, RestartIntensityError)
    assert JOURNAL.of("stop") == ["/dyn/b", "/dyn/a"]  # the crashed child does not run on_stop
    event = wait_for_event(system.events, "supervisor.gave_up", lambda e: e.source == "/dyn")
    assert event.data["max_restarts"] == 1


def test_thousands_of_temporary_children_come_and_go(system: ActorSystem) -> None:
    sup = DynamicSupervisor.start()
    proxy = sup.proxy()
    refs = [proxy.start_child(ChildSpec(f"c{i}", Worker, restart="temporary")).get(timeout=10) for i in range(2000)]
    for ref in refs:
        ref.stop(block=False)
    wait_until(lambda: proxy.count_children().get()["specs"] == 0)


def test_a_child_without_progress_reports_is_quiet_until_it_crashes(system: ActorSystem) -> None:
    sup = DynamicSupervisor.start(name="dyn")
    proxy = sup.proxy()

    def topics_for(child_id: str) -> list[str]:
        return [e.topic for e in system.events.recent(200, source="/dyn") if e.data.get("id") == child_id]

    quiet = proxy.start_child(ChildSpec("quiet", Worker, restart="temporary", progress=False)).get(timeout=5)
    loud = proxy.start_child(ChildSpec("loud", Worker, restart="temporary")).get(timeout=5)
    quiet.stop()
    loud.stop()
    # One supervisor publishes in order: once the loud child's exit is out, the quiet one's would be too.
    wait_until(lambda: "supervisor.child_exited" in topics_for("loud"))
    assert topics_for("loud") == ["supervisor.child_started", "supervisor.child_exited"]
    assert topics_for("quiet") == []
    crashing = proxy.start_child(ChildSpec("crashing", Worker, restart="temporary", progress=False)).get(timeout=5)
    crashing.tell("crash")
    wait_until(lambda: topics_for("crashing") == ["supervisor.child_crashed"])


class Sibling(Actor):
    """Records, in its on_start, how many of its supervisor's children are registered."""

    seen: dict[str, int]

    def on_start(self) -> None:
        Sibling.seen[self.path] = len(self.system.registered(self.path.rsplit("/", 1)[0] + "/"))


def test_start_children_spawns_every_child_before_waiting_for_the_first(system: ActorSystem) -> None:
    Sibling.seen = {}
    sup = DynamicSupervisor.start(name="dyn")
    refs = sup.proxy().start_children([ChildSpec(f"c{i}", Sibling) for i in range(5)]).get(timeout=5)
    assert [r.path for r in refs] == [f"/dyn/c{i}" for i in range(5)]
    # Started one after another, the first would have seen only itself.
    assert Sibling.seen == {f"/dyn/c{i}": 5 for i in range(5)}
    assert [c.id for c in sup.proxy().which_children().get()] == [f"c{i}" for i in range(5)]


class Plain(Actor):
    """No ``on_start``: nothing of its start can fail."""

    def on_receive(self, message: Any) -> Any:
        return message


class Looking(DynamicSupervisor):
    async def start_and_look(self, specs: list[ChildSpec]) -> list[str | None]:
        """Start children, then read their own status in the same step of this supervisor's task."""
        refs = await self.start_children(specs)
        return [r.statistics().status for r in refs]  # type: ignore[union-attr]


def test_a_child_without_on_start_is_started_at_its_spawn_without_waiting_for_its_first_step(
    system: ActorSystem,
) -> None:
    sup = system.spawn(Looking, name="dyn")
    proxy = sup.proxy()
    # Nothing of their start can fail, so the supervisor waits for none of them (a model
    # response's tool calls start this way): none has run a step when it answers.
    assert proxy.start_and_look([ChildSpec(f"p{i}", Plain) for i in range(3)]).get(timeout=5) == ["starting"] * 3
    assert [c.status for c in proxy.which_children().get()] == ["running"] * 3
    assert [c.ref.ask(i) for i, c in enumerate(proxy.which_children().get())] == [0, 1, 2]
    # Children with an on_start are still waited for.
    assert proxy.start_and_look([ChildSpec("w", Worker)]).get(timeout=5) == ["running"]

    # One killed before its first step has an ordinary end: a permanent child is restarted.
    async def start_and_kill() -> Any:
        ref = await proxy.start_child(ChildSpec("k", Plain))
        ref.kill()
        return ref

    killed = trio.from_thread.run(start_and_kill, trio_token=system.loop.token)
    assert killed.exited().get(timeout=5).kind == "killed"
    again = wait_until(lambda: next((c.ref for c in proxy.which_children().get() if c.id == "k" and c.ref), None))
    assert again is not killed
    assert again.ask("x") == "x"


def test_start_children_reports_each_childs_failure_and_starts_the_rest(system: ActorSystem) -> None:
    # "bad" counts toward max_children until its start fails, as it is spawned with the rest.
    sup = DynamicSupervisor.start(name="dyn", max_children=5)
    proxy = sup.proxy()
    proxy.start_child(ChildSpec("taken", Worker)).get(timeout=5)
    specs = [
        ChildSpec("a", Worker),
        ChildSpec("taken", Worker),
        ChildSpec("bad", BadInit),
        ChildSpec("b", Worker),
        ChildSpec("c", Worker),
        ChildSpec("d", Worker),
    ]
    out = proxy.start_children(specs).get(timeout=5)
    assert [type(o).__name__ for o in out] == [
        "Ref",
        "ChildExistsError",
        "StartError",
        "Ref",
        "Ref",
        "MaxChildrenError",
    ]
    assert "refuses to start" in str(out[2])
    assert "maximum of 5" in str(out[5])
    assert [c.id for c in proxy.which_children().get()] == ["taken", "a", "b", "c"]
    assert all(r.ask("ping") == "ping" for r in (out[0], out[3], out[4]))


class Holding(Worker):
    """A worker whose spec carries a value, to see whether the supervisor still holds it."""

    def __init__(self, payload: object = None) -> None:
        super().__init__()
        self.payload = payload

    def tag(self) -> str:
        return getattr(self.payload, "tag", "")


class Payload:
    def __init__(self, tag: str) -> None:
        self.tag = tag


def test_a_hibernated_child_with_a_rebuild_keeps_no_spec_and_wakes_from_the_rebuilt_one(system: ActorSystem) -> None:
    made: list[str] = []

    def spec(tag: str) -> ChildSpec:
        made.append(tag)
        return ChildSpec("h", Holding, kwargs={"payload": Payload(tag)}, rebuild=lambda: spec(f"{tag}+"))

    sup = DynamicSupervisor.start()
    ref = sup.proxy().start_child(spec("first")).get(timeout=5)
    assert ref.proxy().tag().get(timeout=5) == "first"
    assert sup.proxy().hibernate_child("h").get(timeout=5) is True
    # Asleep, the supervisor holds the rebuild, not the spec and what its kwargs hold.
    gc.collect()
    assert [o.tag for o in gc.get_objects() if type(o) is Payload] == []
    info = sup.proxy().which_children().get(timeout=5)[0]
    assert (info.id, info.kind, info.status, info.restart) == ("h", "Holding", "hibernated", "permanent")
    assert sup.proxy().count_children().get(timeout=5)["workers"] == 1
    assert made == ["first"]  # asking about it made nothing
    stub = system.whereis(f"{sup.path}/h")
    assert stub.proxy().tag().get(timeout=5) == "first+"
    assert made == ["first", "first+"]
    # Running, it is restarted from the spec it has (no rebuild needed).
    woken = system.whereis(f"{sup.path}/h")
    woken.tell("crash")
    wait_until(lambda: (r := system.whereis(f"{sup.path}/h")) not in (None, woken) and r.is_alive())
    assert system.whereis(f"{sup.path}/h").proxy().tag().get(timeout=5) == "first+"
    assert made == ["first", "first+"]


def test_a_rebuild_that_fails_or_makes_another_child_is_a_failed_start(system: ActorSystem) -> None:
    def broken() -> ChildSpec:
        raise OSError("the record is gone")

    sup = DynamicSupervisor.start()
    outcomes = (
        sup.proxy()
        .add_hibernated(
            [
                ChildSpec("a", Worker, rebuild=broken),
                ChildSpec("b", Worker, rebuild=lambda: ChildSpec("other", Worker)),
                ChildSpec("c", Worker, rebuild=lambda: ChildSpec("c", Worker)),
            ],
            {},
        )
        .get(timeout=5)
    )
    a, b, c = outcomes
    with pytest.raises(pykka.ActorDeadError, match="did not come back"):
        a.ask("hello", timeout=5)
    with pytest.raises(pykka.ActorDeadError, match="did not come back"):
        b.ask("hello", timeout=5)
    assert c.ask("hello", timeout=5) == "hello"
    statuses = {i.id: i.status for i in sup.proxy().which_children().get(timeout=5)}
    assert statuses == {"a": "stopped", "b": "stopped", "c": "running"}
    with pytest.raises(TypeError, match="rebuild is None or a function"):
        ChildSpec("d", Worker, rebuild="not callable")  # type: ignore[arg-type]


def test_which_children_answers_for_the_children_asked_about_and_statistics_count_them_all(
    system: ActorSystem,
) -> None:
    sup = DynamicSupervisor.start()
    for n in range(5):
        sup.proxy().start_child(ChildSpec(f"w{n}", Worker)).get(timeout=5)
    assert sup.proxy().hibernate_child("w3").get(timeout=5) is True
    infos = sup.proxy().which_children(["w4", "nobody", "w1", "w4"]).get(timeout=5)
    assert [(i.id, i.status) for i in infos] == [("w4", "running"), ("w1", "running")]
    assert [i.id for i in sup.proxy().which_children().get(timeout=5)] == ["w0", "w1", "w2", "w3", "w4"]
    stats = sup.proxy().statistics().get(timeout=5)
    assert (stats.children, stats.asleep, stats.restarts) == (5, 1, 0)
    assert sup.proxy().awake_children().get(timeout=5) == ["w0", "w1", "w2", "w4"]
    system.whereis(f"{sup.path}/w3").tell("wake up")  # any message wakes it
    wait_until(lambda: sup.proxy().statistics().get(timeout=5).asleep == 0, timeout=10)
    assert sup.proxy().awake_children().get(timeout=5) == ["w0", "w1", "w2", "w4", "w3"]  # the last up last
    sup.proxy().terminate_child(system.whereis(f"{sup.path}/w1")).get(timeout=5)
    assert sup.proxy().awake_children().get(timeout=5) == ["w0", "w2", "w4", "w3"]
    system.whereis(f"{sup.path}/w0").tell("crash")
    wait_until(lambda: sup.proxy().statistics().get(timeout=5).restarts == 1, timeout=10)
    sup.stop()


def test_children_added_asleep_have_no_stub_until_their_path_is_looked_up(system: ActorSystem) -> None:
    # A million sessions asleep are rows of their supervisor's, not a million stubs in the registry.
    sup = DynamicSupervisor.start()
    base = sup.path.rstrip("/")
    specs = [ChildSpec(f"w{n}", Worker) for n in range(3)]
    assert sup.proxy().add_asleep(specs, {}).get(timeout=5) == ["w0", "w1", "w2"]
    (again,) = sup.proxy().add_asleep([ChildSpec("w0", Worker)], {}).get(timeout=5)
    assert isinstance(again, ChildExistsError)
    assert system.registered(f"{base}/") == []
    assert sup.proxy().statistics().get(timeout=5).asleep == 3
    # Asked whether it sleeps, without making its stub.
    assert system.asleep(f"{base}/w1") == "hibernated"
    assert system.asleep(f"{base}/nobody") is None
    assert system.registered(f"{base}/") == []
    # Looked up: its stub is made, registered, and wakes it at its first message.
    stub = system.whereis(f"{base}/w1")
    assert isinstance(stub, Stub)
    assert (stub.state, stub.path) == ("hibernated", f"{base}/w1")
    assert system.whereis(f"{base}/w1") is stub
    assert system.registered(f"{base}/") == [f"{base}/w1"]
    assert JOURNAL.of("start") == []
    assert stub.ask("hello", timeout=5) == "hello"
    assert JOURNAL.of("start") == [f"{base}/w1"]
    wait_until(lambda: sup.proxy().statistics().get(timeout=5).asleep == 2, timeout=10)
    assert system.asleep(f"{base}/w1") is None
    # One never looked up is stopped by id; another by the stub its which_children gives.
    assert sup.proxy().stop_child("w2").get(timeout=5) is True
    assert system.whereis(f"{base}/w2") is None
    (info,) = sup.proxy().which_children(["w0"]).get(timeout=5)
    assert isinstance(info.ref, Stub)
    assert info.status == "hibernated"
    sup.proxy().terminate_child(info.ref).get(timeout=5)
    assert not info.ref.is_alive()
    assert system.whereis(f"{base}/w0") is None
    assert [i.id for i in sup.proxy().which_children().get(timeout=5)] == ["w1"]
    sup.proxy().add_asleep([ChildSpec("w3", Worker)], {}).get(timeout=5)
    sup.stop()
    # The supervisor's table went with it: nothing answers for its children's paths.
    assert system.whereis(f"{base}/w3") is None
    assert system.asleep(f"{base}/w3") is None
