"""Attacks on the shell permission rules, on the terminal and on secrets in MCP configs (issue 22): counted.

`run_rule_attacks` tries three kinds of attack and counts each tried and refused:

- shell rules: every listed attack of ``tests/tools/shell_attacks.py`` (text
  bash expands a second time, programs that run another, a ``.git/config``
  rewrite chained into ``git status``), each run first by a real bash,
  which must really do what it hides (create ``PWNED``, delete
  ``victim/``), then decided: refused means the decision the attack calls
  for (``ask``, or ``deny`` for a hidden ``rm``); the wrappers this machine
  cannot run, decided only; then ``examples`` command lines drawn from the
  generator of nested quoting and expansion forms, each run by bash and
  decided, where refused means that whatever ran unallowed was not allowed
  (the differential property). Over-asked counts generated lines that ran
  nothing unallowed and were asked about all the same;
- terminal: hostile texts (window titles, clipboard writes, clear-screen, a
  one-byte CSI, bidirectional overrides, a lone surrogate...) printed by the
  CLI's console (`weald.runtime.daemon._render.SafeConsole`), bare and as
  table cells, markup or not: refused means no character that steers a
  terminal reached the output;
- secrets: values known only by their shape (a URL with a password, keys
  and tokens with known prefixes) in an MCP server's ``env`` and ``args``,
  through ``weald mcp import``'s translation and ``weald config``'s view:
  refused means the value is in neither.

Each attack is one invariant (``refused:<kind>``).
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from collections import Counter
from pathlib import Path

import shell_attacks
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from rel_store import ResourceReport
from rich.table import Table
from weald.runtime.daemon._mcp_import import server_tables, translate
from weald.runtime.daemon._render import SafeConsole
from weald.runtime.daemon.config import config_to_dict, parse_config

# Everything a terminal acts on but tab and newline.
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)

TERMINAL_PAYLOADS = {
    "window title (OSC 0)": "\x1b]0;owned\x07",
    "clipboard write (OSC 52)": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "clear screen (CSI 2J)": "\x1b[2J\x1b[H",
    "erase line, cursor back": "ok\x1b[2K\x1b[200Dshell wants to run: ls",
    "one-byte C1 CSI": "\x9b2J",
    "device control string": "\x1bPq#0;2;0;0;0\x1b\\",
    "full reset (ESC c)": "\x1bc",
    "carriage return overwrite": "rm -rf victim\rls -la       ",
    "backspaces": "rm -rf victim" + "\b" * 13 + "ls",
    "right-to-left override": "txt.\u202eexe",
    "isolates": "\u2066a\u2069\u2067b\u2069",
    "line separator": "a\u2028b",
    "lone surrogate": "a\ud800b",
    "bell": "\x07\x07",
}

SECRET_VALUES = {
    "URL with a password": "postgres://admin:pw-9d8c7b6a5f@db.internal/app",
    "Anthropic key": "sk-ant-api03-Qm4r7Tx2Vb9Nc5Lk8Hj3Gf6Dd1Ss0Aa",
    "OpenAI key": "sk-proj-Ab3De5Gh7Jk9Lm2Np4Qr6St8Vw0Xy",
    "GitHub token": "ghp_Ab3De5Gh7Jk9Lm2Np4Qr6St8Vw0Xy1Za3",
    "GitHub fine-grained token": "github_pat_11AB3DE5GH7JK9LM2NP4QR6ST8",
    "GitLab token": "glpat-Ab3De5Gh7Jk9Lm2Np4Qr",
    "Slack bot token": "xoxb-1234567890-abcdefghijkl",
    "AWS access key id": "AKIAIOSFODNN7EXAMPLE",
    "Google API key": "AIzaSyAb3De5Gh7Jk9Lm2Np4Qr6St8Vw0Xy1Za5",
    "Hugging Face token": "hf_Ab3De5Gh7Jk9Lm2Np4Qr6St8Vw0",
    "Stripe secret key": "sk_live_Ab3De5Gh7Jk9Lm2Np4Qr",
    "JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
}


def run_rule_attacks(root: Path, *, examples: int = 200, seed: int = 2025) -> ResourceReport:
    """Every attack of the three kinds; an invariant per attack (see the module docstring)."""
    report = ResourceReport()
    root.mkdir(parents=True, exist_ok=True)
    tally: Counter[str] = Counter()
    _shell_listed(report, tally)
    _shell_generated(report, tally, examples, seed)
    _terminal(report, tally)
    _secrets(report, tally, root)
    for kind in ("shell, listed", "shell, decided only", "shell, generated", "terminal", "secrets"):
        report.figures[f"{kind}: tried / refused"] = f"{tally[kind + ' tried']} / {tally[kind + ' refused']}"
    report.figures["shell, listed: proven by a real bash"] = tally["shell, listed proven"]
    report.figures["shell, generated: ran something unallowed"] = tally["shell, generated ran"]
    report.figures["shell, generated: over-asked (ran nothing, asked)"] = tally["shell, generated over-asked"]
    return report


def _shell_listed(report: ResourceReport, tally: Counter[str]) -> None:
    project = Path(tempfile.gettempdir()) / "weald-rule-attacks"
    for attack in shell_attacks.attacks():
        ran = shell_attacks.outcome(attack.command, git=attack.git)
        decision, why = shell_attacks.decide(attack.command, attack.table, project)
        proven = ran.touched or ran.removed
        held = decision == attack.expect
        tally["shell, listed tried"] += 1
        tally["shell, listed proven"] += proven
        tally["shell, listed refused"] += held
        problems = [] if held else [f"{attack.command!r}: decided {decision} ({why}), expected {attack.expect}"]
        if not proven:
            problems.append(f"{attack.command!r}: bash did not run what it hides (a program missing?)")
        report.check("refused:shell, listed", problems)
    for command in shell_attacks.WRAPPED_RM_DECIDED:
        decision, why = shell_attacks.decide(command, shell_attacks.ECHO_RULES, project)
        tally["shell, decided only tried"] += 1
        tally["shell, decided only refused"] += decision == "deny"
        report.check("refused:shell, decided only", [] if decision == "deny" else [f"{command!r}: {decision} ({why})"])


def _shell_generated(report: ResourceReport, tally: Counter[str], examples: int, seed: int) -> None:
    project = Path(tempfile.gettempdir()) / "weald-rule-attacks"

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(shell_attacks.nested_forms())
    def one(command: str) -> None:
        ran = shell_attacks.outcome(command, timeout=10)
        decision, why = shell_attacks.decide(command, shell_attacks.ECHO_RULES, project)
        held = shell_attacks.refused(decision, ran)
        tally["shell, generated tried"] += 1
        tally["shell, generated refused"] += held
        if ran.touched or ran.removed:
            tally["shell, generated ran"] += 1
        elif decision != "allow":
            tally["shell, generated over-asked"] += 1
        report.check(
            "refused:shell, generated", [] if held else [f"{command!r}: ran {ran}, decided {decision} ({why})"]
        )

    one()


def _terminal(report: ResourceReport, tally: Counter[str]) -> None:
    for name, payload in TERMINAL_PAYLOADS.items():
        out = io.StringIO()
        console = SafeConsole(file=out, force_terminal=False, width=200, highlight=False)
        console.print(f"shell wants to run: {payload}", markup=False)
        console.print(f"[bold]{payload}[/bold]")
        table = Table("title")
        table.add_row(payload)
        console.print(table)
        found = sorted({repr(c) for c in _CONTROL.findall(out.getvalue())})
        tally["terminal tried"] += 1
        tally["terminal refused"] += not found
        report.check("refused:terminal", [f"{name}: {found} reached the output"] if found else [])


def _secrets(report: ResourceReport, tally: Counter[str], root: Path) -> None:
    for name, secret in SECRET_VALUES.items():
        problems: list[str] = []
        foreign = {
            "mcpServers": {
                "in-env": {"command": "npx", "args": ["server"], "env": {"SETTING": secret}},
                "in-args": {"command": "npx", "args": ["server", "--with", secret]},
            }
        }
        _, servers, notes = translate(foreign)
        written = server_tables(servers)
        if secret in written or secret in json.dumps(notes):
            problems.append(f"{name}: written by weald mcp import")
        if "in-args" in servers:
            problems.append(f"{name}: a server with it on its command line was imported")
        toml = f'[mcp.servers.handwritten]\ncommand = "npx"\n[mcp.servers.handwritten.env]\nSETTING = "{secret}"\n'
        shown = json.dumps(config_to_dict(parse_config(toml, source=str(root / "weald.toml"))))
        if secret in shown:
            problems.append(f"{name}: shown by weald config")
        tally["secrets tried"] += 1
        tally["secrets refused"] += not problems
        report.check("refused:secrets", problems)


if __name__ == "__main__":  # a quick run by hand
    result = run_rule_attacks(Path(tempfile.mkdtemp()), examples=int(os.environ.get("EXAMPLES", "50")))
    print(json.dumps(result.figures, indent=2), [c for c in result.checks if not c.held])
