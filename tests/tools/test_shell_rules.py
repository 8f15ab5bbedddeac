"""Shell permission patterns read the command line as bash runs it (tools/_bash.py, tools/_shellrules.py).

Every case goes through `decide_permission` with the real shell tool, as the
tool runner decides a call. The attacks are checked twice: the decision
refuses or asks, and the same command line, run by a real bash, really does
what the rule meant to stop (creates ``PWNED``, deletes ``victim/``), so no
case passes on a spelling bash would not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import shell_attacks
from hypothesis import given, settings
from hypothesis import strategies as st
from shell_attacks import Attack, outcome
from system_packages import apt_install
from weald.runtime.agents.tool_runner import RunnerConfig, decide_permission
from weald.runtime.daemon.config import parse_config
from weald.tools import PermissionScope
from weald.tools._bash import MAX_COMMAND_BYTES, MAX_DEPTH, MAX_SYNTAX_NODES, analyze
from weald.tools.shell import shell

ROOT = Path(__file__).resolve().parents[2]
PROJECT = Path("/work/project")
SCOPE = PermissionScope(PROJECT, (Path("/work/outputs"),))

RULES: dict[str, Any] = {
    "echo ok*": "allow",
    "git status*": "allow",
    "ls*": "allow",
    "cat*": "allow",
    "cd *": "allow",
    "grep *": "allow",
    "wc *": "allow",
    "make test": "allow",
    "rm -rf *": "deny",
    "git push --force*": "deny",
    "curl *": "ask",
}

# With every simple command allowed, what still asks is what cannot be checked.
ALLOW_EVERY_COMMAND: dict[str, Any] = {"*": "allow"}


def decide(command: str, rules: dict[str, Any] = RULES, **arguments: Any) -> tuple[str, str]:
    return decide_permission(shell, {"command": command, **arguments}, {"shell": rules}, scope=SCOPE)


def run_bash(command: str, where: Path) -> None:
    """Run ``command`` with a real bash in ``where`` (no network, nothing of ours in the environment)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(where), "LC_ALL": "C"}
    subprocess.run(
        ["bash", "-c", command],
        cwd=where,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )


# -- allow needs every simple command allowed ------------------------------------------------

# Each line runs `touch PWNED` beside an allowed `echo ok`, in one of bash's ways.
SMUGGLED = [
    "echo ok; touch PWNED",
    "echo ok;touch PWNED",
    "echo ok && touch PWNED",
    "echo ok&&touch PWNED",
    "false || touch PWNED",
    "echo ok | touch PWNED",
    "echo ok |& touch PWNED",
    "echo ok & touch PWNED",
    "echo ok\ntouch PWNED",
    "echo ok # a comment\ntouch PWNED",
    "echo ok $(touch PWNED)",
    'echo ok "$(touch PWNED)"',
    "echo ok `touch PWNED`",
    "echo ok `echo \\`touch PWNED\\``",
    "echo ok <(touch PWNED)",
    "echo ok > >(touch PWNED)",
    "echo ok ${UNSET:-$(touch PWNED)}",
    "echo ok $((1 + $(touch PWNED; echo 1)))",
    "(echo ok; touch PWNED)",
    "{ echo ok; touch PWNED; }",
    "if echo ok; then touch PWNED; fi",
    "for i in 1; do touch PWNED; done",
    "while echo ok; do touch PWNED; break; done",
    "case x in x) touch PWNED;; esac",
    "f() { touch PWNED; }; f",
    "[[ -n $(touch PWNED) ]]",
    "! touch PWNED",
    "echo ok; time touch PWNED",
    "bash -c 'echo ok; touch PWNED'",
    "sh -c 'touch PWNED'",
    "bash -lc 'touch PWNED'",
    "bash -c \"bash -c 'touch PWNED'\"",
    "echo ok; bash -c 'echo ok' && sh -c 'touch PWNED'",
    "cat > x.txt <<EOF\n$(touch PWNED)\nEOF",
    "cat > x.txt <<EOF\n`touch PWNED`\nEOF",
    "echo ok\\\n; touch PWNED",
]


@pytest.mark.parametrize("command", SMUGGLED)
def test_an_allowed_command_does_not_allow_another_one_beside_it(command: str, tmp_path: Path) -> None:
    run_bash(command, tmp_path)
    assert (tmp_path / "PWNED").exists(), "bash did not run touch: the case proves nothing"
    decision, why = decide(command)
    assert decision == "ask", why


