"""No agent rewrites the rules that judge it, and its sandbox hides what it promises: through a real daemon.

`rel_guard.run_guard` (shared with ``benchmarks/reliability.py``) runs every
attack as a model would, through a real ``weald serve`` with real
bubblewrap, real git and real files; each must be refused, and the user's
own ``git status`` and ``git commit`` afterwards must run nothing the agent
planted. The file tools' refusals are checked through the real tool runner.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from rel_guard import run_guard
from sec_runner import RunnerHarness
from weald.runtime import ActorSystem

pytestmark = pytest.mark.usefixtures("bubblewrap", "git")


def test_every_attack_on_the_rules_and_the_hidden_paths_is_refused_through_a_real_daemon(tmp_path: Path) -> None:
    # Under /tmp on purpose: a project there must keep its hidden paths hidden.
    assert str(tmp_path).startswith("/tmp/")
    report = run_guard(tmp_path / "guard")
    assert [f"{c.name}: {c.detail}" for c in report.failures] == []
    assert report.figures["attacks tried"] == report.figures["attacks refused"] >= 20
    assert {c.name for c in report.checks} >= {"git_runs_nothing_planted", "refused:plant weald.toml"}


PROTECTED_WRITES = [
    "weald.toml",
    ".weald/skills/x/SKILL.md",
    ".weald",
    "deeper/weald.toml",
    ".git/config",
    ".git/hooks/pre-commit",
    "sub/.git/config",
    ".githooks/pre-commit",
    "tools/mcp.json",
]


@pytest.mark.parametrize("path", PROTECTED_WRITES)
def test_file_tools_refuse_to_write_the_rules_even_when_every_write_is_allowed(
    system: ActorSystem, project: Path, path: str
) -> None:
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "config", "core.hooksPath", ".githooks"], check=True)
    (project / "tools").mkdir()
    (project / "tools" / "mcp.json").write_text("{}\n")
    before = sorted(str(p.relative_to(project)) for p in project.rglob("*"))
    config_text = (project / ".git" / "config").read_text()
    runner = _harness(system, project, protected=(str(project / "tools" / "mcp.json"),))
    written = runner.call("write_file", path=path, content="[tools.permissions]\nshell = 'allow'\n")
    assert not written.ok
    assert f"{path} is protected: it is " in written.text()
    assert "nothing was written" in written.text()
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*")) == before
    assert (project / ".git" / "config").read_text() == config_text


def test_edit_file_refuses_an_existing_weald_toml_and_it_stays_as_it_was(system: ActorSystem, project: Path) -> None:
    (project / "weald.toml").write_text('[tools.permissions]\nshell = "ask"\n')
    runner = _harness(system, project)
    assert runner.call("read_file", path="weald.toml").ok
    edited = runner.call("edit_file", path="weald.toml", old_string='"ask"', new_string='"allow"')
    assert not edited.ok
    assert "weald.toml is protected: it is the project's weald configuration" in edited.text()
    assert (project / "weald.toml").read_text() == '[tools.permissions]\nshell = "ask"\n'


def _harness(system: ActorSystem, project: Path, protected: tuple[str, ...] = ()) -> RunnerHarness:
    return RunnerHarness(system, project, protected=protected)
