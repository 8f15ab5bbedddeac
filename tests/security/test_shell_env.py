"""The shell tool's commands never see the daemon's secrets: secret-looking variables are removed.

Run through the real tool runner, in this process, whose environment gets
one variable per secret-looking shape for the duration of each test.
"""

from __future__ import annotations

import pytest
from sec_runner import RunnerHarness
from weald.runtime import ActorSystem, is_secret_name
from weald.runtime._secrets import is_secret_env_name, sanitized_env

SECRET_VARIABLES = {
    "OPENAI_API_KEY": "sk-" + "a1b2c3d4e5f6a7b8",
    "ANTHROPIC_API_KEY": "sk-ant-" + "a1b2c3d4e5f6",
    "GITHUB_TOKEN": "ghp_" + "a1b2c3d4e5f6a7b8",
    "AWS_SECRET_ACCESS_KEY": "aws-" + "a1b2c3d4e5f6a7b8",
    "DATABASE_PASSWORD": "pw-" + "a1b2c3d4e5f6a7b8",
    "SLACK_BOT_TOKEN": "xoxb-" + "a1b2c3d4e5f6a7b8",
    "STRIPE_SECRET": "sk_live_" + "a1b2c3d4e5f6",
    "my_service_key": "svc-" + "a1b2c3d4e5f6a7b8",
    "NPM_AUTH_TOKEN": "npm-" + "a1b2c3d4e5f6a7b8",
    "DOCKER_PASSWD": "dk-" + "a1b2c3d4e5f6a7b8",
    "GCP_CREDENTIALS": "gcp-" + "a1b2c3d4e5f6a7b8",
    "SESSION_COOKIE": "ck-" + "a1b2c3d4e5f6a7b8",
    "SSH_PRIVATE_KEY": "ssh-" + "a1b2c3d4e5f6a7b8",
}


