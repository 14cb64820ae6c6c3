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


class SteppedClock:
    """A store clock that stands still until moved (`advance`)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta) -> None:
        self.now += by


async def turn_marks_expire_after_their_keep(
    store: MemoryStore, clock: SteppedClock, keep: timedelta
) -> None:
    """The scenario of a store built with `clock` and `turn_marks_keep=keep`: an erased turn's
    mark refuses facts taken from it until a forget made past its keep drops it; the person's
    mark stays, and still refuses their earlier words."""
    who, bystander = scope(), scope()
    session_id = uid("session")
    await record_turns(store, session_id, who, 1)
    await store.forget_principal(who.tenant_id, who.principal_id)
    erased_turn = turn(session_id, who, 0)
    from_erased = new(uid("fact"), "Has two kids.").model_copy(
        update={"provenance": Provenance(session_id=session_id, turn_id=erased_turn.turn_id, message_seq=1)}
    )
    await refused(store.apply_fact_operations(who, [from_erased], uid("key")), ErrorCode.PRINCIPAL_FORGOTTEN)

    clock.advance(keep / 2)
    await store.forget_principal(bystander.tenant_id, bystander.principal_id)  # too early to drop
    await refused(store.apply_fact_operations(who, [from_erased], uid("key")), ErrorCode.PRINCIPAL_FORGOTTEN)

    clock.advance(keep)
    await store.forget_principal(bystander.tenant_id, bystander.principal_id)
    assert len(await store.apply_fact_operations(who, [from_erased], uid("key"))) == 1
    await refused(store.append_history_turn(erased_turn), ErrorCode.PRINCIPAL_FORGOTTEN)
