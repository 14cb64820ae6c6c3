"""Forget's turn marks are bounded: each forget drops those older than the owner's keep (the
in-memory store; tests/integration/test_memory_mongo.py runs the same scenario on MongoDB)."""

from __future__ import annotations

from datetime import timedelta

from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from tests.conformance.memory_builders import BASE, SteppedClock, turn_marks_expire_after_their_keep


async def test_turn_marks_expire_after_their_keep_and_the_persons_mark_stays() -> None:
    clock, keep = SteppedClock(BASE + timedelta(days=1)), timedelta(days=30)
    await turn_marks_expire_after_their_keep(
        InMemoryMemoryStore(clock=clock, turn_marks_keep=keep), clock, keep
    )
