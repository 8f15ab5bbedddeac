"""The glob tool on real trees, and its .gitignore-style patterns."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from weald.tools import SessionServices, ToolContext, ToolError, ToolResult, invoke
from weald.tools.glob import PathPattern, glob

BASE_TIME = 1_700_000_000


def touch(path: Path, age: int, text: str = "") -> None:
    """Create ``path`` with a modification time ``age`` seconds before BASE_TIME."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (BASE_TIME - age, BASE_TIME - age))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    touch(root / ".gitignore", 100, "build/\n*.log\n")
    touch(root / "setup.py", 50)
    touch(root / "src" / "main.py", 10)
    touch(root / "src" / "util.py", 30)
    touch(root / "src" / "web" / "app.ts", 20)
    touch(root / "src" / "web" / "view.tsx", 5)
    touch(root / "build" / "gen.py", 1)
    touch(root / "trace.log", 1)
    touch(root / ".github" / "ci.yml", 40)
    touch(root / ".git" / "HEAD", 1)
    return root


@pytest.fixture
def ctx(tree: Path, tmp_path: Path) -> ToolContext:
    return ToolContext(working_dir=tree, session=SessionServices(output_dir=tmp_path / "out"))


async def find(ctx: ToolContext, **arguments: Any) -> ToolResult:
    return await invoke(glob, ctx, arguments)


def test_glob_is_declared_as_a_read_tool_allowed_by_default() -> None:
    assert glob.permission == "allow"
    assert glob.kind == "read"
    assert glob.timeout == 10
    assert glob.is_async


@pytest.mark.trio
async def test_files_are_listed_newest_first_without_ignored_files(ctx: ToolContext) -> None:
    result = await find(ctx, pattern="*.py")
    assert result.ok
    assert result.output.splitlines() == [
        "3 files match '*.py' in the working directory, newest first:",
        "src/main.py",
        "src/util.py",
        "setup.py",
    ]
    assert result.data == {"files": ["src/main.py", "src/util.py", "setup.py"], "total": 3}


@pytest.mark.trio
async def test_everything_lists_hidden_files_but_not_git_or_ignored_ones(ctx: ToolContext) -> None:
    result = await find(ctx, pattern="**")
    assert result.data["files"] == [
        "src/web/view.tsx",
        "src/main.py",
        "src/web/app.ts",
        "src/util.py",
        ".github/ci.yml",
        "setup.py",
        ".gitignore",
    ]


@pytest.mark.trio
async def test_a_pattern_naming_ignored_files_does_not_bring_them_back(ctx: ToolContext) -> None:
    result = await find(ctx, pattern="*.log")
    assert result.ok
    assert result.data["total"] == 0
    assert "No files match '*.log'" in result.output
    assert (await find(ctx, pattern="build/*.py")).data["total"] == 0


@pytest.mark.trio
async def test_patterns_with_a_slash_match_paths_from_the_searched_directory(ctx: ToolContext) -> None:
    assert (await find(ctx, pattern="src/*.py")).data["files"] == ["src/main.py", "src/util.py"]
    assert (await find(ctx, pattern="/*.py")).data["files"] == ["setup.py"]
    assert (await find(ctx, pattern="src/**/*.ts")).data["files"] == ["src/web/app.ts"]
    assert (await find(ctx, pattern="**/web/*")).data["files"] == ["src/web/view.tsx", "src/web/app.ts"]
    assert (await find(ctx, pattern="*.{ts,tsx}")).data["files"] == ["src/web/view.tsx", "src/web/app.ts"]
    assert (await find(ctx, pattern="web/*.ts", path="src")).data["files"] == ["src/web/app.ts"]


@pytest.mark.trio
async def test_at_most_a_hundred_files_are_listed_with_a_count_of_the_rest(ctx: ToolContext, tree: Path) -> None:
    for i in range(150):
        touch(tree / "data" / f"row{i:03}.csv", 1000 + i)
    result = await find(ctx, pattern="*.csv")
    lines = result.output.splitlines()
    assert lines[0] == "150 files match '*.csv' in the working directory, newest first; showing the newest 100:"
    assert lines[1] == "data/row000.csv"
    assert lines[100] == "data/row099.csv"
    assert lines[101] == "[50 more not shown. Narrow the pattern or the path to see them.]"
    assert result.data["total"] == 150


@pytest.mark.trio
async def test_bad_paths_and_patterns_get_clear_errors(ctx: ToolContext) -> None:
    outside = await find(ctx, pattern="*", path="../")
    assert not outside.ok
    assert "outside the sandbox" in outside.output
    a_file = await find(ctx, pattern="*", path="setup.py")
    assert not a_file.ok
    assert "is a file, not a directory" in a_file.output
    malformed = await find(ctx, pattern="src/[ab")
    assert not malformed.ok
    assert "malformed" in malformed.output


