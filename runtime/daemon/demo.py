"""``weald demo``: a self-contained tour, on a fresh machine, with no API key.

It starts a real daemon (a subprocess, on a private socket, with fault
injection on), hosts three agents driven by the scripted model that do real
work with real tools in a temporary project, injects faults (a tool that
crashes, a subprocess killed mid-command, an agent that crashes mid-turn),
shows the supervisors restoring the tree, and prints the supervision tree and
a debug_state. Every claim it prints is checked; the exit code says whether
they all held.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from weald.runtime.daemon._render import SafeConsole, error_line, render_tree
from weald.runtime.daemon.client import Client, DaemonUnavailableError

__all__ = ["run_demo"]

CALC = '''"""A tiny calculator with a bug for the agents to find."""


def add(a, b):
    return a - b


def mul(a, b):
    return a * b
'''

TEST_CALC = """import unittest

from calc import add, mul


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)

    def test_add_negative(self):
        self.assertEqual(add(-1, 1), 0)


if __name__ == "__main__":
    unittest.main()
"""

FAULTS = """# Faults the demo injects (see docs/faults.md). Seeded: a run replays exactly.
seed = 7

[[faults]]
id = "grep-crash"           # the chaos agent's first grep raises
target = "tool"
kind = "crash"
tool = "grep"
agent = "/sessions/chaos/agent"
count = 1

[[faults]]
id = "kill-job"             # its shell job is killed half a second in
target = "tool"
kind = "kill_subprocess"
tool = "shell"
agent = "/sessions/chaos/agent"
seconds = 0.5
count = 1

[[faults]]
id = "agent-crash"          # the agent itself crashes on its third batch of tool results
target = "actor"
kind = "crash"
path = "/sessions/chaos/agent"
message = "ToolResults"
after = 2
count = 1
"""


def _scripts(python: str, sub_model: str) -> dict[str, list[dict[str, Any]]]:
    """The scripted models' turns, one list per agent."""

    def call(name: str, **arguments: Any) -> dict[str, Any]:
        return {"name": name, "arguments": arguments}

    return {
        "explorer": [
            {
                "text": "Let me look around the project.",
                "tool_calls": [call("glob", pattern="*.py"), call("read_file", path="README.md")],
            },
            {"text": "Now the functions.", "tool_calls": [call("grep", pattern="^def ", include="*.py")]},
            {
                "text": "I will track the work.",
                "tool_calls": [
                    call(
                        "tasks",
                        action="batch",
                        operations=[
                            {"op": "insert", "ref": "fix", "title": "Fix add() in calc.py"},
                            {"op": "insert", "ref": "test", "title": "Run the tests", "blocked_by": ["fix"]},
                            {"op": "insert", "title": "Note the fix in README.md", "blocked_by": ["test"]},
                        ],
                    )
                ],
            },
            {
                "text": "A sub-agent can check calc.py while I wait.",
                "tool_calls": [
                    call(
                        "sub_agent",
                        task="Read calc.py and say which function is wrong.",
                        tools=["read_file", "grep"],
                        model=sub_model,
                    )
                ],
            },
            {"text": "Plan: add() subtracts instead of adding (found by my sub-agent). Tasks 1-3 track the fix."},
        ],
        "sub": [
            {"tool_calls": [call("read_file", path="calc.py")]},
            {"text": "add() returns a - b; it should return a + b."},
        ],
        "fixer": [
            {"text": "Reading calc.py first.", "tool_calls": [call("read_file", path="calc.py")]},
            {
                "text": "Fixing add().",
                "tool_calls": [call("edit_file", path="calc.py", old_string="return a - b", new_string="return a + b")],
            },
            {"text": "Running the tests.", "tool_calls": [call("shell", command=f"{python} -m unittest -q test_calc")]},
            {"text": "Marking the task done.", "tool_calls": [call("tasks", action="update", id="1", status="done")]},
            {"text": "Fixed add(); the 3 tests pass. Task 1 is done, which unblocked task 2."},
        ],
        "chaos": [
            {"text": "Searching.", "tool_calls": [call("grep", pattern="def")]},
            {"text": "grep crashed (an injected fault); the runner turned it into an error result and I carried on."},
            {"text": "Starting the slow job.", "tool_calls": [call("shell", command="sleep 30; echo finished")]},
            {"text": "The job's process group was killed; I got an error result, not a hang."},
            {"text": "Reading the notes.", "tool_calls": [call("read_file", path="NOTES.md")]},
            {"text": "I was restarted by my session supervisor and reloaded my history from the store."},
        ],
    }


