"""A protected path that is a symbolic link: its link cannot be swapped for the agent's own file.

bubblewrap binds a protected path read-only where its link leads, but the
link itself is an entry of a writable directory: a sandboxed command can
``rm`` it and put its own file there (an ``.mcp.json`` naming a server that
runs on the host, a ``weald.toml``, a ``.git/hooks`` directory with a
``pre-commit``). weald remembers each such link when a command starts; the
daemon refuses a configuration file whose link was replaced while a command
runs, and once the command ends the link is put back, the replacement moved
aside and the model told. Every test drives a real ``weald serve``, real
bubblewrap and, for hooks, the user's real ``git`` on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, recent_events, serving
from weald.runtime.testing import wait_until

pytestmark = pytest.mark.usefixtures("bubblewrap", "git")

USER_RULES = '[tools.permissions]\nshell = "allow"\n[tools.shell]\nsandbox = "required"\n'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with serving(tmp_path_factory.mktemp("links"), extra_config=USER_RULES) as proc:
        yield proc


def call(daemon: DaemonProcess, method: str, params: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    with daemon.client() as client:
        return client.call(method, params or {}, timeout=timeout)


def evil_servers(marker: Path) -> str:
    return json.dumps({"mcpServers": {"x": {"command": "sh", "args": ["-c", f"touch {marker}"]}}})


def linked_project(root: Path, name: str) -> Path:
    """A project whose weald.toml and imported .mcp.json are links into conf/, and a git repository's hooks too."""
    project = root / name
    (project / "conf").mkdir(parents=True)
    (project / "notes.txt").write_text("alpha\n")
    (project / "conf" / "mcp.json").write_text('{"mcpServers": {}}\n')
    (project / "conf" / "weald.toml").write_text(f'[mcp]\nimport = ["{project / ".mcp.json"}"]\n')
    (project / "weald.toml").symlink_to("conf/weald.toml")
    (project / ".mcp.json").symlink_to("conf/mcp.json")
    host_git(project, "init", "-q")
    (project / "githooks").mkdir()
    hooks = project / ".git" / "hooks"
    subprocess.run(["rm", "-rf", str(hooks)], check=True)
    hooks.symlink_to("../githooks")
    return project


