"""The shell tool in its OS sandbox: real bubblewrap, real namespaces, real mounts.

Every test runs commands through `invoke` with the sandbox on (the default,
``auto``, where bubblewrap works; the ``bubblewrap`` fixture installs it when
it is missing). A command's own pids are its namespace's, so processes are
found on the host by a unique argument (``sleep 900.<tag>``), which survives
``env -i``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from weald.runtime import is_placeholder, scan_proc
from weald.runtime.daemon.config import find_project_files
from weald.runtime.testing import await_until, process_alive
from weald.tools import SessionServices, ToolConfig, ToolContext, ToolError, ToolResult, invoke, sandbox_status
from weald.tools._jobs import JobTable, nursery_spawner
from weald.tools.debug_state import describe_sandbox
from weald.tools.shell import network_allowed, shell

pytestmark = pytest.mark.usefixtures("bubblewrap")

FAST_KILL: dict[str, Any] = {"kill_grace": 0.5}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def make_ctx(work: Path, tmp_path: Path) -> Callable[..., ToolContext]:
    def make(
        *,
        shell_options: Mapping[str, Any] | None = None,
        private: tuple[str, ...] = (),
        protected: tuple[str, ...] = (),
        **fields: Any,
    ) -> ToolContext:
        fields.setdefault("working_dir", work)
        fields.setdefault("session", SessionServices(output_dir=tmp_path / "out"))
        options = {"shell": {**FAST_KILL, **(shell_options or {})}}
        fields["config"] = ToolConfig(options=options, private_paths=private, protected_paths=protected)
        return ToolContext(**fields)

    return make


async def run(ctx: ToolContext, **arguments: Any) -> ToolResult:
    return await invoke(shell, ctx, arguments)


def read(path: Path) -> str:
    return path.read_text()


def tag() -> str:
    """A unique sleep duration: ``sleep <tag>`` is findable on the host, whatever the process's environment."""
    return f"9{secrets.randbelow(10**6):06d}.{secrets.randbelow(10**6):06d}"


def host_processes(sleep: str) -> list[int]:
    """Live host processes running exactly ``sleep <tag>`` (not the shells whose command line names it)."""
    argv = f"sleep\0{sleep.removeprefix('sleep ')}\0".encode()
    found = scan_proc("cmdline", lambda cmdline: cmdline == argv) or []
    return [pid for pid in found if process_alive(pid)]


