"""Builders that let conformance tests read like STORE_CONTRACT.md.

Pure builders make commands with canonical payloads (`quipu.contracts.lifecycle` encoders); the async
steps at the bottom drive a store through the common preparations and read it back. Identifiers
are uuid-based so that tests never collide, even on a shared backend.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.lifecycle import (
    Failure,
    encode_cancellation_intent,
    encode_child_run_linked,
    encode_run_completed,
    encode_run_started,
    encode_run_suspended,
)
from quipu.contracts.store import (
    AppendResult,
    CancellationReason,
    Checkpoint,
    LifecycleType,
    Page,
    Record,
    RunMeta,
    RunStart,
    RunStatus,
    Session,
    SessionStatus,
    StartOutcome,
    StartResult,
)
from quipu.services.domain.store.protocol import Store

T = TypeVar("T")

# --- time and identifiers -------------------------------------------------------------------------

BASE = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)
"""An arbitrary fixed instant; every timestamp of the suite is BASE plus whole milliseconds."""

STATE_CHANGE_GAP = 0.005
"""Seconds to sleep between operations so that a millisecond store clock must move."""


def ms(offset: int = 0) -> datetime:
    """BASE + `offset` milliseconds: UTC, millisecond precision (valid everywhere)."""
    return BASE + timedelta(milliseconds=offset)


def sub_ms(offset: int = 0, microseconds: int = 1) -> datetime:
    """A timestamp with a non-zero sub-millisecond part (INVALID_ARGUMENT everywhere)."""
    return ms(offset) + timedelta(microseconds=microseconds)


def uid(prefix: str) -> str:
    """A unique identifier with a readable prefix."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


ORDINARY_TYPE = "run_phase_changed"
"""A non-lifecycle record type (§11) used for ordinary records."""

CHECKPOINT_BYTES = b"\x00\xff\xfe\x80checkpoint\xc3\x28\xed\xa0\x80\n"
"""Checkpoint data that is deliberately not UTF-8 (stray, truncated and surrogate sequences)."""

DEFAULT_FAILURE = Failure(message="tool exploded", kind="tool_error", retryable=False)


# --- start commands -------------------------------------------------------------------------------


class RootStart(NamedTuple):
    """Arguments of `Store.start_root_run`, in order."""

    run: RunStart
    started: Record
    stopped: Record


class ChildStart(NamedTuple):
    """Arguments of `Store.start_child_run`, in order."""

    run: RunStart
    parent_link: Record
    started: Record
    stopped: Record


class OneShotStart(NamedTuple):
    """Arguments of `Store.start_one_shot_run`, in order."""

    run: RunStart
    started: Record


class OneShotChildStart(NamedTuple):
    """Arguments of `Store.start_one_shot_child_run`, in order."""

    run: RunStart
    parent_link: Record
    started: Record


def run_start(
    *,
    run_id: str | None = None,
    agent_id: str = "agent-a",
    session_id: str = "",
    parent_run_id: str = "",
    predecessor_run_id: str = "",
    started_at: datetime | None = None,
    labels: dict[str, str] | None = None,
) -> RunStart:
    """A RunStart with a fresh run id unless one is given."""
    return RunStart(
        run_id=run_id or uid("run"),
        agent_id=agent_id,
        session_id=session_id,
        parent_run_id=parent_run_id,
        predecessor_run_id=predecessor_run_id,
        started_at=started_at or ms(0),
        labels=labels or {},
    )


def started_record(
    run: RunStart, *, key: str = "started", turn_id: str = "", payload: bytes | None = None
) -> Record:
    """The start's `run_started` record: at `started_at`, payload equal to the RunStart."""
    encoded = encode_run_started(run) if payload is None else payload
    return run.record(key, LifecycleType.RUN_STARTED, encoded, turn_id=turn_id)


