"""The incremental SSE decoder, fed byte streams split at random points."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from weald.runtime.llm import SSEDecoder, SSEEvent

# Text that may appear in a field value: anything but line breaks, with
# multi-byte characters so that splits land inside UTF-8 sequences.
values = st.text(alphabet=st.sampled_from('ab :"{}é—日本🎉\ufeff\t'), max_size=20)
names = st.text(alphabet=st.sampled_from("abcxyz_0"), min_size=1, max_size=8)
line_ends = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def event_streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    """A serialised event stream and the events it must decode to."""
    end = draw(line_ends)
    lines: list[str] = []
    expected: list[SSEEvent] = []
    last_id: str | None = None
    if draw(st.booleans()):
        lines[:0] = ["\ufeff"]  # a BOM before the first line
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            lines.append(":" + draw(values))  # a comment
        kind = draw(st.none() | names)
        if kind is not None:
            lines.append(f"event: {kind}")
        if draw(st.booleans()):
            last_id = draw(names)
            lines.append(f"id: {last_id}")
        data = draw(st.lists(values, min_size=1, max_size=3))
        for value in data:
            # Sometimes without the optional space; a value that itself starts
            # with a space then needs the space to survive.
            spaced = draw(st.booleans()) or value.startswith(" ")
            lines.append(f"data: {value}" if spaced else f"data:{value}")
        if draw(st.booleans()):
            lines.append("retry: 1000")
        lines.append("")
        expected.append(SSEEvent(data="\n".join(data), event=kind or "message", id=last_id))
    text = "".join(line + end for line in lines)
    if text.startswith("\ufeff"):
        text = "\ufeff" + text.removeprefix("\ufeff" + end)
    return text.encode(), expected


def decode(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@given(event_streams(), st.lists(st.integers(min_value=0), max_size=40))
def test_events_decode_the_same_however_the_bytes_are_split(
    stream: tuple[bytes, list[SSEEvent]], cuts: list[int]
) -> None:
    data, expected = stream
    assert decode(split(data, cuts)) == expected


@given(event_streams())
def test_events_decode_the_same_fed_one_byte_at_a_time(
    stream: tuple[bytes, list[SSEEvent]],
) -> None:
    data, expected = stream
    assert decode([data[i : i + 1] for i in range(len(data))]) == expected


def test_a_blank_line_without_data_dispatches_nothing() -> None:
    assert decode([b"event: ping\n\n: keepalive\n\n"]) == []


def test_an_empty_data_line_dispatches_an_empty_event() -> None:
    assert decode([b"data\n\n"]) == [SSEEvent(data="")]


def test_a_cr_at_a_chunk_end_followed_by_lf_is_one_line_end() -> None:
    assert decode([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]) == [SSEEvent(data="a\nb")]


def test_complete_lines_without_the_last_blank_line_are_still_delivered() -> None:
    assert decode([b"data: [DONE]\n"]) == [SSEEvent(data="[DONE]")]


def test_an_unterminated_last_line_is_dropped() -> None:
    assert decode([b'data: {"a": 1}\n\ndata: {"trunc']) == [SSEEvent(data='{"a": 1}')]


def test_invalid_utf8_becomes_the_replacement_character() -> None:
    assert decode([b"data: \xff\n\n"]) == [SSEEvent(data="\ufffd")]
