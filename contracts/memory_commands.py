"""Memory commands on `storage.commands`: one model per `MemoryStore` method.

Same pattern as `quipu.contracts.commands`: each command names a `MemoryStore` method and its own
fields are that method's keyword arguments; `backend` tells the owner to apply it to its memory
store. Commands are keyed by session id when they touch one session, else by principal id.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

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
    SessionSummary,
)
from quipu.contracts.store_operation import Backend, StoreOperation


class MemoryOperation(StoreOperation):
    """Base of a memory command: applied by the owner's `MemoryStore`."""

    backend: ClassVar[Backend] = Backend.MEMORY

    def partition_key(self) -> str:
        """The session when the command has one, else the principal (ordering only)."""
        for name in ("session_id", "turn", "summary"):
            value = getattr(self, name, None)
            if isinstance(value, HistoryTurn | SessionSummary):
                return value.session_id
            if isinstance(value, str) and value:
                return value
        for name in ("scope", "profile", "entry"):
            value = getattr(self, name, None)
            if isinstance(value, MemoryScope):
                return value.principal_id
            if isinstance(value, Profile | IndexEntry):
                return value.scope.principal_id
        return ""


class AppendHistoryTurn(MemoryOperation):
    """Record a finished turn as two history rows; the same turn again writes nothing."""

    method: ClassVar[str] = "append_history_turn"
    result_type: ClassVar[Any] = HistoryAppendResult
    op: Literal["AppendHistoryTurn"] = Field(default="AppendHistoryTurn", description="Operation name.")
    turn: HistoryTurn = Field(description="The turn to record.")


class ClaimSession(MemoryOperation):
    """Bind a session to a principal unless it has an owner; refused when another principal owns it."""

    method: ClassVar[str] = "claim_session"
    result_type: ClassVar[Any] = MemoryScope
    op: Literal["ClaimSession"] = Field(default="ClaimSession", description="Operation name.")
    session_id: str = Field(description="Session to claim.")
    scope: MemoryScope = Field(description="Tenant, principal and agent claiming it.")


class ListHistory(MemoryOperation):
    """Read history rows after a sequence."""

    method: ClassVar[str] = "list_history"
    result_type: ClassVar[Any] = list[HistoryMessage]
    op: Literal["ListHistory"] = Field(default="ListHistory", description="Operation name.")
    session_id: str = Field(description="Session to read.")
    after_seq: int = Field(default=0, description="Rows with a greater seq are returned.")
    limit: int = Field(description="At most this many rows, 1..500.")


class HistoryTail(MemoryOperation):
    """Read the last rows of a session."""

    method: ClassVar[str] = "history_tail"
    result_type: ClassVar[Any] = list[HistoryMessage]
    op: Literal["HistoryTail"] = Field(default="HistoryTail", description="Operation name.")
    session_id: str = Field(description="Session to read.")
    count: int = Field(description="How many rows, 0..500.")


class LoadSummary(MemoryOperation):
    """Read a session's rolling summary."""

    method: ClassVar[str] = "load_summary"
    result_type: ClassVar[Any] = SessionSummary | None
    op: Literal["LoadSummary"] = Field(default="LoadSummary", description="Operation name.")
    session_id: str = Field(description="Session summarised.")


class SaveSummary(MemoryOperation):
    """Save the next version of a session's summary (conditional on version and cursor)."""

    method: ClassVar[str] = "save_summary"
    result_type: ClassVar[Any] = SessionSummary
    op: Literal["SaveSummary"] = Field(default="SaveSummary", description="Operation name.")
    summary: SessionSummary = Field(description="Version N+1 of the summary.")


class ApplyFactOperations(MemoryOperation):
    """Apply curated-memory operations atomically, once per idempotency key."""

    method: ClassVar[str] = "apply_fact_operations"
    result_type: ClassVar[Any] = list[FactChanged]
    op: Literal["ApplyFactOperations"] = Field(default="ApplyFactOperations", description="Operation name.")
    scope: MemoryScope = Field(description="Whose memory.")
    operations: list[FactOperation] = Field(description="Validated operations.")
    idempotency_key: str = Field(description="Applying the same key again changes nothing.")


class ListFacts(MemoryOperation):
    """Read the current facts of a scope."""

    method: ClassVar[str] = "list_facts"
    result_type: ClassVar[Any] = list[Fact]
    op: Literal["ListFacts"] = Field(default="ListFacts", description="Operation name.")
    scope: MemoryScope = Field(description="Whose facts (empty agent = every agent).")


