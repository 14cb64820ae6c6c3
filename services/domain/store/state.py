"""Durable state behind the store contract, shared by every backend that applies the rules.

`RunState` is RunMeta plus the hidden bookkeeping of STORE_CONTRACT §3; `SessionState` is a
Session plus its sequences. Both carry a `revision` so a backend can make each save conditional
on what it read (optimistic concurrency) — a racing writer then retries the whole operation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.store import (
    Checkpoint,
    Record,
    RunMeta,
    RunStatus,
    Session,
    SessionStatus,
    StartOutcome,
)
from quipu.contracts.wire import Timestamp

T = TypeVar("T")


class StoredStart(BaseModel):
    """The start's records as received (the unwritten `stopped` alternative included) and their ids."""

    model_config = ConfigDict(frozen=True)

    started: Record = Field(description="The run_started record.")
    stopped: Record | None = Field(default=None, description="The run_completed alternative.")
    parent_link: Record | None = Field(default=None, description="child_run_linked on the parent.")
    started_id: str = Field(description="Id given to run_started.")
    stopped_id: str = Field(default="", description="Id given to run_completed when the start stopped.")
    parent_link_id: str = Field(default="", description="Id of child_run_linked on the parent.")


class RunState(BaseModel):
    """Everything the store keeps about one run."""

    model_config = ConfigDict(frozen=True)

    run_id: str = Field(description="Run identifier.")
    agent_id: str = Field(description="Agent of the run.")
    session_id: str = Field(description="Session; empty when sessionless.")
    parent_run_id: str = Field(description="Parent run; empty for roots.")
    predecessor_run_id: str = Field(description="Continued run; empty otherwise (not in RunMeta).")
    started_at: Timestamp = Field(description="Start time from the command.")
    labels: dict[str, str] = Field(description="Labels from the start.")
    tenant_id: str = Field(default="", description="Tenant of the run's principal, from the start.")
    principal_id: str = Field(default="", description="Whose key seals the run's texts, from the start.")
    status: RunStatus = Field(description="Current status.")
    start_outcome: StartOutcome = Field(description="The start's decision.")
    successor_run_id: str = Field(default="", description="Admitted continuation, once.")
    cancellation_reason: str = Field(default="", description="First accepted reason.")
    updated_at: Timestamp = Field(description="Store clock at the last state change.")
    start: StoredStart = Field(description="The start's records and ids.")
    cancellation_key: str = Field(default="", description="Key of the cancellation intent.")
    suspension_key: str = Field(default="", description="Key of run_suspended.")
    terminal_key: str = Field(default="", description="Key of the closing record.")
    checkpoint: Checkpoint | None = Field(default=None, description="Suspension checkpoint.")
    record_count: int = Field(default=0, description="Last per-run sequence given.")
    log_chain: str | None = Field(
        default=None,
        description="The log's chain (`LogBasis.chain`) over its records; None: started before chains.",
    )
    start_order: int = Field(default=0, description="Position among the session's starts.")
    revision: int = Field(default=0, description="Bumped on every save; guards concurrent writers.")

    def meta(self) -> RunMeta:
        """The public view of this run."""
        return RunMeta(
            run_id=self.run_id,
            agent_id=self.agent_id,
            session_id=self.session_id,
            parent_run_id=self.parent_run_id,
            started_at=self.started_at,
            labels=self.labels,
            status=self.status,
            start_outcome=self.start_outcome,
            successor_run_id=self.successor_run_id,
            cancellation_reason=self.cancellation_reason,
            updated_at=self.updated_at,
            tenant_id=self.tenant_id,
            principal_id=self.principal_id,
        )


class SessionState(BaseModel):
    """A session and its sequences."""

    model_config = ConfigDict(frozen=True)

    session: Session = Field(description="The public session.")
    record_count: int = Field(default=0, description="Last per-session record sequence given.")
    run_count: int = Field(default=0, description="Number of runs started in the session.")
    revision: int = Field(default=0, description="Bumped on every save; guards concurrent writers.")

    @property
    def status(self) -> SessionStatus:
        """The session's status."""
        return self.session.status


class StoreTransaction(Protocol):
    """What the rules need from a backend inside one atomic unit."""

    async def is_tombstoned(self, session_id: str) -> bool:
        """Whether the session id was purged."""
        ...

    async def load_session(self, session_id: str) -> SessionState | None:
        """The session, or None."""
        ...

    async def save_session(self, state: SessionState) -> None:
        """Insert (revision 1) or replace the session written at `revision - 1`."""
        ...

    async def load_run(self, run_id: str, *, likely_absent: bool = False) -> RunState | None:
        """The run, or None. `likely_absent`: the operation inserts the run when it is absent and
        expects it to be (a start); a backend may answer None unread, as `load_records` may."""
        ...

    async def save_run(self, state: RunState) -> None:
        """Insert (revision 1) or replace the run written at `revision - 1`."""
        ...

    async def load_record(self, run_id: str, event_key: str) -> Record | None:
        """The record with this key on this run, or None."""
        ...

    async def log_chain(self, run: RunState) -> str | None:
        """`run.log_chain` when every record of the run's log still reads as it was written, so the
        chain stands for the log; None otherwise (a backend whose texts were erased since, or
        that cannot tell: the rules then read the records)."""
        ...

    async def load_records(
        self, run_id: str, event_keys: list[str], *, likely_absent: Collection[str] = ()
    ) -> dict[str, Record]:
        """The run's records with these keys, by key (a missing key is absent), in one read.

        `likely_absent`: keys among `event_keys` that the operation writes when they are absent
        and that are expected to be (a new step's own). A backend may answer them absent without
        reading them, provided it confirms that before the operation's outcome stands: by its own
        insert of the key (a unique index), or else by a read, failing the attempt as a write race
        when one is there; the retry reads them."""
        ...

    async def insert_records(self, rows: list[tuple[RunState, Record, int]]) -> None:
        """Insert each (run, record, session sequence) in order, in one write where the backend
        can: a record of `run` whose `id` is its per-run sequence (session sequence 0 when
        sessionless); `run` is the record's run as this operation sees it, maybe not saved yet."""
        ...

    async def list_records(self, run_id: str, after: int, limit: int) -> list[Record]:
        """Up to `limit` records of the run with sequence > after, in order."""
        ...

    async def list_session_records(self, session_id: str, after: int, limit: int) -> list[tuple[int, Record]]:
        """Up to `limit` (session sequence, record) pairs with sequence > after, in order."""
        ...

    async def list_runs(self, session_id: str) -> list[RunState]:
        """The session's runs in start order."""
        ...

    async def purge(self, session_id: str) -> None:
        """Write the tombstone and delete the session with every run, record and checkpoint."""
        ...


class TransactionRunner(Protocol):
    """Runs one operation atomically, retrying it whole on a transient conflict."""

    async def run(self, operation: Callable[[StoreTransaction], Awaitable[T]]) -> T:
        """Apply `operation` in one transaction and return its result."""
        ...

    async def read(self, operation: Callable[[StoreTransaction], Awaitable[T]]) -> T:
        """Apply a read-only `operation` whose reads need not share one snapshot (a single
        document, or rows only ever appended): a backend may run it outside any transaction."""
        ...
