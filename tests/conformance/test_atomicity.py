"""Atomicity and concurrency (§6.1, §7 admission, §8; §12 "Atomicity: nothing partial; racing
starts, admissions, closes and purges").

Racing commands go through `resending`: a store may abort a conflicting transaction with
UNAVAILABLE, and the contract makes the caller resend the identical command (§5). Each race is
then judged on the final answers and on what the read operations show.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.store import (
    CancellationReason,
    LifecycleType,
    RunStatus,
    StartOutcome,
    StartResult,
)
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    all_run_records,
    all_session_records,
    changed,
    child_start,
    ended_session,
    intent,
    keys,
    ms,
    open_session,
    ordinary,
    proceed,
    refused,
    resending,
    root_start,
    running_one_shot,
    running_root,
    session_with_root,
    snapshot,
    suspend,
    suspension,
    terminal,
    uid,
)

RACERS = 8
T = TypeVar("T")


async def race(*operations: Callable[[], Awaitable[T]]) -> list[T | StoreError]:
    """Run operations concurrently (each resent after UNAVAILABLE); results or StoreErrors."""
    results = await asyncio.gather(
        *(resending(operation) for operation in operations), return_exceptions=True
    )
    outcomes: list[T | StoreError] = []
    for result in results:
        if isinstance(result, StoreError) or not isinstance(result, BaseException):
            outcomes.append(result)
        else:
            raise result
    return outcomes


def codes(results: Sequence[object]) -> list[ErrorCode | None]:
    """The error code of each result, None for a success."""
    return [result.code if isinstance(result, StoreError) else None for result in results]


def successes(results: list[T | StoreError]) -> list[T]:
    """The results, all of them successes (the test fails on any StoreError among them)."""
    assert codes(results) == [None] * len(results)
    return [result for result in results if not isinstance(result, StoreError)]


# --- a failed check writes nothing ----------------------------------------------------------------


async def test_stop_child_start_failing_on_the_link_key_writes_nothing(store: Store) -> None:
    # The stop decision would write three records on two runs; the last check fails first.
    session_id, parent = await session_with_root(store)
    await store.append_run_record(ordinary(parent, "taken"))
    await store.end_session(session_id, ms(3))
    command = child_start(session_id, parent, link_key="taken")
    watched = [parent.run_id, command.run.run_id]
    before = await snapshot(store, runs=watched, sessions=[session_id])
    await refused(ErrorCode.EVENT_CONFLICT, store.start_child_run(*command))
    assert await snapshot(store, runs=watched, sessions=[session_id]) == before


async def test_refused_child_continuation_writes_neither_link_nor_admission(store: Store) -> None:
    session_id, parent = await session_with_root(store, agent_id="agent-parent")
    child = await proceed(store, child_start(session_id, parent, tool_name="approve", tool_call_id="toolu_1"))
    await suspend(store, child)
    await store.append_run_record(ordinary(parent, "taken"))
    command = child_start(
        session_id,
        parent,
        agent_id=child.agent_id,
        predecessor_run_id=child.run_id,
        tool_name="approve",
        tool_call_id="toolu_1",
        link_key="taken",
    )
    watched = [parent.run_id, child.run_id, command.run.run_id]
    before = await snapshot(store, runs=watched, sessions=[session_id])
    await refused(ErrorCode.EVENT_CONFLICT, store.start_child_run(*command))
    assert await snapshot(store, runs=watched, sessions=[session_id]) == before
    # The predecessor is still free for a valid continuation.
    admitted = command._replace(parent_link=changed(command.parent_link, event_key="link-ok"))
    assert (await store.start_child_run(*admitted)).decision is StartOutcome.PROCEED
    assert (await store.load_run(child.run_id)).successor_run_id == command.run.run_id


# --- racing starts --------------------------------------------------------------------------------


async def test_racing_identical_starts_admit_one_run(store: Store) -> None:
    session_id = await open_session(store)
    command = root_start(session_id)
    results = await race(*([lambda: store.start_root_run(*command)] * RACERS))
    starts = successes(results)
    assert sum(result.started.inserted for result in starts) == 1
    assert len({result.started.record_id for result in starts}) == 1
    assert {result.decision for result in starts} == {StartOutcome.PROCEED}
    assert len(await all_run_records(store, command.run.run_id)) == 1
    assert keys(await all_session_records(store, session_id)) == [(command.run.run_id, "started")]


async def test_racing_different_starts_of_one_run_admit_one(store: Store) -> None:
    session_id = await open_session(store)
    run_id = uid("run")
    commands = [root_start(session_id, run_id=run_id, agent_id=f"agent-{n}") for n in range(RACERS)]
    results = await race(*(partial(store.start_root_run, *c) for c in commands))
    outcome = codes(results)
    assert outcome.count(None) == 1
    assert outcome.count(ErrorCode.RUN_CONFLICT) == RACERS - 1
    winner = commands[outcome.index(None)]
    assert (await store.load_run(run_id)).agent_id == winner.run.agent_id
    [started] = await all_run_records(store, run_id)
    assert started.same_content(winner.started)


@pytest.mark.parametrize("session_state", ["active", "ended"])
async def test_eight_racing_continuations_admit_exactly_one(store: Store, session_state: str) -> None:
    session_id, predecessor = await session_with_root(store)
    await suspend(store, predecessor)
    if session_state == "ended":
        await store.end_session(session_id, ms(5))
    before = keys(await all_session_records(store, session_id))
    commands = [
        root_start(session_id, predecessor_run_id=predecessor.run_id, started_at=ms(100 + n))
        for n in range(RACERS)
    ]
    results = await race(*(partial(store.start_root_run, *c) for c in commands))
    outcome = codes(results)
    assert outcome.count(None) == 1, outcome
    assert outcome.count(ErrorCode.RUN_CONFLICT) == RACERS - 1, outcome
    winner = commands[outcome.index(None)]
    expected = StartOutcome.PROCEED if session_state == "active" else StartOutcome.STOP
    [won] = successes([results[outcome.index(None)]])
    assert won.decision is expected

    assert (await store.load_run(predecessor.run_id)).successor_run_id == winner.run.run_id
    for command in commands:
        if command is not winner:
            await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))
            # Losers get RUN_CONFLICT on every attempt.
            await refused(ErrorCode.RUN_CONFLICT, store.start_root_run(*command))
    after = keys(await all_session_records(store, session_id))
    written = [key for key in after if key not in before]
    assert {run_id for run_id, _ in written} == {winner.run.run_id}
    listed = await store.list_runs_by_session(session_id, [])
    assert [meta.run_id for meta in listed] == [predecessor.run_id, winner.run.run_id]


async def test_racing_new_children_and_parent_close_leave_no_orphan(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    commands = [child_start(session_id, parent, tool_call_id=f"call-{n}") for n in range(RACERS)]
    close = terminal(parent)
    operations: list[Callable[[], Awaitable[object]]] = [partial(store.start_child_run, *c) for c in commands]
    operations.insert(RACERS // 2, lambda: store.record_run_terminal(close))
    results = await race(*operations)
    child_results = results[: RACERS // 2] + results[RACERS // 2 + 1 :]
    assert codes([results[RACERS // 2]]) == [None]
    assert set(codes(child_results)) <= {None, ErrorCode.RUN_NOT_ACTIVE}

    links = {
        record.event_key
        for record in await all_run_records(store, parent.run_id)
        if record.type == LifecycleType.CHILD_RUN_LINKED
    }
    for command, code in zip(commands, codes(child_results), strict=True):
        if code is None:
            assert command.parent_link.event_key in links
            assert len(await all_run_records(store, command.run.run_id)) == 1
        else:
            assert command.parent_link.event_key not in links
            await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))


# --- racing closes --------------------------------------------------------------------------------


async def test_racing_terminal_and_suspension_leave_exactly_one_close(store: Store) -> None:
    session_id = await open_session(store)
    for _ in range(6):
        run = await running_root(store, session_id)
        checkpoint, suspended = suspension(run)
        completed = terminal(run)
        results = await race(
            partial(store.record_run_suspension, checkpoint, suspended),
            partial(store.record_run_terminal, completed),
        )
        outcome = codes(results)
        assert sorted(outcome, key=str) == sorted([None, ErrorCode.RUN_TERMINAL_CONFLICT], key=str)
        records = await all_run_records(store, run.run_id)
        closing = [r for r in records if r.type != LifecycleType.RUN_STARTED]
        assert len(closing) == 1
        meta = await store.load_run(run.run_id)
        if outcome[0] is None:
            assert meta.status is RunStatus.SUSPENDED
            assert closing[0].same_content(suspended)
            assert await store.load_run_suspension(run.run_id) == checkpoint
        else:
            assert meta.status is RunStatus.COMPLETED
            assert closing[0].same_content(completed)
            await refused(ErrorCode.RUN_SUSPENSION_NOT_FOUND, store.load_run_suspension(run.run_id))


async def test_racing_cancellation_and_completion_stay_consistent(store: Store) -> None:
    session_id = await open_session(store)
    for _ in range(6):
        run = await running_root(store, session_id)
        results = await race(
            partial(store.record_run_cancellation, intent(run)),
            partial(store.record_run_terminal, terminal(run)),
        )
        meta = await store.load_run(run.run_id)
        types = [record.type for record in await all_run_records(store, run.run_id)]
        if codes(results) == [None, ErrorCode.RUN_CANCELLATION_CONFLICT]:
            assert meta.status is RunStatus.RUNNING
            assert meta.cancellation_reason == CancellationReason.USER_REQUESTED.value
            assert types == [LifecycleType.RUN_STARTED, LifecycleType.CANCELLATION_INTENT]
        else:
            assert codes(results) == [ErrorCode.RUN_NOT_ACTIVE, None]
            assert meta.status is RunStatus.COMPLETED
            assert meta.cancellation_reason == ""
            assert types == [LifecycleType.RUN_STARTED, LifecycleType.RUN_COMPLETED]


async def test_racing_cancellations_keep_one_reason(store: Store) -> None:
    _, run = await session_with_root(store)
    reasons = list(CancellationReason)
    results = await race(
        *(
            lambda r=reason: store.record_run_cancellation(intent(run, r, f"cancel-{r.value}"))
            for reason in reasons
        )
    )
    outcome = codes(results)
    assert outcome.count(None) == 1
    assert outcome.count(ErrorCode.RUN_CANCELLATION_CONFLICT) == len(reasons) - 1
    winner = reasons[outcome.index(None)]
    assert (await store.load_run(run.run_id)).cancellation_reason == winner.value
    intents = [
        r for r in await all_run_records(store, run.run_id) if r.type == LifecycleType.CANCELLATION_INTENT
    ]
    assert [r.event_key for r in intents] == [f"cancel-{winner.value}"]


# --- racing appends -------------------------------------------------------------------------------


async def test_racing_appends_get_distinct_contiguous_ids(store: Store) -> None:
    session_id, run = await session_with_root(store)
    records = [ordinary(run, f"step-{n}") for n in range(RACERS * 2)]
    appended = successes(await race(*(partial(store.append_run_record, r) for r in records)))
    assert all(result.inserted for result in appended)
    ids = sorted(int(result.record_id) for result in appended)
    assert ids == list(range(2, 2 + len(records)))
    listed = await all_run_records(store, run.run_id)
    assert [int(r.id) for r in listed] == list(range(1, 2 + len(records)))
    # Session order is commit order, which for one run is its per-run order.
    assert keys(await all_session_records(store, session_id)) == keys(listed)


async def test_racing_appends_of_one_key_keep_one_record(store: Store) -> None:
    _, run = await session_with_root(store)
    records = [ordinary(run, "same-key", payload=f'{{"n":{n}}}'.encode()) for n in range(RACERS)]
    results = await race(*(partial(store.append_run_record, r) for r in records))
    outcome = codes(results)
    assert outcome.count(None) == 1
    assert outcome.count(ErrorCode.EVENT_CONFLICT) == RACERS - 1
    [stored] = [r for r in await all_run_records(store, run.run_id) if r.event_key == "same-key"]
    assert stored.same_content(records[outcome.index(None)])


# --- racing purges --------------------------------------------------------------------------------


async def _purge_when_possible(store: Store, session_id: str) -> None:
    """PurgeSession, retried while a run of the session is still running."""
    for _ in range(2000):
        try:
            await resending(lambda: store.purge_session(session_id))
            return
        except StoreError as error:
            if error.code is not ErrorCode.SESSION_HAS_ACTIVE_RUNS:
                raise
            await asyncio.sleep(0)
    raise AssertionError("the session never became purgeable")


async def test_purge_racing_appends_leaves_all_or_nothing_of_each(store: Store) -> None:
    session_id, run = await session_with_root(store)
    start_command = root_start(session_id, run_id=run.run_id, agent_id=run.agent_id)
    sessionless = await running_one_shot(store)
    await store.end_session(session_id, ms(4))
    appends = [ordinary(run, f"late-{n}") for n in range(RACERS * 2)]
    sessionless_appends = [ordinary(sessionless, f"side-{n}") for n in range(RACERS)]

    operations: list[Callable[[], Awaitable[object]]] = [partial(store.append_run_record, r) for r in appends]
    operations.insert(RACERS, lambda: store.record_run_terminal(terminal(run)))
    operations.insert(RACERS // 2, lambda: _purge_when_possible(store, session_id))
    operations.extend(lambda: store.start_root_run(*start_command) for _ in range(3))
    operations.extend(partial(store.append_run_record, r) for r in sessionless_appends)
    results = await race(*operations)

    allowed = {None, ErrorCode.SESSION_PURGED, ErrorCode.RUN_NOT_FOUND, ErrorCode.RUN_NOT_ACTIVE}
    assert set(codes(results)) <= allowed, codes(results)
    # Everything of the session is gone, whatever each racer saw.
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(run.run_id))
    await refused(ErrorCode.RUN_NOT_FOUND, store.list_run_records(run.run_id, "", 10))
    await refused(ErrorCode.SESSION_PURGED, store.load_session_status(session_id))
    # Late retries recreate nothing.
    for record in appends:
        await refused(ErrorCode.SESSION_PURGED, store.append_run_record(record))
    await refused(ErrorCode.SESSION_PURGED, store.start_root_run(*start_command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(run.run_id))
    # The sessionless run got every one of its appends, exactly once.
    side = [r.event_key for r in await all_run_records(store, sessionless.run_id)]
    assert sorted(side) == sorted(["started", *[r.event_key for r in sessionless_appends]])


async def test_purge_racing_new_starts_recreates_nothing(store: Store) -> None:
    session_id = await ended_session(store)
    commands = [root_start(session_id) for _ in range(RACERS)]
    operations: list[Callable[[], Awaitable[object]]] = [partial(store.start_root_run, *c) for c in commands]
    operations.insert(RACERS // 2, lambda: store.purge_session(session_id))
    results = await race(*operations)
    purge_code = codes(results)[RACERS // 2]
    assert purge_code is None
    start_results = results[: RACERS // 2] + results[RACERS // 2 + 1 :]
    for result in start_results:
        if isinstance(result, StoreError):
            assert result.code is ErrorCode.SESSION_PURGED
        else:
            assert isinstance(result, StartResult)
            assert result.decision is StartOutcome.STOP  # a start in an ended session never runs
    for command in commands:
        await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))
        await refused(ErrorCode.SESSION_PURGED, store.start_root_run(*command))
    await refused(ErrorCode.SESSION_PURGED, store.list_runs_by_session(session_id, []))
