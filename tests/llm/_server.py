"""A real HTTP/1.1 server on loopback that plays back scripted replies.

Each test queues :class:`Reply` objects; the server answers the requests it
receives with them in order and records every request. Streaming replies use
chunked transfer encoding, one HTTP chunk per body piece, as real SSE servers
do. Events let tests wait for conditions (the server stalling, the client
hanging up) instead of sleeping. `LoopbackModel` runs one on a thread of its
own, for a daemon process to call; the ``anthropic_*`` helpers build
Anthropic Messages streams.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import h11
import trio
import trio.lowlevel
from weald.runtime.llm import ModelRequest, Provider, StreamEvent

SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))


@attrs.define
class Reply:
    """How the server answers one request.

    Attributes:
        status: The HTTP status.
        headers: Response headers.
        body: Body pieces, each sent as its own HTTP chunk and socket write.
        json_body: If set, the whole body as JSON with a Content-Length.
        stall: After the body pieces, keep the connection open and silent
            until the client hangs up.
        drop: Close the connection without answering.
        cut: After the body pieces, close the connection without ending
            the body, as a server that crashes mid-stream does.
        hang: Never answer; wait until the client hangs up.
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = SSE_HEADERS
    body: list[bytes] = attrs.field(factory=list)
    json_body: object = None
    stall: bool = False
    drop: bool = False
    cut: bool = False
    hang: bool = False


@attrs.frozen
class Seen:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    time: float
    connection: int  # which connection it came on, counted from 0

    def json(self) -> dict[str, object]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


def error_reply(status: int, message: str, *, headers: Iterable[tuple[str, str]] = ()) -> Reply:
    """An error reply shaped as OpenAI's and Anthropic's error bodies."""
    return Reply(
        status=status,
        headers=(("content-type", "application/json"), *headers),
        json_body={
            "type": "error",
            "error": {"type": "test_error", "message": message, "code": None},
        },
    )


class FakeServer:
    """The server; start it with ``await nursery.start(server.serve)``."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[Seen] = []
        self.port = 0
        self.connections = 0  # how many the server has accepted
        self.stalled = trio.Event()  # a stalling reply has sent its body
        self.client_gone = trio.Event()  # the client hung up on a stalled reply

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started()

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        connection = self.connections
        self.connections += 1
        try:
            while True:
                request = await _next_event(conn, stream)
                if not isinstance(request, h11.Request):
                    return
                body = b""
                while True:
                    event = await _next_event(conn, stream)
                    if isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return
                self.requests.append(
                    Seen(
                        method=request.method.decode(),
                        path=request.target.decode(),
                        headers={k.decode(): v.decode() for k, v in request.headers},
                        body=body,
                        time=trio.current_time(),
                        connection=connection,
                    )
                )
                reply = (
                    self.replies.pop(0)
                    if self.replies
                    else error_reply(500, "the test scripted no reply for this request")
                )
                if not await self._send(conn, stream, reply):
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()

    async def _send(self, conn: h11.Connection, stream: trio.SocketStream, reply: Reply) -> bool:
        """Send ``reply``; return whether the connection can serve another request."""
        if reply.drop:
            return False
        if reply.hang:
            await self._wait_for_hang_up(stream)
            return False
        headers = list(reply.headers)
        if reply.json_body is not None:
            payload = json.dumps(reply.json_body).encode()
            headers.append(("content-length", str(len(payload))))
            await stream.send_all(conn.send(h11.Response(status_code=reply.status, headers=headers)))
            await stream.send_all(conn.send(h11.Data(data=payload)))
            await stream.send_all(conn.send(h11.EndOfMessage()))
            return True
        await stream.send_all(conn.send(h11.Response(status_code=reply.status, headers=headers)))
        for piece in reply.body:
            await stream.send_all(conn.send(h11.Data(data=piece)))
            # Let the client read each piece on its own where it can.
            await trio.lowlevel.checkpoint()
        if reply.stall:
            await self._wait_for_hang_up(stream)
            return False
        if reply.cut:
            return False
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True

    async def _wait_for_hang_up(self, stream: trio.SocketStream) -> None:
        self.stalled.set()
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        self.client_gone.set()


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> object:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        return event


def sse(data: object, event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line, a ``data:`` line, a blank line."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


async def collect(provider: Provider, request: ModelRequest) -> list[StreamEvent]:
    """Run one model call to the end and return its events."""
    async with contextlib.aclosing(provider.stream(request)) as events:
        return [event async for event in events]


def closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def unanswered_listener() -> Iterator[int]:
    """A loopback port whose connection attempts never complete.

    The listener's accept queue (backlog 0) is filled by one connection that
    is never accepted; Linux then drops further SYNs, so a client's connect
    waits until its own timeout.
    """
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port: int = listener.getsockname()[1]
        filler.connect(("127.0.0.1", port))
        yield port


# -- Anthropic Messages streams ----------------------------------------------------------

ANTHROPIC_MODEL = "claude-sonnet-4-5"


def anthropic_event(kind: str, **fields: object) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def anthropic_message_start(input_tokens: int = 25, cache_read: int = 0) -> bytes:
    return anthropic_event(
        "message_start",
        message={
            "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": ANTHROPIC_MODEL,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cache_read,
                "output_tokens": 1,
            },
        },
    )


def anthropic_text_block(index: int, *pieces: str) -> list[bytes]:
    return [
        anthropic_event("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *[
            anthropic_event(
                "content_block_delta",
                index=index,
                delta={"type": "text_delta", "text": piece},
            )
            for piece in pieces
        ],
        anthropic_event("content_block_stop", index=index),
    ]


def anthropic_tool_block(index: int, tool_id: str, name: str, *fragments: str) -> list[bytes]:
    return [
        anthropic_event(
            "content_block_start",
            index=index,
            content_block={"type": "tool_use", "id": tool_id, "name": name, "input": {}},
        ),
        anthropic_event(
            "content_block_delta",
            index=index,
            delta={"type": "input_json_delta", "partial_json": ""},
        ),
        *[
            anthropic_event(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": fragment},
            )
            for fragment in fragments
        ],
        anthropic_event("content_block_stop", index=index),
    ]


def anthropic_message_end(stop_reason: str, output_tokens: int) -> list[bytes]:
    return [
        anthropic_event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        anthropic_event("message_stop"),
    ]


class LoopbackModel:
    """tests/llm's `FakeServer` on its own trio thread: an OpenAI-compatible server a daemon process can call."""

    def __init__(self) -> None:
        self.server = FakeServer()
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name="loopback-model", daemon=True)

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            self._token = trio.lowlevel.current_trio_token()
            await nursery.start(self.server.serve)
            self._ready.set()

    def __enter__(self) -> LoopbackModel:
        self._thread.start()
        assert self._ready.wait(30), "the loopback model server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        assert self._scope is not None
        self._token.run_sync_soon(self._scope.cancel)
        self._thread.join(30)

    def answer(self, text: str) -> None:
        """Queue one streamed Chat Completions answer."""
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        body = [
            sse({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]}),
            sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            sse({**chunk, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
            b"data: [DONE]\n\n",
        ]
        self.server.replies.append(Reply(body=body))

    def requests(self) -> list[dict[str, Any]]:
        return [seen.json() for seen in list(self.server.requests)]
