"""Memory commands on `storage.commands`: one model per `MemoryStore` method.

Same pattern as `quipu.contracts.commands`: each command names a `MemoryStore` method and its own
fields are that method's keyword arguments; `backend` tells the owner to apply it to its memory
store. Commands are keyed by session id when they touch one session, else by principal id.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

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
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store_operation import Backend, StoreOperation


class MemoryOperation(StoreOperation):
    """Base of a memory command: applied by the owner's `MemoryStore`."""

    backend: ClassVar[Backend] = Backend.MEMORY

    def partition_key(self) -> str:
        """The session when the command has one, else the principal (ordering only)."""
        for name in ("session_id", "turn", "summary"):
            value = self.field_or_none(name)
            if isinstance(value, HistoryTurn | SessionSummary):
                return value.session_id
            if isinstance(value, str) and value:
                return value
        for name in ("scope", "profile", "entry"):
            value = self.field_or_none(name)
            if isinstance(value, MemoryScope):
                return value.principal_id
            if isinstance(value, Profile | IndexEntry):
                return value.scope.principal_id
        return ""

    def whose_words(self) -> SealedFor | None:
        """The principal whose memory the command touches (their key seals it), when it names one."""
        for name in ("scope", "turn", "profile", "entry"):
            value = self.field_or_none(name)
            scope = value if isinstance(value, MemoryScope) else getattr(value, "scope", None)
            if isinstance(scope, MemoryScope) and scope.principal_id:
                return SealedFor(tenant_id=scope.tenant_id, principal_id=scope.principal_id)
        return None


class AppendHistoryTurn(MemoryOperation, result_type=HistoryAppendResult):
    """Record a finished turn as two history rows; the same turn again writes nothing."""

    turn: HistoryTurn = Field(description="The turn to record.")


class ClaimSession(MemoryOperation, result_type=MemoryScope):
    """Bind a session to a principal unless it has an owner; refused when another principal owns it."""

    session_id: str = Field(description="Session to claim.")
    scope: MemoryScope = Field(description="Tenant, principal and agent claiming it.")


class ClaimSessionForTurn(MemoryOperation, result_type=MemoryScope):
    """Admit a turn into a session by its owner: the history is claimed for the owner recorded on
    the session (else for the turn's person) and a turn of anyone else is refused."""

    backend: ClassVar[Backend] = Backend.BOTH
    session_id: str = Field(description="Session the turn is in.")
    scope: MemoryScope = Field(
        description="The turn's tenant, principal (from its credentials) and agent; the recorded owner "
        "is the owner's own data, never part of the command."
    )


class ListHistory(MemoryOperation, result_type=list[HistoryMessage]):
    """Read history rows after a sequence."""

    session_id: str = Field(description="Session to read.")
    after_seq: int = Field(default=0, description="Rows with a greater seq are returned.")
    limit: int = Field(description="At most this many rows, 1..500.")


class HistoryTail(MemoryOperation, result_type=list[HistoryMessage]):
    """Read the last rows of a session."""

    session_id: str = Field(description="Session to read.")
    count: int = Field(description="How many rows, 0..500.")


class LoadSummary(MemoryOperation, result_type=SessionSummary | None):
    """Read a session's rolling summary."""

    session_id: str = Field(description="Session summarised.")


class LoadSessionMemory(MemoryOperation, result_type=SessionMemory):
    """Read a session's rolling summary and its last rows in one command (a turn's memory)."""

    session_id: str = Field(description="Session to read.")
    count: int = Field(description="How many of its last rows, 0..500.")


class SaveSummary(MemoryOperation, result_type=SessionSummary):
    """Save the next version of a session's summary (conditional on version and cursor)."""

    summary: SessionSummary = Field(description="Version N+1 of the summary.")


class ApplyFactOperations(MemoryOperation, result_type=list[FactChanged]):
    """Apply curated-memory operations atomically, once per idempotency key."""

    scope: MemoryScope = Field(description="Whose memory.")
    operations: list[FactOperation] = Field(description="Validated operations.")
    idempotency_key: str = Field(description="Applying the same key again changes nothing.")


class ListFacts(MemoryOperation, result_type=list[Fact]):
    """Read the current facts of a scope."""

    scope: MemoryScope = Field(description="Whose facts (empty agent = every agent).")


class FactAudit(MemoryOperation, result_type=list[Fact]):
    """Read previous versions of updated and deleted facts."""

    scope: MemoryScope = Field(description="Whose audit trail.")


class DeleteFact(MemoryOperation, result_type=FactChanged):
    """Delete one fact at the user's request."""

    scope: MemoryScope = Field(description="Whose fact.")
    fact_id: str = Field(description="The fact to delete.")


class SaveProfile(MemoryOperation, result_type=Profile):
    """Replace a principal's profile."""

    profile: Profile = Field(description="The new profile.")


class LoadProfile(MemoryOperation, result_type=Profile | None):
    """Read a principal's profile."""

    scope: MemoryScope = Field(description="Whose profile.")


class UpsertIndexEntry(MemoryOperation, result_type=None):
    """Store a derived retrieval entry (never over a newer version)."""

    entry: IndexEntry = Field(description="The entry.")


class DeleteIndexEntries(MemoryOperation, result_type=None):
    """Drop derived entries."""

    scope: MemoryScope = Field(description="Whose entries.")
    fact_ids: list[str] = Field(description="Facts whose entries go.")


class SearchIndex(MemoryOperation, result_type=list[ScoredFact]):
    """Search the derived index, rehydrated from canonical facts."""

    scope: MemoryScope = Field(description="Scope searched (never crossed).")
    query: str = Field(description="Free text.")
    k: int = Field(description="At most this many facts, 1..100.")


class SearchAuthority(MemoryOperation, result_type=list[ScoredFact]):
    """Search canonical facts by keyword overlap and recency (the fallback)."""

    scope: MemoryScope = Field(description="Scope searched (never crossed).")
    query: str = Field(description="Free text.")
    k: int = Field(description="At most this many facts, 1..100.")


class ExportPrincipal(MemoryOperation, result_type=PrincipalExport):
    """Read everything remembered about a principal."""

    scope: MemoryScope = Field(description="Whose memory.")


class ForgetPrincipal(MemoryOperation, result_type=int):
    """Erase a principal: facts, audit, profiles, history, summaries, index entries and their key."""

    scope: MemoryScope = Field(description="Tenant and principal to erase (the agent is ignored).")

    def arguments(self) -> dict[str, Any]:
        """`forget_principal(tenant_id, principal_id)`: the envelope's own tenant is not the target."""
        return {"tenant_id": self.scope.tenant_id, "principal_id": self.scope.principal_id}

    def whose_words(self) -> SealedFor | None:
        """None: the command and its reply carry no words, and sealing them would make the key anew."""
        return None


MemoryCommand = (
    AppendHistoryTurn
    | ClaimSession
    | ClaimSessionForTurn
    | ListHistory
    | HistoryTail
    | LoadSummary
    | LoadSessionMemory
    | SaveSummary
    | ApplyFactOperations
    | ListFacts
    | FactAudit
    | DeleteFact
    | SaveProfile
    | LoadProfile
    | UpsertIndexEntry
    | DeleteIndexEntries
    | SearchIndex
    | SearchAuthority
    | ExportPrincipal
    | ForgetPrincipal
)
"""Every memory command (members of the `storage.commands` union)."""
