"""A claim takes its session's history for new: the first attempt inserts the session's
bookkeeping without reading it, and every answer stays the one a read would give
(services/storage_owner/mongo_memory_transaction.py, `likely_absent`).

The session's unique `_id` confirms the insert; a session that was there fails the first attempt,
and the retry reads it. Alone and in groups (group commit), on two stores of one database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import MemoryScope
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.memory.transaction import MemorySession, MemoryTransaction
from quipu.services.storage_owner.mongo import TransactionPolicy
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from tests.conformance.memory_builders import scope, uid
from tests.owner_support import CommandLog, client_on

SESSIONS = "memory_sessions"


@pytest.fixture(params=[TransactionPolicy(), TransactionPolicy(group_max=8)], ids=["alone", "grouped"])
async def logged(
    stack: EmbeddedStack, database: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[MongoMemoryStore, CommandLog]]:
    """A memory store whose client logs every command it sends, applying operations alone or grouped."""
    log = CommandLog()
    client = client_on(stack.mongo_uri, event_listeners=[log])
    memory = await MongoMemoryStore.open(client, database, policy=request.param)
    yield memory, log
    await client.close()


async def test_a_new_sessions_claim_reads_no_session(logged: tuple[MongoMemoryStore, CommandLog]) -> None:
    memory, log = logged
    session_id, person = uid("session"), scope()
    log.commands.clear()
    assert await memory.claim_session(session_id, person) == person
    assert log.finds_of(SESSIONS) == []
    assert await memory.claim_session(session_id, person) == person  # the session is there now


async def test_a_claimed_session_answers_as_a_read_would(logged: tuple[MongoMemoryStore, CommandLog]) -> None:
    memory, _ = logged
    session_id, owner = uid("session"), scope()
    await memory.claim_session(session_id, owner)
    again = MemoryScope(tenant_id=owner.tenant_id, principal_id=owner.principal_id, agent_id="agent-b")
    assert await memory.claim_session(session_id, again) == owner
    with pytest.raises(StoreError) as refusal:
        await memory.claim_session(session_id, scope())
    assert refusal.value.code is ErrorCode.SESSION_PRINCIPAL_MISMATCH


@pytest.fixture
async def copies(stack: EmbeddedStack, database: str) -> AsyncIterator[list[MongoMemoryStore]]:
    """Two memory stores on the test's database, each on a client of its own (two owner copies)."""
    opened = [
        await MongoMemoryStore.open(client_on(stack.mongo_uri), database, owns_client=True) for _ in range(2)
    ]
    yield opened
    for copy in opened:
        await copy.close()


async def test_another_copys_claim_is_found_on_the_retry(copies: list[MongoMemoryStore]) -> None:
    elsewhere, here = copies
    session_id, owner = uid("session"), scope()
    assert await elsewhere.claim_session(session_id, owner) == owner
    with pytest.raises(StoreError) as refusal:
        await here.claim_session(session_id, scope())
    assert refusal.value.code is ErrorCode.SESSION_PRINCIPAL_MISMATCH
    assert await here.claim_session(session_id, owner) == owner


async def test_racing_claims_of_a_new_session_have_one_winner(copies: list[MongoMemoryStore]) -> None:
    for _ in range(5):
        session_id, people = uid("session"), [scope(), scope()]
        outcomes = await asyncio.gather(
            *(copy.claim_session(session_id, person) for copy, person in zip(copies, people, strict=True)),
            return_exceptions=True,
        )
        winners = [outcome for outcome in outcomes if isinstance(outcome, MemoryScope)]
        refusals = [outcome for outcome in outcomes if isinstance(outcome, StoreError)]
        assert len(winners) == 1 and len(refusals) == 1, outcomes
        assert refusals[0].code is ErrorCode.SESSION_PRINCIPAL_MISMATCH
        for copy in copies:
            assert await copy.claim_session(session_id, winners[0]) == winners[0]


async def test_a_session_taken_for_new_and_not_saved_is_read_before_the_answer(
    logged: tuple[MongoMemoryStore, CommandLog],
) -> None:
    memory, _ = logged
    session_id, owner = uid("session"), scope()
    await memory.claim_session(session_id, owner)

    async def look(tx: MemoryTransaction) -> MemorySession | None:
        return await tx.load_session(session_id, likely_absent=True)

    found = await memory.transactions.run(look)
    assert found is not None and found.scope == owner
