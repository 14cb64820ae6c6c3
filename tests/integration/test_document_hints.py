"""The owner's document hints: a write starts from the session and run it last committed, and no
answer rests on a hint another owner copy made stale (services/storage_owner/document_hints.py).

Two MongoStore objects on one database stand for two owner copies (their hints are their own).
Each stale case is answered as a store without hints answers it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.store import LogBasis, RunStart, StartOutcome, StartResult
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.storage_owner.document_hints import MAX_HINT_BYTES, DocumentHints
from quipu.services.storage_owner.mongo import TransactionPolicy
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.mongo_transaction import RUNS, SESSIONS
from tests.conformance.builders import (
    all_run_records,
    child_start,
    ms,
    ordinary,
    root_start,
    session_with_root,
    start,
    terminal,
)
from tests.owner_support import CommandLog, client_on, owner_copy

UNHINTED = TransactionPolicy(document_hints=0)


@pytest.fixture
async def unhinted(stack: EmbeddedStack, database: str) -> AsyncIterator[MongoStore]:
    """A copy without hints: every document found (what the answers must equal)."""
    async with owner_copy(stack.mongo_uri, database, UNHINTED) as opened:
        yield opened


async def _finds_of_an_append(stack: EmbeddedStack, database: str, policy: TransactionPolicy) -> list[str]:
    log = CommandLog()
    client = client_on(stack.mongo_uri, event_listeners=[log])
    try:
        store = await MongoStore.open(client, database, policy=policy)
        _, run = await session_with_root(store)
        log.commands.clear()
        await store.append_run_records([ordinary(run, "step-1"), ordinary(run, "step-2")])
        return [str(command["find"]) for name, command in log.commands if name == "find"]
    finally:
        await client.close()


async def test_a_runs_next_write_starts_from_the_session_and_run_its_start_committed(
    stack: EmbeddedStack, database: str
) -> None:
    hinted = await _finds_of_an_append(stack, database, TransactionPolicy())
    found = await _finds_of_an_append(stack, database, UNHINTED)
    assert SESSIONS not in hinted and RUNS not in hinted, hinted
    assert found.count(SESSIONS) == 1 and found.count(RUNS) == 1, found


async def _outcome(operation: Awaitable[Any]) -> object:
    """What an operation came to, comparable across stores: its refusal's code, a start's decision
    and the run's status (a stop writes its record: a second store meets it as a retry), else its
    result."""
    try:
        result = await operation
    except StoreError as error:
        return error.code
    if isinstance(result, StartResult):
        return result.decision, result.run_status
    return result


async def test_an_append_behind_another_copys_append_follows_it(
    here: MongoStore, elsewhere: MongoStore
) -> None:
    _, run = await session_with_root(here)
    theirs = await elsewhere.append_run_record(ordinary(run, "theirs"))
    ours = await here.append_run_record(ordinary(run, "ours"))
    assert int(ours.record_id) == int(theirs.record_id) + 1
    keys = [record.event_key for record in await all_run_records(here, run.run_id)]
    assert keys[-2:] == ["theirs", "ours"]


async def test_a_step_following_the_log_another_copy_extended_is_not_refused(
    here: MongoStore, elsewhere: MongoStore
) -> None:
    # Here the run's hint holds one record fewer than the log the step names: a refusal
    # (RUN_LOG_MOVED) decided on it would be wrong, so it is checked against the database first.
    _, run = await session_with_root(here)
    await here.append_run_record(ordinary(run, "warm"))
    await elsewhere.append_run_record(ordinary(run, "theirs"))
    log = await all_run_records(elsewhere, run.run_id)
    [result] = await here.append_run_records([ordinary(run, "ours")], follows=LogBasis.of(log))
    assert result.inserted and int(result.record_id) == len(log) + 1


Stale = Callable[[MongoStore, str, RunStart], Awaitable[object]]
"""What another copy does to the session or run the hinted copy last wrote."""


async def _closes_the_run(store: MongoStore, session_id: str, run: RunStart) -> object:
    return await store.record_run_terminal(terminal(run))


async def _ends_the_session(store: MongoStore, session_id: str, run: RunStart) -> object:
    await store.record_run_terminal(terminal(run))
    return await store.end_session(session_id, ms(9))


async def _purges_the_session(store: MongoStore, session_id: str, run: RunStart) -> object:
    await _ends_the_session(store, session_id, run)
    await store.purge_session(session_id)
    return None


def _append(store: MongoStore, session_id: str, run: RunStart) -> Awaitable[object]:
    return store.append_run_record(ordinary(run, "after"))


def _close(store: MongoStore, session_id: str, run: RunStart) -> Awaitable[object]:
    return store.record_run_terminal(terminal(run, key="closed-here"))


def _child(store: MongoStore, session_id: str, run: RunStart) -> Awaitable[object]:
    return start(store, child_start(session_id, run, run_id=f"{run.run_id}-child"))


def _next_root(store: MongoStore, session_id: str, run: RunStart) -> Awaitable[object]:
    return start(store, root_start(session_id, run_id=f"{run.run_id}-next", started_at=ms(20)))


@pytest.mark.parametrize(
    ("stale", "then"),
    [
        (_closes_the_run, _append),
        (_closes_the_run, _close),
        (_closes_the_run, _child),
        (_ends_the_session, _append),
        (_ends_the_session, _next_root),
        (_purges_the_session, _append),
        (_purges_the_session, _child),
        (_purges_the_session, _next_root),
    ],
)
async def test_a_write_on_documents_another_copy_moved_is_answered_as_without_hints(
    here: MongoStore,
    elsewhere: MongoStore,
    unhinted: MongoStore,
    stale: Stale,
    then: Callable[[MongoStore, str, RunStart], Awaitable[object]],
) -> None:
    session_id, run = await session_with_root(here)
    await here.append_run_record(ordinary(run, "warm"))  # the run and session, hinted here
    await stale(elsewhere, session_id, run)
    ours = await _outcome(then(here, session_id, run))
    assert isinstance(ours, ErrorCode) or (isinstance(ours, tuple) and ours[0] is StartOutcome.STOP), ours
    # Refused, or stopped, so the store without hints meets the same run and session.
    assert ours == await _outcome(then(unhinted, session_id, run))


def _document(revision: int, **fields: object) -> dict[str, object]:
    return {"_id": "s", "revision": revision, **fields}


def test_hints_keep_the_newest_revision_and_a_tombstone_for_good() -> None:
    hints = DocumentHints(8)
    key = (SESSIONS, "s")
    hints.keep([(key, _document(3))])
    hints.keep([(key, _document(2))])  # a transaction that committed earlier settles later
    assert hints.get(key) == _document(3)
    tombstone: dict[str, object] = {"_id": "s", "tombstone": True}
    hints.keep([(key, tombstone)])
    hints.keep([(key, _document(4))])
    assert hints.get(key) == tombstone
    hints.keep([(key, None)])  # found gone
    assert hints.get(key) is None


def test_a_document_too_large_to_keep_is_not_kept() -> None:
    hints = DocumentHints(8)
    key = (RUNS, "r")
    hints.keep([(key, _document(1))])
    hints.keep([(key, _document(2, checkpoint={"data": b"x" * MAX_HINT_BYTES}))])
    assert hints.get(key) is None  # not even its older version: it moved


def test_hints_hold_at_most_their_size_least_recent_out() -> None:
    hints = DocumentHints(2)
    hints.keep([((RUNS, "a"), _document(1)), ((RUNS, "b"), _document(1))])
    assert hints.get((RUNS, "a")) is not None  # now the most recent
    hints.keep([((RUNS, "c"), _document(1))])
    assert hints.get((RUNS, "b")) is None
    assert hints.get((RUNS, "a")) is not None and hints.get((RUNS, "c")) is not None
