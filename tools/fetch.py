"""The ``fetch`` tool: read a web page or other text resource over HTTP(S).

One GET with httpx on the trio loop, under a trio deadline covering the
whole exchange. Redirects on the same origin (scheme, host and port) are
followed, up to `MAX_REDIRECTS`; a redirect to another origin is not: the
result names the target and asks for a new call, so the permission given
for one URL never carries over to another host. The body is read as a
stream and reading stops at ``max_bytes``: a huge or endless response costs
no more than the cap (compressed bodies count decompressed).

What comes back depends on the content type: HTML is reduced to readable
text (`weald.tools._html`), JSON is pretty-printed, other text is returned
as it is, and binary content is refused before its body is read. A status
of 400 or more is an error result with the status and the start of the body.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import trio
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._hashline import binary_reason
from weald.tools._html import html_to_text

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT", "MAX_BYTES", "MAX_REDIRECTS", "MAX_TIMEOUT", "fetch"]

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
"""How much of a body is read unless the call asks for another amount."""

MAX_BYTES = 20 * 1024 * 1024
"""The most a call may ask to read."""

DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 120.0
MAX_REDIRECTS = 10

# How much of an error response is read, and shown.
_ERROR_BODY = 64 * 1024
_ERROR_EXCERPT = 600

_USER_AGENT = "weald-fetch/0.1 (an LLM coding agent's fetch tool)"
_ACCEPT = "text/html,application/xhtml+xml,text/plain;q=0.9,application/json;q=0.9,text/*;q=0.8,*/*;q=0.5"

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/x-sh",
        "application/sql",
        "application/graphql",
        "application/x-httpd-php",
        "application/x-tex",
        "application/x-python",
    },
)
_BINARY_PREFIXES = ("image/", "audio/", "video/", "font/", "model/")
_BINARY_TYPES = frozenset(
    {
        "application/pdf",
        "application/zip",
        "application/gzip",
        "application/x-gzip",
        "application/x-tar",
        "application/x-7z-compressed",
        "application/x-rar-compressed",
        "application/vnd.ms-excel",
        "application/msword",
        "application/wasm",
        "application/x-bzip2",
        "application/x-xz",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "application/x-executable",
        "application/java-archive",
        "application/x-msdownload",
    },
)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)

_PARAMETERS = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "minLength": 1, "description": "The http:// or https:// URL to read."},
        "max_bytes": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_BYTES,
            "description": f"The most bytes of the body to read (default {DEFAULT_MAX_BYTES}); the rest is cut.",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_TIMEOUT,
            "description": f"Seconds for the whole request (default {DEFAULT_TIMEOUT:g}, at most {MAX_TIMEOUT:g}).",
        },
    },
    "required": ["url"],
    "additionalProperties": False,
}

_DESCRIPTION = (
    "Fetch a URL (http or https, GET) and return its content as text: web pages reduced to readable text "
    "(headings, paragraphs, lists, code blocks, links as 'text (url)'), JSON pretty-printed, other text as is. "
    "Follows redirects on the same host; a redirect to another host is reported, not followed: call fetch "
    "again with the URL it names. Binary content (images, PDFs, archives) is refused. Reads at most max_bytes of the "
    "body (default 5 MiB)."
)


def _subject(arguments: Any) -> str | None:
    url = arguments.get("url")
    return url if isinstance(url, str) else None


@tool(
    name="fetch",
    description=_DESCRIPTION,
    parameters=_PARAMETERS,
    permission="ask",
    timeout=DEFAULT_TIMEOUT,
    max_timeout=MAX_TIMEOUT,
    subject=_subject,
    kind="network",
)
async def fetch(
    ctx: ToolContext,
    *,
    url: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout: float | None = None,
) -> ToolResult:
    """GET ``url`` and return its content as text.

    Without a ``timeout`` argument the request gets the runner's limit for
    the call (``ctx.timeout``: ``[tools.timeouts] fetch``), else `DEFAULT_TIMEOUT`.
    """
    if timeout is None:
        timeout = ctx.timeout if ctx.timeout is not None else DEFAULT_TIMEOUT
    target = _check_url(url)
    with trio.move_on_after(timeout):  # the runner's deadline for the call is later (grace)
        try:
            return await _get(target, max_bytes=max_bytes, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise _timeout_error(url, timeout) from exc
        except httpx.ConnectError as exc:
            raise ToolError(
                f"could not connect to {target.host}: {exc}. Check the host name and port, or try again later.",
            ) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise ToolError(f"the connection to {target.host} failed mid-way: {exc}. Try again.") from exc
        except httpx.DecodingError as exc:
            raise ToolError(f"the response from {url} could not be decoded ({exc}).") from exc
        except httpx.HTTPError as exc:
            raise ToolError(f"fetching {url} failed: {type(exc).__name__}: {exc}.") from exc
    raise _timeout_error(url, timeout)


def _timeout_error(url: str, timeout: float) -> ToolError:
    return ToolError(
        f"fetching {url} timed out after {timeout:g} s. The server is slow or unreachable: try again with a "
        f"larger timeout (at most {MAX_TIMEOUT:g} s), or use another source.",
    )


def _check_url(url: str) -> httpx.URL:
    try:
        target = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise ToolError(f"{url!r} is not a valid URL ({exc}). Give a full http:// or https:// URL.") from exc
    if target.scheme not in ("http", "https"):
        if not target.scheme:
            raise ToolError(f"{url!r} has no scheme. Give a full URL, e.g. 'https://{url.strip()}'.")
        raise ToolError(
            f"fetch reads only http and https URLs, not {target.scheme}:. "
            "Use read_file for local files, or shell for other protocols.",
        )
    if not target.host:
        raise ToolError(f"{url!r} has no host. Give a full URL, e.g. 'https://example.com/page'.")
    return target


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's default port when the URL names none)."""
    port = url.port if url.port is not None else {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, port


async def _get(target: httpx.URL, *, max_bytes: int, timeout: float) -> ToolResult:
    """GET ``target``, following redirects while they stay on its origin.

    httpx follows none itself: each hop is checked here first, so a redirect
    to another origin, or to a scheme other than http(s), is never requested.
    """
    async with httpx.AsyncClient(
        follow_redirects=False,
        timeout=httpx.Timeout(timeout),
        headers={"User-Agent": _USER_AGENT, "Accept": _ACCEPT},
    ) as client:
        request = client.build_request("GET", target)
        for _ in range(MAX_REDIRECTS + 1):
            response = await client.send(request, stream=True)
            try:
                hop = response.next_request
                if hop is None:
                    return await _respond(response, target, max_bytes=max_bytes)
                if hop.url.scheme not in ("http", "https"):
                    raise ToolError(
                        f"{target} redirected to a URL that is not http or https ({hop.url}); fetch cannot follow it.",
                    )
                if _origin(hop.url) != _origin(target):
                    return _other_host_result(response, target, hop.url)
                request = hop
            finally:
                await response.aclose()
    raise ToolError(f"{target} redirected more than {MAX_REDIRECTS} times (a redirect loop?). Check the URL.")


def _other_host_result(response: httpx.Response, requested: httpx.URL, location: httpx.URL) -> ToolResult:
    """The answer to a redirect off the requested origin: where it leads, and how to go there."""
    status = f"{response.status_code} {response.reason_phrase}"
    via = "" if response.url == requested else f" (by way of {response.url})"
    return ToolResult.success(
        f"{requested} redirects to a different host (or scheme or port){via}: {status} to {location}\n"
        "The redirect was not followed: permission to fetch one URL does not extend to another host. "
        f"To read it, call fetch again with url={str(location)!r}.",
        data={"url": str(requested), "status": response.status_code, "redirect": str(location)},
    )


async def _respond(response: httpx.Response, target: httpx.URL, *, max_bytes: int) -> ToolResult:
    """The result for the final (non-redirect) response."""
    content_type = response.headers.get("content-type", "")
    media = content_type.split(";")[0].strip().lower()
    final = str(response.url)
    if response.status_code >= 400:
        body, _ = await _read(response, min(max_bytes, _ERROR_BODY))
        return _error_result(response, media, body)
    if _is_binary_type(media):
        length = response.headers.get("content-length")
        size = f", {int(length):,} bytes" if length and length.isdigit() else ""
        return ToolResult.error(
            f"{final} is binary content ({media}{size}); fetch returns text only. "
            "To download the file, use shell (e.g. curl -L -o NAME URL).",
            data={"url": final, "status": response.status_code, "content_type": media},
        )
    body, truncated = await _read(response, max_bytes)
    return _success_result(response, media, body, truncated=truncated, requested=str(target))


async def _read(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the body, and whether there was more."""
    body = bytearray()
    chunks = response.aiter_bytes().__aiter__()
    # Invariant: True once httpx's generator chain has ended (at the end of
    # the body, or by an exception raised through it): nothing to unwind.
    finished = False
    try:
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                finished = True
                return bytes(body), False
            except BaseException:
                finished = True
                raise
            room = limit - len(body)
            if len(chunk) > room:
                body += chunk[:room]
                return bytes(body), True
            body += chunk
    finally:
        if not finished:
            await _unwind(chunks)


async def _unwind(chunks: AsyncIterator[bytes]) -> None:
    """End httpx's chain of body generators after stopping early.

    An async generator dropped half-way is finalised later by trio, which
    warns about it. Reading on under an already-cancelled scope makes the
    first blocking read inside the chain raise Cancelled, which unwinds and
    closes every generator in it.
    """
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            while True:
                await chunks.__anext__()
        except (StopAsyncIteration, httpx.HTTPError):
            pass  # the chain ended, or broke: either way it is closed


def _is_binary_type(media: str) -> bool:
    return media.startswith(_BINARY_PREFIXES) or media in _BINARY_TYPES


def _charset(response: httpx.Response, media: str, body: bytes) -> str:
    charset = response.charset_encoding
    if charset is None and media in _HTML_TYPES:
        found = _META_CHARSET.search(body[:4096])
        if found is not None:
            charset = found.group(1).decode("ascii", "replace")
    return charset or "utf-8"


def _decode(response: httpx.Response, media: str, body: bytes) -> str:
    try:
        return body.decode(_charset(response, media, body), errors="replace")
    except LookupError:  # an unknown charset name
        return body.decode("utf-8", errors="replace")


def _render(response: httpx.Response, media: str, body: bytes) -> tuple[str, str]:
    """The body as text for the model, and its title (HTML only)."""
    if media in _HTML_TYPES:
        page = html_to_text(_decode(response, media, body), str(response.url))
        return page.text, page.title
    if media == "application/json" or media.endswith("+json") or media == "text/json":
        try:
            return msgspec.json.format(body, indent=2).decode("utf-8", errors="replace"), ""
        except msgspec.DecodeError:
            pass  # not valid JSON (or cut by max_bytes): shown as it is
    return _decode(response, media, body), ""


def _is_text(media: str) -> bool:
    return (
        media.startswith("text/")
        or media in _HTML_TYPES
        or media in _TEXT_TYPES
        or media.endswith(("+xml", "+json", "/json"))
    )


def _success_result(
    response: httpx.Response,
    media: str,
    body: bytes,
    *,
    truncated: bool,
    requested: str,
) -> ToolResult:
    final = str(response.url)
    data: dict[str, Any] = {
        "url": final,
        "status": response.status_code,
        "content_type": media,
        "bytes": len(body),
        "truncated": truncated,
    }
    if not _is_text(media):
        # Unlabelled or generic (application/octet-stream): judge by the bytes.
        reason = binary_reason(body)
        if reason is not None:
            return ToolResult.error(
                f"{final} is binary content ({media or 'no content type'}; {reason}); fetch returns text only. "
                "To download the file, use shell (e.g. curl -L -o NAME URL).",
                data=data,
            )
    text, title = _render(response, media, body)
    header = (
        f"{final} ({response.status_code} {response.reason_phrase}, {media or 'no content type'}, {len(body):,} bytes"
    )
    header += ", truncated)" if truncated else ")"
    lines = [header]
    if final != requested:
        lines.append(f"Redirected from {requested}")
    if title:
        lines.append(f"Title: {title}")
    lines.append("")
    lines.append(text if text.strip() else "(the page has no readable text)")
    if truncated:
        lines.append(
            f"\n[truncated: the response is larger than max_bytes={len(body):,}; only the first "
            f"{len(body):,} bytes were read. Pass a larger max_bytes (at most {MAX_BYTES:,}) to read more.]",
        )
    return ToolResult.success("\n".join(lines), data=data)


def _error_result(response: httpx.Response, media: str, body: bytes) -> ToolResult:
    text, _ = _render(response, media, body) if not _is_binary_type(media) else ("", "")
    excerpt = " ".join(text.split())
    if len(excerpt) > _ERROR_EXCERPT:
        excerpt = excerpt[:_ERROR_EXCERPT] + "…"
    status = response.status_code
    advice = {
        401: "The page needs authentication, which fetch does not do.",
        403: "The server refuses access to it.",
        404: "The page does not exist: check the URL.",
        410: "The page was removed.",
        429: "The server is rate-limiting: wait before trying again.",
    }.get(status, "A server error: try again later." if status >= 500 else "Check the URL.")
    message = f"HTTP {status} {response.reason_phrase} from {response.url}. {advice}"
    if excerpt:
        message += f"\nThe response began: {excerpt}"
    return ToolResult.error(message, data={"url": str(response.url), "status": status, "content_type": media})
