"""Sealed messages: a topic message whose words travel encrypted under one principal's data key.

A message that carries a principal's words (or their model's answers) names whose key seals it in
`sealed_for`, in plaintext, and its word-carrying fields (`sealed_field_names()` of its model)
travel as one JSON object encrypted in `sealed` (padded base64 of the sealed-field format:
version, key tag, nonce, AES-256-GCM; the associated data is the canonical JSON of every clear
field, so a sealed part moved onto another message does not open). Ids, types, timestamps,
tenant and causality stay in clear: partitioning, routing, de-duplication and settling a message
whose key is gone need them, and they carry no words.

Forgetting a principal shreds their key: every copy of their messages on a topic (and in its
`.dlq`, which keeps the original bytes) becomes unreadable at once. A consumer reads such a
message as erased and settles it. A message without `sealed_for` is plaintext, as before: plain
producers and golden files decode unchanged.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SEALED_FOR_FIELD = "sealed_for"
"""The plaintext field naming whose data key seals a message."""

SEALED_FIELD = "sealed"
"""The wire-only field holding a sealed message's word-carrying fields, encrypted."""


class SealedFor(BaseModel):
    """Whose data key seals a message's words: the tenant and the principal (never the key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str = Field(default="", description="Tenant of the principal (empty: the default tenant).")
    principal_id: str = Field(
        description="The person whose words the message carries (empty: no one, the message is not sealed)."
    )


def without_empty(value: SealedFor | None) -> bool:
    """`exclude_if` of `sealed_for`: a message sealed for no one encodes as before the field."""
    return value is None


def refuse_unopened(data: Any) -> Any:
    """A model validator (mode="before"): a sealed message decoded without being opened first is
    refused, never read with its sealed fields at their defaults."""
    if isinstance(data, dict) and SEALED_FIELD in data:
        raise ValueError("a sealed message: open it with its principal's key before decoding")
    return data
