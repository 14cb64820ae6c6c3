"""PurgeSession and the tombstone (§8; §12 "Purge: preconditions, cascade, tombstone, no
recreation")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import CancellationReason, RunStart, RunStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    all_run_records,
    changed,
    child_start,
    complete,
    ended_session,
    intent,
    ms,
    open_session,
    ordinary,
    proceed,
    refused,
    root_start,
    running_child,
    running_one_shot,
    running_root,
    session_with_root,
    snapshot,
    suspend,
    suspension,
    terminal,
    uid,
)


async def test_purge_of_a_missing_session_is_session_not_found(store: Store) -> None:
    session_id = uid("missing")
    await refused(ErrorCode.SESSION_NOT_FOUND, store.purge_session(session_id))
    # Not a tombstone either: the id can still be created.
    assert (await store.create_session(session_id, ms(0))).session_id == session_id


async def test_purge_of_an_active_session_is_session_active(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await complete(store, run)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.SESSION_ACTIVE, store.purge_session(session_id))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


@pytest.mark.parametrize("which", ["root", "child"])
async def test_purge_with_a_running_run_is_session_has_active_runs(store: Store, which: str) -> None:
    session_id, root = await session_with_root(store)
    child = await running_child(store, session_id, root)
    if which == "child":
        await complete(store, root)
    else:
        await complete(store, child)
    await store.end_session(session_id, ms(9))
    watched = [root.run_id, child.run_id]
    before = await snapshot(store, runs=watched, sessions=[session_id])
    await refused(ErrorCode.SESSION_HAS_ACTIVE_RUNS, store.purge_session(session_id))
    assert await snapshot(store, runs=watched, sessions=[session_id]) == before


async def _session_with_every_kind_of_run(store: Store) -> tuple[str, list[RunStart]]:
    """An ended session holding suspended, final, stop, child and successor runs, none running."""
    session_id, completed = await session_with_root(store)
    child = await running_child(store, session_id, completed)
    await store.append_run_record(ordinary(child, "child-step"))
    await complete(store, child)
    await complete(store, completed)
    failed = await running_root(store, session_id)
    await store.record_run_terminal(terminal(failed, RunStatus.FAILED))
    canceled = await running_root(store, session_id)
    await store.record_run_cancellation(intent(canceled))
    await store.record_run_terminal(
        terminal(canceled, RunStatus.CANCELED, reason=CancellationReason.USER_REQUESTED)
    )
    predecessor = await running_root(store, session_id)
    await suspend(store, predecessor)
    successor = await proceed(
        store, root_start(session_id, predecessor_run_id=predecessor.run_id, started_at=ms(50))
    )
    await suspend(store, successor)
    await store.end_session(session_id, ms(60))
    stopped = root_start(session_id)
    await store.start_root_run(*stopped)
    return session_id, [completed, child, failed, canceled, predecessor, successor, stopped.run]


async def test_suspended_and_final_runs_do_not_block_and_everything_goes(store: Store) -> None:
    session_id, runs = await _session_with_every_kind_of_run(store)
    await store.purge_session(session_id)
    for run in runs:
        await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(run.run_id))
        await refused(ErrorCode.RUN_NOT_FOUND, store.load_run_suspension(run.run_id))
        await refused(ErrorCode.RUN_NOT_FOUND, store.list_run_records(run.run_id, "", 10))


SESSION_OPERATIONS: dict[str, Callable[[Store, str], Awaitable[object]]] = {
    "create_session": lambda store, s: store.create_session(s, ms(0)),
    "end_session": lambda store, s: store.end_session(s, ms(0)),
    "load_session_status": lambda store, s: store.load_session_status(s),
    "list_session_run_records": lambda store, s: store.list_session_run_records(s, "", 10),
    "list_runs_by_session": lambda store, s: store.list_runs_by_session(s, []),
    "start_root_run": lambda store, s: store.start_root_run(*root_start(s)),
}


@pytest.mark.parametrize("operation", list(SESSION_OPERATIONS), ids=list(SESSION_OPERATIONS))
async def test_session_operations_after_purge_are_session_purged(store: Store, operation: str) -> None:
    session_id = await ended_session(store)
    await store.purge_session(session_id)
    await refused(ErrorCode.SESSION_PURGED, SESSION_OPERATIONS[operation](store, session_id))


async def test_purge_is_idempotent(store: Store) -> None:
    session_id, _ = await _session_with_every_kind_of_run(store)
    await store.purge_session(session_id)
    await store.purge_session(session_id)
    await refused(ErrorCode.SESSION_PURGED, store.load_session_status(session_id))


async def test_late_writes_to_purged_runs_are_session_purged_and_recreate_nothing(
    store: Store,
) -> None:
    session_id, parent = await session_with_root(store)
    child_command = child_start(session_id, parent)
    await store.start_child_run(*child_command)
    child = child_command.run
    appended = ordinary(child, "step")
    await store.append_run_record(appended)
    await complete(store, child)
    await suspend(store, parent)
    root_command = root_start(session_id, run_id=parent.run_id, agent_id=parent.agent_id)
    await store.end_session(session_id, ms(5))
    await store.purge_session(session_id)

    late: list[Awaitable[object]] = [
        store.start_root_run(*root_command),  # exact retry of an accepted start
        store.start_child_run(*child_command),  # exact retry of an accepted child start
        store.append_run_record(appended),  # exact retry of an accepted append
        store.append_run_record(ordinary(child, "new-step")),
        store.record_run_cancellation(intent(child)),
        store.record_run_suspension(*suspension(parent)),  # exact retry of the suspension
        store.record_run_terminal(terminal(child)),  # exact retry of the terminal
        store.start_root_run(*root_start(session_id, predecessor_run_id=parent.run_id)),
    ]
    for operation in late:
        await refused(ErrorCode.SESSION_PURGED, operation)
    for run_id in (parent.run_id, child.run_id):
        await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(run_id))
        await refused(ErrorCode.RUN_NOT_FOUND, store.list_run_records(run_id, "", 10))
    await refused(ErrorCode.SESSION_PURGED, store.load_session_status(session_id))


async def test_purge_leaves_sessionless_runs_and_other_sessions_untouched(store: Store) -> None:
    session_id, _ = await _session_with_every_kind_of_run(store)
    other_session = await open_session(store)
    neighbour = await running_root(store, other_session)
    await store.append_run_record(ordinary(neighbour, "still-here"))
    sessionless = await running_one_shot(store)
    await store.append_run_record(ordinary(sessionless, "still-here"))
    finished = await running_one_shot(store)
    await suspend(store, finished)
    watched = [neighbour.run_id, sessionless.run_id, finished.run_id]
    before = await snapshot(store, runs=watched, sessions=[other_session])

    await store.purge_session(session_id)
    assert await snapshot(store, runs=watched, sessions=[other_session]) == before
    # ...and they keep working.
    assert (await store.append_run_record(ordinary(sessionless, "after"))).inserted is True
    assert (await store.append_run_record(ordinary(neighbour, "after"))).inserted is True


async def test_purge_of_an_ended_empty_session(store: Store) -> None:
    session_id = await ended_session(store)
    await store.purge_session(session_id)
    await refused(ErrorCode.SESSION_PURGED, store.create_session(session_id, ms(0)))


async def test_record_naming_a_purged_session_is_session_purged(store: Store) -> None:
    # §6.4 record checks: the tombstone of the record's session is checked before its run.
    purged = await ended_session(store)
    await store.purge_session(purged)
    _, run = await session_with_root(store)
    stray = changed(ordinary(run, "stray"), session_id=purged)
    await refused(ErrorCode.SESSION_PURGED, store.append_run_record(stray))
    assert len(await all_run_records(store, run.run_id)) == 1
