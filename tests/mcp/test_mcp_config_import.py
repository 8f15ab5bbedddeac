"""Configuration that fits the ecosystem: ${VAR} expansion, the inherited environment, imports, weald mcp.

The daemon tests run a real ``weald serve`` with real servers (server-everything
prints its environment with ``get-env``; mcp-server-time from a Claude Desktop
config file read live); the CLI tests run the real ``weald mcp`` commands.
"""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path

import pytest
from weald.runtime import scan_proc
from weald.runtime.daemon._mcp_import import read_foreign_config, remove_server_tables, translate
from weald.runtime.daemon.config import parse_config
from weald.runtime.mcp import MCPConfigError, ServerConfig

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))  # the daemon harness, shared

from daemon_harness import DaemonProcess

TOKEN = "tok-7f3a9c1e5b2d4e6f8a0b"  # the value of a secret-looking variable; no output may show it


# -- ${VAR} ------------------------------------------------------------------------------------------------


def test_variables_expand_with_defaults_and_a_missing_one_names_the_field() -> None:
    config = ServerConfig(
        name="s",
        command="${TOOL_HOME:-/opt/tool}/bin/serve",
        args=["--user", "${USER_NAME}", "--literal", "$${NOT_A_VARIABLE}"],
        env={"GREETING": "hello ${USER_NAME}", "EMPTY": "${EMPTY_ONE:-fallback}"},
        environ={"USER_NAME": "ada", "EMPTY_ONE": ""},
    )
    assert config.variables() == ["TOOL_HOME", "USER_NAME", "EMPTY_ONE"]
    resolved = config.resolved()
    assert resolved.command == "/opt/tool/bin/serve"
    assert resolved.args == ("--user", "ada", "--literal", "${NOT_A_VARIABLE}")
    assert resolved.env == {"GREETING": "hello ada", "EMPTY": "fallback"}
    assert config.env["GREETING"] == "hello ${USER_NAME}"  # the config itself keeps what was written

    missing = ServerConfig(
        name="s", url="https://x.example/mcp", headers={"Authorization": "Bearer ${NO_SUCH}"}, environ={}
    )
    with pytest.raises(MCPConfigError) as failed:
        missing.resolved()
    assert str(failed.value) == (
        "MCP server 's': headers.Authorization uses ${NO_SUCH}, which is not set in the daemon's environment; "
        "set it where the daemon starts, or give a default (${NO_SUCH:-value})"
    )
    templated = ServerConfig(name="s", url="${MCP_URL:-https://x.example/mcp}", environ={"MCP_URL": "ftp://no"})
    with pytest.raises(MCPConfigError, match="url must be an absolute http:// or https:// URL, not 'ftp://no'"):
        templated.resolved()
    assert ServerConfig(name="s", url="${MCP_URL:-https://x.example/mcp}", environ={}).resolved().url == (
        "https://x.example/mcp"
    )
    with pytest.raises(MCPConfigError, match=r"args\[0\]: a \$\{ is not closed"):
        ServerConfig(name="s", command="x", args=["${OOPS"])
    with pytest.raises(MCPConfigError, match=r"env.A: \$\{1BAD\} is not \$\{NAME\}"):
        ServerConfig(name="s", command="x", env={"A": "${1BAD}"})


@pytest.fixture
def env_daemon(tmp_path: Path, node: str, everything_js: Path):
    config = f"""
[mcp.servers.everything]
command = "{node}"
args = ["{everything_js}", "stdio"]

[mcp.servers.everything.env]
GREETING = "hello ${{WEALD_TEST_GREETING}}"
FALLBACK = "${{WEALD_TEST_UNSET:-the default}}"
API_TOKEN = "${{WEALD_TEST_API_TOKEN}}"

[mcp.servers.needs_a_variable]
command = "{node}"
args = ["{everything_js}", "${{WEALD_TEST_NOT_SET}}"]

[tools.permissions]
"mcp__everything__get-env" = "allow"
"""
    return DaemonProcess(tmp_path, extra_config=config)


