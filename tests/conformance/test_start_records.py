"""A start carrying the run's first records (§6.3 "First records"): every kind of start appends them
after `run_started` when the run proceeds, in the same transaction, and never on a stop; an exact
retry carries exactly what the first attempt wrote; the records are checked as a step's."""

from __future__ import annotations

from typing import Any

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import LifecycleType, Record, RunStart, StartOutcome, StartResult
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    ChildStart,
    OneShotChildStart,
    OneShotStart,
    RootStart,
    all_run_records,
    child_start,
    ended_session,
    one_shot,
    one_shot_child,
    open_session,
    ordinary,
    refused,
    root_start,
    running_one_shot,
    same_record,
    session_with_root,
    snapshot,
)

KINDS = ["root", "child", "one-shot", "one-shot child"]


async def _command(store: Store, kind: str) -> tuple[Any, list[str], list[str]]:
    """A start command of `kind`, with the runs and sessions a snapshot around it should show."""
    if kind == "root":
        session_id = await open_session(store)
        command: Any = root_start(session_id)
        return command, [command.run.run_id], [session_id]
    if kind == "child":
        session_id, parent = await session_with_root(store)
        command = child_start(session_id, parent)
        return command, [command.run.run_id, parent.run_id], [session_id]
    if kind == "one-shot":
        command = one_shot()
        return command, [command.run.run_id], []
    parent = await running_one_shot(store)
    command = one_shot_child(parent)
    return command, [command.run.run_id, parent.run_id], []


async def start_with(store: Store, command: Any, records: list[Record]) -> StartResult:
    """Send a start command of any kind carrying `records`."""
    if isinstance(command, RootStart):
        return await store.start_root_run(*command, records)
    if isinstance(command, ChildStart):
        return await store.start_child_run(*command, records)
    if isinstance(command, OneShotStart):
        return await store.start_one_shot_run(*command, records)
    assert isinstance(command, OneShotChildStart)
    return await store.start_one_shot_child_run(*command, records)


def first_records(run: RunStart) -> list[Record]:
    """A run's first records as a planner writes them: its context, then its input."""
    return [ordinary(run, "context"), ordinary(run, "input", payload=b'{"phase":"prompted"}')]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_start_appends_its_records_after_run_started_in_order(store: Store, kind: str) -> None:
    command, _, _ = await _command(store, kind)
    records = first_records(command.run)
    result = await start_with(store, command, records)
    assert result.decision is StartOutcome.PROCEED and result.started.inserted
    stored = await all_run_records(store, command.run.run_id)
    assert [(record.id, record.event_key) for record in stored] == [
        ("1", "started"),
        ("2", "context"),
        ("3", "input"),
    ]
    assert all(same_record(kept, sent) for kept, sent in zip(stored[1:], records, strict=True))


@pytest.mark.parametrize("kind", KINDS)
async def test_an_exact_retry_of_a_start_with_records_returns_the_original_and_writes_nothing(
    store: Store, kind: str
) -> None:
    command, runs, sessions = await _command(store, kind)
    records = first_records(command.run)
    first = await start_with(store, command, records)
    before = await snapshot(store, runs=runs, sessions=sessions)
    again = await start_with(store, command, records)
    assert (again.decision, again.started.record_id, again.started.inserted) == (
        first.decision,
        first.started.record_id,
        False,
    )
    assert await snapshot(store, runs=runs, sessions=sessions) == before


async def test_a_retry_carrying_other_records_is_refused_and_one_carrying_none_is_exact(store: Store) -> None:
    command, runs, sessions = await _command(store, "root")
    records = first_records(command.run)
    await start_with(store, command, records)
    before = await snapshot(store, runs=runs, sessions=sessions)
    other_content = [records[0], ordinary(command.run, "input", payload=b'{"phase":"planning"}')]
    await refused(ErrorCode.EVENT_CONFLICT, start_with(store, command, other_content))
    never_written = [*records, ordinary(command.run, "memory")]
    await refused(ErrorCode.RUN_CONFLICT, start_with(store, command, never_written))
    assert not (await start_with(store, command, [])).started.inserted
    assert await snapshot(store, runs=runs, sessions=sessions) == before


async def test_a_start_that_stops_writes_none_of_its_records_and_its_retry_stops_again(store: Store) -> None:
    command = root_start(await ended_session(store))
    records = first_records(command.run)
    result = await start_with(store, command, records)
    assert result.decision is StartOutcome.STOP
    assert [record.event_key for record in await all_run_records(store, command.run.run_id)] == [
        "started",
        "stopped",
    ]
    again = await start_with(store, command, records)
    assert again.decision is StartOutcome.STOP and not again.started.inserted


INVALID_SHAPES = [
    "lifecycle type",
    "repeated key",
    "the started key",
    "record id set",
    "over the cap",
    "two runs",
]


@pytest.mark.parametrize("shape", INVALID_SHAPES)
async def test_invalid_first_records_are_invalid_argument_and_start_nothing(store: Store, shape: str) -> None:
    command, runs, sessions = await _command(store, "root")
    run = command.run
    other = run.model_copy(update={"run_id": run.run_id + "-other"})
    shapes = {
        "lifecycle type": [ordinary(run, "a", record_type=LifecycleType.RUN_COMPLETED.value)],
        "repeated key": [ordinary(run, "a"), ordinary(run, "a", payload=b'{"x":1}')],
        "the started key": [ordinary(run, "started")],
        "record id set": [ordinary(run, "a").model_copy(update={"id": "7"})],
        "over the cap": [ordinary(run, f"k{index}") for index in range(101)],
        "two runs": [ordinary(run, "a"), ordinary(other, "b")],
    }
    before = await snapshot(store, runs=runs, sessions=sessions)
    await refused(ErrorCode.INVALID_ARGUMENT, start_with(store, command, shapes[shape]))
    assert await snapshot(store, runs=runs, sessions=sessions) == before


async def test_a_first_record_naming_another_agent_is_owner_mismatch_and_starts_nothing(store: Store) -> None:
    command, runs, sessions = await _command(store, "root")
    stranger = ordinary(command.run, "context").model_copy(update={"agent_id": "someone-else"})
    before = await snapshot(store, runs=runs, sessions=sessions)
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, start_with(store, command, [stranger]))
    assert await snapshot(store, runs=runs, sessions=sessions) == before
