"""The memory rules, applied once for every backend (docs/architecture.md, "Conversation memory").

Pure helpers first — the tokenizer, BM25 over index entries, keyword-and-recency authority
scoring and the scope rule — which the enricher and retrieval import too. Then `MemoryRules`:
the `MemoryStore` protocol over a `MemoryTransactionRunner`, so the in-memory store and the
MongoDB store differ only in how they load and save inside one atomic unit. Every check of an
operation runs before its first write, so a refused command writes nothing.

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
from typing import NoReturn, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.envelope import derive_id
from quipu.contracts.errors import ErrorCode, StoreError, invalid
from quipu.contracts.memory import (
    Fact,
    FactChanged,
    FactChangeKind,
    FactOperation,
    FactOperationKind,
    HistoryAppendResult,
    HistoryMessage,
    HistoryRole,
    HistoryTurn,
    IndexEntry,
    MemoryScope,
    PrincipalExport,
    Profile,
    Provenance,
    ScoredFact,
    SessionSummary,
)
from quipu.contracts.wire import has_sub_millisecond, utc_now_ms

T = TypeVar("T")

MAX_HISTORY_PAGE = 500
MAX_SEARCH_RESULTS = 100
MAX_FACT_TEXT = 2000
MAX_OPERATIONS = 100
BM25_K1 = 1.2
BM25_B = 0.75
SOURCE_INDEX = "index"
SOURCE_AUTHORITY = "authority"
USER_DELETE_PREFIX = "user-delete/"

# Words that carry no meaning for retrieval (English and Spanish, the languages of our users).
_STOPWORD_TEXT = """
    a an and are as at be but by for from has have i in is it its me my of on or our so that the
    their them they this to was we were what when where which who will with you your do does did
    not no yes
    al con de del el en es la las lo los mi mis por que se su sus un una uno y o para como pero
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())

_WORD = re.compile(r"[^\W_]+")


# ---------------------------------------------------------------------------------------------
# Pure helpers (shared with the enricher and retrieval)


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


# ---------------------------------------------------------------------------------------------
# Validation (INVALID_ARGUMENT, no I/O)


def _fail(code: ErrorCode, message: str) -> NoReturn:
    raise StoreError(code, message)


def require_id(name: str, value: str) -> None:
    """Identifiers are non-empty strings."""
    if not value:
        raise invalid(f"{name} is required")


def require_millisecond(name: str, value: datetime) -> None:
    """MongoDB keeps milliseconds: finer precision is refused, never truncated."""
    if value.tzinfo is None:
        raise invalid(f"{name} must carry a UTC offset")
    if has_sub_millisecond(value):
        raise invalid(f"{name} has sub-millisecond precision")


def require_principal(scope: MemoryScope) -> None:
    """Memory always belongs to a person."""
    require_id("scope.principal_id", scope.principal_id)


def require_results(k: int) -> None:
    """Searches return between 1 and MAX_SEARCH_RESULTS facts."""
    if not 1 <= k <= MAX_SEARCH_RESULTS:
        raise invalid(f"k must be between 1 and {MAX_SEARCH_RESULTS}")


def check_operations(operations: Sequence[FactOperation]) -> None:
    """Shape of a batch: ids present and distinct, texts present and short."""
    if len(operations) > MAX_OPERATIONS:
        raise invalid(f"at most {MAX_OPERATIONS} operations per batch")
    seen: set[str] = set()
    for operation in operations:
        require_id("fact_id", operation.fact_id)
        if operation.fact_id in seen:
            raise invalid(f"fact {operation.fact_id} appears twice in one batch")
        seen.add(operation.fact_id)
        if operation.kind is not FactOperationKind.DELETE:
            if not operation.text.strip():
                raise invalid(f"{operation.kind.value} of {operation.fact_id} needs a text")
            if len(operation.text) > MAX_FACT_TEXT:
                raise invalid(f"fact text longer than {MAX_FACT_TEXT} characters")


# ---------------------------------------------------------------------------------------------
# The port


class MemorySession(BaseModel):
    """Bookkeeping of a session's history: whose it is and its last sequence."""

    model_config = ConfigDict(frozen=True)

    session_id: str = Field(description="The session.")
    scope: MemoryScope = Field(description="Tenant, principal and agent of the session's first turn.")
    last_seq: int = Field(default=0, description="Sequence of the last row (0 before the first turn).")


