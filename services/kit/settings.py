"""Settings every service shares, read from the environment (`QUIPU_...`).

Build them once (in `__main__` or `create_app`) and pass them in; nothing here
reads the environment at import time.

One vocabulary across the services: a field that means the same in two services has the same
name, type, bounds and description, declared once here (`StoreClientSettings`, the annotated
types `ConsumerGroup`, `RetryAttempts`, ...), and each service states only its own default. A
renamed field keeps its old variable as a deprecated alias (`renamed`): still read, with a
warning naming the new variable.

Two Kafka flavours need different client settings (PLATFORM_NOTES): real
Apache Kafka keeps the client defaults, the embedded Tansu broker needs short
fetch waits and session timeouts and no idempotent producer. The defaults
below are the production ones; `flavour="tansu"` (or `QUIPU_KAFKA_FLAVOUR=tansu`,
or `KafkaSettings.for_embedded`) switches every field that was not set
explicitly to the Tansu value.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KafkaFlavour = Literal["kafka", "tansu"]
OffsetReset = Literal["earliest", "latest"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def renamed(name: str, *old_names: str) -> AliasChoices:
    """The validation alias of a renamed field: `name` first, then the names it had before.

    The old names stay readable, under the class's prefix (`QUIPU_ENRICHER_ATTEMPTS` for
    `store_attempts` renamed from `attempts`), and building the settings with one of them warns
    (`FutureWarning`) with the new name; when both are set the new one wins.
    """
    return AliasChoices(name, *old_names)


class QuipuSettings(BaseSettings):
    """Base of every Quipu settings class: frozen, unknown variables ignored, renames honoured.

    A subclass sets only its `env_prefix`; the prefix applies to a renamed field's old names as
    well (see `renamed`).
    """

    model_config = SettingsConfigDict(
        frozen=True, extra="ignore", env_prefix_target="all", validate_by_name=True, validate_by_alias=True
    )

    @model_validator(mode="before")
    @classmethod
    def _warn_about_old_names(cls, data: Any) -> Any:
        """Say which variable replaces a deprecated one that was used (or an old keyword)."""
        prefix = str(cls.model_config.get("env_prefix", "")).upper()
        given = {key.upper() for key in data} if isinstance(data, dict) else set()
        variables = {key.upper() for key in os.environ}
        for name, field in cls.model_fields.items():
            if not isinstance(field.validation_alias, AliasChoices):
                continue
            for old in field.validation_alias.choices[1:]:
                if isinstance(old, str) and (old.upper() in given or f"{prefix}{old.upper()}" in variables):
                    warnings.warn(
                        f"{prefix}{old.upper()} is deprecated and will be removed: "
                        f"set {prefix}{name.upper()} instead",
                        FutureWarning,
                        stacklevel=2,
                    )
        return data


ConsumerGroup = Annotated[
    str,
    Field(
        min_length=1,
        description=(
            "Consumer group of the service's topics (the prefix of its groups where it has several); "
            "every copy of the service joins the same one."
        ),
    ),
]
"""A service's consumer group; each service gives its own default (`group: ConsumerGroup = "planner"`)."""

RetryAttempts = Annotated[
    int,
    Field(
        ge=1,
        description=(
            "Tries of one message on a transient failure (a retryable error or a timeout), with a "
            "jittered backoff between them, before it is left to be delivered again."
        ),
    ),
]
"""How often the delivery wrapper tries one message; each service gives its own default."""

StoreReplyTimeout = Annotated[
    float,
    Field(
        gt=0,
        description=(
            "How long one store command waits for the storage owner's reply before it is sent "
            "again (the identical command: the owner applies it once); raise it on a busy host."
        ),
    ),
]
"""How long a store client waits for one reply (`StoreClientSettings.store_reply_timeout_s`)."""

StoreAttempts = Annotated[
    int,
    Field(
        ge=1,
        description="Sends of one store command before the call fails as UNAVAILABLE.",
    ),
]
"""How often a store client sends one command (`StoreClientSettings.store_attempts`)."""

