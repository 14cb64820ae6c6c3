"""A step or a terminal that names the log it was decided on (§6.4 AppendRunRecords and §6.7
RecordRunTerminal `follows`): it is written only while the run's log is still exactly that log,
else RUN_LOG_MOVED and nothing is written; its exact retry succeeds whatever the log became. A
planner sends a turn's first step, or its first answer when that closes the run, this way before
its start is answered, so a start that did not simply succeed never gets a write it did not see."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import LogBasis, RunStart, RunStatus, SessionStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    all_run_records,
    ms,
    ordinary,
    refused,
    run_start,
    session_with_root,
    snapshot,
    stopped_root,
    terminal,
)

FollowingWrite = Callable[[Store, RunStart, LogBasis], Awaitable[object]]
"""A write of `run` naming the log it was decided on: a step, or a terminal closing with one."""


async def _step(store: Store, run: RunStart, basis: LogBasis) -> object:
    return await store.append_run_records([ordinary(run, "step")], follows=basis)


async def _terminal(store: Store, run: RunStart, basis: LogBasis) -> object:
    return await store.record_run_terminal(terminal(run), [ordinary(run, "step")], follows=basis)


@pytest.fixture(params=["step", "terminal"])
def following(request: pytest.FixtureRequest) -> FollowingWrite:
    """Each way to write behind a log: AppendRunRecords, RecordRunTerminal carrying the answer."""
    writes: dict[str, FollowingWrite] = {"step": _step, "terminal": _terminal}
    return writes[request.param]


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


async def test_a_write_whose_log_moved_on_is_refused_and_writes_nothing(
    store: Store, following: FollowingWrite
) -> None:
    session_id, run = await session_with_root(store)
    basis = LogBasis.of(await all_run_records(store, run.run_id))
    await store.append_run_record(ordinary(run, "written-meanwhile"))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_LOG_MOVED, following(store, run, basis))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_log_as_long_with_other_content_is_not_the_basis(
    store: Store, following: FollowingWrite
) -> None:
    # An earlier attempt's start wrote the same keys with other content (its memory read differed).
    session_id, run = await session_with_root(store)
    await store.append_run_record(ordinary(run, "input", payload=b'{"said":"earlier"}'))
    stored = await all_run_records(store, run.run_id)
    seen = [stored[0], ordinary(run, "input", payload=b'{"said":"later"}')]
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_LOG_MOVED, following(store, run, LogBasis.of(seen)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_write_following_a_start_that_stopped_or_never_happened_is_refused(
    store: Store, following: FollowingWrite
) -> None:
    # The session had ended: the start stopped the run (canceled, its own terminal written). A
    # terminal behind it is told that its log moved, not that the run closed otherwise.
    command = await stopped_root(store)
    seen = [command.started, ordinary(command.run, "input")]
    stopped = [command.run.run_id]
    before = await snapshot(store, runs=stopped, sessions=[command.run.session_id])
    await refused(ErrorCode.RUN_LOG_MOVED, following(store, command.run, LogBasis.of(seen)))
    assert await snapshot(store, runs=stopped, sessions=[command.run.session_id]) == before
    never = run_start(session_id=command.run.session_id)
    await refused(ErrorCode.RUN_NOT_FOUND, following(store, never, LogBasis.of(seen)))


async def test_a_terminal_following_the_whole_log_closes_the_run_and_is_retried_exactly(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.append_run_records([ordinary(run, "context"), ordinary(run, "input")])
    basis = LogBasis.of(await all_run_records(store, run.run_id))
    answer, closing = ordinary(run, "step/1/assistant"), terminal(run)
    first = await store.record_run_terminal(closing, [answer], follows=basis)
    assert (first.record_id, first.inserted) == ("5", True)
    assert (await store.load_run(run.run_id)).status is RunStatus.COMPLETED
    keys = [record.event_key for record in await all_run_records(store, run.run_id)]
    assert keys[3:] == ["step/1/assistant", "terminal"]
    # Its resend after it committed is an exact retry, though the log is no longer its basis.
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    again = await store.record_run_terminal(closing, [answer], follows=basis)
    assert (again.record_id, again.inserted) == ("5", False)
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_a_terminal_following_its_log_closes_the_run_after_its_session_ended(store: Store) -> None:
    # The session ended after the start: a running run may still close, on the log it was decided on.
    session_id, run = await session_with_root(store)
    basis = LogBasis.of(await all_run_records(store, run.run_id))
    await store.end_session(session_id, ms())
    closed = await store.record_run_terminal(terminal(run), [ordinary(run, "answer")], follows=basis)
    assert closed.inserted and closed.session_status == SessionStatus.ENDED.value
    assert (await store.load_run(run.run_id)).status is RunStatus.COMPLETED


async def test_a_basis_that_names_no_chain_is_checked_by_the_records(
    store: Store, following: FollowingWrite
) -> None:
    # A writer from before `LogBasis.chain`: the store reads the records the basis names.
    _, run = await session_with_root(store)
    stored = await all_run_records(store, run.run_id)
    unchained = LogBasis.of(stored).model_copy(update={"chain": None})
    other = LogBasis.of([ordinary(run, stored[0].event_key, payload=b'{"said":"other"}')])
    await refused(ErrorCode.RUN_LOG_MOVED, following(store, run, other.model_copy(update={"chain": None})))
    await following(store, run, unchained)
    assert [record.event_key for record in await all_run_records(store, run.run_id)][-1] in (
        "step",
        "terminal",
    )