class _Demo:
    def __init__(self, root: Path, console: Console, *, quiet: bool) -> None:
        self.root = root
        self.console = console
        self.quiet = quiet
        self.project = root / "project"
        self.socket = root / "run" / "weald.sock"
        self.config = root / "weald.toml"
        self.faults = root / "faults.toml"
        self.log = root / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.checks: list[tuple[str, bool, str]] = []
        self.models: dict[str, str] = {}

    # -- setting up ----------------------------------------------------------------------------

    def prepare(self) -> None:
        self.project.mkdir()
        (self.project / "calc.py").write_text(CALC)
        (self.project / "test_calc.py").write_text(TEST_CALC)
        (self.project / "README.md").write_text("# calc\n\nA calculator. `add` and `mul`.\n")
        (self.project / "NOTES.md").write_text("- add() looks wrong\n")
        self.config.write_text(
            f'[store]\npath = "{self.root / "store.db"}"\n'
            f'[server]\nsocket = "{self.socket}"\n'
            "# The demo lets its agents edit and run commands without asking.\n"
            '[tools.permissions]\nedit_file = "allow"\nwrite_file = "allow"\nshell = "allow"\n'
        )
        self.faults.write_text(FAULTS)
        scripts = self.root / "scripts"
        scripts.mkdir()
        sub_model = f"scripted:{scripts / 'sub.json'}"
        for name, turns in _scripts(sys.executable, sub_model).items():
            path = scripts / f"{name}.json"
            path.write_text(json.dumps({"turns": turns}, indent=1))
            self.models[name] = f"scripted:{path}"

    def start_daemon(self) -> None:
        env = dict(os.environ, WEALD_CONFIG=str(self.config))
        args = [
            sys.executable,
            "-m",
            "weald.runtime.daemon.cli",
            "serve",
            "--socket",
            str(self.socket),
            "--faults",
            str(self.faults),
        ]
        with self.log.open("ab") as log:
            # Our own interpreter running our own module: no untrusted input.
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=log, cwd=self.project)  # noqa: S603
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                msg = f"the daemon exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}"
                raise RuntimeError(msg)
            try:
                with Client.connect(self.socket, timeout=1) as client:
                    client.call("daemon.status", timeout=10)
                    return
            except (DaemonUnavailableError, OSError):
                time.sleep(0.1)
        msg = "the daemon did not answer within 90 s"
        raise RuntimeError(msg)

    def stop_daemon(self) -> int:
        if self.proc is None:
            return 0
        try:
            with Client.connect(self.socket) as client:
                client.call("daemon.stop", timeout=10)
        except Exception:
            self.proc.terminate()
        code = self.proc.wait(60)
        self.proc = None
        return code

    # -- helpers ------------------------------------------------------------------------------------

    def say(self, text: str | Panel) -> None:
        if not self.quiet:
            self.console.print(text)

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        self.checks.append((what, ok, detail))
        mark = "[green]✓[/green]" if ok else "[red]✗[/red]"
        self.say(f"  {mark} {what}" + (f" [dim]({detail})[/dim]" if detail and not ok else ""))

    def prompt(self, client: Client, agent: str, text: str, follow: Callable[[], None]) -> Any:
        pending = client.request("agent.prompt", {"agent_id": agent, "text": text})
        while not pending.done():
            follow()
        return pending.get()

    # -- the tour -------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        with Client.connect(self.socket) as client:
            client.call(
                "events.subscribe",
                {
                    "topics": [
                        "tool.started",
                        "tool.failed",
                        "fault.injected",
                        "supervisor.child_crashed",
                        "supervisor.child_restarted",
                        "agent.recovered",
                    ]
                },
            )

            def follow() -> None:
                self._show_events(client)

            for name in ["explorer", "fixer", "chaos"]:
                client.call(
                    "agent.start", {"working_dir": str(self.project), "model": self.models[name], "agent_id": name}
                )
            self.say("\n[bold]1. Three agents start, each its own supervised session.[/bold]")

            self.say("\n[bold]2. The explorer surveys the project, plans tasks and delegates to a sub-agent.[/bold]")
            explorer = self.prompt(client, "explorer", "Survey the project and plan the work.", follow)
            self.check("the explorer finished its turn", explorer["ok"], str(explorer.get("error")))
            history = client.call("agent.history", {"agent_id": "explorer"})["messages"]
            sub = next((m for m in history if m["role"] == "tool" and m["name"] == "sub_agent"), None)
            self.check("its sub-agent found the bug", bool(sub and "a + b" in sub["content"]), str(sub))
            tasks = client.call("tasks.list", {"working_dir": str(self.project)})["tasks"]
            self.check("three tasks tracked in the store, chained by dependencies", len(tasks) == 3, str(tasks))

            self.say("\n[bold]3. The fixer edits calc.py and runs the tests, for real.[/bold]")
            fixer = self.prompt(client, "fixer", "Fix the bug in calc.py and run the tests.", follow)
            self.check("the fixer finished its turn", fixer["ok"], str(fixer.get("error")))
            self.check("calc.py is fixed on disk", "return a + b" in (self.project / "calc.py").read_text())
            history = client.call("agent.history", {"agent_id": "fixer"})["messages"]
            shell = next((m for m in history if m["role"] == "tool" and m["name"] == "shell"), None)
            self.check("the tests pass under the shell tool", bool(shell and not shell["is_error"]), str(shell))
            ready = client.call("tasks.list", {"working_dir": str(self.project), "view": "ready"})["tasks"]
            self.check("finishing task 1 unblocked task 2", [t["id"] for t in ready] == ["2"], str(ready))

            self.say("\n[bold]4. Faults: a tool crashes, a subprocess is killed, the agent itself crashes.[/bold]")
            first = self.prompt(client, "chaos", "Search the code.", follow)
            chaos = client.call("agent.history", {"agent_id": "chaos"})["messages"]
            grep = next((m for m in chaos if m["role"] == "tool" and m["name"] == "grep"), None)
            self.check(
                "an injected tool crash became an error result",
                bool(grep and grep["is_error"] and first["ok"]),
                str(grep),
            )
            second = self.prompt(client, "chaos", "Run the slow job.", follow)
            chaos = client.call("agent.history", {"agent_id": "chaos"})["messages"]
            shell = next((m for m in chaos if m["role"] == "tool" and m["name"] == "shell"), None)
            self.check(
                "the killed job became an error result, not a hang",
                bool(shell and shell["is_error"] and second["ok"]),
                str(shell),
            )
            third = self.prompt(client, "chaos", "Read the notes.", follow)
            self.check(
                "the agent crashed mid-turn and the turn was reported interrupted",
                bool(third.get("interrupted")),
                str(third),
            )
            fourth = self.prompt(client, "chaos", "Are you all right?", follow)
            self.check("the restarted agent answers, its history intact", fourth["ok"], str(fourth.get("error")))
            chaos = client.call("agent.history", {"agent_id": "chaos"})["messages"]
            self.check("every message survived the crash", len(chaos) >= 11, f"{len(chaos)} messages")

            tree = client.call("tree")
            state = client.call("debug_state", {"agent_id": "chaos", "events": 200, "messages": 3})
            session = next(n for n in tree["children"] if n["path"] == "/sessions")
            chaos_node = next(n for n in session["children"] if n["path"] == "/sessions/chaos")
            agent_node = next(n for n in chaos_node["children"] if n["path"] == "/sessions/chaos/agent")
            self.check(
                "the supervision tree is whole again, the agent restarted once",
                agent_node["restarts"] == 1 and agent_node["status"] == "running",
                str(agent_node),
            )
            faults = client.call("fault.list")
            fired = {f["id"]: f["fires"] for f in faults["faults"]}
            self.check(
                "all three faults fired, once each",
                fired == {"grep-crash": 1, "kill-job": 1, "agent-crash": 1},
                str(fired),
            )
            follow()
        return {"tree": tree, "debug_state": state, "faults": faults}

    def _show_events(self, client: Client) -> None:
        note = client.next_notification(timeout=0.05)
        if note is None or note[0] != "event" or self.quiet:
            return
        event = note[1]["event"]
        topic, data, source = event["topic"], event["data"], event["source"]
        who = source.split("/")[2] if source.startswith("/sessions/") and source.count("/") >= 2 else source
        if topic == "tool.started":
            self.say(f"    [cyan]{who}[/cyan] ▶ {data['tool']} [dim]{json.dumps(data.get('arguments', {}))[:90]}[/dim]")
        elif topic == "tool.failed":
            error = escape(error_line(data.get("error", ""), 110))
            self.say(f"    [cyan]{who}[/cyan] [yellow]✗ {data['tool']}: {error}[/yellow]")
        elif topic == "fault.injected":
            self.say(f"    [red]⚡ fault {data.get('id')} ({data.get('kind')}) fired at {source}[/red]")
        elif topic == "supervisor.child_crashed":
            error = escape(error_line(data.get("error"), 100))
            self.say(f"    [magenta]{source}: child {data['id']} crashed: {error}[/magenta]")
        elif topic == "supervisor.child_restarted":
            self.say(f"    [green]{source}: restarted {data['id']} (restart {data['restarts']})[/green]")
        elif topic == "agent.recovered":
            self.say(
                f"    [green]{who}: recovered from the store; "
                f"interrupted turn {data.get('interrupted_turn')} reported[/green]"
            )


