"""HTML reduced to readable text for a model, on the standard library's ``html.parser``.

What is kept, and how it looks:

- headings as ``#``-prefixed lines (``## Install``);
- paragraphs and other blocks separated by blank lines;
- links as ``text (url)``, the URL made absolute against the page's address;
- lists as ``- item`` / ``1. item``, nested lists indented;
- ``pre`` blocks verbatim inside fences, inline ``code`` in backticks;
- block quotes prefixed ``>``, table cells separated by ``|``, images by their alt text.

Scripts, styles, navigation, ``noscript``, forms' buttons, embedded frames
and the document head (except its title) are dropped; other whitespace collapses.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin

import attrs

__all__ = ["HTMLText", "html_to_text"]

_DROP = frozenset(
    {
        "script",
        "style",
        "noscript",
        "nav",
        "template",
        "svg",
        "canvas",
        "iframe",
        "object",
        "embed",
        "head",
        "button",
        "select",
        "dialog",
    },
)
_BLOCK = frozenset(
    {
        "p",
        "div",
        "section",
        "article",
        "main",
        "header",
        "footer",
        "aside",
        "address",
        "figure",
        "figcaption",
        "details",
        "summary",
        "table",
        "thead",
        "tbody",
        "tfoot",
        "caption",
        "form",
        "fieldset",
        "dl",
        "center",
        "body",
        "html",
    },
)
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_SPACE = re.compile(r"\s+")
_BLANK_LINES = re.compile(r"\n{3,}")


@attrs.frozen
class HTMLText:
    """A page as text.

    Attributes:
        title: the document's ``<title>``, or ``""``.
        text: the readable text.
    """

    title: str
    text: str


def html_to_text(html: str, base_url: str | None = None) -> HTMLText:
    """Convert an HTML document (or a fragment, or a truncated document) to readable text.

    Args:
        html: the markup.
        base_url: the page's address, against which relative links are resolved.
    """
    converter = _Converter(base_url or "")
    converter.feed(html)
    converter.close()
    return HTMLText(title=converter.title, text=converter.result())


class _Block:
    __slots__ = ("text", "tight")

    def __init__(self, text: str, *, tight: bool) -> None:
        self.text = text
        self.tight = tight


class _Converter(HTMLParser):
    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base = base_url
        self._title: list[str] = []
        self._in_title = False
        self._skip = 0
        self._blocks: list[_Block] = []
        self._inline: list[str] = []
        self._prefix = ""
        self._tight = False
        self._lists: list[list[int]] = []  # [ordered (0/1), counter]
        self._quote = 0
        self._pre = 0
        self._pre_text: list[str] = []
        self._link: tuple[str, int] | None = None
        self._cells = 0

    @property
    def title(self) -> str:
        return _SPACE.sub(" ", "".join(self._title)).strip()

    # -- output --------------------------------------------------------------------

    def _add(self, text: str, *, tight: bool = False) -> None:
        if self._quote:
            mark = "> " * self._quote
            text = "\n".join(mark + line if line else mark.rstrip() for line in text.split("\n"))
        self._blocks.append(_Block(text, tight=tight))

    def _flush(self) -> None:
        self._close_link()
        raw = "".join(self._inline)
        self._inline = []
        lines = [_SPACE.sub(" ", line).strip() for line in raw.split("\n")]
        text = "\n".join(line for line in lines if line)
        if text:
            if self._prefix:
                pad = " " * len(self._prefix)
                text = self._prefix + text.replace("\n", "\n" + pad)
            self._add(text, tight=self._tight)
        self._prefix = ""
        self._tight = False
        self._cells = 0

    def result(self) -> str:
        self._flush()
        parts: list[str] = []
        previous: _Block | None = None
        for block in self._blocks:
            if previous is not None:
                parts.append("\n" if block.tight and previous.tight else "\n\n")
            parts.append(block.text)
            previous = block
        return _BLANK_LINES.sub("\n\n", "".join(parts)).strip()

    # -- links ---------------------------------------------------------------------

    def _close_link(self) -> None:
        if self._link is None:
            return
        href, start = self._link
        self._link = None
        text = _SPACE.sub(" ", "".join(self._inline[start:])).strip()
        if not href or href.startswith(("#", "javascript:")):
            return
        url = urljoin(self.base, href) if self.base else href
        if not text:
            self._inline.append(url)
        elif text not in (url, href):
            self._inline.append(f" ({url})")

    # -- parser callbacks ------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
            return
        if tag == "base" and not self.base:
            href = dict(attrs).get("href")
            if href:
                self.base = href
        if tag in _DROP:
            self._skip += 1
            return
        if self._skip:
            return
        if self._pre:
            if tag == "br":
                self._pre_text.append("\n")
            return
        self._start(tag, dict(attrs))

    def _start(self, tag: str, attrs: dict[str, str | None]) -> None:
        if tag in _HEADINGS:
            self._flush()
            self._prefix = "#" * _HEADINGS[tag] + " "
        elif tag in ("ul", "ol", "menu"):
            self._flush()
            self._lists.append([int(tag == "ol"), 0])
        elif tag == "li":
            self._flush()
            if not self._lists:
                self._lists.append([0, 0])
            kind = self._lists[-1]
            kind[1] += 1
            bullet = f"{kind[1]}. " if kind[0] else "- "
            self._prefix = "  " * (len(self._lists) - 1) + bullet
            self._tight = True
        elif tag == "pre":
            self._flush()
            self._pre = 1
            self._pre_text = []
        elif tag == "blockquote":
            self._flush()
            self._quote += 1
        elif tag in ("dt", "dd"):
            self._flush()
            self._prefix = "  " if tag == "dd" else ""
            self._tight = True
        elif tag == "tr":
            self._flush()
            self._tight = True
        elif tag in ("td", "th"):
            if self._cells:
                self._inline.append(" | ")
            self._cells += 1
        elif tag == "br":
            self._inline.append("\n")
        elif tag == "hr":
            self._flush()
            self._add("---")
        elif tag == "a":
            self._close_link()
            self._link = (attrs.get("href") or "", len(self._inline))
        elif tag == "img":
            alt = (attrs.get("alt") or "").strip()
            if alt:
                self._inline.append(f"[image: {alt}]")
        elif tag == "code":
            self._inline.append("`")
        elif tag in _BLOCK:
            self._flush()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in ("br", "hr", "img", "base"):
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
            return
        if tag in _DROP:
            self._skip = max(0, self._skip - 1)
            return
        if self._skip:
            return
        if self._pre:
            if tag == "pre":
                body = "".join(self._pre_text).strip("\n")
                self._pre = 0
                self._pre_text = []
                if body.strip():
                    self._add(f"```\n{body}\n```")
            return
        if tag in ("ul", "ol", "menu"):
            self._flush()
            if self._lists:
                self._lists.pop()
        elif tag == "blockquote":
            self._flush()
            self._quote = max(0, self._quote - 1)
        elif tag == "a":
            self._close_link()
        elif tag == "code":
            self._inline.append("`")
        elif tag in _HEADINGS or tag in _BLOCK or tag in ("li", "tr", "dt", "dd"):
            self._flush()

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self._title.append(data)
            return
        if self._skip:
            return
        if self._pre:
            self._pre_text.append(data)
        else:
            self._inline.append(_SPACE.sub(" ", data))
