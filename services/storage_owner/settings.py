"""Settings of the storage owner, on top of the shared Kafka and Mongo settings."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class OwnerSettings(BaseSettings):
    """How the storage owner consumes commands and protects cursors."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_OWNER_", frozen=True, extra="ignore")

    group: str = Field(default="storage-owner", description="Consumer group of every owner copy.")
    cursor_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key of listing cursors; unset: a key generated once and kept in MongoDB.",
    )
    master_key: SecretStr | None = Field(
        default=None,
        description=(
            "Master key wrapping each principal's memory data key: base64 of 32 random bytes "
            "(openssl rand -base64 32). Unset: one generated once and kept in MongoDB's `meta`, "
            "which protects nothing against whoever reads the database."
        ),
    )
    partition_workers: int = Field(
        default=1,
        ge=1,
        description=(
            "Consumers in this process, each owning some partitions of storage.commands, so "
            "partitions are applied concurrently, each in order. On Tansu more than one adds "
            "rebalances (slow joins) and, measured, no throughput: SecantusDB serialises writes."
        ),
    )
    retry_attempts: int = Field(
        default=5, ge=1, description="Tries of one command on a transient database failure."
    )
