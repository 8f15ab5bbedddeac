"""The read ledger: what a session knows of each file, and which version of it an anchor names.

A model that edits a file it has not read, or that changed since it read it
(the user saved it, a formatter ran, a shell command rewrote it), edits from
a picture that is wrong. edit_file and write_file therefore consult the
session's `ReadLedger` first and refuse with a message to read the file again.

A line anchor (``12:3f``) names a line as the model saw it in *some* version
of the file: the one it read, or one an edit result showed it. Models reuse
anchors from before their own last edit, and a two-hex-digit tag cannot tell
two lines apart one time in 256 (equal lines, such as blank lines, always
share one). So the ledger keeps, per file, a short history:

- each **version** of the file the session has known, from its reads and
  from the edits and writes weald itself made, with the exact **hunks** that
  turn one version into the next (a change made outside weald is a break:
  no line is carried across it);
- for each version, the **views**: the tagged lines that were shown to the
  model (read_file pages, the changed lines an edit reports, the lines an
  edit_file refusal shows). A later view of line ``N`` of the current version
  (a read, or a refusal) replaces the earlier views of line ``N``: from then
  on ``N`` means the line as shown last.

`FileHistory.resolve` finds every version whose view of line ``N`` carries
the anchor's tag and follows each through the hunks to today's file. The
anchor is applied only when all of them lead to one current line; if they
disagree, or the line was replaced by a later edit, or changed on disk, the
edit is refused. (One disagreement is no doubt: when an edit put back the
very text line ``N`` had, at the same number, line ``N`` now is the line the
model saw either way.) An anchor no view explains is accepted only if it matches
the current line and that line has kept its number (nothing above it was
inserted or deleted, and it was not itself replaced) since the session first
read the file.

Everything here is bounded: `MAX_VERSIONS` versions per file and
`MAX_VIEW_CHARS` characters of shown lines in a whole ledger; the oldest are
dropped first, and an anchor only they explained is then refused, not guessed.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import attrs
from weald.tools._contract import ToolContext, ToolError
from weald.tools._hashline import Hunk, line_hash

__all__ = [
    "MAX_VERSIONS",
    "MAX_VIEW_CHARS",
    "AnchorFate",
    "FileHistory",
    "FileState",
    "LedgerStatistics",
    "ReadLedger",
    "digest",
    "session_ledger",
]

# Versions kept per file; the oldest are dropped first.
MAX_VERSIONS = 32
# Characters of shown lines kept across a ledger; the oldest versions' views go first.
MAX_VIEW_CHARS = 8 * 1024 * 1024


def digest(data: bytes) -> bytes:
    """SHA-256 of ``data``: with the CPU's SHA extensions the fastest hashlib offers (about 1.5 GB/s)."""
    return hashlib.sha256(data).digest()


@attrs.frozen
class FileState:
    """A file's state when the session last read or wrote it.

    Attributes:
        mtime_ns: modification time in nanoseconds.
        size: size in bytes.
        digest: SHA-256 of the content.
    """

    mtime_ns: int
    size: int
    digest: bytes = attrs.field(repr=lambda d: d.hex())

    @classmethod
    def of(cls, data: bytes, st: os.stat_result, *, sha256: bytes | None = None) -> FileState:
        """The state of a file whose content is ``data`` (of digest ``sha256``, if known) and status ``st``."""
        return cls(mtime_ns=st.st_mtime_ns, size=st.st_size, digest=sha256 or digest(data))


# A view: the number of its first line and the lines shown from there.
View = tuple[int, tuple[str, ...]]


@attrs.frozen
class FileVersion:
    """One version of a file as the session knew it.

    Attributes:
        seq: when it was recorded, ledger-wide (older is smaller).
        digest: SHA-256 of its content.
        hunks: how the previous version became this one (weald's own edit);
            None when the change was made outside weald, or for the first version.
        views: the lines of this version shown to the model, by first line number;
            they do not overlap.
        view_chars: characters in ``views``.
    """

    seq: int
    digest: bytes = attrs.field(repr=lambda d: d.hex()[:12])
    hunks: tuple[Hunk, ...] | None
    views: tuple[View, ...] = ()
    view_chars: int = 0

    def shown(self, number: int) -> str | None:
        """Line ``number`` (1-based) as the model was shown it, or None if it was not."""
        for first, lines in self.views:
            if first <= number < first + len(lines):
                return lines[number - first]
        return None


_Outcome = Literal["gone", "outdated"]


