"""Metadata every topic message carries (CONVENTIONS: Contracts)."""

from __future__ import annotations

import uuid
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quipu.contracts.sealed import SealedFor, refuse_unopened, without_empty
from quipu.contracts.wire import Timestamp, utc_now_ms

QUIPU_NAMESPACE = uuid.UUID("6b3c2f0e-9a51-4c1e-8f7d-2a9e5d4b7c10")


def derive_id(parent_id: str, step: str) -> str:
    """Deterministic output id: uuid5 of the input's id and the step, so redelivery repeats it."""
    return str(uuid.uuid5(QUIPU_NAMESPACE, f"{parent_id}/{step}"))


class Envelope(BaseModel):
    """Base of every topic payload: idempotency key, version, time, tenant and causality."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_id: str = Field(
        default_factory=lambda: str(uuid.uuid4()),
        description="Idempotency key of this message; outputs derive theirs with uuid5.",
    )
    schema_version: int = Field(default=1, description="Payload schema version; bumped with an upcaster.")
    occurred_at: Timestamp = Field(default_factory=utc_now_ms, description="When the producer made it.")
    tenant_id: str = Field(default="", description="Tenant the message belongs to.")
    correlation_id: str = Field(default="", description="Ties a request to its replies and effects.")
    causation_id: str = Field(default="", description="event_id of the message that caused this one.")
    sealed_for: SealedFor | None = Field(
        default=None,
        exclude_if=without_empty,
        description=(
            "Whose data key seals this message's words (quipu.contracts.sealed); absent: a plaintext message."
        ),
    )

    sealed_fields: ClassVar[frozenset[str]] = frozenset()
    """The fields that carry a principal's words: sealed on the wire when `sealed_for` is set."""

    _refuse_unopened = model_validator(mode="before")(refuse_unopened)

    @classmethod
    def sealed_field_names(cls) -> frozenset[str]:
        """The fields a sealed message of this type carries encrypted."""
        return cls.sealed_fields
