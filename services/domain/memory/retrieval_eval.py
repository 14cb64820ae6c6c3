"""Measuring fact retrieval on a labelled set: recall@k, MRR and latency of any search method.

The labelled set (tests/data/retrieval_labelled.json) holds facts of a few principals, recorded
oldest first, and queries a user would type, each with the ids of the facts a good answer needs.
Every query is searched in its own principal's scope; a hit from another principal is counted
as `foreign` (a scope bug, never a success). Used by the retrieval tests, `make bench` and the
measurement that chose the retrieval method (NOTES.md, "Retrieval").

    labelled = load_labelled(path)
    clock = ManualClock()
    store = InMemoryMemoryStore(clock=clock)
    await record_facts(store, labelled, clock)
    result = await evaluate("authority", store.search_authority, labelled)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.memory import (
    FactChanged,
    FactOperation,
    FactOperationKind,
    MemoryScope,
    Provenance,
    ScoredFact,
)

Search = Callable[[MemoryScope, str, int], Awaitable[list[ScoredFact]]]
"""A retrieval method: (scope, query, k) → the top-k facts, best first."""

LABELLED_SESSION = "labelled-set"
"""Session named in the provenance of the labelled facts."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LabelledFact(_Frozen):
    """One fact of the labelled set."""

    fact_id: str = Field(description="Fact id (unique in the set).")
    tenant_id: str = Field(default="", description="Tenant of the principal.")
    principal_id: str = Field(description="Whose fact.")
    agent_id: str = Field(default="", description="Agent the fact belongs to; empty = every agent.")
    text: str = Field(description="The fact.")

    @property
    def scope(self) -> MemoryScope:
        """The fact's scope."""
        return MemoryScope(tenant_id=self.tenant_id, principal_id=self.principal_id, agent_id=self.agent_id)


class LabelledQuery(_Frozen):
    """One query with the facts a good answer needs."""

    query_id: str = Field(description="Query id (unique in the set).")
    tenant_id: str = Field(default="", description="Tenant of the asking principal.")
    principal_id: str = Field(description="Who asks; the search is scoped to them.")
    text: str = Field(description="What the user said.")
    relevant: list[str] = Field(min_length=1, description="Ids of the relevant facts (same principal).")

    @property
    def scope(self) -> MemoryScope:
        """The scope the query is searched in (every agent of the principal)."""
        return MemoryScope(tenant_id=self.tenant_id, principal_id=self.principal_id)


class LabelledSet(_Frozen):
    """Facts (oldest first) and labelled queries."""

    description: str = Field(default="", description="What the set is and how it was built.")
    facts: list[LabelledFact] = Field(description="Facts in the order they are recorded.")
    queries: list[LabelledQuery] = Field(description="Labelled queries.")


def load_labelled(path: Path) -> LabelledSet:
    """Read and check a labelled set: unique ids, relevant facts exist and are the asker's own."""
    labelled = LabelledSet.model_validate_json(path.read_bytes())
    facts = {fact.fact_id: fact for fact in labelled.facts}
    if len(facts) != len(labelled.facts):
        raise ValueError(f"{path}: duplicate fact ids")
    if len({query.query_id for query in labelled.queries}) != len(labelled.queries):
        raise ValueError(f"{path}: duplicate query ids")
    for query in labelled.queries:
        for fact_id in query.relevant:
            fact = facts.get(fact_id)
            if fact is None or (fact.tenant_id, fact.principal_id) != (query.tenant_id, query.principal_id):
                raise ValueError(
                    f"{path}: query {query.query_id} names {fact_id}, not a fact of its principal"
                )
    return labelled


