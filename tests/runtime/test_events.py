"""The event bus: topics, patterns, a ring of recent events, and publishers that never block."""

from __future__ import annotations

import os
import threading
import time

import pytest
import trio
import trio.testing
from weald.runtime import REDACTED, Event, EventBus, register_secret


def test_subscribers_get_events_matching_their_patterns() -> None:
    bus = EventBus()
    tools = bus.subscribe("tool.*")
    everything = bus.subscribe("*")
    bus.publish("tool.started", "/s/a1/tool_runner", {"tool": "grep"})
    bus.publish("agent.turn_end", "/s/a1/agent", {})
    assert [e.topic for e in tools.drain_nowait()] == ["tool.started"]
    assert [e.topic for e in everything.drain_nowait()] == ["tool.started", "agent.turn_end"]


def test_a_subscription_can_be_narrowed_to_one_subtree() -> None:
    bus = EventBus()
    one = bus.subscribe("*", source="/sessions/a1")
    bus.publish("x", "/sessions/a1/agent")
    bus.publish("x", "/sessions/a2/agent")
    assert [e.source for e in one.drain_nowait()] == ["/sessions/a1/agent"]


def test_a_slow_subscriber_never_blocks_the_publisher_and_counts_what_it_lost() -> None:
    bus = EventBus()
    slow = bus.subscribe("*", max_buffer=10)
    started = time.monotonic()
    for i in range(10_000):
        bus.publish("tick", "/x", {"i": i})
    assert time.monotonic() - started < 5
    events = slow.drain_nowait()
    assert len(events) == 10
    assert [e.data["i"] for e in events] == list(range(9_990, 10_000))
    assert slow.dropped == 9_990


def test_the_ring_keeps_the_most_recent_events_in_order() -> None:
    bus = EventBus(ring_size=5)
    for i in range(8):
        bus.publish("n" if i % 2 else "m", "/x", {"i": i})
    assert [e.data["i"] for e in bus.recent(10)] == [3, 4, 5, 6, 7]
    assert [e.data["i"] for e in bus.recent(10, topic="n")] == [3, 5, 7]
    assert [e.seq for e in bus.recent(2)] == [7, 8]


def test_a_thread_can_block_for_the_next_event() -> None:
    bus = EventBus()
    sub = bus.subscribe("later")
    threading.Timer(0.01, lambda: bus.publish("later", "/x")).start()
    event = sub.get(timeout=5)
    assert event is not None
    assert event.topic == "later"
    assert sub.get(timeout=0.01) is None


@pytest.mark.trio
async def test_a_trio_task_can_iterate_events_published_from_another_thread() -> None:
    bus = EventBus()
    sub = bus.subscribe("n")

    def publish() -> None:
        for i in range(3):
            bus.publish("n", "/x", {"i": i})
        sub.close()

    threading.Thread(target=publish).start()
    seen = [event.data["i"] async for event in sub]
    assert seen == [0, 1, 2]


@pytest.mark.trio
async def test_receive_wakes_for_an_event_published_on_the_same_loop() -> None:
    bus = EventBus()
    sub = bus.subscribe("n")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: trio.to_thread.run_sync(lambda: None))
        bus.publish("n", "/x", {"i": 1})
        event = await sub.receive()
    assert event.data == {"i": 1}


@pytest.mark.trio
async def test_a_cancelled_receive_leaves_the_event_for_the_next_reader() -> None:
    bus = EventBus()
    sub = bus.subscribe("n")
    bus.publish("n", "/x", {"i": 1})
    with trio.CancelScope() as scope:
        scope.cancel()
        await sub.receive()
    assert scope.cancelled_caught
    event = sub.get_nowait()
    assert event is not None
    assert event.data == {"i": 1}