def test_secret_looking_variables_never_reach_a_command(
    system: ActorSystem, project: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRET_VARIABLES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WEALD_HARMLESS_SETTING", "visible")
    runner = RunnerHarness(system, project)  # type: ignore[arg-type]
    result = runner.call("shell", command="env; printenv OPENAI_API_KEY || echo unset")
    assert result.ok, result.text()
    output = result.text()
    assert "WEALD_HARMLESS_SETTING=visible" in output  # the environment is there, minus the secrets
    assert output.rstrip().endswith("unset")
    for name, value in SECRET_VARIABLES.items():
        assert f"{name}=" not in output
        assert value not in output


def test_a_secret_kept_on_purpose_with_env_keep_is_the_only_one_passed(
    system: ActorSystem, project: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRET_VARIABLES.items():
        monkeypatch.setenv(name, value)
    runner = RunnerHarness(system, project, options={"shell": {"env_keep": ["GITHUB_TOKEN"]}})  # type: ignore[arg-type]
    output = runner.call("shell", command="env").text()
    assert f"GITHUB_TOKEN={SECRET_VARIABLES['GITHUB_TOKEN']}" in output
    assert [n for n in SECRET_VARIABLES if f"{n}=" in output] == ["GITHUB_TOKEN"]


# Shapes an audit found passed to commands: secret words inside compound
# names, bare words, and credentials inside URLs.
MORE_SECRET_VARIABLES = {
    "TOKEN": "tok-" + "a1b2c3d4e5f6a7b8",
    "GL_PAT": "glpat-" + "a1b2c3d4e5f6a7b8",
    "GITHUB_PAT": "github_pat_" + "a1b2c3d4e5f6",
    "NPM_CONFIG__AUTH": "npmauth-" + "a1b2c3d4e5f6",
    "SLACK_BOT_TOKEN_PROD": "xoxb-prod-" + "a1b2c3d4e5f6",
    "GH_TOKEN_2": "gho_" + "a1b2c3d4e5f6a7b8",
    "DB_PASS": "dbpass-" + "a1b2c3d4e5f6",
    "CI_JOB_JWT": "eyJhbGciOi" + "a1b2c3d4e5f6",
    "SENTRY_DSN": "https://" + "a1b2c3d4e5f6@sentry.example/1",
    "DATABASE_URL": "postgres://u:" + "hunter2@db/x",
    "CACHE_ADDRESS": "redis://:" + "s3cr3t-pw@cache:6379/0",
}

NOT_SECRET_VARIABLES = {
    "KEYBOARD": "us",
    "PASSTHROUGH": "yes",
    "PATH_EXTRA": "/opt/bin",
    "PUBLIC_URL": "https://user@example.com/app",
    "DOCS_URL": "https://example.com/a:b@c",
}


SECRET_NAMES = [
    *sorted(MORE_SECRET_VARIABLES.keys() - {"DATABASE_URL", "CACHE_ADDRESS"}),
    "OPENAI_API_KEY",
    "apikey",
    "db_password",
    "AWS_SESSION_TOKEN",
    "MY_SECRETS_2",
    "GCP_CREDENTIALS",
    "auth_cookie",
    "token2",
    # The second audit's: a password for sshpass, bare bearer tokens, Stripe's secret keys,
    # webhook URLs, DSNs, credential files' contents, passwords in compound names.
    "SSHPASS",
    "BEARER",
    "BEARER_TOKEN",
    "STRIPE_SK",
    "STRIPE_LIVE_SK",
    "SLACK_WEBHOOK_URL",
    "DISCORD_WEBHOOK",
    "MYWEBHOOKSECRET",
    "SENTRY_DSN",
    "DATABASE_DSN",
    "GOOGLE_APPLICATION_CREDENTIALS_JSON",
    "AZURE_CREDENTIALS",
    "MYSQL_PWD",
    "GPG_PASSPHRASE",
    "AZURE_STORAGE_CONNECTION_STRING",
    "DB_CONN_STR",
]

# Secret words inside other words do not count.
NOT_SECRET_NAMES = [
    "PATH",
    "HOME",
    "LANG",
    "TERM",
    "PWD",
    "KEYBOARD",
    "PASSTHROUGH",
    "PATH_EXTRA",
    "TOKENIZERS_PARALLELISM",
    "KEYMAP",
    "COMPASS_DIR",
    "input_tokens",
    "LC_ALL",
    "SSH_AUTH_SOCK",  # a socket path: git over ssh needs it
    "PWD",  # the working directory; MYSQL_PWD is a password
    "OLDPWD",
    "DISK",
    "TASKS",
    "SKIP_TESTS",
    "XDG_SESSION_ID",
    "DBUS_SESSION_BUS_ADDRESS",
]


def test_variable_names_are_secret_by_whole_words_not_substrings() -> None:
    assert [name for name in SECRET_NAMES if not is_secret_env_name(name)] == []
    assert [name for name in NOT_SECRET_NAMES if is_secret_env_name(name) or is_secret_name(name)] == []


def test_compound_names_with_a_secret_word_are_redacted_as_keys_but_bare_field_names_are_not() -> None:
    compound = ["GITHUB_PAT", "SLACK_BOT_TOKEN_PROD", "GH_TOKEN_2", "DB_PASS", "CI_JOB_JWT"]
    assert [name for name in compound if not is_secret_name(name)] == []
    # A memory note's key and a session id are weald's data, not credentials.
    assert not is_secret_name("key")
    assert not is_secret_name("session_id")


def test_urls_carrying_a_password_are_removed_whatever_the_name() -> None:
    env = sanitized_env({"DATABASE_URL": "postgres://u:hunter2@db/x", "PLAIN": "postgres://db/x", "HOME": "/h"})
    assert env == {"PLAIN": "postgres://db/x", "HOME": "/h"}


def test_the_audited_variables_never_reach_a_command_and_the_ordinary_ones_do(
    system: ActorSystem, project: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**MORE_SECRET_VARIABLES, **NOT_SECRET_VARIABLES}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", "/home/weald-test")
    monkeypatch.setenv("LANG", "C.UTF-8")
    runner = RunnerHarness(system, project, options={"shell": {"env_keep": ["DB_PASS"]}})  # type: ignore[arg-type]
    result = runner.call("shell", command="env")
    assert result.ok, result.text()
    output = result.text()
    for name, value in MORE_SECRET_VARIABLES.items():
        if name != "DB_PASS":
            assert f"{name}=" not in output
            assert value not in output
    assert f"DB_PASS={MORE_SECRET_VARIABLES['DB_PASS']}" in output  # kept on purpose
    for name, value in {**NOT_SECRET_VARIABLES, "HOME": "/home/weald-test", "LANG": "C.UTF-8"}.items():
        assert f"{name}={value}" in output
    assert "PATH=" in output
