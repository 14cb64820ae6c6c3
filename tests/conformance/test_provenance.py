"""Cancellation provenance (§9, §12 "Cancellation provenance: the three combinations and every
conflict row"), plus the provenance step of RecordRunTerminal and RecordRunSuspension."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import decode_cancellation_intent, decode_run_completed
from quipu.contracts.store import CancellationReason, LifecycleType, Record, RunStart, RunStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    all_run_records,
    changed,
    intent,
    ms,
    refused,
    session_with_root,
    snapshot,
    stopped_root,
    suspension,
    terminal,
)

USER = CancellationReason.USER_REQUESTED
SESSION = CancellationReason.SESSION_ENDED
ENGINE = CancellationReason.ENGINE_CANCELED


def _of_type(records: list[Record], record_type: LifecycleType) -> list[Record]:
    return [record for record in records if record.type == record_type.value]


# --- the three valid combinations -----------------------------------------------------------------


@pytest.mark.parametrize("reason", [USER, SESSION, ENGINE], ids=lambda r: r.value)
async def test_explicit_cancellation_then_canceled_with_the_same_reason(
    store: Store, reason: CancellationReason
) -> None:
    _, run = await session_with_root(store)
    await store.record_run_cancellation(intent(run, reason))
    result = await store.record_run_terminal(terminal(run, RunStatus.CANCELED, reason=reason))
    assert result.inserted is True

    meta = await store.load_run(run.run_id)
    assert meta.status is RunStatus.CANCELED
    assert meta.cancellation_reason == reason.value
    records = await all_run_records(store, run.run_id)
    [intent_record] = _of_type(records, LifecycleType.CANCELLATION_INTENT)
    assert decode_cancellation_intent(intent_record.payload).reason == reason.value
    [completed] = _of_type(records, LifecycleType.RUN_COMPLETED)
    assert decode_run_completed(completed.payload).cancellation_reason == reason.value


async def test_start_under_an_ended_session(store: Store) -> None:
    command = await stopped_root(store)
    meta = await store.load_run(command.run.run_id)
    assert meta.status is RunStatus.CANCELED
    assert meta.cancellation_reason == SESSION.value
    records = await all_run_records(store, command.run.run_id)
    assert _of_type(records, LifecycleType.CANCELLATION_INTENT) == []
    [completed] = _of_type(records, LifecycleType.RUN_COMPLETED)
    assert decode_run_completed(completed.payload).cancellation_reason == SESSION.value


async def test_engine_cancels_without_a_recorded_request(store: Store) -> None:
    _, run = await session_with_root(store)
    await store.record_run_terminal(terminal(run, RunStatus.CANCELED, reason=ENGINE))
    meta = await store.load_run(run.run_id)
    assert meta.status is RunStatus.CANCELED
    assert meta.cancellation_reason == ""  # meaningful, not missing
    records = await all_run_records(store, run.run_id)
    assert _of_type(records, LifecycleType.CANCELLATION_INTENT) == []
    [completed] = _of_type(records, LifecycleType.RUN_COMPLETED)
    assert decode_run_completed(completed.payload).cancellation_reason == ENGINE.value


# --- the conflict table ---------------------------------------------------------------------------

Attempt = Callable[[Store, RunStart], Awaitable[object]]


def _cancel(reason: CancellationReason, key: str = "cancel", **changes: object) -> Attempt:
    def attempt(store: Store, run: RunStart) -> Awaitable[object]:
        record = intent(run, reason, key)
        return store.record_run_cancellation(changed(record, **changes) if changes else record)

    return attempt


def _terminal(status: RunStatus, reason: CancellationReason | None = None) -> Attempt:
    def attempt(store: Store, run: RunStart) -> Awaitable[object]:
        return store.record_run_terminal(terminal(run, status, reason=reason))

    return attempt


def _suspend(store: Store, run: RunStart) -> Awaitable[object]:
    return store.record_run_suspension(*suspension(run))


# (stored reason via an explicit intent with key "cancel", attempt, expected error)
CONFLICT_ROWS: dict[str, tuple[Attempt, ErrorCode]] = {
    "second_cancellation_other_reason": (_cancel(ENGINE, "cancel-2"), ErrorCode.RUN_CANCELLATION_CONFLICT),
    # §6.5 step 2 (stored reason differs) precedes step 3 (same key, other content).
    "other_reason_same_key": (_cancel(SESSION, "cancel"), ErrorCode.RUN_CANCELLATION_CONFLICT),
    "same_reason_other_key": (_cancel(USER, "cancel-2"), ErrorCode.RUN_CANCELLATION_CONFLICT),
    "same_key_other_content": (_cancel(USER, "cancel", turn_id="t-2"), ErrorCode.EVENT_CONFLICT),
    "same_key_other_timestamp": (_cancel(USER, "cancel", timestamp=ms(77)), ErrorCode.EVENT_CONFLICT),
    "canceled_terminal_other_reason": (
        _terminal(RunStatus.CANCELED, ENGINE),
        ErrorCode.RUN_CANCELLATION_CONFLICT,
    ),
    "canceled_terminal_session_ended": (
        _terminal(RunStatus.CANCELED, SESSION),
        ErrorCode.RUN_CANCELLATION_CONFLICT,
    ),
    "completed_terminal_after_reason": (
        _terminal(RunStatus.COMPLETED),
        ErrorCode.RUN_CANCELLATION_CONFLICT,
    ),
    "failed_terminal_after_reason": (
        _terminal(RunStatus.FAILED),
        ErrorCode.RUN_CANCELLATION_CONFLICT,
    ),
    "suspension_after_reason": (_suspend, ErrorCode.RUN_CANCELLATION_CONFLICT),
}


@pytest.mark.parametrize("row", list(CONFLICT_ROWS), ids=list(CONFLICT_ROWS))
async def test_conflict_rows_after_a_user_requested_cancellation(store: Store, row: str) -> None:
    session_id, run = await session_with_root(store)
    await store.record_run_cancellation(intent(run, USER, "cancel"))
    attempt, code = CONFLICT_ROWS[row]
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(code, attempt(store, run))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_identical_intent_succeeds_with_the_original_id(store: Store) -> None:
    _, run = await session_with_root(store)
    first = await store.record_run_cancellation(intent(run, USER, "cancel"))
    again = await store.record_run_cancellation(intent(run, USER, "cancel"))
    assert again.record_id == first.record_id
    assert again.inserted is False


@pytest.mark.parametrize("reason", [USER, SESSION], ids=lambda r: r.value)
async def test_canceled_terminal_without_a_stored_reason_requires_engine_canceled(
    store: Store, reason: CancellationReason
) -> None:
    session_id, run = await session_with_root(store)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(
        ErrorCode.RUN_CANCELLATION_CONFLICT,
        store.record_run_terminal(terminal(run, RunStatus.CANCELED, reason=reason)),
    )
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_first_cancellation_on_a_closed_run_with_another_stored_reason(store: Store) -> None:
    _, run = await session_with_root(store)
    await store.record_run_cancellation(intent(run, USER, "cancel"))
    await store.record_run_terminal(terminal(run, RunStatus.CANCELED, reason=USER))
    # Another reason: the stored one wins the argument (RUN_CANCELLATION_CONFLICT)...
    await refused(
        ErrorCode.RUN_CANCELLATION_CONFLICT,
        store.record_run_cancellation(intent(run, ENGINE, "cancel-2")),
    )
    # ...the same reason with another key is a second intent (RUN_CANCELLATION_CONFLICT).
    await refused(
        ErrorCode.RUN_CANCELLATION_CONFLICT,
        store.record_run_cancellation(intent(run, USER, "cancel-2")),
    )


async def test_stored_reason_is_write_once(store: Store) -> None:
    _, run = await session_with_root(store)
    await store.record_run_cancellation(intent(run, USER, "cancel"))
    for reason in (ENGINE, SESSION):
        await refused(
            ErrorCode.RUN_CANCELLATION_CONFLICT,
            store.record_run_cancellation(intent(run, reason, f"cancel-{reason.value}")),
        )
    assert (await store.load_run(run.run_id)).cancellation_reason == USER.value
