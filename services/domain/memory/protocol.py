"""The `MemoryStore` protocol: product history, summaries, facts, profiles and the derived index.

Implementations: in memory (unit tests), MongoDB inside the storage owner (the only writer), and
the Kafka client that calls the owner. Every method raises `StoreError` on refusal:
MEMORY_CONFLICT for a stale conditional write, FACT_NOT_FOUND, INVALID_ARGUMENT, UNAVAILABLE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from quipu.contracts.memory import (
    Fact,
    FactChanged,
    FactOperation,
    HistoryAppendResult,
    HistoryMessage,
    HistoryTurn,
    IndexEntry,
    MemoryScope,
    PrincipalExport,
    Profile,
    ScoredFact,
    SessionMemory,
    SessionSummary,
)

if TYPE_CHECKING:
    from quipu.services.domain.session_claims import SessionClaims


class MemoryStore(Protocol):
    """Conversation memory as the services see it.

    Capability (`turn_claims`): a store that reaches the storage owner admits a turn into its
    session in one command, which the owner applies over the runtime store and the history it
    holds both of; a direct store (in memory, MongoDB) has none, and its caller applies
    `SessionClaimRule` over the two stores itself.
    """

    @property
    def turn_claims(self) -> SessionClaims | None:
        """The owner-side claim of a session for a turn (one command); None for a direct store."""
        ...

    async def append_history_turn(self, turn: HistoryTurn) -> HistoryAppendResult:
        """Record a turn as two rows (user, assistant); the same turn_id again writes nothing."""
        ...

    async def claim_session(self, session_id: str, scope: MemoryScope) -> MemoryScope:
        """Make `scope`'s principal the session's owner unless it has one; return the owner.
        A session owned by another tenant or principal is SESSION_PRINCIPAL_MISMATCH."""
        ...

    async def list_history(self, session_id: str, after_seq: int, limit: int) -> list[HistoryMessage]:
        """Rows with seq > after_seq, in order, at most `limit` (≤ 500)."""
        ...

    async def history_tail(self, session_id: str, count: int) -> list[HistoryMessage]:
        """The last `count` rows of the session, in order."""
        ...

    async def load_summary(self, session_id: str) -> SessionSummary | None:
        """The session's rolling summary, or None before the first fold."""
        ...

    async def load_session_memory(self, session_id: str, count: int) -> SessionMemory:
        """The session's rolling summary (`load_summary`) and its last `count` rows (`history_tail`),
        in one call: what a turn shows of its session."""
        ...

    async def save_summary(self, summary: SessionSummary) -> SessionSummary:
        """Save version N+1 over version N (`summary.version` = stored version + 1, first = 1) with a
        cursor strictly after the stored one; anything else is MEMORY_CONFLICT."""
        ...

    async def apply_fact_operations(
        self, scope: MemoryScope, operations: list[FactOperation], idempotency_key: str
    ) -> list[FactChanged]:
        """Apply validated operations atomically; the same idempotency key again changes nothing and
        returns the original changes. Update/delete of a fact outside `scope` is FACT_NOT_FOUND."""
        ...

    async def list_facts(self, scope: MemoryScope) -> list[Fact]:
        """Current facts of the scope (principal's facts for every agent when scope.agent_id is empty)."""
        ...

    async def fact_audit(self, scope: MemoryScope) -> list[Fact]:
        """Previous versions of updated and deleted facts, oldest first."""
        ...

    async def delete_fact(self, scope: MemoryScope, fact_id: str) -> FactChanged:
        """Delete one fact (user control); its previous version goes to the audit trail."""
        ...

    async def save_profile(self, profile: Profile) -> Profile:
        """Replace the principal's profile."""
        ...

    async def load_profile(self, scope: MemoryScope) -> Profile | None:
        """The principal's profile, or None."""
        ...

    async def upsert_index_entry(self, entry: IndexEntry) -> None:
        """Store a derived entry; an entry for an older fact version never replaces a newer one."""
        ...

    async def delete_index_entries(self, scope: MemoryScope, fact_ids: list[str]) -> None:
        """Drop derived entries (a deleted fact, a reindex)."""
        ...

    async def search_index(self, scope: MemoryScope, query: str, k: int) -> list[ScoredFact]:
        """Top-k facts by the derived index, rehydrated from canonical facts: entries for deleted,
        superseded (stale version) or out-of-scope facts are dropped."""
        ...

    async def search_authority(self, scope: MemoryScope, query: str, k: int) -> list[ScoredFact]:
        """Top-k facts straight from the authority by keyword overlap and recency (the fallback)."""
        ...

    async def export_principal(self, scope: MemoryScope) -> PrincipalExport:
        """Everything remembered about the principal."""
        ...

    async def forget_principal(self, tenant_id: str, principal_id: str) -> int:
        """Erase the principal: facts, audit, profile, history, summaries of their sessions and index
        entries; returns how many documents went."""
        ...
