"""Secret redaction and environment sanitising."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from weald.runtime import REDACTED, is_secret_name, redact, redact_text, register_secret, sanitized_env


def test_secret_looking_names_are_recognised() -> None:
    for name in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "Authorization", "x-api-key", "GITHUB_TOKEN", "db_password"]:
        assert is_secret_name(name), name
    for name in ["PATH", "HOME", "key", "tokens", "input_tokens", "max_tokens", "monkey"]:
        assert not is_secret_name(name), name


def test_known_secret_values_are_cut_out_of_any_text() -> None:
    register_secret("hunter2-hunter2-hunter2")
    assert redact_text("pw=hunter2-hunter2-hunter2;") == f"pw={REDACTED};"
    assert redact({"deep": ["x hunter2-hunter2-hunter2"]}) == {"deep": [f"x {REDACTED}"]}


def test_short_values_are_not_treated_as_secrets() -> None:
    register_secret("abc")
    assert redact_text("abc") == "abc"


def test_sanitized_env_drops_secret_variables_but_keeps_the_rest() -> None:
    env = sanitized_env({"PATH": "/bin", "OPENAI_API_KEY": "sk-x", "MY_TOKEN": "t", "HOME": "/h"})
    assert env == {"PATH": "/bin", "HOME": "/h"}
    assert sanitized_env({"MY_TOKEN": "t"}, keep=("MY_TOKEN",)) == {"MY_TOKEN": "t"}


SCRUB_PROBE = """
import json, os, posix, subprocess, sys
from weald.runtime import environ_value, restore_environ, scrub_environ, sanitized_env
removed = scrub_environ()
child = subprocess.run(["env"], capture_output=True, text=True).stdout
reader = subprocess.run(
    ["sh", "-c", "cat /proc/$PPID/environ"], capture_output=True
).stdout.decode("latin-1")
report = {
    "removed": removed,
    "in_os_environ": [n for n in removed if n in os.environ],
    "in_posix_environ": [n for n in removed if n.encode() in posix.environ],
    "values": {n: environ_value(n) for n in removed},
    "child_env": child,
    "proc_environ": reader,
    "kept": sanitized_env(keep=("GITHUB_TOKEN",)).get("GITHUB_TOKEN"),
}
restore_environ()
report["restored"] = {n: os.environ.get(n) for n in removed}
print(json.dumps(report))
"""


def test_scrub_environ_leaves_no_secret_where_a_child_or_proc_could_read_it() -> None:
    secrets = {
        "GITHUB_TOKEN": "ghp_scrub0123456789",
        "SSHPASS": "sshpass-0123456789",
        "STRIPE_SK": "sk_live_0123456789",
    }
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "PLAIN": "visible-value", **secrets}
    done = subprocess.run(
        [sys.executable, "-c", SCRUB_PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(done.stdout)
    assert report["removed"] == sorted(secrets)
    assert report["in_os_environ"] == report["in_posix_environ"] == []
    assert report["values"] == secrets  # what providers read (environ_value), kept in memory
    for value in secrets.values():
        assert value not in report["child_env"]
        assert value not in report["proc_environ"]  # the start-up block is wiped too
    assert "PLAIN=visible-value" in report["child_env"]
    assert "PLAIN=visible-value" in report["proc_environ"]
    assert report["kept"] == secrets["GITHUB_TOKEN"]  # env_keep still reaches a scrubbed variable
    assert report["restored"] == secrets
