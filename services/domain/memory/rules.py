"""The memory rules, applied once for every backend (docs/architecture.md, "Conversation memory").

`MemoryRules` is the `MemoryStore` protocol over a `MemoryTransactionRunner` (`transaction`), so
the in-memory store and the MongoDB store differ only in how they load and save inside one atomic
unit. Every check of an operation runs before its first write (`validation`), so a refused
command writes nothing; searches rank the same way everywhere (`ranking`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import NoReturn

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
    SessionMemory,
    SessionSummary,
)
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.ranking import (
    audit_order,
    authority_ranking,
    fact_order,
    rehydrated_ranking,
    scope_covers,
)
from quipu.services.domain.memory.tombstone import DEFAULT_TURN_MARKS_KEEP, turn_mark
from quipu.services.domain.memory.transaction import (
    MemorySession,
    MemoryTransaction,
    MemoryTransactionRunner,
    require_owner,
)
from quipu.services.domain.memory.validation import (
    MAX_HISTORY_PAGE,
    check_operations,
    require_principal,
    require_results,
)
from quipu.services.domain.store.validation import require_id, require_millisecond

USER_DELETE_PREFIX = "user-delete/"


def _fail(code: ErrorCode, message: str) -> NoReturn:
    raise StoreError(code, message)


async def _refuse_forgotten(
    tx: MemoryTransaction,
    tenant_id: str,
    principal_id: str,
    said_at: datetime | None,
    turns: Sequence[tuple[str, str]] = (),
) -> None:
    """PRINCIPAL_FORGOTTEN when the words were said at or before the principal's last forget, or
    come from a turn forget erased (`turns`: session and turn ids): writing them would bring back
    what forget erased, under a key made anew."""
    marks = [turn_mark(tenant_id, principal_id, session_id, turn_id) for session_id, turn_id in turns]
    if (await tx.forgetting(tenant_id, principal_id, marks)).refuses(said_at):
        _fail(ErrorCode.PRINCIPAL_FORGOTTEN, "these words were erased when their principal was forgotten")


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
    """The `MemoryStore` over a transaction runner; `clock` stamps fact changes and forgets."""

    def __init__(
        self,
        transactions: MemoryTransactionRunner,
        clock: Callable[[], datetime] = utc_now_ms,
        turn_marks_keep: timedelta = DEFAULT_TURN_MARKS_KEEP,
    ) -> None:
        self._transactions = transactions
        self._clock = clock
        self._turn_marks_keep = turn_marks_keep

    @property
    def turn_claims(self) -> None:
        """None: a direct store; its caller applies `SessionClaimRule` (`MemoryStore`)."""
        return None

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
            who = turn.scope
            turns = [(turn.session_id, turn.turn_id)]
            await _refuse_forgotten(tx, who.tenant_id, who.principal_id, turn.created_at, turns)
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
            # A turn is claimed once a planner first sees its session: mostly the session's first.
            session = await tx.load_session(session_id, likely_absent=True)
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
        _require_tail_count(count)
        if count == 0:
            return []
        # The session's last row, then rows only ever appended (a forget erases them whole).
        return await self._transactions.read(lambda tx: tx.history_tail(session_id, count))

    # -- summaries -----------------------------------------------------------------------------

    async def load_summary(self, session_id: str) -> SessionSummary | None:
        """The rolling summary or None."""
        require_id("session_id", session_id)
        return await self._transactions.read(lambda tx: tx.load_summary(session_id))  # one document

    async def load_session_memory(self, session_id: str, count: int) -> SessionMemory:
        """The rolling summary and the last `count` rows (0 to 500), read together."""
        require_id("session_id", session_id)
        _require_tail_count(count)

        async def read(tx: MemoryTransaction) -> SessionMemory:
            # Neither read needs the other's snapshot (each as `load_summary` and `history_tail`).
            summary = await tx.load_summary(session_id)
            tail = await tx.history_tail(session_id, count) if count else []
            return SessionMemory(summary=summary, tail=tail)

        return await self._transactions.read(read)

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
            owner = session.scope
            await _refuse_forgotten(tx, owner.tenant_id, owner.principal_id, summary.updated_at)
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
            sources = {(op.provenance.session_id, op.provenance.turn_id) for op in operations}
            turns = sorted(source for source in sources if source[1])
            if turns:
                await _refuse_forgotten(tx, scope.tenant_id, scope.principal_id, None, turns)
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
            who = profile.scope
            await _refuse_forgotten(tx, who.tenant_id, who.principal_id, profile.updated_at)
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
        """Erase everything of the principal (every agent); returns the documents erased.

        Forget leaves its marks (`tombstone`): from then on, words the person said before it and
        turns it erased are refused PRINCIPAL_FORGOTTEN, wherever a late copy comes from.
        """
        require_id("principal_id", principal_id)
        return await self._forget(tenant_id, principal_id, self._clock())

    async def _forget(self, tenant_id: str, principal_id: str, at: datetime) -> int:
        """Erase and mark in one transaction, dropping expired turn marks (a backend with keys
        shreds them first)."""

        async def operation(tx: MemoryTransaction) -> int:
            erased = await tx.forget(tenant_id, principal_id, at)
            await tx.drop_turn_marks(at - self._turn_marks_keep)
            return erased

        return await self._transactions.run(operation)


def _require_tail_count(count: int) -> None:
    """How many of a session's last rows a read may ask for: 0 to 500."""
    if not 0 <= count <= MAX_HISTORY_PAGE:
        raise invalid(f"count must be between 0 and {MAX_HISTORY_PAGE}")