def test_a_stdio_server_gets_the_safe_variables_its_env_and_expanded_values_never_shown(
    env_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = env_daemon
    monkeypatch.setenv("WEALD_TEST_GREETING", "from the daemon")
    monkeypatch.setenv("WEALD_TEST_API_TOKEN", TOKEN)
    monkeypatch.setenv("WEALD_TEST_PRIVATE", "not for servers")
    try:
        d.start()
        d.wait_mcp("everything")
        model = d.script(
            "env", [{"tool_calls": [{"name": "mcp__everything__get-env", "arguments": {}}]}, {"text": "ok"}]
        )
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "e"})
            assert c.call("agent.prompt", {"agent_id": "e", "text": "env?"}, timeout=60)["ok"]
            output = c.call("agent.history", {"agent_id": "e"})["messages"][2]["content"]
            servers = {s["server"]: s for s in c.call("mcp.servers")}
            shown = json.dumps(servers) + json.dumps(c.call("debug_state", {"events": 500}))
        env = json.loads(output)
        assert env["GREETING"] == "hello from the daemon"
        assert env["FALLBACK"] == "the default"
        assert env["API_TOKEN"] == "[redacted]"  # the server saw the token; the history never holds it
        # The SDK's safe list, plus the server's own env and weald's process mark (how a
        # restarted daemon finds what its predecessor left), and nothing else of the daemon's.
        assert "WEALD_TEST_PRIVATE" not in env
        assert "WEALD_CONFIG" not in env
        assert env["WEALD_PROCESS_MARK"].count(".") == 2  # <state dir>.<daemon>.<random>
        safe = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "WEALD_PROCESS_MARK"}
        assert set(env) - {"GREETING", "FALLBACK", "API_TOKEN"} <= safe
        assert {"HOME", "PATH"} <= set(env)
        assert TOKEN not in shown
        assert TOKEN not in d.log.read_text()
        # A server whose variable is unset does not start, and says which variable.
        failed = servers["needs_a_variable"]
        assert failed["status"] in ("failed", "connecting")
        assert failed["failed_starts"] >= 1 or failed["status"] == "connecting"
        with d.client() as c:
            view = next(s for s in c.call("mcp.servers") if s["server"] == "needs_a_variable")
        assert "args[1] uses ${WEALD_TEST_NOT_SET}, which is not set in the daemon's environment" in view["last_error"]
        assert d.terminate() == 0, d.log.read_text()
    finally:
        d.close()


# -- importing other hosts' configs ------------------------------------------------------------------------

CLAUDE_DESKTOP = {
    "mcpServers": {
        "filesystem": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/alice/Desktop", "/Users/alice/Downloads"],
        },
        "github": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-github"],
            "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_exampleexampleexampleexample00"},
        },
        "linear": {"type": "sse", "url": "https://mcp.linear.app/sse"},
        "notion docs": {
            "type": "http",
            "url": "https://mcp.notion.com/mcp",
            "headers": {"Authorization": "Bearer ${NOTION_TOKEN}"},
        },
        "puppeteer": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-puppeteer"], "alwaysAllow": ["x"]},
    },
    "globalShortcut": "Alt+Space",
}


def test_weald_mcp_import_writes_the_tables_of_a_claude_desktop_config_and_reports_the_rest(tmp_path: Path) -> None:
    source = tmp_path / "claude_desktop_config.json"
    source.write_text(json.dumps(CLAUDE_DESKTOP, indent=2))
    d = DaemonProcess(tmp_path)
    d.config.write_text("# my settings\n[agent]\nmax_steps = 20\n")
    done = d.cli("mcp", "import", str(source))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"imported 5 MCP servers (claude) into {d.config}: filesystem, github, linear, notion docs, puppeteer"
    )
    assert done.stderr.splitlines() == [
        "note: github: env.GITHUB_PERSONAL_ACCESS_TOKEN held a secret; it is written as "
        "${GITHUB_PERSONAL_ACCESS_TOKEN}: set GITHUB_PERSONAL_ACCESS_TOKEN in the daemon's environment",
        "note: linear: type sse needs nothing more: weald tries Streamable HTTP first and falls back to HTTP+SSE",
        "note: puppeteer: alwaysAllow is not translated (set permissions in [tools.permissions], e.g. "
        'mcp__SERVER__TOOL = "allow")',
    ]
    text = d.config.read_text()
    assert text.startswith("# my settings\n[agent]\nmax_steps = 20\n")  # the rest of the file as it was
    assert "ghp_" not in text
    servers = tomllib.loads(text)["mcp"]["servers"]
    assert servers["filesystem"] == {
        "command": "npx",
        "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/alice/Desktop", "/Users/alice/Downloads"],
    }
    assert servers["github"]["env"] == {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GITHUB_PERSONAL_ACCESS_TOKEN}"}
    assert servers["notion docs"] == {
        "url": "https://mcp.notion.com/mcp",
        "headers": {"Authorization": "Bearer ${NOTION_TOKEN}"},
    }
    assert servers["linear"] == {"url": "https://mcp.linear.app/sse"}
    parse_config(text)  # a valid configuration

    again = d.cli("mcp", "import", str(source))
    assert again.returncode == 0
    assert "imported 0 MCP servers" in again.stdout
    assert "github: " + str(d.config) + " has a server of that name; kept it (--replace replaces)" in again.stderr

    listed = d.cli("mcp", "list", "--json")
    assert [row["server"] for row in json.loads(listed.stdout)["servers"]] == [
        "filesystem",
        "github",
        "linear",
        "notion docs",
        "puppeteer",
    ]
    removed = d.cli("mcp", "remove", "notion docs")
    assert removed.returncode == 0, removed.stderr
    assert "notion docs" not in tomllib.loads(d.config.read_text())["mcp"]["servers"]
    assert "headers" not in d.config.read_text()
    missing = d.cli("mcp", "remove", "notion docs")
    assert missing.returncode == 2
    assert f"{d.config} has no MCP server 'notion docs'" in missing.stderr


