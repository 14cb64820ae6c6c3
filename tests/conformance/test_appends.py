"""AppendRunRecord (§6.4, §12 "Appends"): exact retry (also after close), RUN_NOT_ACTIVE,
EVENT_CONFLICT, session_status, and appends never touching `updated_at`."""

from __future__ import annotations

import asyncio

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import SessionStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    CLOSINGS,
    STATE_CHANGE_GAP,
    all_run_records,
    changed,
    child_start,
    close_run,
    ms,
    ordinary,
    proceed,
    refused,
    running_one_shot,
    same_record,
    session_with_root,
    snapshot,
    stopped_root,
)


async def test_append_writes_the_next_record(store: Store) -> None:
    _, run = await session_with_root(store)
    record = ordinary(run, "phase-1", turn_id="turn-1")
    result = await store.append_run_record(record)
    assert result.inserted is True
    assert result.record_id == "2"
    assert result.session_status == SessionStatus.ACTIVE.value
    records = await all_run_records(store, run.run_id)
    assert len(records) == 2
    assert records[1].id == "2"
    assert same_record(records[1], record)


async def test_exact_retry_returns_the_original_id_and_writes_nothing(store: Store) -> None:
    _, run = await session_with_root(store)
    record = ordinary(run, "phase-1")
    first = await store.append_run_record(record)
    await store.append_run_record(ordinary(run, "phase-2"))
    again = await store.append_run_record(record)
    assert again.record_id == first.record_id
    assert again.inserted is False
    assert again.session_status == SessionStatus.ACTIVE.value
    assert len(await all_run_records(store, run.run_id)) == 3


@pytest.mark.parametrize("how", CLOSINGS)
async def test_exact_retry_after_the_run_closed_succeeds(store: Store, how: str) -> None:
    _, run = await session_with_root(store)
    record = ordinary(run, "phase-1")
    first = await store.append_run_record(record)
    await close_run(store, run, how)
    again = await store.append_run_record(record)
    assert again.record_id == first.record_id
    assert again.inserted is False


@pytest.mark.parametrize("how", CLOSINGS)
async def test_new_record_on_a_closed_run_is_run_not_active(store: Store, how: str) -> None:
    session_id, run = await session_with_root(store)
    await close_run(store, run, how)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.append_run_record(ordinary(run, "late")))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_new_record_on_a_stop_run_is_run_not_active(store: Store) -> None:
    run = (await stopped_root(store)).run
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.append_run_record(ordinary(run, "plan")))
    assert len(await all_run_records(store, run.run_id)) == 2


async def test_same_key_other_content_is_event_conflict(store: Store) -> None:
    _, run = await session_with_root(store)
    await store.append_run_record(ordinary(run, "phase-1", payload=b'{"phase":"planning"}'))
    await refused(
        ErrorCode.EVENT_CONFLICT,
        store.append_run_record(ordinary(run, "phase-1", payload=b'{"phase":"executing_tools"}')),
    )


async def test_same_key_other_content_on_a_closed_run_is_event_conflict(store: Store) -> None:
    # §6.4: the key check (step 2) comes before the closed-run check (step 3).
    _, run = await session_with_root(store)
    record = ordinary(run, "phase-1")
    await store.append_run_record(record)
    await close_run(store, run, "completed")
    await refused(ErrorCode.EVENT_CONFLICT, store.append_run_record(changed(record, turn_id="t")))


async def test_key_of_a_lifecycle_record_is_event_conflict(store: Store) -> None:
    _, run = await session_with_root(store)
    await refused(ErrorCode.EVENT_CONFLICT, store.append_run_record(ordinary(run, "started")))


async def test_append_after_session_end_reports_ended_also_on_retry(store: Store) -> None:
    # Lead's reading: session_status on an exact retry is the CURRENT session status.
    session_id, run = await session_with_root(store)
    record = ordinary(run, "before-end")
    assert (await store.append_run_record(record)).session_status == SessionStatus.ACTIVE.value
    await store.end_session(session_id, ms(9))
    again = await store.append_run_record(record)
    assert again.inserted is False
    assert again.session_status == SessionStatus.ENDED.value


async def test_sessionless_append_has_an_empty_session_status(store: Store) -> None:
    run = await running_one_shot(store)
    record = ordinary(run, "phase-1")
    result = await store.append_run_record(record)
    assert result.inserted is True
    assert result.session_status == ""
    assert (await store.append_run_record(record)).session_status == ""


async def test_appends_and_retries_keep_updated_at(store: Store) -> None:
    _, run = await session_with_root(store)
    meta = await store.load_run(run.run_id)
    record = ordinary(run, "phase-1")
    await asyncio.sleep(STATE_CHANGE_GAP)
    await store.append_run_record(record)
    await asyncio.sleep(STATE_CHANGE_GAP)
    await store.append_run_record(record)
    await store.append_run_record(ordinary(run, "phase-2"))
    assert await store.load_run(run.run_id) == meta


async def test_appends_to_children_do_not_touch_the_parent(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    child = await proceed(store, child_start(session_id, parent))
    parent_records = await all_run_records(store, parent.run_id)
    await store.append_run_record(ordinary(child, "child-step"))
    assert await all_run_records(store, parent.run_id) == parent_records