def require_owner(session: MemorySession, scope: MemoryScope) -> None:
    """A session's history has one owner, its first turn's (or its claimer's) tenant and principal."""
    owner = session.scope
    if (owner.tenant_id, owner.principal_id) != (scope.tenant_id, scope.principal_id):
        raise StoreError(
            ErrorCode.SESSION_PRINCIPAL_MISMATCH, f"session {session.session_id} belongs to another principal"
        )


class MemoryTransaction(Protocol):
    """What the rules need from a backend inside one atomic unit (no rule lives here)."""

    async def load_session(self, session_id: str) -> MemorySession | None:
        """The session's bookkeeping, or None before its first turn."""
        ...

    async def save_session(self, session: MemorySession) -> None:
        """Insert or replace the session's bookkeeping."""
        ...

    async def find_turn(self, session_id: str, turn_id: str) -> list[HistoryMessage]:
        """The rows already recorded for the turn (empty when new)."""
        ...

    async def insert_history(self, session: MemorySession, rows: list[HistoryMessage]) -> None:
        """Insert rows whose seqs the rules assigned."""
        ...

    async def list_history(self, session_id: str, after_seq: int, limit: int) -> list[HistoryMessage]:
        """Rows with seq > after_seq, ascending, at most `limit`."""
        ...

    async def history_tail(self, session_id: str, count: int) -> list[HistoryMessage]:
        """The last `count` rows, ascending."""
        ...

    async def load_summary(self, session_id: str) -> SessionSummary | None:
        """The stored summary, or None."""
        ...

    async def save_summary(self, session: MemorySession, summary: SessionSummary) -> None:
        """Insert or replace the session's summary."""
        ...

    async def load_fact_changes(self, scope: MemoryScope, idempotency_key: str) -> list[FactChanged] | None:
        """The changes recorded under the key for the principal, or None."""
        ...

    async def save_fact_changes(
        self, scope: MemoryScope, idempotency_key: str, changes: list[FactChanged]
    ) -> None:
        """Record the changes a key produced."""
        ...

    async def load_fact(self, fact_id: str) -> Fact | None:
        """The current fact, or None."""
        ...

    async def fact_id_used(self, fact_id: str) -> bool:
        """Whether the id belongs to a current fact or to one in the audit trail."""
        ...

    async def save_fact(self, fact: Fact) -> None:
        """Insert or replace the current fact."""
        ...

    async def remove_fact(self, fact_id: str) -> None:
        """Delete the current fact."""
        ...

    async def archive_fact(self, fact: Fact) -> None:
        """Append a previous version to the audit trail."""
        ...

    async def principal_facts(self, tenant_id: str, principal_id: str) -> list[Fact]:
        """Every current fact of the principal (any agent, any order)."""
        ...

    async def principal_audit(self, tenant_id: str, principal_id: str) -> list[Fact]:
        """Every audit entry of the principal (any agent, any order)."""
        ...

    async def save_profile(self, profile: Profile) -> None:
        """Insert or replace the profile of exactly `profile.scope`."""
        ...

    async def load_profile(self, scope: MemoryScope) -> Profile | None:
        """The profile of exactly `scope`, or None."""
        ...

    async def load_index_entry(self, fact_id: str) -> IndexEntry | None:
        """The fact's derived entry, or None."""
        ...

    async def save_index_entry(self, entry: IndexEntry) -> None:
        """Insert or replace the fact's derived entry."""
        ...

    async def delete_index_entries(self, scope: MemoryScope, fact_ids: list[str]) -> None:
        """Delete the entries of these facts that belong to the scope's principal."""
        ...

    async def principal_index(self, tenant_id: str, principal_id: str) -> list[IndexEntry]:
        """Every derived entry of the principal."""
        ...

    async def forget(self, tenant_id: str, principal_id: str) -> int:
        """Erase everything of the principal; count rows, summaries, facts, audit, profiles and entries."""
        ...