def test_mcp_import_is_read_live_under_a_server_weald_mcp_add_wrote(tmp_path: Path) -> None:
    desktop = tmp_path / "claude" / "claude_desktop_config.json"
    desktop.parent.mkdir()
    clock = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
    desktop.write_text(json.dumps({"mcpServers": {"clock": clock, "shadowed": {"command": "/nonexistent/server"}}}))
    d = DaemonProcess(tmp_path, extra_config='[mcp]\nimport = ["claude/claude_desktop_config.json"]\n')
    added = d.cli("mcp", "add", "shadowed", "-e", "TZ=UTC", "--", sys.executable, "-m", "mcp_server_time")
    assert added.returncode == 0, added.stderr
    assert tomllib.loads(d.config.read_text())["mcp"]["servers"]["shadowed"] == {
        "command": sys.executable,
        "args": ["-m", "mcp_server_time"],
        "env": {"TZ": "UTC"},
    }
    refused = d.cli("mcp", "add", "bad", "https://x.example/mcp", "--env", "A=1")
    assert refused.returncode == 2
    assert "--env applies to stdio servers; an HTTP server takes --header" in refused.stderr
    try:
        d.start()
        # The imported server runs; weald.toml's own "shadowed" wins over the imported one.
        servers = {s["server"]: s["status"] for s in d.wait_mcp("clock", "shadowed")}
        assert servers == {"clock": "running", "shadowed": "running"}
        listed = d.cli("mcp", "list")
        assert listed.returncode == 0, listed.stderr
        assert f"shadowed: {sys.executable} -m mcp_server_time [stdio] - running" in listed.stdout
        rows = json.loads(d.cli("mcp", "list", "--json").stdout)["servers"]
        assert {row["server"]: row["from"] for row in rows} == {"clock": str(desktop), "shadowed": "weald.toml"}
        assert d.terminate() == 0, d.log.read_text()
    finally:
        d.close()
    desktop.write_text("{not json")
    broken = d.cli("config")
    assert broken.returncode == 2
    assert f"{desktop}: cannot import MCP servers (mcp.import): {desktop} is not JSON" in broken.stderr


def test_an_opencode_config_with_comments_translates_local_and_remote_servers(tmp_path: Path) -> None:
    source = tmp_path / "opencode.jsonc"
    source.write_text(
        """{
  "$schema": "https://opencode.ai/config.json",
  // the servers
  "mcp": {
    "everything": {"type": "local", "command": ["npx", "-y", "@modelcontextprotocol/server-everything"],
                   "environment": {"LOG_LEVEL": "debug", "API_KEY": "{env:EVERYTHING_KEY}"}, "timeout": 10000},
    /* a remote one, off for now */
    "jira": {"type": "remote", "url": "https://jira.example.com/mcp", "enabled": false,
             "headers": {"X-Tenant": "acme"}, "oauth": {"clientId": "x"}},
  },
}"""
    )
    found = read_foreign_config(source)
    assert found.kind == "opencode"
    assert found.servers == {
        "everything": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-everything"],
            "env": {"LOG_LEVEL": "debug", "API_KEY": "${EVERYTHING_KEY}"},
            "connect_timeout": 10.0,
        },
        "jira": {"url": "https://jira.example.com/mcp", "headers": {"X-Tenant": "acme"}, "enabled": False},
    }
    assert found.notes == (
        "jira: oauth is not translated; give weald's own [mcp.servers.jira.auth] table "
        "(client_id, scopes, client_secret_env naming the variable that holds the secret)",
    )
    v2 = translate(
        {"mcp": {"servers": {"a": {"type": "local", "command": ["a"], "disabled": True, "timeout": {"request": 5000}}}}}
    )
    assert v2 == ("opencode", {"a": {"command": "a", "enabled": False, "call_timeout": 5.0}}, [])
    with pytest.raises(ValueError, match='expected "mcpServers" \\(Claude\\) or "mcp" \\(OpenCode\\)'):
        translate({"servers": {}})


