"""Step 1 of every operation (STORE_CONTRACT §6.1): checks that need no I/O.

Everything here raises INVALID_ARGUMENT, except a start's record owned by another run than its
target, which is RECORD_OWNER_MISMATCH. Nothing here reads or writes state.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from quipu.contracts.errors import ErrorCode, StoreError, invalid
from quipu.contracts.lifecycle import (
    RunCompletedPayload,
    decode_child_run_linked,
    decode_run_completed,
    decode_run_started,
)
from quipu.contracts.store import (
    LIFECYCLE_TYPES,
    CancellationReason,
    LifecycleType,
    Record,
    RunStart,
    RunStatus,
)
from quipu.contracts.wire import has_sub_millisecond

MAX_PAGE = 500
MAX_STEP_RECORDS = 100
"""The most records one AppendRunRecords (or one terminal's carried records) may hold."""


def require_id(name: str, value: str) -> None:
    """Identifiers are non-empty strings; `""` means absent."""
    if not value:
        raise invalid(f"{name} is required")


def require_millisecond(name: str, value: datetime) -> None:
    """A non-zero sub-millisecond part is refused, never truncated."""
    if value.tzinfo is None:
        raise invalid(f"{name} must carry a UTC offset")
    if has_sub_millisecond(value):
        raise invalid(f"{name} has sub-millisecond precision")


def page_limit(limit: int) -> int:
    """`limit` ≤ 0 is refused; above the cap it is capped."""
    if limit <= 0:
        raise invalid("limit must be positive")
    return min(limit, MAX_PAGE)


def check_envelope(record: Record, expected_type: LifecycleType | None = None) -> None:
    """Envelope rules of STORE_CONTRACT §3, and the type an operation requires."""
    if record.id:
        raise invalid("record id is assigned by the store and must be absent")
    require_id("event_key", record.event_key)
    require_id("run_id", record.run_id)
    require_id("agent_id", record.agent_id)
    require_id("type", record.type)
    if not record.payload:
        raise invalid("payload must be non-empty JSON bytes")
    require_millisecond("timestamp", record.timestamp)
    if expected_type is None:
        if record.type in LIFECYCLE_TYPES:
            raise invalid(f"{record.type} is written only by lifecycle operations")
    elif record.type != expected_type.value:
        raise invalid(f"record type must be {expected_type.value}")


def check_step_records(records: list[Record], closing: Record | None = None) -> None:
    """A step's records (AppendRunRecords, or the ones a terminal `closing` carries): 1 to
    MAX_STEP_RECORDS ordinary records of one run, their keys (and the closing one's) pairwise distinct."""
    if not records or len(records) > MAX_STEP_RECORDS:
        raise invalid(f"a step holds 1 to {MAX_STEP_RECORDS} records")
    for record in records:
        check_envelope(record)
    run_id = (closing or records[0]).run_id
    if any(record.run_id != run_id for record in records):
        raise invalid("a step's records belong to one run")
    keys = [record.event_key for record in records] + ([closing.event_key] if closing is not None else [])
    if len(set(keys)) != len(keys):
        raise invalid("a step's record keys must be pairwise distinct")


def _check_start_identity(run: RunStart, *, sessioned: bool, child: bool) -> None:
    require_id("run_id", run.run_id)
    require_id("agent_id", run.agent_id)
    require_millisecond("started_at", run.started_at)
    if sessioned:
        require_id("session_id", run.session_id)
    elif run.session_id or run.predecessor_run_id:
        raise invalid("one-shot runs have no session and no predecessor")
    if child:
        require_id("parent_run_id", run.parent_run_id)
    elif run.parent_run_id:
        raise invalid("root runs have no parent")
    if run.run_id in (run.parent_run_id, run.predecessor_run_id):
        raise invalid("parent and predecessor must differ from the run")


def _check_started(run: RunStart, started: Record) -> None:
    check_envelope(started, LifecycleType.RUN_STARTED)
    if started.timestamp != run.started_at:
        raise invalid("run_started timestamp must equal started_at")
    if not decode_run_started(started.payload).matches(run):
        raise invalid("run_started payload must equal the RunStart")


def _check_stopped(run: RunStart, stopped: Record) -> None:
    check_envelope(stopped, LifecycleType.RUN_COMPLETED)
    if stopped.timestamp != run.started_at:
        raise invalid("stopped run_completed timestamp must equal started_at")
    payload: RunCompletedPayload = decode_run_completed(stopped.payload)
    if (
        payload.run_status is not RunStatus.CANCELED
        or payload.cancellation_reason != CancellationReason.SESSION_ENDED.value
    ):
        raise invalid("stopped must be canceled with reason session_ended")
    if dict(payload.labels) != run.labels:
        raise invalid("stopped labels must equal the run's")


def _check_parent_link(run: RunStart, parent_link: Record) -> None:
    check_envelope(parent_link, LifecycleType.CHILD_RUN_LINKED)
    link = decode_child_run_linked(parent_link.payload)
    if link.child_run_id != run.run_id or link.child_agent_id != run.agent_id:
        raise invalid("child_run_linked must name the child run and agent of the start")


def _check_owner(run: RunStart, record: Record) -> None:
    if (record.run_id, record.agent_id, record.session_id) != (
        run.run_id,
        run.agent_id,
        run.session_id,
    ):
        raise StoreError(ErrorCode.RECORD_OWNER_MISMATCH, f"{record.type} belongs to another run")


def check_start(
    run: RunStart,
    started: Record,
    stopped: Record | None,
    parent_link: Record | None,
    *,
    sessioned: bool,
    records: Sequence[Record] = (),
) -> None:
    """Every start check that needs no I/O; owner mismatches come after all INVALID_ARGUMENT ones.

    `records` (the run's first ordinary records, carried by the start) are checked as a step's.
    """
    _check_start_identity(run, sessioned=sessioned, child=parent_link is not None)
    _check_started(run, started)
    if stopped is not None:
        _check_stopped(run, stopped)
    if parent_link is not None:
        _check_parent_link(run, parent_link)
    if records:
        check_step_records(list(records))
    keys = [record.event_key for record in (started, stopped, parent_link, *records) if record is not None]
    if len(set(keys)) != len(keys):
        raise invalid("the start's record keys must be pairwise distinct")
    for record in (started, stopped, *records):
        if record is not None:
            _check_owner(run, record)
    if parent_link is not None and (parent_link.run_id, parent_link.session_id) != (
        run.parent_run_id,
        run.session_id,
    ):
        raise StoreError(ErrorCode.RECORD_OWNER_MISMATCH, "child_run_linked belongs to another run")
