"""make_provider, ProviderSettings and the exported names."""

from __future__ import annotations

import pytest
import weald.runtime.llm as llm
from weald.runtime.llm import (
    AnthropicProvider,
    ConfigurationError,
    OpenAIProvider,
    ProviderSettings,
    UnknownProviderError,
    make_provider,
)


def test_exported_members_are_exactly_the_public_api() -> None:
    assert llm.__all__ == sorted(llm.__all__, key=lambda n: (not n.isupper(), n))
    assert {n for n in dir(llm) if not n.startswith("_")} - {"annotations", "logging"} == set(llm.__all__)
    for name in llm.__all__:
        assert getattr(llm, name) is not None


@pytest.mark.trio
async def test_specs_make_the_matching_provider() -> None:
    settings = ProviderSettings(base_url="http://127.0.0.1:1/v1/")
    openai = make_provider("openai:gpt-4.1", settings)
    anthropic = make_provider("anthropic:claude-sonnet-4-5")
    try:
        assert isinstance(openai, OpenAIProvider)
        assert (openai.name, openai.model) == ("openai", "gpt-4.1")
        assert openai.url == "http://127.0.0.1:1/v1/chat/completions"
        assert isinstance(anthropic, AnthropicProvider)
        assert anthropic.model == "claude-sonnet-4-5"
        assert anthropic.url == "https://api.anthropic.com/v1/messages"
    finally:
        await openai.aclose()
        await anthropic.aclose()


def test_an_unknown_provider_is_named_with_the_known_ones() -> None:
    with pytest.raises(UnknownProviderError) as info:
        make_provider("gemini:pro")
    assert "'gemini'" in str(info.value)
    assert "anthropic, openai, scripted" in str(info.value)


@pytest.mark.parametrize("spec", ["gpt-4.1", "openai:", ":gpt-4.1", ""])
def test_a_spec_without_provider_and_model_is_rejected(spec: str) -> None:
    with pytest.raises(ConfigurationError, match="provider:model"):
        make_provider(spec)


def test_settings_never_show_header_values() -> None:
    settings = ProviderSettings(extra_headers={"Authorization": "Bearer sk-hidden"})
    assert "sk-hidden" not in repr(settings)
    assert "Authorization" in repr(settings)
    assert settings.extra_headers == {"Authorization": "Bearer sk-hidden"}


def test_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="stall_timeout"):
        ProviderSettings(stall_timeout=0)
    with pytest.raises(ValueError, match="max_retries"):
        ProviderSettings(max_retries=-1)