def stopped_record(
    run: RunStart, *, key: str = "stopped", turn_id: str = "", payload: bytes | None = None
) -> Record:
    """The start's `stopped` alternative: canceled/session_ended at `started_at`, run labels."""
    encoded = (
        encode_run_completed(
            RunStatus.CANCELED, labels=run.labels, cancellation_reason=CancellationReason.SESSION_ENDED.value
        )
        if payload is None
        else payload
    )
    return run.record(key, LifecycleType.RUN_COMPLETED, encoded, turn_id=turn_id)


def link_record(
    child: RunStart,
    *,
    parent_agent_id: str,
    tool_name: str = "delegate",
    tool_call_id: str = "call-1",
    key: str | None = None,
    payload: bytes | None = None,
) -> Record:
    """The `child_run_linked` record written on the child's parent (owned by the parent)."""
    return Record(
        event_key=key or f"link:{child.run_id}",
        run_id=child.parent_run_id,
        agent_id=parent_agent_id,
        session_id=child.session_id,
        type=LifecycleType.CHILD_RUN_LINKED,
        payload=(
            encode_child_run_linked(tool_name, tool_call_id, child.run_id, child.agent_id)
            if payload is None
            else payload
        ),
        timestamp=child.started_at,
    )


def root_start(
    session_id: str,
    *,
    run_id: str | None = None,
    agent_id: str = "agent-a",
    predecessor_run_id: str = "",
    started_at: datetime | None = None,
    labels: dict[str, str] | None = None,
    started_key: str = "started",
    stopped_key: str = "stopped",
    turn_id: str = "",
) -> RootStart:
    """StartRootRun arguments (a continuation when `predecessor_run_id` is set)."""
    run = run_start(
        run_id=run_id,
        agent_id=agent_id,
        session_id=session_id,
        predecessor_run_id=predecessor_run_id,
        started_at=started_at,
        labels=labels,
    )
    return RootStart(
        run,
        started_record(run, key=started_key, turn_id=turn_id),
        stopped_record(run, key=stopped_key, turn_id=turn_id),
    )


def child_start(
    session_id: str,
    parent: RunStart,
    *,
    run_id: str | None = None,
    agent_id: str = "agent-b",
    predecessor_run_id: str = "",
    started_at: datetime | None = None,
    labels: dict[str, str] | None = None,
    tool_name: str = "delegate",
    tool_call_id: str = "call-1",
    link_key: str | None = None,
    link_agent_id: str | None = None,
    started_key: str = "started",
    stopped_key: str = "stopped",
) -> ChildStart:
    """StartChildRun arguments: the child of `parent`, linked by one tool call."""
    run = run_start(
        run_id=run_id,
        agent_id=agent_id,
        session_id=session_id,
        parent_run_id=parent.run_id,
        predecessor_run_id=predecessor_run_id,
        started_at=started_at,
        labels=labels,
    )
    link = link_record(
        run,
        parent_agent_id=parent.agent_id if link_agent_id is None else link_agent_id,
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        key=link_key,
    )
    return ChildStart(run, link, started_record(run, key=started_key), stopped_record(run, key=stopped_key))


def one_shot(
    *,
    run_id: str | None = None,
    agent_id: str = "agent-a",
    started_at: datetime | None = None,
    labels: dict[str, str] | None = None,
    started_key: str = "started",
) -> OneShotStart:
    """StartOneShotRun arguments: a sessionless root."""
    run = run_start(run_id=run_id, agent_id=agent_id, started_at=started_at, labels=labels)
    return OneShotStart(run, started_record(run, key=started_key))


def one_shot_child(
    parent: RunStart,
    *,
    run_id: str | None = None,
    agent_id: str = "agent-b",
    started_at: datetime | None = None,
    labels: dict[str, str] | None = None,
    tool_name: str = "delegate",
    tool_call_id: str = "call-1",
    link_key: str | None = None,
    link_agent_id: str | None = None,
    started_key: str = "started",
) -> OneShotChildStart:
    """StartOneShotChildRun arguments: a sessionless child of a sessionless parent."""
    run = run_start(
        run_id=run_id,
        agent_id=agent_id,
        parent_run_id=parent.run_id,
        started_at=started_at,
        labels=labels,
    )
    link = link_record(
        run,
        parent_agent_id=parent.agent_id if link_agent_id is None else link_agent_id,
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        key=link_key,
    )
    return OneShotChildStart(run, link, started_record(run, key=started_key))


