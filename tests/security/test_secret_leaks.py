"""Secrets never leave the daemon: not in debug_state, events, histories, logs or the store file.

One real daemon (module scope) runs with secrets in every place they can be:
an API key in its environment named by ``api_key_env``, more secret-looking
variables beside it, an auth header in a provider's ``extra_headers``, an
MCP server's auth header and environment (the stdio server prints its
token to stderr), and an agent on an OpenAI-compatible loopback server that
records every request. The agent runs ``env`` through the shell tool and its
model echoes the key; a second turn gets an error from the server that
repeats the request's headers. Then everything a client or an operator can
see is collected and searched for every secret.
"""

from __future__ import annotations

import fnmatch
import json
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from daemon_harness import DaemonProcess
from fake_openai import FakeOpenAI

API_KEY = "sk-weald-" + "Zq8Xv3Lm9Pw2Rt7Ny4Ks"
GITHUB_TOKEN = "ghp_" + "Jk4Lm5Nb6Vc7Xz8As9Df0"
DB_SECRET = "db-" + "Po9Iu8Yt7Re6Wq5Lk4"
PASSWORD = "pw-" + "Mn3Bv2Cx1Za0Sd9Fg8"
PROVIDER_HEADER = "hdr-" + "Aa1Bb2Cc3Dd4Ee5Ff6"
MCP_HEADER = "mcp-" + "Qq1Ww2Ee3Rr4Tt5Yy6"
MCP_ENV = "mcpenv-" + "Uu7Ii8Oo9Pp0Aa1Ss2"
PLAIN_NAMED_KEY = "prod-" + "Hh5Jj6Kk7Ll8Mm9Nn0"

DAEMON_ENV = {
    "WEALD_SEC_API_KEY": API_KEY,
    "WEALD_SEC_GITHUB_TOKEN": GITHUB_TOKEN,
    "WEALD_SEC_DB_SECRET": DB_SECRET,
    "WEALD_SEC_PASSWORD": PASSWORD,
    # Named by a provider's api_key_env, but not a name that looks secret.
    "OPENAI_KEY_PROD": PLAIN_NAMED_KEY,
}
# What "secret-looking" means here: the shell tool's contract (*_KEY, *_TOKEN, *_SECRET, passwords).
SECRET_NAME_PATTERNS = ("*_KEY", "*_TOKEN", "*_SECRET", "*PASSWORD*", "*PASSWD*", "*API_KEY*", "*APIKEY*")
ENV_SECRETS = {"API_KEY": API_KEY, "GITHUB_TOKEN": GITHUB_TOKEN, "DB_SECRET": DB_SECRET, "PASSWORD": PASSWORD}


class SecretDaemon(DaemonProcess):
    """A daemon whose environment holds the secrets (the test process's own environment is left alone)."""

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(DAEMON_ENV)
        return env


@attrs.frozen
class Surfaces:
    """Everything a client or an operator can see, by name, as text."""

    texts: dict[str, str]
    provider_requests: list[tuple[dict[str, str], dict[str, Any]]]
    shell_env: str
    plain_shell_env: str

    def containing(self, secret: str) -> list[str]:
        return sorted(name for name, text in self.texts.items() if secret in text)


def _config(url: str) -> str:
    return textwrap.dedent(
        f"""
        [models]
        default = "fake:gpt"
        [models.aliases]
        prod = "fake2:gpt"
        [providers.fake]
        kind = "openai"
        base_url = "{url}"
        api_key_env = "WEALD_SEC_API_KEY"
        max_retries = 0
        extra_headers = {{ "X-Custom-Auth-Token" = "{PROVIDER_HEADER}" }}
        [providers.fake2]
        kind = "openai"
        base_url = "{url}"
        api_key_env = "OPENAI_KEY_PROD"
        max_retries = 0
        [tools.permissions]
        shell = "allow"
        [mcp.servers.remote]
        url = "http://127.0.0.1:9/mcp"
        headers = {{ Authorization = "Bearer {MCP_HEADER}" }}
        connect_timeout = 2
        [mcp.servers.local]
        command = "sh"
        args = ["-c", "echo token $MCP_API_TOKEN >&2; exit 3"]
        env = {{ MCP_API_TOKEN = "{MCP_ENV}" }}
        connect_timeout = 2
        """
    )


