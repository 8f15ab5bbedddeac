"""File tools cannot read, list, write or run outside the sandbox, through the real tool runner.

Every attack goes through a `ToolRunner` actor in an `ActorSystem` (the path a
model's call takes: argument validation, permission, a `ToolExecution`
child, the tool, the error translation), never through the sandbox helpers
alone. Each test checks the error the model reads and that nothing outside
changed: ``outside/`` holds the same files with the same bytes and times,
and its secret appears in no output.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import weald.tools._sandbox as sandbox
from sec_runner import SECRET, RunnerHarness
from weald.runtime import ActorSystem
from weald.tools import ToolContext

OUTSIDE_PATH = "OUTSIDE"  # replaced by the outside directory's absolute path


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory``: its bytes and modification time."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture
def layout(project: Path, outside: Path) -> Iterator[tuple[Path, Path]]:
    """Links from the project out: a file symlink, a directory symlink and (same file system) a hard link."""
    (project / "link.txt").symlink_to(outside / "secret.txt")
    (project / "dirlink").symlink_to(outside)
    os.link(outside / "secret.txt", project / "hard.txt")
    before = snapshot(outside)
    yield project, outside
    assert snapshot(outside) == before, "a file outside the sandbox was changed or created"


@pytest.fixture
def runner(system: ActorSystem, project: Path) -> RunnerHarness:
    return RunnerHarness(system, project)


def _args(arguments: dict[str, Any], outside: Path) -> dict[str, Any]:
    return {k: v.replace(OUTSIDE_PATH, str(outside)) if isinstance(v, str) else v for k, v in arguments.items()}


DOTDOT = "is outside the sandbox: its '..' components lead to"
ABSOLUTE = "is outside the sandbox ("
SYMLINK = "leads outside the sandbox through a symlink: it resolves to"
HARDLINK = "hard links, so it may be the same file as one outside the sandbox"

REFUSED = [
    ("read_file", {"path": "../outside/secret.txt"}, DOTDOT),
    ("read_file", {"path": f"{OUTSIDE_PATH}/secret.txt"}, ABSOLUTE),
    ("read_file", {"path": "link.txt"}, SYMLINK),
    ("read_file", {"path": "dirlink/secret.txt"}, SYMLINK),
    ("read_file", {"path": "hard.txt"}, HARDLINK),
    ("read_file", {"path": "sub/../../outside/secret.txt"}, DOTDOT),
    ("write_file", {"path": "../outside/new.txt", "content": "pwned\n"}, DOTDOT),
    ("write_file", {"path": f"{OUTSIDE_PATH}/secret.txt", "content": "pwned\n"}, ABSOLUTE),
    ("write_file", {"path": "link.txt", "content": "pwned\n"}, SYMLINK),
    ("write_file", {"path": "dirlink/new.txt", "content": "pwned\n"}, SYMLINK),
    ("write_file", {"path": "dirlink/secret.txt", "content": "pwned\n"}, SYMLINK),
    ("write_file", {"path": "hard.txt", "content": "pwned\n"}, HARDLINK),
    ("edit_file", {"path": "../outside/secret.txt", "old_string": "top", "new_string": "pwned"}, DOTDOT),
    ("edit_file", {"path": "link.txt", "old_string": "top", "new_string": "pwned"}, SYMLINK),
    ("edit_file", {"path": "dirlink/secret.txt", "old_string": "top", "new_string": "pwned"}, SYMLINK),
    ("edit_file", {"path": "hard.txt", "old_string": "top", "new_string": "pwned"}, HARDLINK),
    ("grep", {"pattern": "secret", "path": "../outside"}, DOTDOT),
    ("grep", {"pattern": "secret", "path": OUTSIDE_PATH}, ABSOLUTE),
    ("grep", {"pattern": "secret", "path": "dirlink"}, SYMLINK),
    ("grep", {"pattern": "secret", "path": "link.txt"}, SYMLINK),
    ("glob", {"pattern": "*", "path": "../outside"}, DOTDOT),
    ("glob", {"pattern": "*", "path": OUTSIDE_PATH}, ABSOLUTE),
    ("glob", {"pattern": "*", "path": "dirlink"}, SYMLINK),
    ("glob", {"pattern": "../outside/*"}, DOTDOT),
    ("glob", {"pattern": f"{OUTSIDE_PATH}/*"}, ABSOLUTE),
    ("shell", {"command": "cat secret.txt; echo pwned > pwned.txt", "cwd": "../outside"}, DOTDOT),
    ("shell", {"command": "cat secret.txt; echo pwned > pwned.txt", "cwd": OUTSIDE_PATH}, ABSOLUTE),
    ("shell", {"command": "cat secret.txt; echo pwned > pwned.txt", "cwd": "dirlink"}, SYMLINK),
]


@pytest.mark.parametrize(
    ("tool", "arguments", "error"),
    REFUSED,
    ids=[f"{t}-{'-'.join(str(v) for v in a.values())[:40]}" for t, a, _ in REFUSED],
)
def test_a_path_leading_outside_is_refused_with_a_clear_error_and_nothing_outside_changes(
    runner: RunnerHarness, layout: tuple[Path, Path], tool: str, arguments: dict[str, Any], error: str
) -> None:
    _, outside = layout
    result = runner.call(tool, **_args(arguments, outside))
    assert not result.ok
    assert error in result.text()
    assert SECRET.strip() not in result.text()


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("grep", {"pattern": "launch"}),
        ("grep", {"pattern": "launch", "path": "sub"}),
        ("glob", {"pattern": "**/*"}),
    ],
)
def test_searches_of_the_project_never_follow_its_links_out(
    runner: RunnerHarness, layout: tuple[Path, Path], tool: str, arguments: dict[str, Any]
) -> None:
    project, outside = layout
    os.unlink(project / "hard.txt")  # hard links have a test of their own (below)
    result = runner.call(tool, **_args(arguments, outside))
    assert result.ok, result.text()
    assert SECRET.strip() not in result.text()
    assert "secret.txt" not in result.text()


def test_grep_does_not_show_the_lines_of_a_hard_link_to_an_outside_file(
    runner: RunnerHarness, layout: tuple[Path, Path]
) -> None:
    result = runner.call("grep", pattern="launch")
    assert SECRET.strip() not in result.text()


# -- a symlink swapped in between the check and the use ----------------------------------------------------


def swap_after_check(monkeypatch: pytest.MonkeyPatch, swap: Callable[[], None]) -> None:
    """Make the next sandbox check swap the file system right after it passed (the race, won every time)."""
    real_resolve = sandbox.resolve_in_sandbox

    def resolve_then_swap(ctx: ToolContext, path: str, *, must_exist: bool = False) -> Path:
        result = real_resolve(ctx, path, must_exist=must_exist)
        monkeypatch.setattr(sandbox, "resolve_in_sandbox", real_resolve)
        swap()
        return result

    monkeypatch.setattr(sandbox, "resolve_in_sandbox", resolve_then_swap)


def swap_directory(project: Path, outside: Path) -> Callable[[], None]:
    def swap() -> None:
        (project / "sub").rename(project / "old-sub")
        (project / "sub").symlink_to(outside)

    return swap


def swap_file(project: Path, outside: Path) -> Callable[[], None]:
    def swap() -> None:
        (project / "sub" / "inner.txt").unlink()
        (project / "sub" / "inner.txt").symlink_to(outside / "secret.txt")

    return swap


CHANGED = "changed while it was being opened"

SWAPPED = [
    ("read_file", {"path": "sub/inner.txt"}, swap_file),
    ("read_file", {"path": "sub/inner.txt"}, swap_directory),
    ("write_file", {"path": "sub/inner.txt", "content": "pwned\n"}, swap_file),
    ("write_file", {"path": "sub/inner.txt", "content": "pwned\n"}, swap_directory),
    ("write_file", {"path": "sub/secret.txt", "content": "pwned\n"}, swap_directory),
    ("edit_file", {"path": "sub/inner.txt", "old_string": "inner", "new_string": "pwned"}, swap_file),
    ("edit_file", {"path": "sub/inner.txt", "old_string": "inner", "new_string": "pwned"}, swap_directory),
]


@pytest.mark.parametrize(
    ("tool", "arguments", "make_swap"),
    SWAPPED,
    ids=[f"{t}-{s.__name__}-{a['path']}" for t, a, s in SWAPPED],
)
def test_a_symlink_swapped_in_after_the_check_is_not_followed(
    runner: RunnerHarness,
    project: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
    tool: str,
    arguments: dict[str, Any],
    make_swap: Callable[[Path, Path], Callable[[], None]],
) -> None:
    if tool == "edit_file":
        assert runner.call("read_file", path="sub/inner.txt").ok  # edits need a fresh read
    before = snapshot(outside)
    swap_after_check(monkeypatch, make_swap(project, outside))
    result = runner.call(tool, **arguments)
    assert not result.ok
    assert CHANGED in result.text()
    assert "It was not followed" in result.text() or "nothing was written" in result.text()
    assert SECRET.strip() not in result.text()
    assert snapshot(outside) == before


_SWAP_ESCAPES = "the swap is not caught: {}"


@pytest.mark.parametrize("make_swap", [swap_directory, swap_file])
def test_grep_does_not_search_a_directory_or_file_swapped_for_a_symlink_after_the_check(
    runner: RunnerHarness,
    project: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
    make_swap: Callable[[Path, Path], Callable[[], None]],
) -> None:
    path = "sub" if make_swap is swap_directory else "sub/inner.txt"
    swap_after_check(monkeypatch, make_swap(project, outside))
    result = runner.call("grep", pattern="launch", path=path)
    assert SECRET.strip() not in result.text()


def test_glob_does_not_list_a_directory_swapped_for_a_symlink_after_the_check(
    runner: RunnerHarness, project: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, swap_directory(project, outside))
    result = runner.call("glob", pattern="*", path="sub")
    assert "secret.txt" not in result.text()


def test_shell_does_not_run_in_a_directory_swapped_for_a_symlink_after_the_check(
    runner: RunnerHarness, project: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, swap_directory(project, outside))
    runner.call("shell", command="pwd; echo pwned > pwned.txt", cwd="sub")
    assert not (outside / "pwned.txt").exists()
