"""A step as one command (§6.4.1, §6.7, §12 "Steps"): AppendRunRecords appends a step's records in
order and atomically, and RecordRunTerminal carries the closing step's records: exact retries
(whole or in part), RUN_NOT_ACTIVE, EVENT_CONFLICT, validation, ownership, and nothing partial."""

from __future__ import annotations

import asyncio

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import CancellationReason, LifecycleType, RunStatus, SessionStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    CLOSINGS,
    all_run_records,
    all_session_records,
    close_run,
    keys,
    load,
    ms,
    ordinary,
    refused,
    running_root,
    same_record,
    session_with_root,
    snapshot,
    terminal,
)


async def test_a_step_is_appended_in_order_with_the_next_ids(store: Store) -> None:
    session_id, run = await session_with_root(store)
    step = [ordinary(run, "context"), ordinary(run, "input"), ordinary(run, "phase-1")]
    results = await store.append_run_records(step)
    assert [result.record_id for result in results] == ["2", "3", "4"]
    assert all(result.inserted for result in results)
    assert {result.session_status for result in results} == {SessionStatus.ACTIVE.value}
    records = await all_run_records(store, run.run_id)
    assert [record.event_key for record in records[1:]] == ["context", "input", "phase-1"]
    assert all(same_record(stored, sent) for stored, sent in zip(records[1:], step, strict=True))
    assert keys(await all_session_records(store, session_id))[1:] == keys(step)


async def test_an_exact_retry_of_a_step_returns_the_original_ids_and_writes_nothing(store: Store) -> None:
    session_id, run = await session_with_root(store)
    step = [ordinary(run, "a"), ordinary(run, "b")]
    first = await store.append_run_records(step)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    again = await store.append_run_records(step)
    assert [result.record_id for result in again] == [result.record_id for result in first]
    assert not any(result.inserted for result in again)
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_step_whose_first_records_are_stored_appends_only_the_rest(store: Store) -> None:
    _, run = await session_with_root(store)
    written = ordinary(run, "a")
    await store.append_run_record(written)
    results = await store.append_run_records([written, ordinary(run, "b")])
    assert [(result.record_id, result.inserted) for result in results] == [("2", False), ("3", True)]
    assert [record.event_key for record in await all_run_records(store, run.run_id)][1:] == ["a", "b"]


async def test_a_key_holding_other_content_refuses_the_whole_step(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.append_run_record(ordinary(run, "b", payload=b'{"phase":"planning"}'))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    step = [ordinary(run, "a"), ordinary(run, "b", payload=b'{"phase":"executing_tools"}')]
    await refused(ErrorCode.EVENT_CONFLICT, store.append_run_records(step))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


@pytest.mark.parametrize("how", CLOSINGS)
async def test_a_step_on_a_closed_run_is_run_not_active_and_its_retry_succeeds(
    store: Store, how: str
) -> None:
    session_id, run = await session_with_root(store)
    step = [ordinary(run, "a"), ordinary(run, "b")]
    first = await store.append_run_records(step)
    await close_run(store, run, how)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.append_run_records([step[0], ordinary(run, "late")]))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before
    again = await store.append_run_records(step)
    assert [result.record_id for result in again] == [result.record_id for result in first]


@pytest.mark.parametrize(
    "shape",
    ["empty", "lifecycle type", "two runs", "repeated key", "over the cap", "record id set"],
)
async def test_an_invalid_step_is_invalid_argument_and_writes_nothing(store: Store, shape: str) -> None:
    session_id, run = await session_with_root(store)
    other = await running_root(store, session_id)
    steps = {
        "empty": [],
        "lifecycle type": [
            ordinary(run, "a"),
            ordinary(run, "b", record_type=LifecycleType.RUN_STARTED.value),
        ],
        "two runs": [ordinary(run, "a"), ordinary(other, "b")],
        "repeated key": [ordinary(run, "a"), ordinary(run, "a", payload=b'{"x":1}')],
        "over the cap": [ordinary(run, f"k{index}") for index in range(101)],
        "record id set": [ordinary(run, "a").model_copy(update={"id": "7"})],
    }
    before = await snapshot(store, runs=[run.run_id, other.run_id], sessions=[session_id])
    await refused(ErrorCode.INVALID_ARGUMENT, store.append_run_records(steps[shape]))
    assert await snapshot(store, runs=[run.run_id, other.run_id], sessions=[session_id]) == before