TANSU_CLIENT_SETTINGS: dict[str, Any] = {
    # The Tansu fetch long-poll does not wake on new data: a hop costs about
    # fetch_max_wait_ms / 2, so wait as little as possible.
    "fetch_max_wait_ms": 10,
    # ... but every idle consumer then fetches 100 times a second: the consumers no caller waits
    # on fetch 4 times a second instead (a hop of theirs costs ~125 ms).
    "background_fetch_max_wait_ms": 250,
    # ... and a consumer that saw nothing for idle_after_s fetches 4 times a second until it does
    # (100 ms: 88 Kafka requests a second from an idle fleet, 250 ms: 65).
    "idle_fetch_max_wait_ms": 250,
    # ... and those no caller waits on once a second: their first record after a quiet spell
    # starts its work up to a second late, and their process's idle fetches cost the broker
    # 0.4 % of a core against 1.0 % at 250 ms (measured, 8 partitions).
    "background_idle_fetch_max_wait_ms": 1000,
    # A group join takes max(1 s, session_timeout / 2) on Tansu, and
    # FastStream starts subscribers one after another.
    "session_timeout_ms": 2000,
    "heartbeat_interval_ms": 500,
    # aiokafka's InitProducerId v0 fails on Tansu (`UnknownError` at start).
    "enable_idempotence": False,
    # ListOffsets(latest) under-reports on Tansu, so "latest" loses messages.
    "auto_offset_reset": "earliest",
}
"""The client settings the embedded Tansu broker needs (PLATFORM_NOTES, Tansu)."""