class FactAudit(MemoryOperation):
    """Read previous versions of updated and deleted facts."""

    method: ClassVar[str] = "fact_audit"
    result_type: ClassVar[Any] = list[Fact]
    op: Literal["FactAudit"] = Field(default="FactAudit", description="Operation name.")
    scope: MemoryScope = Field(description="Whose audit trail.")


class DeleteFact(MemoryOperation):
    """Delete one fact at the user's request."""

    method: ClassVar[str] = "delete_fact"
    result_type: ClassVar[Any] = FactChanged
    op: Literal["DeleteFact"] = Field(default="DeleteFact", description="Operation name.")
    scope: MemoryScope = Field(description="Whose fact.")
    fact_id: str = Field(description="The fact to delete.")


class SaveProfile(MemoryOperation):
    """Replace a principal's profile."""

    method: ClassVar[str] = "save_profile"
    result_type: ClassVar[Any] = Profile
    op: Literal["SaveProfile"] = Field(default="SaveProfile", description="Operation name.")
    profile: Profile = Field(description="The new profile.")


class LoadProfile(MemoryOperation):
    """Read a principal's profile."""

    method: ClassVar[str] = "load_profile"
    result_type: ClassVar[Any] = Profile | None
    op: Literal["LoadProfile"] = Field(default="LoadProfile", description="Operation name.")
    scope: MemoryScope = Field(description="Whose profile.")


class UpsertIndexEntry(MemoryOperation):
    """Store a derived retrieval entry (never over a newer version)."""

    method: ClassVar[str] = "upsert_index_entry"
    result_type: ClassVar[Any] = None
    op: Literal["UpsertIndexEntry"] = Field(default="UpsertIndexEntry", description="Operation name.")
    entry: IndexEntry = Field(description="The entry.")


class DeleteIndexEntries(MemoryOperation):
    """Drop derived entries."""

    method: ClassVar[str] = "delete_index_entries"
    result_type: ClassVar[Any] = None
    op: Literal["DeleteIndexEntries"] = Field(default="DeleteIndexEntries", description="Operation name.")
    scope: MemoryScope = Field(description="Whose entries.")
    fact_ids: list[str] = Field(description="Facts whose entries go.")


class SearchIndex(MemoryOperation):
    """Search the derived index, rehydrated from canonical facts."""

    method: ClassVar[str] = "search_index"
    result_type: ClassVar[Any] = list[ScoredFact]
    op: Literal["SearchIndex"] = Field(default="SearchIndex", description="Operation name.")
    scope: MemoryScope = Field(description="Scope searched (never crossed).")
    query: str = Field(description="Free text.")
    k: int = Field(description="At most this many facts, 1..100.")


class SearchAuthority(MemoryOperation):
    """Search canonical facts by keyword overlap and recency (the fallback)."""

    method: ClassVar[str] = "search_authority"
    result_type: ClassVar[Any] = list[ScoredFact]
    op: Literal["SearchAuthority"] = Field(default="SearchAuthority", description="Operation name.")
    scope: MemoryScope = Field(description="Scope searched (never crossed).")
    query: str = Field(description="Free text.")
    k: int = Field(description="At most this many facts, 1..100.")


class ExportPrincipal(MemoryOperation):
    """Read everything remembered about a principal."""

    method: ClassVar[str] = "export_principal"
    result_type: ClassVar[Any] = PrincipalExport
    op: Literal["ExportPrincipal"] = Field(default="ExportPrincipal", description="Operation name.")
    scope: MemoryScope = Field(description="Whose memory.")


class ForgetPrincipal(MemoryOperation):
    """Erase a principal: facts, audit, profiles, history, summaries, index entries and their key."""

    method: ClassVar[str] = "forget_principal"
    result_type: ClassVar[Any] = int
    op: Literal["ForgetPrincipal"] = Field(default="ForgetPrincipal", description="Operation name.")
    scope: MemoryScope = Field(description="Tenant and principal to erase (the agent is ignored).")

    def arguments(self) -> dict[str, Any]:
        """`forget_principal(tenant_id, principal_id)`: the envelope's own tenant is not the target."""
        return {"tenant_id": self.scope.tenant_id, "principal_id": self.scope.principal_id}


MemoryCommand = (
    AppendHistoryTurn
    | ClaimSession
    | ListHistory
    | HistoryTail
    | LoadSummary
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