@attrs.frozen
class AnchorFate:
    """What an anchor ``N:hh`` names in the current version of a file.

    Attributes:
        kind: ``"current"`` (it names line ``line`` as the model saw it, now);
            ``"moved"`` (it names a line the model saw before its own edits,
            which is now line ``line``); ``"gone"`` (that line was replaced or
            deleted by a later edit); ``"outdated"`` (it names a line from
            before the file changed outside weald); ``"ambiguous"`` (the model
            was shown line ``N`` with this tag in versions whose lines are now
            different, ``candidates``); ``"unconfirmed"`` (no view explains it,
            and line ``N`` has moved or changed since the file was first read);
            ``"mismatch"`` (line ``N`` does not carry that tag and no view
            explains it, or the line a view explains no longer holds the
            text that was shown).
        line: the current line (1-based) the anchor names, for ``current`` and ``moved``.
        origin: index into the history's versions of the newest version the
            anchor is explained by (0 when no view explains it).
        candidates: current lines it might mean, for ``ambiguous``.
        near: for ``gone`` and ``outdated``, the current line nearest to where
            the line was.
        lost: for ``ambiguous``, one of the lines it might mean is gone or outdated.
    """

    kind: Literal["current", "moved", "gone", "outdated", "ambiguous", "unconfirmed", "mismatch"]
    line: int | None = None
    origin: int = 0
    candidates: tuple[int, ...] = ()
    near: int | None = None
    lost: bool = False

    @property
    def accepted(self) -> bool:
        """The anchor names exactly one current line."""
        return self.line is not None


@attrs.frozen
class FileHistory:
    """A snapshot of one file's recorded versions, oldest first; the last is the file as it is now.

    Attributes:
        versions: the versions, oldest first.
        stable_lines: lines numbered above this kept their number through
            versions that were dropped (None: no version was dropped).
    """

    versions: tuple[FileVersion, ...]
    stable_lines: int | None = None

    def resolve(self, number: int, tag: str, lines: Sequence[str]) -> AnchorFate:
        """What the anchor ``number:tag`` names in ``lines``, the current version's lines.

        See the module docstring for the rule.
        """
        explained = [
            i
            for i, version in enumerate(self.versions)
            if (content := version.shown(number)) is not None and line_hash(content) == tag
        ]
        if explained:
            outcomes = {i: self._forward(i, number - 1) for i in explained}
            distinct = set(outcomes.values())
            live = sorted(o for o in distinct if isinstance(o, int))
            if live == [number - 1] and distinct <= {number - 1, "gone"}:
                # Lines an edit replaced by the same text at the same number: whichever the
                # model meant, line N now is the line it saw.
                seen = {self.versions[i].shown(number) for i in explained}
                if seen == {lines[number - 1]}:
                    distinct = {number - 1}
            if len(distinct) == 1 and live:
                current = live[0] + 1
                newest = explained[-1]
                if current > len(lines) or lines[current - 1] != self.versions[newest].shown(number):
                    # A line carried through weald's own edits keeps its text; if it has not,
                    # the file is not the version the ledger knows (changed within one clock tick).
                    return AnchorFate("mismatch", near=min(number, len(lines)))
                fresh = newest == len(self.versions) - 1 or current == number
                return AnchorFate("current" if fresh else "moved", line=current, origin=newest)
            if live:
                return AnchorFate(
                    "ambiguous",
                    origin=explained[-1],
                    candidates=tuple(x + 1 for x in live),
                    near=live[0] + 1,
                    lost=len(distinct) > len(live),
                )
            kind: _Outcome = "outdated" if "outdated" in distinct else "gone"
            return AnchorFate(kind, origin=explained[-1], near=self._near(explained[-1], number - 1, len(lines)))
        if number <= len(lines) and line_hash(lines[number - 1]) == tag:
            if self.stable(number):
                return AnchorFate("current", line=number)
            return AnchorFate("unconfirmed", near=number)
        return AnchorFate("mismatch", near=min(number, len(lines)))

    def stable(self, number: int) -> bool:
        """Line ``number`` of the current version has kept its number, unchanged, since the first version."""
        if self.stable_lines is not None and number > self.stable_lines:
            return False
        return self._back(0, number - 1) == number - 1

    def intact(self, origin: int, first: int, last: int, *, skip_first: bool, skip_last: bool) -> bool:
        """Current lines ``first``..``last`` were, unchanged and in order, consecutive lines of version ``origin``.

        ``skip_first`` / ``skip_last`` leave an end out (it was shown in a newer version than ``origin``).
        """
        lo = first + 1 if skip_first else first
        hi = last - 1 if skip_last else last
        previous: int | None = None
        for line in range(lo, hi + 1):
            back = self._back(origin, line - 1)
            if back is None or (previous is not None and back != previous + 1):
                return False
            previous = back
        return True

    def _forward(self, index: int, line: int) -> int | _Outcome:
        """Where 0-based ``line`` of version ``index`` is now: its 0-based line, or why it is not."""
        for version in self.versions[index + 1 :]:
            if version.hunks is None:
                return "outdated"
            shift = 0
            for a, b, c in version.hunks:
                if line < a:
                    break
                if line < b:
                    return "gone"
                shift += c - (b - a)
            line += shift
        return line

    def _back(self, index: int, line: int) -> int | None:
        """Which 0-based line of version ``index`` current 0-based ``line`` was, or None if it is newer."""
        for version in reversed(self.versions[index + 1 :]):
            if version.hunks is None:
                return None
            shift = 0
            for a, b, c in version.hunks:
                if line < a + shift:
                    break
                if line < a + shift + c:
                    return None
                shift += c - (b - a)
            line -= shift
        return line

    def _near(self, index: int, line: int, total: int) -> int:
        """The current line nearest to where 0-based ``line`` of version ``index`` was (1-based)."""
        for version in self.versions[index + 1 :]:
            if version.hunks is None:
                break
            shift = 0
            replaced_at: int | None = None
            for a, b, c in version.hunks:
                if line < a:
                    break
                if line < b:  # replaced: it was where the replacement starts
                    replaced_at = a + shift
                    break
                shift += c - (b - a)
            line = line + shift if replaced_at is None else replaced_at
        return max(1, min(line + 1, total))


