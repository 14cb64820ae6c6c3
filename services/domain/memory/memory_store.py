"""The in-memory `MemoryStore`: the memory rules over dictionaries, one critical section per operation.

Nothing is encrypted here (nothing is at rest); behaviour is otherwise identical to the MongoDB
store, which the conformance suite checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from quipu.contracts.memory import (
    Fact,
    FactChanged,
    HistoryMessage,
    IndexEntry,
    MemoryScope,
    Profile,
    SessionSummary,
)
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.rules import MemoryRules
from quipu.services.domain.memory.tombstone import (
    DEFAULT_TURN_MARKS_KEEP,
    Forgetting,
    person_mark,
    turn_mark,
)
from quipu.services.domain.memory.transaction import MemorySession, MemoryTransaction

T = TypeVar("T")

_Principal = tuple[str, str]


def _principal(scope: MemoryScope) -> _Principal:
    return (scope.tenant_id, scope.principal_id)


@dataclass
class _Tables:
    sessions: dict[str, MemorySession] = field(default_factory=dict)
    history: dict[str, list[HistoryMessage]] = field(default_factory=dict)  # in seq order
    summaries: dict[str, SessionSummary] = field(default_factory=dict)
    fact_changes: dict[tuple[str, str, str], list[FactChanged]] = field(default_factory=dict)
    facts: dict[str, Fact] = field(default_factory=dict)
    audit: list[Fact] = field(default_factory=list)
    profiles: dict[MemoryScope, Profile] = field(default_factory=dict)
    index: dict[str, IndexEntry] = field(default_factory=dict)
    forgotten_people: dict[str, datetime] = field(default_factory=dict)
    """Forget's person marks: when each was last forgotten."""
    erased_turns: dict[str, datetime] = field(default_factory=dict)
    """Forget's turn marks: when each turn was erased."""


