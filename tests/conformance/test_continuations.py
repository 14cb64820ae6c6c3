"""Continuations (§7, §12 "Continuations"): every check with its error, single admission,
losers, the winner's retries, chains, children whose parent moved, ended sessions."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import decode_run_started
from quipu.contracts.store import CancellationReason, LifecycleType, RunStart, RunStatus, StartOutcome
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    CHECKPOINT_BYTES,
    STATE_CHANGE_GAP,
    ChildStart,
    RootStart,
    all_run_records,
    changed,
    child_start,
    complete,
    ms,
    open_session,
    proceed,
    refused,
    root_start,
    running_child,
    running_one_shot,
    running_root,
    session_with_root,
    snapshot,
    suspend,
    terminal,
    uid,
)


async def suspended_root(store: Store, session_id: str, **options: object) -> RunStart:
    """A root run of the session, started and suspended with CHECKPOINT_BYTES."""
    run = await running_root(store, session_id, **options)
    await suspend(store, run)
    return run


def successor_of(
    predecessor: RunStart, *, agent_id: str | None = None, started_at: datetime | None = None
) -> RootStart:
    """StartRootRun arguments continuing a suspended root (same session, agent and labels)."""
    return root_start(
        predecessor.session_id,
        predecessor_run_id=predecessor.run_id,
        agent_id=predecessor.agent_id if agent_id is None else agent_id,
        labels=dict(predecessor.labels),
        started_at=ms(500) if started_at is None else started_at,
    )


async def test_continuation_is_admitted_and_recorded_on_both_runs(store: Store) -> None:
    session_id = await open_session(store)
    predecessor = await suspended_root(store, session_id, labels={"topic": "refund"})
    before = await store.load_run(predecessor.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)

    command = successor_of(predecessor)
    result = await store.start_root_run(*command)
    assert result.decision is StartOutcome.PROCEED
    assert result.run_status is RunStatus.RUNNING

    after = await store.load_run(predecessor.run_id)
    assert after.successor_run_id == command[0].run_id
    assert after.status is RunStatus.SUSPENDED  # the predecessor stays suspended
    assert after.updated_at > before.updated_at  # successor admission is a state change
    checkpoint = await store.load_run_suspension(predecessor.run_id)
    assert checkpoint.data == CHECKPOINT_BYTES  # kept after a successor is admitted

    [started] = await all_run_records(store, command[0].run_id)
    assert started.type == LifecycleType.RUN_STARTED.value
    assert decode_run_started(started.payload).predecessor_run_id == predecessor.run_id
    successor = await store.load_run(command[0].run_id)
    assert successor.successor_run_id == ""
    assert successor.parent_run_id == ""


async def test_continuation_of_a_missing_predecessor_is_run_not_found(store: Store) -> None:
    session_id = await open_session(store)
    command = root_start(session_id, predecessor_run_id=uid("ghost"))
    await refused(ErrorCode.RUN_NOT_FOUND, store.start_root_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))


async def test_continuation_across_sessions_is_run_session_mismatch(store: Store) -> None:
    session_id = await open_session(store)
    other_session = await open_session(store)
    predecessor = await suspended_root(store, other_session)
    command = root_start(session_id, predecessor_run_id=predecessor.run_id, agent_id=predecessor.agent_id)
    await refused(ErrorCode.RUN_SESSION_MISMATCH, store.start_root_run(*command))
    assert (await store.load_run(predecessor.run_id)).successor_run_id == ""


async def test_continuation_of_a_sessionless_run_is_run_session_mismatch(store: Store) -> None:
    session_id = await open_session(store)
    predecessor = await running_one_shot(store)
    await suspend(store, predecessor)
    command = root_start(session_id, predecessor_run_id=predecessor.run_id, agent_id=predecessor.agent_id)
    await refused(ErrorCode.RUN_SESSION_MISMATCH, store.start_root_run(*command))


@pytest.mark.parametrize("status", ["running", "completed", "failed", "canceled"])
async def test_continuation_of_a_run_not_suspended_is_run_suspension_not_found(
    store: Store, status: str
) -> None:
    _, predecessor = await session_with_root(store)
    if status == "completed":
        await complete(store, predecessor)
    elif status == "failed":
        await store.record_run_terminal(terminal(predecessor, RunStatus.FAILED))
    elif status == "canceled":
        await store.record_run_terminal(
            terminal(predecessor, RunStatus.CANCELED, reason=CancellationReason.ENGINE_CANCELED)
        )
    command = successor_of(predecessor)
    await refused(ErrorCode.RUN_SUSPENSION_NOT_FOUND, store.start_root_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command[0].run_id))
    assert (await store.load_run(predecessor.run_id)).successor_run_id == ""


async def test_continuation_by_another_agent_is_run_conflict(store: Store) -> None:
    session_id = await open_session(store)
    predecessor = await suspended_root(store, session_id)
    command = successor_of(predecessor, agent_id="agent-other")
    await refused(ErrorCode.RUN_CONFLICT, store.start_root_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command[0].run_id))
    assert (await store.load_run(predecessor.run_id)).successor_run_id == ""


async def test_child_continuing_a_root_is_run_conflict(store: Store) -> None:
    session_id = await open_session(store)
    predecessor = await suspended_root(store, session_id)
    parent = await running_root(store, session_id)
    command = child_start(
        session_id, parent, agent_id=predecessor.agent_id, predecessor_run_id=predecessor.run_id
    )
    before = await snapshot(store, runs=[parent.run_id, predecessor.run_id])
    await refused(ErrorCode.RUN_CONFLICT, store.start_child_run(*command))
    assert await snapshot(store, runs=[parent.run_id, predecessor.run_id]) == before


# --- child continuations --------------------------------------------------------------------------


async def suspended_child(store: Store, session_id: str) -> tuple[RunStart, RunStart]:
    """(parent, child): a running parent whose child, called as tool `approve`, is suspended."""
    parent = await running_root(store, session_id, agent_id="agent-parent")
    child = await running_child(
        store,
        session_id,
        parent,
        agent_id="agent-child",
        tool_name="approve",
        tool_call_id="toolu_A",
    )
    await suspend(store, child)
    return parent, child


def child_successor(
    session_id: str,
    parent: RunStart,
    predecessor: RunStart,
    *,
    tool_name: str = "approve",
    tool_call_id: str = "toolu_A",
) -> ChildStart:
    """StartChildRun arguments continuing `predecessor` under `parent`, repeating its tool call
    (`suspended_child`'s) unless told another."""
    return child_start(
        session_id,
        parent,
        predecessor_run_id=predecessor.run_id,
        agent_id=predecessor.agent_id,
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        started_at=ms(700),
    )


async def test_root_continuing_a_child_is_run_conflict(store: Store) -> None:
    session_id = await open_session(store)
    _, child = await suspended_child(store, session_id)
    command = successor_of(child)
    await refused(ErrorCode.RUN_CONFLICT, store.start_root_run(*command))
    assert (await store.load_run(child.run_id)).successor_run_id == ""


async def test_child_continuation_under_the_same_parent_is_admitted(store: Store) -> None:
    session_id = await open_session(store)
    parent, child = await suspended_child(store, session_id)
    command = child_successor(session_id, parent, child)
    successor = await proceed(store, command)
    assert (await store.load_run(child.run_id)).successor_run_id == successor.run_id
    links = [
        r for r in await all_run_records(store, parent.run_id) if r.type == LifecycleType.CHILD_RUN_LINKED
    ]
    assert [link.event_key for link in links] == [f"link:{child.run_id}", f"link:{successor.run_id}"]


async def test_child_continuation_under_the_parents_own_continuation(store: Store) -> None:
    # §7: a child is identified by its tool call; its execution parent may move to the
    # parent's own continuation, which must be running and in the same session.
    session_id = await open_session(store)
    old_parent, child = await suspended_child(store, session_id)
    await suspend(store, old_parent)
    new_parent = await proceed(store, successor_of(old_parent))

    command = child_successor(session_id, new_parent, child)
    result = await store.start_child_run(*command)
    assert result.decision is StartOutcome.PROCEED
    successor = await store.load_run(command[0].run_id)
    assert successor.parent_run_id == new_parent.run_id
    assert (await store.load_run(child.run_id)).successor_run_id == command[0].run_id
    new_parent_records = await all_run_records(store, new_parent.run_id)
    assert new_parent_records[-1].type == LifecycleType.CHILD_RUN_LINKED.value
    assert result.parent_link is not None
    assert new_parent_records[-1].id == result.parent_link.record_id
    # Nothing was linked on the old parent.
    old_links = [
        r for r in await all_run_records(store, old_parent.run_id) if r.type == LifecycleType.CHILD_RUN_LINKED
    ]
    assert len(old_links) == 1


@pytest.mark.parametrize(
    "options",
    [{"tool_name": "reject"}, {"tool_call_id": "toolu_B"}],
    ids=["other_tool_name", "other_tool_call_id"],
)
async def test_child_continuation_with_another_tool_call_is_run_conflict(
    store: Store, options: dict[str, str]
) -> None:
    session_id = await open_session(store)
    parent, child = await suspended_child(store, session_id)
    command = child_successor(session_id, parent, child, **options)
    before = await snapshot(store, runs=[parent.run_id, child.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_CONFLICT, store.start_child_run(*command))
    assert await snapshot(store, runs=[parent.run_id, child.run_id], sessions=[session_id]) == (before)


async def test_child_continuation_under_a_parent_of_another_agent_is_run_conflict(
    store: Store,
) -> None:
    session_id = await open_session(store)
    _, child = await suspended_child(store, session_id)
    stranger = await running_root(store, session_id, agent_id="agent-stranger")
    command = child_successor(session_id, stranger, child)
    await refused(ErrorCode.RUN_CONFLICT, store.start_child_run(*command))
    assert len(await all_run_records(store, stranger.run_id)) == 1


async def test_child_continuation_under_a_closed_parent_is_run_not_active(store: Store) -> None:
    session_id = await open_session(store)
    parent, child = await suspended_child(store, session_id)
    await suspend(store, parent)
    command = child_successor(session_id, parent, child)
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.start_child_run(*command))
    assert (await store.load_run(child.run_id)).successor_run_id == ""


async def test_child_continuation_under_a_parent_in_another_session_is_refused(
    store: Store,
) -> None:
    session_id = await open_session(store)
    other_session = await open_session(store)
    _, child = await suspended_child(store, session_id)
    foreign_parent = await running_root(store, other_session, agent_id="agent-parent")
    command = child_successor(session_id, foreign_parent, child)
    await refused(ErrorCode.RUN_SESSION_MISMATCH, store.start_child_run(*command))
    assert (await store.load_run(child.run_id)).successor_run_id == ""


# --- admission ------------------------------------------------------------------------------------


async def test_second_continuation_loses_on_every_attempt_and_leaves_nothing(
    store: Store,
) -> None:
    session_id = await open_session(store)
    predecessor = await suspended_root(store, session_id)
    winner = successor_of(predecessor)
    await store.start_root_run(*winner)
    loser = successor_of(predecessor, started_at=ms(600))
    watched = [predecessor.run_id, winner[0].run_id, loser[0].run_id]
    before = await snapshot(store, runs=watched, sessions=[session_id])
    for _ in range(3):
        await refused(ErrorCode.RUN_CONFLICT, store.start_root_run(*loser))
    assert await snapshot(store, runs=watched, sessions=[session_id]) == before
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(loser[0].run_id))