def run_demo(*, json_output: bool = False, keep: bool = False) -> int:
    """Run the demo; returns 0 when every check held."""
    console = SafeConsole(highlight=False)
    root = Path(tempfile.mkdtemp(prefix="weald-demo-"))
    demo = _Demo(root, console, quiet=json_output)
    demo.say(
        Panel.fit(
            "[bold]weald demo[/bold]: a daemon hosting agents under OTP supervision trees.\n"
            "The model is [bold]scripted[/bold] (it replays fixed turns; no API key needed), "
            "but every tool call is real:\n"
            "real files, a real shell, a real store, real supervisors, real injected faults.",
            border_style="blue",
        )
    )
    outcome: dict[str, Any] = {}
    code = 1
    try:
        demo.prepare()
        with (
            console.status("starting the daemon (fault injection on)...", spinner="dots")
            if not json_output
            else _nothing()
        ):
            demo.start_daemon()
        demo.say(f"daemon up on {demo.socket}; project in {demo.project}")
        outcome = demo.run()
        if not json_output:
            console.print(
                "\n[bold]5. The supervision tree after the faults[/bold] (restarts counted by each supervisor):"
            )
            console.print(render_tree(_trim(outcome["tree"])))
            console.print("\n[bold]6. debug_state of the agent that crashed[/bold]:")
            console.print(_state_table(outcome["debug_state"]))
    except Exception as exc:
        demo.check("the demo ran to the end", False, f"{type(exc).__name__}: {exc}")
    finally:
        stopped = demo.stop_daemon()
        demo.check("the daemon stopped cleanly (exit 0)", stopped == 0, f"exit {stopped}")
        failed = [c for c in demo.checks if not c[1]]
        code = 0 if not failed else 1
        if json_output:
            sys.stdout.write(
                json.dumps(
                    {
                        "ok": not failed,
                        "checks": [{"check": w, "ok": o, "detail": d} for w, o, d in demo.checks],
                        **outcome,
                    },
                    indent=2,
                    default=str,
                )
                + "\n"
            )
        else:
            _closing(console, demo, failed)
        if keep or failed:
            demo.say(f"[dim]kept {root} (daemon log: {demo.log})[/dim]")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return code