@pytest.fixture
def visible(tmp_path: Path) -> Iterator[Path]:
    """A directory outside /tmp (which the sandbox replaces whole): what is in it is visible unless hidden."""
    path = Path(tempfile.mkdtemp(prefix="weald-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def fake_home(visible: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home directory full of credentials, as $HOME (the sandbox hides what it finds there)."""
    home = visible / "home"
    files = {
        ".ssh/id_ed25519": "ssh-private-key-material",
        ".aws/credentials": "aws_secret_access_key = AKIAsecret",
        ".config/gcloud/application_default_credentials.json": '{"private_key": "gcloud-secret"}',
        ".netrc": "machine example.com password netrc-secret",
        ".docker/config.json": '{"auths": {"x": {"auth": "docker-secret"}}}',
        ".weald/weald.toml": "# weald-config-secret",
        ".git-credentials": "https://user:gitcred-secret@example.com",
    }
    for name, text in files.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    monkeypatch.setenv("HOME", str(home))
    return home


# -- the filesystem -------------------------------------------------------------------------


@pytest.mark.trio
async def test_the_project_is_writable_and_the_rest_of_the_filesystem_is_read_only(
    make_ctx: Callable[..., ToolContext], work: Path, visible: Path
) -> None:
    result = await run(make_ctx(), command=f"echo made > made.txt && echo pwned > {visible}/pwned.txt")
    assert (work / "made.txt").read_text() == "made\n"
    assert not (visible / "pwned.txt").exists()
    assert not result.ok
    assert "Read-only file system" in result.output
    assert result.data["sandbox"] == "bwrap"
    assert any("[tools.shell] writable" in hint for hint in result.hints)


@pytest.mark.trio
async def test_the_hosts_tmp_is_out_of_reach(make_ctx: Callable[..., ToolContext], tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("tmp-secret")
    result = await run(make_ctx(), command=f"cat {outside}/secret.txt; echo pwned > {outside}/pwned.txt")
    assert "tmp-secret" not in result.output
    assert not (outside / "pwned.txt").exists()


@pytest.mark.trio
async def test_paths_configured_writable_can_be_written_relative_ones_in_the_project(
    make_ctx: Callable[..., ToolContext], work: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (work / "build").mkdir()
    ctx = make_ctx(shell_options={"writable": [str(cache)]})
    result = await run(ctx, command=f"echo cached > {cache}/c.txt && touch build/ok")
    assert result.ok, result.output
    assert (cache / "c.txt").read_text() == "cached\n"


@pytest.mark.trio
async def test_tmp_is_private_to_the_session_and_shared_by_its_calls(
    make_ctx: Callable[..., ToolContext], tmp_path: Path
) -> None:
    host_file = Path("/tmp") / f"weald-host-{secrets.token_hex(6)}"
    host_file.write_text("host")
    try:
        ctx = make_ctx()
        first = await run(ctx, command=f"test -e {host_file} && echo visible || echo hidden; echo kept > /tmp/note")
        assert first.output.strip() == "hidden"
        second = await run(ctx, command="cat /tmp/note")
        assert second.output.strip() == "kept"
        assert read(tmp_path / "out" / "tmp" / "note") == "kept\n"  # the session's /tmp, on the host
    finally:
        host_file.unlink()


@pytest.mark.trio
async def test_home_secrets_and_the_daemons_private_paths_are_not_visible(
    make_ctx: Callable[..., ToolContext], fake_home: Path, visible: Path
) -> None:
    state = visible / "state"
    state.mkdir()
    (state / "store.db").write_text("store-secret")
    ctx = make_ctx(private=(str(state),))
    command = (
        "cat ~/.ssh/id_ed25519 ~/.aws/credentials ~/.config/gcloud/*.json ~/.netrc ~/.docker/config.json "
        f"~/.weald/weald.toml ~/.git-credentials {state}/store.db"
    )
    result = await run(ctx, command=command)
    for secret in ("ssh-private", "AKIAsecret", "gcloud-secret", "netrc-secret", "docker-secret"):
        assert secret not in result.output
    for secret in ("weald-config-secret", "gitcred-secret", "store-secret"):
        assert secret not in result.output
    # The directories are there, and empty.
    listing = await run(ctx, command=f"ls -A ~/.ssh ~/.aws ~/.weald {state}")
    assert listing.ok, listing.output
    for name in ("id_ed25519", "credentials", "weald.toml", "store.db"):
        assert name not in listing.output


@pytest.mark.trio
async def test_a_hidden_path_configured_readable_is_shown_read_only(
    make_ctx: Callable[..., ToolContext], fake_home: Path
) -> None:
    ctx = make_ctx(shell_options={"readable": ["~/.aws"]})
    result = await run(ctx, command="cat ~/.aws/credentials; echo x >> ~/.aws/credentials")
    assert "AKIAsecret" in result.output
    assert "Read-only file system" in result.output
    assert (fake_home / ".aws/credentials").read_text() == "aws_secret_access_key = AKIAsecret"


@pytest.mark.trio
async def test_the_projects_own_weald_config_cannot_be_rewritten_from_inside(
    make_ctx: Callable[..., ToolContext], work: Path
) -> None:
    (work / "weald.toml").write_text('[tools.permissions]\nshell = "ask"\n')
    (work / ".weald" / "skills").mkdir(parents=True)
    command = "echo 'shell = \"allow\"' >> weald.toml; touch .weald/skills/evil; echo more > notes.txt; cat notes.txt"
    result = await run(make_ctx(), command=command)
    assert (work / "weald.toml").read_text() == '[tools.permissions]\nshell = "ask"\n'
    assert not (work / ".weald" / "skills" / "evil").exists()
    assert (work / "notes.txt").read_text() == "more\n"
    assert result.output.count("Read-only file system") == 2


# -- processes ------------------------------------------------------------------------------


@pytest.mark.trio
async def test_the_command_sees_only_its_own_processes(
    make_ctx: Callable[..., ToolContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Secret-looking, so not passed to commands: only the daemon's own environment holds it.
    monkeypatch.setenv("WEALD_TEST_CANARY_TOKEN", "canary-" + secrets.token_hex(8))
    here = os.getpid()
    command = (
        f"ls /proc | grep -c '^[0-9]'; test -e /proc/{here} && echo sees-the-daemon; "
        "tr '\\0' '\\n' < /proc/$PPID/environ; for f in /proc/[0-9]*/environ; do cat $f; done | tr '\\0' '\\n'"
    )
    result = await run(make_ctx(), command=command)
    assert result.ok, result.output
    # bwrap's init, bash, ls, grep (and the loop's processes, later): a handful, not the machine's.
    assert int(result.output.split()[0]) < 10
    assert "sees-the-daemon" not in result.output
    assert "canary-" not in result.output
    assert "WEALD_TEST_CANARY_TOKEN" not in result.output


@pytest.mark.trio
async def test_processes_that_leave_the_session_and_clear_their_environment_end_with_the_command(
    make_ctx: Callable[..., ToolContext],
) -> None:
    sleep = tag()
    result = await run(make_ctx(), command=f"setsid env -i bash -c 'sleep {sleep}' & sleep 0.2; echo started")
    assert result.ok, result.output
    assert host_processes(f"sleep {sleep}") == []


@pytest.mark.trio
async def test_a_timeout_ends_every_process_of_the_command(make_ctx: Callable[..., ToolContext]) -> None:
    sleep = tag()
    command = f"trap '' TERM; setsid env -i bash -c 'trap \"\" TERM; sleep {sleep}' & sleep 1000"
    result = await run(make_ctx(), command=command, timeout=1)
    assert result.data["timed_out"]
    assert host_processes(f"sleep {sleep}") == []


@pytest.mark.trio
async def test_an_aborted_call_ends_every_process_and_the_command_gets_its_sigterm_first(
    make_ctx: Callable[..., ToolContext], work: Path
) -> None:
    sleep = tag()
    # A loop, not `wait`: bash runs its trap at the next command, whichever signal lands first.
    command = (
        "trap 'echo got-term > term.txt; exit 0' TERM; "
        f"setsid env -i bash -c 'sleep {sleep}' & while :; do sleep 0.05; done"
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run(make_ctx(), command=command))
        await await_until(lambda: host_processes(f"sleep {sleep}"), timeout=10, message="the sleeper to start")
        nursery.cancel_scope.cancel()
    assert host_processes(f"sleep {sleep}") == []
    assert (work / "term.txt").read_text() == "got-term\n"


@pytest.mark.trio
async def test_a_command_killed_by_a_signal_says_which(make_ctx: Callable[..., ToolContext]) -> None:
    result = await run(make_ctx(), command="kill -SEGV $$")
    assert not result.ok
    assert "SIGSEGV" in result.output


@pytest.mark.trio
async def test_a_background_job_and_what_it_started_end_when_it_is_killed(
    nursery: trio.Nursery, make_ctx: Callable[..., ToolContext], tmp_path: Path
) -> None:
    jobs = JobTable(nursery_spawner(nursery), output_dir=tmp_path / "out", kill_grace=0.5)
    ctx = make_ctx(session=SessionServices(output_dir=tmp_path / "out", jobs=jobs))
    sleep = tag()
    # The job ignores SIGTERM: bwrap is killed, and the kill returns only once its namespace is empty.
    command = f"trap '' TERM; setsid env -i bash -c 'sleep {sleep}' & sleep 1000"
    started = await run(ctx, command=command, background=True)
    assert started.data["sandbox"] == "bwrap"
    await await_until(lambda: host_processes(f"sleep {sleep}"), timeout=10, message="the job's sleeper")
    await run(ctx, action="kill", job_id=started.data["job_id"])
    assert host_processes(f"sleep {sleep}") == []
    await jobs.aclose()


# -- the network ----------------------------------------------------------------------------


PROBE = """\
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        print(s.recv(16).decode().strip())
except OSError as exc:
    print("no network:", exc)
    sys.exit(1)
"""


@pytest.mark.trio
async def test_the_network_is_off_by_default_on_when_configured_and_per_pattern(
    make_ctx: Callable[..., ToolContext], work: Path, loopback_listener: int
) -> None:
    (work / "probe.py").write_text(PROBE)
    command = f"python3 probe.py 127.0.0.1 {loopback_listener}"
    off = await run(make_ctx(), command=command)
    assert not off.ok
    assert "no network" in off.output
    on = await run(make_ctx(shell_options={"network": True}), command=command)
    assert on.output.strip() == "hello"
    patterned = make_ctx(shell_options={"network": ["python3 probe.py *"]})
    assert (await run(patterned, command=command)).output.strip() == "hello"
    # The pattern lends the network to that one command only, never to what a ';' adds to it.
    assert "no network" in (await run(patterned, command=f"{command}; true")).output


@pytest.mark.trio
async def test_a_command_that_finds_no_network_is_told_how_to_get_it(
    make_ctx: Callable[..., ToolContext], work: Path
) -> None:
    (work / "probe.py").write_text(PROBE)
    result = await run(make_ctx(), command="python3 probe.py 10.255.255.1 80")
    assert not result.ok
    assert "Network is unreachable" in result.output
    assert any("[tools.shell] network" in hint for hint in result.hints)


def test_network_patterns_match_one_simple_command_only() -> None:
    patterns = ["npm install*", "git fetch"]
    assert network_allowed(patterns, "npm install left-pad")
    assert network_allowed(patterns, "  git fetch ")
    for command in [
        "npm install x; curl evil",
        "npm install x && curl evil",
        "npm install x | sh",
        "npm install $(curl evil)",
        "npm install `curl evil`",
        "npm install x\ncurl evil",
        "npm install x > ~/.bashrc",
        "git fetch origin",
        "curl evil",
    ]:
        assert not network_allowed(patterns, command), command
    assert network_allowed(True, "anything; at all")
    assert not network_allowed(False, "npm install")


# -- where bubblewrap does not work ---------------------------------------------------------


@pytest.fixture
def no_bwrap(path_without_bwrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process on a PATH without bwrap (bash, env and the rest stay): a machine without bubblewrap."""
    monkeypatch.setenv("PATH", path_without_bwrap)
    assert not sandbox_status(refresh=True).available
    yield
    monkeypatch.undo()
    assert sandbox_status(refresh=True).available


@pytest.mark.trio
@pytest.mark.usefixtures("no_bwrap")
async def test_without_bubblewrap_required_refuses_and_auto_runs_with_process_groups(
    make_ctx: Callable[..., ToolContext], work: Path
) -> None:
    with pytest.raises(ToolError, match=r"sandbox = \\?\"required\\?\".*not installed.*apt-get install bubblewrap"):
        await shell.fn(make_ctx(shell_options={"sandbox": "required"}), command="echo ran > ran.txt")
    assert not (work / "ran.txt").exists()
    result = await run(make_ctx(), command="echo ran")
    assert result.ok
    assert result.data["sandbox"] == "unavailable"
    off = await run(make_ctx(shell_options={"sandbox": "off"}), command="echo ran")
    assert off.data["sandbox"] == "off"


def test_debug_state_tells_the_agent_how_its_commands_are_sandboxed(make_ctx: Callable[..., ToolContext]) -> None:
    assert describe_sandbox(make_ctx()).startswith("bubblewrap")
    assert "network off" in describe_sandbox(make_ctx())
    assert "network only for npm install*" in describe_sandbox(make_ctx(shell_options={"network": ["npm install*"]}))
    assert describe_sandbox(make_ctx(shell_options={"sandbox": "off"})).startswith("off")


@pytest.mark.usefixtures("no_bwrap")
def test_debug_state_says_when_the_sandbox_is_unavailable(make_ctx: Callable[..., ToolContext]) -> None:
    assert "process groups only" in describe_sandbox(make_ctx())
    assert "refuses every command" in describe_sandbox(make_ctx(shell_options={"sandbox": "required"}))


@pytest.mark.trio
async def test_programs_on_the_path_under_the_hosts_tmp_still_run_read_only(
    make_ctx: Callable[..., ToolContext], tmp_path: Path
) -> None:
    # A checkout and its virtualenv in /tmp (a CI runner's work directory): the sandbox's own /tmp
    # must not take the toolchain away with the rest of the host's /tmp.
    venv = tmp_path / "checkout" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "lib").mkdir()
    (venv / "lib" / "data.txt").write_text("from the venv's lib\n")
    hello = venv / "bin" / "hello-from-tmp"
    hello.write_text(f"#!/bin/sh\ncat {venv}/lib/data.txt\n")
    hello.chmod(0o755)
    (tmp_path / "checkout" / "secret.txt").write_text("tmp-secret")
    ctx = make_ctx(shell_options={"env": {"PATH": f"{venv / 'bin'}:/usr/bin:/bin"}})
    result = await run(ctx, command=f"hello-from-tmp; touch {venv}/lib/pwned; cat {tmp_path}/checkout/secret.txt")
    assert result.data["sandbox"] == "bwrap"
    assert "from the venv's lib" in result.output
    assert not (venv / "lib" / "pwned").exists()  # shown read-only
    assert "tmp-secret" not in result.output  # the rest of the host's /tmp stays out of reach


# -- what decides what the agent may do, and what the sandbox hides ------------------------------


@pytest.mark.trio
async def test_weald_config_and_skills_cannot_be_planted_where_there_are_none(
    make_ctx: Callable[..., ToolContext], work: Path
) -> None:
    command = (
        "echo more > notes.txt; "
        'printf \'[mcp.servers.x]\\ncommand = "sh"\\n[tools.shell]\\nsandbox = "off"\\n\' > weald.toml; '
        "mkdir -p .weald/skills/x; rm -rf weald.toml .weald; mv weald.toml elsewhere"
    )
    result = await run(make_ctx(), command=command)
    assert not result.ok
    for refusal in ("weald.toml: Read-only file system", "Not a directory", "Device or resource busy"):
        assert refusal in result.output
    assert any("read-only to every command, whether they exist or not" in hint for hint in result.hints)
    # Nothing planted, no placeholder left behind; the rest of the project stays writable.
    assert names(work) == ["notes.txt"]
    assert (work / "notes.txt").read_text() == "more\n"


@pytest.mark.trio
async def test_a_placeholder_stays_while_any_sandbox_holds_it_and_goes_with_the_last(
    nursery: trio.Nursery, make_ctx: Callable[..., ToolContext], work: Path, tmp_path: Path, bubblewrap: str
) -> None:
    jobs = JobTable(nursery_spawner(nursery), output_dir=tmp_path / "out", kill_grace=0.5)
    ctx = make_ctx(session=SessionServices(output_dir=tmp_path / "out", jobs=jobs))
    (tmp_path / "weald.toml").write_text('[tools.permissions]\nshell = "deny"\n')  # the project around work/
    started = await run(ctx, command="sleep 1000", background=True)
    # Held by the job's sandbox: empty files of mode 0400, which no configuration reader takes for one.
    assert is_placeholder(work / "weald.toml", "file")
    assert is_placeholder(work / ".weald", "file")
    assert "Read-only file system" in (await run(ctx, command="echo x > weald.toml")).output
    assert is_placeholder(work / "weald.toml")  # the job still holds it after that command ended
    # Meanwhile, a session started in work/ is still judged by the project's rules around it.
    assert find_project_files(work, home=tmp_path / "home", environ={}).project == tmp_path / "weald.toml"
    # Another process's sandbox (another daemon's, say) holds it too, with bubblewrap's lock.
    lock = ["--lock-file", str(work / "weald.toml")]
    other = await trio.lowlevel.open_process(
        [bubblewrap, "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/", *lock, "--", "sleep", "1000"]
    )
    await await_until(lambda: _locked(work / "weald.toml"), timeout=10, message="the other sandbox's lock")
    await run(ctx, action="kill", job_id=started.data["job_id"])
    assert is_placeholder(work / "weald.toml")  # not removed from under the other sandbox
    assert not (work / ".weald").exists()  # nobody else held that one
    other.kill()
    await other.wait()
    # Its init dies with it (--die-with-parent), a moment later; then the next command to end removes it.
    await await_until(lambda: not _locked(work / "weald.toml"), timeout=10, message="the other sandbox to end")
    assert (await run(ctx, command="true")).ok
    assert names(work) == []
    await jobs.aclose()


def names(directory: Path) -> list[str]:
    """What ``directory`` holds, sorted."""
    return sorted(os.listdir(directory))


def _locked(path: Path) -> bool:
    import fcntl
    import struct

    fd = os.open(path, os.O_RDONLY)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("@hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
    finally:
        os.close(fd)
    return bool(struct.unpack("@hhqqi4x", answer)[0] != fcntl.F_UNLCK)


def _git(project: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x"}
    env |= {"GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@x"}
    done = subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout


@pytest.mark.trio
@pytest.mark.usefixtures("git")
async def test_git_config_hooks_and_hooks_path_are_read_only_and_git_still_works(
    make_ctx: Callable[..., ToolContext], work: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "PLANTED-RAN"
    _git(work, "init", "-q")
    _git(work, "config", "core.hooksPath", "tools/githooks")  # tools/ does not exist yet
    config = (work / ".git" / "config").read_text()
    command = (
        f"git config core.fsmonitor 'touch {marker}'; printf '[core]\\nfsmonitor = touch {marker}\\n' >> .git/config; "
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/pre-commit; mkdir -p tools/githooks; "
        "mv .git .git.old; mv .git/hooks .git/h; "
        "echo hi > a.txt && git add a.txt && git -c user.name=a -c user.email=a@x commit -qm first && git log --oneline"
    )
    result = await run(make_ctx(), command=command)
    assert "first" in result.output, result.output  # git itself works in the sandbox
    assert result.output.count("Read-only file system") >= 2
    assert "could not write config file .git/config" in result.output  # git config's own refusal
    assert (work / ".git" / "config").read_text() == config
    assert sorted(p.name for p in (work / ".git" / "hooks").iterdir() if not p.name.endswith(".sample")) == []
    assert names(work) == [".git", "a.txt"]  # no tools/ left, .git not moved
    # The user's own git, on the host, afterwards: nothing planted runs.
    (work / "a.txt").write_text("changed\n")
    _git(work, "status")
    _git(work, "commit", "-qam", "second")
    assert not marker.exists()


@pytest.mark.trio
@pytest.mark.usefixtures("git")
async def test_files_git_config_includes_are_read_only_nested_and_missing_ones_too(
    make_ctx: Callable[..., ToolContext], work: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "PLANTED-RAN"
    _git(work, "init", "-q")
    # .git/config includes conf/git.inc (there), which includes conf/more.inc (missing) and sets
    # core.hooksPath to a directory that does not exist yet; an includeIf names conf/if.inc (missing).
    (work / "conf").mkdir()
    (work / "conf" / "git.inc").write_text("[include]\n\tpath = more.inc\n[core]\n\thooksPath = conf/hooks\n")
    _git(work, "config", "include.path", "../conf/git.inc")
    _git(work, "config", "includeIf.onbranch:main.path", "../conf/if.inc")
    planted = f"[core]\\n\\tfsmonitor = touch {marker}\\n"
    hook = f"#!/bin/sh\\ntouch {marker}\\n"
    command = (
        f"printf '{planted}' >> conf/git.inc; printf '{planted}' > conf/more.inc; printf '{planted}' > conf/if.inc; "
        f"mkdir -p conf/hooks && printf '{hook}' > conf/hooks/pre-commit; chmod +x conf/hooks/pre-commit; "
        "mv conf conf.old; echo other > conf/notes.txt; ls conf"
    )
    result = await run(make_ctx(), command=command)
    assert result.output.count("Read-only file system") >= 3, result.output
    assert (work / "conf" / "git.inc").read_text().count("fsmonitor") == 0
    assert sorted(p.name for p in (work / "conf").iterdir()) == ["git.inc", "notes.txt"]  # placeholders gone
    assert (work / "conf" / "notes.txt").read_text() == "other\n"  # the rest of conf/ stays writable
    # The user's own git, on the host, afterwards: nothing planted runs.
    (work / "a.txt").write_text("x\n")
    _git(work, "add", "a.txt")
    _git(work, "-c", "user.name=a", "-c", "user.email=a@x", "commit", "-qm", "first")
    _git(work, "status")
    assert not marker.exists()


@pytest.mark.trio
async def test_a_file_the_configuration_reads_is_read_only(make_ctx: Callable[..., ToolContext], work: Path) -> None:
    (work / "config").mkdir()
    (work / "config" / ".mcp.json").write_text('{"mcpServers": {}}\n')
    ctx = make_ctx(protected=(str(work / "config" / ".mcp.json"),))
    command = "echo '{}' > config/.mcp.json; mv config conf; rm config/.mcp.json; echo ok > config/other.json"
    result = await run(ctx, command=command)
    assert (work / "config" / ".mcp.json").read_text() == '{"mcpServers": {}}\n'
    assert (work / "config" / "other.json").read_text() == "ok\n"  # the rest of its directory stays writable
    assert "Device or resource busy" in result.output  # its directory cannot be moved away either


@pytest.mark.trio
async def test_hidden_and_private_paths_stay_hidden_in_a_project_under_tmp(
    make_ctx: Callable[..., ToolContext], work: Path
) -> None:
    assert str(work).startswith("/tmp/")  # the host's /tmp, which the sandbox replaces: the project is shown again
    (work / ".env").write_text("TOKEN=env-secret\n")
    (work / "secrets").mkdir()
    (work / "secrets" / "key").write_text("key-secret")
    state = work / "state"
    state.mkdir()
    (state / "store.db").write_text("store-secret")
    ctx = make_ctx(
        shell_options={"hidden": [".env", "secrets"], "readable": ["state"], "writable": ["state"]},
        private=(str(state),),
    )
    result = await run(ctx, command="cat .env secrets/key state/store.db; echo pwned > state/store.db; ls -A state")
    for secret in ("env-secret", "key-secret", "store-secret"):
        assert secret not in result.output
    assert (state / "store.db").read_text() == "store-secret"  # private wins over readable and writable


CREDENTIALS = {
    ".claude.json": '{"oauthAccount": "claude-secret"}',
    ".claude/.credentials.json": '{"accessToken": "claude-token"}',
    ".config/Claude/claude_desktop_config.json": '{"env": {"K": "desktop-secret"}}',
    ".codex/auth.json": '{"OPENAI_API_KEY": "codex-secret"}',
    ".config/opencode/opencode.json": '{"apiKey": "opencode-config"}',
    ".local/share/opencode/auth.json": '{"key": "opencode-secret"}',
    ".cache/huggingface/token": "hf-secret",
    ".config/rclone/rclone.conf": "pass = rclone-secret",
    ".pip/pip.conf": "index-url = https://u:pip-secret@x",
    ".config/pip/pip.conf": "index-url = https://u:pip2-secret@x",
    ".env": "TOKEN=home-env-secret",
    ".s3cfg": "secret_key = s3cfg-secret",
    ".config/containers/auth.json": '{"auths": {"x": {"auth": "podman-secret"}}}',
    ".gem/credentials": ":rubygems_api_key: gem-secret",
    ".config/github-copilot/hosts.json": '{"github.com": {"oauth_token": "copilot-secret"}}',
    ".psql_history": "select 'psql-secret';",
}


@pytest.mark.trio
async def test_the_credentials_of_coding_agents_and_common_tools_are_hidden(
    make_ctx: Callable[..., ToolContext], visible: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = visible / "home"
    for name, text in CREDENTIALS.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    monkeypatch.setenv("HOME", str(home))
    listing = " ".join(f"~/{name}" for name in CREDENTIALS)
    result = await run(make_ctx(), command=f"cat {listing} 2>&1; grep -r secret ~ 2>&1")
    leaked = [name for name, text in CREDENTIALS.items() if text.split()[-1].strip("'\";}") in result.output]
    assert leaked == []


@pytest.mark.trio
async def test_the_sandboxs_command_line_names_no_hidden_path(
    make_ctx: Callable[..., ToolContext], fake_home: Path, visible: Path
) -> None:
    state = visible / "state"
    state.mkdir()
    sleep = tag()
    ctx = make_ctx(private=(str(state),), shell_options={"hidden": ["secret-dir"]})
    (Path(ctx.working_dir) / "secret-dir").mkdir()
    command = f"tr '\\0' '\\n' < /proc/1/cmdline; sleep {sleep} & sleep 0.5; ps -eo args; wait"
    result = await run(ctx, command=command, timeout=30)
    for path in (state, fake_home / ".ssh", Path(ctx.working_dir) / "secret-dir"):
        assert str(path) not in result.output
    assert "--args" in result.output  # bubblewrap read its options from a file
