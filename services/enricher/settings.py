"""Settings of the enricher, on top of the shared Kafka settings (`QUIPU_ENRICHER_...`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from quipu.services.kit.settings import (
    ConsumerGroup,
    ConsumerSettings,
    RetryAttempts,
    StoreReplyTimeout,
    renamed,
)


class EnricherSettings(ConsumerSettings):
    """How the enricher consumes `memory.changes` and how long it tries (`QUIPU_ENRICHER_...`)."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_ENRICHER_")

    group: ConsumerGroup = "enricher"
    # Both renamed into the shared vocabulary: QUIPU_ENRICHER_ATTEMPTS and
    # QUIPU_ENRICHER_STORE_TIMEOUT_S are still read (deprecated).
    retry_attempts: RetryAttempts = Field(
        default=3,
        validation_alias=renamed("retry_attempts", "attempts"),
        description=(
            "Tries to apply one change while the store is unavailable or slow; after the last, the "
            "change is dead-lettered (a reindex repairs the index later) and the next one is taken."
        ),
    )
    store_reply_timeout_s: StoreReplyTimeout = Field(
        default=5.0,
        validation_alias=renamed("store_reply_timeout_s", "store_timeout_s"),
        description=(
            "Longest one store call (an upsert or a delete of index entries) may take; the enricher "
            "sends each command once and makes its own tries."
        ),
    )
    retry_delay_s: float = Field(
        default=0.2,
        ge=0,
        description="Base of the exponential backoff (with full jitter) between two tries.",
    )