class _nothing:  # noqa: N801 - a context manager standing in for a spinner
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _trim(node: dict[str, Any]) -> dict[str, Any]:
    """Hide the tool runner's per-call children (they come and go) to keep the tree readable."""
    node = dict(node)
    node["children"] = [_trim(c) for c in node["children"] if not c["path"].endswith("/calls")]
    return node


def _state_table(state: dict[str, Any]) -> Table:
    table = Table(show_header=False, box=None)
    table.add_row("agent", state["agent"])
    table.add_row("status", state["status"])
    table.add_row("restarts", str(state["restarts"]))
    table.add_row("messages", str(state["message_count"]))
    table.add_row("usage", f"{state['usage']['input_tokens']} in / {state['usage']['output_tokens']} out tokens")
    table.add_row("tools", ", ".join(state["tools"]))
    table.add_row("place in tree", " → ".join(n["path"] for n in state["tree"]))
    shown = ("agent.recovered", "agent.turn_end", "agent.error", "fault.injected")
    for event in [e for e in state["recent_events"] if e["topic"] in shown][-6:]:
        data = {k: v for k, v in event["data"].items() if k not in ("session_id", "agent_id", "usage")}
        table.add_row("event", f"{event['topic']} {json.dumps(data)[:110]}")
    return table


def _closing(console: Console, demo: _Demo, failed: list[tuple[str, bool, str]]) -> None:
    held = len(demo.checks) - len(failed)
    verdict = "[green]all checks held[/green]" if not failed else f"[red]{len(failed)} checks failed[/red]"
    console.print(
        Panel.fit(
            f"{verdict} ({held}/{len(demo.checks)}).\n\n"
            "The model in this demo was [bold]scripted[/bold]. To use a real one, put in weald.toml\n"
            "(in your project, or ~/.weald/weald.toml):\n\n"
            '  \\[models]\n  default = "openai:gpt-4.1"          # or "anthropic:claude-sonnet-4-5"\n\n'
            '  \\[providers.openai]\n  api_key_env = "OPENAI_API_KEY"     # the NAME of the variable holding the key\n'
            '  # base_url = "http://localhost:8000/v1"  for vLLM, llama.cpp, Ollama, LM Studio, OpenRouter\n\n'
            'then [bold]weald serve[/bold] and [bold]weald run "..."[/bold]. See docs/configuration.md.',
            border_style="green" if not failed else "red",
            title="done",
        )
    )
