"""The pure memory rules the enricher and retrieval share: tokenizer, BM25, authority ranking, scope."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

from quipu.contracts.memory import Fact, IndexEntry, MemoryScope, Provenance
from quipu.services.domain.memory.ranking import (
    bm25_scores,
    index_ranking,
    keyword_overlap,
    rehydrated_ranking,
    scope_covers,
    term_frequencies,
    tokenize,
)

WHEN = datetime(2025, 1, 1, tzinfo=UTC)
WHO = MemoryScope(tenant_id="t", principal_id="p", agent_id="a")


def _entry(fact_id: str, text: str) -> IndexEntry:
    terms, length = term_frequencies(text)
    return IndexEntry(fact_id=fact_id, scope=WHO, fact_version=1, terms=terms, length=length, indexed_at=WHEN)


def test_tokenize_folds_case_and_accents_and_drops_stopwords() -> None:
    assert tokenize("¿Qué base de datos? PostgreSQL_16, la MEJOR — café") == [
        "base", "datos", "postgresql", "16", "mejor", "cafe",
    ]  # fmt: skip
    assert tokenize("I am a b") == ["am"]
    assert term_frequencies("tea tea coffee") == ({"tea": 2, "coffee": 1}, 3)


def test_bm25_matches_the_formula() -> None:
    entries = [_entry("1", "tea tea coffee"), _entry("2", "coffee milk"), _entry("3", "water")]
    scores = bm25_scores(["tea", "tea"], entries)
    n, containing, average = 3, 1, (3 + 2 + 1) / 3
    idf = math.log(1 + (n - containing + 0.5) / (containing + 0.5))
    expected = idf * 2 * 2.2 / (2 + 1.2 * (1 - 0.75 + 0.75 * 3 / average))
    assert math.isclose(scores[0], expected) and scores[1:] == [0.0, 0.0]
    coffee = bm25_scores(["coffee"], entries)
    assert coffee[1] > coffee[0] > 0  # the shorter document wins at equal frequency
    assert bm25_scores(["tea"], []) == []


def test_keyword_overlap_and_scope() -> None:
    assert keyword_overlap(tokenize("Cusco trip"), "Visited Cusco in May") == 0.5
    assert keyword_overlap([], "anything") == 0.0
    assert scope_covers(WHO, WHO.model_copy(update={"agent_id": ""}))
    assert not scope_covers(WHO, WHO.model_copy(update={"agent_id": "b"}))
    assert scope_covers(WHO.model_copy(update={"agent_id": ""}), WHO.model_copy(update={"agent_id": "b"}))
    assert not scope_covers(WHO, WHO.model_copy(update={"tenant_id": "other"}))


async def test_lazy_rehydration_ranks_exactly_like_the_full_one() -> None:
    rng = random.Random(7)
    words = ["tea", "coffee", "milk", "lima", "cusco", "jazz"]
    for _ in range(200):
        facts: dict[str, Fact] = {}
        entries = []
        for index in range(rng.randint(0, 12)):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
            fact = Fact(
                fact_id=f"f{index}", scope=WHO, text=text, created_at=WHEN,
                updated_at=WHEN + timedelta(milliseconds=rng.randint(0, 3)),
                provenance=Provenance(session_id="s", turn_id="t"), version=rng.choice([1, 2]),
            )  # fmt: skip
            entry = _entry(fact.fact_id, text).model_copy(update={"fact_version": rng.choice([1, 2])})
            entries.append(entry)
            if rng.random() < 0.9:
                facts[fact.fact_id] = fact
        loads: list[str] = []

        async def load(fact_id: str, facts: dict[str, Fact] = facts, loads: list[str] = loads) -> Fact | None:
            loads.append(fact_id)
            return facts.get(fact_id)

        query, k = " ".join(rng.sample(words, 2)), rng.randint(1, 4)
        lazy = await rehydrated_ranking(WHO, query, entries, load, k)
        assert lazy == index_ranking(WHO, query, entries, facts, k)
        assert len(loads) <= len(entries)
