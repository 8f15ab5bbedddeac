"""The fetch tool against a real HTTP server on 127.0.0.1, and the HTML converter."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
import trio
from weald.runtime import ActorSystem
from weald.runtime.agents.tool_runner import RunnerConfig, RunTools, ToolCallRequest, ToolRunner
from weald.runtime.testing import ResultCollector, wait_until
from weald.tools import SessionServices, ToolContext, ToolRegistry, ToolResult, invoke
from weald.tools._html import html_to_text
from weald.tools.fetch import fetch

PAGE = """<!doctype html>
<html><head><title>The  Test Page</title>
<style>body { color: red }</style>
<script>var hidden = "script text";</script>
</head>
<body>
<nav><a href="/home">Home</a> | <a href="/about">About</a></nav>
<h1>Main title</h1>
<p>Some   <b>bold</b>
text with a <a href="/docs/intro.html">relative link</a> and <a href="#top">an anchor</a>.</p>
<h2>Install</h2>
<ul><li>first item</li><li>second <code>item</code>
  <ol><li>nested one</li><li>nested two</li></ol></li></ul>
<pre>def f(x):
    return   x + 1
</pre>
<noscript>Enable JavaScript</noscript>
<blockquote><p>Quoted words.</p></blockquote>
<table><tr><th>Name</th><th>Value</th></tr><tr><td>a</td><td>1</td></tr></table>
</body></html>
"""


class Handler(BaseHTTPRequestHandler):
    """Routes: see `do_GET`. ``release`` unblocks the slow route."""

    release: ClassVar[threading.Event]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet

    def send(self, status: int, content_type: str, body: bytes, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path
        if path == "/page.html":
            self.send(200, "text/html; charset=utf-8", PAGE.encode())
        elif path == "/data.json":
            self.send(200, "application/json", json.dumps({"name": "weald", "tags": ["a", "b"]}).encode())
        elif path == "/plain.txt":
            self.send(200, "text/plain; charset=utf-8", b"just text\nline two\n")
        elif path == "/redirect":
            self.send(302, "text/plain", b"moved", Location="/page.html")
        elif path == "/other-host":
            # The same server under another name: a different host all the same.
            port = self.server.server_address[1]
            self.send(302, "text/plain", b"moved", Location=f"http://localhost:{port}/page.html")
        elif path == "/hop-then-other-host":
            self.send(301, "text/plain", b"moved", Location="/other-host")
        elif path == "/same-host-absolute":
            port = self.server.server_address[1]
            self.send(307, "text/plain", b"moved", Location=f"http://127.0.0.1:{port}/plain.txt")
        elif path == "/to-ftp":
            self.send(302, "text/plain", b"moved", Location="ftp://example.com/file.txt")
        elif path == "/loop":
            self.send(302, "text/plain", b"again", Location="/loop")
        elif path == "/missing":
            self.send(404, "text/html", b"<html><body><h1>Not Found</h1><p>No such page here.</p></body></html>")
        elif path == "/big.txt":
            self.send(200, "text/plain", b"0123456789" * 200_000)
        elif path == "/image.png":
            self.send(200, "image/png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
        elif path == "/unlabelled-text":
            self.send(200, "application/octet-stream", b"plain words after all\n")
        elif path == "/unlabelled-binary":
            self.send(200, "application/octet-stream", b"\x00\x01\x02\x03" * 100)
        elif path == "/slow":
            self.release.wait(10)
            self.send(200, "text/plain", b"too late")
        else:
            self.send(500, "text/plain", b"unknown route")


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client hanging up early (size cap, timeout) is expected here


@pytest.fixture
def server() -> Iterator[str]:
    release = threading.Event()
    handler = type("BoundHandler", (Handler,), {"release": release})
    httpd = QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), name="test-http-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(working_dir=tmp_path, session=SessionServices(output_dir=tmp_path / "out"))


async def get(ctx: ToolContext, **arguments: Any) -> ToolResult:
    return await invoke(fetch, ctx, arguments)


def test_fetch_is_declared_as_a_network_tool_that_asks_permission_for_its_url() -> None:
    assert fetch.permission == "ask"
    assert fetch.kind == "network"
    assert fetch.timeout == 30
    assert fetch.is_async
    assert fetch.subject is not None
    assert fetch.subject({"url": "https://example.com"}) == "https://example.com"


@pytest.mark.trio
async def test_an_html_page_becomes_readable_text(ctx: ToolContext, server: str) -> None:
    result = await get(ctx, url=f"{server}/page.html")
    assert result.ok
    text = result.output
    assert text.startswith(f"{server}/page.html (200 OK, text/html, ")
    assert "Title: The Test Page" in text
    assert "# Main title" in text
    assert "## Install" in text
    assert f"Some bold text with a relative link ({server}/docs/intro.html) and an anchor." in text
    assert "- first item\n- second `item`\n  1. nested one\n  2. nested two" in text
    assert "```\ndef f(x):\n    return   x + 1\n```" in text
    assert "> Quoted words." in text
    assert "Name | Value\na | 1" in text
    for dropped in ("script text", "color: red", "Enable JavaScript", "About"):
        assert dropped not in text


@pytest.mark.trio
async def test_json_is_pretty_printed(ctx: ToolContext, server: str) -> None:
    result = await get(ctx, url=f"{server}/data.json")
    assert result.ok
    body = result.output.split("\n\n", 1)[1]
    assert body == '{\n  "name": "weald",\n  "tags": [\n    "a",\n    "b"\n  ]\n}'


@pytest.mark.trio
async def test_plain_text_is_returned_as_it_is(ctx: ToolContext, server: str) -> None:
    result = await get(ctx, url=f"{server}/plain.txt")
    assert result.output.endswith("\n\njust text\nline two\n")
    assert result.data["truncated"] is False


@pytest.mark.trio
async def test_redirects_are_followed_and_reported(ctx: ToolContext, server: str) -> None:
    result = await get(ctx, url=f"{server}/redirect")
    assert result.ok
    assert result.output.startswith(f"{server}/page.html (200 OK")
    assert f"Redirected from {server}/redirect" in result.output
    loop = await get(ctx, url=f"{server}/loop")
    assert not loop.ok
    assert "redirected more than 10 times" in loop.output


@pytest.mark.trio
async def test_a_redirect_to_the_same_host_by_absolute_url_is_followed(ctx: ToolContext, server: str) -> None:
    result = await get(ctx, url=f"{server}/same-host-absolute")
    assert result.ok
    assert result.output.startswith(f"{server}/plain.txt (200 OK")
    assert result.output.endswith("just text\nline two\n")


@pytest.mark.trio
async def test_a_redirect_to_another_host_is_not_followed_but_named_for_a_new_call(
    ctx: ToolContext, server: str
) -> None:
    port = server.rpartition(":")[2]
    target = f"http://localhost:{port}/page.html"
    result = await get(ctx, url=f"{server}/other-host")
    assert result.output == (
        f"{server}/other-host redirects to a different host (or scheme or port): 302 Found to {target}\n"
        "The redirect was not followed: permission to fetch one URL does not extend to another host. "
        f"To read it, call fetch again with url='{target}'."
    )
    assert result.data == {"url": f"{server}/other-host", "status": 302, "redirect": target}
    # Same-host hops before it are followed, and named.
    hopped = await get(ctx, url=f"{server}/hop-then-other-host")
    assert hopped.output.startswith(
        f"{server}/hop-then-other-host redirects to a different host (or scheme or port) "
        f"(by way of {server}/other-host): 302 Found to {target}\n",
    )
    assert "Main title" not in hopped.output


@pytest.mark.trio
async def test_a_redirect_to_a_url_that_is_not_http_is_refused(ctx: ToolContext, server: str) -> None:
    result = await get(ctx, url=f"{server}/to-ftp")
    assert not result.ok
    assert result.output == (
        f"{server}/to-ftp redirected to a URL that is not http or https (ftp://example.com/file.txt); "
        "fetch cannot follow it."
    )


@pytest.mark.trio
async def test_an_http_error_gives_the_status_and_an_excerpt(ctx: ToolContext, server: str) -> None:
    result = await get(ctx, url=f"{server}/missing")
    assert not result.ok
    assert result.output.startswith(f"HTTP 404 Not Found from {server}/missing. The page does not exist")
    assert "# Not Found No such page here." in result.output
    assert result.data["status"] == 404


@pytest.mark.trio
async def test_reading_stops_at_max_bytes_and_says_so(ctx: ToolContext, server: str) -> None:
    result = await get(ctx, url=f"{server}/big.txt", max_bytes=1000)
    assert result.ok
    assert result.data["bytes"] == 1000
    assert result.data["truncated"] is True
    assert "0123456789" * 100 in result.output
    assert "[truncated: the response is larger than max_bytes=1,000" in result.output


@pytest.mark.trio
async def test_a_slow_server_times_out_with_a_clear_message(ctx: ToolContext, server: str) -> None:
    started = trio.current_time()
    result = await get(ctx, url=f"{server}/slow", timeout=0.5)
    assert trio.current_time() - started < 3
    assert not result.ok
    assert "timed out after 0.5 s" in result.output
    assert "larger timeout" in result.output


@pytest.mark.trio
async def test_without_a_timeout_argument_the_runners_limit_for_the_call_applies(ctx: ToolContext, server: str) -> None:
    limited = attrs.evolve(ctx, timeout=0.5)  # what the runner passes for [tools.timeouts] fetch = 0.5
    result = await get(limited, url=f"{server}/slow")
    assert not result.ok
    assert f"fetching {server}/slow timed out after 0.5 s." in result.output
    # The call's own argument still wins.
    assert "timed out after 0.3 s" in (await get(limited, url=f"{server}/slow", timeout=0.3)).output


def test_a_configured_fetch_timeout_reaches_the_tool_through_the_runner(
    system: ActorSystem, server: str, tmp_path: Path
) -> None:
    # grace=30: had the limit not reached fetch, its own 30 s default would run out first.
    config = RunnerConfig(timeouts={"fetch": 0.5}, permissions={"fetch": "allow"}, grace=30.0)
    runner = system.spawn(
        ToolRunner,
        args=("s1", tmp_path),
        kwargs={"registry": ToolRegistry([fetch]), "config": config, "output_dir": tmp_path / "out"},
        name="runner",
    )
    agent = ResultCollector.start()
    runner.tell(RunTools("b1", (ToolCallRequest("c1", "fetch", {"url": f"{server}/slow"}),), None, agent))
    results = wait_until(lambda: agent.proxy().received().get(), timeout=20)
    result = results[0].outcomes[0].result
    assert not result.ok
    # fetch's own message, at the configured limit.
    assert result.output.startswith(f"fetching {server}/slow timed out after 0.5 s.")


@pytest.mark.trio
async def test_binary_content_is_refused(ctx: ToolContext, server: str) -> None:
    image = await get(ctx, url=f"{server}/image.png")
    assert not image.ok
    assert "binary content (image/png" in image.output
    assert "curl" in image.output
    unlabelled = await get(ctx, url=f"{server}/unlabelled-binary")
    assert not unlabelled.ok
    assert "NUL bytes" in unlabelled.output
    text = await get(ctx, url=f"{server}/unlabelled-text")
    assert text.ok
    assert "plain words after all" in text.output


@pytest.mark.trio
@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/file", "only http and https"),
        ("file:///etc/passwd", "only http and https"),
        ("example.com/page", "has no scheme"),
        ("http://", "has no host"),
    ],
)
async def test_urls_that_are_not_http_are_refused(ctx: ToolContext, url: str, message: str) -> None:
    result = await get(ctx, url=url)
    assert not result.ok
    assert message in result.output


@pytest.mark.trio
async def test_an_unreachable_host_is_explained(ctx: ToolContext) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = await get(ctx, url=f"http://127.0.0.1:{port}/", timeout=5)
    assert not result.ok
    assert "could not connect to 127.0.0.1" in result.output


def test_html_conversion_handles_fragments_and_truncated_markup() -> None:
    page = html_to_text('<p>One<br>Two</p><div><a href="https://x.org/a">https://x.org/a</a><img alt="logo">')
    assert page.text == "One\nTwo\n\nhttps://x.org/a[image: logo]"
    cut = html_to_text("<h3>Head</h3><p>unfinished <a href='/x'>li", "https://site.test/dir/")
    assert cut.text == "### Head\n\nunfinished li (https://site.test/x)"
