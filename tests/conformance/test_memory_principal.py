"""The principal's own controls: export everything, forget everything."""

from __future__ import annotations

from quipu.contracts.errors import ErrorCode
from quipu.contracts.memory import Profile
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.memory.ranking import build_index_entry
from tests.conformance.memory_builders import (
    ms,
    other_agent,
    record_turns,
    refused,
    remember,
    scope,
    summary,
    turn,
    uid,
    update,
)


async def test_export_holds_facts_audit_and_profile(memory_store: MemoryStore) -> None:
    who = scope()
    [fact] = await remember(memory_store, who, "Prefers tea.")
    await memory_store.apply_fact_operations(who, [update(fact.fact_id, "Prefers green tea.")], uid("key"))
    profile = await memory_store.save_profile(
        Profile(scope=who, text="Tea lover.", source_turns=3, updated_at=ms())
    )
    await remember(memory_store, scope(tenant_id=who.tenant_id), "Someone else's fact.")

    exported = await memory_store.export_principal(who)
    assert exported.scope == who and exported.profile == profile
    assert [(f.text, f.version) for f in exported.facts] == [("Prefers green tea.", 2)]
    assert [(f.text, f.version) for f in exported.audit] == [("Prefers tea.", 1)]


async def test_forget_erases_every_trace_and_nothing_else(memory_store: MemoryStore) -> None:
    who = scope(agent_id="agent-a")
    session_id, other_session = uid("session"), uid("session")
    await record_turns(memory_store, session_id, who, 2)
    await record_turns(memory_store, other_session, other_agent(who, "agent-b"), 1)
    await memory_store.save_summary(summary(session_id, 2, 1))
    facts = await remember(memory_store, who, "Has two kids.", "Drives a red car.")
    await memory_store.apply_fact_operations(who, [update(facts[0].fact_id, "Has three kids.")], uid("key"))
    await remember(memory_store, other_agent(who, "agent-b"), "Likes jazz.")
    for fact in await memory_store.list_facts(other_agent(who, "")):
        await memory_store.upsert_index_entry(build_index_entry(fact, ms(1)))
    await memory_store.save_profile(Profile(scope=who, text="Parent.", source_turns=2, updated_at=ms()))

    bystander = scope(tenant_id=who.tenant_id)
    bystander_session = uid("session")
    await record_turns(memory_store, bystander_session, bystander, 1)
    [kept] = await remember(memory_store, bystander, "Has two kids.")

    # 6 history rows, 1 summary, 3 facts, 1 audit entry, 1 profile, 3 index entries.
    assert await memory_store.forget_principal(who.tenant_id, who.principal_id) == 15

    everyone = other_agent(who, "")
    assert await memory_store.list_history(session_id, 0, 500) == []
    assert await memory_store.history_tail(other_session, 10) == []
    assert await memory_store.load_summary(session_id) is None
    assert await memory_store.list_facts(everyone) == []
    assert await memory_store.fact_audit(everyone) == []
    assert await memory_store.load_profile(who) is None
    assert await memory_store.search_index(everyone, "kids car jazz", 10) == []
    assert await memory_store.search_authority(everyone, "kids car jazz", 10) == []
    await refused(memory_store.delete_fact(who, facts[1].fact_id), ErrorCode.FACT_NOT_FOUND)
    assert await memory_store.forget_principal(who.tenant_id, who.principal_id) == 0

    assert len(await memory_store.list_history(bystander_session, 0, 500)) == 2
    assert [f.fact_id for f in await memory_store.list_facts(bystander)] == [kept.fact_id]

    # The person may come back: a new history starts from seq 1.
    again = await memory_store.append_history_turn(turn(session_id, who, 0))
    assert (again.first_seq, again.inserted) == (1, True)
