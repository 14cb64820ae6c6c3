"""Settings of the `quipu` client commands (`QUIPU_CLI_...`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CliSettings(BaseSettings):
    """How long client commands wait, and when they say what they see instead of waiting silently."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_CLI_", frozen=True, extra="ignore")

    store_reply_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "How long one store call waits for the storage owner's reply before sending the identical "
            "command again (QUIPU_CLI_STORE_REPLY_TIMEOUT_S); raise it on a busy host."
        ),
    )
    store_attempts: int = Field(
        default=3,
        ge=1,
        description=(
            "How many times a store call is sent before it fails as UNAVAILABLE (QUIPU_CLI_STORE_ATTEMPTS)."
        ),
    )
    no_event_hint_s: float = Field(
        default=8.0,
        gt=0,
        description=(
            "After this long without an event of the run, `quipu run` looks at the planner's consumer "
            "group and says what it sees (no member, or how many requests are ahead)."
        ),
    )
    status_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long `quipu status` and the hints wait for the broker's answers about groups.",
    )
