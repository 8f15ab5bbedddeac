"""The shell tool's commands never see the daemon's secrets: secret-looking variables are removed.

Run through the real tool runner, in this process, whose environment gets
one variable per secret-looking shape for the duration of each test.
"""

from __future__ import annotations

import pytest
from sec_runner import RunnerHarness
from weald.runtime import ActorSystem

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
