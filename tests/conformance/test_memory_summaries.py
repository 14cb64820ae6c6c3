"""Rolling summaries: conditional on version (stored + 1, first = 1) and a forward-only cursor."""

from __future__ import annotations

import asyncio

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.services.domain.memory.protocol import MemoryStore
from tests.conformance.memory_builders import record_turns, refused, scope, summary, uid


async def test_versions_follow_each_other_and_the_cursor_only_moves_forward(
    memory_store: MemoryStore,
) -> None:
    who, session_id = scope(), uid("session")
    await record_turns(memory_store, session_id, who, 5)
    assert await memory_store.load_summary(session_id) is None

    await refused(memory_store.save_summary(summary(session_id, 2, 2)), ErrorCode.MEMORY_CONFLICT)
    first = await memory_store.save_summary(summary(session_id, 2, 1, "première — résumé"))
    assert await memory_store.load_summary(session_id) == first

    await refused(memory_store.save_summary(summary(session_id, 4, 1)), ErrorCode.MEMORY_CONFLICT)
    await refused(memory_store.save_summary(summary(session_id, 4, 3)), ErrorCode.MEMORY_CONFLICT)
    await refused(memory_store.save_summary(summary(session_id, 2, 2)), ErrorCode.MEMORY_CONFLICT)
    await refused(memory_store.save_summary(summary(session_id, 1, 2)), ErrorCode.MEMORY_CONFLICT)
    second = await memory_store.save_summary(summary(session_id, 6, 2))
    assert await memory_store.load_summary(session_id) == second


async def test_the_cursor_stays_within_the_history(memory_store: MemoryStore) -> None:
    who, session_id = scope(), uid("session")
    await refused(memory_store.save_summary(summary(session_id, 1, 1)), ErrorCode.INVALID_ARGUMENT)
    await record_turns(memory_store, session_id, who, 1)
    await refused(memory_store.save_summary(summary(session_id, 3, 1)), ErrorCode.INVALID_ARGUMENT)
    await refused(memory_store.save_summary(summary(session_id, 0, 1)), ErrorCode.INVALID_ARGUMENT)
    assert await memory_store.load_summary(session_id) is None


async def test_of_two_racing_saves_of_one_version_exactly_one_wins(memory_store: MemoryStore) -> None:
    who, session_id = scope(), uid("session")
    await record_turns(memory_store, session_id, who, 3)
    outcomes = await asyncio.gather(
        memory_store.save_summary(summary(session_id, 2, 1, "left")),
        memory_store.save_summary(summary(session_id, 4, 1, "right")),
        return_exceptions=True,
    )
    failures = [outcome for outcome in outcomes if isinstance(outcome, StoreError)]
    assert len(failures) == 1 and failures[0].code is ErrorCode.MEMORY_CONFLICT
    stored = await memory_store.load_summary(session_id)
    assert stored is not None and stored in outcomes


async def test_a_sessions_memory_is_its_summary_and_its_tail_read_together(memory_store: MemoryStore) -> None:
    # What a turn shows of its session, in one call (one command through the owner).
    who, session_id = scope(), uid("session")
    empty = await memory_store.load_session_memory(session_id, 4)
    assert empty.summary is None and empty.tail == []
    await record_turns(memory_store, session_id, who, 3)
    saved = await memory_store.save_summary(summary(session_id, 2, 1, "première — résumé"))
    shown = await memory_store.load_session_memory(session_id, 4)
    assert shown.summary == saved == await memory_store.load_summary(session_id)
    assert shown.tail == await memory_store.history_tail(session_id, 4)
    assert [row.seq for row in shown.tail] == [3, 4, 5, 6]
    assert (await memory_store.load_session_memory(session_id, 0)).tail == []
    await refused(memory_store.load_session_memory(session_id, 501), ErrorCode.INVALID_ARGUMENT)
    await refused(memory_store.load_session_memory("", 4), ErrorCode.INVALID_ARGUMENT)