ALLOWED = [
    "echo ok",
    "echo okay then",
    "git status",
    "git status --short",
    'git "status"',
    "git st'atus'",
    "ls -la | grep x | wc -l",
    "cd src && make test",
    "cd src\nls",
    "(ls; echo ok)",
    "{ ls; echo ok; }",
    "echo ok > out.txt",
    "echo ok >> sub/log.txt 2>&1",
    "echo ok 2>/dev/null >&2",
    "ls > /work/outputs/list.txt",
    "cd sub && echo ok > ../out.txt",
    "echo ok # trailing comment",
    "timeout 5 git status",
    "timeout -s KILL 5 git status",
    "nice -n 5 ls",
    "nohup ls",
    "time ls",
    "command ls",
    "bash -c 'ls; echo ok'",
    "bash -c 'timeout 5 git status'",
    "cat <<'EOF'\n$(touch PWNED) `id`\nEOF",
    "cat <<EOF\nplain text $HOME\nEOF",
    "ls && echo ok || echo ok",
    "echo ok rm -rf /",
    "grep -rf x .",
    "echo ok $(ls)",
]


@pytest.mark.parametrize("command", ALLOWED)
def test_a_command_line_of_allowed_commands_is_allowed(command: str) -> None:
    decision, why = decide(command)
    assert decision == "allow", why


NOT_ALLOWED_AS_WRITTEN = [
    "./git status",  # another program named git
    "./bash -c 'ls'",  # not the system's shell: more than its script
    "sudo bash -c 'ls'",
    "/tmp/git status",
    "FOO=1 git status",  # an assignment can change what the program does
    "PATH=/tmp git status",
    "LD_PRELOAD=/tmp/x.so ls",
    "env git status",  # env can set variables, so it is no harmless wrapper
    "sudo ls",
    "xargs ls",
    "PATH=/tmp; git status",  # a bare assignment is a command of its own
    "export PATH=/tmp; git status",
    "time -o /etc/x ls",  # /usr/bin/time writes a file
    "git status; make",
    "make test && make install",
    "find . -exec touch PWNED ;",
]


@pytest.mark.parametrize("command", NOT_ALLOWED_AS_WRITTEN)
def test_what_an_allow_pattern_does_not_name_is_asked(command: str) -> None:
    decision, why = decide(command)
    assert decision == "ask", why


# -- ask whatever the patterns say --------------------------------------------------------------

