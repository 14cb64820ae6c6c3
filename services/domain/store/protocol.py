"""The `Store` protocol: one interface, three implementations (memory, MongoDB, Kafka client)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from quipu.contracts.store import (
    AppendResult,
    Checkpoint,
    LogBasis,
    Page,
    Record,
    RunMeta,
    RunStart,
    RunStatus,
    Session,
    SessionOwner,
    StartResult,
)


class Store(Protocol):
    """The runtime store contract (STORE_CONTRACT §6). Every method raises `StoreError` on refusal."""

    async def create_session(
        self, session_id: str, created_at: datetime, owner: SessionOwner | None = None
    ) -> Session:
        """CreateSession: insert an active session with its owner, or return the stored active one as is."""
        ...

    async def end_session(self, session_id: str, ended_at: datetime) -> Session:
        """EndSession: end an active session; an ended one is returned with its first `ended_at`."""
        ...

    async def load_session_status(self, session_id: str) -> Session:
        """LoadSessionStatus."""
        ...

    async def purge_session(self, session_id: str) -> None:
        """PurgeSession: tombstone the id and delete every run and record of the session."""
        ...

    async def start_root_run(
        self, run: RunStart, started: Record, stopped: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        """StartRootRun (also continuations of a root, via `predecessor_run_id`); `records` (the
        run's first ordinary records, such as its context and input) are appended after
        `run_started` when it proceeds, atomically (every start takes them)."""
        ...

    async def start_child_run(
        self,
        run: RunStart,
        parent_link: Record,
        started: Record,
        stopped: Record,
        records: Sequence[Record] = (),
    ) -> StartResult:
        """StartChildRun: a session child, linked on its parent."""
        ...

    async def start_one_shot_run(
        self, run: RunStart, started: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        """StartOneShotRun: a sessionless root that always proceeds."""
        ...

    async def start_one_shot_child_run(
        self, run: RunStart, parent_link: Record, started: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        """StartOneShotChildRun: a sessionless child of a sessionless parent."""
        ...

    async def append_run_record(self, record: Record) -> AppendResult:
        """AppendRunRecord: an ordinary (non-lifecycle) record."""
        ...

    async def append_run_records(
        self, records: Sequence[Record], *, follows: LogBasis | None = None
    ) -> list[AppendResult]:
        """AppendRunRecords: ordinary records of one run (one step), appended in order, atomically;
        with `follows`, only while the run's log is still exactly that (else RUN_LOG_MOVED)."""
        ...

    async def record_run_cancellation(self, record: Record) -> AppendResult:
        """RecordRunCancellation: the first reason is permanent."""
        ...

    async def record_run_suspension(self, checkpoint: Checkpoint, record: Record) -> AppendResult:
        """RecordRunSuspension: store the checkpoint and suspend the run."""
        ...

    async def record_run_terminal(self, record: Record, records: Sequence[Record] = ()) -> AppendResult:
        """RecordRunTerminal: close the run as completed, failed or canceled; `records` (ordinary
        records of the closing step, such as the final answer) are appended before it, atomically."""
        ...

    async def load_run(self, run_id: str) -> RunMeta:
        """LoadRun."""
        ...

    async def load_run_suspension(self, run_id: str) -> Checkpoint:
        """LoadRunSuspension: the checkpoint, kept after a successor is admitted."""
        ...

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Page:
        """ListRunRecords: per-run order, opaque cursor, limit capped at 500."""
        ...

    async def list_session_run_records(self, session_id: str, cursor: str, limit: int) -> Page:
        """ListSessionRunRecords: session commit order across runs."""
        ...

    async def list_runs_by_session(self, session_id: str, statuses: list[RunStatus]) -> list[RunMeta]:
        """ListRunsBySession: runs in start order; an empty filter means all."""
        ...
