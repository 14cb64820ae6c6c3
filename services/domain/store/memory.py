"""The in-memory store: the contract's rules over dictionaries, one critical section per operation."""

from __future__ import annotations

import asyncio
import bisect
import secrets
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from quipu.contracts.store import Record
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.store.rules import RuleStore
from quipu.services.domain.store.state import RunState, SessionState, StoreTransaction

T = TypeVar("T")


@dataclass
class _Tables:
    tombstones: set[str] = field(default_factory=set)
    sessions: dict[str, SessionState] = field(default_factory=dict)
    runs: dict[str, RunState] = field(default_factory=dict)
    # run id -> event key -> record, and run id -> records in sequence order
    records_by_key: dict[str, dict[str, Record]] = field(default_factory=dict)
    records_in_order: dict[str, list[Record]] = field(default_factory=dict)
    # session id -> (session sequence, record) in commit order
    session_records: dict[str, list[tuple[int, Record]]] = field(default_factory=dict)


class _MemoryTransaction:
    """Direct access to the tables; the lock around the operation makes it atomic."""

    def __init__(self, tables: _Tables) -> None:
        self._tables = tables

    async def is_tombstoned(self, session_id: str) -> bool:
        return session_id in self._tables.tombstones

    async def load_session(self, session_id: str) -> SessionState | None:
        return self._tables.sessions.get(session_id)

    async def save_session(self, state: SessionState) -> None:
        self._tables.sessions[state.session.session_id] = state

    async def load_run(self, run_id: str, *, likely_absent: bool = False) -> RunState | None:
        return self._tables.runs.get(run_id)

    async def save_run(self, state: RunState) -> None:
        self._tables.runs[state.run_id] = state

    async def load_record(self, run_id: str, event_key: str) -> Record | None:
        return self._tables.records_by_key.get(run_id, {}).get(event_key)

    async def log_chain(self, run: RunState) -> str | None:
        return run.log_chain  # nothing here is ever erased

    async def load_records(
        self, run_id: str, event_keys: list[str], *, likely_absent: Collection[str] = ()
    ) -> dict[str, Record]:
        held = self._tables.records_by_key.get(run_id, {})
        return {key: held[key] for key in event_keys if key in held}

    async def insert_records(self, rows: list[tuple[RunState, Record, int]]) -> None:
        for _, record, session_sequence in rows:
            self._tables.records_by_key.setdefault(record.run_id, {})[record.event_key] = record
            self._tables.records_in_order.setdefault(record.run_id, []).append(record)
            if session_sequence:
                listed = self._tables.session_records.setdefault(record.session_id, [])
                listed.append((session_sequence, record))

    async def list_records(self, run_id: str, after: int, limit: int) -> list[Record]:
        # Per-run sequences start at 1 and have no gaps, so position `after` is the slice start.
        return self._tables.records_in_order.get(run_id, [])[after : after + limit]

    async def list_session_records(self, session_id: str, after: int, limit: int) -> list[tuple[int, Record]]:
        rows = self._tables.session_records.get(session_id, [])
        start = bisect.bisect_right(rows, after, key=lambda row: row[0])
        return rows[start : start + limit]

    async def list_runs(self, session_id: str) -> list[RunState]:
        runs = [run for run in self._tables.runs.values() if run.session_id == session_id]
        return sorted(runs, key=lambda run: run.start_order)

    async def purge(self, session_id: str) -> None:
        tables = self._tables
        tables.tombstones.add(session_id)
        tables.sessions.pop(session_id, None)
        tables.session_records.pop(session_id, None)
        for run_id in [run.run_id for run in tables.runs.values() if run.session_id == session_id]:
            tables.runs.pop(run_id)
            tables.records_by_key.pop(run_id, None)
            tables.records_in_order.pop(run_id, None)


class _MemoryTransactions:
    """Serialises operations: one critical section each, as STORE_CONTRACT §6.1 allows in memory."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._transaction = _MemoryTransaction(_Tables())

    async def run(self, operation: Callable[[StoreTransaction], Awaitable[T]]) -> T:
        async with self._lock:
            return await operation(self._transaction)

    async def read(self, operation: Callable[[StoreTransaction], Awaitable[T]]) -> T:
        return await self.run(operation)


class InMemoryStore(RuleStore):
    """The `Store` for unit tests and single-process use; state lives as long as the object."""

    def __init__(
        self, cursor_secret: bytes | None = None, clock: Callable[[], datetime] = utc_now_ms
    ) -> None:
        super().__init__(_MemoryTransactions(), cursor_secret or secrets.token_bytes(32), clock)
