"""Root and one-shot starts (§6.3, §12 "Starts of each kind"): proceed, stop under an ended
session, exact retries (also after close), RUN_CONFLICT vs EVENT_CONFLICT, start validation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import encode_run_completed, encode_run_started
from quipu.contracts.store import (
    CancellationReason,
    LifecycleType,
    RunStatus,
    SessionStatus,
    StartOutcome,
)
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    STATE_CHANGE_GAP,
    RootStart,
    all_run_records,
    all_session_records,
    changed,
    complete,
    ended_session,
    keys,
    ms,
    one_shot,
    open_session,
    refused,
    root_start,
    run_start,
    running_one_shot,
    same_record,
    session_with_root,
    snapshot,
    started_record,
    stopped_record,
    sub_ms,
    uid,
)

LABELS = {"team": "search", "tier": "gold"}


# --- proceed and stop -----------------------------------------------------------------------------


async def test_root_start_in_an_active_session_proceeds(store: Store) -> None:
    session_id = await open_session(store)
    command = root_start(session_id, labels=LABELS, started_at=ms(30))
    result = await store.start_root_run(*command)

    assert result.decision is StartOutcome.PROCEED
    assert result.run_status is RunStatus.RUNNING
    assert result.parent_link is None
    assert result.stopped is None
    assert result.started.inserted is True
    assert result.started.record_id == "1"  # §3: decimal per-run sequence from "1"
    assert result.started.session_status == SessionStatus.ACTIVE.value

    meta = await store.load_run(command.run.run_id)
    assert meta.run_id == command.run.run_id
    assert meta.agent_id == command.run.agent_id
    assert meta.session_id == session_id
    assert meta.parent_run_id == ""
    assert meta.started_at == ms(30)
    assert meta.labels == LABELS
    assert meta.status is RunStatus.RUNNING
    assert meta.start_outcome is StartOutcome.PROCEED
    assert meta.successor_run_id == ""
    assert meta.cancellation_reason == ""
    assert meta.updated_at.microsecond % 1000 == 0  # store clock truncated to the millisecond

    records = await all_run_records(store, command.run.run_id)
    assert len(records) == 1
    assert records[0].id == result.started.record_id
    assert same_record(records[0], command.started)
    # The unwritten `stopped` alternative is not a record.
    assert keys(await all_session_records(store, session_id)) == [(command.run.run_id, "started")]


async def test_root_start_in_an_ended_session_stops_without_an_intent(store: Store) -> None:
    session_id = await ended_session(store)
    command = root_start(session_id, labels=LABELS)
    result = await store.start_root_run(*command)

    assert result.decision is StartOutcome.STOP
    assert result.run_status is RunStatus.CANCELED
    assert result.started.inserted is True
    assert result.stopped is not None
    assert result.stopped.inserted is True
    assert result.stopped.session_status == SessionStatus.ENDED.value
    assert result.started.record_id != result.stopped.record_id

    meta = await store.load_run(command.run.run_id)
    assert meta.status is RunStatus.CANCELED
    assert meta.start_outcome is StartOutcome.STOP
    assert meta.cancellation_reason == CancellationReason.SESSION_ENDED.value

    records = await all_run_records(store, command.run.run_id)
    assert [record.type for record in records] == [
        LifecycleType.RUN_STARTED.value,
        LifecycleType.RUN_COMPLETED.value,
    ]
    assert same_record(records[0], command.started)
    assert same_record(records[1], command.stopped)
    assert [record.id for record in records] == [
        result.started.record_id,
        result.stopped.record_id,
    ]
    assert LifecycleType.CANCELLATION_INTENT.value not in {record.type for record in records}


async def test_one_shot_start_proceeds_without_a_session(store: Store) -> None:
    command = one_shot(labels=LABELS)
    result = await store.start_one_shot_run(*command)
    assert result.decision is StartOutcome.PROCEED
    assert result.run_status is RunStatus.RUNNING
    assert result.started.inserted is True
    assert result.started.session_status == ""
    assert result.parent_link is None
    assert result.stopped is None
    meta = await store.load_run(command.run.run_id)
    assert meta.session_id == ""
    assert meta.start_outcome is StartOutcome.PROCEED
    records = await all_run_records(store, command.run.run_id)
    assert len(records) == 1
    assert same_record(records[0], command.started)


async def test_started_payload_equality_is_semantic_and_bytes_are_kept(store: Store) -> None:
    # Lead's reading: `run_started` must equal the RunStart in decoded values, not canonical
    # bytes; the store keeps and returns the received bytes (§4: it never re-encodes).
    session_id = await open_session(store)
    run = run_start(session_id=session_id, labels={"b": "2", "a": "1"})
    payload = b' \n{ "labels" : { "b":"2", "a":"1" } }\t'
    command = RootStart(run, started_record(run, payload=payload), stopped_record(run))
    assert (await store.start_root_run(*command)).started.inserted is True
    [stored] = await all_run_records(store, run.run_id)
    assert stored.payload == payload


async def test_explicit_empty_labels_equal_absent_labels(store: Store) -> None:
    # §2: labels absent equals {}; the started payload may state them explicitly.
    session_id = await open_session(store)
    run = run_start(session_id=session_id)
    command = RootStart(run, started_record(run, payload=b'{"labels":{}}'), stopped_record(run))
    assert (await store.start_root_run(*command)).started.inserted is True


# --- exact retries --------------------------------------------------------------------------------


async def test_exact_retry_of_a_running_start_returns_the_original_result(store: Store) -> None:
    session_id = await open_session(store)
    command = root_start(session_id, labels=LABELS)
    first = await store.start_root_run(*command)
    meta = await store.load_run(command.run.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)

    again = await store.start_root_run(*command)
    assert again.decision is StartOutcome.PROCEED
    assert again.run_status is RunStatus.RUNNING
    assert again.started.record_id == first.started.record_id
    assert again.started.inserted is False
    assert again.stopped is None
    assert await store.load_run(command.run.run_id) == meta  # updated_at kept
    assert len(await all_run_records(store, command.run.run_id)) == 1


async def test_exact_retry_after_close_reports_original_decision_and_current_status(
    store: Store,
) -> None:
    session_id = await open_session(store)
    command = root_start(session_id)
    first = await store.start_root_run(*command)
    await complete(store, command.run)

    again = await store.start_root_run(*command)
    assert again.decision is StartOutcome.PROCEED
    assert again.run_status is RunStatus.COMPLETED
    assert again.started.record_id == first.started.record_id
    assert again.started.inserted is False


async def test_exact_retry_after_the_session_ended_still_proceeds(store: Store) -> None:
    session_id = await open_session(store)
    command = root_start(session_id)
    first = await store.start_root_run(*command)
    await store.end_session(session_id, ms(40))

    again = await store.start_root_run(*command)
    assert again.decision is StartOutcome.PROCEED  # the original decision, not a new one
    assert again.run_status is RunStatus.RUNNING
    assert again.stopped is None
    assert again.started.record_id == first.started.record_id
    assert again.started.inserted is False
    assert len(await all_run_records(store, command.run.run_id)) == 1
    assert (await store.load_run(command.run.run_id)).start_outcome is StartOutcome.PROCEED


async def test_exact_retry_of_a_stop_start_returns_both_original_ids(store: Store) -> None:
    session_id = await ended_session(store)
    command = root_start(session_id)
    first = await store.start_root_run(*command)
    assert first.stopped is not None

    again = await store.start_root_run(*command)
    assert again.decision is StartOutcome.STOP
    assert again.run_status is RunStatus.CANCELED
    assert again.started.record_id == first.started.record_id
    assert again.started.inserted is False
    assert again.stopped is not None
    assert again.stopped.record_id == first.stopped.record_id
    assert again.stopped.inserted is False
    assert len(await all_run_records(store, command.run.run_id)) == 2


async def test_exact_retry_of_a_one_shot_start_after_close(store: Store) -> None:
    command = one_shot()
    first = await store.start_one_shot_run(*command)
    await complete(store, command.run)
    again = await store.start_one_shot_run(*command)
    assert again.decision is StartOutcome.PROCEED
    assert again.run_status is RunStatus.COMPLETED
    assert again.started.record_id == first.started.record_id
    assert again.started.inserted is False


# --- conflicts ------------------------------------------------------------------------------------

Variant = Callable[[str, str], RootStart]


def _base(session_id: str, run_id: str) -> RootStart:
    return root_start(session_id, run_id=run_id, labels=LABELS, started_at=ms(100))


RUN_CONFLICTS: dict[str, Variant] = {
    "other_agent": lambda s, r: root_start(
        s, run_id=r, agent_id="agent-z", labels=LABELS, started_at=ms(100)
    ),
    "other_labels": lambda s, r: root_start(s, run_id=r, labels={"team": "search"}, started_at=ms(100)),
    # §6.3: "A later started_at is a conflict too."
    "later_started_at": lambda s, r: root_start(s, run_id=r, labels=LABELS, started_at=ms(101)),
    "earlier_started_at": lambda s, r: root_start(s, run_id=r, labels=LABELS, started_at=ms(99)),
    "other_started_key": lambda s, r: root_start(
        s, run_id=r, labels=LABELS, started_at=ms(100), started_key="started-2"
    ),
    "other_stopped_key": lambda s, r: root_start(
        s, run_id=r, labels=LABELS, started_at=ms(100), stopped_key="stopped-2"
    ),
    # §6.3 order: "Run exists → exact-retry comparison" comes before "Session missing", so a
    # start naming an unknown session for an existing run id is RUN_CONFLICT.
    "other_session": lambda s, r: root_start(uid("session"), run_id=r, labels=LABELS, started_at=ms(100)),
}


@pytest.mark.parametrize("variant", list(RUN_CONFLICTS), ids=list(RUN_CONFLICTS))
async def test_start_differing_in_identity_or_record_key_is_run_conflict(store: Store, variant: str) -> None:
    session_id = await open_session(store)
    run_id = uid("run")
    await store.start_root_run(*_base(session_id, run_id))
    before = await snapshot(store, runs=[run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_CONFLICT, store.start_root_run(*RUN_CONFLICTS[variant](session_id, run_id)))
    assert await snapshot(store, runs=[run_id], sessions=[session_id]) == before


EVENT_CONFLICTS: dict[str, Callable[[RootStart], RootStart]] = {
    "started_turn_id": lambda c: c._replace(started=changed(c.started, turn_id="turn-9")),
    "stopped_turn_id": lambda c: c._replace(stopped=changed(c.stopped, turn_id="turn-9")),
    # Semantically the same payload, other bytes: records compare payload bytes (§3).
    "started_payload_bytes": lambda c: c._replace(
        started=changed(c.started, payload=b" " + encode_run_started(c.run))
    ),
    "stopped_payload_bytes": lambda c: c._replace(
        stopped=changed(
            c.stopped,
            payload=encode_run_completed(
                RunStatus.CANCELED, labels=c.run.labels, cancellation_reason="session_ended"
            )
            + b"\n",
        )
    ),
}


@pytest.mark.parametrize("variant", list(EVENT_CONFLICTS), ids=list(EVENT_CONFLICTS))
async def test_start_with_same_key_other_record_content_is_event_conflict(store: Store, variant: str) -> None:
    session_id = await open_session(store)
    original = _base(session_id, uid("run"))
    await store.start_root_run(*original)
    before = await snapshot(store, runs=[original.run.run_id], sessions=[session_id])
    await refused(ErrorCode.EVENT_CONFLICT, store.start_root_run(*EVENT_CONFLICTS[variant](original)))
    assert await snapshot(store, runs=[original.run.run_id], sessions=[session_id]) == before


async def test_start_conflicts_persist_after_the_run_closed(store: Store) -> None:
    session_id = await open_session(store)
    original = _base(session_id, uid("run"))
    await store.start_root_run(*original)
    await complete(store, original.run)
    await refused(
        ErrorCode.RUN_CONFLICT,
        store.start_root_run(*RUN_CONFLICTS["later_started_at"](session_id, original.run.run_id)),
    )


async def test_run_id_reused_by_another_kind_of_start_is_run_conflict(store: Store) -> None:
    session_id, root = await session_with_root(store)
    await refused(
        ErrorCode.RUN_CONFLICT,
        store.start_one_shot_run(*one_shot(run_id=root.run_id, agent_id=root.agent_id)),
    )
    sessionless = await running_one_shot(store)
    await refused(
        ErrorCode.RUN_CONFLICT,
        store.start_root_run(
            *root_start(session_id, run_id=sessionless.run_id, agent_id=sessionless.agent_id)
        ),
    )


async def test_one_shot_start_differing_in_identity_is_run_conflict(store: Store) -> None:
    original = one_shot(labels=LABELS)
    await store.start_one_shot_run(*original)
    await refused(
        ErrorCode.RUN_CONFLICT,
        store.start_one_shot_run(*one_shot(run_id=original.run.run_id, labels={"x": "y"})),
    )


async def test_start_in_a_missing_session_is_session_not_found(store: Store) -> None:
    command = root_start(uid("missing"))
    await refused(ErrorCode.SESSION_NOT_FOUND, store.start_root_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))


# --- validation -----------------------------------------------------------------------------------


def _with_run(run_changes: dict[str, object]) -> Callable[[RootStart], RootStart]:
    """Change the RunStart and rebuild both records from it, so only the identity is invalid."""

    def build(command: RootStart) -> RootStart:
        run = changed(command.run, **run_changes)
        return RootStart(
            run,
            started_record(run, key=command.started.event_key),
            stopped_record(run, key=command.stopped.event_key),
        )

    return build


INVALID_STARTS: dict[str, Callable[[RootStart], RootStart]] = {
    "empty_run_id": _with_run({"run_id": ""}),
    "empty_agent_id": _with_run({"agent_id": ""}),
    "sub_millisecond_started_at": _with_run({"started_at": sub_ms(0, 500)}),
    # §3: parent_run_id is "" for roots; parent and predecessor ≠ run_id.
    "root_with_parent": _with_run({"parent_run_id": "some-parent"}),
    "predecessor_is_itself": lambda c: _with_run({"predecessor_run_id": c.run.run_id})(c),
    "started_wrong_type": lambda c: c._replace(started=changed(c.started, type="run_resumed")),
    "started_not_at_started_at": lambda c: c._replace(started=changed(c.started, timestamp=ms(1))),
    "started_payload_other_labels": lambda c: c._replace(
        started=changed(c.started, payload=b'{"labels":{"team":"other"}}')
    ),
    "started_payload_without_labels": lambda c: c._replace(started=changed(c.started, payload=b"{}")),
    "started_payload_with_parent": lambda c: c._replace(
        started=changed(c.started, payload=b'{"parent_run_id":"p","labels":{"team":"a"}}')
    ),
    "empty_started_key": lambda c: c._replace(started=changed(c.started, event_key="")),
    # Lead's reading: keys of the start's records must be pairwise distinct.
    "same_started_and_stopped_key": lambda c: c._replace(
        stopped=changed(c.stopped, event_key=c.started.event_key)
    ),
    # Lead's reading: `stopped` is validated even when the decision is proceed.
    "stopped_wrong_type": lambda c: c._replace(
        stopped=changed(c.stopped, type=LifecycleType.RUN_SUSPENDED.value)
    ),
    "stopped_not_at_started_at": lambda c: c._replace(stopped=changed(c.stopped, timestamp=ms(5))),
    "stopped_user_requested": lambda c: c._replace(
        stopped=changed(
            c.stopped,
            payload=encode_run_completed(
                RunStatus.CANCELED, labels=c.run.labels, cancellation_reason="user_requested"
            ),
        )
    ),
    "stopped_completed": lambda c: c._replace(
        stopped=changed(c.stopped, payload=encode_run_completed(RunStatus.COMPLETED, c.run.labels))
    ),
    "stopped_other_labels": lambda c: c._replace(
        stopped=changed(
            c.stopped,
            payload=encode_run_completed(
                RunStatus.CANCELED, labels={"x": "y"}, cancellation_reason="session_ended"
            ),
        )
    ),
    "stopped_empty_payload": lambda c: c._replace(stopped=changed(c.stopped, payload=b"")),
}


@pytest.mark.parametrize("variant", list(INVALID_STARTS), ids=list(INVALID_STARTS))
async def test_invalid_start_is_invalid_argument_and_writes_nothing(store: Store, variant: str) -> None:
    session_id = await open_session(store)
    command = INVALID_STARTS[variant](root_start(session_id, labels={"team": "a"}))
    await refused(ErrorCode.INVALID_ARGUMENT, store.start_root_run(*command))
    if command.run.run_id:
        await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))
    assert await all_session_records(store, session_id) == []
    assert await store.list_runs_by_session(session_id, []) == []


async def test_root_start_without_session_is_invalid(store: Store) -> None:
    await refused(ErrorCode.INVALID_ARGUMENT, store.start_root_run(*root_start("")))


@pytest.mark.parametrize(
    "field", ["session_id", "predecessor_run_id", "parent_run_id"], ids=lambda f: f"with_{f}"
)
async def test_one_shot_start_with_session_predecessor_or_parent_is_invalid(store: Store, field: str) -> None:
    session_id, predecessor = await session_with_root(store)
    run = {
        "session_id": run_start(session_id=session_id),
        "predecessor_run_id": run_start(predecessor_run_id=predecessor.run_id),
        "parent_run_id": run_start(parent_run_id=predecessor.run_id),
    }[field]
    await refused(ErrorCode.INVALID_ARGUMENT, store.start_one_shot_run(run, started_record(run)))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(run.run_id))


OWNER_MISMATCHES: dict[str, Callable[[RootStart], RootStart]] = {
    "started_run_id": lambda c: c._replace(started=changed(c.started, run_id=uid("run"))),
    "started_agent_id": lambda c: c._replace(started=changed(c.started, agent_id="agent-z")),
    "started_session_id": lambda c: c._replace(started=changed(c.started, session_id=uid("session"))),
    "stopped_run_id": lambda c: c._replace(stopped=changed(c.stopped, run_id=uid("run"))),
    "stopped_agent_id": lambda c: c._replace(stopped=changed(c.stopped, agent_id="agent-z")),
    "stopped_session_id": lambda c: c._replace(stopped=changed(c.stopped, session_id=uid("session"))),
}


@pytest.mark.parametrize("variant", list(OWNER_MISMATCHES), ids=list(OWNER_MISMATCHES))
async def test_start_record_owned_by_another_run_is_record_owner_mismatch(store: Store, variant: str) -> None:
    session_id = await open_session(store)
    command = OWNER_MISMATCHES[variant](root_start(session_id))
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, store.start_root_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))
    assert await all_session_records(store, session_id) == []


async def test_one_shot_started_record_with_a_session_is_record_owner_mismatch(
    store: Store,
) -> None:
    session_id = await open_session(store)
    command = one_shot()
    command = command._replace(started=changed(command.started, session_id=session_id))
    await refused(ErrorCode.RECORD_OWNER_MISMATCH, store.start_one_shot_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(command.run.run_id))