# --- record commands ------------------------------------------------------------------------------


def _record(
    run: RunStart,
    *,
    key: str,
    record_type: str,
    payload: bytes,
    turn_id: str,
    timestamp: datetime | None,
) -> Record:
    at = timestamp or run.started_at + timedelta(milliseconds=1)
    return run.record(key, record_type, payload, turn_id=turn_id, at=at)


def ordinary(
    run: RunStart,
    key: str | None = None,
    *,
    payload: bytes = b'{"phase":"planning"}',
    record_type: str = ORDINARY_TYPE,
    turn_id: str = "",
    timestamp: datetime | None = None,
) -> Record:
    """An ordinary (non-lifecycle) record for AppendRunRecord."""
    return _record(
        run,
        key=key or uid("event"),
        record_type=record_type,
        payload=payload,
        turn_id=turn_id,
        timestamp=timestamp,
    )


def intent(
    run: RunStart,
    reason: CancellationReason = CancellationReason.USER_REQUESTED,
    key: str = "cancel",
    *,
    turn_id: str = "",
    timestamp: datetime | None = None,
    payload: bytes | None = None,
) -> Record:
    """A `runtime.cancellation_intent` record for RecordRunCancellation."""
    return _record(
        run,
        key=key,
        record_type=LifecycleType.CANCELLATION_INTENT,
        payload=encode_cancellation_intent(reason) if payload is None else payload,
        turn_id=turn_id,
        timestamp=timestamp,
    )


def suspension(
    run: RunStart,
    *,
    suspension_id: str = "susp-1",
    data: bytes = CHECKPOINT_BYTES,
    key: str = "suspended",
    version: str = "v1",
    pending_count: int = 1,
    required_tools: Iterable[str] = ("approve_refund",),
    turn_id: str = "",
    timestamp: datetime | None = None,
    payload: bytes | None = None,
) -> tuple[Checkpoint, Record]:
    """RecordRunSuspension arguments: the checkpoint and its `run_suspended` record."""
    record = _record(
        run,
        key=key,
        record_type=LifecycleType.RUN_SUSPENDED,
        payload=(
            encode_run_suspended(suspension_id, version, pending_count, list(required_tools))
            if payload is None
            else payload
        ),
        turn_id=turn_id,
        timestamp=timestamp,
    )
    return Checkpoint(suspension_id=suspension_id, data=data), record


def terminal(
    run: RunStart,
    status: RunStatus = RunStatus.COMPLETED,
    *,
    reason: CancellationReason | None = None,
    failure: Failure | None = None,
    key: str = "terminal",
    labels: dict[str, str] | None = None,
    turn_id: str = "",
    timestamp: datetime | None = None,
    payload: bytes | None = None,
) -> Record:
    """A `run_completed` record for RecordRunTerminal, carrying the run's labels by default."""
    if payload is None:
        if status is RunStatus.FAILED and failure is None:
            failure = DEFAULT_FAILURE
        if status is RunStatus.CANCELED and reason is None:
            raise ValueError("a canceled terminal needs an explicit reason")
        payload = encode_run_completed(
            status,
            labels=run.labels if labels is None else labels,
            failure=failure,
            cancellation_reason=reason.value if reason is not None else "",
        )
    return _record(
        run,
        key=key,
        record_type=LifecycleType.RUN_COMPLETED,
        payload=payload,
        turn_id=turn_id,
        timestamp=timestamp,
    )


def changed(model: Any, **changes: Any) -> Any:
    """A copy of a frozen contract model with some fields changed (re-validated)."""
    return type(model).model_validate({**model.model_dump(), **changes})


# --- assertions -----------------------------------------------------------------------------------


