"""Settings of the tool executor, on top of the shared Kafka settings."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from quipu.services.kit.settings import ConsumerGroup, ConsumerSettings, RetryAttempts


class ToolExecutorSettings(ConsumerSettings):
    """How the tool executor consumes calls, bounds them and shuts down (`QUIPU_TOOLS_...`)."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_TOOLS_")

    group: ConsumerGroup = "tool-executor"
    max_in_flight: int = Field(
        default=64,
        ge=1,
        description=(
            "Calls one executor runs at once across every tool; when all are busy it stops "
            "taking messages until one finishes."
        ),
    )
    max_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Upper bound of any call's deadline (a tool's own or a request's override); must stay "
            "well below the consumer's max_poll_interval."
        ),
    )
    remembered_results: int = Field(
        default=1_000,
        ge=1,
        description=(
            "Results kept in process so a redelivered call is answered again without running twice. "
            "A result is at most 64 KiB, so the worst case is this many times 64 KiB of memory."
        ),
    )
    remembered_cancels: int = Field(
        default=10_000,
        ge=1,
        description="Canceled run ids kept in process; later calls of those runs are not run.",
    )
    retry_attempts: RetryAttempts = Field(
        default=5, description="Tries to publish one result while the broker is briefly unavailable."
    )
