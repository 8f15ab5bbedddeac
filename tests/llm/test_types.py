"""The provider-neutral values."""

from __future__ import annotations

import msgspec
import pytest
from weald.runtime.llm import (
    Completed,
    Message,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallStarted,
    Usage,
)
from weald.runtime.llm._http import parse_retry_after


def test_usages_add_up() -> None:
    total = Usage(1, 2, 3, 4) + Usage(10, 20, 30, 40)
    assert total == Usage(11, 22, 33, 44)
    assert total.total_input_tokens == 11 + 33 + 44


@pytest.mark.parametrize(
    ("raw", "arguments", "error"),
    [
        ('{"a": 1}', {"a": 1}, None),
        ("", {}, None),
        ("  ", {}, None),
        ('{"a": ', None, "not valid JSON"),
        ("[1, 2]", None, "must be a JSON object, but they are a JSON array"),
        ('"x"', None, "a JSON string"),
    ],
)
def test_tool_call_arguments_are_parsed_or_explained(
    raw: str, arguments: dict[str, object] | None, error: str | None
) -> None:
    call = ToolCall.parse(id="c1", name="edit", raw_arguments=raw)
    assert call.arguments == arguments
    assert call.raw_arguments == raw
    if error is None:
        assert call.error is None
    else:
        assert call.error is not None
        assert error in call.error
        assert "Call the tool again" in call.error


def test_stream_events_round_trip_as_a_tagged_union() -> None:
    events: list[StreamEvent] = [
        TextDelta("hi"),
        ToolCallStarted(index=0, id="c", name="t"),
        Completed(
            message=Message(
                role="assistant",
                content="hi",
                tool_calls=[ToolCall.parse(id="c", name="t", raw_arguments="{}")],
            ),
            usage=Usage(1, 2),
            stop_reason="tool_use",
        ),
    ]
    wire = msgspec.json.encode(events)
    assert b'"type":"text_delta"' in wire
    assert msgspec.json.decode(wire, type=list[StreamEvent]) == events


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") == 0.0
    now = 1_700_000_000.0  # 2023-11-14T22:13:20Z
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now=now) == 30.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0.0
