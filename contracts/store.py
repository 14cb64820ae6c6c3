"""The runtime store's data model (STORE_CONTRACT §3): sessions, runs, records, results."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from quipu.contracts.wire import Timestamp, WireBytes


class SessionStatus(StrEnum):
    """A session goes from active to ended, one way."""

    ACTIVE = "active"
    ENDED = "ended"


class RunStatus(StrEnum):
    """Status of a run; every status but RUNNING is closed."""

    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def closed(self) -> bool:
        """Closed: anything but running (suspended included)."""
        return self is not RunStatus.RUNNING

    @property
    def final(self) -> bool:
        """Final: completed, failed or canceled."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED)


class StartOutcome(StrEnum):
    """The decision a start took; never changed afterwards."""

    PROCEED = "proceed"
    STOP = "stop"


class CancellationReason(StrEnum):
    """The three accepted cancellation reasons."""

    USER_REQUESTED = "user_requested"
    SESSION_ENDED = "session_ended"
    ENGINE_CANCELED = "engine_canceled"


class LifecycleType(StrEnum):
    """Record types written only by lifecycle operations."""

    RUN_STARTED = "run_started"
    CHILD_RUN_LINKED = "child_run_linked"
    CANCELLATION_INTENT = "runtime.cancellation_intent"
    RUN_SUSPENDED = "run_suspended"
    RUN_COMPLETED = "run_completed"


LIFECYCLE_TYPES = frozenset(t.value for t in LifecycleType)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SessionOwner(_Frozen):
    """Who a session belongs to: the tenant and principal of the credential that created it."""

    tenant_id: str = Field(description="Tenant of the creator (empty: the default tenant).")
    principal_id: str = Field(
        description="The creator; only they (or their tenant's admin) reach the session."
    )


class Session(_Frozen):
    """A conversation container administered by the host."""

    session_id: str = Field(description="Non-empty session identifier, compared byte for byte.")
    status: SessionStatus = Field(description="active until ended; one way.")
    created_at: Timestamp = Field(description="First accepted creation time.")
    ended_at: Timestamp | None = Field(default=None, description="First accepted end time; null until ended.")
    owner: SessionOwner | None = Field(
        default=None,
        exclude_if=lambda owner: owner is None,  # encodes as before the field when there is none
        description="The first creation's owner, never changed; null when created without one (by a worker).",
    )


def _without_empty_person(encoded: dict[str, Any]) -> dict[str, Any]:
    """`encoded` without an empty `tenant_id` or `principal_id` (fields added after the first version)."""
    for name in ("tenant_id", "principal_id"):
        if not encoded.get(name):
            encoded.pop(name, None)
    return encoded


