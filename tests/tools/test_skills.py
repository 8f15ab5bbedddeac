"""Skill discovery, the front matter parser and the use_skill tool (tools/skills.py), on real folders."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import trio
from weald.tools import SessionServices, ToolContext, ToolResult, invoke
from weald.tools.skills import (
    Skill,
    SkillFormatError,
    default_skill_dirs,
    describe_skills,
    parse_front_matter,
    scan_skills,
    skill_catalog,
    use_skill,
)


def write_skill(root: Path, folder: str, front: str, body: str = "Do the thing.\n") -> Path:
    path = root / ".weald" / "skills" / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\n{front}\n---\n{body}", encoding="utf-8")
    return path


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    path = tmp_path / "proj"
    path.mkdir()
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def ctx(proj: Path, home: Path, tmp_path: Path) -> ToolContext:
    runtime = types.SimpleNamespace(skill_dirs=default_skill_dirs(proj, home))
    return ToolContext(working_dir=proj, session=SessionServices(output_dir=tmp_path / "out", runtime=runtime))


def load(ctx: ToolContext, **arguments: Any) -> ToolResult:
    return trio.run(invoke, use_skill, ctx, arguments)


def test_use_skill_is_a_runtime_tool_allowed_by_default() -> None:
    assert use_skill.permission == "allow"
    assert use_skill.kind == "runtime"


def test_skills_are_found_in_the_project_and_the_home_directory(proj: Path, home: Path) -> None:
    write_skill(proj, "release", "name: release\ndescription: Cut a release.")
    write_skill(home, "pdf", "name: pdf-forms\ndescription: Fill PDF forms.")
    skills = skill_catalog(proj, home)
    assert [(s.name, s.description) for s in skills] == [
        ("pdf-forms", "Fill PDF forms."),
        ("release", "Cut a release."),
    ]
    assert all(isinstance(s, Skill) for s in skills)
    assert skills[0].origin == home / ".weald" / "skills"
    assert skills[1].directory == proj / ".weald" / "skills" / "release"


def test_the_project_skill_wins_a_name_clash(proj: Path, home: Path) -> None:
    write_skill(home, "lint", "name: lint\ndescription: The user's way.")
    write_skill(proj, "lint-here", "name: lint\ndescription: The project's way.")
    (skill,) = skill_catalog(proj, home)
    assert skill.description == "The project's way."
    assert skill.origin == proj / ".weald" / "skills"


def test_describe_skills_lists_names_and_descriptions_for_the_prompt(proj: Path, home: Path) -> None:
    assert describe_skills(proj, home) == ""
    write_skill(proj, "b", "name: beta\ndescription: >\n  Second skill,\n  folded.")
    write_skill(proj, "a", "name: alpha\ndescription: First skill.")
    text = describe_skills(proj, home)
    assert text.splitlines() == [
        "Skills available (call use_skill with a name to load its full instructions before doing a task it covers):",
        "- alpha: First skill.",
        "- beta: Second skill, folded.",
    ]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("Just a body, no front matter.\n", "no front matter"),
        ("---\nname: x\ndescription: never closed\n", "not closed by a '---' line"),
        ("---\ndescription: no name\n---\n", "has no 'name'"),
        ("---\nname: nodesc\n---\n", "has no 'description'"),
        ("---\nname: bad name!\ndescription: d\n---\n", "is not 1-64 letters"),
        ('---\nname: x\ndescription: "unterminated\n---\n', "is not closed or has a bad escape"),
        ("---\nname x\ndescription: d\n---\n", "line 2: expected 'key: value'"),
        ("---\n  indented: first\n---\n", "follows no key"),
    ],
)
def test_a_malformed_skill_is_skipped_with_a_note(proj: Path, home: Path, content: str, reason: str) -> None:
    bad = proj / ".weald" / "skills" / "bad" / "SKILL.md"
    bad.parent.mkdir(parents=True)
    bad.write_text(content)
    write_skill(proj, "good", "name: good\ndescription: Works.")
    scan = scan_skills(default_skill_dirs(proj, home))
    assert [s.name for s in scan.skills] == ["good"]
    (note,) = scan.skipped
    assert note.startswith(f"{bad}: skipped, ")
    assert reason in note


def test_unreadable_and_duplicate_skills_are_skipped_too(proj: Path, home: Path) -> None:
    binary = proj / ".weald" / "skills" / "binary" / "SKILL.md"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"---\nname: bin\xff\n---\n")
    write_skill(proj, "one", "name: twin\ndescription: First.")
    write_skill(proj, "two", "name: twin\ndescription: Second.")
    (proj / ".weald" / "skills" / "not-a-skill").mkdir()
    (proj / ".weald" / "skills" / "stray.md").write_text("ignored")
    scan = scan_skills(default_skill_dirs(proj, home))
    assert [(s.name, s.description) for s in scan.skills] == [("twin", "First.")]
    assert len(scan.skipped) == 2
    assert "is not UTF-8 text" in scan.skipped[0]
    assert "the name 'twin' is taken by" in scan.skipped[1]


def test_the_front_matter_parser_reads_the_yaml_skills_use() -> None:
    text = "\n".join(
        [
            "\ufeff---",
            "# a comment",
            "name: 'it''s'",
            'description: "Quoted: with \\"escapes\\" and a # hash"',
            "summary: plain value # trailing comment",
            "long: first line",
            "  continued here",
            "literal: |",
            "  line one",
            "  line two",
            "",
            "metadata:",
            "  owner: me",
            "empty:",
            "url: http://example.com/a:b",
            "---",
            "# Body",
            "text",
        ]
    )
    fields, body = parse_front_matter(text)
    assert fields == {
        "name": "it's",
        "description": 'Quoted: with "escapes" and a # hash',
        "summary": "plain value",
        "long": "first line continued here",
        "literal": "line one\nline two",
        "metadata": "owner: me",
        "empty": "",
        "url": "http://example.com/a:b",
    }
    assert body == "# Body\ntext"
    with pytest.raises(SkillFormatError, match="no front matter"):
        parse_front_matter("")


def test_use_skill_returns_the_whole_skill_and_lists_its_other_files(ctx: ToolContext, proj: Path) -> None:
    skill_md = write_skill(proj, "release", "name: release\ndescription: Cut a release.", "# Release\n\nRun bump.py.\n")
    folder = skill_md.parent
    (folder / "scripts").mkdir()
    (folder / "scripts" / "bump.py").write_text("print('bump')")
    (folder / "reference.md").write_text("ref")
    (folder / ".hidden").write_text("no")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "x.pyc").write_bytes(b"")
    result = load(ctx, name="release")
    assert result.ok, result.output
    assert result.output.splitlines() == [
        f"Skill 'release' from {skill_md}:",
        "",
        "---",
        "name: release",
        "description: Cut a release.",
        "---",
        "# Release",
        "",
        "Run bump.py.",
        "",
        f"Other files in {folder}, relative to it (read them when the skill says to):",
        "- reference.md",
        "- scripts/bump.py",
    ]
    assert result.data["files"] == ["reference.md", "scripts/bump.py"]
    assert load(ctx, name="RELEASE").ok


def test_an_unknown_skill_lists_the_available_ones_and_the_skipped(ctx: ToolContext, proj: Path, home: Path) -> None:
    write_skill(proj, "release", "name: release\ndescription: Cut a release.")
    write_skill(home, "pdf", "name: pdf-forms\ndescription: Fill PDF forms.")
    write_skill(home, "broken", "description: no name")
    result = load(ctx, name="deploy")
    assert not result.ok
    lines = result.output.splitlines()
    assert (
        lines[0]
        == "no skill named 'deploy'. Available skills: pdf-forms, release. Call use_skill with one of these names."
    )
    assert lines[1].startswith("Skipped: ")
    assert "has no 'name'" in lines[1]


def test_with_no_skills_the_error_says_where_to_put_one(ctx: ToolContext, proj: Path) -> None:
    result = load(ctx, name="anything")
    assert not result.ok
    assert "no skills are installed" in result.output
    assert str(proj / ".weald" / "skills") in result.output


def test_without_a_runtime_the_default_directories_are_used(
    monkeypatch: pytest.MonkeyPatch, proj: Path, home: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(home))
    write_skill(home, "mine", "name: mine\ndescription: From home.")
    ctx = ToolContext(working_dir=proj, session=None)
    result = load(ctx, name="mine")
    assert result.ok, result.output
    assert "From home." in result.output
    assert [s.name for s in skill_catalog(proj)] == ["mine"]


def test_the_runtime_can_name_other_skill_directories(proj: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    write_skill(extra, "x", "name: extra-skill\ndescription: Configured.")
    runtime = types.SimpleNamespace(skill_dirs=(extra / ".weald" / "skills",))
    ctx = ToolContext(working_dir=proj, session=SessionServices(output_dir=tmp_path / "o", runtime=runtime))
    assert load(ctx, name="extra-skill").ok
    assert [s.name for s in skill_catalog(proj, dirs=[extra / ".weald" / "skills"])] == ["extra-skill"]


# -- symlinks: the file tools' rules -----------------------------------------------------------------


@pytest.fixture
def outside_skill(tmp_path: Path) -> Path:
    """A skill folder outside the project and the home, with a secret beside its SKILL.md."""
    folder = tmp_path / "outside" / "evil"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: evil\ndescription: Not yours.\n---\nOUTSIDE INSTRUCTIONS\n")
    (folder / "secret.txt").write_text("OUTSIDE SECRET\n")
    return folder


def test_a_skill_folder_linked_out_of_the_project_is_refused_everywhere(
    ctx: ToolContext, proj: Path, home: Path, outside_skill: Path
) -> None:
    write_skill(proj, "fine", "name: fine\ndescription: A real skill.")
    link = proj / ".weald" / "skills" / "evil"
    link.symlink_to(Path("..") / ".." / ".." / "outside" / "evil")
    assert link.resolve() == outside_skill  # the link really leads out
    scan = scan_skills(default_skill_dirs(proj, home), project=proj)
    assert [s.name for s in scan.skills] == ["fine"]
    (note,) = scan.skipped
    assert note.startswith(f"{link}: skipped, it is a symlink to {outside_skill}, outside {proj.resolve()}")
    # The system prompt's catalog, and the tool.
    assert "evil" not in describe_skills(proj, home)
    assert [s.name for s in skill_catalog(proj, home)] == ["fine"]
    result = load(ctx, name="evil")
    assert not result.ok
    assert "no skill named 'evil'" in result.output
    assert "OUTSIDE" not in result.output


def test_a_skill_file_linked_out_of_the_project_is_refused(
    ctx: ToolContext, proj: Path, home: Path, outside_skill: Path
) -> None:
    folder = proj / ".weald" / "skills" / "sneaky"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").symlink_to(outside_skill / "SKILL.md")
    scan = scan_skills(default_skill_dirs(proj, home), project=proj)
    assert scan.skills == ()
    (note,) = scan.skipped
    assert "leads outside the sandbox through a symlink" in note
    assert "OUTSIDE" not in load(ctx, name="evil").output


def test_a_project_skills_directory_that_leads_out_is_not_read(
    ctx: ToolContext, proj: Path, home: Path, outside_skill: Path
) -> None:
    (proj / ".weald").mkdir()
    (proj / ".weald" / "skills").symlink_to(outside_skill.parent)
    scan = scan_skills(default_skill_dirs(proj, home), project=proj)
    assert scan.skills == ()
    assert scan.skipped == (
        f"{proj / '.weald' / 'skills'}: skipped, it leads outside the project through a symlink "
        f"(to {outside_skill.parent}); skills are not followed out of the project",
    )
    assert "OUTSIDE" not in load(ctx, name="evil").output


def test_links_inside_the_project_are_followed(ctx: ToolContext, proj: Path) -> None:
    shared = proj / "docs" / "shared-skill"
    shared.mkdir(parents=True)
    (shared / "SKILL.md").write_text("---\nname: shared\ndescription: Kept in docs.\n---\nSHARED BODY\n")
    (shared / "notes.md").write_text("notes\n")
    skills = proj / ".weald" / "skills"
    skills.mkdir(parents=True)
    (skills / "shared").symlink_to(Path("..") / ".." / "docs" / "shared-skill")
    result = load(ctx, name="shared")
    assert result.ok, result.output
    assert "SHARED BODY" in result.output
    assert result.data["files"] == ["notes.md"]


def test_the_files_listed_with_a_skill_leave_out_links_that_lead_out(
    ctx: ToolContext, proj: Path, outside_skill: Path
) -> None:
    write_skill(proj, "tidy", "name: tidy\ndescription: Tidy up.")
    folder = proj / ".weald" / "skills" / "tidy"
    (folder / "script.sh").write_text("echo tidy\n")
    (folder / "inside.md").symlink_to(folder / "script.sh")
    (folder / "secret.txt").symlink_to(outside_skill / "secret.txt")
    (folder / "elsewhere").symlink_to(outside_skill)  # a directory link out: neither listed nor entered
    (folder / "refs").mkdir()
    (folder / "refs" / "guide.md").write_text("guide\n")
    result = load(ctx, name="tidy")
    assert result.ok, result.output
    assert result.data["files"] == ["inside.md", "script.sh", "refs/guide.md"]
    assert "OUTSIDE" not in result.output
    assert "elsewhere" not in result.output


def test_a_users_skill_linked_out_of_the_users_skills_directory_is_refused(
    ctx: ToolContext, proj: Path, home: Path, outside_skill: Path
) -> None:
    skills = home / ".weald" / "skills"
    skills.mkdir(parents=True)
    (skills / "evil").symlink_to(outside_skill)
    scan = scan_skills(default_skill_dirs(proj, home), project=proj)
    assert scan.skills == ()
    assert "is a symlink to" in scan.skipped[0]
    assert "OUTSIDE" not in load(ctx, name="evil").output


def test_a_users_skills_directory_may_itself_be_a_link_to_where_the_user_keeps_it(
    proj: Path, home: Path, tmp_path: Path
) -> None:
    dotfiles = tmp_path / "dotfiles" / "skills"
    (dotfiles / "mine").mkdir(parents=True)
    (dotfiles / "mine" / "SKILL.md").write_text("---\nname: mine\ndescription: The user's own.\n---\nbody\n")
    (home / ".weald").mkdir()
    (home / ".weald" / "skills").symlink_to(dotfiles)
    assert [s.name for s in skill_catalog(proj, home)] == ["mine"]