class KafkaSettings(QuipuSettings):
    """How a service reaches Kafka, and how its producer and consumers behave."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_KAFKA_")

    bootstrap: str = Field(
        description="Comma-separated `host:port` list of brokers (QUIPU_KAFKA_BOOTSTRAP).",
    )
    topic_prefix: str = Field(
        default="",
        description=(
            "Prepended to every topic name and consumer group id; tests use a unique prefix "
            "to isolate themselves on a shared broker. Empty in production."
        ),
    )
    flavour: KafkaFlavour = Field(
        default="kafka",
        description=(
            "Which broker this is. `tansu` fills every client setting not given explicitly "
            "with the value the embedded Tansu broker needs."
        ),
    )
    client_id: str = Field(
        default="quipu",
        description="Kafka client id, shown in broker logs and quotas; services pass their name.",
    )
    acks: Literal["all", 1, 0] = Field(
        default="all",
        description="Producer acknowledgements; `all` waits for every in-sync replica.",
    )
    enable_idempotence: bool = Field(
        default=True,
        description=(
            "Idempotent producer (no duplicates from producer retries). Must be off on Tansu, "
            "where aiokafka's InitProducerId fails."
        ),
    )
    fetch_max_wait_ms: int = Field(
        default=500,
        ge=0,
        description=(
            "Longest time the broker holds a fetch waiting for data. On Tansu each hop costs "
            "about half of it, so the embedded value is 10."
        ),
    )
    background_fetch_max_wait_ms: int = Field(
        default=500,
        ge=0,
        description=(
            "The fetch wait of the consumers no caller waits on: the registries, cancels and the "
            "memory services (transcript recorder, fact extractor, enricher) with their store "
            "replies. An idle consumer fetches 1000 / wait times a second; on Tansu each of their "
            "hops costs about half the wait, so the embedded value is 250 (against 10)."
        ),
    )
    idle_fetch_max_wait_ms: int = Field(
        default=500,
        ge=0,
        description=(
            "The fetch wait of a consumer that has seen no new record for `idle_after_s`, until one "
            "comes, and of the one look-out that fetches for all of a process's consumers once every "
            "one is idle (kit.fetch_pace): the first message after a quiet spell waits up to it. "
            "Only used on Tansu (250 against 10), whose fetch does not wake on new data."
        ),
    )
    background_idle_fetch_max_wait_ms: int = Field(
        default=500,
        ge=0,
        description=(
            "The idle wait (`idle_fetch_max_wait_ms`) of the consumers no caller waits on, and of the "
            "look-out of a process that has no other: an idle transcript recorder, fact extractor "
            "or enricher fetches 1000 / wait times a second. Only used on Tansu (1000)."
        ),
    )
    idle_after_s: float = Field(
        default=2.0,
        gt=0,
        description="How long a consumer sees no new record before it fetches with the idle wait.",
    )
    own_record_within_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "A record this process published, seen by a consumer of the process within this long, "
            "is the process's own: it wakes only the consumers holding its partition, which park "
            "again once they have handed it out (kit.fetch_pace). Any other record is from "
            "elsewhere and wakes every consumer of the process. A partition and offset are the "
            "process's own whatever their age, so this only bounds what is remembered; it must "
            "outlast how late a consumer compares its marks (a look every 50 ms, longer on a busy "
            "machine: at 50 ms the process's own records were taken for others'). Only used on Tansu."
        ),
    )
    consumer_timeout_ms: int = Field(
        default=1_000,
        gt=0,
        description=(
            "Longest a consumer's background fetch routine sleeps when nothing wakes it (aiokafka's "
            "`consumer_timeout_ms`, 200 by default). A fetch's answer, a resume, a seek and a "
            "rebalance wake it at once, so this only bounds a wait nothing needs; each look is an "
            "event-loop wake-up (~0.2 ms of CPU on a small machine): at 200, five a second for "
            "every idle consumer of every process."
        ),
    )
    session_timeout_ms: int = Field(
        default=10_000,
        gt=0,
        description=(
            "A consumer silent this long is dropped from its group. Real Kafka refuses less "
            "than its group.min.session.timeout.ms (6000 by default)."
        ),
    )
    heartbeat_interval_ms: int = Field(
        default=3_000,
        gt=0,
        description="How often a consumer heartbeats its group; about a third of the session.",
    )
    reply_claim_session_timeout_ms: int = Field(
        default=10_000,
        ge=6_000,
        description=(
            "The session timeout of the store clients' claim group (kit.reply_claim), heartbeated "
            "a third as often. Nothing waits on that group's joins, so it keeps Kafka's usual "
            "timeout even on Tansu: fewer heartbeats, and a killed client's partition is free "
            "again this long after."
        ),
    )
    max_poll_interval_ms: int = Field(
        default=300_000,
        gt=0,
        description=(
            "Longest gap between two polls before the consumer is dropped from its group; "
            "every model or tool call timeout must stay well below it."
        ),
    )
    max_request_bytes: int = Field(
        default=1_048_576,
        gt=1024,
        description=(
            "Largest record the producer sends (aiokafka's max_request_size). Keep it at or below "
            "the broker's message.max.bytes (1048588 on Kafka by default): a dead letter bigger "
            "than it carries the original body's size and sha256 instead of the body."
        ),
    )
    share_producer: bool = Field(
        default=True,
        description=(
            "Whether the services of one process send through one producer (leases of it): "
            "their records share produce requests instead of each service sending its own. "
            "Off gives every service and store client a producer of its own."
        ),
    )
    dead_letter_attempts: int = Field(
        default=3,
        ge=1,
        description=(
            "Tries to publish one dead letter while the broker fails (then its smallest form is "
            "tried, and when that fails too the message is logged with its position and skipped)."
        ),
    )
    dead_letter_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest one dead-letter publish may wait for the broker before it counts as failed.",
    )
    auto_offset_reset: OffsetReset = Field(
        default="earliest",
        description=(
            "Where a new consumer group starts. `earliest`, so that nothing published before "
            "a group's first start is lost (effects are idempotent); on Tansu `latest` is wrong."
        ),
    )

    @field_validator("acks", mode="before")
    @classmethod
    def _acks_from_text(cls, value: Any) -> Any:
        """Accept `QUIPU_KAFKA_ACKS=1` (the environment only holds text)."""
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return "all" if int(value) == -1 else int(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _apply_flavour_defaults(cls, data: Any) -> Any:
        """Fill the client settings not given explicitly with the flavour's values."""
        if not isinstance(data, dict) or data.get("flavour") != "tansu":
            return data
        return {**TANSU_CLIENT_SETTINGS, **data}

    @model_validator(mode="after")
    def _check_heartbeat(self) -> KafkaSettings:
        """Refuse a heartbeat that cannot keep the session alive."""
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be lower than session_timeout_ms")
        return self

    def in_background(self) -> KafkaSettings:
        """These settings for consumers no caller waits on: they fetch with
        `background_fetch_max_wait_ms`, and with `background_idle_fetch_max_wait_ms` once idle."""
        busy = self.background_fetch_max_wait_ms
        idle = max(busy, self.background_idle_fetch_max_wait_ms)
        return self.model_copy(update={"fetch_max_wait_ms": busy, "idle_fetch_max_wait_ms": idle})

    @classmethod
    def for_embedded(cls, bootstrap: str, *, topic_prefix: str = "", **overrides: Any) -> KafkaSettings:
        """Settings for the embedded Tansu broker at `bootstrap` (see `TANSU_CLIENT_SETTINGS`)."""
        return cls(bootstrap=bootstrap, topic_prefix=topic_prefix, flavour="tansu", **overrides)


class MongoSettings(QuipuSettings):
    """How the storage owner reaches MongoDB (no other service holds these)."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_MONGO_")

    uri: SecretStr = Field(
        description=(
            "MongoDB connection string (QUIPU_MONGO_URI); it may carry credentials. "
            "SecantusDB needs `retryWrites=false` in it."
        ),
    )
    database: str = Field(
        default="quipu",
        min_length=1,
        description="Database holding every Quipu collection; tests use a unique name.",
    )


class ServiceSettings(QuipuSettings):
    """What every service process needs to describe itself: its name and how it logs."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_")

    service_name: str = Field(
        default="quipu",
        description="Name bound to every log line as `service` and used as the Kafka client id.",
    )
    log_level: LogLevel = Field(
        default="INFO",
        description="Lowest level logged, for Quipu and the libraries it uses.",
    )
    json_logs: bool | None = Field(
        default=None,
        description="JSON lines if true, a pretty console if false; unset: JSON unless on a TTY.",
    )
    log_repeat_burst: int = Field(
        default=10,
        ge=1,
        description=(
            "The same warning or error line is written at most this many times per "
            "`log_repeat_window_s`; the next one written says how many were held back."
        ),
    )
    log_repeat_window_s: float = Field(
        default=10.0,
        gt=0,
        description="The window of `log_repeat_burst`, in seconds.",
    )


