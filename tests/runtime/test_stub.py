"""Stubs: what holds a sleeping actor's path buffers its messages and hands them, in order, to its successor."""

from __future__ import annotations

import threading
from typing import Any

import attrs
import pykka
import pytest
import trio
from weald.runtime import Actor, ActorSystem, Stub
from weald.runtime.agents.agent import _idle_clock, _IdleFor
from weald.runtime.testing import wait_until
from weald.supervisors import ChildSpec, DynamicSupervisor, MaxChildrenError, Supervisor


class Log(Actor):
    """Records what it handles; holds its messages on 'hold'."""

    seen: list[tuple[str, Any]] = []

    def on_receive(self, message: Any) -> Any:
        if message == "hold":
            self.hold_messages()
            return None
        Log.seen.append((self.path, message))
        return message

    def echo(self, value: Any) -> Any:
        return value


class Pair(Supervisor):
    pass


@pytest.fixture(autouse=True)
def _clear() -> None:
    Log.seen = []


def test_messages_sent_to_a_stub_wake_its_actor_and_reach_it_in_order(system: ActorSystem) -> None:
    top = Supervisor.start([ChildSpec("late", Log, lazy=True)])
    stub = wait_until(lambda: system.whereis(f"{top.path}/late"))
    assert isinstance(stub, Stub)
    assert stub.state == "dormant"
    assert stub.is_alive()
    for n in range(5):
        stub.tell(n)
    assert stub.proxy().echo("through the proxy").get(timeout=5) == "through the proxy"
    assert stub.ask("asked", timeout=5) == "asked"
    assert [m for _, m in Log.seen] == [0, 1, 2, 3, 4, "asked"]
    live = system.whereis(f"{top.path}/late")
    assert live is stub.successor
    assert live is not None
    assert live.__class__ is not Stub
    stub.tell("forwarded")  # a caller that kept the stub still reaches the actor
    wait_until(lambda: Log.seen[-1] == (f"{top.path}/late", "forwarded"))
    top.stop()


def test_a_hibernated_subtree_wakes_on_a_message_to_any_of_its_paths(system: ActorSystem) -> None:
    top = Supervisor.start([ChildSpec("pair", Pair, kwargs={"children": [ChildSpec("a", Log), ChildSpec("b", Log)]})])
    assert top.proxy().hibernate_child("pair").get(timeout=5) is True
    assert system.registered(f"{top.path}/") == [f"{top.path}/pair"]
    below = system.whereis(f"{top.path}/pair/b")  # made on demand from the subtree's shape
    assert isinstance(below, Stub)
    assert below.state == "hibernated"
    assert system.whereis(f"{top.path}/pair/nothing") is None
    below.tell("to b")
    wait_until(lambda: Log.seen == [(f"{top.path}/pair/b", "to b")])
    assert sorted(system.registered(f"{top.path}/")) == [f"{top.path}/pair", f"{top.path}/pair/a", f"{top.path}/pair/b"]
    infos = top.proxy().which_children().get(timeout=5)
    assert [(i.id, i.status, i.restarts) for i in infos] == [("pair", "running", 0)]  # a wake is not a restart
    top.stop()


def test_what_a_holding_actor_receives_while_it_stops_is_handed_to_its_successor(system: ActorSystem) -> None:
    top = Supervisor.start([ChildSpec("pair", Pair, kwargs={"children": [ChildSpec("a", Log)]})])
    a = wait_until(lambda: system.whereis(f"{top.path}/pair/a"))
    a.tell("hold")
    futures = [a.ask(n, block=False) for n in range(3)]
    wait_until(lambda: a.mailbox_size() == 0)  # taken from the inbox and held, not handled
    assert Log.seen == []
    assert top.proxy().hibernate_child("pair").get(timeout=5) is True
    # Held while the subtree stopped, then handed to the stub, which woke it.
    assert [f.get(timeout=5) for f in futures] == [0, 1, 2]
    assert Log.seen == [(f"{top.path}/pair/a", n) for n in range(3)]
    top.stop()


class SlowStop(Log):
    """A `Log` whose stop lasts until the test lets it end (as an agent's lasts while its record commits)."""

    stopping = threading.Event()
    release = threading.Event()

    async def on_stop(self) -> None:
        SlowStop.stopping.set()
        await trio.to_thread.run_sync(SlowStop.release.wait)


