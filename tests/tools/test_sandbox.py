from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from weald.tools import ToolContext, ToolError
from weald.tools import _sandbox as sandbox
from weald.tools._sandbox import display_path, open_read, resolve_in_sandbox, write_atomic


def current_umask() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask in /proc/self/status")


def no_temp_files(directory: Path) -> bool:
    return not any(p.name.endswith(".weald-tmp") for p in directory.iterdir())


# --- resolve_in_sandbox ------------------------------------------------------


def test_relative_paths_resolve_against_the_working_directory(ctx: ToolContext, project: Path) -> None:
    assert resolve_in_sandbox(ctx, "src/a.py") == project / "src" / "a.py"
    assert resolve_in_sandbox(ctx, ".") == project


def test_absolute_paths_inside_the_sandbox_are_fine(ctx: ToolContext, project: Path) -> None:
    assert resolve_in_sandbox(ctx, str(project / "a.py")) == project / "a.py"


def test_dotdot_that_stays_inside_is_fine(ctx: ToolContext, project: Path) -> None:
    assert resolve_in_sandbox(ctx, "src/../b.py") == project / "b.py"
    assert resolve_in_sandbox(ctx, f"../{project.name}/c.py") == project / "c.py"


def test_dotdot_out_of_the_sandbox_is_refused(ctx: ToolContext, outside: Path) -> None:
    with pytest.raises(ToolError) as exc:
        resolve_in_sandbox(ctx, "../outside/secret.txt")
    message = str(exc.value)
    assert "../outside/secret.txt is outside the sandbox: its '..' components lead to" in message
    assert "File tools may only touch files under the working directory" in message
    assert "Use a path inside it, relative to the working directory." in message


def test_absolute_paths_outside_are_refused(ctx: ToolContext, outside: Path) -> None:
    with pytest.raises(ToolError, match=r"secret\.txt is outside the sandbox \(.*secret\.txt\)\. File tools may only"):
        resolve_in_sandbox(ctx, str(outside / "secret.txt"))
    with pytest.raises(ToolError, match="outside the sandbox"):
        resolve_in_sandbox(ctx, "/etc/passwd")


def test_home_directory_paths_are_refused(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="outside the sandbox"):
        resolve_in_sandbox(ctx, "~/.ssh/id_rsa")


def test_a_symlinked_file_leading_outside_is_refused(ctx: ToolContext, project: Path, outside: Path) -> None:
    (project / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolError) as exc:
        resolve_in_sandbox(ctx, "link.txt")
    message = str(exc.value)
    assert "link.txt leads outside the sandbox through a symlink: it resolves to" in message
    assert "do not follow symlinks out of it" in message


def test_a_symlinked_parent_directory_leading_outside_is_refused(
    ctx: ToolContext,
    project: Path,
    outside: Path,
) -> None:
    (project / "sub").symlink_to(outside)
    with pytest.raises(ToolError, match="leads outside the sandbox through a symlink"):
        resolve_in_sandbox(ctx, "sub/secret.txt")
    with pytest.raises(ToolError, match="leads outside the sandbox through a symlink"):
        resolve_in_sandbox(ctx, "sub/new-file.txt")


def test_a_dangling_symlink_leading_outside_is_refused(ctx: ToolContext, project: Path, outside: Path) -> None:
    (project / "new.txt").symlink_to(outside / "not-yet.txt")
    with pytest.raises(ToolError, match=r"new\.txt leads outside the sandbox through a symlink"):
        resolve_in_sandbox(ctx, "new.txt")
    with pytest.raises(ToolError, match="leads outside the sandbox through a symlink"):
        write_atomic(ctx, "new.txt", b"x")
    assert not (outside / "not-yet.txt").exists()


def test_a_symlink_loop_is_neither_read_nor_written(ctx: ToolContext, project: Path) -> None:
    (project / "loop").symlink_to("loop")
    with pytest.raises(ToolError, match="It was not followed"):
        open_read(ctx, "loop")
    with pytest.raises(ToolError, match="It was not followed"):
        write_atomic(ctx, "loop", b"x")
    assert (project / "loop").is_symlink()


