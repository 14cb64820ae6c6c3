"""Group commit on the real database: commands that arrive together share one transaction.

What the conformance suite cannot show (it sees outcomes only): that the commands of different
sessions really were committed as one group, that a command refused by a rule inside a group
neither loses nor changes what the others wrote, and that a group meeting a conflict (or a step
whose own key is taken) is applied again command by command, each exactly once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.store import RunStart
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.storage_owner.mongo import TransactionPolicy
from quipu.services.storage_owner.mongo_store import MongoStore
from tests.conformance.builders import (
    all_run_records,
    all_session_records,
    ordinary,
    session_with_root,
    terminal,
)
from tests.owner_support import client_on

Client = AsyncMongoClient[dict[str, Any]]
GROUP = TransactionPolicy(group_max=16)


@pytest.fixture
async def grouped(stack: EmbeddedStack, database: str) -> AsyncIterator[tuple[MongoStore, Client]]:
    """A grouping store whose client alone is hit by fail points (matched on its appName)."""
    client = client_on(stack.mongo_uri, appname=f"grouped-{uuid.uuid4().hex[:8]}")
    store = await MongoStore.open(client, database, policy=GROUP)
    try:
        yield store, client
    finally:
        await client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        await client.close()


async def _runs(store: MongoStore, count: int) -> list[RunStart]:
    return [(await session_with_root(store))[1] for _ in range(count)]


async def _fail(client: Client, command: str, times: int, **data: Any) -> None:
    """Fail the next `times` of `command` sent by `client` (its appName) as `data` says."""
    app_name = str(client.options.pool_options.metadata["application"]["name"])
    await client.admin.command(
        {
            "configureFailPoint": "failCommand",
            "mode": {"times": times},
            "data": {"failCommands": [command], "appName": app_name, **data},
        }
    )


async def _keys(store: MongoStore, run: RunStart) -> list[str]:
    return [record.event_key for record in await all_run_records(store, run.run_id)]


async def _outcomes(*operations: Awaitable[Any]) -> list[Any]:
    """Every operation started at once (so they queue for one group), each one's result or refusal."""
    results = await asyncio.gather(*operations, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, StoreError):
            raise result
    return results


async def test_appends_of_different_sessions_that_arrive_together_commit_as_one_group(
    grouped: tuple[MongoStore, Client],
) -> None:
    store, _ = grouped
    runs = await _runs(store, 5)
    loop = store.transactions
    groups, grouped_ops, attempts = loop.groups, loop.grouped, loop.attempts

    results = await _outcomes(*(store.append_run_record(ordinary(run, "step")) for run in runs))

    assert [(result.record_id, result.inserted) for result in results] == [("2", True)] * 5
    assert (loop.groups - groups, loop.grouped - grouped_ops, loop.attempts - attempts) == (1, 5, 1)
    for run in runs:
        assert await _keys(store, run) == ["started", "step"]


async def test_a_command_refused_inside_a_group_neither_loses_nor_changes_the_others(
    grouped: tuple[MongoStore, Client],
) -> None:
    store, _ = grouped
    first, closed, second = await _runs(store, 3)
    await store.record_run_terminal(terminal(closed))
    loop = store.transactions
    groups, fallbacks = loop.groups, loop.fallbacks

    results = await _outcomes(
        store.append_run_records([ordinary(first, "a"), ordinary(first, "b")]),
        store.append_run_record(ordinary(closed, "too-late")),  # RUN_NOT_ACTIVE
        store.append_run_record(ordinary(second, "c")),
        store.append_run_record(ordinary(second, "d")),  # the same session again, after "c"
    )

    assert (loop.groups - groups, loop.fallbacks - fallbacks) == (1, 0)
    assert [result.code for result in results if isinstance(result, StoreError)] == [ErrorCode.RUN_NOT_ACTIVE]
    assert [[r.record_id for r in results[0]]] == [["2", "3"]]
    assert [(r.record_id, r.inserted) for r in (results[2], results[3])] == [("2", True), ("3", True)]
    assert [await _keys(store, run) for run in (first, closed, second)] == [
        ["started", "a", "b"],
        ["started", "terminal"],
        ["started", "c", "d"],
    ]
    # Session sequences stay gapless: the refused command took none.
    assert [r.event_key for r in await all_session_records(store, second.session_id)] == ["started", "c", "d"]


