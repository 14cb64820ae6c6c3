"""Strict decoding of every lifecycle payload (§4, §12 "Strict decoding of each lifecycle payload,
with no state change on rejection"), through every operation that carries one."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import Failure, encode_run_completed, encode_run_started
from quipu.contracts.store import CancellationReason, Record, RunStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    RootStart,
    all_run_records,
    changed,
    child_start,
    intent,
    open_session,
    refused,
    root_start,
    run_start,
    running_root,
    session_with_root,
    snapshot,
    started_record,
    stopped_record,
    suspension,
    terminal,
)

LABELS = {"team": "a"}
FAILURE = Failure(message="upstream said no", kind="provider_error", retryable=True, http_status=503)


@dataclass
class Case:
    """One operation carrying one lifecycle payload, ready to send with any payload bytes."""

    good: bytes
    send: Callable[[bytes], Awaitable[object]]
    runs: list[str]
    sessions: list[str]


async def _run_started(store: Store) -> Case:
    session_id = await open_session(store)
    command = root_start(session_id, labels=LABELS)

    def send(payload: bytes) -> Awaitable[object]:
        return store.start_root_run(command.run, changed(command.started, payload=payload), command.stopped)

    return Case(command.started.payload, send, [command.run.run_id], [session_id])


async def _stopped(store: Store) -> Case:
    # Validated although the session is active and `stopped` would not be written (lead's reading).
    session_id = await open_session(store)
    command = root_start(session_id, labels=LABELS)

    def send(payload: bytes) -> Awaitable[object]:
        return store.start_root_run(command.run, command.started, changed(command.stopped, payload=payload))

    return Case(command.stopped.payload, send, [command.run.run_id], [session_id])


async def _child_run_linked(store: Store) -> Case:
    session_id, parent = await session_with_root(store)
    command = child_start(session_id, parent, labels=LABELS)

    def send(payload: bytes) -> Awaitable[object]:
        return store.start_child_run(
            command.run,
            changed(command.parent_link, payload=payload),
            command.started,
            command.stopped,
        )

    return Case(command.parent_link.payload, send, [parent.run_id, command.run.run_id], [session_id])


async def _cancellation_intent(store: Store) -> Case:
    session_id, run = await session_with_root(store, labels=LABELS)
    record = intent(run, CancellationReason.USER_REQUESTED)

    def send(payload: bytes) -> Awaitable[object]:
        return store.record_run_cancellation(changed(record, payload=payload))

    return Case(record.payload, send, [run.run_id], [session_id])


async def _run_suspended(store: Store) -> Case:
    session_id, run = await session_with_root(store, labels=LABELS)
    checkpoint, record = suspension(run, required_tools=["approve", "sign"], pending_count=2)

    def send(payload: bytes) -> Awaitable[object]:
        return store.record_run_suspension(checkpoint, changed(record, payload=payload))

    return Case(record.payload, send, [run.run_id], [session_id])


async def _run_completed(store: Store) -> Case:
    session_id, run = await session_with_root(store, labels=LABELS)
    record = terminal(run, RunStatus.FAILED, failure=FAILURE)

    def send(payload: bytes) -> Awaitable[object]:
        return store.record_run_terminal(changed(record, payload=payload))

    return Case(record.payload, send, [run.run_id], [session_id])


CASES: dict[str, Callable[[Store], Awaitable[Case]]] = {
    "run_started": _run_started,
    "run_completed_stopped": _stopped,
    "child_run_linked": _child_run_linked,
    "cancellation_intent": _cancellation_intent,
    "run_suspended": _run_suspended,
    "run_completed_terminal": _run_completed,
}

# --- mutations of a valid payload -----------------------------------------------------------------


def _first(good: bytes) -> tuple[str, Any, dict[str, Any]]:
    decoded: dict[str, Any] = json.loads(good)
    key, value = next(iter(decoded.items()))
    return key, value, decoded


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _in_first_string(good: bytes, raw: bytes) -> bytes:
    """Insert raw bytes at the start of the first string value."""
    at = good.index(b'":"') + 3
    return good[:at] + raw + good[at:]


def _duplicate_first_key(good: bytes) -> bytes:
    key, value, _ = _first(good)
    return good[:-1] + b"," + _dump({key: value})[1:-1] + b"}"


def _recase_first_key(good: bytes) -> bytes:
    key, _, _ = _first(good)
    recased = key[0].upper() + key[1:]
    return good.replace(f'"{key}"'.encode(), f'"{recased}"'.encode(), 1)


def _drop_first_key(good: bytes) -> bytes:
    key, _, decoded = _first(good)
    return _dump({k: v for k, v in decoded.items() if k != key})


def _null_first_value(good: bytes) -> bytes:
    key, _, decoded = _first(good)
    return _dump({**decoded, key: None})


MUTATIONS: dict[str, Callable[[bytes], bytes]] = {
    # Rule 1: valid UTF-8 only.
    "stray_byte": lambda g: _in_first_string(g, b"\xff"),
    "stray_continuation_byte": lambda g: _in_first_string(g, b"\x80"),
    "truncated_sequence": lambda g: _in_first_string(g, b"\xe2\x82"),
    "overlong_sequence": lambda g: _in_first_string(g, b"\xc0\xaf"),
    "encoded_surrogate": lambda g: _in_first_string(g, b"\xed\xa0\x80"),
    "above_u10ffff": lambda g: _in_first_string(g, b"\xf4\x90\x80\x80"),
    "escaped_lone_high_surrogate": lambda g: _in_first_string(g, b"\\ud800"),
    "escaped_lone_low_surrogate": lambda g: _in_first_string(g, b"\\udfff"),
    # Rule 2: exactly one JSON value, an object, only whitespace around it.
    "null": lambda g: b"null",
    "array": lambda g: b"[" + g + b"]",
    "trailing_garbage": lambda g: g + b"x",
    "second_value": lambda g: g + b" {}",
    "truncated_json": lambda g: g[:-1],
    # Rule 3: exactly the listed keys; null is no key's value.
    "duplicate_key": _duplicate_first_key,
    "differently_cased_key": _recase_first_key,
    "unknown_key": lambda g: g[:-1] + b',"extra":"x"}',
    "missing_key": _drop_first_key,
    "null_value": _null_first_value,
}


@pytest.mark.parametrize("mutation", list(MUTATIONS), ids=list(MUTATIONS))
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
async def test_malformed_lifecycle_payload_is_invalid_argument_and_changes_nothing(
    store: Store, case: str, mutation: str
) -> None:
    prepared = await CASES[case](store)
    bad = MUTATIONS[mutation](prepared.good)
    assert bad != prepared.good
    before = await snapshot(store, runs=prepared.runs, sessions=prepared.sessions)
    await refused(ErrorCode.INVALID_ARGUMENT, prepared.send(bad))
    assert await snapshot(store, runs=prepared.runs, sessions=prepared.sessions) == before
    # Nothing was reserved either: the valid command is then accepted as a first write.
    await prepared.send(prepared.good)
    assert await snapshot(store, runs=prepared.runs, sessions=prepared.sessions) != before


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
async def test_whitespace_around_the_object_is_accepted_and_kept(store: Store, case: str) -> None:
    prepared = await CASES[case](store)
    padded = b" \n\t" + prepared.good + b"\r\n "
    await prepared.send(padded)
    stored = [
        record
        for run_id in prepared.runs
        for record in await all_run_records(store, run_id)
        if record.payload == padded
    ]
    if case != "run_completed_stopped":  # the unwritten alternative is never a record
        assert len(stored) == 1


# --- integers are integer literals ----------------------------------------------------------------


@pytest.mark.parametrize("literal", [b"2.0", b"2e0", b"2E+0", b"-1", b'"2"', b"true", b"null"])
async def test_pending_count_must_be_a_non_negative_integer_literal(store: Store, literal: bytes) -> None:
    prepared = await _run_suspended(store)
    bad = prepared.good.replace(b'"pending_count":2', b'"pending_count":' + literal)
    assert bad != prepared.good
    before = await snapshot(store, runs=prepared.runs, sessions=prepared.sessions)
    await refused(ErrorCode.INVALID_ARGUMENT, prepared.send(bad))
    assert await snapshot(store, runs=prepared.runs, sessions=prepared.sessions) == before


@pytest.mark.parametrize("literal", [b"503.0", b"5.03e2"])
async def test_failure_http_status_must_be_an_integer_literal(store: Store, literal: bytes) -> None:
    prepared = await _run_completed(store)
    bad = prepared.good.replace(b'"http_status":503', b'"http_status":' + literal)
    assert bad != prepared.good
    before = await snapshot(store, runs=prepared.runs, sessions=prepared.sessions)
    await refused(ErrorCode.INVALID_ARGUMENT, prepared.send(bad))
    assert await snapshot(store, runs=prepared.runs, sessions=prepared.sessions) == before


# --- nested objects and shape rules ---------------------------------------------------------------

TERMINAL_SHAPES: dict[str, bytes] = {
    "failure_unknown_key": b'{"status":"failed","phase":"failed","failure":{"message":"m",'
    b'"kind":"k","retryable":false,"extra":1},"labels":{"team":"a"}}',
    "failure_without_retryable": b'{"status":"failed","phase":"failed","failure":{"message":"m",'
    b'"kind":"k"},"labels":{"team":"a"}}',
    "failure_empty_message": b'{"status":"failed","phase":"failed","failure":{"message":"",'
    b'"kind":"k","retryable":false},"labels":{"team":"a"}}',
    "failure_cased_key": b'{"status":"failed","phase":"failed","failure":{"Message":"m",'
    b'"kind":"k","retryable":false},"labels":{"team":"a"}}',
    "failed_without_failure": b'{"status":"failed","phase":"failed","labels":{"team":"a"}}',
    "success_with_failure": b'{"status":"success","phase":"completed","failure":{"message":"m",'
    b'"kind":"k","retryable":false},"labels":{"team":"a"}}',
    "success_with_cancellation": b'{"status":"success","phase":"completed",'
    b'"cancellation":{"reason":"engine_canceled"},"labels":{"team":"a"}}',
    "canceled_without_cancellation": b'{"status":"canceled","phase":"canceled","labels":{"team":"a"}}',
    "canceled_empty_reason": b'{"status":"canceled","phase":"canceled","cancellation":'
    b'{"reason":""},"labels":{"team":"a"}}',
    "cancellation_unknown_key": b'{"status":"canceled","phase":"canceled","cancellation":'
    b'{"reason":"engine_canceled","by":"x"},"labels":{"team":"a"}}',
    "phase_not_matching_status": b'{"status":"success","phase":"canceled","labels":{"team":"a"}}',
    "status_completed": b'{"status":"completed","phase":"completed","labels":{"team":"a"}}',
    "labels_value_not_string": b'{"status":"success","phase":"completed","labels":{"team":1}}',
}


@pytest.mark.parametrize("shape", list(TERMINAL_SHAPES), ids=list(TERMINAL_SHAPES))
async def test_run_completed_shape_rules(store: Store, shape: str) -> None:
    prepared = await _run_completed(store)
    before = await snapshot(store, runs=prepared.runs, sessions=prepared.sessions)
    await refused(ErrorCode.INVALID_ARGUMENT, prepared.send(TERMINAL_SHAPES[shape]))
    assert await snapshot(store, runs=prepared.runs, sessions=prepared.sessions) == before


@pytest.mark.parametrize(
    "payload",
    [
        b'{"suspension_id":"susp-1","version":"v1","pending_count":2,"required_tools":"approve"}',
        b'{"suspension_id":"susp-1","version":"v1","pending_count":2,"required_tools":[1]}',
        b'{"suspension_id":"susp-1","version":"v1","pending_count":2,"required_tools":[null]}',
        b'{"suspension_id":"susp-1","version":1,"pending_count":2,"required_tools":[]}',
        b'{"suspension_id":"susp-1","version":"v1","pending_count":2}',
    ],
    ids=["tools_not_array", "tool_not_string", "tool_null", "version_not_string", "no_tools"],
)
async def test_run_suspended_shape_rules(store: Store, payload: bytes) -> None:
    prepared = await _run_suspended(store)
    before = await snapshot(store, runs=prepared.runs, sessions=prepared.sessions)
    await refused(ErrorCode.INVALID_ARGUMENT, prepared.send(payload))
    assert await snapshot(store, runs=prepared.runs, sessions=prepared.sessions) == before


@pytest.mark.parametrize("reason", [b'"canceled"', b'"User_Requested"', b'""', b"1"])
async def test_cancellation_reason_must_be_one_of_the_three(store: Store, reason: bytes) -> None:
    prepared = await _cancellation_intent(store)
    before = await snapshot(store, runs=prepared.runs, sessions=prepared.sessions)
    await refused(ErrorCode.INVALID_ARGUMENT, prepared.send(b'{"reason":' + reason + b"}"))
    assert await snapshot(store, runs=prepared.runs, sessions=prepared.sessions) == before


# --- rule 4: no Unicode normalisation -------------------------------------------------------------


def _nfc_nfd(text: str) -> tuple[str, str]:
    nfc, nfd = unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)
    assert nfc != nfd
    return nfc, nfd


async def test_run_started_labels_are_not_normalised(store: Store) -> None:
    session_id = await open_session(store)
    nfc, nfd = _nfc_nfd("café")
    run = run_start(session_id=session_id, labels={"dish": nfc})
    payload = encode_run_started(changed(run, labels={"dish": nfd}))
    command = RootStart(run, started_record(run, payload=payload), stopped_record(run))
    await refused(ErrorCode.INVALID_ARGUMENT, store.start_root_run(*command))
    await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(run.run_id))


async def test_run_completed_labels_are_not_normalised(store: Store) -> None:
    session_id = await open_session(store)
    nfc, nfd = _nfc_nfd("Ångström")
    run = await running_root(store, session_id, labels={nfc: "1"})
    record: Record = terminal(
        run, RunStatus.COMPLETED, payload=encode_run_completed(RunStatus.COMPLETED, labels={nfd: "1"})
    )
    await refused(ErrorCode.INVALID_ARGUMENT, store.record_run_terminal(record))
    assert (await store.load_run(run.run_id)).status is RunStatus.RUNNING
