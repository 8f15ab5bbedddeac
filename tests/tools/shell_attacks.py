"""Attacks on the shell permission rules, each one proven in a real bash, and a generator of more.

Shared by tests/tools/test_shell_rules.py and ``benchmarks/reliability.py``
(its "shell rules" part). An attack is a command line that runs something
the rules did not allow: ``touch PWNED`` (a program no pattern allows) or
``rm -rf victim`` (denied). `outcome` runs it with a real bash in a fresh
directory and reports what actually ran, by the marker it left (``PWNED``
exists, ``victim/`` is gone); `decide` is the checker's decision. The
differential property: whatever ran that the rules did not allow, the
checker did not allow either (an ``rm`` it saw is denied, one it could not
see asked about).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from hypothesis import strategies as st
from weald.runtime.agents.tool_runner import decide_permission
from weald.tools import PermissionScope
from weald.tools.shell import shell

# The documented example table of the issue: echo and git status allowed, rm denied.
ECHO_RULES: Mapping[str, Any] = {"echo *": "allow", "git status*": "allow", "rm *": "deny"}
# Every simple command allowed: what is still asked is what the checker cannot see.
EVERY_RULES: Mapping[str, Any] = {"*": "allow", "rm *": "deny"}


def decide(command: str, rules: Mapping[str, Any], project: Path) -> tuple[str, str]:
    """The tool runner's decision on ``command`` under ``[tools.permissions.shell]`` = ``rules``."""
    scope = PermissionScope(project, ())
    return decide_permission(shell, {"command": command}, {"shell": dict(rules)}, scope=scope)


@attrs.frozen
class Outcome:
    """What a real bash did with a command line: the markers it left."""

    touched: bool  # `touch PWNED` ran
    removed: bool  # `rm -rf victim` ran


@attrs.frozen
class Attack:
    """One attack: a command line, the rules it is tried under, and the decision that stops it.

    ``expect`` is ``ask`` (the checker cannot see the command: a person
    decides) or ``deny`` (it sees the denied command through whatever hides it).
    """

    command: str
    rules: str  # "echo" or "every"
    expect: str
    git: bool = False  # run in a git repository (for attacks through .git/config)

    @property
    def table(self) -> Mapping[str, Any]:
        return ECHO_RULES if self.rules == "echo" else EVERY_RULES


def bash_env(where: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(where), "LC_ALL": "C"}


def run_bash(command: str, where: Path, *, timeout: float = 30) -> None:
    """Run ``command`` with a real bash in ``where`` (no network use, nothing of ours in the environment)."""
    with contextlib.suppress(subprocess.TimeoutExpired):  # what it did until then is what counts
        subprocess.run(
            ["bash", "-c", command],
            cwd=where,
            env=bash_env(where),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )


def outcome(command: str, *, git: bool = False, timeout: float = 30) -> Outcome:
    """What ``command`` does in a real bash, in a fresh directory holding ``victim/`` (and a git repository)."""
    where = Path(tempfile.mkdtemp(prefix="weald-attack-"))
    try:
        (where / "victim" / "deep").mkdir(parents=True)
        if git:
            subprocess.run(["git", "init", "-q", str(where)], check=True, env=bash_env(where), timeout=30)
            # The attack's `git status` runs on the host: what .git/config names runs with it.
        run_bash(command, where, timeout=timeout)
        return Outcome(touched=(where / "PWNED").exists(), removed=not (where / "victim").exists())
    finally:
        shutil.rmtree(where, ignore_errors=True)


# -- the attacks ------------------------------------------------------------------------------------

