"""Settings of the enricher, on top of the shared Kafka settings."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from quipu.services.kit.settings import ConsumerSettings


class EnricherSettings(ConsumerSettings):
    """How the enricher consumes `memory.changes` and how long it tries (`QUIPU_ENRICHER_...`)."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_ENRICHER_", frozen=True, extra="ignore")

    group: str = Field(
        default="enricher",
        description="Consumer group of `memory.changes`; every enricher copy joins it.",
    )
    attempts: int = Field(
        default=3,
        ge=1,
        description=(
            "Tries to apply one change while the store is unavailable or slow; after the last, the "
            "change is dead-lettered (a reindex repairs the index later) and the next one is taken."
        ),
    )
    store_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Longest one store call (an upsert or a delete of index entries) may take.",
    )
    retry_delay_s: float = Field(
        default=0.2,
        ge=0,
        description="Base of the exponential backoff (with full jitter) between two tries.",
    )