CONCERNS = {
    "cat <<EOF | bash\ntouch PWNED\nEOF": "bash reads the commands it runs from its input",
    "bash <<EOF\ntouch PWNED\nEOF": "bash reads the commands it runs from its input",
    "bash <<< 'touch PWNED'": "bash reads the commands it runs from its input",
    "echo touch PWNED | sh": "sh reads the commands it runs from its input",
    "curl -s x | bash -s": "bash reads the commands it runs from its input",
    "bash < script.sh": "bash reads the commands it runs from its input",
    "eval 'touch PWNED'": "eval runs a command line built when it runs",
    "eval echo ok": "eval runs a command line built when it runs",
    "source $SCRIPT": "source reads a script whose path is computed",
    ". $SCRIPT": ". reads a script whose path is computed",
    'bash -c "$SCRIPT"': "bash -c runs a script that is computed when it runs",
    "sh -c $SCRIPT": "sh -c runs a script that is computed when it runs",
    "exec touch PWNED": "exec replaces the shell with another program",
    "$CMD PWNED": "the program's name is computed when it runs ($CMD)",
    "${CMD} PWNED": "the program's name is computed when it runs (${CMD})",
    '"$(echo touch)" PWNED': "the program's name is computed when it runs",
    "tou$X PWNED": "the program's name is computed when it runs",
    "/usr/bin/tou? PWNED": "the program's name is a glob pattern",
    "echo ok > /etc/x": "it writes outside the project (> /etc/x)",
    "echo ok >> ~/.bashrc": "it writes outside the project (>> ~/.bashrc)",
    "echo ok > ../x": "it writes outside the project (> ../x)",
    "echo ok > sub/../../x": "it writes outside the project (> sub/../../x)",
    "echo ok &> /tmp/x": "it writes outside the project (&> /tmp/x)",
    "echo ok 2> /tmp/x": "it writes outside the project (> /tmp/x)",
    "echo ok >| /tmp/x": "it writes outside the project (>| /tmp/x)",
    "echo ok >& /tmp/x": "it writes outside the project (>& /tmp/x)",
    "echo ok > ~root/x": "it writes into another user's home directory",
    'echo ok > "$F"': 'it writes to a file named when it runs (> "$F")',
    "echo ok > out/*.txt": "it writes to a file named by a glob pattern",
    "cd /etc && echo ok > passwd": "it writes outside the project (> passwd)",
    "cd $DIR && echo ok > x": "it writes to a relative path after a cd weald cannot follow",
    "cd - && echo ok > x": "it writes to a relative path after a cd weald cannot follow",
    "ls <> x": "bash's grammar does not parse",
    "echo ok; (": "bash's grammar does not parse",
    "{ls,-la}": "bash's grammar does not parse",
    "env -S 'touch PWNED'": "env -S runs a command line weald cannot check",
    "sudo -s": "sudo starts a shell",
    "su -": "su starts a shell as another user",
    "cat > x <<EOF\n`touch PWNED`\nEOF": "a here-document runs backquoted commands",
    "echo x >> .git/config": "it writes into .git",
    "echo x > .git/hooks/pre-commit": "it writes into .git",
    "cd .git && echo x > config": "it writes into .git",
    "echo x > sub/.git/config": "it writes into .git",
    "echo x > ./.GIT/config": "it writes into .git",
    "echo '[tools]' > weald.toml": "it writes weald's own configuration",
    "echo x > .weald/skills/x/SKILL.md": "it writes weald's own configuration",
    "echo $(( '$(touch PWNED)' ))": "bash expands this text again where weald cannot follow it",
    "for x in $(cat list); do echo $((x)); done": "bash reads the value of x as code again",
    "echo $((_))": "bash reads the value of _ as code again (arithmetic), and it comes from _ set by bash",
    "echo `echo '`touch PWNED`'`": "backquotes inside backquotes without backslashes",
    "unshare": "unshare starts a shell reading the commands it runs from its input",
    "chroot /srv": "chroot starts a shell reading the commands it runs from its input",
    "script -q log.txt": "script starts a shell reading the commands it runs from its input",
    "doas -s": "doas starts a shell",
    "systemd-run -p ExecStartPre=/bin/true true": "systemd-run runs the commands its unit properties name",
    "flock lock -c": "flock runs a command line weald cannot find",
}


@pytest.mark.parametrize(("command", "concern"), CONCERNS.items())
def test_what_cannot_be_checked_is_asked_even_when_every_command_is_allowed(command: str, concern: str) -> None:
    decision, why = decide(command, ALLOW_EVERY_COMMAND)
    assert decision == "ask", why
    assert concern in why


def test_the_same_concerns_are_allowed_once_the_thing_is_checkable() -> None:
    for command in [
        "echo ok > out.txt",
        "bash -c 'touch PWNED'",
        "source ./env.sh",
        "cat <<'EOF'\n`id`\nEOF",
        "echo ok > .gitignore",
        "echo ok > docs/git/notes.md",
        "echo ok > weald.toml.bak",
        "echo $(( 1 + 2 )) $[ 3 * 4 ]",
        "echo $(( $(echo 1) + 2 ))",
        "for i in 1 2 3; do echo $((i * 2)); done",
        "x=5; echo $((x + 1)); (( x > 1 )) && echo big",
        "echo ${x:-default} ${#x} ${a[1]} ${s:1:2} \"${x:-'quoted'}\" ${x/a/b}",
        "[[ 3 -eq 3 ]] && echo ok",
        'for f in *.txt; do echo "$f"; done',
        "echo `echo \\`echo ok\\``",
        "flock lock -c 'echo ok'",
        "script -qc 'echo ok' /dev/null",
        "sg users 'echo ok'",
    ]:
        assert decide(command, ALLOW_EVERY_COMMAND) == (
            "allow",
            'tools.permissions.shell "*" = allow, for every command in it',
        ), command


# -- deny sees through spellings -----------------------------------------------------------------

