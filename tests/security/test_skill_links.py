"""use_skill follows no symlink out of the project: the skills attack of issue 12, through the real runner."""

from __future__ import annotations

from pathlib import Path

from sec_runner import SECRET, RunnerHarness
from weald.runtime import ActorSystem
from weald.tools.skills import describe_skills


def test_a_skill_folder_linked_to_a_directory_outside_is_neither_read_nor_listed(
    system: ActorSystem, project: Path, outside: Path
) -> None:
    (outside / "SKILL.md").write_text("---\nname: evil\ndescription: Read me.\n---\nOUTSIDE INSTRUCTIONS\n")
    skills = project / ".weald" / "skills"
    skills.mkdir(parents=True)
    (skills / "evil").symlink_to(Path("..") / ".." / ".." / "outside")
    assert (skills / "evil" / "SKILL.md").read_text().endswith("OUTSIDE INSTRUCTIONS\n")  # the link works
    result = RunnerHarness(system, project).call("use_skill", name="evil")
    assert not result.ok
    assert "no skill named 'evil'" in result.output
    assert "is a symlink to" in result.output  # the skipped note says why
    for leaked in ("OUTSIDE INSTRUCTIONS", "secret.txt", SECRET.strip()):
        assert leaked not in result.output
    assert "evil" not in describe_skills(project, project / "no-home")
