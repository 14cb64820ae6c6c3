"""Settings of the fact extractor, on top of the shared Kafka settings (`QUIPU_FACTS_...`)."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from quipu.services.domain.models.factory import ModelSettings
from quipu.services.kit.settings import ConsumerGroup, ConsumerSettings, RetryAttempts, StoreClientSettings


class FactExtractorSettings(ConsumerSettings, StoreClientSettings):
    """How the fact extractor consumes `history.recorded`, bounds its model calls and its memory."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_FACTS_")

    group: ConsumerGroup = "fact-extractor"
    model_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Bound on one model call. Times `retry_attempts` (and two calls on a profile turn) it "
            "must stay below the consumer's max_poll_interval."
        ),
    )
    retry_attempts: RetryAttempts = 2
    max_output_tokens: int = Field(
        default=1024, ge=64, description="Output tokens asked for in one extraction or profile call."
    )
    max_operations_per_turn: int = Field(
        default=10, ge=1, description="Proposals of one turn that are considered; the rest are dropped."
    )
    max_fact_chars: int = Field(
        default=280, ge=16, le=2000, description="Longest fact text kept; longer proposals are refused."
    )
    max_facts_per_scope: int = Field(
        default=200, ge=1, description="Facts one scope may hold; new facts beyond it are refused."
    )
    profile_every_turns: int = Field(
        default=5,
        ge=0,
        le=250,
        description=(
            "The profile is rewritten on every N-th turn of a session (turn N, 2N, ...), from that "
            "session's last N turns (at most 250: one history page); 0 never rewrites it."
        ),
    )
    profile_max_lines: int = Field(default=8, ge=1, description="Most lines a profile keeps.")
    profile_max_line_chars: int = Field(
        default=200, ge=16, description="Longest profile line kept; longer lines are dropped."
    )
    profile_max_chars: int = Field(default=800, ge=64, description="Longest profile kept, in characters.")
    model: ModelSettings = Field(
        default_factory=ModelSettings,
        description="The language model this service calls (`QUIPU_MODEL_...`, the same for every service).",
    )

    @model_validator(mode="after")
    def _check(self) -> FactExtractorSettings:
        """A profile line must fit in the profile."""
        if self.profile_max_line_chars > self.profile_max_chars:
            raise ValueError("profile_max_line_chars must not exceed profile_max_chars")
        return self