class _MemoryTransaction:
    """Direct access to the tables; the lock around the operation makes it atomic."""

    def __init__(self, tables: _Tables) -> None:
        self._tables = tables

    async def load_session(self, session_id: str, *, likely_absent: bool = False) -> MemorySession | None:
        return self._tables.sessions.get(session_id)

    async def save_session(self, session: MemorySession) -> None:
        self._tables.sessions[session.session_id] = session

    async def find_turn(self, session_id: str, turn_id: str) -> list[HistoryMessage]:
        return [row for row in self._tables.history.get(session_id, []) if row.turn_id == turn_id]

    async def insert_history(self, session: MemorySession, rows: list[HistoryMessage]) -> None:
        self._tables.history.setdefault(session.session_id, []).extend(rows)

    async def list_history(self, session_id: str, after_seq: int, limit: int) -> list[HistoryMessage]:
        # Seqs start at 1 and have no gaps, so seq `after_seq + 1` sits at position `after_seq`.
        return self._tables.history.get(session_id, [])[after_seq : after_seq + limit]

    async def history_tail(self, session_id: str, count: int) -> list[HistoryMessage]:
        return self._tables.history.get(session_id, [])[-count:]

    async def load_summary(self, session_id: str) -> SessionSummary | None:
        return self._tables.summaries.get(session_id)

    async def save_summary(self, session: MemorySession, summary: SessionSummary) -> None:
        self._tables.summaries[session.session_id] = summary

    async def load_fact_changes(self, scope: MemoryScope, idempotency_key: str) -> list[FactChanged] | None:
        recorded = self._tables.fact_changes.get((*_principal(scope), idempotency_key))
        return None if recorded is None else list(recorded)

    async def save_fact_changes(
        self, scope: MemoryScope, idempotency_key: str, changes: list[FactChanged]
    ) -> None:
        self._tables.fact_changes[(*_principal(scope), idempotency_key)] = list(changes)

    async def load_fact(self, fact_id: str) -> Fact | None:
        return self._tables.facts.get(fact_id)

    async def fact_id_used(self, fact_id: str) -> bool:
        return fact_id in self._tables.facts or any(old.fact_id == fact_id for old in self._tables.audit)

    async def save_fact(self, fact: Fact) -> None:
        self._tables.facts[fact.fact_id] = fact

    async def remove_fact(self, fact_id: str) -> None:
        self._tables.facts.pop(fact_id, None)

    async def archive_fact(self, fact: Fact) -> None:
        self._tables.audit.append(fact)

    async def principal_facts(self, tenant_id: str, principal_id: str) -> list[Fact]:
        return [
            fact
            for fact in self._tables.facts.values()
            if _principal(fact.scope) == (tenant_id, principal_id)
        ]

    async def principal_audit(self, tenant_id: str, principal_id: str) -> list[Fact]:
        return [fact for fact in self._tables.audit if _principal(fact.scope) == (tenant_id, principal_id)]

    async def save_profile(self, profile: Profile) -> None:
        self._tables.profiles[profile.scope] = profile

    async def load_profile(self, scope: MemoryScope) -> Profile | None:
        return self._tables.profiles.get(scope)

    async def load_index_entry(self, fact_id: str) -> IndexEntry | None:
        return self._tables.index.get(fact_id)

    async def save_index_entry(self, entry: IndexEntry) -> None:
        self._tables.index[entry.fact_id] = entry

    async def delete_index_entries(self, scope: MemoryScope, fact_ids: list[str]) -> None:
        for fact_id in fact_ids:
            entry = self._tables.index.get(fact_id)
            if entry is not None and _principal(entry.scope) == _principal(scope):
                del self._tables.index[fact_id]

    async def principal_index(self, tenant_id: str, principal_id: str) -> list[IndexEntry]:
        return [
            entry
            for entry in self._tables.index.values()
            if _principal(entry.scope) == (tenant_id, principal_id)
        ]

    async def forgetting(self, tenant_id: str, principal_id: str, turn_marks: Sequence[str]) -> Forgetting:
        tables = self._tables
        return Forgetting(
            forgotten_at=tables.forgotten_people.get(person_mark(tenant_id, principal_id)),
            erased_turn=any(mark in tables.erased_turns for mark in turn_marks),
        )

    async def drop_turn_marks(self, before: datetime) -> None:
        turns = self._tables.erased_turns
        for mark in [mark for mark, at in turns.items() if at < before]:
            del turns[mark]

    async def forget(self, tenant_id: str, principal_id: str, at: datetime) -> int:
        tables = self._tables
        who = (tenant_id, principal_id)
        tables.forgotten_people[person_mark(tenant_id, principal_id)] = at
        erased = 0
        for session_id in [
            sid for sid, session in tables.sessions.items() if _principal(session.scope) == who
        ]:
            del tables.sessions[session_id]
            rows = tables.history.pop(session_id, [])
            for row in rows:
                tables.erased_turns[turn_mark(tenant_id, principal_id, session_id, row.turn_id)] = at
            erased += len(rows)
            erased += 1 if tables.summaries.pop(session_id, None) is not None else 0
        for fact_id in [fact_id for fact_id, fact in tables.facts.items() if _principal(fact.scope) == who]:
            del tables.facts[fact_id]
            erased += 1
        kept = [fact for fact in tables.audit if _principal(fact.scope) != who]
        erased += len(tables.audit) - len(kept)
        tables.audit = kept
        for scope in [scope for scope in tables.profiles if _principal(scope) == who]:
            del tables.profiles[scope]
            erased += 1
        for fact_id in [fact_id for fact_id, entry in tables.index.items() if _principal(entry.scope) == who]:
            del tables.index[fact_id]
            erased += 1
        for key in [key for key in tables.fact_changes if key[:2] == who]:
            del tables.fact_changes[key]
        return erased


class _MemoryTransactions:
    """Serialises operations: one critical section each."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._transaction = _MemoryTransaction(_Tables())

    async def run(self, operation: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        async with self._lock:
            return await operation(self._transaction)

    async def read(self, operation: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        return await self.run(operation)


class InMemoryMemoryStore(MemoryRules):
    """The `MemoryStore` for unit tests and single-process use; state lives as long as the object."""

    def __init__(
        self, clock: Callable[[], datetime] = utc_now_ms, turn_marks_keep: timedelta = DEFAULT_TURN_MARKS_KEEP
    ) -> None:
        super().__init__(_MemoryTransactions(), clock, turn_marks_keep)
