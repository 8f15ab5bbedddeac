"""How much a model can read: its context window and the share kept for its answer.

An agent keeps every model request under ``context_window - output_reserve``
tokens. The window comes from the provider's settings when configured
(``[models.aliases.NAME] context_window = ...`` in ``weald.toml``), else from
the table of common models below (matched by name prefix, after any
``vendor/`` part, so ``openai/gpt-4o`` and ``gpt-4o-2024-08-06`` both match
``gpt-4o``), else it is `DEFAULT_CONTEXT_WINDOW`. A server that refuses a
request as too long tells the agent the real window when it says it.
"""

from __future__ import annotations

import functools
from typing import Final, Literal

import attrs

from ._settings import ProviderSettings

__all__ = ["DEFAULT_CONTEXT_WINDOW", "KNOWN_CONTEXT_WINDOWS", "ModelLimits", "model_limits"]

#: The window assumed for a model that is neither configured nor in the table.
DEFAULT_CONTEXT_WINDOW: Final = 128_000

#: Context windows of common models, in tokens, by model-name prefix (longest match wins).
KNOWN_CONTEXT_WINDOWS: Final[dict[str, int]] = {
    # OpenAI
    "gpt-5": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1-mini": 128_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    # Anthropic (the Messages API and its model ids)
    "claude-": 200_000,
    # Open models, as vLLM, llama.cpp, Ollama and OpenRouter name them
    "llama-3.1": 131_072,
    "llama-3.2": 131_072,
    "llama-3.3": 131_072,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    "qwen2.5": 32_768,
    "qwen3": 40_960,
    "mistral-large": 128_000,
    "deepseek-chat": 64_000,
    "deepseek-reasoner": 64_000,
    "gemini-1.5-pro": 2_097_152,
    "gemini-1.5-flash": 1_048_576,
    "gemini-2": 1_048_576,
}

# The most tokens reserved for the answer when not configured (and at most a quarter of the window).
_MAX_DEFAULT_RESERVE = 16_384


@attrs.frozen
class ModelLimits:
    """A model's context window and the tokens kept free for its answer.

    Attributes:
        context_window: The most tokens a request and its answer may hold together.
        output_reserve: Tokens kept free for the answer: requests stay under
            ``context_window - output_reserve``.
        source: Where the window came from: ``"configured"``, ``"known"``
            (the table of common models), ``"default"``, or ``"server"``
            (a server refused a request and said how large its window is).
    """

    context_window: int = attrs.field(validator=attrs.validators.gt(0))
    output_reserve: int = attrs.field(validator=attrs.validators.ge(0))
    source: Literal["configured", "known", "default", "server"] = "default"

    @property
    def input_budget(self) -> int:
        """The most tokens a request may hold: the window less the reserve (at least 1)."""
        return max(1, self.context_window - self.output_reserve)

    def narrowed(self, window: int) -> ModelLimits:
        """These limits for a smaller window a server reported (unchanged if it is not smaller).

        The reserve shrinks with the window, to at most a quarter of it.
        """
        if window >= self.context_window or window <= 0:
            return self
        return ModelLimits(context_window=window, output_reserve=min(self.output_reserve, window // 4), source="server")


def _known_window(model: str) -> int | None:
    name = model.strip().lower().rsplit("/", 1)[-1]
    best: tuple[int, int] | None = None  # (prefix length, window)
    for prefix, window in KNOWN_CONTEXT_WINDOWS.items():
        if name.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), window)
    return best[1] if best is not None else None


def model_limits(model: str, settings: ProviderSettings | None = None) -> ModelLimits:
    """The limits of ``model``: configured in ``settings``, else known, else the default.

    Args:
        model: The model's name as the provider sends it (``gpt-4.1``,
            ``claude-sonnet-4-5``, ``openai/gpt-4o``).
        settings: The provider's settings; their ``context_window`` and
            ``output_reserve`` win when set.

    Returns:
        The limits. The reserve, when not configured, is a quarter of the
        window, at most 16,384 tokens.
    """
    window = settings.context_window if settings is not None else None
    reserve = settings.output_reserve if settings is not None else None
    return _limits(model, window, reserve)


@functools.lru_cache(maxsize=256)
def _limits(model: str, window: int | None, reserve: int | None) -> ModelLimits:
    # Cached: every agent of a daemon asks, and the answer is a frozen value it may share.
    source: Literal["configured", "known", "default"] = "configured"
    if window is None:
        window = _known_window(model)
        source = "known"
    if window is None:
        window = DEFAULT_CONTEXT_WINDOW
        source = "default"
    if reserve is None:
        reserve = min(_MAX_DEFAULT_RESERVE, window // 4)
    return ModelLimits(context_window=window, output_reserve=min(reserve, window - 1), source=source)
