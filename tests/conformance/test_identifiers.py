"""Identifiers (§2: byte-for-byte, case-sensitive, never normalised; `""` = absent) as arguments
of the read and session operations."""

from __future__ import annotations

import unicodedata
from collections.abc import Awaitable, Callable

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    all_run_records,
    ms,
    open_session,
    ordinary,
    refused,
    running_root,
    session_with_root,
    uid,
)

# Reading: `""` means absent, and an operation whose required id is absent fails validation
# (§6.1 step 1, INVALID_ARGUMENT) rather than looking up an empty id (*_NOT_FOUND).
ABSENT_IDS: dict[str, Callable[[Store], Awaitable[object]]] = {
    "EndSession": lambda store: store.end_session("", ms(0)),
    "LoadSessionStatus": lambda store: store.load_session_status(""),
    "PurgeSession": lambda store: store.purge_session(""),
    "ListSessionRunRecords": lambda store: store.list_session_run_records("", "", 10),
    "ListRunsBySession": lambda store: store.list_runs_by_session("", []),
    "LoadRun": lambda store: store.load_run(""),
    "LoadRunSuspension": lambda store: store.load_run_suspension(""),
    "ListRunRecords": lambda store: store.list_run_records("", "", 10),
}


@pytest.mark.parametrize("operation", list(ABSENT_IDS), ids=list(ABSENT_IDS))
async def test_absent_id_is_invalid_argument(store: Store, operation: str) -> None:
    await refused(ErrorCode.INVALID_ARGUMENT, ABSENT_IDS[operation](store))


async def test_run_ids_are_case_sensitive_and_never_normalised(store: Store) -> None:
    session_id = await open_session(store)
    base = uid("Ejecución")
    nfc, nfd = unicodedata.normalize("NFC", base), unicodedata.normalize("NFD", base)
    assert nfc != nfd
    first = await running_root(store, session_id, run_id=nfc)
    for other in (nfd, nfc.upper(), nfc.lower()):
        await refused(ErrorCode.RUN_NOT_FOUND, store.load_run(other))
    # The variants are other runs, free to start.
    second = await running_root(store, session_id, run_id=nfd)
    await store.append_run_record(ordinary(second, "only-here"))
    assert [r.event_key for r in await all_run_records(store, first.run_id)] == ["started"]
    assert len(await store.list_runs_by_session(session_id, [])) == 2


async def test_event_keys_are_case_sensitive(store: Store) -> None:
    _, run = await session_with_root(store)
    assert (await store.append_run_record(ordinary(run, "Step"))).inserted is True
    assert (await store.append_run_record(ordinary(run, "step"))).inserted is True
