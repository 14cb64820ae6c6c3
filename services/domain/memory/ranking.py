"""How memory is searched, the same for every backend: the tokenizer, BM25 over index entries,
keyword-and-recency authority scoring, the scope rule and the orders facts are listed in.

The enricher (index entries), fact extraction (the tokenizer) and retrieval import these too.

Scope rule: a query scope covers a fact (entry, profile) of the same tenant and principal whose
agent is the query's agent or empty (a principal-wide fact); a query with an empty agent covers
every agent of the principal.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from quipu.contracts.memory import Fact, IndexEntry, MemoryScope, ScoredFact

BM25_K1 = 1.2
BM25_B = 0.75
SOURCE_INDEX = "index"
SOURCE_AUTHORITY = "authority"

# Words that carry no meaning for retrieval (English and Spanish, the languages of our users).
_STOPWORD_TEXT = """
    a an and are as at be but by for from has have i in is it its me my of on or our so that the
    their them they this to was we were what when where which who will with you your do does did
    not no yes
    al con de del el en es la las lo los mi mis por que se su sus un una uno y o para como pero
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())

_WORD = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased, accent-folded words of two or more characters, stopwords removed, in order."""
    folded = text.casefold()
    if not folded.isascii():
        decomposed = unicodedata.normalize("NFKD", folded)
        folded = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return [word for word in _WORD.findall(folded) if len(word) > 1 and word not in STOPWORDS]


def term_frequencies(text: str) -> tuple[dict[str, int], int]:
    """The BM25 document of a text: term frequencies and the number of terms."""
    terms = tokenize(text)
    return dict(Counter(terms)), len(terms)


def build_index_entry(fact: Fact, indexed_at: datetime) -> IndexEntry:
    """The derived entry for the fact's current version (what the enricher upserts)."""
    terms, length = term_frequencies(fact.text)
    return IndexEntry(
        fact_id=fact.fact_id,
        scope=fact.scope,
        fact_version=fact.version,
        terms=terms,
        length=length,
        indexed_at=indexed_at,
    )


def bm25_scores(
    query_terms: Sequence[str], entries: Sequence[IndexEntry], k1: float = BM25_K1, b: float = BM25_B
) -> list[float]:
    """Okapi BM25 of every entry against the distinct query terms; the entries are the corpus.

    idf = ln(1 + (N - n + 0.5) / (n + 0.5)) (never negative); scores align with `entries`.
    """
    if not entries:
        return []
    distinct = list(dict.fromkeys(query_terms))
    count = len(entries)
    average_length = sum(entry.length for entry in entries) / count or 1.0
    idf = {}
    for term in distinct:
        containing = sum(1 for entry in entries if entry.terms.get(term, 0) > 0)
        idf[term] = math.log(1.0 + (count - containing + 0.5) / (containing + 0.5))
    scores = []
    for entry in entries:
        norm = k1 * (1.0 - b + b * entry.length / average_length)
        score = 0.0
        for term in distinct:
            frequency = entry.terms.get(term, 0)
            if frequency:
                score += idf[term] * frequency * (k1 + 1.0) / (frequency + norm)
        scores.append(score)
    return scores


def keyword_overlap(query_terms: Sequence[str], text: str) -> float:
    """Share of the distinct query terms present in the text (0.0 to 1.0)."""
    distinct = set(query_terms)
    if not distinct:
        return 0.0
    return len(distinct & set(tokenize(text))) / len(distinct)


def scope_covers(query: MemoryScope, owner: MemoryScope) -> bool:
    """Whether memory owned by `owner` is visible to a caller in `query` (see the module docstring)."""
    if query.tenant_id != owner.tenant_id or query.principal_id != owner.principal_id:
        return False
    return not query.agent_id or owner.agent_id in ("", query.agent_id)


def authority_ranking(scope: MemoryScope, query: str, facts: Sequence[Fact], k: int) -> list[ScoredFact]:
    """Keyword overlap on canonical facts, most recent first among equals (the fallback search).

    Facts sharing no word with the query are left out; a query with no words returns the most
    recent facts with score 0.
    """
    terms = tokenize(query)
    scored = [(keyword_overlap(terms, fact.text), fact) for fact in facts if scope_covers(scope, fact.scope)]
    if terms:
        scored = [(score, fact) for score, fact in scored if score > 0]
    scored.sort(key=lambda pair: (-pair[0], -pair[1].updated_at.timestamp(), pair[1].fact_id))
    return [ScoredFact(fact=fact, score=score, source=SOURCE_AUTHORITY) for score, fact in scored[:k]]


def index_ranking(
    scope: MemoryScope, query: str, entries: Sequence[IndexEntry], facts: dict[str, Fact], k: int
) -> list[ScoredFact]:
    """BM25 over the scope's entries, rehydrated from canonical `facts` (by id).

    An entry is dropped when its fact is gone (deleted), its version differs from the fact's
    current version (stale), or its scope is not the fact's or not covered by `scope`.
    """
    visible = [entry for entry in entries if scope_covers(scope, entry.scope)]
    scores = bm25_scores(tokenize(query), visible)
    hits = []
    for entry, score in zip(visible, scores, strict=True):
        fact = facts.get(entry.fact_id)
        if score <= 0 or fact is None or fact.version != entry.fact_version or fact.scope != entry.scope:
            continue
        hits.append((score, fact))
    hits.sort(key=lambda pair: (-pair[0], -pair[1].updated_at.timestamp(), pair[1].fact_id))
    return [ScoredFact(fact=fact, score=score, source=SOURCE_INDEX) for score, fact in hits[:k]]


async def rehydrated_ranking(
    scope: MemoryScope,
    query: str,
    entries: Sequence[IndexEntry],
    load_fact: Callable[[str], Awaitable[Fact | None]],
    k: int,
) -> list[ScoredFact]:
    """`index_ranking`, loading canonical facts one by one in score order, only as far as needed.

    Candidates are rehydrated best first until k survive and the next candidate scores strictly
    less than the k-th survivor (so ties at the cut are all seen and recency can break them).
    """
    visible = [entry for entry in entries if scope_covers(scope, entry.scope)]
    scored = sorted(
        ((score, entry) for score, entry in zip(bm25_scores(tokenize(query), visible), visible, strict=True)),
        key=lambda pair: (-pair[0], pair[1].fact_id),
    )
    found: dict[str, Fact] = {}
    survivors: list[float] = []
    for score, entry in scored:
        if score <= 0 or (len(survivors) >= k and score < survivors[k - 1]):
            break
        fact = await load_fact(entry.fact_id)
        if fact is not None:
            found[fact.fact_id] = fact
            if fact.version == entry.fact_version and fact.scope == entry.scope:
                survivors.append(score)
    return index_ranking(scope, query, visible, found, k)


def audit_order(fact: Fact) -> tuple[datetime, str, int]:
    """Audit trail order: when the archived version was written, then id and version."""
    return (fact.updated_at, fact.fact_id, fact.version)


def fact_order(fact: Fact) -> tuple[datetime, str]:
    """Current facts in the order they were first recorded."""
    return (fact.created_at, fact.fact_id)