class ManualClock:
    """A clock that moves only when told: gives the labelled facts distinct, ordered timestamps."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 9, 1, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta = timedelta(minutes=1)) -> None:
        """Move forward."""
        self.now += delta


class FactWriter(Protocol):
    """The one store operation recording the labelled facts needs."""

    async def apply_fact_operations(
        self, scope: MemoryScope, operations: list[FactOperation], idempotency_key: str
    ) -> list[FactChanged]:
        """Apply validated operations atomically."""
        ...


async def record_facts(
    store: FactWriter, labelled: LabelledSet, clock: ManualClock | None = None
) -> list[FactChanged]:
    """Record every fact of the set, oldest first (one minute apart on `clock` when given)."""
    changes: list[FactChanged] = []
    for fact in labelled.facts:
        if clock is not None:
            clock.advance()
        operation = FactOperation(
            kind=FactOperationKind.NEW,
            fact_id=fact.fact_id,
            text=fact.text,
            provenance=Provenance(session_id=LABELLED_SESSION, turn_id=fact.fact_id),
        )
        changes += await store.apply_fact_operations(fact.scope, [operation], f"labelled/{fact.fact_id}")
    return changes


def recall_at_k(ranked: Sequence[str], relevant: Sequence[str], k: int) -> float:
    """Share of the relevant ids among the first k ranked ids."""
    wanted = set(relevant)
    return len(wanted & set(ranked[:k])) / len(wanted)


def reciprocal_rank(ranked: Sequence[str], relevant: Sequence[str]) -> float:
    """1 / position of the first relevant id (0 when none is ranked)."""
    wanted = set(relevant)
    for position, fact_id in enumerate(ranked, start=1):
        if fact_id in wanted:
            return 1.0 / position
    return 0.0


class QueryOutcome(_Frozen):
    """How one query fared."""

    query_id: str = Field(description="The query.")
    ranked: list[str] = Field(description="Fact ids returned, best first.")
    recall: float = Field(description="recall@k of this query.")
    reciprocal_rank: float = Field(description="1 / rank of the first relevant fact (0: none).")
    foreign: list[str] = Field(description="Returned ids of another principal's facts (must be empty).")
    latency_ms: float = Field(description="Time the search took.")


class Evaluation(_Frozen):
    """A method's figures over the labelled set."""

    method: str = Field(description="Name of the method.")
    k: int = Field(description="Results asked for per query.")
    recall_at_k: float = Field(description="Mean recall@k over the queries.")
    mrr: float = Field(description="Mean reciprocal rank over the queries.")
    p50_ms: float = Field(description="Median latency of one search.")
    outcomes: list[QueryOutcome] = Field(description="Per query.")

    @property
    def foreign_hits(self) -> int:
        """Hits that crossed principals, over every query."""
        return sum(len(outcome.foreign) for outcome in self.outcomes)

    def summary(self) -> str:
        """One line: method, recall@k, MRR, p50."""
        return (
            f"{self.method}: recall@{self.k} {self.recall_at_k:.3f}, MRR {self.mrr:.3f}, "
            f"p50 {self.p50_ms:.2f} ms"
        )


async def evaluate(method: str, search: Search, labelled: LabelledSet, k: int = 5) -> Evaluation:
    """Run every labelled query through `search` once, in its principal's scope, and score it."""
    owners = {fact.fact_id: (fact.tenant_id, fact.principal_id) for fact in labelled.facts}
    outcomes: list[QueryOutcome] = []
    for query in labelled.queries:
        started = time.perf_counter()
        hits = await search(query.scope, query.text, k)
        latency_ms = (time.perf_counter() - started) * 1000
        ranked = [hit.fact.fact_id for hit in hits]
        asker = (query.tenant_id, query.principal_id)
        foreign = [
            hit.fact.fact_id
            for hit in hits
            if (hit.fact.scope.tenant_id, hit.fact.scope.principal_id) != asker
            or owners.get(hit.fact.fact_id, asker) != asker
        ]
        outcomes.append(
            QueryOutcome(
                query_id=query.query_id,
                ranked=ranked,
                recall=recall_at_k(ranked, query.relevant, k),
                reciprocal_rank=reciprocal_rank(ranked, query.relevant),
                foreign=foreign,
                latency_ms=latency_ms,
            )
        )
    return Evaluation(
        method=method,
        k=k,
        recall_at_k=statistics.fmean(outcome.recall for outcome in outcomes),
        mrr=statistics.fmean(outcome.reciprocal_rank for outcome in outcomes),
        p50_ms=statistics.median(outcome.latency_ms for outcome in outcomes),
        outcomes=outcomes,
    )


def with_fallback(primary: Search, fallback: Search) -> Search:
    """`primary`, or `fallback` when it fails or finds nothing: how the context builder uses the
    index (services/domain/memory/context.py), so what the index cannot answer (the enricher is
    stopped, the store refuses) still comes from the authority.
    """

    async def search(scope: MemoryScope, query: str, k: int) -> list[ScoredFact]:
        try:
            hits = await primary(scope, query, k)
        except Exception:
            hits = []
        return hits or await fallback(scope, query, k)

    return search