async def test_winner_retries_return_its_original_ids_even_after_it_closed(store: Store) -> None:
    session_id = await open_session(store)
    predecessor = await suspended_root(store, session_id)
    winner = successor_of(predecessor)
    first = await store.start_root_run(*winner)
    await complete(store, winner[0])

    again = await store.start_root_run(*winner)
    assert again.decision is StartOutcome.PROCEED
    assert again.run_status is RunStatus.COMPLETED
    assert again.started.record_id == first.started.record_id
    assert again.started.inserted is False
    # A loser is still a loser after the winner closed.
    await refused(ErrorCode.RUN_CONFLICT, store.start_root_run(*successor_of(predecessor)))


async def test_continuation_retry_keeps_the_predecessors_updated_at(store: Store) -> None:
    session_id = await open_session(store)
    predecessor = await suspended_root(store, session_id)
    winner = successor_of(predecessor)
    await store.start_root_run(*winner)
    admitted = await store.load_run(predecessor.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)
    await store.start_root_run(*winner)
    await refused(ErrorCode.RUN_CONFLICT, store.start_root_run(*successor_of(predecessor)))
    assert await store.load_run(predecessor.run_id) == admitted


async def test_chain_of_continuations(store: Store) -> None:
    session_id = await open_session(store)
    first = await suspended_root(store, session_id)
    second = await proceed(store, successor_of(first))
    await suspend(store, second, suspension_id="susp-2", data=b"\x01second")
    third = await proceed(store, successor_of(second, started_at=ms(900)))

    assert (await store.load_run(first.run_id)).successor_run_id == second.run_id
    assert (await store.load_run(second.run_id)).successor_run_id == third.run_id
    assert (await store.load_run(third.run_id)).successor_run_id == ""
    assert (await store.load_run_suspension(first.run_id)).data == CHECKPOINT_BYTES
    assert (await store.load_run_suspension(second.run_id)).data == b"\x01second"
    [started] = await all_run_records(store, third.run_id)
    assert decode_run_started(started.payload).predecessor_run_id == second.run_id
    # Skipping a link of the chain is a losing continuation of the first run.
    await refused(ErrorCode.RUN_CONFLICT, store.start_root_run(*successor_of(first)))


async def test_continuation_in_an_ended_session_is_admitted_and_stops(store: Store) -> None:
    session_id = await open_session(store)
    predecessor = await suspended_root(store, session_id)
    await store.end_session(session_id, ms(300))
    command = successor_of(predecessor)
    result = await store.start_root_run(*command)
    assert result.decision is StartOutcome.STOP
    assert result.run_status is RunStatus.CANCELED
    assert result.stopped is not None
    meta = await store.load_run(command[0].run_id)
    assert meta.cancellation_reason == CancellationReason.SESSION_ENDED.value
    assert (await store.load_run(predecessor.run_id)).successor_run_id == command[0].run_id
    await refused(
        ErrorCode.RUN_CONFLICT,
        store.start_root_run(*successor_of(predecessor, started_at=ms(800))),
    )


async def test_continuation_started_payload_must_name_the_predecessor(store: Store) -> None:
    session_id = await open_session(store)
    predecessor = await suspended_root(store, session_id)
    run, started, stopped = successor_of(predecessor)
    await refused(
        ErrorCode.INVALID_ARGUMENT,
        store.start_root_run(run, changed(started, payload=b"{}"), stopped),
    )
    assert (await store.load_run(predecessor.run_id)).successor_run_id == ""