async def test_a_step_whose_key_is_taken_costs_its_group_an_attempt_and_changes_nothing_else(
    grouped: tuple[MongoStore, Client],
) -> None:
    # A step on an open run takes its own keys for new (its insert checks them): one that is taken
    # (a redelivery, a conflict) fails the group's insert, and each command is applied alone.
    store, _ = grouped
    first, second, third = await _runs(store, 3)
    await store.append_run_record(ordinary(third, "taken", payload=b'{"phase":"planning"}'))
    redelivered = ordinary(second, "again")
    original = await store.append_run_record(redelivered)
    loop = store.transactions
    groups, fallbacks = loop.groups, loop.fallbacks

    results = await _outcomes(
        store.append_run_record(ordinary(first, "a")),
        store.append_run_record(redelivered),
        store.append_run_record(ordinary(third, "taken", payload=b'{"phase":"other"}')),  # EVENT_CONFLICT
    )

    assert (loop.groups - groups, loop.fallbacks - fallbacks) == (0, 1)
    assert [result.code for result in results if isinstance(result, StoreError)] == [ErrorCode.EVENT_CONFLICT]
    assert (results[0].record_id, results[0].inserted) == ("2", True)
    assert (results[1].record_id, results[1].inserted) == (original.record_id, False)
    assert [await _keys(store, run) for run in (first, second, third)] == [
        ["started", "a"],
        ["started", "again"],
        ["started", "taken"],
    ]
    assert [r.payload for r in await all_run_records(store, third.run_id)][1] == b'{"phase":"planning"}'


async def test_a_group_that_meets_a_write_conflict_is_applied_again_command_by_command(
    grouped: tuple[MongoStore, Client],
) -> None:
    store, client = grouped
    runs = await _runs(store, 4)
    loop = store.transactions
    groups, fallbacks = loop.groups, loop.fallbacks
    # The group's first write meets a write conflict: the group aborts, nothing of it is kept.
    await _fail(client, "bulkWrite", 1, errorCode=112, errorLabels=["TransientTransactionError"])

    results = await _outcomes(*(store.append_run_record(ordinary(run, "step")) for run in runs))

    assert (loop.groups - groups, loop.fallbacks - fallbacks) == (0, 1)
    assert [(result.record_id, result.inserted) for result in results] == [("2", True)] * 4
    for run in runs:
        assert await _keys(store, run) == ["started", "step"]


async def test_a_group_whose_commit_outcome_stays_unknown_is_applied_again_alone_and_nothing_twice(
    grouped: tuple[MongoStore, Client],
) -> None:
    store, client = grouped
    runs = await _runs(store, 3)
    loop = store.transactions
    fallbacks = loop.fallbacks
    # Each try of the group's commit applies, then its reply carries a write concern error.
    await _fail(
        client,
        "commitTransaction",
        TransactionPolicy().commit_attempts,
        writeConcernError={"code": 64, "errmsg": "waiting for replication timed out"},
    )

    results = await _outcomes(*(store.append_run_record(ordinary(run, "step")) for run in runs))

    # Alone, each command finds what the group committed: its own record, written once.
    assert loop.fallbacks - fallbacks == 1
    assert [(result.record_id, result.inserted) for result in results] == [("2", False)] * 3
    for run in runs:
        assert await _keys(store, run) == ["started", "step"]


async def test_a_record_too_large_for_the_database_is_refused_alone_and_its_group_commits_the_rest(
    grouped: tuple[MongoStore, Client],
) -> None:
    store, _ = grouped
    big, small = await _runs(store, 2)
    loop = store.transactions
    fallbacks = loop.fallbacks
    over_the_limit = b'"' + b"x" * (17 * 1024 * 1024) + b'"'  # BSON documents stop at 16 MiB

    results = await _outcomes(
        store.append_run_record(ordinary(big, "big", payload=over_the_limit)),
        store.append_run_record(ordinary(small, "small")),
    )

    assert loop.fallbacks - fallbacks == 1
    assert isinstance(results[0], StoreError) and results[0].code is ErrorCode.INVALID_ARGUMENT
    assert (results[1].record_id, results[1].inserted) == ("2", True)
    assert [await _keys(store, run) for run in (big, small)] == [["started"], ["started", "small"]]
