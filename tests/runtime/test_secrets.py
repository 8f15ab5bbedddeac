"""Secret redaction and environment sanitising."""

from __future__ import annotations

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
