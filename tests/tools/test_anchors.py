"""Line anchors never land in the wrong place: the ledger's versions, views and hunks.

The first tests replay the cases of issue 14 by hand; the last one is the
property: random files, random edit sequences (by anchor, by text, by
write_file, and changes made outside weald), and anchors reused from any
earlier view, fresh or stale. An edit either lands exactly where the anchor
pointed when the model saw it, or is refused.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from weald.tools import SessionServices, ToolContext, ToolResult, invoke
from weald.tools._hashline import line_hash
from weald.tools._ledger import ReadLedger
from weald.tools.edit_file import edit_file
from weald.tools.grep import grep
from weald.tools.read_file import read_file
from weald.tools.write_file import write_file

Call = Callable[..., ToolResult]


def anchor(n: int, content: str) -> str:
    return f"{n}:{line_hash(content)}"


def tag(n: int, content: str) -> str:
    return f"{n}:{line_hash(content)}|{content}"


@pytest.fixture
def put(call: Call, project: Path) -> Callable[[str, list[str]], Path]:
    """Write a file of ``lines`` and read it whole in the session."""

    def make(name: str, lines: list[str]) -> Path:
        path = project / name
        path.write_text("".join(line + "\n" for line in lines))
        assert call(read_file, path=name).ok
        return path

    return make


# The file, as it gives it.
OUTER = ["function outer() {", "if (ok) {", "x();", "y();", "  }", "}"]


# --- the case ------------------------------------------------------------


def test_an_anchor_from_before_an_edit_is_followed_to_its_line(call: Call, put: Callable[..., Path]) -> None:
    path = put("outer.js", OUTER)
    merged = call(
        edit_file, path="outer.js", start=anchor(3, "x();"), through=anchor(4, "y();"), new_string="x(); y();"
    )
    assert merged.ok, merged.output
    # The model reuses the anchor it read for line 5 ("  }"), which is now line 4.
    result = call(edit_file, path="outer.js", start=anchor(5, "  }"), new_string="  } // if")
    assert result.ok, result.output
    assert path.read_text() == "function outer() {\nif (ok) {\nx(); y();\n  } // if\n}\n"
    assert "start='5:d1' is the tag line 5 had before your earlier edit; that line is now line 4" in result.output


def test_an_old_anchor_that_a_tag_check_alone_would_accept_is_refused(call: Call, put: Callable[..., Path]) -> None:
    # Lines 5 and 6 are equal, so after the merge line 5 carries the stale anchor's tag: the old
    # ledger took it as fresh and edited the function's closing brace.
    lines = ["function outer() {", "  if (ok) {", "    x();", "    y();", "  }", "  }", "}"]
    path = put("outer.js", lines)
    assert call(
        edit_file, path="outer.js", start=anchor(3, lines[2]), through=anchor(4, lines[3]), new_string="    x(); y();"
    ).ok
    before = path.read_text()
    result = call(edit_file, path="outer.js", start=anchor(5, "  }"), new_string="  } // if")
    assert not result.ok
    assert result.output.startswith(
        "start='5:d1' is ambiguous: you were shown line 5 with this tag both before and after your edits to "
        "outer.js, and those are not the same line now (it could mean line 4 or line 5), so the edit was refused "
        "rather than guess. "
        "Lines 2-6 of outer.js now are (these tags are current):\n",
    )
    assert tag(4, "  }") in result.output
    assert path.read_text() == before
    # The refusal showed line 5 as it is now, so the same anchor now means that line.
    retry = call(edit_file, path="outer.js", start=anchor(5, "  }"), new_string="  } // outer")
    assert retry.ok, retry.output
    assert path.read_text().splitlines()[4] == "  } // outer"


def test_an_anchor_to_a_line_an_edit_replaced_is_refused_with_the_lines_now(
    call: Call, put: Callable[..., Path]
) -> None:
    path = put("a.txt", ["one", "two", "three", "four"])
    assert call(edit_file, path="a.txt", start=anchor(2, "two"), new_string="TWO").ok
    result = call(edit_file, path="a.txt", start=anchor(2, "two"), new_string="2")
    assert not result.ok
    assert result.output.startswith(
        "start='2:" + line_hash("two") + "' names line 2 as you saw it before your later edits to a.txt, and one "
        "of those edits replaced or deleted that line, so it is no longer in the file. Lines 1-4 of a.txt now are "
        "(these tags are current):\n",
    )
    assert tag(2, "TWO") in result.output
    assert path.read_text() == "one\nTWO\nthree\nfour\n"


def test_a_line_edited_back_to_its_old_text_is_anchored_by_its_tag_again(call: Call, put: Callable[..., Path]) -> None:
    # The same line number and text were shown before and after the edits: line 2 is the line seen either way.
    path = put("a.txt", ["one", "two", "three"])
    assert call(edit_file, path="a.txt", start=anchor(2, "two"), new_string="2").ok
    assert call(edit_file, path="a.txt", start=anchor(2, "2"), new_string="two").ok
    result = call(edit_file, path="a.txt", start=anchor(2, "two"), new_string="TWO")
    assert result.ok, result.output
    assert path.read_text() == "one\nTWO\nthree\n"


def test_a_line_deleted_by_an_edit_cannot_be_anchored(call: Call, put: Callable[..., Path]) -> None:
    path = put("a.txt", ["one", "two", "three"])
    assert call(edit_file, path="a.txt", start=anchor(2, "two")).ok
    result = call(edit_file, path="a.txt", start=anchor(2, "two"), operation="insert_after", new_string="x")
    assert "replaced or deleted that line" in result.output
    assert path.read_text() == "one\nthree\n"


def test_anchors_follow_inserts_and_text_edits_above_them(call: Call, put: Callable[..., Path]) -> None:
    lines = [f"line {i}" for i in range(1, 11)]
    path = put("a.txt", lines)
    assert call(edit_file, path="a.txt", start=anchor(1, "line 1"), operation="insert_before", new_string="a\nb").ok
    assert call(edit_file, path="a.txt", old_string="line 3\n", new_string="").ok
    # Line 8 as first read is now line 9 (two inserted above, one deleted).
    result = call(edit_file, path="a.txt", start=anchor(8, "line 8"), through=anchor(10, "line 10"), new_string="end")
    assert result.ok, result.output
    assert path.read_text().splitlines() == [
        "a",
        "b",
        "line 1",
        "line 2",
        "line 4",
        "line 5",
        "line 6",
        "line 7",
        "end",
    ]


def test_a_range_whose_inside_changed_since_is_refused(call: Call, put: Callable[..., Path]) -> None:
    lines = [f"line {i}" for i in range(1, 31)]
    path = put("a.txt", lines)
    # Change line 15, far from anything the model then anchors.
    assert call(edit_file, path="a.txt", old_string="line 15\n", new_string="fifteen\n").ok
    before = path.read_text()
    result = call(edit_file, path="a.txt", start=anchor(5, "line 5"), through=anchor(25, "line 25"), new_string="x")
    assert not result.ok
    assert result.output.startswith(
        "start and through come from an older view of a.txt than some of the lines between them",
    )
    assert path.read_text() == before
    # The refusal showed the range as it is: the same anchors now work.
    assert call(edit_file, path="a.txt", start=anchor(5, "line 5"), through=anchor(25, "line 25"), new_string="x").ok
    assert path.read_text().splitlines() == [*lines[:4], "x", *lines[25:]]


def test_a_range_that_only_grew_at_its_ends_is_fine(call: Call, put: Callable[..., Path]) -> None:
    lines = [f"line {i}" for i in range(1, 11)]
    path = put("a.txt", lines)
    assert call(edit_file, path="a.txt", start=anchor(2, "line 2"), new_string="two").ok
    assert call(edit_file, path="a.txt", start=anchor(3, "line 3"), through=anchor(6, "line 6"), new_string="x").ok
    assert path.read_text().splitlines() == ["line 1", "two", "x", "line 7", "line 8", "line 9", "line 10"]


def test_an_anchor_from_before_a_change_on_disk_is_refused(
    call: Call,
    put: Callable[..., Path],
) -> None:
    lines = [f"line {i}" for i in range(1, 101)]
    path = put("a.txt", lines)
    path.write_text("inserted\n" + path.read_text())  # a formatter, the user, another tool
    assert call(read_file, path="a.txt", offset=1, limit=10).ok  # the model re-reads only the top
    result = call(edit_file, path="a.txt", start=anchor(50, "line 50"), new_string="x")
    assert not result.ok
    assert result.output.startswith(
        "start='50:" + line_hash("line 50") + "' names line 50 as you saw it before a.txt was changed outside "
        "this session, so weald cannot tell where that line is now.",
    )
    assert tag(51, "line 50") in result.output
    # From the lines that refusal showed, the model can anchor at once.
    assert call(edit_file, path="a.txt", start=anchor(51, "line 50"), new_string="fifty").ok
    assert "fifty" in path.read_text().splitlines()[50]


def test_a_rewrite_that_keeps_size_and_mtime_is_caught_by_the_anchor(call: Call, put: Callable[..., Path]) -> None:
    # Within one clock tick a same-size rewrite passes the freshness check; the anchor must not.
    path = put("a.txt", ["alpha", "beta", "gamma"])
    st = path.stat()
    path.write_text("alpha\nBETA\ngamma\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    result = call(edit_file, path="a.txt", start=anchor(2, "beta"), new_string="b")
    assert result.output.startswith(f"start='{anchor(2, 'beta')}' is stale: line 2 of a.txt now has tag")
    assert path.read_text() == "alpha\nBETA\ngamma\n"


def test_an_anchor_found_by_grep_works_until_lines_move(call: Call, put: Callable[..., Path], project: Path) -> None:
    lines = [f"line {i}" for i in range(1, 201)]
    path = project / "a.txt"
    path.write_text("".join(line + "\n" for line in lines))
    assert call(read_file, path="a.txt", limit=20).ok  # read the top only
    found = call(grep, pattern="^line 150$", path="a.txt")
    assert f"a.txt:{tag(150, 'line 150')}" in found.output
    # Nothing moved: the grep anchor names the line.
    assert call(edit_file, path="a.txt", start=anchor(150, "line 150"), new_string="one fifty").ok
    found = call(grep, pattern="^line 180$", path="a.txt")
    assert call(edit_file, path="a.txt", start=anchor(10, "line 10"), operation="insert_after", new_string="x").ok
    # Line 180 is now line 181; an anchor for "180" that weald never showed is not trusted.
    result = call(edit_file, path="a.txt", start=anchor(181, "line 180"), new_string="y")
    assert result.output.startswith(f"start='{anchor(181, 'line 180')}' matches line 181 of a.txt now, but")
    retry = call(edit_file, path="a.txt", start=anchor(181, "line 180"), new_string="one eighty")
    assert retry.ok, retry.output
    assert path.read_text().splitlines()[180] == "one eighty"


def test_old_anchors_do_not_survive_write_file(call: Call, put: Callable[..., Path]) -> None:
    path = put("a.txt", ["alpha", "beta", "gamma"])
    assert call(write_file, path="a.txt", content="alpha\nbeta\ngamma\ndelta\n").ok
    result = call(edit_file, path="a.txt", start=anchor(2, "beta"), new_string="B")
    assert "replaced or deleted that line" in result.output
    assert path.read_text() == "alpha\nbeta\ngamma\ndelta\n"


def test_without_a_session_only_the_tag_is_checked(
    make_ctx: Callable[..., ToolContext],
    call: Call,
    project: Path,
) -> None:
    (project / "a.txt").write_text("one\ntwo\n")
    result = call(edit_file, ctx=make_ctx(session=None), path="a.txt", start=anchor(2, "two"), new_string="2")
    assert result.ok, result.output
    assert (project / "a.txt").read_text() == "one\n2\n"


# --- the ledger's bounds ---------------------------------------------------------------


def test_the_ledger_keeps_at_most_max_versions_per_file(project: Path) -> None:
    ledger = ReadLedger(max_versions=3)
    path = project / "a.txt"
    data = b"a\n"
    path.write_bytes(data)
    state = ledger.record_read(path, data, path.stat(), first=1, shown=["a"])
    for i in range(6):
        new = data + b"x\n" * (i + 1)
        path.write_bytes(new)
        state = ledger.record_change(path, new, path.stat(), base=state.digest, hunks=[(1 + i, 1 + i, 1)])
    assert ledger.statistics().versions == 3
    history = ledger.history(path, state.digest)
    assert history is not None
    assert len(history.versions) == 3
    # The dropped versions changed nothing above line 2, so line 1 is still known to be stable.
    assert history.stable(1)
    assert not history.stable(2)


def test_the_view_budget_drops_the_oldest_views_first(project: Path) -> None:
    ledger = ReadLedger(max_view_chars=100)
    a, b = project / "a.txt", project / "b.txt"
    a.write_bytes(b"x" * 60 + b"\n")
    b.write_bytes(b"y" * 60 + b"\n")
    ledger.record_read(a, a.read_bytes(), a.stat(), shown=["x" * 60])
    ledger.record_read(b, b.read_bytes(), b.stat(), shown=["y" * 60])
    assert ledger.statistics().view_chars == 60
    history = ledger.history(a, ledger.get(a).digest)  # type: ignore[union-attr]
    assert history is not None
    assert history.versions[-1].views == ()
    ledger.forget(b)
    assert ledger.statistics().view_chars == 0


def test_a_ledger_refuses_impossible_bounds() -> None:
    with pytest.raises(ValueError, match="at least one version"):
        ReadLedger(max_versions=0)


def test_history_is_given_only_for_the_current_content(project: Path) -> None:
    ledger = ReadLedger()
    path = project / "a.txt"
    path.write_bytes(b"a\n")
    state = ledger.record_read(path, b"a\n", path.stat())
    assert ledger.history(path, state.digest) is not None
    assert ledger.history(path, b"\0" * 32) is None


# --- the property ----------------------------------------------------------------------

# Line contents: equal lines (blank ones, braces) are common, and two pairs share a tag.
POOL = ["", "    ", "}", "  }", "    }", "x();", "  x();", "pass", "v49();", "v82();", "v48();", "v83();"]
assert line_hash("v49();") == line_hash("v82();")
assert line_hash("v48();") == line_hash("v83();")
_TAGGED = re.compile(r"^(\d+):([0-9a-f]{2})\|(.*)$")


@attrs.define
class _Seen:
    """An anchor the model was shown, and the line it named then."""

    anchor: str
    identity: int
    fresh_read: bool = False


@attrs.define
class _Model:
    """The harness's own account of the file: each line's identity and content."""

    lines: list[tuple[int, str]]
    next_id: int = 0
    seen: list[_Seen] = attrs.Factory(list)
    stale_file: bool = False
    edits_since_read: int = 0

    def new_lines(self, contents: list[str]) -> list[tuple[int, str]]:
        made = [(self.next_id + i, c) for i, c in enumerate(contents)]
        self.next_id += len(contents)
        return made

    def text(self) -> str:
        return "".join(c + "\n" for _, c in self.lines)

    def position(self, identity: int) -> int | None:
        for i, (ident, _) in enumerate(self.lines):
            if ident == identity:
                return i
        return None

    def learn(self, output: str, *, fresh_read: bool = False) -> None:
        """Remember every tagged line an output shows, as the line it is now.

        A model cannot mean two lines by one anchor: an anchor shown again
        means the line it was shown for last.
        """
        if fresh_read:
            for seen in self.seen:
                seen.fresh_read = False
        for line in output.split("\n"):
            m = _TAGGED.match(line)
            if m is None:
                continue
            n = int(m[1])
            ident, content = self.lines[n - 1]
            assert (m[2], m[3]) == (line_hash(content), content), (line, content)
            shown = f"{n}:{m[2]}"
            self.seen = [seen for seen in self.seen if seen.anchor != shown]
            self.seen.append(_Seen(shown, ident, fresh_read))


def _run(ctx: ToolContext, tool: object, **arguments: object) -> ToolResult:
    return trio.run(invoke, tool, ctx, arguments)


def _contents(draw: st.DataObject, low: int, high: int) -> list[str]:
    return draw.draw(st.lists(st.sampled_from(POOL), min_size=low, max_size=high))


def _anchored_step(data: st.DataObject, ctx: ToolContext, model: _Model, path: Path) -> None:
    if not model.seen:
        return
    start = data.draw(st.sampled_from(model.seen))
    operation = data.draw(st.sampled_from(["replace", "insert_after", "insert_before"]))
    through = data.draw(st.sampled_from(model.seen)) if operation == "replace" and data.draw(st.booleans()) else None
    new = _contents(data, 0 if operation == "replace" else 1, 3)
    arguments: dict[str, object] = {"path": "f.txt", "start": start.anchor, "operation": operation}
    if through is not None:
        arguments["through"] = through.anchor
    if new or operation != "replace":
        arguments["new_string"] = "".join(c + "\n" for c in new)
    before = path.read_text()
    result = _run(ctx, edit_file, **arguments)
    first = model.position(start.identity)
    last = first if through is None else model.position(through.identity)
    expected: list[tuple[int, str]] | None = None
    if not model.stale_file and first is not None and last is not None and last >= first:
        made = model.new_lines(new)
        if operation == "replace":
            expected = [*model.lines[:first], *made, *model.lines[last + 1 :]]
        elif operation == "insert_before":
            expected = [*model.lines[:first], *made, *model.lines[first:]]
        else:
            expected = [*model.lines[: first + 1], *made, *model.lines[first + 1 :]]
    stale = expected is not None and first != int(start.anchor.split(":")[0]) - 1
    event(f"anchored edit: {'refused' if not result.ok else 'moved' if stale else 'applied'}")
    if not result.ok:
        assert path.read_text() == before
        # An anchor from a whole read of the current version, with nothing changed since, always works.
        fresh = start.fresh_read and (through is None or through.fresh_read) and model.edits_since_read == 0
        changes = expected is not None and [c for _, c in expected] != [c for _, c in model.lines]
        assert not (fresh and changes), result.output
        if not model.stale_file:
            model.learn(result.output)
        return
    assert expected is not None, f"edited although the anchor names no line now: {arguments}\n{result.output}"
    assert path.read_text() == "".join(c + "\n" for _, c in expected), (arguments, result.output)
    model.lines = expected
    model.edits_since_read += 1
    model.learn(result.output)


def _text_step(data: st.DataObject, ctx: ToolContext, model: _Model, path: Path) -> None:
    if model.stale_file or not model.lines:
        return
    first = data.draw(st.integers(0, len(model.lines) - 1))
    last = data.draw(st.integers(first, min(first + 2, len(model.lines) - 1)))
    old = "".join(c + "\n" for _, c in model.lines[first : last + 1])
    text = model.text()
    at = text.find(old)
    unique = text.find(old, at + 1) < 0  # overlapping occurrences count too
    if not old.strip() or not unique or not (at == 0 or text[at - 1] == "\n"):
        return
    new = [f"t{model.next_id + i}" for i in range(data.draw(st.integers(0, 2)))]
    result = _run(ctx, edit_file, path="f.txt", old_string=old, new_string="".join(c + "\n" for c in new))
    assert result.ok, result.output
    model.lines = [*model.lines[:first], *model.new_lines(new), *model.lines[last + 1 :]]
    assert path.read_text() == model.text()
    model.edits_since_read += 1
    model.learn(result.output)


def _read_step(data: st.DataObject, ctx: ToolContext, model: _Model) -> None:
    total = len(model.lines)
    offset = data.draw(st.integers(1, total))
    limit = data.draw(st.integers(1, total))
    result = _run(ctx, read_file, path="f.txt", offset=offset, limit=limit)
    assert result.ok, result.output
    model.stale_file = False
    whole = offset == 1 and limit >= total
    model.learn(result.output, fresh_read=whole)
    if whole:
        model.edits_since_read = 0


def _outside_step(data: st.DataObject, model: _Model, path: Path) -> None:
    at = data.draw(st.integers(0, len(model.lines)))
    model.lines = [*model.lines[:at], *model.new_lines(_contents(data, 1, 2)), *model.lines[at:]]
    path.write_text(model.text())
    model.stale_file = True
    model.edits_since_read += 1


def _write_step(data: st.DataObject, ctx: ToolContext, model: _Model, path: Path) -> None:
    if model.stale_file:
        return
    keep = [c for _, c in model.lines]  # much of it unchanged: the old anchors must still not carry over
    contents = [*keep[: len(keep) // 2], *_contents(data, 1, 3), *keep[len(keep) // 2 :]]
    result = _run(ctx, write_file, path="f.txt", content="".join(c + "\n" for c in contents))
    assert result.ok, result.output
    model.lines = model.new_lines(contents)
    assert path.read_text() == model.text()
    model.edits_since_read += 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_an_anchored_edit_lands_where_the_anchor_pointed_or_is_refused(data: st.DataObject) -> None:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None  # tmpfs: fsync costs nothing
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        root = Path(tmp)
        ctx = ToolContext(working_dir=root, session=SessionServices(output_dir=root / ".out", ledger=ReadLedger()))
        path = root / "f.txt"
        model = _Model([])
        model.lines = model.new_lines([*_contents(data, 3, 12), "end"])
        path.write_text(model.text())
        _read_step(data, ctx, model)
        for _ in range(data.draw(st.integers(4, 14))):
            step = data.draw(st.sampled_from(["anchored", "anchored", "anchored", "text", "read", "outside", "write"]))
            if step == "anchored":
                _anchored_step(data, ctx, model, path)
            elif step == "text":
                _text_step(data, ctx, model, path)
            elif step == "read":
                _read_step(data, ctx, model)
            elif step == "outside":
                _outside_step(data, model, path)
            else:
                _write_step(data, ctx, model, path)
            if not model.lines:
                break