def test_removing_a_server_cuts_its_tables_and_nothing_else() -> None:
    text = (
        '[agent]\nmax_steps = 3\n\n[mcp.servers."my server"]\ncommand = "a"\n\n'
        '[ mcp.servers."my server" . env ]\nA = "1"\n\n[mcp.servers.other]\ncommand = "b"\n# trailing comment\n'
    )
    result, found = remove_server_tables(text, "my server")
    assert found
    assert result == '[agent]\nmax_steps = 3\n\n[mcp.servers.other]\ncommand = "b"\n# trailing comment\n'


# -- secrets found by name and by shape (issue 22) --------------------------------------------------------

DB_PASSWORD = "pw-4b1d9e77c2"
ANT_KEY = "sk-ant-api03-Zq81mXcVbN5tR2pL0wYhK3sDfGj7"
ARG_PASSWORD = "hunter2hunter2"
URL_PASSWORD = "s3cretpassw0rd"
GITHUB_KEY = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
SECRETS = (DB_PASSWORD, ANT_KEY, ARG_PASSWORD, URL_PASSWORD, GITHUB_KEY)

LEAKY = {
    "mcpServers": {
        "db": {
            "command": sys.executable,
            "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            "env": {"DB_URL": f"postgres://u:{DB_PASSWORD}@h/db", "X_API": ANT_KEY, "TZ": "UTC"},
        },
        "argv": {"command": "npx", "args": ["server", f"postgres://admin:{ARG_PASSWORD}@db/x"]},
        "keyarg": {"command": "npx", "args": ["-y", "server", "${ANTHROPIC_API_KEY}"]},
        "web": {
            "type": "http",
            "url": f"https://user:{URL_PASSWORD}@mcp.example.com/mcp",
            "headers": {"X-Api": GITHUB_KEY},
        },
    }
}


def test_weald_mcp_import_writes_no_secret_and_says_which_variable_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / ".mcp.json"
    source.write_text(json.dumps(LEAKY))
    d = DaemonProcess(tmp_path)
    done = d.cli("mcp", "import", str(source))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"imported 2 MCP servers (claude) into {d.config}: db, web"
    notes = done.stderr.splitlines()
    assert notes[:2] == [
        "note: db: env.DB_URL held a secret; it is written as ${DB_URL}: set DB_URL in the daemon's environment",
        "note: db: env.X_API held a secret; it is written as ${X_API}: set X_API in the daemon's environment",
    ]
    assert notes[2].startswith("note: argv: args[1] holds a secret, and every user of this machine can read")
    assert notes[3].startswith("note: keyarg: args[2] uses ${ANTHROPIC_API_KEY}, a secret, and every user")
    assert "the server is left out" in notes[2]
    assert set(notes[4:]) == {
        "note: web: headers.X-Api held a secret; it is written as ${WEB_X_API}: set WEB_X_API in the "
        "daemon's environment",
        "note: web: url held a secret (a password); it is written as ${WEB_URL}: set WEB_URL to the whole URL "
        "in the daemon's environment",
    }
    text = d.config.read_text()
    assert not [s for s in SECRETS if s in text + done.stdout + done.stderr]
    servers = tomllib.loads(text)["mcp"]["servers"]
    assert servers["db"]["env"] == {"DB_URL": "${DB_URL}", "X_API": "${X_API}", "TZ": "UTC"}
    assert servers["web"] == {"url": "${WEB_URL}", "headers": {"X-Api": "${WEB_X_API}"}}

    # A secret written into weald.toml by hand is not shown either, by config, mcp list or mcp.servers.
    with d.config.open("a") as toml:
        toml.write(
            f'\n[mcp.servers.handwritten]\ncommand = "{sys.executable}"\n'
            'args = ["-m", "mcp_server_time"]\n'
            f'[mcp.servers.handwritten.env]\nSTORE = "postgres://store:{DB_PASSWORD}@h2/db"\nPLAIN = "{ANT_KEY}"\n'
        )
    monkeypatch.setenv("DB_URL", f"postgres://u:{DB_PASSWORD}@h/db")
    monkeypatch.setenv("X_API", ANT_KEY)
    monkeypatch.setenv("WEB_URL", "http://127.0.0.1:9/mcp")
    monkeypatch.setenv("WEB_X_API", GITHUB_KEY)
    shown = [d.cli("config"), d.cli("config", "--json"), d.cli("mcp", "list"), d.cli("mcp", "list", "--json")]
    assert all(run.returncode == 0 for run in shown), [run.stderr for run in shown]
    try:
        d.start()
        d.wait_mcp("db", "handwritten")
        with d.client() as c:
            servers_view = json.dumps(c.call("mcp.servers"))
        listed = d.cli("mcp", "list")
        assert "db: " in listed.stdout
        everything = servers_view + listed.stdout + listed.stderr + "".join(r.stdout + r.stderr for r in shown)
        assert not [s for s in SECRETS if s in everything]
        assert "postgres://store:[redacted]@h2/db" in shown[1].stdout  # the handwritten value, its password cut
        assert d.terminate() == 0, d.log.read_text()
    finally:
        d.close()


