"""Child and one-shot child starts (§6.3, §12 "Child starts"): the link on the parent, the
running-parent rule, retries after the parent closed, session mismatch, link ownership."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import encode_child_run_linked
from quipu.contracts.store import (
    CancellationReason,
    LifecycleType,
    RunStart,
    RunStatus,
    SessionStatus,
    StartOutcome,
)
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    CLOSINGS,
    ChildStart,
    all_run_records,
    all_session_records,
    changed,
    child_start,
    close_run,
    keys,
    link_record,
    ms,
    one_shot_child,
    open_session,
    ordinary,
    refused,
    running_child,
    running_one_shot,
    running_root,
    same_record,
    session_with_root,
    snapshot,
    started_record,
    stopped_record,
    terminal,
    uid,
)


async def _close(store: Store, run: RunStart, how: str) -> None:
    """Move a running run to a closed status."""
    await close_run(store, run, how)
    assert (await store.load_run(run.run_id)).status.value == how


# --- session children -----------------------------------------------------------------------------


async def test_child_start_links_on_the_parent_then_starts_the_child(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    command = child_start(session_id, parent, tool_name="search", tool_call_id="toolu_01")
    result = await store.start_child_run(*command)

    assert result.decision is StartOutcome.PROCEED
    assert result.run_status is RunStatus.RUNNING
    assert result.stopped is None
    assert result.parent_link is not None
    assert result.parent_link.inserted is True
    assert result.parent_link.session_status == SessionStatus.ACTIVE.value
    assert result.started.inserted is True

    parent_records = await all_run_records(store, parent.run_id)
    assert [record.type for record in parent_records] == [
        LifecycleType.RUN_STARTED.value,
        LifecycleType.CHILD_RUN_LINKED.value,
    ]
    assert same_record(parent_records[1], command.parent_link)
    assert parent_records[1].id == result.parent_link.record_id
    [child_started] = await all_run_records(store, command.run.run_id)
    assert same_record(child_started, command.started)
    assert child_started.id == result.started.record_id

    meta = await store.load_run(command.run.run_id)
    assert meta.parent_run_id == parent.run_id
    assert meta.session_id == session_id
    assert meta.status is RunStatus.RUNNING
    # §6.1: the link is written first, then the child's run_started.
    assert keys(await all_session_records(store, session_id)) == [
        (parent.run_id, "started"),
        (parent.run_id, command.parent_link.event_key),
        (command.run.run_id, "started"),
    ]


async def test_child_start_in_an_ended_session_links_and_stops(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    await store.end_session(session_id, parent.started_at)
    command = child_start(session_id, parent)
    result = await store.start_child_run(*command)

    assert result.decision is StartOutcome.STOP
    assert result.run_status is RunStatus.CANCELED
    assert result.parent_link is not None
    assert result.parent_link.inserted is True
    assert result.stopped is not None
    assert result.stopped.inserted is True
    child_records = await all_run_records(store, command.run.run_id)
    assert [record.event_key for record in child_records] == ["started", "stopped"]
    meta = await store.load_run(command.run.run_id)
    assert meta.start_outcome is StartOutcome.STOP
    assert meta.cancellation_reason == CancellationReason.SESSION_ENDED.value
    assert (await store.load_run(parent.run_id)).status is RunStatus.RUNNING
    assert keys(await all_session_records(store, session_id))[1:] == [
        (parent.run_id, command.parent_link.event_key),
        (command.run.run_id, "started"),
        (command.run.run_id, "stopped"),
    ]


async def test_several_children_and_grandchildren_link_in_order(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    first = await running_child(store, session_id, parent, tool_call_id="call-1")
    second = await running_child(store, session_id, parent, tool_call_id="call-2")
    grandchild = await running_child(store, session_id, first, agent_id="agent-c")
    parent_links = [r for r in await all_run_records(store, parent.run_id)][1:]
    assert [r.payload for r in parent_links] == [
        encode_child_run_linked("delegate", "call-1", first.run_id, first.agent_id),
        encode_child_run_linked("delegate", "call-2", second.run_id, second.agent_id),
    ]
    assert [r.type for r in await all_run_records(store, first.run_id)] == [
        LifecycleType.RUN_STARTED.value,
        LifecycleType.CHILD_RUN_LINKED.value,
    ]
    assert (await store.load_run(grandchild.run_id)).parent_run_id == first.run_id


@pytest.mark.parametrize("how", CLOSINGS)
async def test_new_child_of_a_closed_parent_is_run_not_active(store: Store, how: str) -> None:
    session_id, parent = await session_with_root(store)
    await _close(store, parent, how)
    command = child_start(session_id, parent)
    before = await snapshot(store, runs=[parent.run_id, command.run.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.start_child_run(*command))
    after = await snapshot(store, runs=[parent.run_id, command.run.run_id], sessions=[session_id])
    assert after == before


@pytest.mark.parametrize("how", CLOSINGS)
async def test_exact_child_retry_after_the_parent_closed_succeeds(store: Store, how: str) -> None:
    session_id, parent = await session_with_root(store)
    command = child_start(session_id, parent)
    first = await store.start_child_run(*command)
    await complete_child_then_close_parent(store, command.run, parent, how)

    again = await store.start_child_run(*command)
    assert again.decision is StartOutcome.PROCEED
    assert again.run_status is RunStatus.COMPLETED
    assert again.started.record_id == first.started.record_id
    assert again.started.inserted is False
    assert again.parent_link is not None
    assert first.parent_link is not None
    assert again.parent_link.record_id == first.parent_link.record_id
    assert again.parent_link.inserted is False
    links = [
        r for r in await all_run_records(store, parent.run_id) if r.type == LifecycleType.CHILD_RUN_LINKED
    ]
    assert len(links) == 1


async def complete_child_then_close_parent(store: Store, child: RunStart, parent: RunStart, how: str) -> None:
    """Close the child, then the parent (so the parent is no longer running)."""
    await store.record_run_terminal(terminal(child, RunStatus.COMPLETED))
    await _close(store, parent, how)


async def test_modified_child_retry_after_the_parent_closed_is_refused(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    command = child_start(session_id, parent, tool_call_id="call-1")
    await store.start_child_run(*command)
    await complete_child_then_close_parent(store, command.run, parent, "completed")
    # Same link key, other tool call: same key, other content.
    other_call = child_start(
        session_id,
        parent,
        run_id=command.run.run_id,
        tool_call_id="call-2",
        link_key=command.parent_link.event_key,
    )
    await refused(ErrorCode.EVENT_CONFLICT, store.start_child_run(*other_call))
    # Another link key: a record key differs.
    other_key = child_start(
        session_id, parent, run_id=command.run.run_id, tool_call_id="call-1", link_key="link-other"
    )
    await refused(ErrorCode.RUN_CONFLICT, store.start_child_run(*other_key))


async def test_child_of_a_missing_parent_is_run_not_found(store: Store) -> None:
    session_id = await open_session(store)
    ghost = RunStart(run_id=uid("ghost"), agent_id="agent-a", started_at=ms(0))
    command = child_start(session_id, ghost)
    await refused(ErrorCode.RUN_NOT_FOUND, store.start_child_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))


async def test_child_of_a_parent_in_another_session_is_run_session_mismatch(
    store: Store,
) -> None:
    session_id = await open_session(store)
    other_session = await open_session(store)
    parent = await running_root(store, other_session)
    command = child_start(session_id, parent)
    before = await snapshot(store, runs=[parent.run_id], sessions=[session_id, other_session])
    await refused(ErrorCode.RUN_SESSION_MISMATCH, store.start_child_run(*command))
    assert await snapshot(store, runs=[parent.run_id], sessions=[session_id, other_session]) == (before)
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))


async def test_session_child_of_a_sessionless_parent_is_run_session_mismatch(
    store: Store,
) -> None:
    session_id = await open_session(store)
    parent = await running_one_shot(store)
    await refused(ErrorCode.RUN_SESSION_MISMATCH, store.start_child_run(*child_start(session_id, parent)))
    assert len(await all_run_records(store, parent.run_id)) == 1


async def test_link_agent_other_than_the_parents_is_record_owner_mismatch(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    command = child_start(session_id, parent, link_agent_id="agent-impostor")
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, store.start_child_run(*command))
    assert len(await all_run_records(store, parent.run_id)) == 1
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))


LINK_OWNERS: dict[str, Callable[[ChildStart], ChildStart]] = {
    # §6.1 step 1: the link is owned by `parent_run_id` and the child's `session_id`.
    "link_on_another_run": lambda c: c._replace(parent_link=changed(c.parent_link, run_id=uid("run"))),
    "link_in_another_session": lambda c: c._replace(
        parent_link=changed(c.parent_link, session_id=uid("session"))
    ),
    "started_on_the_parent": lambda c: c._replace(started=changed(c.started, run_id=c.run.parent_run_id)),
}


@pytest.mark.parametrize("variant", list(LINK_OWNERS), ids=list(LINK_OWNERS))
async def test_child_start_records_owned_elsewhere_are_record_owner_mismatch(
    store: Store, variant: str
) -> None:
    session_id, parent = await session_with_root(store)
    command = LINK_OWNERS[variant](child_start(session_id, parent))
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, store.start_child_run(*command))
    assert len(await all_run_records(store, parent.run_id)) == 1


def _link_payload(c: ChildStart, **fields: str) -> ChildStart:
    values = {
        "tool_name": "delegate",
        "tool_call_id": "call-1",
        "child_run_id": c.run.run_id,
        "child_agent_id": c.run.agent_id,
        **fields,
    }
    return c._replace(parent_link=changed(c.parent_link, payload=encode_child_run_linked(**values)))


def _self_parent(c: ChildStart) -> ChildStart:
    run = changed(c.run, run_id=c.run.parent_run_id)
    return ChildStart(
        run,
        link_record(run, parent_agent_id=c.parent_link.agent_id),
        started_record(run),
        stopped_record(run),
    )


INVALID_CHILDREN: dict[str, Callable[[ChildStart], ChildStart]] = {
    "link_other_child_run_id": lambda c: _link_payload(c, child_run_id=uid("run")),
    "link_other_child_agent_id": lambda c: _link_payload(c, child_agent_id="agent-z"),
    "link_empty_tool_name": lambda c: _link_payload(c, tool_name=""),
    "link_empty_tool_call_id": lambda c: _link_payload(c, tool_call_id=""),
    "link_wrong_type": lambda c: c._replace(
        parent_link=changed(c.parent_link, type=LifecycleType.RUN_STARTED.value)
    ),
    # Lead's reading: the three keys are pairwise distinct even though they land on two runs.
    "link_key_equals_started_key": lambda c: c._replace(
        parent_link=changed(c.parent_link, event_key=c.started.event_key)
    ),
    "link_key_equals_stopped_key": lambda c: c._replace(
        parent_link=changed(c.parent_link, event_key=c.stopped.event_key)
    ),
    # §3: the parent differs from the run itself (the run id here names a running run).
    "parent_is_itself": _self_parent,
    "started_payload_without_parent": lambda c: c._replace(started=changed(c.started, payload=b"{}")),
}


@pytest.mark.parametrize("variant", list(INVALID_CHILDREN), ids=list(INVALID_CHILDREN))
async def test_invalid_child_start_is_invalid_argument(store: Store, variant: str) -> None:
    session_id, parent = await session_with_root(store)
    command = INVALID_CHILDREN[variant](child_start(session_id, parent))
    before = await snapshot(store, runs=[parent.run_id, command.run.run_id], sessions=[session_id])
    await refused(ErrorCode.INVALID_ARGUMENT, store.start_child_run(*command))
    after = await snapshot(store, runs=[parent.run_id, command.run.run_id], sessions=[session_id])
    assert after == before


async def test_child_start_without_a_parent_is_invalid(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    command = child_start(session_id, parent)
    run = changed(command.run, parent_run_id="")
    orphan = ChildStart(run, command.parent_link, changed(command.started, payload=b"{}"), command.stopped)
    await refused(ErrorCode.INVALID_ARGUMENT, store.start_child_run(*orphan))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(run.run_id))


async def test_link_key_taken_on_the_parent_is_event_conflict(store: Store) -> None:
    session_id, parent = await session_with_root(store)
    await store.append_run_record(ordinary(parent, "tool-call-1"))
    command = child_start(session_id, parent, link_key="tool-call-1")
    before = await snapshot(store, runs=[parent.run_id, command.run.run_id], sessions=[session_id])
    await refused(ErrorCode.EVENT_CONFLICT, store.start_child_run(*command))
    after = await snapshot(store, runs=[parent.run_id, command.run.run_id], sessions=[session_id])
    assert after == before


# --- one-shot children ----------------------------------------------------------------------------


async def test_one_shot_child_links_on_its_sessionless_parent(store: Store) -> None:
    parent = await running_one_shot(store)
    command = one_shot_child(parent)
    result = await store.start_one_shot_child_run(*command)
    assert result.decision is StartOutcome.PROCEED
    assert result.run_status is RunStatus.RUNNING
    assert result.parent_link is not None
    assert result.parent_link.inserted is True
    assert result.parent_link.session_status == ""
    assert result.started.session_status == ""
    assert result.stopped is None
    parent_records = await all_run_records(store, parent.run_id)
    assert same_record(parent_records[-1], command.parent_link)
    meta = await store.load_run(command.run.run_id)
    assert meta.parent_run_id == parent.run_id
    assert meta.session_id == ""


async def test_one_shot_child_of_a_missing_parent_is_run_not_found(store: Store) -> None:
    ghost = RunStart(run_id=uid("ghost"), agent_id="agent-a", started_at=ms(0))
    command = one_shot_child(ghost)
    await refused(ErrorCode.RUN_NOT_FOUND, store.start_one_shot_child_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))


async def test_one_shot_child_of_a_session_parent_is_run_session_mismatch(store: Store) -> None:
    _, parent = await session_with_root(store)
    command = one_shot_child(parent)
    await refused(ErrorCode.RUN_SESSION_MISMATCH, store.start_one_shot_child_run(*command))
    assert len(await all_run_records(store, parent.run_id)) == 1


async def test_one_shot_child_link_agent_mismatch_is_record_owner_mismatch(store: Store) -> None:
    parent = await running_one_shot(store)
    command = one_shot_child(parent, link_agent_id="agent-impostor")
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, store.start_one_shot_child_run(*command))
    assert len(await all_run_records(store, parent.run_id)) == 1


@pytest.mark.parametrize("how", CLOSINGS)
async def test_new_one_shot_child_of_a_closed_parent_is_run_not_active(store: Store, how: str) -> None:
    parent = await running_one_shot(store)
    await _close(store, parent, how)
    command = one_shot_child(parent)
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.start_one_shot_child_run(*command))
    assert len(await all_run_records(store, parent.run_id)) == 2
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))


async def test_exact_one_shot_child_retry_after_the_parent_closed_succeeds(store: Store) -> None:
    parent = await running_one_shot(store)
    command = one_shot_child(parent)
    first = await store.start_one_shot_child_run(*command)
    await store.record_run_terminal(terminal(parent, RunStatus.COMPLETED))

    again = await store.start_one_shot_child_run(*command)
    assert again.decision is StartOutcome.PROCEED
    assert again.run_status is RunStatus.RUNNING
    assert again.started.record_id == first.started.record_id
    assert again.started.inserted is False
    assert again.parent_link is not None
    assert first.parent_link is not None
    assert again.parent_link.record_id == first.parent_link.record_id
    assert again.parent_link.inserted is False
    # ...but a modified retry is not an exact one.
    modified = one_shot_child(parent, run_id=command.run.run_id, link_key="link-other")
    await refused(ErrorCode.RUN_CONFLICT, store.start_one_shot_child_run(*modified))


async def test_one_shot_child_link_in_a_session_is_record_owner_mismatch(store: Store) -> None:
    session_id = await open_session(store)
    parent = await running_one_shot(store)
    command = one_shot_child(parent)
    command = command._replace(parent_link=changed(command.parent_link, session_id=session_id))
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, store.start_one_shot_child_run(*command))


async def test_child_start_in_an_ended_session_with_a_closed_parent_is_run_not_active(
    store: Store,
) -> None:
    # §6.3 order: the parent checks (step 5) come before the decision (step 6), so an ended
    # session does not turn a refused new child into a `stop` start.
    session_id, parent = await session_with_root(store)
    await _close(store, parent, "completed")
    await store.end_session(session_id, parent.started_at)
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.start_child_run(*child_start(session_id, parent)))
