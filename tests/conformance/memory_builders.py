"""Builders for the memory conformance suite: unique scopes, turns, operations, and refusals."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import (
    FactChanged,
    FactOperation,
    FactOperationKind,
    HistoryAppendResult,
    HistoryTurn,
    MemoryScope,
    Provenance,
    SessionSummary,
)
from quipu.services.domain.memory.protocol import MemoryStore

T = TypeVar("T")

BASE = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)


def ms(offset: int = 0) -> datetime:
    """BASE + `offset` milliseconds."""
    return BASE + timedelta(milliseconds=offset)


def uid(prefix: str) -> str:
    """A unique identifier (tests share backends)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def scope(agent_id: str = "agent-a", principal_id: str = "", tenant_id: str = "") -> MemoryScope:
    """A fresh principal's scope (or the given one's)."""
    return MemoryScope(
        tenant_id=tenant_id or uid("tenant"), principal_id=principal_id or uid("person"), agent_id=agent_id
    )


def other_agent(base: MemoryScope, agent_id: str) -> MemoryScope:
    """The same person seen by another agent (or every agent, with "")."""
    return base.model_copy(update={"agent_id": agent_id})


def turn(session_id: str, who: MemoryScope, index: int = 0, turn_id: str = "") -> HistoryTurn:
    """Turn `index` of a session, with texts that name it."""
    return HistoryTurn(
        session_id=session_id,
        turn_id=turn_id or f"{session_id}-turn-{index}",
        scope=who,
        user_text=f"user says {index} — ¿qué tal? 🙂",
        assistant_text=f"assistant answers {index}",
        created_at=ms(index),
    )


async def record_turns(
    store: MemoryStore, session_id: str, who: MemoryScope, count: int
) -> list[HistoryAppendResult]:
    """Record `count` turns in order."""
    return [await store.append_history_turn(turn(session_id, who, index)) for index in range(count)]


def summary(session_id: str, cursor: int, version: int, text: str = "") -> SessionSummary:
    """A summary version."""
    return SessionSummary(
        session_id=session_id, text=text or f"summary up to {cursor}", cursor=cursor, version=version,
        model="scripted", updated_at=ms(cursor),
    )  # fmt: skip


PROVENANCE = Provenance(session_id="session-x", turn_id="turn-x", message_seq=1)


def new(fact_id: str, text: str) -> FactOperation:
    """Create a fact."""
    return FactOperation(kind=FactOperationKind.NEW, fact_id=fact_id, text=text, provenance=PROVENANCE)


def update(fact_id: str, text: str) -> FactOperation:
    """Reword a fact."""
    return FactOperation(kind=FactOperationKind.UPDATE, fact_id=fact_id, text=text, provenance=PROVENANCE)


def delete(fact_id: str) -> FactOperation:
    """Delete a fact."""
    return FactOperation(kind=FactOperationKind.DELETE, fact_id=fact_id, provenance=PROVENANCE)


async def remember(store: MemoryStore, who: MemoryScope, *texts: str) -> list[FactChanged]:
    """Create one fact per text under a fresh key; returns the created events (ids in order)."""
    operations = [new(uid("fact"), text) for text in texts]
    return await store.apply_fact_operations(who, operations, uid("key"))


async def refused(call: Awaitable[T], code: ErrorCode) -> StoreError:
    """Await `call`, which must fail with `code`."""
    with pytest.raises(StoreError) as caught:
        await call
    assert caught.value.code is code, caught.value
    return caught.value
