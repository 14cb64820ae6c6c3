"""The `Store` protocol: one interface, three implementations (memory, MongoDB, Kafka client).

Besides the contract's operations, a store names what it can do beyond them (its capabilities):
a direct store (in memory, MongoDB) applies each call as it is made and has none; the storage
owner's Kafka client has all three (`pipeline`, `outbox`, `owner_memory`). Callers ask the
capability, never the store's class.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypeVar

from quipu.contracts.commands import DispatchedCall
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

if TYPE_CHECKING:
    from quipu.services.domain.memory.protocol import MemoryStore

T = TypeVar("T")


class Pipeline(Protocol):
    """A store's way to have a call under way without awaiting its answer, in order per key."""

    async def sent(self, operation: Awaitable[T]) -> asyncio.Task[T]:
        """`operation` (one call of this store) under way: returns once it is sent, or once it
        ended without being sent (its error is then the task's). A call made after this returns
        is applied after it when the two concern the same run."""
        ...


class Outbox(Protocol):
    """A store whose step command carries the tool calls it justifies and publishes them itself."""

    async def append_run_records(
        self,
        records: Sequence[Record],
        calls: Sequence[DispatchedCall] = (),
        *,
        follows: LogBasis | None = None,
    ) -> list[AppendResult]:
        """AppendRunRecords with `calls`, published by the store once the records commit (again
        on an exact retry), never on a refusal or in an ended session."""
        ...


class Store(Protocol):
    """The runtime store contract (STORE_CONTRACT §6). Every method raises `StoreError` on refusal.

    Capabilities (None for a direct store, whose every call is its write):
    - `pipeline`: calls can be sent without awaiting their answers and are applied in the order
      sent for one run (the owner's client: one partition per run key), so a planner may send a
      run's start and its first step back to back.
    - `outbox`: a step's command carries its tool calls and the store publishes them once the
      step commits; without it the caller publishes them after the append returns.
    - `owner_memory`: the memory store of the storage owner this client reaches, over the same
      transport; a direct store keeps no memory of its own.
    """

    @property
    def pipeline(self) -> Pipeline | None:
        """How to send a call without awaiting its answer, keeping per-run order; None when the
        store applies each call before it returns."""
        ...

    @property
    def outbox(self) -> Outbox | None:
        """The step append that publishes the step's tool calls itself; None when the caller must."""
        ...

    @property
    def owner_memory(self) -> MemoryStore | None:
        """The storage owner's memory store, reached through this client; None for a direct store."""
        ...

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

    async def record_run_terminal(
        self, record: Record, records: Sequence[Record] = (), *, follows: LogBasis | None = None
    ) -> AppendResult:
        """RecordRunTerminal: close the run as completed, failed or canceled; `records` (ordinary
        records of the closing step, such as the final answer) are appended before it, atomically;
        with `follows`, only while the run's log is still exactly that (else RUN_LOG_MOVED)."""
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
