"""The attacks of the shell sandbox audit, through a real daemon and a real shell, as root and as an ordinary user.

A model (scripted) drives an agent whose shell is allowed everything, and
runs what an attacker would: read the daemon's secrets from its environment
(``/proc/$PPID/environ``, base64 and reversed so no redaction can see them),
read the home's credentials, the daemon's store, config and socket, write
outside the project, use the network, kill the daemon, leave processes
behind (``setsid env -i``). Each must be refused or contained.

The daemon runs as root and as an ordinary user (root may read any /proc
entry; a user may read its own processes'), with the OS sandbox on (the
default) and off (``[tools.shell] sandbox = "off"``: then only the attacks
on the daemon's environment apply, and the scrubbed environment alone must
hold). Its environment holds 22 secrets. The process tests kill the daemon
with SIGKILL in the middle of a shell call and of an MCP server that
ignores end of input, and check that nothing of the dead daemon survives
its next start.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from daemon_harness import DaemonProcess, recent_events, sleep_tag, sleeping
from sec_user import User, ordinary_user
from weald.runtime import scan_proc
from weald.runtime.daemon.client import Client
from weald.runtime.testing import process_alive, wait_until

pytestmark = pytest.mark.usefixtures("bubblewrap")

STUBBORN_SERVER = Path(__file__).with_name("sec_stubborn_server.py")


def _secret(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(10)}"


# What the audit found in the daemon's environment, and more of the same shapes: 22 in all.
SECRETS = {
    "OPENAI_API_KEY": _secret("sk-proj"),
    "ANTHROPIC_API_KEY": _secret("sk-ant"),
    "GITHUB_TOKEN": _secret("ghp"),
    "GH_PAT": _secret("github_pat"),
    "AWS_SECRET_ACCESS_KEY": _secret("aws"),
    "AWS_ACCESS_KEY_ID": _secret("AKIA"),
    "SSHPASS": _secret("sshpass"),
    "BEARER": _secret("bearer"),
    "STRIPE_SK": _secret("sk_live"),
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/" + _secret("T0"),
    "DISCORD_WEBHOOK": "https://discord.com/api/webhooks/" + _secret("wh"),
    "SENTRY_DSN": "https://" + _secret("dsn") + "@sentry.example/1",
    "DATABASE_URL": "postgres://app:" + _secret("pw") + "@db/app",
    "GCP_CREDENTIALS": _secret("gcp"),
    "GOOGLE_APPLICATION_CREDENTIALS_JSON": _secret("gac"),
    "MYSQL_PWD": _secret("mysql"),
    "NPM_TOKEN": _secret("npm"),
    "HF_TOKEN": _secret("hf"),
    "DOCKER_PASSWORD": _secret("docker"),
    "GPG_PASSPHRASE": _secret("gpg"),
    "CI_JOB_JWT": _secret("eyJhbGciOi"),
    "AZURE_STORAGE_CONNECTION_STRING": "AccountKey=" + _secret("azure"),
}

HOME_SECRETS = {
    ".ssh/id_ed25519": _secret("ssh-key"),
    ".aws/credentials": _secret("aws-file"),
    ".config/gcloud/credentials.db": _secret("gcloud"),
    ".netrc": _secret("netrc"),
    ".docker/config.json": _secret("docker-file"),
    ".weald/weald.toml": _secret("home-config"),
}


def leaked(text: str) -> list[str]:
    """The secrets (of the daemon's environment and of the home) found in ``text``."""
    values = {**SECRETS, **{f"~/{k}": v for k, v in HOME_SECRETS.items()}}
    return sorted(name for name, value in values.items() if value in text)


def unreverse(text: str) -> str:
    """Undo ``base64 -w0 | rev``; what is not base64 comes back as it was."""
    chunks = []
    for word in text.split():
        try:
            chunks.append(base64.b64decode(word[::-1] + "==", validate=False).decode("latin-1"))
            chunks.append(base64.b64decode(word + "==", validate=False).decode("latin-1"))
        except ValueError:
            chunks.append(word)
    return text + "\n".join(chunks)


class AttackDaemon(DaemonProcess):
    """A daemon with secrets in its environment and its home, run as ``user`` (None: as this process)."""

    def __init__(self, root: Path, *, user: User | None, sandbox: str, extra_config: str = "") -> None:
        # Beside the state directory, not in it: the state directory is hidden whole.
        self.home = root.with_name(root.name + "-home")
        for name, value in HOME_SECRETS.items():
            (self.home / name).parent.mkdir(parents=True, exist_ok=True)
            (self.home / name).write_text(value)
        (self.home / ".bashrc").write_text("# the user's own\n")
        config = f'[tools.permissions]\nshell = "allow"\n[tools.shell]\nsandbox = "{sandbox}"\nkill_grace = 0.5\n'
        super().__init__(root, extra_config=config + extra_config)
        (root / "run").mkdir(exist_ok=True)
        self.user = user
        if user is not None:
            user.give(root)
            user.give(self.home)

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(SECRETS)
        env["HOME"] = str(self.home)
        env.pop("XDG_RUNTIME_DIR", None)
        return env

    def start(self, *extra: str) -> AttackDaemon:
        args = [sys.executable, "-m", "weald.runtime.daemon.cli", "serve", "--socket", str(self.socket), *extra]
        prefix = list(self.user.prefix) if self.user is not None else []
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([*prefix, *args], env=self.env(), stdout=log, stderr=log, cwd=self.project)
        wait_until(self._answers, timeout=60, message=lambda: f"the daemon to answer; log:\n{self.log.read_text()}")
        return self

    def _answers(self) -> bool:
        with self._acting():
            return super()._answers()

    def client(self) -> Client:
        with self._acting():
            return super().client()

    def _acting(self) -> contextlib.AbstractContextManager[None]:
        return self.user.acting() if self.user is not None else contextlib.nullcontext()

    def daemon_pid(self) -> int:
        with self.client() as client:
            pid: int = client.call("daemon.status")["pid"]
        return pid

    def shell_outputs(self, commands: list[str], agent: str, timeout: float = 120) -> list[str]:
        """Run each command through the shell tool of a new agent, in order; the outputs the model read."""
        steps: list[dict[str, Any]] = [
            {"tool_calls": [{"name": "shell", "arguments": {"command": c, "timeout": 30}}]} for c in commands
        ]
        model = self.script(agent, [*steps, {"text": "done"}])
        with self.client() as client:
            client.call("agent.start", {"working_dir": str(self.project), "model": model, "agent_id": agent})
            client.call("agent.prompt", {"agent_id": agent, "text": "go"}, timeout=timeout)
            messages = client.call("agent.history", {"agent_id": agent})["messages"]
        outputs = [m["content"] for m in messages if m["role"] == "tool"]
        assert len(outputs) == len(commands), messages
        return outputs


@pytest.fixture(scope="module")
def attack_root() -> Iterator[Path]:
    """Outside /tmp (which the sandbox replaces whole): the home and state must be hidden, not merely elsewhere."""
    root = Path(tempfile.mkdtemp(prefix="weald-attacks-", dir="/var/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


PROBE = """\
import socket, sys
try:
    if sys.argv[1] == "unix":
        s = socket.socket(socket.AF_UNIX)
        s.connect(sys.argv[2])
    else:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=5)
    print("connected", s.recv(16) if sys.argv[1] != "unix" else b"")
except OSError as exc:
    print("refused:", exc)
"""


MEMSCAN = """\
import re, sys
pid, prefixes = sys.argv[1], sys.argv[2:]
pattern = re.compile(("(?:" + "|".join(map(re.escape, prefixes)) + ")-[0-9a-f]{20}").encode())
found = set()
try:
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            start, end = (int(x, 16) for x in addr.split("-"))
            if not perms.startswith("rw") or end - start > 256 << 20:
                continue
            try:
                mem.seek(start)
                # Reversed: the daemon cuts known secrets out of what a command prints, literally.
                found.update(m.group().decode()[::-1] for m in pattern.finditer(mem.read(end - start)))
            except OSError:
                continue
    print("scanned:", " ".join(sorted(found)))
except OSError as exc:
    print("denied:", exc)
"""
PREFIXES = sorted({value.split("-")[0] for value in SECRETS.values() if "://" not in value and "=" not in value})


@attrs.frozen
class Attacked:
    """What each attack printed, and what the host looked like after."""

    who: str
    sandboxed: bool
    outputs: dict[str, str]
    root: Path
    home: Path
    daemon_alive_after: bool
    sleeper: str
    sleepers_after: list[int]


def _attack(root: Path, loopback_listener: int, who: str, sandbox: str) -> Attacked:
    user = ordinary_user(root) if who == "user" else None
    base = root / f"{who}-{sandbox}"
    base.mkdir()
    if user is not None:
        user.give(base)
    daemon = AttackDaemon(base, user=user, sandbox=sandbox)
    try:
        daemon.start()
        pid = daemon.daemon_pid()
        (daemon.project / "probe.py").write_text(PROBE)
        (daemon.project / "memscan.py").write_text(MEMSCAN)
        sleeper = sleep_tag()
        attacks = {
            "env": "env",
            "ppid environ": "base64 -w0 < /proc/$PPID/environ | rev",
            "daemon environ": f"base64 -w0 < /proc/{pid}/environ | rev",
        }
        if (who, sandbox) != ("root", "off"):
            # Root may read any process's memory: without the sandbox, a root daemon's secrets are
            # its root shell's. Every other daemon's memory is out of its commands' reach.
            prefixes = " ".join(PREFIXES)
            attacks["daemon memory"] = f"python3 memscan.py $PPID {prefixes}; python3 memscan.py {pid} {prefixes}"
        if sandbox != "off":
            attacks |= {
                # Outside the sandbox this would read the whole machine's processes: too much to check.
                "every environ": "for f in /proc/[0-9]*/environ; do cat $f; done 2>/dev/null | base64 -w0",
                "home": "cat ~/.ssh/id_ed25519 ~/.aws/credentials ~/.config/gcloud/credentials.db ~/.netrc "
                "~/.docker/config.json ~/.weald/weald.toml 2>&1; ls -A ~/.ssh ~/.aws ~/.weald",
                "state": f"ls -A {base}; cat {base}/store.db {daemon.config} 2>&1 | base64 -w0",
                "socket": f"python3 probe.py unix {daemon.socket}",
                "write": f"echo pwned >> ~/.bashrc; echo pwned > {base}/pwned.txt; echo done",
                "network": f"python3 probe.py tcp {loopback_listener}",
                "kill the daemon": f"kill -9 {pid}; echo rc=$?",
                "processes": "ls /proc | grep -c '^[0-9]'",
                "leave a sleeper": f"setsid env -i bash -c 'sleep {sleeper}' & sleep 0.3; echo started",
            }
        outputs = dict(zip(attacks, daemon.shell_outputs(list(attacks.values()), "attacker"), strict=True))
        alive = daemon.proc is not None and daemon.proc.poll() is None
        after = sleeping(sleeper)
        assert daemon.terminate() == 0, daemon.log.read_text()
        return Attacked(who, sandbox != "off", outputs, base, daemon.home, alive, sleeper, after)
    finally:
        daemon.close()


@pytest.fixture(scope="module")
def runs(attack_root: Path, loopback_listener: int) -> dict[tuple[str, str], Attacked]:
    """The attacks, once per daemon (as root and as a user, sandbox on and off), on first use."""
    return _Lazy(attack_root, loopback_listener)  # type: ignore[return-value]


class _Lazy(dict[tuple[str, str], Attacked]):
    def __init__(self, root: Path, loopback_listener: int) -> None:
        super().__init__()
        self._root = root
        self._listener = loopback_listener

    def __missing__(self, key: tuple[str, str]) -> Attacked:
        self[key] = _attack(self._root, self._listener, *key)
        return self[key]


EVERY_DAEMON = [("root", "auto"), ("user", "auto"), ("root", "off"), ("user", "off")]
SANDBOXED = [("root", "auto"), ("user", "auto")]


def _ids(params: list[tuple[str, str]]) -> list[str]:
    return [f"{who}-{'sandbox' if mode == 'auto' else 'no-sandbox'}" for who, mode in params]


@pytest.fixture(params=EVERY_DAEMON, ids=_ids(EVERY_DAEMON))
def attacked(request: pytest.FixtureRequest, runs: dict[tuple[str, str], Attacked]) -> Attacked:
    return runs[request.param]


@pytest.fixture(params=SANDBOXED, ids=_ids(SANDBOXED))
def sandboxed(request: pytest.FixtureRequest, runs: dict[tuple[str, str], Attacked]) -> Attacked:
    return runs[request.param]


# -- the daemon's environment (sandbox or not) -----------------------------------------------


def test_every_variable_of_the_audit_counts_as_secret() -> None:
    from weald.runtime._secrets import is_secret_env_name, is_secret_env_value

    assert len(SECRETS) == 22
    assert [n for n, v in SECRETS.items() if not (is_secret_env_name(n) or is_secret_env_value(v))] == []


def test_the_commands_environment_holds_no_secret(attacked: Attacked) -> None:
    output = attacked.outputs["env"]
    assert "PATH=" in output  # it ran
    assert leaked(output) == []
    assert [name for name in SECRETS if f"{name}=" in output] == []


def test_the_daemons_environment_cannot_be_read_through_proc_even_encoded(attacked: Attacked) -> None:
    for attack in ("ppid environ", "daemon environ"):
        assert leaked(unreverse(attacked.outputs[attack])) == [], attack


@pytest.mark.parametrize("who", ["user-sandbox", "user-no-sandbox", "root-sandbox"])
def test_the_daemons_memory_cannot_be_read(runs: dict[tuple[str, str], Attacked], who: str) -> None:
    name, _, mode = who.partition("-")
    output = runs[name, "off" if mode == "no-sandbox" else "auto"].outputs["daemon memory"]
    assert "scanned:" in output or "denied:" in output
    assert leaked(" ".join(word[::-1] for word in output.split())) == []


def test_no_process_in_the_sandbox_has_a_secret_in_its_environment(sandboxed: Attacked) -> None:
    output = sandboxed.outputs["every environ"]
    assert "PATH=" in unreverse(output)  # it read the environments there are
    assert leaked(unreverse(output)) == []


# -- the sandbox -------------------------------------------------------------------------------


def test_home_credentials_are_not_visible(sandboxed: Attacked) -> None:
    output = sandboxed.outputs["home"]
    assert leaked(output) == []
    assert "id_ed25519" not in output.rpartition(".ssh:")[2]


def test_the_daemons_store_config_and_socket_are_out_of_reach(sandboxed: Attacked) -> None:
    state = unreverse(sandboxed.outputs["state"])
    assert "store.db" not in sandboxed.outputs["state"].split()
    assert "[store]" not in state
    assert "sessions" not in state
    assert sandboxed.outputs["socket"].startswith("refused:")


def test_nothing_outside_the_project_is_written(sandboxed: Attacked) -> None:
    assert "done" in sandboxed.outputs["write"]
    assert "Read-only file system" in sandboxed.outputs["write"]
    assert (sandboxed.home / ".bashrc").read_text() == "# the user's own\n"
    assert not (sandboxed.root / "pwned.txt").exists()


def test_the_network_is_off(sandboxed: Attacked) -> None:
    assert sandboxed.outputs["network"].startswith("refused:")


def test_the_daemon_cannot_be_seen_or_killed(sandboxed: Attacked) -> None:
    assert "No such process" in sandboxed.outputs["kill the daemon"]
    assert sandboxed.daemon_alive_after
    assert int(sandboxed.outputs["processes"].split()[0]) < 10


def test_a_process_that_left_the_session_with_an_empty_environment_ends_with_the_call(sandboxed: Attacked) -> None:
    assert "started" in sandboxed.outputs["leave a sleeper"]
    assert sandboxed.sleepers_after == []


# -- processes never outlive their owner -------------------------------------------------------


def _start_job(daemon: AttackDaemon, agent: str, command: str) -> None:
    model = daemon.script(
        agent,
        [{"tool_calls": [{"name": "shell", "arguments": {"command": command, "background": True}}]}, {"text": "ok"}],
    )
    with daemon.client() as client:
        client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": agent})
        client.call("agent.prompt", {"agent_id": agent, "text": "go"}, timeout=60)


@pytest.fixture
def daemon(attack_root: Path) -> Iterator[AttackDaemon]:
    base = Path(tempfile.mkdtemp(prefix="procs-", dir=attack_root))
    proc = AttackDaemon(base, user=None, sandbox="auto")
    try:
        yield proc
    finally:
        proc.close()


def test_a_background_job_and_what_left_its_session_end_with_agent_stop_and_daemon_stop(daemon: AttackDaemon) -> None:
    daemon.start()
    first, second = sleep_tag(), sleep_tag()
    _start_job(daemon, "a1", f"setsid env -i bash -c 'sleep {first}' & sleep 1000")
    _start_job(daemon, "a2", f"setsid env -i bash -c 'sleep {second}' & sleep 1000")
    wait_until(lambda: sleeping(first) and sleeping(second), timeout=20, message="both jobs' sleepers")
    with daemon.client() as client:
        client.call("agent.stop", {"agent_id": "a1"}, timeout=30)
    assert sleeping(first) == []
    assert sleeping(second)
    assert daemon.terminate() == 0
    assert sleeping(second) == []


def test_a_killed_daemon_takes_its_sandboxed_commands_with_it(daemon: AttackDaemon) -> None:
    daemon.start()
    job, call = sleep_tag(), sleep_tag()
    _start_job(daemon, "k", f"setsid env -i bash -c 'sleep {job}' & sleep 1000")
    model = daemon.script("long", [{"tool_calls": [{"name": "shell", "arguments": {"command": f"sleep {call}"}}]}])
    with daemon.client() as client:
        client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "long"})
        client.request("agent.prompt", {"agent_id": "long", "text": "go"})
        wait_until(lambda: sleeping(job) and sleeping(call), timeout=20, message="the job and the call running")
        daemon.kill9()
    # Without waiting for a restart: bwrap's parent-death signal ends each sandbox.
    wait_until(lambda: not sleeping(job) and not sleeping(call), timeout=10, message="the sandboxes to end")
    daemon.start()
    assert recent_events(daemon, "daemon.leftovers_stopped") == []


def test_what_a_killed_daemon_left_unsandboxed_is_stopped_and_reported_by_the_next_start(
    attack_root: Path,
) -> None:
    base = Path(tempfile.mkdtemp(prefix="leftovers-", dir=attack_root))
    server_child = sleep_tag()
    mcp = textwrap.dedent(
        f"""
        [mcp.servers.stubborn]
        command = "{sys.executable}"
        args = ["{STUBBORN_SERVER}", "{server_child}"]
        """
    )
    daemon = AttackDaemon(base, user=None, sandbox="off", extra_config=mcp)
    try:
        daemon.start()
        wait_until(lambda: sleeping(server_child), timeout=30, message="the MCP server's child")
        server = _process_running(str(STUBBORN_SERVER))
        call = sleep_tag()
        model = daemon.script(
            "long", [{"tool_calls": [{"name": "shell", "arguments": {"command": f"sleep {call} & sleep 1000"}}]}]
        )
        with daemon.client() as client:
            client.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "long"})
            client.request("agent.prompt", {"agent_id": "long", "text": "go"})
            wait_until(lambda: sleeping(call), timeout=20, message="the command running")
            daemon.kill9()
        # The direct children died with the daemon (their parent-death signal)...
        wait_until(lambda: not process_alive(server), timeout=10, message="the MCP server itself to die")
        # ...what they started did not: only the next start can find them, by their mark.
        orphans = sleeping(call) + sleeping(server_child)
        assert len(orphans) == 2
        daemon.start()
        assert sleeping(call) == []
        assert [p for p in orphans if process_alive(p)] == []
        (event,) = recent_events(daemon, "daemon.leftovers_stopped")
        stopped = {entry["pid"] for entry in event["data"]["processes"] if entry["stopped"]}
        assert set(orphans) <= stopped
        assert event["data"]["survivors"] == []
        assert daemon.terminate() == 0
    finally:
        daemon.close()
        for pid in sleeping(server_child):
            os.kill(pid, signal.SIGKILL)


def _process_running(needle: str) -> int:
    found = [
        pid for pid in scan_proc("cmdline", lambda cmdline: needle.encode() in cmdline) or [] if process_alive(pid)
    ]
    assert len(found) == 1, found
    return found[0]
