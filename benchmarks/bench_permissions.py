"""What deciding a shell call's permission costs: bash's grammar + pattern matching, beside plain prefix globs.

For each command line, per decision, in microseconds (median of single
decisions, the contenders interleaved in rounds):

- ``prefix``: what weald did before: every pattern of ``[tools.permissions.shell]``
  tried as ``fnmatch`` on the whole command text, the strictest match wins
  (reproduced here; it let ``echo ok; touch PWNED`` through ``"echo ok*"``);
- ``shell rules``: `decide_permission` with the shell tool as the runner calls
  it: the command line parsed with tree-sitter-bash into its simple commands,
  each matched in its forms (tools/_bash.py, tools/_shellrules.py);
- ``parse only``: `weald.tools._bash.analyze` alone, to show where the time goes.

Command lines: a plain ``git status``; a typical compound one
(``cd src && make test 2>&1 | tail -20``); a ``bash -c`` with ``$( )`` and a
wrapper; a 200-line here-document writing a file; and the 64 KiB worst case
(7,000 ``echo ok;`` commands, at the parse limit); 16,000 ``''`` each followed by a
backslash-newline (48 KB, once quadratic); and 1,500 nested expansions bash reads
twice (43 KB). Two rule tables: the
documented one (7 patterns) and one of 60 patterns.

Run: ``python benchmarks/bench_permissions.py [--quick]``.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from weald.runtime.agents.tool_runner import decide_permission
from weald.tools import PermissionScope
from weald.tools._bash import MAX_COMMAND_BYTES, analyze
from weald.tools.shell import shell

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, interleave, quick_main, summary

_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
SCOPE = PermissionScope(Path("/work/project"), (Path("/work/outputs"),))

DOCUMENTED = {
    "git status*": "allow",
    "git diff*": "allow",
    "ls*": "allow",
    "cd *": "allow",
    "echo *": "allow",
    "rm -rf *": "deny",
    "git push*": "ask",
}
MANY = {
    **DOCUMENTED,
    **{f"tool{i} --flag*": "allow" for i in range(40)},
    **{f"danger{i} -rf *": "deny" for i in range(10)},
    **{f"maybe{i} *": "ask" for i in range(3)},
}

HEREDOC = (
    "cat > notes/report.md <<'EOF'\n"
    + "".join(f"line {i}: some text $(not run) `nor this`\n" for i in range(200))
    + "EOF"
)
WORST = "echo ok; " * ((MAX_COMMAND_BYTES - 16) // len("echo ok; "))
# What made the old check quadratic (issue 22: 13-28 s of CPU): 16,000 empty strings, each
# followed by a backslash-newline; and text bash expands a second time, nested.
CONTINUED = "echo" + "''\\\n" * 16_000
NESTED = "echo " + "\"${x:-'$(( a[$(echo 1)] ))'}\" " * 1_500

COMMANDS = {
    "git status": "git status",
    "compound": "cd src && make test 2>&1 | tail -20",
    "bash -c, $( ), wrapper": "timeout 60 bash -c 'git diff $(git merge-base HEAD main) -- src | wc -l'",
    "200-line here-doc": HEREDOC,
    "64 KiB, 7,000 commands": WORST,
    "48 KB, 16,000 '' + \\-newline": CONTINUED,
    "43 KB, nested expansions": NESTED,
}


def prefix_decision(subject: str, rules: Mapping[str, str]) -> tuple[str, str]:
    """The old rule: fnmatch on the whole subject, strictest match wins, else the default."""
    matched = [(perm, pattern) for pattern, perm in rules.items() if fnmatch.fnmatchcase(subject, pattern)]
    if not matched:
        return "ask", "default for shell (no pattern matched)"
    perm, pattern = max(matched, key=lambda m: _STRICTNESS[m[0]])
    return perm, f'tools.permissions.shell "{pattern}" = {perm}'


def _sampler(fn: Callable[[], Any]) -> Callable[[int], list[float]]:
    import time

    def sample(n: int) -> list[float]:
        out = []
        perf = time.perf_counter
        for _ in range(n):
            began = perf()
            fn()
            out.append((perf() - began) * 1e6)
        return out

    return sample


def run(quick: bool = False) -> list[Row]:
    banner("bench_permissions: one shell permission decision")
    rows: list[Row] = []
    for table_name, table in (("documented, 7 patterns", DOCUMENTED), ("60 patterns", MANY)):
        rules: dict[str, Any] = {"shell": table}
        print(f"\nrules: {table_name}")
        print(f"  {'command line':<26} {'prefix':>10} {'shell rules':>12} {'parse only':>11} {'ratio':>8}  decisions")
        for label, command in COMMANDS.items():
            heavy = len(command) > 4096
            ops = (5 if quick else 20) if heavy else (100 if quick else 500)
            arguments = {"command": command}
            new = decide_permission(shell, arguments, rules, scope=SCOPE)
            old = prefix_decision(command, table)
            figures = interleave(
                {
                    "prefix": _sampler(lambda c=command, t=table: prefix_decision(c, t)),
                    "shell rules": _sampler(lambda a=arguments, r=rules: decide_permission(shell, a, r, scope=SCOPE)),
                    "parse only": _sampler(lambda c=command: analyze(c)),
                },
                ops=ops,
                rounds=3 if quick else 5,
            )
            ratio = figures["shell rules"] / figures["prefix"]
            print(
                f"  {label:<26} {figures['prefix']:>8.1f}us {figures['shell rules']:>10.1f}us "
                f"{figures['parse only']:>9.1f}us {ratio:>7.0f}x  before {old[0]}, now {new[0]}"
            )
            rows.append(
                Row(
                    "permissions",
                    f"{label} ({table_name})",
                    figures["shell rules"],
                    "us",
                    note=f"prefix {figures['prefix']:.1f} us ({ratio:.0f}x); parse {figures['parse only']:.1f} us; "
                    f"decides {new[0]} (prefix said {old[0]})",
                )
            )
    return summary(rows)


def main() -> None:
    quick_main(run, __doc__)


if __name__ == "__main__":
    main()
