"""ClaimSessionForTurn: a turn is admitted by its session's one owner, the recorded one first.

Over the in-memory and MongoDB pairs the rule runs over both stores; over Kafka it is one command
the owner applies to its own two stores (docs/store-contract.md §13).
"""

from __future__ import annotations

from quipu.contracts.errors import ErrorCode
from quipu.contracts.memory import MemoryScope
from quipu.contracts.store import SessionOwner
from tests.conformance.memory_builders import ms, refused, scope, turn, uid
from tests.conformance.memory_implementations import OwnerStores


async def _session(stores: OwnerStores, owner: MemoryScope | None = None) -> str:
    """A new session, recorded for `owner` (its tenant and principal) or for nobody."""
    session_id = uid("session")
    recorded = (
        None if owner is None else SessionOwner(tenant_id=owner.tenant_id, principal_id=owner.principal_id)
    )
    await stores.store.create_session(session_id, ms(0), recorded)
    return session_id


async def test_the_history_is_claimed_for_the_recorded_owner(owner_stores: OwnerStores) -> None:
    alice = scope()
    session_id = await _session(owner_stores, alice)
    assert await owner_stores.claims.claim_session_for_turn(session_id, alice) == alice
    # Claimed in the memory store itself: anybody else's claim or row there is refused.
    stranger = scope(tenant_id=alice.tenant_id)
    await refused(
        owner_stores.memory.claim_session(session_id, stranger), ErrorCode.SESSION_PRINCIPAL_MISMATCH
    )
    await refused(
        owner_stores.memory.append_history_turn(turn(session_id, stranger)),
        ErrorCode.SESSION_PRINCIPAL_MISMATCH,
    )
    recorded = await owner_stores.memory.append_history_turn(turn(session_id, alice))
    assert (recorded.first_seq, recorded.last_seq) == (1, 2)


async def test_a_turn_of_anybody_else_is_refused_and_claims_nothing(owner_stores: OwnerStores) -> None:
    alice = scope()
    session_id = await _session(owner_stores, alice)
    same_person_other_tenant = scope(principal_id=alice.principal_id)
    for stranger in (scope(tenant_id=alice.tenant_id), same_person_other_tenant):
        for _ in range(2):  # a redelivered turn is refused the same way
            await refused(
                owner_stores.claims.claim_session_for_turn(session_id, stranger),
                ErrorCode.SESSION_PRINCIPAL_MISMATCH,
            )
    # Nothing was claimed, not even for alice: her first claim now is the one that binds the history.
    alice_elsewhere = alice.model_copy(update={"agent_id": "agent-b"})
    assert await owner_stores.memory.claim_session(session_id, alice_elsewhere) == alice_elsewhere


async def test_the_turns_person_claims_a_session_recorded_for_nobody(owner_stores: OwnerStores) -> None:
    alice = scope()
    session_id = await _session(owner_stores)
    assert await owner_stores.claims.claim_session_for_turn(session_id, alice) == alice
    await refused(
        owner_stores.claims.claim_session_for_turn(session_id, scope(tenant_id=alice.tenant_id)),
        ErrorCode.SESSION_PRINCIPAL_MISMATCH,
    )
    # Another agent of the same person is admitted; the history keeps its first claim's agent.
    alice_elsewhere = alice.model_copy(update={"agent_id": "agent-b"})
    assert await owner_stores.claims.claim_session_for_turn(session_id, alice_elsewhere) == alice


async def test_a_history_owned_by_another_than_the_recorded_owner_is_refused(
    owner_stores: OwnerStores,
) -> None:
    alice, bob = scope(), scope()
    session_id = await _session(owner_stores, alice)
    await owner_stores.memory.claim_session(session_id, bob)  # a direct writer bound it first
    await refused(
        owner_stores.claims.claim_session_for_turn(session_id, alice), ErrorCode.SESSION_PRINCIPAL_MISMATCH
    )
    await refused(
        owner_stores.claims.claim_session_for_turn(session_id, bob), ErrorCode.SESSION_PRINCIPAL_MISMATCH
    )


async def test_a_recorded_owner_without_a_principal_is_the_sessions_anonymous_one(
    owner_stores: OwnerStores,
) -> None:
    tenant_id = uid("tenant")
    session_id = await _session(owner_stores, MemoryScope(tenant_id=tenant_id, principal_id=""))
    anonymous = MemoryScope(tenant_id=tenant_id, principal_id=f"session:{session_id}", agent_id="agent-a")
    await refused(
        owner_stores.claims.claim_session_for_turn(session_id, scope(tenant_id=tenant_id)),
        ErrorCode.SESSION_PRINCIPAL_MISMATCH,
    )
    assert await owner_stores.claims.claim_session_for_turn(session_id, anonymous) == anonymous


async def test_a_retry_returns_the_same_owner_and_writes_nothing_more(owner_stores: OwnerStores) -> None:
    alice = scope()
    session_id = await _session(owner_stores, alice)
    first = await owner_stores.claims.claim_session_for_turn(session_id, alice)
    await owner_stores.memory.append_history_turn(turn(session_id, alice))
    assert await owner_stores.claims.claim_session_for_turn(session_id, alice) == first
    assert [row.seq for row in await owner_stores.memory.list_history(session_id, 0, 500)] == [1, 2]


async def test_an_unknown_or_purged_session_is_refused_as_its_status_read(owner_stores: OwnerStores) -> None:
    alice = scope()
    never_made = uid("session")
    await refused(owner_stores.claims.claim_session_for_turn(never_made, alice), ErrorCode.SESSION_NOT_FOUND)
    bob = scope()
    assert await owner_stores.memory.claim_session(never_made, bob) == bob  # nothing was claimed for alice

    purged = await _session(owner_stores, alice)
    await owner_stores.store.end_session(purged, ms(1))
    await owner_stores.store.purge_session(purged)
    await refused(owner_stores.claims.claim_session_for_turn(purged, alice), ErrorCode.SESSION_PURGED)


async def test_bad_arguments_are_refused_before_anything_is_read(owner_stores: OwnerStores) -> None:
    alice = scope()
    await refused(owner_stores.claims.claim_session_for_turn("", alice), ErrorCode.INVALID_ARGUMENT)
    session_id = await _session(owner_stores, alice)
    no_principal = alice.model_copy(update={"principal_id": ""})
    await refused(
        owner_stores.claims.claim_session_for_turn(session_id, no_principal), ErrorCode.INVALID_ARGUMENT
    )
    # Unknown and unclaimed alike: validation comes first.
    await refused(
        owner_stores.claims.claim_session_for_turn(uid("session"), no_principal), ErrorCode.INVALID_ARGUMENT
    )