@attrs.frozen
class LedgerStatistics:
    """A snapshot of a `ReadLedger`.

    Attributes:
        files: how many files are recorded.
        versions: how many versions are kept, over all files.
        view_chars: characters of shown lines kept.
    """

    files: int
    versions: int = 0
    view_chars: int = 0


@attrs.define
class _Entry:
    """One file's record (mutated under the ledger's lock)."""

    state: FileState
    versions: list[FileVersion]
    stable_lines: int | None = None


def _chars(lines: Sequence[str]) -> int:
    return sum(map(len, lines))


def _remove_range(version: FileVersion, lo: int, hi: int) -> FileVersion:
    """``version`` without views of lines ``lo``..``hi`` (1-based, inclusive)."""
    out: list[View] = []
    removed = 0
    for first, lines in version.views:
        last = first + len(lines) - 1
        if last < lo or first > hi:
            out.append((first, lines))
            continue
        keep_head = lines[: max(lo - first, 0)]
        keep_tail = lines[hi + 1 - first :] if last > hi else ()
        removed += _chars(lines[len(keep_head) : len(lines) - len(keep_tail)])
        if keep_head:
            out.append((first, keep_head))
        if keep_tail:
            out.append((hi + 1, keep_tail))
    if not removed and len(out) == len(version.views):
        return version
    return attrs.evolve(version, views=tuple(out), view_chars=version.view_chars - removed)


def _add_view(version: FileVersion, first: int, lines: Sequence[str]) -> FileVersion:
    """``version`` with lines ``first``.. shown as ``lines``, replacing what they overlap."""
    trimmed = _remove_range(version, first, first + len(lines) - 1)
    views = tuple(sorted((*trimmed.views, (first, tuple(lines))), key=lambda v: v[0]))
    return attrs.evolve(trimmed, views=views, view_chars=trimmed.view_chars + _chars(lines))


