"""RecordRunTerminal (§6.7; §12 "terminal: exact retries, updated_at, conflicts")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import Failure, encode_run_completed
from quipu.contracts.store import CancellationReason, Record, RunStart, RunStatus, SessionStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    STATE_CHANGE_GAP,
    all_run_records,
    ended_session,
    ms,
    ordinary,
    refused,
    root_start,
    running_one_shot,
    running_root,
    same_record,
    session_with_root,
    snapshot,
    suspension,
    terminal,
)

LABELS = {"team": "a", "env": "prod"}


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (RunStatus.COMPLETED, None),
        (RunStatus.FAILED, None),
        (RunStatus.CANCELED, CancellationReason.ENGINE_CANCELED),
    ],
    ids=["completed", "failed", "canceled"],
)
async def test_terminal_closes_the_run_with_its_record(
    store: Store, status: RunStatus, reason: CancellationReason | None
) -> None:
    _, run = await session_with_root(store, labels=LABELS)
    started = await store.load_run(run.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)

    record = terminal(run, status, reason=reason)
    result = await store.record_run_terminal(record)
    assert result.inserted is True
    assert result.session_status == SessionStatus.ACTIVE.value
    meta = await store.load_run(run.run_id)
    assert meta.status is status
    assert meta.updated_at > started.updated_at
    assert meta.cancellation_reason == ""
    stored = (await all_run_records(store, run.run_id))[-1]
    assert stored.id == result.record_id
    assert same_record(stored, record)


async def test_failure_with_every_optional_field(store: Store) -> None:
    run = await running_one_shot(store)
    failure = Failure(
        message="rate limited",
        kind="provider_error",
        retryable=True,
        debug_message="429 from upstream",
        provider="anthropic",
        operation="messages.create",
        code="rate_limit",
        http_status=429,
    )
    result = await store.record_run_terminal(terminal(run, RunStatus.FAILED, failure=failure))
    assert result.inserted is True
    assert result.session_status == ""
    assert (await store.load_run(run.run_id)).status is RunStatus.FAILED


async def test_exact_retry_returns_the_original_id_and_keeps_updated_at(store: Store) -> None:
    session_id, run = await session_with_root(store, labels=LABELS)
    record = terminal(run, RunStatus.COMPLETED)
    first = await store.record_run_terminal(record)
    meta = await store.load_run(run.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)
    await store.end_session(session_id, ms(30))
    again = await store.record_run_terminal(record)
    assert again.record_id == first.record_id
    assert again.inserted is False
    assert again.session_status == SessionStatus.ENDED.value
    assert await store.load_run(run.run_id) == meta
    assert len(await all_run_records(store, run.run_id)) == 2


CLOSED_CONFLICTS: dict[str, tuple[Callable[[RunStart], Record], ErrorCode]] = {
    "other_status": (lambda r: terminal(r, RunStatus.FAILED), ErrorCode.RUN_TERMINAL_CONFLICT),
    "other_status_same_key": (
        lambda r: terminal(r, RunStatus.FAILED, key="terminal"),
        ErrorCode.RUN_TERMINAL_CONFLICT,
    ),
    "same_status_other_key": (
        lambda r: terminal(r, RunStatus.COMPLETED, key="terminal-2"),
        ErrorCode.RUN_TERMINAL_CONFLICT,
    ),
    "same_key_other_turn_id": (
        lambda r: terminal(r, RunStatus.COMPLETED, turn_id="turn-2"),
        ErrorCode.EVENT_CONFLICT,
    ),
    "same_key_other_timestamp": (
        lambda r: terminal(r, RunStatus.COMPLETED, timestamp=ms(999)),
        ErrorCode.EVENT_CONFLICT,
    ),
    # §6.7 order: the closed-run comparison (step 2) precedes the labels check (step 3).
    "other_status_wrong_labels": (
        lambda r: terminal(r, RunStatus.FAILED, key="terminal-2", labels={"x": "y"}),
        ErrorCode.RUN_TERMINAL_CONFLICT,
    ),
}


@pytest.mark.parametrize("variant", list(CLOSED_CONFLICTS), ids=list(CLOSED_CONFLICTS))
async def test_terminal_on_a_completed_run_differing_from_the_first(store: Store, variant: str) -> None:
    session_id, run = await session_with_root(store, labels=LABELS)
    await store.record_run_terminal(terminal(run, RunStatus.COMPLETED))
    build, code = CLOSED_CONFLICTS[variant]
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(code, store.record_run_terminal(build(run)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


@pytest.mark.parametrize("key", ["suspended", "terminal"], ids=["suspension_key", "other_key"])
async def test_terminal_on_a_suspended_run_is_run_terminal_conflict(store: Store, key: str) -> None:
    # §6.7: a suspended run is closed; `suspended` counts as another status.
    session_id, run = await session_with_root(store)
    await store.record_run_suspension(*suspension(run, key="suspended"))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(
        ErrorCode.RUN_TERMINAL_CONFLICT,
        store.record_run_terminal(terminal(run, RunStatus.COMPLETED, key=key)),
    )
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_stop_start_terminal_is_its_stopped_record(store: Store) -> None:
    session_id = await ended_session(store)
    command = root_start(session_id)
    result = await store.start_root_run(*command)
    assert result.stopped is not None
    again = await store.record_run_terminal(command.stopped)
    assert again.record_id == result.stopped.record_id
    assert again.inserted is False
    await refused(
        ErrorCode.RUN_TERMINAL_CONFLICT,
        store.record_run_terminal(
            terminal(command.run, RunStatus.CANCELED, reason=CancellationReason.SESSION_ENDED)
        ),
    )
    await refused(
        ErrorCode.RUN_TERMINAL_CONFLICT,
        store.record_run_terminal(terminal(command.run, RunStatus.COMPLETED)),
    )


@pytest.mark.parametrize(
    "labels",
    [{"team": "a"}, {"team": "a", "env": "prod", "x": "y"}, {"team": "a", "env": "PROD"}, {}],
    ids=["missing_label", "extra_label", "other_value", "none"],
)
async def test_terminal_labels_must_equal_the_runs(store: Store, labels: dict[str, str]) -> None:
    session_id, run = await session_with_root(store, labels=LABELS)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(
        ErrorCode.INVALID_ARGUMENT,
        store.record_run_terminal(terminal(run, RunStatus.COMPLETED, labels=labels)),
    )
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_terminal_labels_compare_as_maps(store: Store) -> None:
    # §2: labels compare as maps; absent equals {}. Order of keys does not matter.
    session_id, run = await session_with_root(store, labels=LABELS)
    payload = b'{"status":"success","phase":"completed","labels":{"team":"a","env":"prod"}}'
    assert (await store.record_run_terminal(terminal(run, payload=payload))).inserted is True
    unlabelled = await running_root(store, session_id)
    explicit_empty = b'{"status":"success","phase":"completed","labels":{}}'
    assert (await store.record_run_terminal(terminal(unlabelled, payload=explicit_empty))).inserted


async def test_terminal_key_used_by_another_record_is_event_conflict(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.append_run_record(ordinary(run, "terminal"))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.EVENT_CONFLICT, store.record_run_terminal(terminal(run)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_run_of_an_ended_session_may_still_close(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.end_session(session_id, ms(5))
    result = await store.record_run_terminal(terminal(run, RunStatus.FAILED))
    assert result.inserted is True
    assert result.session_status == SessionStatus.ENDED.value


async def test_terminal_payload_is_kept_as_received(store: Store) -> None:
    _, run = await session_with_root(store, labels=LABELS)
    canonical = encode_run_completed(RunStatus.COMPLETED, LABELS)
    padded = b"\n" + canonical
    await store.record_run_terminal(terminal(run, payload=padded))
    assert (await all_run_records(store, run.run_id))[-1].payload == padded
