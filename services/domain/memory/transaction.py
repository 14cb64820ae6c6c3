"""The port the memory rules run over: one backend transaction (`MemoryTransaction`) and the
runner that applies an operation atomically (`MemoryTransactionRunner`). No rule lives here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import (
    Fact,
    FactChanged,
    HistoryMessage,
    IndexEntry,
    MemoryScope,
    Profile,
    SessionSummary,
)
from quipu.services.domain.memory.tombstone import Forgetting

T = TypeVar("T")


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

    async def load_session(self, session_id: str, *, likely_absent: bool = False) -> MemorySession | None:
        """The session's bookkeeping, or None before its first turn. `likely_absent`: the operation
        saves the session when it is absent and expects it to be (a claim). A backend may answer
        None without reading it, provided it confirms that before the operation's outcome stands:
        by its save inserting the session (its unique id), or else by a read, failing the attempt
        as a write race when the session is there; the retry reads it."""
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

    async def forgetting(self, tenant_id: str, principal_id: str, turn_marks: Sequence[str]) -> Forgetting:
        """What forget marks say of the principal and of these turns (`tombstone.turn_mark` ids)."""
        ...

    async def forget(self, tenant_id: str, principal_id: str, at: datetime) -> int:
        """Erase everything of the principal, leaving forget's marks (the person's, dated `at`, and
        one per erased turn, dated `at` too); count rows, summaries, facts, audit, profiles and entries."""
        ...

    async def drop_turn_marks(self, before: datetime) -> None:
        """Delete the turn marks of every forget made before `before` (people's marks stay)."""
        ...


class MemoryTransactionRunner(Protocol):
    """Runs one operation atomically, retrying it whole on a transient conflict."""

    async def run(self, operation: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        """Apply `operation` in one transaction and return its result."""
        ...

    async def read(self, operation: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        """Apply a read-only `operation` whose reads need not share one snapshot (a single
        document, or rows only ever appended): a backend may run it outside any transaction."""
        ...
