"""RecordRunCancellation (§6.5, §12 "Cancellation ... exact retries, updated_at, conflicts").
The §9 provenance table is in test_provenance.py."""

from __future__ import annotations

import asyncio

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import CancellationReason, RunStatus, SessionStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    CLOSINGS,
    STATE_CHANGE_GAP,
    all_run_records,
    close_run,
    intent,
    ms,
    ordinary,
    refused,
    running_one_shot,
    same_record,
    session_with_root,
    snapshot,
    stopped_root,
    terminal,
)


@pytest.mark.parametrize("reason", list(CancellationReason), ids=[r.value for r in CancellationReason])
async def test_first_cancellation_stores_the_reason_and_the_intent(
    store: Store, reason: CancellationReason
) -> None:
    _, run = await session_with_root(store)
    started = await store.load_run(run.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)

    record = intent(run, reason, "cancel-1")
    result = await store.record_run_cancellation(record)
    assert result.inserted is True
    assert result.session_status == SessionStatus.ACTIVE.value

    meta = await store.load_run(run.run_id)
    assert meta.cancellation_reason == reason.value
    assert meta.status is RunStatus.RUNNING  # a request, not an end
    assert meta.updated_at > started.updated_at
    stored = (await all_run_records(store, run.run_id))[-1]
    assert stored.id == result.record_id
    assert same_record(stored, record)


async def test_exact_retry_returns_the_original_id_and_keeps_updated_at(store: Store) -> None:
    _, run = await session_with_root(store)
    record = intent(run)
    first = await store.record_run_cancellation(record)
    meta = await store.load_run(run.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)
    again = await store.record_run_cancellation(record)
    assert again.record_id == first.record_id
    assert again.inserted is False
    assert await store.load_run(run.run_id) == meta
    assert len(await all_run_records(store, run.run_id)) == 2


async def test_exact_retry_after_the_run_was_canceled(store: Store) -> None:
    session_id, run = await session_with_root(store)
    record = intent(run, CancellationReason.USER_REQUESTED)
    first = await store.record_run_cancellation(record)
    await store.record_run_terminal(
        terminal(run, RunStatus.CANCELED, reason=CancellationReason.USER_REQUESTED)
    )
    await store.end_session(session_id, ms(10))
    again = await store.record_run_cancellation(record)
    assert again.record_id == first.record_id
    assert again.inserted is False
    assert again.session_status == SessionStatus.ENDED.value  # the current status


async def test_running_run_keeps_writing_after_a_cancellation_request(store: Store) -> None:
    _, run = await session_with_root(store)
    await store.record_run_cancellation(intent(run))
    assert (await store.append_run_record(ordinary(run, "wrap-up"))).inserted is True


async def test_intent_key_used_by_another_record_is_event_conflict(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.append_run_record(ordinary(run, "cancel"))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.EVENT_CONFLICT, store.record_run_cancellation(intent(run, key="cancel")))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


@pytest.mark.parametrize("how", CLOSINGS)
async def test_first_cancellation_on_a_closed_run_is_run_not_active(store: Store, how: str) -> None:
    session_id, run = await session_with_root(store)
    await close_run(store, run, how)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.record_run_cancellation(intent(run)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before
    assert (await store.load_run(run.run_id)).cancellation_reason == ""


async def test_cancellation_of_a_sessionless_run(store: Store) -> None:
    run = await running_one_shot(store)
    result = await store.record_run_cancellation(intent(run))
    assert result.inserted is True
    assert result.session_status == ""
    assert (await store.load_run(run.run_id)).cancellation_reason == "user_requested"


async def test_cancellation_of_a_stop_run(store: Store) -> None:
    # A stop run is closed with reason session_ended stored and no intent key (§6.3, §9).
    command = await stopped_root(store)
    same_reason = intent(command.run, CancellationReason.SESSION_ENDED)
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.record_run_cancellation(same_reason))
    other_reason = intent(command.run, CancellationReason.USER_REQUESTED)
    await refused(ErrorCode.RUN_CANCELLATION_CONFLICT, store.record_run_cancellation(other_reason))
    assert len(await all_run_records(store, command.run.run_id)) == 2
