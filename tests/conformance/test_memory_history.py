"""Product history: two rows per turn, gapless per-session seqs, idempotent by turn id."""

from __future__ import annotations

from quipu.contracts.errors import ErrorCode
from quipu.contracts.memory import HistoryRole
from quipu.services.domain.memory.protocol import MemoryStore
from tests.conformance.memory_builders import ms, record_turns, refused, scope, turn, uid


async def test_a_turn_is_two_rows_with_the_next_seqs(memory_store: MemoryStore) -> None:
    who, session_id = scope(), uid("session")
    results = await record_turns(memory_store, session_id, who, 3)
    assert [(r.first_seq, r.last_seq, r.inserted) for r in results] == [
        (1, 2, True),
        (3, 4, True),
        (5, 6, True),
    ]

    rows = await memory_store.list_history(session_id, 0, 500)
    assert [row.seq for row in rows] == [1, 2, 3, 4, 5, 6]
    assert [row.role for row in rows[:2]] == [HistoryRole.USER, HistoryRole.ASSISTANT]
    first = turn(session_id, who, 0)
    assert (rows[0].text, rows[1].text) == (first.user_text, first.assistant_text)
    assert rows[0].turn_id == first.turn_id and rows[0].created_at == ms(0)
    assert (rows[0].principal_id, rows[0].agent_id) == (who.principal_id, who.agent_id)


async def test_sessions_count_apart(memory_store: MemoryStore) -> None:
    who = scope()
    one, two = uid("session"), uid("session")
    await record_turns(memory_store, one, who, 2)
    result = await memory_store.append_history_turn(turn(two, who, 0))
    assert (result.first_seq, result.last_seq) == (1, 2)


async def test_the_same_turn_again_writes_nothing_and_returns_its_seqs(memory_store: MemoryStore) -> None:
    who, session_id = scope(), uid("session")
    await record_turns(memory_store, session_id, who, 2)
    again = await memory_store.append_history_turn(turn(session_id, who, 0))
    assert (again.first_seq, again.last_seq, again.inserted) == (1, 2, False)
    assert len(await memory_store.list_history(session_id, 0, 500)) == 4
    following = await memory_store.append_history_turn(turn(session_id, who, 2))
    assert (following.first_seq, following.last_seq) == (5, 6)


async def test_listing_pages_and_the_tail(memory_store: MemoryStore) -> None:
    who, session_id = scope(), uid("session")
    await record_turns(memory_store, session_id, who, 5)
    assert [row.seq for row in await memory_store.list_history(session_id, 3, 4)] == [4, 5, 6, 7]
    assert [row.seq for row in await memory_store.list_history(session_id, 8, 4)] == [9, 10]
    assert await memory_store.list_history(session_id, 10, 4) == []
    assert [row.seq for row in await memory_store.history_tail(session_id, 3)] == [8, 9, 10]
    assert [row.seq for row in await memory_store.history_tail(session_id, 50)] == list(range(1, 11))
    assert await memory_store.history_tail(session_id, 0) == []
    assert await memory_store.history_tail(uid("session"), 5) == []
    assert await memory_store.list_history(uid("session"), 0, 5) == []


async def test_bad_arguments_are_refused(memory_store: MemoryStore) -> None:
    who, session_id = scope(), uid("session")
    await record_turns(memory_store, session_id, who, 1)
    await refused(memory_store.list_history(session_id, 0, 0), ErrorCode.INVALID_ARGUMENT)
    await refused(memory_store.list_history(session_id, 0, 501), ErrorCode.INVALID_ARGUMENT)
    await refused(memory_store.list_history(session_id, -1, 5), ErrorCode.INVALID_ARGUMENT)
    await refused(memory_store.history_tail(session_id, 501), ErrorCode.INVALID_ARGUMENT)
    no_principal = who.model_copy(update={"principal_id": ""})
    await refused(
        memory_store.append_history_turn(turn(session_id, no_principal, 1)), ErrorCode.INVALID_ARGUMENT
    )
    stranger = scope(tenant_id=who.tenant_id)
    await refused(
        memory_store.append_history_turn(turn(session_id, stranger, 1)), ErrorCode.SESSION_PRINCIPAL_MISMATCH
    )
    assert len(await memory_store.list_history(session_id, 0, 500)) == 2


async def test_the_first_claim_makes_the_owner_for_good(memory_store: MemoryStore) -> None:
    alice, session_id = scope(), uid("session")
    assert await memory_store.claim_session(session_id, alice) == alice
    other_agent_of_alice = alice.model_copy(update={"agent_id": "agent-b"})
    assert await memory_store.claim_session(session_id, other_agent_of_alice) == alice
    for stranger in (scope(tenant_id=alice.tenant_id), scope(principal_id=alice.principal_id)):
        await refused(memory_store.claim_session(session_id, stranger), ErrorCode.SESSION_PRINCIPAL_MISMATCH)
        await refused(
            memory_store.append_history_turn(turn(session_id, stranger, 0)),
            ErrorCode.SESSION_PRINCIPAL_MISMATCH,
        )
    assert await memory_store.list_history(session_id, 0, 500) == []
    recorded = await memory_store.append_history_turn(turn(session_id, alice, 0))
    assert (recorded.first_seq, recorded.last_seq) == (1, 2)


async def test_a_session_with_history_is_owned_by_its_first_turn(memory_store: MemoryStore) -> None:
    alice, session_id = scope(), uid("session")
    await record_turns(memory_store, session_id, alice, 1)
    assert await memory_store.claim_session(session_id, alice) == alice
    await refused(
        memory_store.claim_session(session_id, scope(tenant_id=alice.tenant_id)),
        ErrorCode.SESSION_PRINCIPAL_MISMATCH,
    )
    no_principal = alice.model_copy(update={"principal_id": ""})
    await refused(memory_store.claim_session(session_id, no_principal), ErrorCode.INVALID_ARGUMENT)
