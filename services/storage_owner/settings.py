"""Settings of the storage owner, on top of the shared Kafka and Mongo settings."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from quipu.services.domain.memory.tombstone import DEFAULT_TURN_MARKS_KEEP
from quipu.services.kit.settings import ConsumerGroup, ConsumerSettings, RetryAttempts


class OwnerSettings(ConsumerSettings):
    """How the storage owner consumes commands and protects cursors."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_OWNER_")

    group: ConsumerGroup = "storage-owner"
    cursor_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key of listing cursors; unset: a key generated once and kept in MongoDB.",
    )
    master_key: SecretStr | None = Field(
        default=None,
        description=(
            "Master key wrapping each principal's data key (their memory, run records and "
            "checkpoints are sealed under it): base64 of 32 random bytes "
            "(openssl rand -base64 32). Unset: one generated once and kept in MongoDB's `meta`, "
            "which protects nothing against whoever reads the database."
        ),
    )
    keys_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description=(
            "Port of the key endpoint that hands the principals' data keys to services (it needs "
            "QUIPU_KEYS_TOKEN); unset: none is served and the owner publishes its topics in plaintext."
        ),
    )
    keys_host: str = Field(
        default="127.0.0.1", description="Address the key endpoint listens on (the services' network)."
    )
    keys_previous_token: SecretStr | None = Field(
        default=None,
        description=(
            "The service token being rotated out, still accepted by the key endpoint beside "
            "QUIPU_KEYS_TOKEN while the services move to the new one; unset it once they have."
        ),
    )
    max_in_flight: int = Field(
        default=8,
        ge=1,
        description=(
            "Commands applied at once: commands of different sessions run concurrently (each in "
            "its own transaction), one session's stay in order. One applies every command in turn."
        ),
    )
    group_commit_max: int = Field(
        default=16,
        ge=1,
        description=(
            "Commands of different sessions that arrive together applied in one database "
            "transaction (one commit), at most; a group that meets a conflict applies each alone. "
            "Suits a database that serialises writes (the embedded SecantusDB); on a MongoDB "
            "replica set, where concurrent transactions scale, 1 (each alone) may serve better."
        ),
    )
    document_hints: int = Field(
        default=4096,
        ge=0,
        description=(
            "Sessions and runs documents the owner keeps as its transactions committed them, so "
            "that a run's next write starts from them instead of reading them again; each is "
            "checked against the database before the write commits (an owner copy that wrote "
            "meanwhile costs an attempt, never a wrong answer). 0 reads every one."
        ),
    )
    forget_turn_marks_keep_s: float = Field(
        default=DEFAULT_TURN_MARKS_KEEP.total_seconds(),
        gt=0,
        description=(
            "How long the mark of a turn a forget erased is kept (digests only): while it is, a late "
            "copy of that turn, or facts taken from it, are refused. Keep it above the retention of "
            "every topic (a late copy is at most that old); the default is 30 days."
        ),
    )
    retry_attempts: RetryAttempts = Field(
        default=5, description="Tries of one command on a transient database failure."
    )

    @property
    def forget_turn_marks_keep(self) -> timedelta:
        """`forget_turn_marks_keep_s` as a duration."""
        return timedelta(seconds=self.forget_turn_marks_keep_s)

    @property
    def previous_keys_token(self) -> str:
        """The token being rotated out, or "" when none is."""
        return self.keys_previous_token.get_secret_value() if self.keys_previous_token is not None else ""