# Each runs `rm -r -f victim`: the real bash run below deletes the directory.
DENIED_AND_RUN = [
    "rm -rf victim",
    "/bin/rm -rf victim",
    "/usr/bin/rm -rf victim",
    "rm -r -f victim",
    "rm -fr victim",
    "rm -rfv victim",
    "rm -r victim -f",
    "rm -R -f victim",
    "rm --recursive --force victim",
    "  rm -rf victim",
    "\trm -rf victim",
    "FOO=1 rm -rf victim",
    "FOO=1 BAR=2 /bin/rm -fr victim",
    "command rm -rf victim",
    "nice rm -rf victim",
    "nice -n 10 rm -rf victim",
    "env rm -rf victim",
    "env -i FOO=1 /bin/rm -rf victim",
    "echo victim | xargs rm -rf",
    "echo victim | xargs -n1 -I{} rm -rf {}",
    "timeout 5 rm -rf victim",
    "timeout -s KILL 5 rm -rf victim",
    "nohup rm -rf victim",
    "stdbuf -oL rm -rf victim",
    "time rm -rf victim",
    "setsid -w rm -rf victim",
    "find . -maxdepth 1 -name victim -exec rm -rf {} +",
    "\\rm -rf victim",
    "r''m -rf victim",
    '"rm" -rf victim',
    "$'\\x72m' -rf victim",
    "rm -{r,f} victim",
    "r\\\nm -rf victim",
    "echo ok; rm -rf victim",
    "echo ok && rm -rf victim",
    "echo $(rm -rf victim)",
    "bash -c 'rm -rf victim'",
    'sh -c "echo ok; rm -rf victim"',
    "eval 'rm -rf victim'",
    "bash <<< 'rm -rf victim'",
    "bash <<EOF\nrm -rf victim\nEOF",
    "env nice timeout 5 rm -rf victim",
    "trap 'rm -rf victim' EXIT",
    "exec rm -rf victim",
]


@pytest.mark.parametrize("command", DENIED_AND_RUN)
def test_a_deny_pattern_matches_every_spelling_of_the_command(command: str, tmp_path: Path) -> None:
    (tmp_path / "victim" / "deep").mkdir(parents=True)
    run_bash(command, tmp_path)
    assert not (tmp_path / "victim").exists(), "bash did not delete victim/: the case proves nothing"
    decision, why = decide(command)
    assert decision == "deny", why
    assert 'tools.permissions.shell "rm -rf *" = deny' in why


DENIED = [
    "sudo rm -rf victim",
    "sudo -u root -- rm -rf victim",
    "doas rm -rf victim",
    "watch -n 1 rm -rf victim",
    "su -c 'rm -rf victim' root",
    "git push --force",
    "git push -f origin main",
    "git -C . push --force",
    "git push origin --force",
]


@pytest.mark.parametrize("command", DENIED)
def test_a_deny_pattern_matches_behind_other_wrappers(command: str) -> None:
    decision, why = decide(command)
    assert decision == "deny", why


NOT_DENIED = [
    "rm -r victim",
    "rm victim",
    "rm -f victim",
    "echo rm -rf victim",
    "grep -rf rm victim",
    "git push origin",
]


@pytest.mark.parametrize("command", NOT_DENIED)
def test_a_deny_pattern_does_not_catch_commands_it_does_not_name(command: str) -> None:
    decision, why = decide(command)
    assert decision != "deny", why


def test_an_ask_pattern_outranks_allow_and_deny_outranks_both() -> None:
    assert decide("echo ok; curl x")[0] == "ask"
    assert decide("curl x; rm -rf y")[0] == "deny"
    assert decide("echo ok; curl x", {"*": "allow", "curl *": "ask"})[0] == "ask"


def test_the_default_applies_to_a_command_no_pattern_matches() -> None:
    assert decide("make") == ("ask", "default for shell (no pattern matched)")
    decision, why = decide("echo ok; make")
    assert (decision, why) == ("ask", 'default for shell: no pattern allows "make"')


def test_a_pattern_spanning_several_commands_never_allows_but_still_denies() -> None:
    assert decide("make && make test", {"make && make test": "allow"})[0] == "ask"
    assert decide("make && make install", {"make && make install": "deny"})[0] == "deny"


def test_redirections_resolve_against_the_calls_cwd_argument() -> None:
    assert decide("echo ok > ../x", cwd="sub")[0] == "allow"
    assert decide("echo ok > ../../x", cwd="sub")[0] == "ask"