def _tool_output(messages: list[dict[str, Any]], tool: str) -> str:
    return "\n".join(m["content"] for m in messages if m["role"] == "tool" and m["name"] == tool)


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Surfaces]:
    root = tmp_path_factory.mktemp("secrets")
    with FakeOpenAI() as server:
        daemon = SecretDaemon(root, extra_config=_config(server.url))
        try:
            daemon.start()
            texts: dict[str, str] = {}
            server.tool_call("shell", {"command": "env"})
            server.text(f"Here is what I found: the key is {API_KEY}.")
            server.echo_headers_error(400)
            with daemon.client() as client:
                client.call("events.subscribe", {})
                client.call("agent.start", {"working_dir": str(daemon.project), "agent_id": "sec"})
                turns = [
                    client.call("agent.prompt", {"agent_id": "sec", "text": t}, timeout=60) for t in ("env?", "again")
                ]
                server.tool_call("shell", {"command": "env"}).text("done")
                client.call("agent.start", {"working_dir": str(daemon.project), "agent_id": "prod", "model": "prod"})
                turns.append(client.call("agent.prompt", {"agent_id": "prod", "text": "env?"}, timeout=60))
                history = client.call("agent.history", {"agent_id": "sec"})["messages"]
                plain = client.call("agent.history", {"agent_id": "prod"})["messages"]
                texts["turn results"] = json.dumps(turns)
                texts["agent.history"] = json.dumps([history, plain])
                texts["debug_state (agent)"] = json.dumps(
                    client.call("debug_state", {"agent_id": "sec", "events": 200, "messages": 50})
                )
                texts["debug_state (daemon)"] = json.dumps(client.call("debug_state", {"events": 2000}))
                texts["agent.list"] = json.dumps(client.call("agent.list"))
                texts["tree"] = json.dumps(client.call("tree"))
                notes = []
                while (note := client.next_notification(timeout=0.5)) is not None:
                    notes.append(note)
                assert any(n[0] == "event" and n[1]["event"]["topic"] == "agent.turn_end" for n in notes)
                texts["events"] = json.dumps(notes)
            assert daemon.terminate() == 0
            texts["daemon stdout and stderr"] = daemon.log.read_text()
            texts["daemon.log (its own log)"] = (root / "daemon.log").read_text()
            for store_file in sorted(root.glob("store.db*")):
                texts[f"store file {store_file.name}"] = store_file.read_bytes().decode("latin-1")
            yield Surfaces(
                texts,
                list(zip(server.headers, server.requests, strict=True)),
                _tool_output(history, "shell"),
                _tool_output(plain, "shell"),
            )
        finally:
            daemon.close()


def test_the_api_key_was_sent_to_the_provider_as_a_bearer_token(surfaces: Surfaces) -> None:
    authorizations = {headers.get("authorization") for headers, _ in surfaces.provider_requests}
    assert f"Bearer {API_KEY}" in authorizations
    assert f"Bearer {PLAIN_NAMED_KEY}" in authorizations
    assert all(API_KEY not in json.dumps(body) for _, body in surfaces.provider_requests[:1])


def test_the_shell_environment_has_no_secret_looking_variables(surfaces: Surfaces) -> None:
    assert "WEALD_CONFIG=" in surfaces.shell_env  # the command did run and print its environment
    names = re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=", surfaces.shell_env, re.MULTILINE)
    secret_like = [n for n in names if any(fnmatch.fnmatch(n.upper(), p) for p in SECRET_NAME_PATTERNS)]
    assert secret_like == []
    assert {"WEALD_SEC_API_KEY", "WEALD_SEC_GITHUB_TOKEN", "WEALD_SEC_DB_SECRET", "WEALD_SEC_PASSWORD"}.isdisjoint(
        names
    )
    for value in ENV_SECRETS.values():
        assert value not in surfaces.shell_env


@pytest.mark.parametrize("name", sorted(ENV_SECRETS))
def test_secrets_from_the_environment_appear_nowhere(surfaces: Surfaces, name: str) -> None:
    assert surfaces.containing(ENV_SECRETS[name]) == []


@pytest.mark.parametrize("secret", [MCP_HEADER, MCP_ENV], ids=["mcp-header", "mcp-env"])
def test_mcp_auth_headers_and_environment_appear_nowhere(surfaces: Surfaces, secret: str) -> None:
    assert surfaces.containing(secret) == []


def test_the_surfaces_were_collected(surfaces: Surfaces) -> None:
    assert {
        "events",
        "agent.history",
        "debug_state (agent)",
        "debug_state (daemon)",
        "daemon stdout and stderr",
        "daemon.log (its own log)",
    } <= set(surfaces.texts)
    assert any(name.startswith("store file store.db") for name in surfaces.texts)
    assert "mcp.disconnected" in surfaces.texts["events"]  # the MCP servers were tried (and their errors seen)


def test_an_api_key_echoed_by_the_model_is_kept_out_of_histories_turn_results_and_the_store(
    surfaces: Surfaces,
) -> None:
    assert surfaces.containing(API_KEY) == []


def test_a_provider_auth_header_appears_nowhere(surfaces: Surfaces) -> None:
    assert surfaces.containing(PROVIDER_HEADER) == []


def test_an_api_key_in_a_plainly_named_variable_is_kept_from_the_shell_and_every_output(surfaces: Surfaces) -> None:
    assert PLAIN_NAMED_KEY not in surfaces.plain_shell_env
    assert surfaces.containing(PLAIN_NAMED_KEY) == []
