"""Settings of the transcript recorder, on top of the shared Kafka settings (`QUIPU_RECORDER_...`)."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from quipu.services.domain.models.factory import ModelSettings
from quipu.services.kit.settings import ConsumerGroup, ConsumerSettings, RetryAttempts, StoreClientSettings


class TranscriptRecorderSettings(ConsumerSettings, StoreClientSettings):
    """How the recorder consumes `history.turns`, sizes the window and folds the summary."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_RECORDER_")

    group: ConsumerGroup = "transcript-recorder"
    window_messages: int = Field(
        default=12,
        ge=2,
        le=500,
        description=(
            "The literal window: the last messages of a session shown word for word (whole turns, "
            "so an odd number means one less). Rows that leave it are folded into the summary. "
            "Keep it equal to the planner's `history_messages`."
        ),
    )
    summary_max_tokens: int = Field(
        default=300,
        ge=32,
        description=(
            "Cap of the rolling summary, in tokens of the local estimate (4 characters each); a "
            "longer answer is cut after its last whole sentence that fits."
        ),
    )
    fold_batch_messages: int = Field(
        default=40,
        ge=2,
        le=500,
        description=(
            "Most rows folded by one summarizer call. One turn leaves the window per turn in "
            "steady state; a recorder catching up folds in batches of this size, each saved with "
            "its own cursor."
        ),
    )
    fold_attempts: int = Field(
        default=5,
        ge=1,
        description="Saves tried per fold before giving up when other copies keep winning (MEMORY_CONFLICT).",
    )
    model_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Bound on one summarizer call. A fold that fails or times out leaves the rows for the "
            "next turn's fold; the turn itself is recorded regardless."
        ),
    )
    retry_attempts: RetryAttempts = 5
    model: ModelSettings = Field(
        default_factory=ModelSettings,
        description="The language model this service calls (`QUIPU_MODEL_...`, the same for every service).",
    )

    @model_validator(mode="after")
    def _even_batch(self) -> TranscriptRecorderSettings:
        """A batch holds whole turns: two rows each."""
        if self.fold_batch_messages % 2:
            raise ValueError("fold_batch_messages must be even (whole turns)")
        return self
