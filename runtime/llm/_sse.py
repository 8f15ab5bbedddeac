"""An incremental decoder for server-sent events.

It follows the WHATWG ``text/event-stream`` parsing rules: bytes are decoded
as UTF-8 (invalid sequences become U+FFFD, a leading BOM is dropped); lines
end in CRLF, LF or CR; a line starting with ``:`` is a comment; ``field:
value`` loses one space after the colon; ``data`` lines accumulate, joined by
newlines; a blank line dispatches the event, unless it has no data. Bytes may
arrive split anywhere -- mid-line, mid-CRLF, mid-UTF-8 sequence.

One deliberate leniency: at the end of the stream, complete lines of an event
that was never followed by a blank line are still dispatched (some servers
omit the last blank line); an unterminated last line is dropped, since a
truncated connection leaves exactly that.
"""

from __future__ import annotations

import codecs
import re

import msgspec

__all__ = ["SSEDecoder", "SSEEvent"]

_LINE_END = re.compile(r"\r\n|\r|\n")


class SSEEvent(msgspec.Struct, frozen=True):
    r"""One dispatched server-sent event.

    Attributes:
        event: The event type (``"message"`` unless the server named one).
        data: The data lines, joined by ``"\\n"``.
        id: The last event id seen so far, if any.
    """

    data: str
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    r"""Turns a byte stream, fed in chunks of any size, into :class:`SSEEvent`\\ s.

    Not thread-safe; one decoder per stream.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._started = False  # whether the BOM check has been done
        self._partial: list[str] = []  # the current line, not yet terminated
        # Invariant: True only when the last character seen was a CR that
        # ended a line, so that an LF at the start of the next chunk belongs
        # to the same line ending.
        self._after_cr = False
        self._event_type = ""
        self._data: list[str] = []
        self._last_id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk`` and return the events it completes, in order."""
        return self._feed_text(self._utf8.decode(chunk))

    def close(self) -> list[SSEEvent]:
        """Finish the stream and return the events still pending.

        After this the decoder must not be fed again.
        """
        events = self._feed_text(self._utf8.decode(b"", final=True))
        self._partial.clear()
        if self._data:
            events.append(self._dispatch())
        return events

    def _feed_text(self, text: str) -> list[SSEEvent]:
        if not text:
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._after_cr:
            self._after_cr = False
            text = text.removeprefix("\n")
        events: list[SSEEvent] = []
        start = 0
        for match in _LINE_END.finditer(text):
            self._partial.append(text[start : match.start()])
            line = "".join(self._partial)
            self._partial.clear()
            event = self._process_line(line)
            if event is not None:
                events.append(event)
            start = match.end()
        if start < len(text):
            self._partial.append(text[start:])
        elif text.endswith("\r"):
            self._after_cr = True
        return events

    def _process_line(self, line: str) -> SSEEvent | None:
        if not line:
            if not self._data:
                self._event_type = ""
                return None
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event_type = value
        elif field == "id" and "\0" not in value:
            self._last_id = value
        # "retry" and unknown fields are ignored.
        return None

    def _dispatch(self) -> SSEEvent:
        event = SSEEvent(
            data="\n".join(self._data),
            event=self._event_type or "message",
            id=self._last_id,
        )
        self._data.clear()
        self._event_type = ""
        return event
