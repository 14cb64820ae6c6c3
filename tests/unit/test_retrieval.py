"""Retrieval of curated facts as a user sees it: deletion, the enricher stopped, scope, reindex,
and the labelled-set measurement (services/domain/memory/retrieval_eval.py) on the in-memory store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quipu.contracts.memory import (
    FactOperation,
    FactOperationKind,
    IndexEntry,
    MemoryScope,
    Provenance,
    ScoredFact,
)
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.reindex import Principal, reindex, reindex_principal
from quipu.services.domain.memory.retrieval_eval import (
    LabelledSet,
    ManualClock,
    evaluate,
    load_labelled,
    recall_at_k,
    reciprocal_rank,
    record_facts,
    with_fallback,
)
from quipu.services.enricher.adapters import Enricher
from quipu.services.enricher.settings import EnricherSettings

LABELLED = Path(__file__).parents[1] / "data" / "retrieval_labelled.json"
ANA = MemoryScope(tenant_id="acme", principal_id="ana")
BRUNO = MemoryScope(tenant_id="acme", principal_id="bruno")
ANA_ELSEWHERE = MemoryScope(tenant_id="globex", principal_id="ana")
PROVENANCE = Provenance(session_id="s-1", turn_id="t-1")


async def _no_wait(_: float) -> None:
    return None


async def entries_of(store: InMemoryMemoryStore, scope: MemoryScope) -> dict[str, IndexEntry]:
    """The principal's derived entries (the protocol has no listing; the transaction port has)."""
    entries = await store._transactions.run(
        lambda tx: tx.principal_index(scope.tenant_id, scope.principal_id)
    )
    return {entry.fact_id: entry for entry in entries}


def ids(hits: list[ScoredFact]) -> list[str]:
    return [hit.fact.fact_id for hit in hits]