def test_what_is_sent_to_a_holding_actor_after_its_stop_began_is_handed_to_its_successor(
    system: ActorSystem,
) -> None:
    SlowStop.stopping.clear()
    SlowStop.release.clear()
    top = Supervisor.start([ChildSpec("pair", Pair, kwargs={"children": [ChildSpec("a", SlowStop)]})])
    a = wait_until(lambda: system.whereis(f"{top.path}/pair/a"))
    a.tell("hold")
    hibernated = top.proxy().hibernate_child("pair")
    wait_until(SlowStop.stopping.is_set)
    try:
        assert not a.is_alive()  # stopping: no longer alive, but still taking what it is sent
        asked = a.ask("asked while it stopped", block=False)
        echoed = a.proxy().echo("through a proxy made while it stopped")
        a.tell("told while it stopped")
    finally:
        SlowStop.release.set()
    assert hibernated.get(timeout=5) is True
    assert asked.get(timeout=5) == "asked while it stopped"
    assert echoed.get(timeout=5) == "through a proxy made while it stopped"
    wait_until(lambda: [m for _, m in Log.seen] == ["asked while it stopped", "told while it stopped"])
    successor = system.whereis(f"{top.path}/pair/a")
    assert successor is not None
    assert successor is not a
    top.stop()


def test_a_stub_discarded_with_its_supervisor_fails_what_it_buffered(system: ActorSystem) -> None:
    top = Supervisor.start([ChildSpec("late", Log, lazy=True)])
    stub = wait_until(lambda: system.whereis(f"{top.path}/late"))
    top.proxy().delete_child("late").get(timeout=5)
    assert not stub.is_alive()
    assert system.whereis(f"{top.path}/late") is None
    with pytest.raises(pykka.ActorDeadError):
        stub.ask("too late", timeout=5)
    top.stop()


def test_children_added_hibernated_start_on_their_first_message_and_count_toward_max_children(
    system: ActorSystem,
) -> None:
    top = DynamicSupervisor.start(max_children=2)
    pair = ChildSpec("pair", Pair, kwargs={"children": [ChildSpec("a", Log), ChildSpec("b", Log)]})
    other = attrs.evolve(pair, id="other")
    outcomes = top.proxy().add_hibernated([pair, other, attrs.evolve(pair, id="third")], {"a": Log, "b": Log})
    first, second, third = outcomes.get(timeout=5)
    assert isinstance(first, Stub)
    assert (first.state, first.path) == ("hibernated", f"{top.path}/pair")
    assert isinstance(second, Stub)
    assert isinstance(third, MaxChildrenError)
    assert Log.seen == []  # nothing started
    counts = top.proxy().count_children().get(timeout=5)
    assert (counts["active"], counts["hibernated"]) == (0, 2)
    # A path of its shape answers, and its first message starts the whole child.
    below = system.whereis(f"{top.path}/pair/b")
    assert isinstance(below, Stub)
    assert below.ask("to b", timeout=5) == "to b"
    assert system.whereis(f"{top.path}/pair/a").__class__ is not Stub
    assert system.whereis(f"{top.path}/other").state == "hibernated"  # the other one sleeps on
    infos = {i.id: (i.status, i.restarts) for i in top.proxy().which_children().get(timeout=5)}
    assert infos == {"pair": ("running", 0), "other": ("hibernated", 0)}
    top.stop()


def test_an_agent_armed_on_every_turn_holds_one_idle_deadline_not_one_per_turn(system: ActorSystem) -> None:
    # Each turn's end arms the agent's idle deadline again; the clock kept every
    # older one until it expired (hibernate_after, 600 s by default): a daemon
    # answering 1,000 prompts a second grew by tens of MB a minute.
    clock = _idle_clock(system)
    ref = system.spawn(Log, name="idle")
    for token in range(1000):
        system.loop.call_soon(clock.arm, ref, token, 600.0)
    wait_until(lambda: len(clock) == 1)
    system.loop.call_soon(clock.arm, ref, 1000, 0.01)  # shorter than the rest: still in order
    wait_until(lambda: ("/idle", _IdleFor(1000)) in Log.seen)
    assert [m for _, m in Log.seen] == [_IdleFor(1000)]
    assert len(clock) == 0