# Text bash expands a second time: a substitution inside quotes in arithmetic or a
# parameter expansion, and values that arithmetic reads as arithmetic again.
HIDDEN_UNDER_ECHO = [
    "echo $(( '$(touch PWNED)' ))",
    "echo $[ '$(touch PWNED)' ]",
    "echo ok; (( '$(touch PWNED)' ))",
    "echo ${x['$(touch PWNED)']}",
    "echo \"${x:-'$(touch PWNED)'}\"",
    "echo ${x:-`touch PWNED`}",
    "echo \"$(( '$(touch PWNED)' ))\"",
    "echo \"${x['$(touch PWNED)']}\"",
    "echo $(( 'a[$(touch PWNED)]' ))",
    "echo ${x[$(( '$(touch PWNED)' ))]}",
    "echo {1..$(( '$(touch PWNED)' ))}",
    "echo ok; [[ 'a[$(touch PWNED)]' -eq 1 ]]",
    "echo ok; [[ -v 'a[$(touch PWNED)]' ]]",
    "for ((i='a[$(touch PWNED)]';0;)); do echo ok; done",
    "case 1 in $(( '$(touch PWNED)' ))) echo ok;; esac",
    "for s in abc; do echo ${s:'a[$(touch PWNED)]'}; done",
    "echo $(( $'a[\\x24(touch PWNED)]' ))",
    # A value arithmetic reads again: from a loop, an assigning expansion, a file name, `$_`.
    "for x in 'a[$(touch PWNED)]'; do echo $((x)); done",
    "for x in 'a[$(touch PWNED)]'; do echo ${a[x]}; done",
    "for x in 'a[$(touch PWNED)]'; do echo ${!x}; done",
    "for x in '$(touch PWNED)'; do echo ${x@P}; done",
    "select x in 'a[$(touch PWNED)]'; do echo $((x)); break; done <<< 1",
    "echo ${x:='a[$(touch PWNED)]'} $((x))",
    "echo 'a[$(touch PWNED)]'; echo $((_))",
    "echo ok > 'a[$(touch PWNED)]'; for f in a*; do echo $((f)); done",
]

HIDDEN_UNDER_EVERY = [
    *HIDDEN_UNDER_ECHO,
    "x='a[$(touch PWNED)]'; echo $((x))",
    "x='a[$(touch PWNED)]'; [[ $x -eq 1 ]]",
    "y=x; x='a[$(touch PWNED)]'; echo $((y))",
    "x='$(touch PWNED)'; echo ${x@P}",
    "x='a[$(touch PWNED)]'; echo ${!x}",
    "a['$(touch PWNED)']=1",
    "declare a['$(touch PWNED)']=1",
    "declare -i x='a[$(touch PWNED)]'",
    "f() { local -i y='a[$(touch PWNED)]'; }; f",
    "let 'a[$(touch PWNED)]'",
    "test -v 'a[$(touch PWNED)]'",
    "printf -v 'a[$(touch PWNED)]' x",
    "read 'a[$(touch PWNED)]' <<< 1",
    "x='a[$(touch PWNED)]'; printf -v \"$x\" 1",
    "x='a[$(touch PWNED)]'; declare -n r=$x; r=1",
    "bash -c 'echo $(($1))' _ 'a[$(touch PWNED)]'",
    "f() { echo $(( $1 )); }; f 'a[$(touch PWNED)]'",
    "x=$(echo 'a[$(touch PWNED)]'); echo $((x))",
]

# The same shapes hiding a denied command: the checker finds it and denies.
HIDDEN_RM = [
    "echo $(( '$(rm -rf victim)' ))",
    "echo $[ '$(rm -rf victim)' ]",
    "echo ok; (( '$(rm -rf victim)' ))",
    "echo ${x['$(rm -rf victim)']}",
    "echo \"${x:-'$(rm -rf victim)'}\"",
    "echo ${x:-`rm -rf victim`}",
    "for x in 'a[$(rm -rf victim)]'; do echo $((x)); done",
    "echo ${x:='a[$(rm -rf victim)]'} $((x))",
]

# Programs that run another: deny sees the command each runs. `{pid}` is the test's own process
# (nsenter enters its namespaces: pid 1's are out of reach in a container).
WRAPPED_RM = [
    "setpriv rm -rf victim",
    "setpriv --reuid=0 --clear-groups rm -rf victim",
    "prlimit --nofile=256 rm -rf victim",
    "prlimit -n256 -- rm -rf victim",
    "unshare rm -rf victim",
    "unshare -U rm -rf victim",
    "script -qc 'rm -rf victim' /dev/null",
    "script -q -c 'echo ok; rm -rf victim' /dev/null",
    "nsenter -t {pid} -u rm -rf victim",
    "nsenter --target {pid} --uts -- rm -rf victim",
    "sg root -c 'rm -rf victim'",
    "sg root 'rm -rf victim'",
    "strace -f -o /dev/null rm -rf victim",
    "strace -qfo /dev/null rm -rf victim",
    "chroot --skip-chdir / rm -rf victim",
    "flock lock rm -rf victim",
    "flock -w 5 lock -c 'rm -rf victim'",
    "ionice -c 3 rm -rf victim",
    "ionice -c3 -n7 rm -rf victim",
    "taskset 1 rm -rf victim",
    "taskset -c 0 rm -rf victim",
    "stdbuf -oL rm -rf victim",
    "stdbuf -o L -e L rm -rf victim",
    "chrt -o 0 rm -rf victim",
    "setarch x86_64 -R rm -rf victim",
    "linux64 rm -rf victim",
    "fakeroot -- rm -rf victim",
    "sudo -u root rm -rf victim",
    "sudo -u root -- rm -rf victim",
    "sudo -s rm -rf victim",
    "nice -n 5 setpriv --reuid=0 timeout 9 rm -rf victim",
]