class Memory:
    """An in-memory store, the enricher in front of it, and a way to write facts."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.store = InMemoryMemoryStore(clock=self.clock)
        self.enricher = Enricher(
            self.store, EnricherSettings(retry_delay_s=0), clock=self.clock, sleep=_no_wait
        )
        self.enricher_running = True

    async def apply(self, scope: MemoryScope, kind: FactOperationKind, fact_id: str, text: str = "") -> None:
        self.clock.advance()
        operation = FactOperation(kind=kind, fact_id=fact_id, text=text, provenance=PROVENANCE)
        changes = await self.store.apply_fact_operations(scope, [operation], f"{kind.value}/{fact_id}/{text}")
        if self.enricher_running:
            for change in changes:
                await self.enricher.on_fact_changed(change)

    async def add(self, scope: MemoryScope, fact_id: str, text: str) -> None:
        await self.apply(scope, FactOperationKind.NEW, fact_id, text)

    async def retrieve(self, scope: MemoryScope, query: str, k: int = 5) -> list[ScoredFact]:
        """What the context builder does: the index, topped up from the authority."""
        return await with_fallback(self.store.search_index, self.store.search_authority)(scope, query, k)


@pytest.fixture
def memory() -> Memory:
    return Memory()


# --- deletion -------------------------------------------------------------------------------------


async def test_a_deleted_fact_leaves_every_retrieval_path_and_the_index(memory: Memory) -> None:
    await memory.add(ANA, "f-1", "Lives in Madrid.")
    await memory.add(ANA, "f-2", "Works in Madrid on Thursdays.")
    assert set(ids(await memory.store.search_index(ANA, "Madrid", 5))) == {"f-1", "f-2"}

    change = await memory.store.delete_fact(ANA, "f-1")  # what the owner publishes on memory.changes
    await memory.enricher.on_fact_changed(change)

    assert "f-1" not in await entries_of(memory.store, ANA)
    assert ids(await memory.store.search_index(ANA, "Madrid", 5)) == ["f-2"]
    assert ids(await memory.store.search_authority(ANA, "Madrid", 5)) == ["f-2"]
    assert ids(await memory.retrieve(ANA, "lives Madrid")) == ["f-2"]


async def test_a_stale_entry_of_a_deleted_fact_is_never_returned(memory: Memory) -> None:
    await memory.add(ANA, "f-1", "Lives in Madrid.")
    memory.enricher_running = False  # the delete is never indexed: its entry stays behind
    await memory.apply(ANA, FactOperationKind.DELETE, "f-1")
    assert "f-1" in await entries_of(memory.store, ANA)
    assert await memory.store.search_index(ANA, "Madrid", 5) == []
    assert await memory.retrieve(ANA, "Madrid") == []


async def test_a_stale_entry_of_an_updated_fact_is_never_returned(memory: Memory) -> None:
    await memory.add(ANA, "f-1", "Lives in Madrid.")
    memory.enricher_running = False
    await memory.apply(ANA, FactOperationKind.UPDATE, "f-1", "Lives in Valencia.")
    assert (await entries_of(memory.store, ANA))["f-1"].fact_version == 1
    assert await memory.store.search_index(ANA, "Madrid", 5) == []
    hits = await memory.retrieve(ANA, "Valencia")
    assert ids(hits) == ["f-1"] and hits[0].fact.text == "Lives in Valencia."


# --- the enricher stopped -------------------------------------------------------------------------


async def test_with_the_enricher_stopped_retrieval_still_finds_facts_in_the_authority(memory: Memory) -> None:
    memory.enricher_running = False
    await memory.add(ANA, "f-1", "Prefers aisle seats on flights.")
    await memory.add(ANA, "f-2", "Flies out of Lisbon airport.")
    assert await entries_of(memory.store, ANA) == {}
    assert await memory.store.search_index(ANA, "flights aisle", 5) == []
    hits = await memory.retrieve(ANA, "flights aisle")
    assert ids(hits) == ["f-1"] and hits[0].source == "authority"


async def test_the_whole_labelled_set_is_answered_from_the_authority_alone() -> None:
    labelled = load_labelled(LABELLED)
    clock = ManualClock()
    store = InMemoryMemoryStore(clock=clock)
    await record_facts(store, labelled, clock)  # no enricher: the index is empty
    indexed = await evaluate("index only", store.search_index, labelled)
    fallback = await evaluate(
        "index then authority", with_fallback(store.search_index, store.search_authority), labelled
    )
    assert indexed.recall_at_k == 0.0
    assert fallback.recall_at_k >= 0.6


# --- scope ------------------------------------------------------------------------------------------


async def test_index_entries_never_cross_principals_or_tenants(memory: Memory) -> None:
    await memory.add(ANA, "ana-1", "Her project uses PostgreSQL and FastAPI.")
    await memory.add(BRUNO, "bruno-1", "His project uses PostgreSQL and Django.")
    await memory.add(ANA_ELSEWHERE, "ana-x", "Her project uses PostgreSQL and Flask.")
    assert set(await entries_of(memory.store, ANA)) == {"ana-1"}
    assert set(await entries_of(memory.store, BRUNO)) == {"bruno-1"}
    assert set(await entries_of(memory.store, ANA_ELSEWHERE)) == {"ana-x"}
    assert ids(await memory.store.search_index(ANA, "PostgreSQL project", 5)) == ["ana-1"]
    assert ids(await memory.store.search_index(BRUNO, "PostgreSQL Django FastAPI Flask", 5)) == ["bruno-1"]
    assert ids(await memory.store.search_index(ANA_ELSEWHERE, "PostgreSQL", 5)) == ["ana-x"]
    # Dropping another principal's ids through one's own scope drops nothing.
    await memory.store.delete_index_entries(ANA, ["bruno-1", "ana-x"])
    assert set(await entries_of(memory.store, BRUNO)) == {"bruno-1"}
    assert set(await entries_of(memory.store, ANA_ELSEWHERE)) == {"ana-x"}


async def test_no_method_crosses_principals_on_the_labelled_set() -> None:
    labelled = load_labelled(LABELLED)
    clock = ManualClock()
    store = InMemoryMemoryStore(clock=clock)
    await record_facts(store, labelled, clock)
    await reindex(store, _principals(labelled), clock)
    for method, search in [("index", store.search_index), ("authority", store.search_authority)]:
        result = await evaluate(method, search, labelled, k=10)
        assert result.foreign_hits == 0, method


def _content(index: dict[Principal, dict[str, IndexEntry]]) -> dict[str, dict[str, object]]:
    return {
        fact_id: entry.model_dump(exclude={"indexed_at"})
        for entries in index.values()
        for fact_id, entry in entries.items()
    }


def _principals(labelled: LabelledSet) -> list[Principal]:
    return [Principal(tenant_id=fact.tenant_id, principal_id=fact.principal_id) for fact in labelled.facts]


# --- reindex ----------------------------------------------------------------------------------------


async def test_reindex_rebuilds_an_emptied_index_identically(memory: Memory) -> None:
    labelled = load_labelled(LABELLED)
    for fact in labelled.facts:
        await memory.add(fact.scope, fact.fact_id, fact.text)
    await memory.apply(ANA, FactOperationKind.UPDATE, "ana-01", "Prefers answers in Spanish.")
    await memory.apply(ANA, FactOperationKind.DELETE, "ana-10")
    principals = list(dict.fromkeys(_principals(labelled)))
    before = {p: await entries_of(memory.store, p.scope) for p in principals}
    answers_before = {
        q.query_id: ids(await memory.store.search_index(q.scope, q.text, 5)) for q in labelled.queries
    }
    assert "ana-10" not in before[Principal(tenant_id="acme", principal_id="ana")]

    for principal in principals:  # the index is lost
        await memory.store.delete_index_entries(principal.scope, list(before[principal]))
        assert await entries_of(memory.store, principal.scope) == {}

    report = await reindex(memory.store, principals, memory.clock)
    after = {p: await entries_of(memory.store, p.scope) for p in principals}
    assert _content(after) == _content(before)  # all but indexed_at, which says when it was built
    assert report.principals == 4 and report.indexed == len(labelled.facts) - 1 and report.dropped == 1
    answers_after = {
        q.query_id: ids(await memory.store.search_index(q.scope, q.text, 5)) for q in labelled.queries
    }
    assert answers_after == answers_before


async def test_reindex_drops_the_entries_of_deleted_facts_and_refreshes_stale_ones(memory: Memory) -> None:
    await memory.add(ANA, "f-1", "Lives in Madrid.")
    await memory.add(ANA, "f-2", "Drinks coffee.")
    memory.enricher_running = False
    await memory.apply(ANA, FactOperationKind.DELETE, "f-1")
    await memory.apply(ANA, FactOperationKind.UPDATE, "f-2", "Drinks green tea.")
    await memory.add(ANA, "f-3", "Has a cat called Tofu.")
    report = await reindex_principal(
        memory.store, Principal(tenant_id="acme", principal_id="ana"), memory.clock
    )
    entries = await entries_of(memory.store, ANA)
    assert set(entries) == {"f-2", "f-3"} and entries["f-2"].fact_version == 2
    assert report.indexed == 2 and report.dropped == 1
    assert set(ids(await memory.store.search_index(ANA, "tea cat", 5))) == {"f-2", "f-3"}


async def test_reindex_of_a_principal_without_memory_does_nothing(memory: Memory) -> None:
    report = await reindex_principal(memory.store, Principal(tenant_id="acme", principal_id="nobody"))
    assert report.indexed == report.dropped == 0


# --- the measurement ---------------------------------------------------------------------------------


def test_recall_and_reciprocal_rank() -> None:
    assert recall_at_k(["a", "b", "c"], ["c", "z"], 5) == 0.5
    assert recall_at_k(["a", "b", "c"], ["c"], 2) == 0.0
    assert reciprocal_rank(["a", "b", "c"], ["c", "b"]) == 0.5
    assert reciprocal_rank([], ["c"]) == 0.0


def test_the_labelled_set_is_consistent(tmp_path: Path) -> None:
    labelled = load_labelled(LABELLED)
    assert len(labelled.facts) >= 40 and len(labelled.queries) >= 25
    broken = json.loads(LABELLED.read_text())
    broken["queries"][0]["relevant"] = ["bruno-01"]  # another principal's fact
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="not a fact of its principal"):
        load_labelled(path)


async def test_measured_recall_does_not_regress() -> None:
    """The figures in NOTES.md ("Retrieval"): a tokenizer or scoring change that loses them fails here."""
    labelled = load_labelled(LABELLED)
    clock = ManualClock()
    store = InMemoryMemoryStore(clock=clock)
    await record_facts(store, labelled, clock)
    await reindex(store, _principals(labelled), clock)
    index = await evaluate("bm25 index", store.search_index, labelled)
    authority = await evaluate("authority", store.search_authority, labelled)
    assert index.recall_at_k >= 0.62 and index.mrr >= 0.58, index.summary()
    assert authority.recall_at_k >= 0.62 and authority.mrr >= 0.58, authority.summary()


async def test_the_authority_answers_when_the_index_fails_or_finds_nothing(memory: Memory) -> None:
    await memory.add(ANA, "f-1", "Lives in Madrid.")

    async def broken(scope: MemoryScope, query: str, k: int) -> list[ScoredFact]:
        raise TimeoutError("index too slow")

    failing = with_fallback(broken, memory.store.search_authority)
    assert [(hit.fact.fact_id, hit.source) for hit in await failing(ANA, "Madrid", 5)] == [
        ("f-1", "authority")
    ]
    assert [hit.source for hit in await memory.retrieve(ANA, "Madrid")] == ["index"]
    memory.enricher_running = False
    await memory.add(ANA, "f-2", "Has a cat called Tofu.")
    assert [(hit.fact.fact_id, hit.source) for hit in await memory.retrieve(ANA, "cat")] == [
        ("f-2", "authority")
    ]