def host_git(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u"}
    env["GIT_COMMITTER_EMAIL"] = "u@x"
    return subprocess.run(
        ["git", "-C", str(project), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def run_command(daemon: DaemonProcess, project: Path, name: str, command: str, *, stop: bool = False) -> str:
    """An agent working in ``project`` runs ``command`` with its sandboxed shell; returns what the model saw."""
    model = daemon.script(
        name,
        [{"tool_calls": [{"name": "shell", "arguments": {"command": command, "timeout": 60}}]}, {"text": "done"}],
    )
    # The agent stays: a reload reads again only the projects of sessions that run.
    agent_id = call(daemon, "agent.start", {"working_dir": str(project), "agent_id": name, "model": model})["agent_id"]
    call(daemon, "agent.prompt", {"agent_id": agent_id, "text": "go"})
    messages = call(daemon, "agent.history", {"agent_id": agent_id})["messages"]
    if stop:
        call(daemon, "agent.stop", {"agent_id": agent_id})
    return str([m["content"] for m in messages if m["role"] == "tool"][-1])


def link_of(path: Path) -> tuple[str, int] | None:
    return (os.readlink(path), path.lstat().st_ino) if path.is_symlink() else None


def project_status(report: dict[str, Any], project: Path) -> dict[str, Any]:
    return next(p for p in report["projects"] if p["project"] == str(project))


def test_an_imported_mcp_json_link_the_agent_replaced_is_put_back_and_its_server_never_runs(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = linked_project(tmp_path, "mcp")
    marker = tmp_path / "PLANTED-RAN"
    before = os.readlink(project / ".mcp.json")
    output = run_command(
        daemon,
        project,
        "mcp-swap",
        f"rm .mcp.json && echo '{evil_servers(marker)}' > .mcp.json && echo swapped",
        stop=True,
    )
    assert "swapped" in output  # the sandbox let the command through: the hole this closes
    assert link_of(project / ".mcp.json") is not None, "the link was not put back"
    assert os.readlink(project / ".mcp.json") == before
    assert (project / "conf" / "mcp.json").read_text() == '{"mcpServers": {}}\n'
    aside = [p for p in project.iterdir() if p.name.startswith(".mcp.json.weald-replaced-")]
    assert [p.read_text() for p in aside] == [evil_servers(marker) + "\n"]
    assert f".mcp.json was replaced from inside the sandbox; weald put the link back (to {before})" in output
    assert aside[0].name in output
    # The next session there reads the project's files afresh: the agent's server is not among them.
    run_command(daemon, project, "mcp-after", "true")
    report = call(daemon, "config.reload")
    assert project_status(report, project)["status"] != "refused", report
    assert not marker.exists()
    restored = [
        e for e in recent_events(daemon, "tool.link_restored") if e["data"]["path"] == str(project / ".mcp.json")
    ]
    assert [(e["data"]["target"], e["data"]["moved_to"]) for e in restored] == [(before, str(aside[0]))]


def test_a_replacement_the_daemon_sees_while_the_command_runs_is_refused_as_a_whole(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = linked_project(tmp_path, "live")
    marker = tmp_path / "PLANTED-RAN"
    ready, go = project / "ready", project / "go"
    planted = f'[mcp.servers.x]\ncommand = "sh"\nargs = ["-c", "touch {marker}"]\n'
    command = (
        f"rm weald.toml && cat > weald.toml <<'EOF'\n{planted}EOF\ntouch ready && "
        "while [ ! -e go ]; do sleep 0.05; done; echo finished"
    )
    outputs: list[str] = []
    runner = threading.Thread(target=lambda: outputs.append(run_command(daemon, project, "live-swap", command)))
    runner.start()
    try:
        wait_until(ready.exists, timeout=120, message="the command to replace weald.toml")
        report = call(daemon, "config.reload")
        status = project_status(report, project)
        assert status["status"] == "refused", report
        problems = " ".join(status["problems"])
        assert f"{project / 'weald.toml'}: {project / 'weald.toml'} was replaced from inside the sandbox" in problems
        assert "(it was a link to conf/weald.toml)" in problems
        # A session started there meanwhile runs under the project's last good configuration, not the planted one.
        call(daemon, "agent.start", {"working_dir": str(project), "agent_id": "live-new"})
        call(daemon, "agent.prompt", {"agent_id": "live-new", "text": "hello"})
        assert not marker.exists()
    finally:
        go.touch()
        runner.join(180)
    assert "finished" in outputs[0]
    assert os.readlink(project / "weald.toml") == "conf/weald.toml"
    assert "weald.toml was replaced from inside the sandbox" in outputs[0]
    # Put back, the link is read as before: the refusal is gone.
    report = call(daemon, "config.reload")
    assert project_status(report, project)["status"] != "refused", report
    assert not marker.exists()


def test_a_weald_toml_link_the_agent_replaced_is_put_back_before_anything_reads_it(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = linked_project(tmp_path, "toml")
    marker = tmp_path / "PLANTED-RAN"
    planted = f'[mcp.servers.x]\ncommand = "sh"\nargs = ["-c", "touch {marker}"]\n'
    output = run_command(daemon, project, "toml-swap", f"rm weald.toml && cat > weald.toml <<'EOF'\n{planted}EOF")
    assert link_of(project / "weald.toml") is not None
    assert os.readlink(project / "weald.toml") == "conf/weald.toml"
    assert "weald.toml was replaced from inside the sandbox" in output
    report = call(daemon, "config.reload")
    assert project_status(report, project)["status"] != "refused", report
    # A session started there now runs under the project's own file, not the planted one.
    run_command(daemon, project, "toml-after", "true")
    assert not marker.exists()


def test_a_git_hooks_link_the_agent_replaced_is_put_back_and_the_users_commit_runs_nothing_planted(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = linked_project(tmp_path, "hooks")
    marker = tmp_path / "PLANTED-RAN"
    hook = f"#!/bin/sh\ntouch {marker}\n"
    output = run_command(
        daemon,
        project,
        "hooks-swap",
        f"rm .git/hooks && mkdir .git/hooks && printf '{hook}' > .git/hooks/pre-commit && "
        "chmod +x .git/hooks/pre-commit && echo planted",
    )
    assert "planted" in output
    assert os.readlink(project / ".git" / "hooks") == "../githooks"
    assert list((project / "githooks").iterdir()) == []
    assert ".git/hooks was replaced from inside the sandbox" in output
    # The user's own git on the host.
    host_git(project, "add", "notes.txt")
    commit = host_git(project, "commit", "-qm", "user commit")
    assert commit.returncode == 0, commit.stderr
    assert not marker.exists(), "the hook the agent planted ran on the host"


def test_a_project_whose_protected_files_are_links_works_as_usual(daemon: DaemonProcess, tmp_path: Path) -> None:
    project = linked_project(tmp_path, "benign")
    links = {name: link_of(project / name) for name in ("weald.toml", ".mcp.json", ".git/hooks")}
    output = run_command(daemon, project, "benign", "echo changed > notes.txt && cat weald.toml && ls .git/hooks")
    assert "import" in output
    assert "replaced" not in output
    assert (project / "notes.txt").read_text() == "changed\n"
    assert {name: link_of(project / name) for name in links} == links
    assert not list(project.rglob("*weald-replaced*"))
    # The user points a link elsewhere between commands: the next command takes it as it is.
    (project / "conf" / "other.json").write_text('{"mcpServers": {}}\n')
    (project / ".mcp.json").unlink()
    (project / ".mcp.json").symlink_to("conf/other.json")
    output = run_command(daemon, project, "benign-2", "cat .mcp.json")
    assert "replaced" not in output
    assert os.readlink(project / ".mcp.json") == "conf/other.json"
    report = call(daemon, "config.reload")
    assert project_status(report, project)["status"] != "refused", report


def test_a_link_the_agent_only_removed_is_put_back_and_the_model_is_told(daemon: DaemonProcess, tmp_path: Path) -> None:
    project = linked_project(tmp_path, "removed")
    output = run_command(daemon, project, "remove", "rm weald.toml .mcp.json && echo removed")
    assert "removed" in output
    assert os.readlink(project / "weald.toml") == "conf/weald.toml"
    assert os.readlink(project / ".mcp.json") == "conf/mcp.json"
    assert output.count("was replaced from inside the sandbox; weald put the link back") == 2
    assert "and it was gone" in output
    assert not [p for p in project.iterdir() if "weald-replaced" in p.name]


def test_a_link_a_background_job_replaced_is_put_back_when_the_job_ends(daemon: DaemonProcess, tmp_path: Path) -> None:
    project = linked_project(tmp_path, "job")
    marker = tmp_path / "PLANTED-RAN"
    command = f"rm .mcp.json && echo '{evil_servers(marker)}' > .mcp.json && echo swapped"
    model = daemon.script(
        "job-swap",
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": command, "background": True}}]},
            {"tool_calls": [{"name": "shell", "arguments": {"action": "wait", "job_id": "job-1", "timeout": 60}}]},
            {"text": "done"},
        ],
    )
    call(daemon, "agent.start", {"working_dir": str(project), "agent_id": "job-swap", "model": model})
    call(daemon, "agent.prompt", {"agent_id": "job-swap", "text": "go"})
    wait_until((project / ".mcp.json").is_symlink, timeout=60, message="the link to be put back")
    assert os.readlink(project / ".mcp.json") == "conf/mcp.json"
    wait_until(
        lambda: any(
            e["data"]["path"] == str(project / ".mcp.json") for e in recent_events(daemon, "tool.link_restored")
        ),
        timeout=60,
        message="tool.link_restored for the job",
    )


def test_a_link_whose_directory_was_swapped_for_a_link_outside_is_not_put_back_there_and_stays_refused(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = tmp_path / "swapdir"
    (project / "real").mkdir(parents=True)
    (project / "conf").mkdir()
    (project / "real" / "mcp.json").write_text('{"mcpServers": {}}\n')
    (project / "conf" / "mcp.json").symlink_to("../real/mcp.json")
    (project / "weald.toml").write_text(f'[mcp]\nimport = ["{project / "conf" / "mcp.json"}"]\n')
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "PLANTED-RAN"
    (outside / "mcp.json").write_text(evil_servers(marker))  # what the agent wants read: it cannot write outside
    output = run_command(daemon, project, "swapdir", f"mv conf conf.old && ln -s {outside} conf && echo swapped")
    assert "swapped" in output
    # weald did not follow the agent's link: nothing was made or moved outside the project.
    assert sorted(p.name for p in outside.iterdir()) == ["mcp.json"]
    assert f"{project / 'conf' / 'mcp.json'} was replaced from inside the sandbox and could not be put back" in output
    # Until the user puts it right, the daemon reads nothing through it.
    report = call(daemon, "config.reload")
    status = project_status(report, project)
    assert status["status"] == "refused", report
    assert "was replaced from inside the sandbox" in " ".join(status["problems"])
    (project / "conf").unlink()
    (project / "conf.old").rename(project / "conf")
    report = call(daemon, "config.reload")
    assert project_status(report, project)["status"] != "refused", report
    assert not marker.exists()


def test_skills_behind_a_weald_link_a_running_command_replaced_are_not_offered(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    project = linked_project(tmp_path, "skills")
    good = project / "conf" / "weald" / "skills" / "good"
    good.mkdir(parents=True)
    (good / "SKILL.md").write_text("---\nname: good\ndescription: the project's own\n---\nbe good\n")
    (project / ".weald").symlink_to("conf/weald")
    ready, go = project / "ready", project / "go"
    evil = "---\\nname: evil\\ndescription: planted\\n---\\nPLANTED-SKILL-TEXT\\n"
    command = (
        f"rm .weald && mkdir -p .weald/skills/evil && printf -- '{evil}' > .weald/skills/evil/SKILL.md && touch ready && "
        "while [ ! -e go ]; do sleep 0.05; done; echo finished"
    )
    outputs: list[str] = []
    runner = threading.Thread(target=lambda: outputs.append(run_command(daemon, project, "skills-swap", command)))
    runner.start()
    try:
        wait_until(ready.exists, timeout=120, message="the command to replace .weald")
        model = daemon.script(
            "skills-reader",
            [{"tool_calls": [{"name": "use_skill", "arguments": {"name": "evil"}}]}, {"text": "done"}],
        )
        start = {"working_dir": str(project), "agent_id": "skills-reader", "model": model}
        call(daemon, "agent.start", start)
        call(daemon, "agent.prompt", {"agent_id": "skills-reader", "text": "go"})
        messages = call(daemon, "agent.history", {"agent_id": "skills-reader"})["messages"]
        seen = str([m["content"] for m in messages if m["role"] == "tool"][-1])
        assert "PLANTED-SKILL-TEXT" not in seen
        assert "no skill named 'evil'" in seen
        assert f"{project / '.weald'} was replaced from inside the sandbox" in seen
    finally:
        go.touch()
        runner.join(180)
    assert "finished" in outputs[0]
    assert os.readlink(project / ".weald") == "conf/weald"
