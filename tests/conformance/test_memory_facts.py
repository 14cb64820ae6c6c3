"""Curated facts: atomic batches, versions and audit trail, idempotency keys, scope boundaries."""

from __future__ import annotations

from quipu.contracts.errors import ErrorCode
from quipu.contracts.memory import FactChangeKind
from quipu.services.domain.memory.protocol import MemoryStore
from tests.conformance.memory_builders import (
    PROVENANCE,
    delete,
    new,
    other_agent,
    refused,
    remember,
    scope,
    uid,
    update,
)


async def test_new_update_delete_with_versions_and_an_audit_trail(memory_store: MemoryStore) -> None:
    who = scope()
    created = await remember(
        memory_store, who, "Prefers answers in technical English.", "Uses PostgreSQL 16."
    )
    assert [(c.kind, c.version) for c in created] == [(FactChangeKind.CREATED, 1)] * 2
    first, second = (change.fact_id for change in created)

    changes = await memory_store.apply_fact_operations(
        who, [update(first, "Prefers answers in Spanish."), delete(second)], uid("key")
    )
    assert [(c.kind, c.fact_id, c.version, c.text) for c in changes] == [
        (FactChangeKind.UPDATED, first, 2, "Prefers answers in Spanish."),
        (FactChangeKind.DELETED, second, 2, ""),
    ]
    assert all(change.scope == who and change.tenant_id == who.tenant_id for change in changes)

    facts = await memory_store.list_facts(who)
    assert [(f.fact_id, f.text, f.version) for f in facts] == [(first, "Prefers answers in Spanish.", 2)]
    assert facts[0].provenance == PROVENANCE and facts[0].created_at <= facts[0].updated_at

    audit = await memory_store.fact_audit(who)
    assert sorted((f.fact_id, f.text, f.version) for f in audit) == sorted(
        [(first, "Prefers answers in technical English.", 1), (second, "Uses PostgreSQL 16.", 1)]
    )

    twice = await memory_store.apply_fact_operations(
        who, [update(first, "Prefers short answers.")], uid("key")
    )
    assert twice[0].version == 3
    assert [f.version for f in await memory_store.fact_audit(who) if f.fact_id == first] == [1, 2]


async def test_a_repeated_key_returns_the_original_changes_and_writes_nothing(
    memory_store: MemoryStore,
) -> None:
    who, key = scope(), uid("key")
    fact_id = uid("fact")
    original = await memory_store.apply_fact_operations(who, [new(fact_id, "Lives in Lima.")], key)
    again = await memory_store.apply_fact_operations(who, [new(fact_id, "Lives in Lima.")], key)
    assert again == original and [c.event_id for c in again] == [c.event_id for c in original]

    different = await memory_store.apply_fact_operations(who, [update(fact_id, "Lives in Cusco.")], key)
    assert different == original
    assert [f.text for f in await memory_store.list_facts(who)] == ["Lives in Lima."]
    assert await memory_store.fact_audit(who) == []


async def test_a_batch_is_all_or_nothing(memory_store: MemoryStore) -> None:
    who = scope()
    [kept] = await remember(memory_store, who, "Has a dog named Rex.")
    batch = [new(uid("fact"), "Likes tea."), update(kept.fact_id, "Has a cat."), update(uid("missing"), "x")]
    await refused(memory_store.apply_fact_operations(who, batch, uid("key")), ErrorCode.FACT_NOT_FOUND)
    facts = await memory_store.list_facts(who)
    assert [(f.text, f.version) for f in facts] == [("Has a dog named Rex.", 1)]
    assert await memory_store.fact_audit(who) == []


async def test_fact_ids_are_never_reused(memory_store: MemoryStore) -> None:
    who = scope()
    [fact] = await remember(memory_store, who, "Works at night.")
    await refused(
        memory_store.apply_fact_operations(who, [new(fact.fact_id, "Works by day.")], uid("key")),
        ErrorCode.INVALID_ARGUMENT,
    )
    await memory_store.delete_fact(who, fact.fact_id)
    await refused(
        memory_store.apply_fact_operations(who, [new(fact.fact_id, "Works by day.")], uid("key")),
        ErrorCode.INVALID_ARGUMENT,
    )
    twin = uid("fact")
    await refused(
        memory_store.apply_fact_operations(who, [new(twin, "a"), update(twin, "b")], uid("key")),
        ErrorCode.INVALID_ARGUMENT,
    )


async def test_bad_operations_are_refused(memory_store: MemoryStore) -> None:
    who = scope()
    for operations, key in (
        ([new(uid("fact"), "   ")], uid("key")),
        ([new("", "text")], uid("key")),
        ([new(uid("fact"), "x" * 2001)], uid("key")),
        ([new(uid("fact"), "ok")], ""),
    ):
        await refused(memory_store.apply_fact_operations(who, operations, key), ErrorCode.INVALID_ARGUMENT)
    nobody = who.model_copy(update={"principal_id": ""})
    await refused(
        memory_store.apply_fact_operations(nobody, [new(uid("f"), "x")], uid("k")), ErrorCode.INVALID_ARGUMENT
    )
    assert await memory_store.list_facts(who) == []


async def test_scope_boundaries(memory_store: MemoryStore) -> None:
    who = scope(agent_id="agent-a")
    [own] = await remember(memory_store, who, "Prefers email.")
    [theirs] = await remember(memory_store, other_agent(who, "agent-b"), "Prefers phone calls.")
    [shared] = await remember(memory_store, other_agent(who, ""), "Is called Ana.")
    stranger = scope(agent_id="agent-a", tenant_id=who.tenant_id)
    [foreign] = await remember(memory_store, stranger, "Lives in Quito.")
    same_person_other_tenant = scope(agent_id="agent-a", principal_id=who.principal_id)
    await remember(memory_store, same_person_other_tenant, "Other tenant's fact.")

    ids = {f.fact_id for f in await memory_store.list_facts(who)}
    assert ids == {own.fact_id, shared.fact_id}
    every_agent = {f.fact_id for f in await memory_store.list_facts(other_agent(who, ""))}
    assert every_agent == {own.fact_id, theirs.fact_id, shared.fact_id}

    for fact_id in (theirs.fact_id, foreign.fact_id, uid("fact")):
        await refused(
            memory_store.apply_fact_operations(who, [update(fact_id, "hijacked")], uid("key")),
            ErrorCode.FACT_NOT_FOUND,
        )
        await refused(memory_store.delete_fact(who, fact_id), ErrorCode.FACT_NOT_FOUND)
    assert [f.text for f in await memory_store.list_facts(stranger)] == ["Lives in Quito."]
    # A principal-wide fact may be reworded by any agent of the person.
    changed = await memory_store.apply_fact_operations(
        who, [update(shared.fact_id, "Is called Ana María.")], uid("k")
    )
    assert changed[0].scope == other_agent(who, "")


async def test_delete_fact_is_a_user_delete_and_repeats_as_the_same_event(memory_store: MemoryStore) -> None:
    who = scope()
    [fact] = await remember(memory_store, who, "Allergic to nothing.")
    deleted = await memory_store.delete_fact(who, fact.fact_id)
    assert (deleted.kind, deleted.fact_id, deleted.version, deleted.text) == (
        FactChangeKind.DELETED,
        fact.fact_id,
        2,
        "",
    )
    assert await memory_store.delete_fact(who, fact.fact_id) == deleted
    assert await memory_store.list_facts(who) == []
    assert [f.text for f in await memory_store.fact_audit(who)] == ["Allergic to nothing."]