# The same, where this machine cannot run them (no systemd, no doas, no busybox): decided only.
WRAPPED_RM_DECIDED = [
    "systemd-run rm -rf victim",
    "systemd-run --scope -p CPUQuota=10% rm -rf victim",
    "systemd-run --user --wait -u job rm -rf victim",
    "doas rm -rf victim",
    "doas -u root rm -rf victim",
    "busybox rm -rf victim",
    "pkexec --user root rm -rf victim",
    "cgexec -g cpu:grp rm -rf victim",
    "numactl -C 0 rm -rf victim",
    "xvfb-run -a rm -rf victim",
    "dbus-run-session -- rm -rf victim",
    "faketime '2020-01-01' rm -rf victim",
    "runcon user_u:user_r:user_t rm -rf victim",
    "runcon -t unconfined_t rm -rf victim",
    "ltrace -o /dev/null rm -rf victim",
    "valgrind --quiet rm -rf victim",
]

# Git runs what .git/config names: `echo` and `git status` allowed chain into anything.
THROUGH_GIT = "echo '[core]' >> .git/config; echo 'fsmonitor = \"touch PWNED\"' >> .git/config; git status"


def attacks(*, wrapped: bool = True) -> Iterator[Attack]:
    """Every listed attack; ``wrapped``: with those of `WRAPPED_RM` (their programs installed)."""
    pid = os.getpid()
    for command in HIDDEN_UNDER_ECHO:
        yield Attack(command, "echo", "ask")
    for command in HIDDEN_UNDER_EVERY:
        yield Attack(command, "every", "ask")
    for command in HIDDEN_RM:
        yield Attack(command, "echo", "deny")
    for command in WRAPPED_RM if wrapped else []:
        yield Attack(command.format(pid=pid), "echo", "deny")
    yield Attack(THROUGH_GIT, "echo", "ask", git=True)


# -- a generator of nested quoting and expansion forms ------------------------------------------------

PAYLOADS = ["$(touch PWNED)", "`touch PWNED`", "$(touch PWNED; echo 1)", "a[$(touch PWNED)]", "$(rm -rf victim)"]

# How one form wraps the text inside it.
FORMS = [
    "'{}'",
    '"{}"',
    "$(( {} ))",
    "$[ {} ]",
    "${{x:-{}}}",
    "${{x:={}}}",
    "${{x[{}]}}",
    "${{x/a/{}}}",
    "${{x:+{}}}",
    "${{#x[{}]}}",
    "a[{}]",
    "\\{}",
    "$'{}'",
    "{{{},b}}",
    "$( echo {} )",
    "`echo {}`",
    "<(echo {})",
    "$(( 1 + {} ))",
    '${{x:-"{}"}}',
]

# The statement the formed text ends up in; only `echo` is allowed by ECHO_RULES.
STATEMENTS = [
    "echo {}",
    "echo ok {}",
    'echo "{}"',
    "echo ok; (( {} ))",
    "for x in {}; do echo $((x)); done",
    "for x in {}; do echo ${{a[x]}}; done",
    "echo ok; [[ {} -eq 1 ]]",
    "echo ok; [[ -v {} ]]",
    "case ok in {}) echo ok;; esac",
    "echo {} $((x))",
    "for ((i={};0;)); do echo ok; done",
    "for s in abcdef; do echo ${{s:{}}}; done",
    "echo ok <<EOF\n{}\nEOF",
    "echo ok <<< {}",
    "echo ok > {}",
    "echo ${{x:-{}}} | echo ok",
    "bash -c 'echo {}'",
]


@st.composite
def nested_forms(draw: st.DrawFn) -> str:
    """A command line hiding ``touch PWNED`` (or ``rm -rf victim``) in one to four nested forms."""
    text = draw(st.sampled_from(PAYLOADS))
    for _ in range(draw(st.integers(1, 4))):
        form = draw(st.sampled_from(FORMS))
        if "'" in form and "'" in text:
            form = draw(st.sampled_from([f for f in FORMS if "'" not in f]))
        text = form.format(text)
    return draw(st.sampled_from(STATEMENTS)).format(text)


def refused(decision: str, ran: Outcome) -> bool:
    """The differential property: what ran unallowed was not allowed (an rm the checker saw was denied)."""
    if not ran.touched and not ran.removed:
        return True
    return decision != "allow"