def test_weald_mcp_add_moves_a_secret_to_a_variable_and_refuses_one_on_the_command_line(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    added = d.cli("mcp", "add", "db", "-e", f"DB_URL=postgres://u:{DB_PASSWORD}@h/db", "--", "npx", "server")
    assert added.returncode == 0, added.stderr
    assert tomllib.loads(d.config.read_text())["mcp"]["servers"]["db"]["env"] == {"DB_URL": "${DB_URL}"}
    assert "set DB_URL in the daemon's environment" in added.stderr
    refused = d.cli("mcp", "add", "leaky", "--", "npx", "server", "--key", ANT_KEY)
    assert refused.returncode == 2
    assert refused.stderr.startswith("weald mcp add: leaky: args[2] holds a secret, and every user of this machine")
    assert ANT_KEY not in d.config.read_text() + refused.stderr


def test_a_secret_variable_on_a_command_line_is_refused_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = DaemonProcess(
        tmp_path, extra_config='[mcp.servers.x]\ncommand = "npx"\nargs = ["-y", "${ANTHROPIC_API_KEY}"]\n'
    )
    shown = d.cli("config")
    assert shown.returncode == 2
    assert shown.stderr.splitlines()[1:] == [
        f"  {d.config}: mcp.servers.x: args[1] uses ${{ANTHROPIC_API_KEY}}, a secret, and every user of this "
        "machine can read a process's command line (/proc/PID/cmdline): give it to the server in env instead"
    ]
    # A variable whose name says nothing, but whose value is a password URL: the server never starts.
    d.config.write_text(
        d.config.read_text().split("[mcp.servers.x]")[0]
        + f'[mcp.servers.y]\ncommand = "{sys.executable}"\nargs = ["-m", "mcp_server_time", "${{WEALD_TEST_TARGET}}"]\n'
    )
    monkeypatch.setenv("WEALD_TEST_TARGET", f"postgres://admin:{ARG_PASSWORD}@db/x")
    try:
        d.start()
        deadline = time.monotonic() + 60
        while True:
            with d.client() as c:
                view = next(s for s in c.call("mcp.servers") if s["server"] == "y")
            if view.get("last_error"):
                break
            assert time.monotonic() < deadline, view
            time.sleep(0.1)
        assert "args[2] uses ${WEALD_TEST_TARGET}, whose value is a secret" in view["last_error"]
        assert ARG_PASSWORD not in json.dumps(view)
        on_argv = scan_proc("cmdline", lambda cmdline: ARG_PASSWORD.encode() in cmdline)
        assert on_argv == []
        assert d.terminate() == 0, d.log.read_text()
    finally:
        d.close()


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ('{"mcpServers": ' + "[" * 100_000 + "]" * 100_000 + "}", "is nested too deep to be an MCP config file"),
        (
            '{"mcpServers": {"x": {"command": "npx", "args": ["\\ud800"]}}}',
            "mcpServers.x.args[0] holds a lone surrogate",
        ),
        ('{"mcpServers": {"\\udc00": {"command": "npx"}}}', "a key of mcpServers holds a lone surrogate"),
    ],
    ids=["nested", "surrogate-value", "surrogate-key"],
)
def test_weald_mcp_import_of_a_hostile_file_fails_in_one_line(tmp_path: Path, content: str, error: str) -> None:
    source = tmp_path / "hostile.json"
    source.write_text(content)
    d = DaemonProcess(tmp_path)
    done = d.cli("mcp", "import", str(source))
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"weald mcp import: {source}"), done.stderr
    assert error in line
    assert "Traceback" not in done.stderr
    assert not d.config.read_text().count("[mcp")
