"""Profiles, the derived index (BM25, rehydrated, stale entries dropped) and the authority search."""

from __future__ import annotations

import asyncio

from quipu.contracts.errors import ErrorCode
from quipu.contracts.memory import IndexEntry, MemoryScope, Profile
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.memory.ranking import build_index_entry
from tests.conformance.memory_builders import ms, other_agent, refused, remember, scope, uid, update


async def _index_all(store: MemoryStore, who: MemoryScope) -> None:
    for fact in await store.list_facts(who):
        await store.upsert_index_entry(build_index_entry(fact, ms(1)))


async def test_profiles_are_kept_per_scope(memory_store: MemoryStore) -> None:
    who = scope()
    assert await memory_store.load_profile(who) is None
    profile = Profile(scope=who, text="Ana, backend engineer in Lima.", source_turns=12, updated_at=ms(5))
    assert await memory_store.save_profile(profile) == profile
    replaced = profile.model_copy(update={"text": "Ana, staff engineer.", "source_turns": 20})
    await memory_store.save_profile(replaced)
    assert await memory_store.load_profile(who) == replaced
    assert await memory_store.load_profile(other_agent(who, "agent-z")) is None
    assert await memory_store.load_profile(scope()) is None


async def test_the_index_ranks_by_bm25_and_rehydrates_canonical_facts(memory_store: MemoryStore) -> None:
    who = scope()
    await remember(
        memory_store, who,
        "Prefers PostgreSQL over MySQL for new projects.",
        "Deploys with Kubernetes on weekdays.",
        "Prefers PostgreSQL.",
    )  # fmt: skip
    await _index_all(memory_store, who)
    hits = await memory_store.search_index(who, "which database: postgresql?", 5)
    assert [hit.fact.text for hit in hits] == [
        "Prefers PostgreSQL.",
        "Prefers PostgreSQL over MySQL for new projects.",
    ]
    assert all(hit.source == "index" for hit in hits) and hits[0].score > hits[1].score > 0
    assert len(await memory_store.search_index(who, "postgresql", 1)) == 1
    assert await memory_store.search_index(who, "nothing matches", 5) == []


async def test_stale_deleted_and_foreign_entries_never_come_back(memory_store: MemoryStore) -> None:
    who = scope()
    updated, deleted, kept = await remember(
        memory_store, who, "Drinks coffee daily.", "Drinks coffee at night.", "Drinks coffee black."
    )
    await _index_all(memory_store, who)
    await memory_store.apply_fact_operations(who, [update(updated.fact_id, "Drinks tea daily.")], uid("key"))
    await memory_store.delete_fact(who, deleted.fact_id)

    hits = await memory_store.search_index(who, "coffee", 5)
    assert [hit.fact.fact_id for hit in hits] == [kept.fact_id]

    [other_agents] = await remember(memory_store, other_agent(who, "agent-b"), "Drinks coffee with milk.")
    [strangers] = await remember(memory_store, scope(tenant_id=who.tenant_id), "Drinks coffee too.")
    for fact in [other_agents, strangers]:
        [canonical] = [f for f in await memory_store.list_facts(fact.scope) if f.fact_id == fact.fact_id]
        await memory_store.upsert_index_entry(build_index_entry(canonical, ms(2)))
    assert [hit.fact.fact_id for hit in await memory_store.search_index(who, "coffee", 5)] == [kept.fact_id]
    every_agent = await memory_store.search_index(other_agent(who, ""), "coffee", 5)
    assert {hit.fact.fact_id for hit in every_agent} == {kept.fact_id, other_agents.fact_id}


async def test_an_older_entry_never_replaces_a_newer_one(memory_store: MemoryStore) -> None:
    who = scope()
    [fact] = await remember(memory_store, who, "Runs marathons.")
    [v1] = await memory_store.list_facts(who)
    await memory_store.apply_fact_operations(who, [update(fact.fact_id, "Swims every morning.")], uid("key"))
    [v2] = await memory_store.list_facts(who)
    await memory_store.upsert_index_entry(build_index_entry(v2, ms(3)))
    await memory_store.upsert_index_entry(build_index_entry(v1, ms(4)))
    assert [hit.fact.text for hit in await memory_store.search_index(who, "swims morning", 5)] == [
        "Swims every morning."
    ]
    assert await memory_store.search_index(who, "marathons", 5) == []


async def test_entries_need_a_live_fact_of_their_scope(memory_store: MemoryStore) -> None:
    who = scope()
    [fact] = await remember(memory_store, who, "Speaks Quechua.")
    [canonical] = await memory_store.list_facts(who)
    entry = build_index_entry(canonical, ms(1))
    await refused(
        memory_store.upsert_index_entry(entry.model_copy(update={"scope": scope()})), ErrorCode.FACT_NOT_FOUND
    )
    await refused(
        memory_store.upsert_index_entry(entry.model_copy(update={"fact_version": 2})),
        ErrorCode.INVALID_ARGUMENT,
    )
    await memory_store.delete_fact(who, fact.fact_id)
    await refused(memory_store.upsert_index_entry(entry), ErrorCode.FACT_NOT_FOUND)
    bogus = IndexEntry(
        fact_id=uid("fact"), scope=who, fact_version=1, terms={"x": 1}, length=1, indexed_at=ms(1)
    )
    await refused(memory_store.upsert_index_entry(bogus), ErrorCode.FACT_NOT_FOUND)


async def test_deleted_entries_leave_the_index_and_k_is_bounded(memory_store: MemoryStore) -> None:
    who = scope()
    first, second = await remember(memory_store, who, "Plays chess online.", "Plays chess at the club.")
    await _index_all(memory_store, who)
    await memory_store.delete_index_entries(who, [first.fact_id, uid("unknown")])
    await memory_store.delete_index_entries(scope(), [second.fact_id])  # another principal's call: no effect
    assert [hit.fact.fact_id for hit in await memory_store.search_index(who, "chess", 5)] == [second.fact_id]
    await refused(memory_store.search_index(who, "chess", 0), ErrorCode.INVALID_ARGUMENT)
    await refused(memory_store.search_authority(who, "chess", 101), ErrorCode.INVALID_ARGUMENT)


async def test_the_authority_search_needs_no_index(memory_store: MemoryStore) -> None:
    who = scope()
    older, newer, _ = await remember(
        memory_store, who, "Visited Cusco in May.", "Visited Lima in June.", "Owns a bike."
    )
    await remember(memory_store, scope(tenant_id=who.tenant_id), "Visited Cusco and Lima.")

    hits = await memory_store.search_authority(who, "Cusco trip", 5)
    assert [(hit.fact.fact_id, hit.score, hit.source) for hit in hits] == [(older.fact_id, 0.5, "authority")]
    both = await memory_store.search_authority(who, "visited", 5)
    assert {hit.fact.fact_id for hit in both} == {older.fact_id, newer.fact_id}
    assert len(await memory_store.search_authority(who, "", 2)) == 2
    await asyncio.sleep(0.005)  # the store's millisecond clock must move for recency to decide
    await memory_store.apply_fact_operations(
        who, [update(older.fact_id, "Visited Cusco in April.")], uid("key")
    )
    latest = await memory_store.search_authority(who, "visited", 5)
    assert latest[0].fact.fact_id == older.fact_id
