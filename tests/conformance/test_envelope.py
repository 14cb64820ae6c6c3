"""Record envelope (§3, §6.4 record checks; §12 "Envelope rules, millisecond precision, record
equality, lifecycle types refused"), applied to every record-writing operation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import (
    encode_cancellation_intent,
    encode_child_run_linked,
    encode_run_completed,
    encode_run_started,
    encode_run_suspended,
)
from quipu.contracts.store import (
    AppendResult,
    CancellationReason,
    LifecycleType,
    Record,
    RunStart,
    RunStatus,
)
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    all_run_records,
    changed,
    intent,
    ms,
    open_session,
    ordinary,
    refused,
    running_one_shot,
    running_root,
    session_with_root,
    snapshot,
    sub_ms,
    suspension,
    terminal,
    uid,
)

# --- the four record-writing operations, each with a valid record for a running run ---------------

Write = Callable[[Store, Record], Awaitable[AppendResult]]


def _valid_record(operation: str, run: RunStart) -> Record:
    if operation == "append":
        return ordinary(run, "probe")
    if operation == "cancellation":
        return intent(run, CancellationReason.USER_REQUESTED, "probe")
    if operation == "suspension":
        return suspension(run, key="probe")[1]
    return terminal(run, RunStatus.COMPLETED, key="probe")


def _write(operation: str) -> Write:
    async def write(store: Store, record: Record) -> AppendResult:
        if operation == "append":
            return await store.append_run_record(record)
        if operation == "cancellation":
            return await store.record_run_cancellation(record)
        if operation == "suspension":
            checkpoint, _ = suspension(
                RunStart(
                    run_id=record.run_id,
                    agent_id=record.agent_id,
                    session_id=record.session_id,
                    started_at=ms(0),
                )
            )
            return await store.record_run_suspension(checkpoint, record)
        return await store.record_run_terminal(record)

    return write


OPERATIONS = ["append", "cancellation", "suspension", "terminal"]


ENVELOPE_VIOLATIONS: dict[str, Callable[[Record], Record]] = {
    "empty_event_key": lambda r: changed(r, event_key=""),
    "empty_type": lambda r: changed(r, type=""),
    "empty_payload": lambda r: changed(r, payload=b""),
    "sub_millisecond_timestamp": lambda r: changed(r, timestamp=sub_ms(3, 1)),
    "sub_millisecond_timestamp_999us": lambda r: changed(r, timestamp=sub_ms(3, 999)),
    # §3: `id` is assigned by the store and "absent in commands"; read literally, a command
    # carrying one is not a valid envelope.
    "id_in_command": lambda r: changed(r, id="7"),
}


@pytest.mark.parametrize("violation", list(ENVELOPE_VIOLATIONS), ids=list(ENVELOPE_VIOLATIONS))
@pytest.mark.parametrize("operation", OPERATIONS)
async def test_invalid_envelope_is_invalid_argument_and_writes_nothing(
    store: Store, operation: str, violation: str
) -> None:
    session_id, run = await session_with_root(store)
    record = ENVELOPE_VIOLATIONS[violation](_valid_record(operation, run))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.INVALID_ARGUMENT, _write(operation)(store, record))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before
    # The refused command reserved nothing: the same key is still free.
    assert (await _write(operation)(store, _valid_record(operation, run))).inserted is True


OWNER_MISMATCHES: dict[str, Callable[[Record], Record]] = {
    "other_agent": lambda r: changed(r, agent_id="agent-impostor"),
    "other_session": lambda r: changed(r, session_id=uid("session")),
    "no_session": lambda r: changed(r, session_id=""),
}


@pytest.mark.parametrize("mismatch", list(OWNER_MISMATCHES), ids=list(OWNER_MISMATCHES))
@pytest.mark.parametrize("operation", OPERATIONS)
async def test_record_owned_by_another_run_is_record_owner_mismatch(
    store: Store, operation: str, mismatch: str
) -> None:
    session_id, run = await session_with_root(store)
    record = OWNER_MISMATCHES[mismatch](_valid_record(operation, run))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, _write(operation)(store, record))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_sessionless_run_record_naming_a_session_is_record_owner_mismatch(
    store: Store, operation: str
) -> None:
    session_id = await open_session(store)
    run = await running_one_shot(store)
    record = changed(_valid_record(operation, run), session_id=session_id)
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, _write(operation)(store, record))
    assert len(await all_run_records(store, run.run_id)) == 1


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_record_of_a_missing_run_is_run_not_found(store: Store, operation: str) -> None:
    session_id = await open_session(store)
    ghost = RunStart(run_id=uid("ghost"), agent_id="agent-a", session_id=session_id, started_at=ms(0))
    await refused(ErrorCode.RUN_NOT_FOUND, _write(operation)(store, _valid_record(operation, ghost)))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(ghost.run_id))


# --- lifecycle types are refused by AppendRunRecord -----------------------------------------------


def _lifecycle_payload(record_type: LifecycleType, run: RunStart) -> bytes:
    """A payload that would be valid for the type, so only the type is wrong."""
    return {
        LifecycleType.RUN_STARTED: encode_run_started(run),
        LifecycleType.CHILD_RUN_LINKED: encode_child_run_linked("t", "c", "child", "agent-b"),
        LifecycleType.CANCELLATION_INTENT: encode_cancellation_intent(CancellationReason.USER_REQUESTED),
        LifecycleType.RUN_SUSPENDED: encode_run_suspended("s", "v1", 0, []),
        LifecycleType.RUN_COMPLETED: encode_run_completed(RunStatus.COMPLETED),
    }[record_type]


@pytest.mark.parametrize("record_type", list(LifecycleType), ids=[t.value for t in LifecycleType])
async def test_append_run_record_refuses_lifecycle_types(store: Store, record_type: LifecycleType) -> None:
    session_id, run = await session_with_root(store)
    record = ordinary(
        run, "sneaky", record_type=record_type.value, payload=_lifecycle_payload(record_type, run)
    )
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.INVALID_ARGUMENT, store.append_run_record(record))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


@pytest.mark.parametrize(
    ("operation", "wrong_type"),
    [
        ("cancellation", LifecycleType.RUN_COMPLETED),
        ("cancellation", "user.cancel"),
        ("suspension", LifecycleType.RUN_COMPLETED),
        ("suspension", "run_paused"),
        ("terminal", LifecycleType.RUN_SUSPENDED),
        ("terminal", "run_finished"),
    ],
)
async def test_lifecycle_operation_with_another_type_is_invalid_argument(
    store: Store, operation: str, wrong_type: str
) -> None:
    session_id, run = await session_with_root(store)
    record = changed(_valid_record(operation, run), type=str(wrong_type))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.INVALID_ARGUMENT, _write(operation)(store, record))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


# --- record equality and stored values ------------------------------------------------------------

EQUALITY_FIELDS: dict[str, Callable[[Record], Record]] = {
    "turn_id": lambda r: changed(r, turn_id="turn-2"),
    "type": lambda r: changed(r, type="tool_start"),
    "timestamp": lambda r: changed(r, timestamp=ms(2)),
    "payload_bytes": lambda r: changed(r, payload=b'{"phase": "planning"}'),
}


@pytest.mark.parametrize("field", list(EQUALITY_FIELDS), ids=list(EQUALITY_FIELDS))
async def test_every_field_of_record_equality_counts(store: Store, field: str) -> None:
    _, run = await session_with_root(store)
    original = ordinary(run, "step-1", turn_id="turn-1", timestamp=ms(1))
    first = await store.append_run_record(original)
    assert (await store.append_run_record(original)).record_id == first.record_id
    await refused(ErrorCode.EVENT_CONFLICT, store.append_run_record(EQUALITY_FIELDS[field](original)))
    assert len(await all_run_records(store, run.run_id)) == 2


async def test_records_are_stored_as_received(store: Store) -> None:
    _, run = await session_with_root(store)
    # Ordinary payloads are not parsed: a duplicate key and odd spacing survive byte for byte.
    payload = '{ "a":1,"a" :2, "é":"\u00e9" }\n'.encode()
    record = ordinary(run, "raw", payload=payload, turn_id="turn-7", timestamp=ms(123))
    result = await store.append_run_record(record)
    stored = (await all_run_records(store, run.run_id))[-1]
    assert stored.id == result.record_id
    assert stored.same_content(record)
    assert stored.payload == payload
    assert stored.timestamp == ms(123)
    assert stored.timestamp.microsecond == 123_000


async def test_record_ids_are_a_decimal_per_run_sequence(store: Store) -> None:
    session_id, first = await session_with_root(store)
    second = await running_root(store, session_id)
    ids = [(await store.append_run_record(ordinary(first))).record_id for _ in range(3)]
    assert ids == ["2", "3", "4"]
    assert (await store.append_run_record(ordinary(second))).record_id == "2"
    assert [r.id for r in await all_run_records(store, first.run_id)] == ["1", "2", "3", "4"]


async def test_the_same_event_key_may_be_used_by_different_runs(store: Store) -> None:
    session_id, first = await session_with_root(store)
    second = await running_root(store, session_id)
    assert (await store.append_run_record(ordinary(first, "shared"))).inserted is True
    assert (await store.append_run_record(ordinary(second, "shared"))).inserted is True
