"""Building a provider from a ``provider:model`` spec."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from ._anthropic import AnthropicProvider
from ._exceptions import ConfigurationError, UnknownProviderError
from ._openai import OpenAIProvider
from ._scripted import ScriptedProvider
from ._settings import ProviderSettings
from ._types import Provider

__all__ = ["PROVIDERS", "make_provider"]


def _scripted(path: str, settings: ProviderSettings | None) -> Provider:
    return ScriptedProvider.from_file(path, settings=settings)


#: The provider kinds :func:`make_provider` knows, by name (read-only).
PROVIDERS: Mapping[str, Callable[[str, ProviderSettings | None], Provider]] = MappingProxyType(
    {
        "anthropic": AnthropicProvider,
        "openai": OpenAIProvider,
        "scripted": _scripted,
    }
)


def make_provider(spec: str, settings: ProviderSettings | None = None) -> Provider:
    """Build a provider from a ``provider:model`` spec.

    Examples: ``"openai:gpt-4.1"``, ``"anthropic:claude-sonnet-4-5"``,
    ``"scripted:path/to/script.json"``. For an OpenAI-compatible local
    server, use ``"openai:<model>"`` with ``settings.base_url`` set.

    Args:
        spec: The provider's kind and the model (for ``scripted``, the script
            file), separated by the first colon.
        settings: Connection settings; None means all defaults.

    Returns:
        The provider. Close it with ``aclose()`` when done.

    Raises:
        UnknownProviderError: The provider kind is not one of ``PROVIDERS``.
        ConfigurationError: The spec is not ``provider:model``.
        MalformedScriptError: A scripted provider's script is not valid.
    """
    kind, colon, model = spec.partition(":")
    kind = kind.strip().lower()
    known = ", ".join(sorted(PROVIDERS))
    if not colon or not kind or not model.strip():
        raise ConfigurationError(
            f"provider spec {spec!r} is not of the form provider:model "
            f"(known providers: {known}), e.g. 'openai:gpt-4.1'"
        )
    factory = PROVIDERS.get(kind)
    if factory is None:
        raise UnknownProviderError(f"unknown provider {kind!r} in spec {spec!r}; known providers: {known}")
    return factory(model.strip(), settings)
