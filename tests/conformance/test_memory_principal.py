"""The principal's own controls: export everything, forget everything."""

from __future__ import annotations

from datetime import timedelta

from quipu.contracts.errors import ErrorCode
from quipu.contracts.memory import HistoryAppendResult, Profile, Provenance
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.memory.ranking import build_index_entry
from tests.conformance.memory_builders import (
    ms,
    new,
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
    said_after = utc_now_ms() + timedelta(seconds=1)
    again = turn(session_id, who, 0, uid("turn")).model_copy(update={"created_at": said_after})
    assert await memory_store.append_history_turn(again) == HistoryAppendResult(
        first_seq=1, last_seq=2, inserted=True
    )


async def test_a_late_copy_of_forgotten_words_is_refused(memory_store: MemoryStore) -> None:
    """A turn told again after forget (redelivered, or handled late), or anything derived from the
    person's earlier words, would come back under a key made anew: every such write is refused."""
    who = scope()
    session_id = uid("session")
    await record_turns(memory_store, session_id, who, 2)
    recorded = turn(session_id, who, 1)
    await memory_store.forget_principal(who.tenant_id, who.principal_id)
    after = utc_now_ms() + timedelta(seconds=1)

    # The erased turn, even dated after the forget; a turn said before it that was never recorded.
    late = recorded.model_copy(update={"created_at": after})
    await refused(memory_store.append_history_turn(late), ErrorCode.PRINCIPAL_FORGOTTEN)
    unrecorded = turn(session_id, who, 5, uid("turn"))
    await refused(memory_store.append_history_turn(unrecorded), ErrorCode.PRINCIPAL_FORGOTTEN)
    # Facts derived from an erased turn, a summary and a profile dated before the forget.
    from_erased = new(uid("fact"), "Has two kids.").model_copy(
        update={"provenance": Provenance(session_id=session_id, turn_id=recorded.turn_id, message_seq=3)}
    )
    await refused(
        memory_store.apply_fact_operations(who, [from_erased], uid("key")), ErrorCode.PRINCIPAL_FORGOTTEN
    )
    profile = Profile(scope=who, text="Parent.", source_turns=2, updated_at=ms())
    await refused(memory_store.save_profile(profile), ErrorCode.PRINCIPAL_FORGOTTEN)
    assert await memory_store.list_facts(other_agent(who, "")) == []
    assert await memory_store.load_profile(who) is None

    # What the person says after the forget is theirs to keep, summary and profile included.
    back = turn(session_id, who, 0, uid("turn")).model_copy(update={"created_at": after})
    assert (await memory_store.append_history_turn(back)).first_seq == 1
    await refused(memory_store.save_summary(summary(session_id, 2, 1)), ErrorCode.PRINCIPAL_FORGOTTEN)
    saved = await memory_store.save_summary(
        summary(session_id, 2, 1).model_copy(update={"updated_at": after})
    )
    assert (saved.cursor, saved.version) == (2, 1)
    assert await memory_store.save_profile(profile.model_copy(update={"updated_at": after})) is not None
    [fact] = await remember(memory_store, who, "Moved to Lima.")
    assert [f.fact_id for f in await memory_store.list_facts(who)] == [fact.fact_id]


async def test_forgetting_one_person_refuses_nothing_of_another(memory_store: MemoryStore) -> None:
    forgotten, bystander = scope(), scope()
    session_id, theirs = uid("session"), uid("session")
    await record_turns(memory_store, session_id, forgotten, 1)
    await memory_store.forget_principal(forgotten.tenant_id, forgotten.principal_id)
    # The same ids in another tenant or for another person, dated long before the forget.
    same_ids = turn(session_id, forgotten, 0).model_copy(update={"session_id": theirs, "scope": bystander})
    assert (await memory_store.append_history_turn(same_ids)).inserted
    assert await memory_store.save_summary(summary(theirs, 2, 1)) is not None