class KeySettings(QuipuSettings):
    """Where a service asks for data keys (`QUIPU_KEYS_...`); no URL: messages are not sealed."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_KEYS_")

    url: str = Field(
        default="",
        description=(
            "Base URL of the storage owner's key endpoint (http://owner:8711). Empty: this service "
            "publishes its messages in plaintext and cannot open sealed ones."
        ),
    )
    token: SecretStr | None = Field(
        default=None, description="The service credential the key endpoint asks for (a Secret)."
    )
    token_file: Path | None = Field(
        default=None,
        description=(
            "A file holding that credential instead (a mounted Secret, or the one `quipu up` writes "
            "for its own user, readable by them only); read when the channel is opened."
        ),
    )
    cache_ttl_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a fetched key is kept in memory: how late a forget elsewhere reaches here.",
    )
    timeout_s: float = Field(default=5.0, gt=0, description="Longest wait for one key request.")

    @property
    def token_value(self) -> str:
        """The service token, or "" when none is set (an empty one is none: sealing is off)."""
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return ""


class SealingSettings(QuipuSettings):
    """Where a service that seals or opens messages asks for data keys: the key settings are read
    with the service's own (`QUIPU_KEYS_...`, the same for every service) and passed in with them."""

    keys: KeySettings = Field(
        default_factory=KeySettings,
        description="Where the service asks for data keys (`QUIPU_KEYS_...`, the same for every service).",
    )


class ConsumerSettings(SealingSettings):
    """How a service consumes its topics concurrently (`kit.concurrent_delivery`); each service's
    settings extend it under their own prefix (`QUIPU_PLANNER_MAX_IN_FLIGHT`, ...)."""

    registry_catch_up_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Bound on reading the registries the service serves from (tools.registry, agents.registry) "
            "to their end at start-up, before it takes any message; past it the service does not start."
        ),
    )
    max_in_flight: int = Field(
        default=32,
        ge=1,
        description=(
            "Messages handled at once per subscribed topic (one key's messages stay in order, other "
            "keys run beside them); when all are busy the consumer takes no more until one finishes."
        ),
    )
    gc_young_threshold: int = Field(
        default=10_000,
        ge=0,
        description=(
            "Allocations between two collections of the garbage collector's youngest generation, "
            "set for the whole process once the service started (Python's default is 700; 0 keeps "
            "it). What start-up built is frozen out of every collection then."
        ),
    )
    commit_linger_s: float = Field(
        default=0.05,
        ge=0,
        description=(
            "How long a consumer lets handled messages gather before it commits their offsets, in "
            "one commit of every partition that moved (0: at once). A crash delivers at most that "
            "much handled work again, which every handler takes as a redelivery."
        ),
    )
    shutdown_grace_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "SIGTERM to exit: the longest a stop takes, wedged or not. Messages in flight get "
            "`drain_share` of it to finish (the rest are delivered again); leaving the consumer "
            "groups and closing clients get the remainder."
        ),
    )
    drain_share: float = Field(
        default=0.6,
        gt=0,
        lt=1,
        description="The part of `shutdown_grace_s` that messages in flight get to finish on shutdown.",
    )
    revoke_grace_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "When partitions move to another copy, how long their messages in flight may finish and "
            "commit first; one still running after it is handled again by the new owner (an exact retry)."
        ),
    )

    @property
    def drain_grace_s(self) -> float:
        """How long messages in flight may finish on shutdown (`drain_share` of the grace)."""
        return self.shutdown_grace_s * self.drain_share


class StoreClientSettings(SealingSettings):
    """How a service's store calls wait for the storage owner (each service under its own prefix:
    `QUIPU_PLANNER_STORE_REPLY_TIMEOUT_S`, `QUIPU_CLI_STORE_ATTEMPTS`, ...)."""

    store_reply_timeout_s: StoreReplyTimeout = 5.0
    store_attempts: StoreAttempts = 3
    store_claim_partition: bool = Field(
        default=True,
        description=(
            "Whether the store client takes a partition of the replies topic of its own in the "
            "`store-replies` group (kit.reply_claim); without, it reads one picked at random, maybe "
            "shared with other clients (their replies are passed over, after being fetched)."
        ),
    )
