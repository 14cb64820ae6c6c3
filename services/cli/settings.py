"""Settings of the `quipu` client commands (`QUIPU_CLI_...`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from quipu.services.kit.settings import StoreClientSettings


class CliSettings(StoreClientSettings):
    """How long client commands wait, and when they say what they see instead of waiting silently."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_CLI_")

    store_claim_partition: bool = Field(
        default=False,
        description=(
            "Off for a client command: it lives too briefly for its join and leave of the claim "
            "group to be worth a rebalance of every other store client (kit.reply_claim)."
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
    toolsets_ready_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "How long `quipu up --app` waits for every toolset of the app to be announced before it "
            "says it is up anyway, naming those that were not (an executor process still starting)."
        ),
    )
    status_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long `quipu status` and the hints wait for the broker's answers about groups.",
    )