async def refused(code: ErrorCode, operation: Awaitable[object]) -> StoreError:
    """Await `operation`; assert it is refused with exactly `code` (codes, never messages)."""
    with pytest.raises(StoreError) as caught:
        await operation
    assert caught.value.code == code, f"expected {code}, got {caught.value.code}: {caught.value}"
    return caught.value


async def code_of(operation: Awaitable[object]) -> ErrorCode | None:
    """The error code `operation` is refused with, or None when it succeeds."""
    try:
        await operation
    except StoreError as error:
        return error.code
    return None


async def resending(operation: Callable[[], Awaitable[T]], attempts: int = 50, pause: float = 0.002) -> T:
    """Run `operation`, resending the identical command after UNAVAILABLE (§5: the caller's job).

    Contract errors are final and raised at once; racing tests use this so that a store which
    aborts conflicting transactions (UNAVAILABLE) is judged on the answer to the resent command.
    """
    for attempt in range(attempts):
        try:
            return await operation()
        except StoreError as error:
            if error.code is not ErrorCode.UNAVAILABLE or attempt == attempts - 1:
                raise
            await asyncio.sleep(pause * (attempt + 1))
    raise AssertionError("unreachable")


def assert_new(result: AppendResult, session_status: str | None = None) -> None:
    """A write that inserted its record."""
    assert result.inserted is True
    assert result.record_id != ""
    if session_status is not None:
        assert result.session_status == session_status


def same_record(stored: Record, sent: Record) -> bool:
    """Record equality of §3 (never `id`)."""
    return stored.same_content(sent)


# --- async steps ----------------------------------------------------------------------------------


async def open_session(store: Store, session_id: str | None = None) -> str:
    """Create an active session and return its id."""
    session_id = session_id or uid("session")
    session = await store.create_session(session_id, ms(0))
    assert session.status is SessionStatus.ACTIVE
    return session_id


async def ended_session(store: Store) -> str:
    """Create a session and end it."""
    session_id = await open_session(store)
    await store.end_session(session_id, ms(1))
    return session_id


async def start(store: Store, command: tuple[Any, ...]) -> StartResult:
    """Send any start command to the matching Store method."""
    if isinstance(command, RootStart):
        return await store.start_root_run(*command)
    if isinstance(command, ChildStart):
        return await store.start_child_run(*command)
    if isinstance(command, OneShotStart):
        return await store.start_one_shot_run(*command)
    if isinstance(command, OneShotChildStart):
        return await store.start_one_shot_child_run(*command)
    raise TypeError(f"not a start command: {command!r}")


async def proceed(store: Store, command: tuple[Any, ...]) -> RunStart:
    """Start a run that must proceed; return its RunStart."""
    result = await start(store, command)
    assert result.decision is StartOutcome.PROCEED
    assert result.run_status is RunStatus.RUNNING
    run: RunStart = command[0]
    return run


async def running_root(store: Store, session_id: str, **options: Any) -> RunStart:
    """A running root run of the session."""
    return await proceed(store, root_start(session_id, **options))


async def principals_root(store: Store, session_id: str, tenant_id: str, principal_id: str) -> RunStart:
    """A running root run of the session whose texts are the principal's (sealed under their key)."""
    command = root_start(session_id)
    run = command.run.model_copy(update={"tenant_id": tenant_id, "principal_id": principal_id})
    return await proceed(store, RootStart(run, command.started, command.stopped))


async def stopped_root(store: Store) -> RootStart:
    """A root run's start sent in an ended session: it stops (canceled, session_ended)."""
    command = root_start(await ended_session(store))
    await start(store, command)
    return command


async def session_with_root(store: Store, **options: Any) -> tuple[str, RunStart]:
    """An active session and a running root run in it (`options` as for `root_start`)."""
    session_id = await open_session(store)
    return session_id, await running_root(store, session_id, **options)


async def running_child(store: Store, session_id: str, parent: RunStart, **options: Any) -> RunStart:
    """A running child run of `parent`."""
    return await proceed(store, child_start(session_id, parent, **options))


async def running_one_shot(store: Store, **options: Any) -> RunStart:
    """A running sessionless run."""
    return await proceed(store, one_shot(**options))


