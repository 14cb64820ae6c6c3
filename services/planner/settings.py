"""Settings of the planner, on top of the shared Kafka settings (`QUIPU_PLANNER_...`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class PlannerSettings(BaseSettings):
    """How the planner consumes its three topics and bounds its model calls."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_PLANNER_", frozen=True, extra="ignore")

    group: str = Field(
        default="planner",
        min_length=1,
        description=(
            "Prefix of the planner's consumer groups (`<group>-requests`, `-control`, `-results`); "
            "every planner copy uses the same ones."
        ),
    )
    model_timeout_s: float = Field(
        default=200.0,
        gt=0,
        description=(
            "Bound on one model call, streaming included. Times `retry_attempts` it must stay "
            "below the consumer's max_poll_interval, so a slow call never costs the group its member; "
            "the model adapter's own deadline must fit inside it."
        ),
    )
    retry_attempts: int = Field(
        default=1,
        ge=1,
        description=(
            "Tries of one message on a transient failure (store UNAVAILABLE, retryable model error) "
            "before it is rewound and delivered again. One by default: a model call can take minutes, "
            "and a rewind re-polls, which keeps the consumer in its group."
        ),
    )
    max_tokens_per_call: int = Field(
        default=4096, ge=1, description="Output tokens asked for in one model call (within the run's budget)."
    )
    history_messages: int = Field(
        default=12,
        ge=0,
        description="Earlier-turn messages (whole turns) the default context source seeds a turn with.",
    )
    store_reply_timeout_s: float = Field(
        default=5.0, gt=0, description="Wait for one storage-owner reply before resending the command."
    )
    max_actions_per_message: int = Field(
        default=64,
        ge=4,
        description="Steps one message may drive before the planner calls it a bug (no progress).",
    )