def test_a_symlink_pointing_inside_resolves_to_its_target(ctx: ToolContext, project: Path) -> None:
    (project / "real.txt").write_text("x")
    (project / "alias.txt").symlink_to("real.txt")
    assert resolve_in_sandbox(ctx, "alias.txt") == project / "real.txt"


def test_allowed_directories_are_part_of_the_sandbox(
    make_ctx: Callable[..., ToolContext],
    outside: Path,
) -> None:
    ctx = make_ctx(allowed_dirs=[outside])
    assert resolve_in_sandbox(ctx, str(outside / "secret.txt")) == outside / "secret.txt"


def test_an_empty_path_is_refused(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match=r"the path is empty\. Give a file path relative to the working directory"):
        resolve_in_sandbox(ctx, "  ")


def test_a_nul_character_is_refused(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="contains a NUL character"):
        resolve_in_sandbox(ctx, "a\x00b")


def test_a_missing_file_suggests_close_names_and_glob(ctx: ToolContext, project: Path) -> None:
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("")
    with pytest.raises(ToolError) as exc:
        resolve_in_sandbox(ctx, "src/mian.py", must_exist=True)
    assert str(exc.value) == (
        "src/mian.py does not exist. Did you mean 'src/main.py'? Use glob to find the file (e.g. pattern '**/mian.py')."
    )


def test_display_path_is_relative_inside_the_working_directory(
    ctx: ToolContext,
    project: Path,
    outside: Path,
) -> None:
    assert display_path(ctx, project / "a" / "b.py") == "a/b.py"
    assert display_path(ctx, project) == "."
    assert display_path(ctx, outside / "x") == str(outside / "x")


# --- open_read ---------------------------------------------------------------


def test_open_read_opens_a_regular_file(ctx: ToolContext, project: Path) -> None:
    (project / "a.txt").write_bytes(b"hello")
    f, real = open_read(ctx, "a.txt")
    with f:
        assert f.read() == b"hello"
    assert real == project / "a.txt"


def test_open_read_refuses_a_directory_and_points_to_glob(ctx: ToolContext, project: Path) -> None:
    (project / "src").mkdir()
    with pytest.raises(ToolError) as exc:
        open_read(ctx, "src")
    assert str(exc.value) == "src is a directory, not a file. Use glob to list it (e.g. pattern 'src/*')."


def test_open_read_refuses_a_fifo_without_hanging(ctx: ToolContext, project: Path) -> None:
    os.mkfifo(project / "pipe")
    with pytest.raises(ToolError, match="is not a regular file"):
        open_read(ctx, "pipe")


def test_open_read_refuses_a_hard_linked_file(ctx: ToolContext, project: Path, outside: Path) -> None:
    os.link(outside / "secret.txt", project / "innocent.txt")
    with pytest.raises(ToolError) as exc:
        open_read(ctx, "innocent.txt")
    message = str(exc.value)
    assert message.startswith("refusing to read innocent.txt: it has 2 hard links")
    assert "same file as one outside the sandbox" in message
    assert "allow_hardlinks = true" in message


def test_open_read_allows_hard_links_when_configured(
    make_ctx: Callable[..., ToolContext],
    project: Path,
    outside: Path,
    secret: bytes,
) -> None:
    os.link(outside / "secret.txt", project / "innocent.txt")
    ctx = make_ctx(options={"files": {"allow_hardlinks": True}})
    f, _ = open_read(ctx, "innocent.txt")
    with f:
        assert f.read() == secret