@pytest.mark.trio
@pytest.mark.parametrize("pattern", ["/etc/*", "/etc/**/passwd"])
async def test_an_absolute_pattern_outside_the_sandbox_is_refused_not_reported_empty(
    ctx: ToolContext, tree: Path, pattern: str
) -> None:
    result = await find(ctx, pattern=pattern)
    assert not result.ok
    assert result.output == (
        "/etc is outside the sandbox (/etc). File tools may only touch files under the working directory "
        f"{tree}. Use a path inside it, relative to the working directory."
    )


@pytest.mark.trio
async def test_a_pattern_whose_dotdot_leaves_the_sandbox_is_refused(ctx: ToolContext, tree: Path) -> None:
    up = await find(ctx, pattern="../*")
    assert not up.ok
    assert up.output == (
        f".. is outside the sandbox: its '..' components lead to {tree.parent}. File tools may only touch files "
        f"under the working directory {tree}. Use a path inside it, relative to the working directory."
    )
    # Through an absolute path, or from a subdirectory, all the same.
    for pattern, path in ((f"{tree}/../outside/*", "."), ("../../*.py", "src")):
        result = await find(ctx, pattern=pattern, path=path)
        assert not result.ok
        assert "is outside the sandbox: its '..' components lead to" in result.output


@pytest.mark.trio
async def test_a_dotdot_after_a_wildcard_is_refused_with_advice(ctx: ToolContext) -> None:
    result = await find(ctx, pattern="src/*/../*.py")
    assert not result.ok
    assert result.output == (
        "the pattern 'src/*/../*.py' has '..' after a wildcard, which no listed path contains. "
        "Put the directories first (e.g. '../lib/*.py'), or give the directory as path."
    )


@pytest.mark.trio
async def test_an_absolute_or_dotdot_pattern_inside_the_sandbox_is_matched_from_its_directory(
    ctx: ToolContext, tree: Path, tmp_path: Path
) -> None:
    assert (await find(ctx, pattern=f"{tree}/*.py")).data["files"] == ["setup.py"]
    assert (await find(ctx, pattern=f"{tree}/src/**/*.ts")).data["files"] == ["src/web/app.ts"]
    assert (await find(ctx, pattern="../*.py", path="src")).data["files"] == ["setup.py"]
    assert (await find(ctx, pattern="src/../src/*.py")).data["files"] == ["src/main.py", "src/util.py"]
    # The '.gitignore' anchor keeps its meaning: 'src' is not a directory at the file system's root.
    assert (await find(ctx, pattern="/src/*.py")).data["files"] == ["src/main.py", "src/util.py"]
    # An allowed directory outside the working directory is listed by its absolute paths.
    extra = tmp_path / "extra"
    touch(extra / "notes.txt", 1)
    allowed = ToolContext(working_dir=tree, allowed_dirs=(extra,), session=SessionServices(output_dir=tmp_path / "o"))
    result = await find(allowed, pattern=f"{extra}/*.txt")
    assert result.output.splitlines() == [
        f"1 file matches '{extra}/*.txt' in {extra}, newest first:",
        f"{extra}/notes.txt",
    ]


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "deep/dir/a.py", True),
        ("*.py", "a.pyc", False),
        ("src/*.py", "src/a.py", True),
        ("src/*.py", "src/sub/a.py", False),
        ("src/*.py", "lib/src/a.py", False),
        ("/a.py", "a.py", True),
        ("/a.py", "x/a.py", False),
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/x/y/a.py", True),
        ("**/test_*.py", "tests/test_a.py", True),
        ("src/", "src/any/thing", True),
        ("?.txt", "a.txt", True),
        ("?.txt", "ab.txt", False),
        ("[ab].txt", "b.txt", True),
        ("[!ab].txt", "b.txt", False),
        ("*.{py,pyi}", "x/y.pyi", True),
        ("{src,lib}/*.py", "lib/a.py", True),
        ("{src,lib}/*.py", "doc/a.py", False),
        ("a\\*b", "a*b", True),
        ("a\\*b", "axb", False),
        ("file.txt", "dir/file.txt", True),
    ],
)
def test_path_patterns_follow_gitignore_conventions(pattern: str, path: str, expected: bool) -> None:
    assert PathPattern.compile(pattern).matches(path) is expected


@pytest.mark.parametrize(
    ("pattern", "name_glob", "by_name"),
    [
        ("*.py", "*.py", True),
        ("src/*.py", "*.py", False),
        ("**", None, False),
        ("src/**", None, False),
        ("{a,b/c}.py", None, False),
    ],
)
def test_a_name_filter_for_ripgrep_is_derived_when_it_is_safe(
    pattern: str, name_glob: str | None, by_name: bool
) -> None:
    compiled = PathPattern.compile(pattern)
    assert compiled.name_glob == name_glob
    assert compiled.by_name_only is by_name


@pytest.mark.parametrize("pattern", ["{a,b", "a}", "[ab", "  "])
def test_malformed_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ToolError):
        PathPattern.compile(pattern)