async def test_a_step_record_naming_another_agent_is_owner_mismatch(store: Store) -> None:
    session_id, run = await session_with_root(store)
    stranger = ordinary(run, "b").model_copy(update={"agent_id": "someone-else"})
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, store.append_run_records([ordinary(run, "a"), stranger]))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_step_of_a_missing_run_is_run_not_found(store: Store) -> None:
    _, run = await session_with_root(store)
    ghost = run.model_copy(update={"run_id": run.run_id + "-ghost"})
    await refused(ErrorCode.RUN_NOT_FOUND, store.append_run_records([ordinary(ghost, "a")]))


async def test_racing_identical_steps_write_it_once(store: Store) -> None:
    _, run = await session_with_root(store)
    step = [ordinary(run, "a"), ordinary(run, "b"), ordinary(run, "c")]
    results = await asyncio.gather(*(store.append_run_records(step) for _ in range(4)))
    assert len({tuple(result.record_id for result in each) for each in results}) == 1
    assert sum(all(result.inserted for result in each) for each in results) == 1
    assert len(await all_run_records(store, run.run_id)) == 4


# --- a terminal carrying the closing step's records -----------------------------------------------


async def test_a_terminal_appends_its_records_before_the_run_completed(store: Store) -> None:
    session_id, run = await session_with_root(store)
    answer = [ordinary(run, "phase-2"), ordinary(run, "answer")]
    result = await store.record_run_terminal(terminal(run), answer)
    assert (result.record_id, result.inserted) == ("4", True)
    records = await all_run_records(store, run.run_id)
    assert [record.event_key for record in records] == ["started", "phase-2", "answer", "terminal"]
    assert (await load(store, run.run_id)).status is RunStatus.COMPLETED
    assert keys(await all_session_records(store, session_id))[1:] == keys([*answer, records[-1]])


async def test_an_exact_retry_of_a_terminal_with_records_returns_the_original(store: Store) -> None:
    session_id, run = await session_with_root(store)
    answer = [ordinary(run, "answer")]
    first = await store.record_run_terminal(terminal(run), answer)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    again = await store.record_run_terminal(terminal(run), answer)
    assert (again.record_id, again.inserted) == (first.record_id, False)
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_terminal_retry_carrying_a_record_never_written_is_run_not_active(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.record_run_terminal(terminal(run), [ordinary(run, "answer")])
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    late = [ordinary(run, "answer"), ordinary(run, "late")]
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.record_run_terminal(terminal(run), late))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_terminal_whose_carried_key_holds_other_content_closes_nothing(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.append_run_record(ordinary(run, "answer", payload=b'{"v":1}'))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    carried = [ordinary(run, "answer", payload=b'{"v":2}')]
    await refused(ErrorCode.EVENT_CONFLICT, store.record_run_terminal(terminal(run), carried))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_terminal_carrying_stored_records_appends_only_the_rest(store: Store) -> None:
    _, run = await session_with_root(store)
    written = ordinary(run, "phase-2")
    await store.append_run_record(written)
    result = await store.record_run_terminal(terminal(run), [written, ordinary(run, "answer")])
    assert result.record_id == "4"
    keys_in_order = [record.event_key for record in await all_run_records(store, run.run_id)]
    assert keys_in_order == ["started", "phase-2", "answer", "terminal"]


@pytest.mark.parametrize("shape", ["terminal's key", "lifecycle type", "other run", "repeated key"])
async def test_invalid_carried_records_are_invalid_argument_and_close_nothing(
    store: Store, shape: str
) -> None:
    session_id, run = await session_with_root(store)
    other = await running_root(store, session_id)
    carried = {
        "terminal's key": [ordinary(run, "terminal")],
        "lifecycle type": [ordinary(run, "x", record_type=LifecycleType.RUN_SUSPENDED.value)],
        "other run": [ordinary(other, "x")],
        "repeated key": [ordinary(run, "x"), ordinary(run, "x", payload=b'{"y":1}')],
    }
    before = await snapshot(store, runs=[run.run_id, other.run_id], sessions=[session_id])
    await refused(ErrorCode.INVALID_ARGUMENT, store.record_run_terminal(terminal(run), carried[shape]))
    assert await snapshot(store, runs=[run.run_id, other.run_id], sessions=[session_id]) == before


async def test_a_terminal_with_records_keeps_the_closing_checks(store: Store) -> None:
    # A refused close (provenance, §9) appends none of the records it carries.
    session_id, run = await session_with_root(store)
    canceled = terminal(run, RunStatus.CANCELED, reason=CancellationReason.USER_REQUESTED, timestamp=ms(5))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(
        ErrorCode.RUN_CANCELLATION_CONFLICT, store.record_run_terminal(canceled, [ordinary(run, "answer")])
    )
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before
