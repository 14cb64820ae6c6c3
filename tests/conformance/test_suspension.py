"""RecordRunSuspension and LoadRunSuspension (§6.6, §6.8; §12 "suspension: exact retries,
updated_at, conflicts, checkpoint bytes")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import encode_run_suspended
from quipu.contracts.store import (
    Checkpoint,
    Record,
    RunStart,
    RunStatus,
    SessionStatus,
)
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    CHECKPOINT_BYTES,
    STATE_CHANGE_GAP,
    all_run_records,
    changed,
    close_run,
    ms,
    open_session,
    ordinary,
    refused,
    running_one_shot,
    running_root,
    same_record,
    session_with_root,
    snapshot,
    stopped_root,
    suspension,
    terminal,
    uid,
)

EVERY_BYTE = bytes(range(256)) * 64  # 16 KiB, every byte value, not UTF-8


async def test_suspension_stores_checkpoint_status_and_record(store: Store) -> None:
    _, run = await session_with_root(store)
    started = await store.load_run(run.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)

    checkpoint, record = suspension(run, data=EVERY_BYTE, pending_count=3)
    result = await store.record_run_suspension(checkpoint, record)
    assert result.inserted is True
    assert result.session_status == SessionStatus.ACTIVE.value

    meta = await store.load_run(run.run_id)
    assert meta.status is RunStatus.SUSPENDED
    assert meta.updated_at > started.updated_at
    loaded = await store.load_run_suspension(run.run_id)
    assert loaded.suspension_id == checkpoint.suspension_id
    assert loaded.data == EVERY_BYTE
    stored = (await all_run_records(store, run.run_id))[-1]
    assert stored.id == result.record_id
    assert same_record(stored, record)


@pytest.mark.parametrize(
    "data",
    [CHECKPOINT_BYTES, b"\x00", b"=", b"\n\r\t ", "ñ".encode("latin-1")],
    ids=["mixed_invalid_utf8", "nul", "base64_padding_char", "whitespace", "latin1"],
)
async def test_checkpoint_bytes_come_back_byte_for_byte(store: Store, data: bytes) -> None:
    run = await running_one_shot(store)
    checkpoint, record = suspension(run, data=data)
    await store.record_run_suspension(checkpoint, record)
    assert await store.load_run_suspension(run.run_id) == Checkpoint(
        suspension_id=checkpoint.suspension_id, data=data
    )


async def test_exact_retry_returns_the_original_id_and_keeps_updated_at(store: Store) -> None:
    session_id, run = await session_with_root(store)
    checkpoint, record = suspension(run)
    first = await store.record_run_suspension(checkpoint, record)
    meta = await store.load_run(run.run_id)
    await asyncio.sleep(STATE_CHANGE_GAP)
    await store.end_session(session_id, ms(20))
    again = await store.record_run_suspension(checkpoint, record)
    assert again.record_id == first.record_id
    assert again.inserted is False
    assert again.session_status == SessionStatus.ENDED.value
    assert await store.load_run(run.run_id) == meta
    assert len(await all_run_records(store, run.run_id)) == 2


def _other_id(run: RunStart) -> tuple[Checkpoint, Record]:
    return suspension(run, suspension_id="susp-2")


def _other_bytes(run: RunStart) -> tuple[Checkpoint, Record]:
    return suspension(run, data=CHECKPOINT_BYTES + b"!")


def _other_key(run: RunStart) -> tuple[Checkpoint, Record]:
    return suspension(run, key="suspended-again")


def _same_key_other_version(run: RunStart) -> tuple[Checkpoint, Record]:
    return suspension(run, version="v2")


def _same_key_other_turn(run: RunStart) -> tuple[Checkpoint, Record]:
    return suspension(run, turn_id="turn-2")


RETRY_CONFLICTS: dict[str, tuple[Callable[[RunStart], tuple[Checkpoint, Record]], ErrorCode]] = {
    "other_checkpoint_id": (_other_id, ErrorCode.RUN_SUSPENSION_CONFLICT),
    "other_checkpoint_bytes": (_other_bytes, ErrorCode.RUN_SUSPENSION_CONFLICT),
    "other_record_key": (_other_key, ErrorCode.RUN_SUSPENSION_CONFLICT),
    "same_key_other_payload": (_same_key_other_version, ErrorCode.EVENT_CONFLICT),
    "same_key_other_turn_id": (_same_key_other_turn, ErrorCode.EVENT_CONFLICT),
}


@pytest.mark.parametrize("variant", list(RETRY_CONFLICTS), ids=list(RETRY_CONFLICTS))
async def test_suspension_of_a_suspended_run_differing_from_the_first(store: Store, variant: str) -> None:
    session_id, run = await session_with_root(store)
    await store.record_run_suspension(*suspension(run))
    build, code = RETRY_CONFLICTS[variant]
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(code, store.record_run_suspension(*build(run)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


@pytest.mark.parametrize("status", ["completed", "failed", "canceled"])
async def test_suspension_of_a_final_run_is_run_terminal_conflict(store: Store, status: str) -> None:
    session_id, run = await session_with_root(store)
    await close_run(store, run, status)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.RUN_TERMINAL_CONFLICT, store.record_run_suspension(*suspension(run)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_suspension_of_a_stop_run_is_run_terminal_conflict(store: Store) -> None:
    command = await stopped_root(store)
    await refused(ErrorCode.RUN_TERMINAL_CONFLICT, store.record_run_suspension(*suspension(command.run)))
    await refused(ErrorCode.RUN_SUSPENSION_NOT_FOUND, store.load_run_suspension(command.run.run_id))


async def test_suspension_key_used_by_another_record_is_event_conflict(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await store.append_run_record(ordinary(run, "suspended"))
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.EVENT_CONFLICT, store.record_run_suspension(*suspension(run)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


INVALID_SUSPENSIONS: dict[str, Callable[[RunStart], tuple[Checkpoint, Record]]] = {
    "payload_names_another_suspension": lambda run: (
        Checkpoint(suspension_id="susp-1", data=b"x"),
        suspension(run, suspension_id="susp-other")[1],
    ),
    "empty_checkpoint_data": lambda run: suspension(run, data=b""),
    "empty_suspension_id": lambda run: (
        Checkpoint(suspension_id="", data=b"x"),
        changed(
            suspension(run)[1],
            payload=b'{"suspension_id":"","version":"v1","pending_count":0,"required_tools":[]}',
        ),
    ),
    "negative_pending_count": lambda run: (
        Checkpoint(suspension_id="susp-1", data=b"x"),
        changed(suspension(run)[1], payload=encode_run_suspended("susp-1", "v1", -1, [])),
    ),
}


@pytest.mark.parametrize("variant", list(INVALID_SUSPENSIONS), ids=list(INVALID_SUSPENSIONS))
async def test_invalid_suspension_is_invalid_argument(store: Store, variant: str) -> None:
    session_id, run = await session_with_root(store)
    before = await snapshot(store, runs=[run.run_id], sessions=[session_id])
    await refused(ErrorCode.INVALID_ARGUMENT, store.record_run_suspension(*INVALID_SUSPENSIONS[variant](run)))
    assert await snapshot(store, runs=[run.run_id], sessions=[session_id]) == before


async def test_suspension_with_nothing_pending_is_accepted(store: Store) -> None:
    run = await running_one_shot(store)
    result = await store.record_run_suspension(*suspension(run, pending_count=0, required_tools=[]))
    assert result.inserted is True
    assert result.session_status == ""


async def test_load_run_suspension_errors(store: Store) -> None:
    session_id = await open_session(store)
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run_suspension(uid("ghost")))
    run = await running_root(store, session_id)
    await refused(ErrorCode.RUN_SUSPENSION_NOT_FOUND, store.load_run_suspension(run.run_id))
    await store.record_run_terminal(terminal(run, RunStatus.COMPLETED))
    await refused(ErrorCode.RUN_SUSPENSION_NOT_FOUND, store.load_run_suspension(run.run_id))


async def test_suspended_run_refuses_new_records_but_keeps_its_checkpoint(store: Store) -> None:
    _, run = await session_with_root(store)
    checkpoint, record = suspension(run)
    await store.record_run_suspension(checkpoint, record)
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.append_run_record(ordinary(run, "late")))
    assert await store.load_run_suspension(run.run_id) == checkpoint
