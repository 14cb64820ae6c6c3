"""The enricher on the real embedded broker, against the real storage owner (MongoDB memory store).

Facts are written through the owner (`KafkaMemoryStore`); the owner publishes each committed
change on `memory.changes`; the enricher (in this process, its own Kafka client to the owner)
builds the index. Everything a test checks goes through the owner too: search_index,
search_authority, reindex. Malformed changes go in as raw bytes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from faststream import FastStream

from quipu.contracts.memory import FactOperation, FactOperationKind, MemoryScope, Provenance, ScoredFact
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.memory.reindex import Principal, principals_from_changes, reindex
from quipu.services.domain.memory.retrieval_eval import (
    LabelledSet,
    evaluate,
    load_labelled,
    record_facts,
    with_fallback,
)
from quipu.services.enricher.app import create_app
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.kit.memory_client import KafkaMemoryStore
from tests.integration.test_gateway_support import ServedStack, eventually, unique_name
from tests.owner_support import RawPublisher, TopicReader, mongo_client
from tests.timing import scaled

pytestmark = pytest.mark.slow

LABELLED = Path(__file__).parents[1] / "data" / "retrieval_labelled.json"
ANA = MemoryScope(tenant_id="acme", principal_id="ana")
PROVENANCE = Provenance(session_id="s-1", turn_id="t-1")


@asynccontextmanager
async def served_memory(stack: EmbeddedStack) -> AsyncIterator[tuple[ServedStack, KafkaMemoryStore]]:
    async with ServedStack(stack, unique_name()) as served:
        yield served, KafkaMemoryStore(served.store)


@asynccontextmanager
async def enricher(served: ServedStack) -> AsyncIterator[FastStream]:
    app = create_app(served.kafka, EnricherSettings(store_reply_timeout_s=scaled(10.0)))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


def ids(hits: list[ScoredFact]) -> list[str]:
    return [hit.fact.fact_id for hit in hits]


async def add(memory: KafkaMemoryStore, scope: MemoryScope, fact_id: str, text: str) -> None:
    operation = FactOperation(kind=FactOperationKind.NEW, fact_id=fact_id, text=text, provenance=PROVENANCE)
    await memory.apply_fact_operations(scope, [operation], f"new/{fact_id}")


def principals(labelled: LabelledSet) -> list[Principal]:
    return list(
        dict.fromkeys(
            Principal(tenant_id=fact.tenant_id, principal_id=fact.principal_id) for fact in labelled.facts
        )
    )


async def test_changes_reach_the_index_and_a_deletion_leaves_it(stack: EmbeddedStack) -> None:
    async with served_memory(stack) as (served, memory), enricher(served):
        await add(memory, ANA, "f-1", "Flies out of Lisbon airport.")
        await add(memory, ANA, "f-2", "Prefers aisle seats on flights.")

        async def indexed() -> bool:
            return set(ids(await memory.search_index(ANA, "Lisbon flights", 5))) == {"f-1", "f-2"}

        await eventually(indexed)
        await memory.apply_fact_operations(
            ANA,
            [
                FactOperation(
                    kind=FactOperationKind.UPDATE,
                    fact_id="f-1",
                    text="Flies out of Porto.",
                    provenance=PROVENANCE,
                )
            ],
            "update/f-1",
        )

        async def updated() -> bool:
            return ids(await memory.search_index(ANA, "Porto", 5)) == ["f-1"]

        await eventually(updated)
        assert ids(await memory.search_index(ANA, "Lisbon", 5)) == []

        await memory.delete_fact(ANA, "f-2")
        # Gone from every path at once (rehydration), before the enricher even sees the change.
        assert await memory.search_index(ANA, "aisle seats", 5) == []
        assert await memory.search_authority(ANA, "aisle seats", 5) == []

        client = mongo_client(stack)
        index = client[served.mongo.database]["memory_index"]  # the owner's derived-entry collection
        try:

            async def entry_gone() -> bool:
                return await index.find_one({"_id": "f-2"}) is None

            await eventually(entry_gone)
            assert await index.find_one({"_id": "f-1"}) is not None
        finally:
            await client.close()


async def test_with_the_enricher_stopped_the_authority_answers(stack: EmbeddedStack) -> None:
    full = load_labelled(LABELLED)  # one tenant's half is enough here; the unit test runs it all
    labelled = LabelledSet(
        facts=[fact for fact in full.facts if fact.tenant_id == "acme"],
        queries=[query for query in full.queries if query.tenant_id == "acme"],
    )
    async with served_memory(stack) as (_, memory):
        await record_facts(memory, labelled)
        assert (await evaluate("index", memory.search_index, labelled)).recall_at_k == 0.0
        result = await evaluate(
            "fallback", with_fallback(memory.search_index, memory.search_authority), labelled
        )
        assert result.recall_at_k >= 0.6 and result.foreign_hits == 0, result.summary()


async def test_malformed_changes_are_dead_lettered_and_the_enricher_keeps_going(stack: EmbeddedStack) -> None:
    async with served_memory(stack) as (served, memory), enricher(served):
        changes = served.topic(Topic.MEMORY_CHANGES)
        dlq = Topic.MEMORY_CHANGES.dlq
        bad = [
            b"{not json",
            json.dumps(
                {"kind": "created", "fact_id": "x", "scope": {"principal_id": ""}, "version": 1}
            ).encode(),
        ]
        async with (
            RawPublisher(stack.bootstrap) as raw,
            TopicReader(stack.bootstrap, served.prefix + dlq) as dead,
        ):
            for body in bad:
                await raw.send(changes, body, key=b"ana")
            await add(memory, ANA, "f-1", "Lives in Madrid.")

            async def indexed() -> bool:
                return ids(await memory.search_index(ANA, "Madrid", 5)) == ["f-1"]

            await eventually(indexed)
            records = await dead.wait_for(lambda records: len(records) >= 2)
        assert sorted(record.value for record in records) == sorted(bad)
        reasons = {dict(record.headers)["x-dlq-reason"] for record in records}
        assert reasons == {b"invalid_payload", b"permanent_error"}


async def answers(memory: KafkaMemoryStore, labelled: LabelledSet) -> dict[str, list[tuple[str, float]]]:
    return {
        query.query_id: [
            (hit.fact.fact_id, round(hit.score, 9))
            for hit in await memory.search_index(query.scope, query.text, 5)
        ]
        for query in labelled.queries
    }


async def test_reindex_rebuilds_an_emptied_index_identically(stack: EmbeddedStack) -> None:
    labelled = load_labelled(LABELLED)
    async with served_memory(stack) as (served, memory):
        async with enricher(served):
            await record_facts(memory, labelled)

            async def all_indexed() -> bool:
                for fact in labelled.facts:
                    if fact.fact_id not in ids(await memory.search_index(fact.scope, fact.text, 10)):
                        return False
                return True

            await eventually(all_indexed, within=60.0)
        # The enricher is stopped: from here on only a reindex can rebuild the index.
        before = await answers(memory, labelled)
        assert any(before.values())
        everyone = await principals_from_changes(served.kafka)
        assert set(everyone) == set(principals(labelled))
        assert await principals_from_changes(served.kafka, tenant_id="globex") == [
            principal for principal in everyone if principal.tenant_id == "globex"
        ]
        for principal in everyone:
            facts = await memory.list_facts(principal.scope)
            await memory.delete_index_entries(principal.scope, [fact.fact_id for fact in facts])
        assert not any((await answers(memory, labelled)).values())

        report = await reindex(memory, everyone)
        assert report.principals == 4 and report.indexed == len(labelled.facts) and report.dropped == 0
        assert await answers(memory, labelled) == before
