"""Settings of the planner, on top of the shared Kafka settings (`QUIPU_PLANNER_...`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from quipu.services.domain.models.factory import ModelSettings
from quipu.services.kit.settings import ConsumerGroup, ConsumerSettings, RetryAttempts, StoreClientSettings


class PlannerSettings(ConsumerSettings, StoreClientSettings):
    """How the planner consumes its three topics and bounds its model calls."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_PLANNER_")

    group: ConsumerGroup = Field(
        default="planner",
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
    retry_attempts: RetryAttempts = Field(
        default=1,
        description=(
            "Tries of one message on a transient failure (store UNAVAILABLE, retryable model error) "
            "before it is set aside and handled again a second later, still first in its key's line. "
            "One by default: a model call can take minutes."
        ),
    )
    max_tokens_per_call: int = Field(
        default=4096, ge=1, description="Output tokens asked for in one model call (within the run's budget)."
    )
    history_messages: int = Field(
        default=12,
        ge=0,
        le=500,
        description=(
            "The literal window: earlier-turn messages (whole turns) a turn is seeded with, word for "
            "word. Keep it equal to the transcript recorder's `window_messages`."
        ),
    )
    use_memory: bool = Field(
        default=True,
        description=(
            "Build each turn's context from conversation memory (facts and profile, the rolling "
            "summary, the literal window) through the storage owner's memory commands; false: "
            "from the session's run logs (the last `history_messages` messages, no summary, no "
            "facts). Memory needs the transcript recorder running; turns it has not recorded yet "
            "are shown from what this planner published."
        ),
    )
    facts_k: int = Field(
        default=5, ge=0, le=100, description="Facts about the person retrieved for a turn (0: none)."
    )
    memory_index_timeout_s: float = Field(
        default=0.5,
        gt=0,
        description=(
            "Wait for the derived memory index; when it errs, is slower or finds nothing, facts "
            "come from the authority (keyword and recency) instead."
        ),
    )
    request_budget_tokens: int = Field(
        default=150_000,
        ge=256,
        description=(
            "Input tokens one model request may carry (system, memory blocks, history, this turn, "
            "tools). Over it, the oldest history turns are compacted into the summary block; a turn "
            "that does not fit even without history fails with `context_overflow`. Together with "
            "`max_tokens_per_call` it must fit the model's context window."
        ),
    )
    count_tokens_above: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description=(
            "Fraction of `request_budget_tokens` above which a request's tokens are counted by the "
            "provider (one API call per model call); below it the local estimate (4 characters a "
            "token) is trusted. The estimate can undercount code, JSON and non-Latin scripts "
            "severalfold, hence the wide margin; 0 counts every request."
        ),
    )
    count_tokens_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Bound on one token count (the provider's counter); past it the local estimate is used.",
    )
    compaction_summary_tokens: int = Field(
        default=500,
        ge=32,
        description="Cap of the summary block a compaction writes, in tokens of the local estimate.",
    )
    compaction_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Bound on one compaction (summarizer) call; past it the message is tried again later.",
    )
    model: ModelSettings = Field(
        default_factory=ModelSettings,
        description="The language model this service calls (`QUIPU_MODEL_...`, the same for every service).",
    )
    max_actions_per_message: int = Field(
        default=64,
        ge=4,
        description="Steps one message may drive before the planner calls it a bug (no progress).",
    )
    sent_views: int = Field(
        default=4096,
        ge=0,
        description=(
            "Runs waiting for their tool results whose view the planner keeps, so a result is "
            "folded in without reading the run's log again (0: always read)."
        ),
    )
    pipeline_starts: bool = Field(
        default=True,
        description=(
            "Call a new turn's model while its start is on its way to the storage owner, and send the "
            "first step, or the terminal when the first answer closes the run, behind it (refused "
            "unless the start simply succeeded), when the request cannot be a redelivery; off: every "
            "start is answered before the model is called."
        ),
    )
    recent_starts: int = Field(
        default=4096,
        ge=0,
        description=(
            "Run ids this planner started lately: a request for one of them (a duplicate) is never "
            "pipelined, its start is answered first."
        ),
    )
    tools_wait_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "How long a run whose agent declares tools no toolset has announced yet waits for their "
            "announcement before it fails with `missing_tool`: an executor started beside the planner "
            "announces once it has joined its group (0: fail at once)."
        ),
    )