def swap_after_resolve(monkeypatch: pytest.MonkeyPatch, swap: Callable[[], None]) -> None:
    """Make the next resolve_in_sandbox call swap the filesystem right after its check."""
    real_resolve = sandbox.resolve_in_sandbox

    def resolve_then_swap(ctx: ToolContext, path: str, *, must_exist: bool = False) -> Path:
        result = real_resolve(ctx, path, must_exist=must_exist)
        monkeypatch.setattr(sandbox, "resolve_in_sandbox", real_resolve)
        swap()
        return result

    monkeypatch.setattr(sandbox, "resolve_in_sandbox", resolve_then_swap)


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_read(
    ctx: ToolContext,
    project: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = project / "a.txt"
    target.write_text("harmless")

    def swap() -> None:
        target.unlink()
        target.symlink_to(outside / "secret.txt")

    swap_after_resolve(monkeypatch, swap)
    with pytest.raises(ToolError) as exc:
        open_read(ctx, "a.txt")
    assert str(exc.value).startswith("a.txt changed while it was being opened: the file is now a symlink")
    assert "It was not followed." in str(exc.value)


def test_a_parent_directory_swapped_for_a_symlink_after_the_check_is_not_read(
    ctx: ToolContext,
    project: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (project / "sub").mkdir()
    (project / "sub" / "secret.txt").write_text("harmless")

    def swap() -> None:
        (project / "sub").rename(project / "old-sub")
        (project / "sub").symlink_to(outside)

    swap_after_resolve(monkeypatch, swap)
    with pytest.raises(ToolError, match="changed while it was being opened: the directory sub is now a symlink"):
        open_read(ctx, "sub/secret.txt")


def test_a_descriptor_that_lies_outside_is_refused(
    ctx: ToolContext,
    project: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stands in for a bind mount or a rename race the O_NOFOLLOW walk cannot see.
    (project / "a.txt").write_text("x")
    monkeypatch.setattr(sandbox, "_fd_target", lambda fd: str(outside / "secret.txt"))
    with pytest.raises(ToolError, match=r"a\.txt was opened but lies at .*secret\.txt, outside the sandbox"):
        open_read(ctx, "a.txt")


# --- write_atomic ------------------------------------------------------------


def test_write_atomic_creates_parent_directories(ctx: ToolContext, project: Path) -> None:
    outcome = write_atomic(ctx, "a/b/c.txt", b"data")
    assert (project / "a" / "b" / "c.txt").read_bytes() == b"data"
    assert outcome.created
    assert outcome.path == project / "a" / "b" / "c.txt"
    assert outcome.stat.st_size == 4


def test_new_files_get_0644_less_the_umask(ctx: ToolContext, project: Path) -> None:
    write_atomic(ctx, "new.txt", b"x")
    mode = stat.S_IMODE((project / "new.txt").stat().st_mode)
    assert mode == 0o644 & ~current_umask()


@pytest.mark.parametrize("mode", [0o600, 0o755, 0o640])
def test_an_existing_files_mode_is_kept(ctx: ToolContext, project: Path, mode: int) -> None:
    path = project / "f.sh"
    path.write_bytes(b"old")
    path.chmod(mode)
    outcome = write_atomic(ctx, "f.sh", b"new")
    assert not outcome.created
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_an_explicit_mode_wins(ctx: ToolContext, project: Path) -> None:
    write_atomic(ctx, "x", b"", mode=0o700)
    assert stat.S_IMODE((project / "x").stat().st_mode) == 0o700


def test_write_atomic_replaces_the_file_and_leaves_no_temporary_file(ctx: ToolContext, project: Path) -> None:
    path = project / "f.txt"
    path.write_bytes(b"old")
    before = path.stat().st_ino
    write_atomic(ctx, "f.txt", b"new")
    assert path.read_bytes() == b"new"
    assert path.stat().st_ino != before  # renamed into place, not rewritten in place
    assert no_temp_files(project)


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(
    ctx: ToolContext,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = project / "f.txt"
    path.write_bytes(b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomic(ctx, "f.txt", b"new")
    assert path.read_bytes() == b"old"
    assert no_temp_files(project)


def test_a_file_swapped_for_a_symlink_before_the_write_is_not_written_through(
    ctx: ToolContext,
    project: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
    secret: bytes,
) -> None:
    target = project / "a.txt"
    target.write_text("harmless")

    def swap() -> None:
        target.unlink()
        target.symlink_to(outside / "secret.txt")

    swap_after_resolve(monkeypatch, swap)
    with pytest.raises(ToolError, match=r"a\.txt changed while it was being opened: the file is now a symlink"):
        write_atomic(ctx, "a.txt", b"pwned")
    assert (outside / "secret.txt").read_bytes() == secret
    assert no_temp_files(project)


def test_a_parent_swapped_for_a_symlink_before_the_write_is_not_written_through(
    ctx: ToolContext,
    project: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
    secret: bytes,
) -> None:
    (project / "sub").mkdir()

    def swap() -> None:
        (project / "sub").rmdir()
        (project / "sub").symlink_to(outside)

    swap_after_resolve(monkeypatch, swap)
    with pytest.raises(ToolError, match="the directory sub is now a symlink"):
        write_atomic(ctx, "sub/secret.txt", b"pwned")
    assert (outside / "secret.txt").read_bytes() == secret
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_missing_parent_swapped_for_a_symlink_is_not_created_through(
    ctx: ToolContext,
    project: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    swap_after_resolve(monkeypatch, lambda: (project / "new").symlink_to(outside))
    with pytest.raises(ToolError, match="the directory new is now a symlink"):
        write_atomic(ctx, "new/file.txt", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_write_atomic_refuses_a_hard_linked_file(ctx: ToolContext, project: Path, outside: Path, secret: bytes) -> None:
    os.link(outside / "secret.txt", project / "innocent.txt")
    with pytest.raises(ToolError, match=r"refusing to write innocent\.txt: it has 2 hard links"):
        write_atomic(ctx, "innocent.txt", b"x")
    assert (outside / "secret.txt").read_bytes() == secret


def test_write_atomic_refuses_a_directory(ctx: ToolContext, project: Path) -> None:
    (project / "d").mkdir()
    with pytest.raises(ToolError, match=r"d is a directory, not a file\. Use glob to list it"):
        write_atomic(ctx, "d", b"x")
    with pytest.raises(ToolError, match=r"\. is a directory, not a file"):
        write_atomic(ctx, ".", b"x")


def test_write_atomic_refuses_a_path_through_a_file(ctx: ToolContext, project: Path) -> None:
    (project / "f").write_text("")
    with pytest.raises(ToolError) as exc:
        write_atomic(ctx, "f/g.txt", b"x")
    assert str(exc.value) == "f is a file, not a directory, so f/g.txt cannot be inside it. Choose another path."


def test_write_atomic_refuses_when_the_file_changed_since_expect(ctx: ToolContext, project: Path) -> None:
    path = project / "f.txt"
    path.write_bytes(b"one")
    expect = path.stat()
    path.write_bytes(b"three")
    with pytest.raises(ToolError) as exc:
        write_atomic(ctx, "f.txt", b"two", expect=expect)
    assert str(exc.value) == (
        "f.txt changed on disk while this call was working on it (it was modified); nothing was written. "
        "Read it again with read_file and redo the change."
    )
    assert path.read_bytes() == b"three"


def test_write_atomic_refuses_when_the_expected_file_is_gone(ctx: ToolContext, project: Path) -> None:
    path = project / "f.txt"
    path.write_bytes(b"one")
    expect = path.stat()
    path.unlink()
    with pytest.raises(ToolError, match=r"\(it was deleted or moved\); nothing was written"):
        write_atomic(ctx, "f.txt", b"two", expect=expect)
    assert not path.exists()


def test_an_exclusive_write_refuses_an_existing_file(ctx: ToolContext, project: Path) -> None:
    (project / "f.txt").write_bytes(b"theirs")
    with pytest.raises(ToolError, match=r"\(it was created by something else\)"):
        write_atomic(ctx, "f.txt", b"mine", exclusive=True)
    assert (project / "f.txt").read_bytes() == b"theirs"


def test_a_file_created_during_the_write_is_not_replaced(
    ctx: ToolContext,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_fsync = os.fsync

    def fsync_then_race(fd: int) -> None:
        real_fsync(fd)
        if not (project / "f.txt").exists():
            (project / "f.txt").write_bytes(b"theirs")

    monkeypatch.setattr(os, "fsync", fsync_then_race)
    with pytest.raises(ToolError, match=r"\(it was created by something else\)"):
        write_atomic(ctx, "f.txt", b"mine")
    assert (project / "f.txt").read_bytes() == b"theirs"
    assert no_temp_files(project)
