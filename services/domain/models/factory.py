"""Which model a service talks to: `ModelSettings` and `make_model`.

With an API key (`ANTHROPIC_API_KEY`, or `QUIPU_MODEL_API_KEY`) the services talk to Claude
through `AnthropicModel`; without one they use the offline `ScriptedModel`, so the demo and the
tests run anywhere. `QUIPU_MODEL_PROVIDER=scripted` forces the scripted model even when a key is
present (tests must never reach a real model); `anthropic` insists on a key.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from quipu.services.domain.models.port import ModelClient, ThinkingMode
from quipu.services.domain.models.scripted import ScriptedModel

ModelProvider = Literal["auto", "anthropic", "scripted"]

MIN_THINKING_BUDGET = 1024
"""The API refuses a smaller `budget_tokens`."""


class ModelSettings(BaseSettings):
    """How services reach the language model (`QUIPU_MODEL_...`, plus `ANTHROPIC_API_KEY`)."""

    # validate_by_name: `ModelSettings(api_key=...)` by the field's name, while the environment is
    # read only under the two aliases (an alias "api_key" would read any API_KEY variable).
    model_config = SettingsConfigDict(
        env_prefix="QUIPU_MODEL_", frozen=True, extra="ignore", validate_by_name=True
    )

    provider: ModelProvider = Field(
        default="auto",
        description=(
            "`auto`: Anthropic when an API key is set, else the scripted model; `anthropic`: "
            "require a key; `scripted`: always the offline scripted model."
        ),
    )
    api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("QUIPU_MODEL_API_KEY", "ANTHROPIC_API_KEY"),
        description="Anthropic API key (QUIPU_MODEL_API_KEY or ANTHROPIC_API_KEY); never logged.",
    )
    name: str = Field(
        default="claude-sonnet-4-6",
        min_length=1,
        description=(
            "Model id sent to the API. Claude Opus 4.7 and later accept only adaptive thinking: "
            "pair them with thinking_mode=adaptive."
        ),
    )
    base_url: str = Field(
        default="https://api.anthropic.com",
        min_length=1,
        description="Messages API base URL; tests point it at a local server.",
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="SDK timeout of each attempt (connect, and each read of the stream).",
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        description="Retries the SDK makes on 408/409/429/5xx/529 and connection errors.",
    )
    deadline_s: float = Field(
        default=180.0,
        gt=0,
        description=(
            "Bound on one whole model call, retries and their waits included. Must stay below "
            "the consumer's max_poll_interval so a slow call never triggers a rebalance."
        ),
    )
    thinking_budget: int = Field(
        default=0,
        ge=0,
        description="Extended-thinking token budget of planner calls; 0 disables, else at least 1024.",
    )
    thinking_mode: ThinkingMode = Field(
        default="enabled",
        description="`enabled` sends budget_tokens; `adaptive` lets the model decide (Opus 4.7+).",
    )
    scripted_latency_s: float = Field(
        default=0.0,
        ge=0,
        le=60,
        description=(
            "Seconds the offline scripted model takes before each answer (0: at once). It stands "
            "in for a real model's latency, so a bench can load the planner the way a real model does."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSettings:
        """Refuse a thinking budget the API would refuse, and a deadline below one attempt."""
        if 0 < self.thinking_budget < MIN_THINKING_BUDGET:
            raise ValueError(f"thinking_budget must be 0 or at least {MIN_THINKING_BUDGET}")
        if self.deadline_s < self.timeout_s:
            raise ValueError("deadline_s must not be shorter than timeout_s")
        if self.provider == "anthropic" and not self.has_api_key:
            raise ValueError("provider=anthropic needs an API key (ANTHROPIC_API_KEY)")
        return self

    @property
    def has_api_key(self) -> bool:
        """Whether a non-empty API key is configured."""
        return self.api_key is not None and bool(self.api_key.get_secret_value())

    @property
    def uses_anthropic(self) -> bool:
        """Whether `make_model` builds an `AnthropicModel`."""
        return self.provider == "anthropic" or (self.provider == "auto" and self.has_api_key)


def make_model(settings: ModelSettings, *, max_poll_interval_ms: int | None = None) -> ModelClient:
    """The model the settings ask for: `AnthropicModel` with a key, else `ScriptedModel`.

    With `max_poll_interval_ms` (the consumer's), a deadline that does not fit inside it raises
    ValueError: the call could outlive the consumer's membership of its group.
    """
    if not settings.uses_anthropic:
        return ScriptedModel(latency_s=settings.scripted_latency_s)
    if max_poll_interval_ms is not None and settings.deadline_s * 1000 >= max_poll_interval_ms:
        raise ValueError(
            f"model deadline_s={settings.deadline_s:g} must stay below the consumer's "
            f"max_poll_interval_ms={max_poll_interval_ms}"
        )
    assert settings.api_key is not None  # uses_anthropic implies a key
    # Imported here: the SDK costs seconds to import, which every restart of an offline service paid.
    from quipu.services.domain.models.anthropic import AnthropicModel  # noqa: PLC0415

    return AnthropicModel(
        api_key=settings.api_key.get_secret_value(),
        model=settings.name,
        base_url=settings.base_url,
        timeout_s=settings.timeout_s,
        max_retries=settings.max_retries,
        deadline_s=settings.deadline_s,
        thinking_mode=settings.thinking_mode,
    )