@pytest.mark.trio
async def test_an_event_taken_by_a_woken_receive_is_returned_even_if_a_cancel_follows() -> None:
    bus = EventBus()
    sub = bus.subscribe("n")
    got: list[object] = []

    async def reader(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            got.append((await sub.receive()).data)
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(reader)
        await trio.testing.wait_all_tasks_blocked()
        bus.publish("n", "/x", {"i": 2})  # wakes the reader (it runs at the next scheduling pass)...
        scope.cancel()  # ...whose receive must still return the event it takes
    assert got == [{"i": 2}]


def test_secrets_never_reach_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    register_secret("sk-test-0123456789abcdef")
    bus = EventBus()
    event = bus.publish(
        "provider.request",
        "/x",
        {
            "headers": {"Authorization": "Bearer sk-test-0123456789abcdef", "Accept": "json"},
            "api_key": "whatever-value",
            "note": "the key is sk-test-0123456789abcdef, really",
        },
    )
    assert event.data["headers"]["Authorization"] == REDACTED
    assert event.data["headers"]["Accept"] == "json"
    assert event.data["api_key"] == REDACTED
    assert "sk-test" not in event.data["note"]
    assert "sk-test" not in repr(bus.recent(1))


def test_statistics_count_per_topic_and_drops() -> None:
    bus = EventBus()
    sub = bus.subscribe("*", max_buffer=1)
    bus.publish("a", "/x")
    bus.publish("a", "/x")
    stats = bus.statistics()
    assert stats["published"] == 2
    assert stats["topics"] == {"a": 2}
    assert stats["dropped"] == 1
    sub.close()
    assert bus.statistics()["subscribers"] == 0
    assert os.environ is not None


def test_emitted_events_nobody_wants_are_built_when_read_in_the_bus_order() -> None:
    bus = EventBus()
    bus.emit("tool.started", "/s/tool_runner", {"call_id": "c1", "api_key": "k-123"})
    bus.publish("agent.state", "/s/agent", {"to": "executing_tools"})
    bus.emit("tool.finished", "/s/tool_runner", {"call_id": "c1", "nested": {"api_key": "t-1", "n": [1, 2]}})
    events = bus.recent(10)
    assert [(e.seq, e.topic) for e in events] == [(1, "tool.started"), (2, "agent.state"), (3, "tool.finished")]
    assert events[0].data == {"call_id": "c1", "api_key": REDACTED}
    assert events[2].data == {"call_id": "c1", "nested": {"api_key": REDACTED, "n": [1, 2]}}
    assert events[0].time <= events[1].time <= events[2].time
    assert bus.recent(10)[0] is events[0]  # built once, the same event for every reader
    assert [e.topic for e in bus.recent(10, topic="tool.*", source="/s/tool")] == ["tool.started", "tool.finished"]
    assert bus.statistics()["topics"] == {"tool.started": 1, "agent.state": 1, "tool.finished": 1}


def test_an_emitted_event_reaches_a_subscriber_that_came_before_it_not_one_that_came_after() -> None:
    bus = EventBus()
    bus.emit("tool.started", "/s/tool_runner", {"i": 0})  # nobody wants it: kept unbuilt
    tools = bus.subscribe("tool.*", source="/s")
    others = bus.subscribe("agent.*")
    bus.emit("tool.started", "/s/tool_runner", {"i": 1, "password": "p"})
    bus.emit("tool.started", "/elsewhere/tool_runner", {"i": 2})
    assert [e.data for e in tools.drain_nowait()] == [{"i": 1, "password": REDACTED}]
    assert others.drain_nowait() == []
    assert [e.data["i"] for e in bus.recent(10)] == [0, 1, 2]


def test_a_secret_known_by_the_time_an_emitted_event_is_read_never_reaches_it() -> None:
    bus = EventBus()
    bus.emit("tool.finished", "/x", {"output": "the value is sk-emit-0123456789abcdef"})
    register_secret("sk-emit-0123456789abcdef")
    assert "sk-emit" not in repr(bus.recent(1))


def test_recent_leaves_out_excluded_topics_and_builds_only_what_it_returns() -> None:
    bus = EventBus(ring_size=10_000)
    bus.emit("fault.injected", "/faults", {"id": "early"})
    for n in range(5000):
        bus.emit("agent.message_delta", f"/sessions/a{n % 7}/agent", {"text": "x"})
    bus.emit("tool.started", "/sessions/a1/tool_runner", {"tool": "glob"})
    # The fault is still found behind 5,000 deltas: a filter searches the whole ring.
    assert [e.data["id"] for e in bus.recent(10, topic="fault.*")] == ["early"]
    kept = bus.recent(3, exclude=["agent.message_delta"])
    assert [e.topic for e in kept] == ["fault.injected", "tool.started"]
    newest = bus.recent(2, source="/sessions/a1")
    assert [e.topic for e in newest] == ["agent.message_delta", "tool.started"]
    # Only what was returned was built: the ring still holds the others unbuilt.
    ring = list(bus._ring)
    assert sum(1 for e in ring if not isinstance(e, Event) and e.event is not None) <= 5
