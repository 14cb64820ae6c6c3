"""What a write inserts taken for new: a step or terminal on an open run inserts its records
without reading their keys first, a start its run without reading it, and every outcome stays the
one a read would give (services/storage_owner/mongo_transaction.py, `likely_absent`).

The unique `(run_id, event_key)` index (the run's `_id`) confirms what the write inserts; what it
does not insert is read before the outcome stands. One that was there fails the first attempt,
and the retry reads. Two MongoStore objects on one database stand for two owner copies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import LogBasis, StartOutcome
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.storage_owner.mongo import TransactionPolicy
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.mongo_transaction import RECORDS, RUNS
from tests.conformance.builders import (
    all_run_records,
    ms,
    open_session,
    ordinary,
    refused,
    root_start,
    session_with_root,
    start,
    suspend,
    terminal,
)
from tests.owner_support import CommandLog, owner_copy

GROUPED = TransactionPolicy(group_max=8)


@pytest.fixture(params=[TransactionPolicy(), GROUPED], ids=["alone", "grouped"])
async def here(
    stack: EmbeddedStack, database: str, request: pytest.FixtureRequest
) -> AsyncIterator[MongoStore]:
    """The owner copy under test, applying each operation alone or in groups."""
    async with owner_copy(stack.mongo_uri, database, request.param) as opened:
        yield opened


async def test_a_new_steps_and_its_terminals_keys_are_not_read(logged: tuple[MongoStore, CommandLog]) -> None:
    store, log = logged
    _, run = await session_with_root(store)
    log.commands.clear()
    [appended] = await store.append_run_records([ordinary(run, "step")])
    closed = await store.record_run_terminal(terminal(run), [ordinary(run, "answer")])
    assert log.finds_of(RECORDS) == []
    assert appended.inserted and closed.inserted
    stored = [record.event_key for record in await all_run_records(store, run.run_id)]
    assert stored[-3:] == ["step", "answer", "terminal"]


async def test_a_redelivered_step_is_answered_as_its_first_delivery(here: MongoStore) -> None:
    _, run = await session_with_root(here)
    step = [ordinary(run, "one"), ordinary(run, "two")]
    first = await here.append_run_records(step)
    again = await here.append_run_records(step)
    assert [result.record_id for result in again] == [result.record_id for result in first]
    assert [result.inserted for result in again] == [False, False]


async def test_a_redelivered_step_behind_its_start_is_a_retry_not_a_moved_log(here: MongoStore) -> None:
    # Taken for new, the step's keys make the redelivery look like a step on a log that moved on:
    # that refusal is given only once the keys were read, and they are there (an exact retry).
    _, run = await session_with_root(here)
    basis = LogBasis.of(await all_run_records(here, run.run_id))
    step = [ordinary(run, "behind")]
    [first] = await here.append_run_records(step, follows=basis)
    [again] = await here.append_run_records(step, follows=basis)
    assert first.inserted and not again.inserted and again.record_id == first.record_id


async def test_a_key_another_copy_wrote_is_still_an_event_conflict(
    here: MongoStore, elsewhere: MongoStore
) -> None:
    _, run = await session_with_root(here)
    await here.append_run_record(ordinary(run, "warm"))  # the run, hinted here
    await elsewhere.append_run_record(ordinary(run, "taken", payload=b'{"phase":"theirs"}'))
    await refused(
        ErrorCode.EVENT_CONFLICT,
        here.append_run_records([ordinary(run, "taken", payload=b'{"phase":"ours"}')]),
    )
    await refused(ErrorCode.EVENT_CONFLICT, here.record_run_terminal(terminal(run, key="taken")))
    keys = [record.event_key for record in await all_run_records(here, run.run_id)]
    assert keys.count("taken") == 1


async def test_a_terminal_another_copy_recorded_is_an_exact_retry(
    here: MongoStore, elsewhere: MongoStore
) -> None:
    _, run = await session_with_root(here)
    await here.append_run_record(ordinary(run, "warm"))
    theirs = await elsewhere.record_run_terminal(terminal(run), [ordinary(run, "answer")])
    ours = await here.record_run_terminal(terminal(run), [ordinary(run, "answer")])
    assert not ours.inserted and ours.record_id == theirs.record_id


async def test_a_new_runs_start_does_not_read_the_run(logged: tuple[MongoStore, CommandLog]) -> None:
    store, log = logged
    session_id = await open_session(store)
    log.commands.clear()
    started = await start(store, root_start(session_id))
    assert log.finds_of(RUNS) == []
    assert started.decision is StartOutcome.PROCEED and started.started.inserted


async def test_a_start_another_copy_applied_is_answered_as_its_retry(
    here: MongoStore, elsewhere: MongoStore
) -> None:
    session_id = await open_session(here)
    command = root_start(session_id)
    theirs = await start(elsewhere, command)
    ours = await start(here, command)
    again = await start(here, command)
    assert theirs.started.inserted and not ours.started.inserted and not again.started.inserted
    assert ours.started.record_id == theirs.started.record_id == again.started.record_id
    assert ours.decision is theirs.decision is StartOutcome.PROCEED
    assert [record.event_key for record in await all_run_records(here, command.run.run_id)] == ["started"]


async def test_a_continuation_retried_is_its_retry_not_a_refusal(
    here: MongoStore, elsewhere: MongoStore
) -> None:
    # Taken for new, the run makes the retry look like a second successor of the suspended run:
    # that refusal is given only once the run was read, and it is there (applied by the other copy,
    # so not hinted here).
    session_id, run = await session_with_root(elsewhere)
    await suspend(elsewhere, run)
    successor = root_start(session_id, predecessor_run_id=run.run_id, started_at=ms(50))
    first = await start(elsewhere, successor)
    again = await start(here, successor)
    assert first.started.inserted and not again.started.inserted
    assert again.started.record_id == first.started.record_id