def test_bounds_on_size_and_nesting_ask_instead_of_parsing_forever() -> None:
    huge = "echo ok; " * (MAX_COMMAND_BYTES // 9 + 1)
    decision, why = decide(huge)
    assert decision == "ask"
    assert "longer than" in why
    dense = "echo ok; " * (MAX_SYNTAX_NODES // 5 + 1)
    assert len(dense) < MAX_COMMAND_BYTES
    decision, why = decide(dense)
    assert decision == "ask"
    assert "too long to check" in why
    nested = "eval " * (MAX_DEPTH + 2) + "echo ok"
    decision, why = decide(nested, ALLOW_EVERY_COMMAND)
    assert decision == "ask"
    assert "nested more than" in why


def test_analyze_lists_each_simple_command_in_its_forms() -> None:
    line = analyze("FOO=1 sudo -u me /bin/rm -r -f x; echo ok")
    assert [c.text for c in line.commands] == ["FOO=1 sudo -u me /bin/rm -r -f x", "echo ok"]
    assert line.commands[0].forms == (
        ("FOO=1", "sudo", "-u", "me", "/bin/rm", "-r", "-f", "x"),
        ("sudo", "-u", "me", "/bin/rm", "-r", "-f", "x"),
        ("rm", "-r", "-f", "x"),
    )
    assert line.concerns == ()


def test_names_that_are_not_utf8_do_not_break_the_parser() -> None:
    command = "ls bad\udcffname.txt > out\udcfe.txt"
    assert decide(command)[0] == "allow"


# -- properties ---------------------------------------------------------------------------

ALLOWED_COMMANDS = ["echo ok", "git status", "ls -la", "cat notes.txt", "wc -l x"]
OTHER_COMMANDS = ["touch PWNED", "id", "make", "python3 -c 1"]
SEPARATORS = ["; ", " && ", " || ", " | ", " & ", "\n", " |& "]
WRAPS = [
    "{}",
    "( {} )",  # not `((`: bash reads that as arithmetic first
    "{{ {}; }}",
    "echo ok $( {} )",  # the spaces keep a nested `( ... )` from reading as `$((` arithmetic
    "echo ok `{}`",
    "bash -c '{}'",
    "if true; then {}; fi",
    "echo ok <({})",
]


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[str, bool]:
    """A command line of 1-5 simple commands, joined and nested at random; and whether all are allowed."""
    picks = draw(st.lists(st.sampled_from(ALLOWED_COMMANDS + OTHER_COMMANDS), min_size=1, max_size=5))
    line = picks[0]
    for pick in picks[1:]:
        line = line + draw(st.sampled_from(SEPARATORS)) + pick
        if draw(st.booleans()):
            wrap = draw(st.sampled_from(WRAPS))
            if any(q in wrap and q in line for q in "'`"):
                continue  # these quotes do not nest
            line = wrap.format(line)
    return line, all(p in ALLOWED_COMMANDS for p in picks)


@settings(max_examples=300, deadline=None)
@given(command_lines())
def test_a_command_line_is_allowed_exactly_when_every_command_in_it_is(case: tuple[str, bool]) -> None:
    line, all_allowed = case
    decision, why = decide(line, {**RULES, "true": "allow"})
    assert decision == ("allow" if all_allowed else "ask"), (line, why)


@st.composite
def rm_spellings(draw: st.DrawFn) -> str:
    program = draw(st.sampled_from(["rm", "/bin/rm", "\\rm", "'rm'", '"rm"', "r''m", "/usr/bin/rm"]))
    flags = draw(
        st.sampled_from([["-rf"], ["-fr"], ["-r", "-f"], ["-f", "-r"], ["-Rf"], ["-rfv"], ["--recursive", "-f"]])
    )
    operands = ["victim", *flags] if draw(st.booleans()) else [*flags, "victim"]
    command = " ".join([program, *operands])
    for _ in range(draw(st.integers(0, 3))):
        wrapper = draw(st.sampled_from(["sudo", "env", "env FOO=1", "nice", "nohup", "timeout 5", "command", "xargs"]))
        command = f"{wrapper} {command}"
    if draw(st.booleans()):
        command = f"FOO=1 {command}"  # assignments only in front: after `nice` it would be the program
    return draw(st.sampled_from(["{}", "echo ok; {}", "ls && {}", "bash -c '{}'", "echo $({})"])).format(command)


@settings(max_examples=300, deadline=None)
@given(rm_spellings())
def test_every_spelling_of_rm_rf_is_denied(command: str) -> None:
    decision, why = decide(command)
    assert decision == "deny", (command, why)


# -- the documented examples ------------------------------------------------------------------

_ROW = re.compile(r"^\| `(?P<command>.+?)` \| (?P<decision>allow|ask|deny) \|", re.MULTILINE)


def _section(text: str, title: str) -> str:
    start = text.index(title)
    end = text.find("\n## ", start)
    return text[start : end if end > 0 else None]


def test_every_example_in_the_configuration_docs_decides_as_documented() -> None:
    section = _section((ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"), "### How shell patterns match")
    blocks = re.findall(r"```toml\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1, "the section should have one pattern table"
    config = parse_config(blocks[0], source="docs/configuration.md")
    rules = RunnerConfig(permissions=dict(config.tools.permissions)).permissions
    rows = [(m["command"].replace("\\|", "|"), m["decision"]) for m in _ROW.finditer(section)]
    assert len(rows) >= 30
    assert {d for _, d in rows} == {"allow", "ask", "deny"}
    wrong = []
    for command, expected in rows:
        got, why = decide_permission(shell, {"command": command}, rules, scope=SCOPE)
        if got != expected:
            wrong.append(f"{command!r}: documented {expected}, decided {got} ({why})")
    assert wrong == []


# -- what bash expands a second time, wrappers, and .git (issue 22) ---------------------------------------

_LISTED = list(shell_attacks.attacks(wrapped=False))


@pytest.mark.parametrize("attack", _LISTED, ids=[f"{a.rules}:{a.command[:60]}" for a in _LISTED])
def test_a_command_bash_runs_from_text_it_expands_again_is_never_allowed(attack: Attack) -> None:
    ran = outcome(attack.command, git=attack.git)
    assert ran.touched or ran.removed, "bash did not run it: the case proves nothing"
    decision, why = shell_attacks.decide(attack.command, attack.table, PROJECT)
    assert decision == attack.expect, why


@pytest.fixture(scope="module")
def wrappers() -> None:
    """The programs of the wrapper attacks, installed (util-linux, coreutils, login and bsdutils are essential)."""
    for program, package in (("strace", "strace"), ("fakeroot", "fakeroot"), ("sudo", "sudo")):
        apt_install(
            package,
            present=lambda program=program: shutil.which(program) is not None,
            needed_for="the shell rules' wrapper attacks (each run by a real bash)",
        )


@pytest.mark.parametrize("command", shell_attacks.WRAPPED_RM)
def test_a_deny_pattern_sees_through_every_program_that_runs_another(command: str, wrappers: None) -> None:
    command = command.format(pid=os.getpid())
    ran = outcome(command)
    assert ran.removed, "bash did not delete victim/: the case proves nothing"
    decision, why = shell_attacks.decide(command, shell_attacks.ECHO_RULES, PROJECT)
    assert (decision, why.split(", matching")[0]) == ("deny", 'tools.permissions.shell "rm *" = deny'), why


@pytest.mark.parametrize("command", shell_attacks.WRAPPED_RM_DECIDED)
def test_a_deny_pattern_sees_through_wrappers_this_machine_cannot_run(command: str) -> None:
    decision, why = shell_attacks.decide(command, shell_attacks.ECHO_RULES, PROJECT)
    assert decision == "deny", why


@settings(max_examples=150, deadline=None)
@given(shell_attacks.nested_forms())
def test_differential_whatever_bash_runs_from_nested_quoting_and_expansion_is_not_allowed(command: str) -> None:
    ran = outcome(command, timeout=10)
    decision, why = shell_attacks.decide(command, shell_attacks.ECHO_RULES, PROJECT)
    assert shell_attacks.refused(decision, ran), (command, ran, decision, why)


def test_a_long_command_line_is_decided_in_linear_time() -> None:
    # `echo` and 16,000 x ('' and a backslash-newline): 48 KB that took 13-28 s of CPU (quadratic).
    command = "echo" + "''\\\n" * 16_000
    assert len(command) < MAX_COMMAND_BYTES
    started = time.thread_time()
    decision, _ = decide(command, {"echo *": "allow"})
    spent = time.thread_time() - started
    assert decision in ("allow", "ask")
    assert spent < 5.0, f"{spent:.1f} s of CPU for one decision"  # a bound far above linear (~0.1 s), far below 13 s
    dense = "echo " + "\"${x:-'$(( a[$(echo 1)] ))'}\" " * 1_500
    assert len(dense) < MAX_COMMAND_BYTES
    started = time.thread_time()
    decision, _ = decide(dense, {"echo *": "allow"})
    assert decision == "ask"
    assert time.thread_time() - started < 5.0


def test_bash_is_on_this_machine_for_the_real_runs() -> None:
    assert shutil.which("bash") is not None, "install bash: the attack cases run it"
