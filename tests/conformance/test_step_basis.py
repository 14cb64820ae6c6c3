"""A step that names the log it was decided on (§6.4, AppendRunRecords `follows`): it is appended
only while the run's log is still exactly that log, else RUN_LOG_MOVED and nothing is written; its
exact retry succeeds whatever the log became. A planner sends a turn's first step this way before
its start is answered, so a start that did not simply succeed never gets a step it did not see."""

from __future__ import annotations

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import LogBasis
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    all_run_records,
    ordinary,
    refused,
    run_start,
    session_with_root,
    snapshot,
    stopped_root,
)


async def test_a_step_following_the_whole_log_is_appended_and_retried_exactly(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.append_run_records([ordinary(run, "context"), ordinary(run, "input")])
    basis = LogBasis.of(await all_run_records(store, run.run_id))
    step = [ordinary(run, "step/1"), ordinary(run, "step/1/phase")]
    first = await store.append_run_records(step, follows=basis)
    assert [result.record_id for result in first] == ["4", "5"]
    assert all(result.inserted for result in first)
    # Its resend after it committed is an exact retry, though the log is no longer its basis.
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    again = await store.append_run_records(step, follows=basis)
    assert [(result.record_id, result.inserted) for result in again] == [("4", False), ("5", False)]
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_step_whose_log_moved_on_is_refused_and_writes_nothing(store: Store) -> None:
    session_id, run = await session_with_root(store)
    basis = LogBasis.of(await all_run_records(store, run.run_id))
    await store.append_run_record(ordinary(run, "written-meanwhile"))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_LOG_MOVED, store.append_run_records([ordinary(run, "step")], follows=basis))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_log_as_long_with_other_content_is_not_the_basis(store: Store) -> None:
    # An earlier attempt's start wrote the same keys with other content (its memory read differed).
    session_id, run = await session_with_root(store)
    await store.append_run_record(ordinary(run, "input", payload=b'{"said":"earlier"}'))
    stored = await all_run_records(store, run.run_id)
    seen = [stored[0], ordinary(run, "input", payload=b'{"said":"later"}')]
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    step = [ordinary(run, "step")]
    await refused(ErrorCode.RUN_LOG_MOVED, store.append_run_records(step, follows=LogBasis.of(seen)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_step_following_a_start_that_stopped_or_never_happened_is_refused(store: Store) -> None:
    command = await stopped_root(store)
    seen = [command.started, ordinary(command.run, "input")]
    step = [ordinary(command.run, "step")]
    await refused(ErrorCode.RUN_LOG_MOVED, store.append_run_records(step, follows=LogBasis.of(seen)))
    never = run_start(session_id=command.run.session_id)
    step = [ordinary(never, "step")]
    await refused(ErrorCode.RUN_NOT_FOUND, store.append_run_records(step, follows=LogBasis.of(seen)))