class ReadLedger:
    """Per session: each file's state when last read or written, and its recent versions; thread-safe.

    Keys are resolved paths (`weald.tools._sandbox.resolve_in_sandbox`), so
    two spellings of one file share an entry.

    Args:
        max_versions: versions kept per file.
        max_view_chars: characters of shown lines kept across all files.
    """

    def __init__(self, *, max_versions: int = MAX_VERSIONS, max_view_chars: int = MAX_VIEW_CHARS) -> None:
        if max_versions < 1 or max_view_chars < 0:
            raise ValueError("a ledger keeps at least one version per file and a non-negative view budget")
        self._lock = threading.Lock()
        self._entries: dict[Path, _Entry] = {}
        self._seq = itertools.count()
        self._max_versions = max_versions
        self._max_view_chars = max_view_chars
        self._view_chars = 0

    def __repr__(self) -> str:
        return f"<ReadLedger files={len(self)}>"

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, path: object) -> bool:
        with self._lock:
            return path in self._entries

    # -- recording -------------------------------------------------------------------

    def record(self, path: Path, data: bytes, st: os.stat_result) -> FileState:
        """Note that the session now knows ``path`` as ``data``, with no lines shown."""
        return self.record_read(path, data, st)

    def record_read(
        self,
        path: Path,
        data: bytes,
        st: os.stat_result,
        *,
        first: int = 1,
        shown: Sequence[str] = (),
        sha256: bytes | None = None,
    ) -> FileState:
        """Record a read of ``path`` whose content is ``data``, showing lines ``first``.. as ``shown``.

        If the content differs from the version last recorded, the file changed
        outside weald: a new version starts, and no line is carried over to it.
        The lines shown replace earlier views of the same line numbers.
        """
        state = FileState.of(data, st, sha256=sha256)
        with self._lock:
            entry = self._entries.get(path)
            if entry is None:
                entry = _Entry(state=state, versions=[FileVersion(next(self._seq), state.digest, None)])
                self._entries[path] = entry
            elif entry.versions[-1].digest != state.digest:
                self._append(entry, FileVersion(next(self._seq), state.digest, None))
            entry.state = state
            if shown:
                self._show(entry, first, shown, supersede=True)
            self._enforce_budget()
        return state

    def record_change(
        self,
        path: Path,
        data: bytes,
        st: os.stat_result,
        *,
        base: bytes | None,
        hunks: Sequence[Hunk] | None,
        views: Sequence[tuple[int, Sequence[str]]] = (),
        sha256: bytes | None = None,
    ) -> FileState:
        """Record that weald changed ``path`` to ``data`` by ``hunks``, from the version of digest ``base``.

        If the version last recorded is not ``base`` (or ``hunks`` is None), the
        new version is not linked to it: no line is carried over. ``views`` are
        the lines of the new version shown in the result; they do not replace
        earlier views.
        """
        state = FileState.of(data, st, sha256=sha256)
        with self._lock:
            entry = self._entries.get(path)
            linked = hunks is not None and entry is not None and entry.versions[-1].digest == base
            version = FileVersion(next(self._seq), state.digest, tuple(hunks) if linked and hunks is not None else None)
            if entry is None:
                entry = _Entry(state=state, versions=[version])
                self._entries[path] = entry
            else:
                self._append(entry, version)
                entry.state = state
            for first, lines in views:
                if lines:
                    self._show(entry, first, lines, supersede=False)
            self._enforce_budget()
        return state

    def record_shown(self, path: Path, sha256: bytes, first: int, shown: Sequence[str]) -> None:
        """Record that lines ``first``.. of the version of digest ``sha256`` were shown (as a refusal does).

        Like a read, they replace earlier views of the same line numbers.
        Nothing is recorded if that version is not the one last recorded.
        """
        if not shown:
            return
        with self._lock:
            entry = self._entries.get(path)
            if entry is None or entry.versions[-1].digest != sha256:
                return
            self._show(entry, first, shown, supersede=True)
            self._enforce_budget()

    def _append(self, entry: _Entry, version: FileVersion) -> None:
        entry.versions.append(version)
        while len(entry.versions) > self._max_versions:
            self._drop_oldest(entry)

    def _drop_oldest(self, entry: _Entry) -> None:
        """Forget ``entry``'s oldest version, keeping what `FileHistory.stable` needs to stay conservative."""
        dropped = entry.versions.pop(0)
        self._view_chars -= dropped.view_chars
        successor = entry.versions[0]
        # Lines at or past the first one `successor.hunks` touched may have moved.
        first_touched = 0 if successor.hunks is None else (successor.hunks[0][0] if successor.hunks else None)
        if first_touched is not None:
            entry.stable_lines = first_touched if entry.stable_lines is None else min(entry.stable_lines, first_touched)
        entry.versions[0] = attrs.evolve(successor, hunks=())

    def _show(self, entry: _Entry, first: int, lines: Sequence[str], *, supersede: bool) -> None:
        last = first + len(lines) - 1
        if supersede:
            for i, version in enumerate(entry.versions[:-1]):
                if version.views:
                    trimmed = _remove_range(version, first, last)
                    self._view_chars += trimmed.view_chars - version.view_chars
                    entry.versions[i] = trimmed
        head = entry.versions[-1]
        updated = _add_view(head, first, lines)
        self._view_chars += updated.view_chars - head.view_chars
        entry.versions[-1] = updated

    def _enforce_budget(self) -> None:
        """Drop the views of the oldest versions, ledger-wide, until the view budget holds."""
        while self._view_chars > self._max_view_chars:
            oldest: tuple[int, _Entry, int] | None = None
            for entry in self._entries.values():
                for i, version in enumerate(entry.versions):
                    if version.views and (oldest is None or version.seq < oldest[0]):
                        oldest = (version.seq, entry, i)
            if oldest is None:
                self._view_chars = 0
                return
            _, entry, i = oldest
            version = entry.versions[i]
            self._view_chars -= version.view_chars
            entry.versions[i] = attrs.evolve(version, views=(), view_chars=0)

    # -- reading -----------------------------------------------------------------------

    def get(self, path: Path) -> FileState | None:
        """The recorded state of ``path``, or None if the session has not read it."""
        with self._lock:
            entry = self._entries.get(path)
            return None if entry is None else entry.state

    def history(self, path: Path, sha256: bytes) -> FileHistory | None:
        """``path``'s versions, if the last one recorded has digest ``sha256`` (the file as it is now)."""
        with self._lock:
            entry = self._entries.get(path)
            if entry is None or entry.versions[-1].digest != sha256:
                return None
            return FileHistory(versions=tuple(entry.versions), stable_lines=entry.stable_lines)

    def forget(self, path: Path) -> bool:
        """Drop ``path``'s entry; returns whether there was one."""
        with self._lock:
            entry = self._entries.pop(path, None)
            if entry is None:
                return False
            self._view_chars -= sum(v.view_chars for v in entry.versions)
            return True

    def check_fresh(
        self,
        path: Path,
        *,
        data: bytes | None = None,
        st: os.stat_result | None = None,
        name: str | None = None,
        sha256: bytes | None = None,
        where: str = "on disk",
    ) -> FileState:
        """Confirm the session read ``path`` and it has not changed since.

        The size and mtime decide when they match. When they do not and the
        current ``data`` is given, an unchanged content hash still counts as
        fresh (a ``touch`` changes nothing the model saw); the entry is updated.
        (A rewrite to the same size within one clock tick passes; an anchor
        into it is still checked against the lines the model was shown.)

        Args:
            path: the resolved path.
            data: the file's current content, if the caller has it.
            st: the file's current status; stat'ed here if None.
            name: the path as the model knows it, for messages.
            sha256: the digest of ``data``, if the caller computed it.
            where: where the file changed, for the message (``"in the editor"``
                when it is an editor's buffer).

        Returns:
            The recorded state.

        Raises:
            ToolError: the session never read the file, or it changed since.
        """
        shown = name or str(path)
        state = self.get(path)
        if state is None:
            raise ToolError(
                f"{shown} has not been read in this session, so the change was refused: edits must start "
                "from the file's current content. Read it first with read_file, then make the change.",
            )
        if st is None:
            try:
                st = os.stat(path)
            except FileNotFoundError as exc:
                raise ToolError(
                    f"{shown} no longer exists: it was deleted or moved after you read it. "
                    "Use glob to find it, or create it with write_file.",
                ) from exc
        if (st.st_mtime_ns, st.st_size) == (state.mtime_ns, state.size):
            return state
        if data is not None and st.st_size == state.size and (sha256 or digest(data)) == state.digest:
            with self._lock:
                entry = self._entries.get(path)
                if entry is not None:
                    entry.state = state = attrs.evolve(state, mtime_ns=st.st_mtime_ns)
            return state
        detail = (
            f"it is now {st.st_size} bytes, was {state.size}"
            if st.st_size != state.size
            else "same size, modified since"
        )
        raise ToolError(
            f"{shown} has changed {where} since you last read it ({detail}); something else modified it. "
            "Read it again with read_file and redo the change against its current content.",
        )

    def statistics(self) -> LedgerStatistics:
        """How many files, versions and shown characters are kept."""
        with self._lock:
            return LedgerStatistics(
                files=len(self._entries),
                versions=sum(len(e.versions) for e in self._entries.values()),
                view_chars=self._view_chars,
            )


def session_ledger(ctx: ToolContext) -> ReadLedger | None:
    """The session's ledger, or None outside a runner (then ledger checks are skipped)."""
    session = ctx.session
    if session is None:
        return None
    ledger = getattr(session, "ledger", None)
    return ledger if isinstance(ledger, ReadLedger) else None