class RunStart(_Frozen):
    """The identity carried by every start; retries repeat it exactly."""

    run_id: str = Field(description="Run identifier (required).")
    agent_id: str = Field(description="Agent that executes the run (required).")
    session_id: str = Field(default="", description="Owning session; empty for one-shot runs.")
    parent_run_id: str = Field(default="", description="Parent run for child starts; empty for roots.")
    predecessor_run_id: str = Field(
        default="", description="Suspended run this one continues (continuations only)."
    )
    started_at: Timestamp = Field(description="Start time from the request, millisecond precision.")
    labels: dict[str, str] = Field(default_factory=dict, description="String labels; absent equals {}.")
    tenant_id: str = Field(
        default="", description="Tenant of the person whose words the run carries (service metadata)."
    )
    principal_id: str = Field(
        default="",
        description=(
            "The person whose words the run carries: the store seals the run's record payloads and "
            "checkpoint under their data key. Set by the planner from the authenticated request; "
            "empty: the session's anonymous principal (else the run's own)."
        ),
    )

    @model_serializer(mode="wrap")
    def _without_empty_principal(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Added fields left out when empty: a start without a principal encodes as it always did.
        return _without_empty_person(handler(self))

    def record(
        self, key: str, record_type: str, payload: bytes, *, turn_id: str = "", at: datetime | None = None
    ) -> Record:
        """A record of this run (its run, agent and session), at `at` or else the run's start."""
        return Record(
            event_key=key,
            run_id=self.run_id,
            agent_id=self.agent_id,
            session_id=self.session_id,
            type=record_type,
            turn_id=turn_id,
            payload=payload,
            timestamp=self.started_at if at is None else at,
        )


class RunMeta(_Frozen):
    """What LoadRun returns: the run's identity and current state."""

    run_id: str = Field(description="Run identifier.")
    agent_id: str = Field(description="Agent that executes the run.")
    session_id: str = Field(description="Owning session; empty for one-shot runs.")
    parent_run_id: str = Field(description="Parent run; empty for roots.")
    started_at: Timestamp = Field(description="Start time from the start command.")
    labels: dict[str, str] = Field(description="Labels from the start.")
    status: RunStatus = Field(description="Current status.")
    start_outcome: StartOutcome = Field(description="The start's decision; never changed.")
    successor_run_id: str = Field(description="The one admitted continuation, or empty.")
    cancellation_reason: str = Field(description="First accepted cancellation reason, or empty.")
    updated_at: Timestamp = Field(description="Store clock at the last state change.")
    tenant_id: str = Field(default="", description="Tenant of the person whose words the run carries.")
    principal_id: str = Field(
        default="",
        description=(
            "The person whose words the run carries, as its start named them (empty: none named); "
            "whoever answers or reads the run for them seals under this person's key."
        ),
    )

    @model_serializer(mode="wrap")
    def _without_empty_principal(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Added fields left out when empty: a run without a principal encodes as it always did.
        return _without_empty_person(handler(self))


ERASED_PAYLOAD = b'{"erased":"principal_forgotten"}'
"""What a record payload or checkpoint reads as once its principal was forgotten (key shredded)."""


def is_erased(payload: bytes) -> bool:
    """Whether a payload read from the store is the erased marker (its principal was forgotten)."""
    return payload == ERASED_PAYLOAD


class Checkpoint(_Frozen):
    """A suspended run's private resume state, stored byte for byte."""

    suspension_id: str = Field(description="Identifier of the suspension (non-empty).")
    data: WireBytes = Field(description="Opaque non-empty checkpoint bytes.")


class Record(_Frozen):
    """An immutable entry in a run's ordered log."""

    id: str = Field(default="", description="Store-assigned per-run sequence; absent in commands.")
    event_key: str = Field(description="Writer-derived key, unique per (run_id, event_key).")
    run_id: str = Field(description="Run the record belongs to.")
    agent_id: str = Field(description="Agent of that run.")
    session_id: str = Field(default="", description="Session of that run; empty when sessionless.")
    type: str = Field(description="Record type; lifecycle types are reserved to lifecycle operations.")
    turn_id: str = Field(default="", description="Optional turn the record belongs to.")
    payload: WireBytes = Field(description="Non-empty JSON bytes, kept and compared as received.")
    timestamp: Timestamp = Field(description="Millisecond-precision time; part of identity.")

    def same_content(self, other: Record) -> bool:
        """Record equality of STORE_CONTRACT §3: every identity field and the payload bytes, never `id`."""
        return (
            self.event_key == other.event_key
            and self.run_id == other.run_id
            and self.agent_id == other.agent_id
            and self.session_id == other.session_id
            and self.turn_id == other.turn_id
            and self.type == other.type
            and self.timestamp == other.timestamp
            and self.payload == other.payload
        )


class LogBasis(_Frozen):
    """The run's whole log a step was decided on (`follows` of AppendRunRecords and
    RecordRunTerminal): the step, or the terminal closing with it, is written only while the run's
    log is still exactly these records, so a step decided before its run's start was answered never
    lands on a log it was not decided on."""

    keys: list[str] = Field(
        min_length=1, max_length=100, description="Event keys of the run's records in log order (ids 1 to n)."
    )
    digest: str = Field(
        pattern="^[0-9a-f]{64}$",
        description="sha256 (hex) over those records' contents in that order (record equality: never `id`).",
    )
    chain: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{64}$",
        description=(
            "The same log as a chain: each record's link is the sha256 (hex) of the previous link "
            "(none before the first record) and the record's content, this the last link. A store "
            "that keeps its runs' chains checks the basis against it without reading the records; "
            "absent (writers before it), the records are read."
        ),
    )

    @classmethod
    def of(cls, records: Sequence[Record]) -> LogBasis:
        """The basis of a log made of `records`, in order."""
        digest, chain = hashlib.sha256(), ""
        for record in records:
            line = _content_line(record)
            digest.update(line)
            chain = _link(chain, line)
        return cls(keys=[record.event_key for record in records], digest=digest.hexdigest(), chain=chain)

    def holds(self, record_count: int, stored: Mapping[str, Record]) -> bool:
        """Whether a run with `record_count` records, of which `stored` are read by key, still has
        exactly this log: as many records, each key at its position with the same content."""
        if record_count != len(self.keys):
            return False
        log = [stored.get(key) for key in self.keys]
        if any(record is None or record.id != str(position) for position, record in enumerate(log, 1)):
            return False
        return _log_digest([record for record in log if record is not None]) == self.digest

    def holds_chained(self, record_count: int, chain: str) -> bool | None:
        """Whether a run with `record_count` records whose log chains to `chain` (`extend_chain`)
        still has exactly this log; None when this basis names no chain (read the records)."""
        if self.chain is None:
            return None
        return record_count == len(self.keys) and chain == self.chain


def extend_chain(chain: str, record: Record) -> str:
    """A log's chain (`LogBasis.chain`; "" for an empty log) once `record` follows it."""
    return _link(chain, _content_line(record))


def _link(chain: str, line: bytes) -> str:
    return hashlib.sha256(chain.encode() + line).hexdigest()


def _content_line(record: Record) -> bytes:
    # A record's JSON holds no raw newline: one record per line.
    return record.model_dump_json(exclude={"id"}).encode() + b"\n"


def _log_digest(records: Sequence[Record]) -> str:
    digest = hashlib.sha256()
    for record in records:
        digest.update(_content_line(record))
    return digest.hexdigest()


class AppendResult(_Frozen):
    """Result of a record write."""

    record_id: str = Field(description="Id of the record (the original one on an exact retry).")
    inserted: bool = Field(description="False on an exact retry: nothing was written.")
    session_status: str = Field(
        description="Session status read in the same transaction: active, ended, or empty when sessionless."
    )

    @property
    def in_ended_session(self) -> bool:
        """Whether the run's session had ended when the write was applied (read in its transaction)."""
        return self.session_status == SessionStatus.ENDED.value


class StartResult(_Frozen):
    """Result of a start: the original decision, the current status and the records' results."""

    decision: StartOutcome = Field(description="The original start outcome.")
    run_status: RunStatus = Field(description="The run's current status.")
    started: AppendResult = Field(description="The run_started record.")
    parent_link: AppendResult | None = Field(default=None, description="child_run_linked on the parent.")
    stopped: AppendResult | None = Field(default=None, description="run_completed when the decision is stop.")


class Page(_Frozen):
    """One page of a record listing."""

    records: list[Record] = Field(description="Records in listing order.")
    next_cursor: str = Field(description="Opaque cursor for the next page; empty when nothing followed.")