class MemoryTransactionRunner(Protocol):
    """Runs one operation atomically, retrying it whole on a transient conflict."""

    async def run(self, operation: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        """Apply `operation` in one transaction and return its result."""
        ...


# ---------------------------------------------------------------------------------------------
# The rules


def _changed_event(kind: FactChangeKind, fact: Fact, version: int, text: str, key: str) -> FactChanged:
    return FactChanged(
        event_id=derive_id(f"{fact.scope.tenant_id}/{fact.scope.principal_id}/{key}", fact.fact_id),
        tenant_id=fact.scope.tenant_id,
        kind=kind,
        fact_id=fact.fact_id,
        scope=fact.scope,
        version=version,
        text=text,
    )


class MemoryRules:
    """The `MemoryStore` over a transaction runner; `clock` stamps fact changes."""

    def __init__(
        self, transactions: MemoryTransactionRunner, clock: Callable[[], datetime] = utc_now_ms
    ) -> None:
        self._transactions = transactions
        self._clock = clock

    # -- history -------------------------------------------------------------------------------

    async def append_history_turn(self, turn: HistoryTurn) -> HistoryAppendResult:
        """Two rows per turn with the next gapless seqs; a recorded turn_id returns its seqs."""
        require_id("session_id", turn.session_id)
        require_id("turn_id", turn.turn_id)
        require_principal(turn.scope)
        require_millisecond("created_at", turn.created_at)

        async def operation(tx: MemoryTransaction) -> HistoryAppendResult:
            session = await tx.load_session(turn.session_id)
            if session is not None:
                require_owner(session, turn.scope)
            existing = await tx.find_turn(turn.session_id, turn.turn_id)
            if existing:
                seqs = [row.seq for row in existing]
                return HistoryAppendResult(first_seq=min(seqs), last_seq=max(seqs), inserted=False)
            session = session or MemorySession(session_id=turn.session_id, scope=turn.scope)
            first = session.last_seq + 1
            rows = [
                HistoryMessage(
                    session_id=turn.session_id,
                    seq=first + offset,
                    turn_id=turn.turn_id,
                    role=role,
                    text=text,
                    principal_id=turn.scope.principal_id,
                    agent_id=turn.scope.agent_id,
                    created_at=turn.created_at,
                )
                for offset, (role, text) in enumerate(
                    [(HistoryRole.USER, turn.user_text), (HistoryRole.ASSISTANT, turn.assistant_text)]
                )
            ]
            session = session.model_copy(update={"last_seq": first + 1})
            await tx.save_session(session)
            await tx.insert_history(session, rows)
            return HistoryAppendResult(first_seq=first, last_seq=first + 1, inserted=True)

        return await self._transactions.run(operation)

    async def claim_session(self, session_id: str, scope: MemoryScope) -> MemoryScope:
        """The session's owner: `scope` when it has none yet (it becomes the owner, for good), the
        owner it has when that is the same tenant and principal; SESSION_PRINCIPAL_MISMATCH else."""
        require_id("session_id", session_id)
        require_principal(scope)

        async def operation(tx: MemoryTransaction) -> MemoryScope:
            session = await tx.load_session(session_id)
            if session is None:
                await tx.save_session(MemorySession(session_id=session_id, scope=scope))
                return scope
            require_owner(session, scope)
            return session.scope

        return await self._transactions.run(operation)

    async def list_history(self, session_id: str, after_seq: int, limit: int) -> list[HistoryMessage]:
        """Rows after `after_seq`, ascending; limit between 1 and 500."""
        require_id("session_id", session_id)
        if after_seq < 0:
            raise invalid("after_seq must not be negative")
        if not 1 <= limit <= MAX_HISTORY_PAGE:
            raise invalid(f"limit must be between 1 and {MAX_HISTORY_PAGE}")
        return await self._transactions.run(lambda tx: tx.list_history(session_id, after_seq, limit))

    async def history_tail(self, session_id: str, count: int) -> list[HistoryMessage]:
        """The last `count` rows (0 to 500), ascending."""
        require_id("session_id", session_id)
        if not 0 <= count <= MAX_HISTORY_PAGE:
            raise invalid(f"count must be between 0 and {MAX_HISTORY_PAGE}")
        if count == 0:
            return []
        return await self._transactions.run(lambda tx: tx.history_tail(session_id, count))

    # -- summaries -----------------------------------------------------------------------------

    async def load_summary(self, session_id: str) -> SessionSummary | None:
        """The rolling summary or None."""
        require_id("session_id", session_id)
        return await self._transactions.run(lambda tx: tx.load_summary(session_id))

    async def save_summary(self, summary: SessionSummary) -> SessionSummary:
        """Conditional save: version = stored + 1 (first = 1), cursor moves strictly forward and
        never past the session's last row."""
        require_id("session_id", summary.session_id)
        require_millisecond("updated_at", summary.updated_at)
        if summary.cursor < 1:
            raise invalid("cursor must be at least 1")

        async def operation(tx: MemoryTransaction) -> SessionSummary:
            session = await tx.load_session(summary.session_id)
            if session is None:
                raise invalid(f"session {summary.session_id} has no history to summarise")
            if summary.cursor > session.last_seq:
                raise invalid(f"cursor {summary.cursor} is past the last row {session.last_seq}")
            stored = await tx.load_summary(summary.session_id)
            expected_version = 1 if stored is None else stored.version + 1
            if summary.version != expected_version:
                _fail(
                    ErrorCode.MEMORY_CONFLICT,
                    f"summary version {summary.version} does not follow the stored one "
                    f"(expected {expected_version})",
                )
            if stored is not None and summary.cursor <= stored.cursor:
                _fail(
                    ErrorCode.MEMORY_CONFLICT,
                    f"cursor {summary.cursor} does not move past the stored cursor {stored.cursor}",
                )
            await tx.save_summary(session, summary)
            return summary

        return await self._transactions.run(operation)

    # -- facts ---------------------------------------------------------------------------------

    async def apply_fact_operations(
        self, scope: MemoryScope, operations: list[FactOperation], idempotency_key: str
    ) -> list[FactChanged]:
        """All operations in one transaction, or none; a known key returns the recorded changes."""
        require_principal(scope)
        require_id("idempotency_key", idempotency_key)
        check_operations(operations)
        now = self._clock()

        async def operation(tx: MemoryTransaction) -> list[FactChanged]:
            recorded = await tx.load_fact_changes(scope, idempotency_key)
            if recorded is not None:
                return recorded
            changes, writes = [], []
            for op in operations:
                change, write = await self._plan(tx, scope, op, now, idempotency_key)
                changes.append(change)
                writes.append(write)
            for write in writes:
                await write(tx)
            if changes:
                await tx.save_fact_changes(scope, idempotency_key, changes)
            return changes

        return await self._transactions.run(operation)

    async def _plan(
        self, tx: MemoryTransaction, scope: MemoryScope, op: FactOperation, now: datetime, key: str
    ) -> tuple[FactChanged, Callable[[MemoryTransaction], Awaitable[None]]]:
        """Check one operation against the stored state; return its event and its deferred writes."""
        if op.kind is FactOperationKind.NEW:
            if await tx.fact_id_used(op.fact_id):
                raise invalid(f"fact id {op.fact_id} is already used")
            fact = Fact(
                fact_id=op.fact_id,
                scope=scope,
                text=op.text,
                created_at=now,
                updated_at=now,
                provenance=op.provenance,
                version=1,
            )

            async def insert(write_tx: MemoryTransaction) -> None:
                await write_tx.save_fact(fact)

            return _changed_event(FactChangeKind.CREATED, fact, 1, fact.text, key), insert

        current = await tx.load_fact(op.fact_id)
        if current is None or not scope_covers(scope, current.scope):
            _fail(ErrorCode.FACT_NOT_FOUND, f"fact {op.fact_id} does not exist in this scope")
        found: Fact = current
        if op.kind is FactOperationKind.UPDATE:
            updated = found.model_copy(
                update={
                    "text": op.text,
                    "updated_at": now,
                    "provenance": op.provenance,
                    "version": found.version + 1,
                }
            )

            async def update(write_tx: MemoryTransaction) -> None:
                await write_tx.archive_fact(found)
                await write_tx.save_fact(updated)

            return _changed_event(FactChangeKind.UPDATED, updated, updated.version, updated.text, key), update

        async def delete(write_tx: MemoryTransaction) -> None:
            await write_tx.archive_fact(found)
            await write_tx.remove_fact(found.fact_id)

        return _changed_event(FactChangeKind.DELETED, found, found.version + 1, "", key), delete

    async def list_facts(self, scope: MemoryScope) -> list[Fact]:
        """Current facts covered by the scope, in the order they were first recorded."""
        require_principal(scope)
        facts = await self._transactions.run(
            lambda tx: tx.principal_facts(scope.tenant_id, scope.principal_id)
        )
        return sorted((fact for fact in facts if scope_covers(scope, fact.scope)), key=fact_order)

    async def fact_audit(self, scope: MemoryScope) -> list[Fact]:
        """Previous versions covered by the scope, oldest first."""
        require_principal(scope)
        audit = await self._transactions.run(
            lambda tx: tx.principal_audit(scope.tenant_id, scope.principal_id)
        )
        return sorted((fact for fact in audit if scope_covers(scope, fact.scope)), key=audit_order)

    async def delete_fact(self, scope: MemoryScope, fact_id: str) -> FactChanged:
        """A delete operation under the key `user-delete/<fact_id>` (a repeat returns the same event)."""
        require_id("fact_id", fact_id)
        operation = FactOperation(
            kind=FactOperationKind.DELETE, fact_id=fact_id, provenance=Provenance(session_id="", turn_id="")
        )
        changes = await self.apply_fact_operations(scope, [operation], f"{USER_DELETE_PREFIX}{fact_id}")
        return changes[0]

    # -- profiles ------------------------------------------------------------------------------

    async def save_profile(self, profile: Profile) -> Profile:
        """Replace the profile of exactly `profile.scope`."""
        require_principal(profile.scope)
        require_millisecond("updated_at", profile.updated_at)
        if profile.source_turns < 0:
            raise invalid("source_turns must not be negative")

        async def operation(tx: MemoryTransaction) -> Profile:
            await tx.save_profile(profile)
            return profile

        return await self._transactions.run(operation)

    async def load_profile(self, scope: MemoryScope) -> Profile | None:
        """The profile of exactly `scope`, or None."""
        require_principal(scope)
        return await self._transactions.run(lambda tx: tx.load_profile(scope))

    # -- the derived index ---------------------------------------------------------------------

    async def upsert_index_entry(self, entry: IndexEntry) -> None:
        """Store an entry for an existing fact; an older version never replaces a newer one.

        An entry for a fact that is gone or owned by another scope is FACT_NOT_FOUND (a late
        enricher must not resurrect deleted or forgotten words); one for a version the fact has
        not reached yet is INVALID_ARGUMENT.
        """
        require_id("fact_id", entry.fact_id)
        require_principal(entry.scope)
        require_millisecond("indexed_at", entry.indexed_at)
        if entry.length < 0 or any(count <= 0 for count in entry.terms.values()):
            raise invalid("term frequencies and length must be positive")

        async def operation(tx: MemoryTransaction) -> None:
            fact = await tx.load_fact(entry.fact_id)
            if fact is None or fact.scope != entry.scope:
                _fail(ErrorCode.FACT_NOT_FOUND, f"fact {entry.fact_id} does not exist in this scope")
            if entry.fact_version > fact.version:
                raise invalid(f"fact {entry.fact_id} has no version {entry.fact_version} yet")
            stored = await tx.load_index_entry(entry.fact_id)
            if stored is not None and stored.fact_version > entry.fact_version:
                return
            await tx.save_index_entry(entry)

        await self._transactions.run(operation)

    async def delete_index_entries(self, scope: MemoryScope, fact_ids: list[str]) -> None:
        """Drop the principal's entries for these facts (unknown ids are ignored)."""
        require_principal(scope)
        if not fact_ids:
            return
        await self._transactions.run(lambda tx: tx.delete_index_entries(scope, fact_ids))

    async def search_index(self, scope: MemoryScope, query: str, k: int) -> list[ScoredFact]:
        """BM25 over the scope's entries, rehydrated from canonical facts (stale entries dropped)."""
        require_principal(scope)
        require_results(k)

        async def operation(tx: MemoryTransaction) -> list[ScoredFact]:
            entries = await tx.principal_index(scope.tenant_id, scope.principal_id)
            return await rehydrated_ranking(scope, query, entries, tx.load_fact, k)

        return await self._transactions.run(operation)

    async def search_authority(self, scope: MemoryScope, query: str, k: int) -> list[ScoredFact]:
        """Keyword overlap on canonical facts with recency tie-break (never touches the index)."""
        require_principal(scope)
        require_results(k)
        facts = await self._transactions.run(
            lambda tx: tx.principal_facts(scope.tenant_id, scope.principal_id)
        )
        return authority_ranking(scope, query, facts, k)

    # -- the principal ---------------------------------------------------------------------------

    async def export_principal(self, scope: MemoryScope) -> PrincipalExport:
        """Facts and audit covered by the scope, and the profile of exactly the scope."""
        facts = await self.list_facts(scope)
        audit = await self.fact_audit(scope)
        profile = await self.load_profile(scope)
        return PrincipalExport(scope=scope, facts=facts, audit=audit, profile=profile)

    async def forget_principal(self, tenant_id: str, principal_id: str) -> int:
        """Erase everything of the principal (every agent); returns the documents erased."""
        require_id("principal_id", principal_id)
        return await self._transactions.run(lambda tx: tx.forget(tenant_id, principal_id))