async def suspend(store: Store, run: RunStart, **options: Any) -> Checkpoint:
    """Suspend a running run; return the stored checkpoint."""
    checkpoint, record = suspension(run, **options)
    assert_new(await store.record_run_suspension(checkpoint, record))
    return checkpoint


async def complete(store: Store, run: RunStart, **options: Any) -> Record:
    """Close a running run as completed; return its terminal record."""
    record = terminal(run, RunStatus.COMPLETED, **options)
    assert_new(await store.record_run_terminal(record))
    return record


CLOSINGS = ["suspended", "completed", "failed", "canceled"]
"""The ways a running run closes (`close_run`)."""


async def close_run(store: Store, run: RunStart, how: str) -> None:
    """Close a running run as `how` says: suspended, completed, failed, or canceled by the engine."""
    if how == "suspended":
        await store.record_run_suspension(*suspension(run))
    elif how == "completed":
        await store.record_run_terminal(terminal(run, RunStatus.COMPLETED))
    elif how == "failed":
        await store.record_run_terminal(terminal(run, RunStatus.FAILED))
    else:
        await store.record_run_terminal(
            terminal(run, RunStatus.CANCELED, reason=CancellationReason.ENGINE_CANCELED)
        )


async def _every_page(read_page: Callable[[str], Awaitable[Page]]) -> list[Record]:
    """The records of every page `read_page(cursor)` returns, from the first to the last."""
    records: list[Record] = []
    cursor = ""
    while True:
        page = await read_page(cursor)
        records.extend(page.records)
        if not page.next_cursor:
            return records
        cursor = page.next_cursor


async def all_run_records(store: Store, run_id: str, limit: int = 500) -> list[Record]:
    """Every record of a run, paging to the end."""
    return await _every_page(lambda cursor: store.list_run_records(run_id, cursor, limit))


async def all_session_records(store: Store, session_id: str, limit: int = 500) -> list[Record]:
    """Every record of a session in commit order, paging to the end."""
    return await _every_page(lambda cursor: store.list_session_run_records(session_id, cursor, limit))


def keys(records: Iterable[Record]) -> list[tuple[str, str]]:
    """(run_id, event_key) of each record, in order."""
    return [(record.run_id, record.event_key) for record in records]


async def _read(operation: Awaitable[Any]) -> Any:
    try:
        value = await operation
    except StoreError as error:
        return ("error", error.code)
    if isinstance(value, list):
        return [item.model_dump() if hasattr(item, "model_dump") else item for item in value]
    return value.model_dump() if hasattr(value, "model_dump") else value


async def snapshot(store: Store, runs: Iterable[str] = (), sessions: Iterable[str] = ()) -> dict[str, Any]:
    """Everything the read operations show about some runs and sessions (errors included).

    Two equal snapshots around a refused operation prove that it wrote nothing observable. The
    reads are sent together: nothing writes while a snapshot is taken, and a remote store's round
    trips then overlap instead of adding up.
    """
    reads: dict[str, Awaitable[Any]] = {}
    for run_id in dict.fromkeys(runs):
        reads[f"run:{run_id}"] = store.load_run(run_id)
        reads[f"records:{run_id}"] = all_run_records(store, run_id)
        reads[f"suspension:{run_id}"] = store.load_run_suspension(run_id)
    for session_id in dict.fromkeys(sessions):
        reads[f"session:{session_id}"] = store.load_session_status(session_id)
        reads[f"session-records:{session_id}"] = all_session_records(store, session_id)
        reads[f"session-runs:{session_id}"] = store.list_runs_by_session(session_id, [])
    values = await asyncio.gather(*(_read(read) for read in reads.values()))
    return dict(zip(reads, values, strict=True))


async def load(store: Store, run_id: str) -> RunMeta:
    """LoadRun (a short alias for readability)."""
    return await store.load_run(run_id)


async def session_of(store: Store, session_id: str) -> Session:
    """LoadSessionStatus (a short alias for readability)."""
    return await store.load_session_status(session_id)
