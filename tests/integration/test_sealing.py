"""Run logs sealed under the principal's data key: unreadable in MongoDB, erased by forgetting.

The runtime store and the memory store share one database and one key per principal, as in the
storage owner. Every record payload and checkpoint rests sealed; reads give the plaintext back
byte for byte while the key lives; once the principal is forgotten, every collection of the
database holds nothing readable of theirs, reads say "erased", and the contract's rules go on
(an exact retry of an erased record is a final EVENT_CONFLICT, never a retry loop).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import ERASED_PAYLOAD, Checkpoint, RunStart
from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED, TranscriptErasedError
from quipu.services.domain.transcript import build_messages_from_run_log
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.mongo_transaction import RECORDS, RUNS
from tests.conformance.builders import (
    all_run_records,
    all_session_records,
    open_session,
    ordinary,
    principals_root,
    refused,
    suspend,
)
from tests.owner_support import resting_bytes

TENANT = "t1"


def _transcript(text: str) -> bytes:
    return b'[{"role":"user","parts":[{"kind":"text","text":"' + text.encode() + b'"}]}]'


async def _run_of(store: MongoStore, session_id: str, principal_id: str) -> RunStart:
    return await principals_root(store, session_id, TENANT, principal_id)


async def _said(store: MongoStore, run: RunStart, phrase: str) -> None:
    record = ordinary(run, "said", payload=_transcript(phrase), record_type=TRANSCRIPT_MESSAGES_APPENDED)
    await store.append_run_record(record)


async def test_payloads_and_checkpoints_rest_sealed_and_read_back_exactly(
    stores: tuple[MongoStore, MongoMemoryStore],
) -> None:
    store, _ = stores
    phrase = f"my locker code is tangerine {uuid.uuid4().hex[:8]}"
    session_id = await open_session(store)
    run = await _run_of(store, session_id, "ana")
    await _said(store, run, phrase)
    checkpoint = await suspend(store, run, data=f"waiting for: {phrase}".encode())

    assert phrase.encode() not in await resting_bytes(store.database)
    [_, said, _] = await all_run_records(store, run.run_id)
    assert said.payload == _transcript(phrase)
    assert await store.load_run_suspension(run.run_id) == checkpoint
    raw = await store.database[RECORDS].find_one({"run_id": run.run_id, "event_key": "said"})
    assert raw is not None and (raw["tenant_id"], raw["principal_id"]) == (TENANT, "ana")


async def test_forgetting_the_principal_erases_their_runs_in_every_collection_only(
    stores: tuple[MongoStore, MongoMemoryStore],
) -> None:
    store, memory = stores
    phrase, other = f"tangerine {uuid.uuid4().hex[:8]}", f"lemon {uuid.uuid4().hex[:8]}"
    session_id = await open_session(store)
    run = await _run_of(store, session_id, "ana")
    await _said(store, run, phrase)
    await suspend(store, run, data=phrase.encode())
    bystander = await _run_of(store, await open_session(store), "bruno")
    await _said(store, bystander, other)

    await memory.forget_principal(TENANT, "ana")

    dump = await resting_bytes(store.database)
    assert phrase.encode() not in dump and b"tangerine" not in dump
    records = await all_run_records(store, run.run_id)
    assert [record.type for record in records] == [
        "run_started",
        TRANSCRIPT_MESSAGES_APPENDED,
        "run_suspended",
    ]
    assert {record.payload for record in records} == {ERASED_PAYLOAD}
    assert {r.payload for r in await all_session_records(store, session_id)} == {ERASED_PAYLOAD}
    assert await store.load_run_suspension(run.run_id) == Checkpoint(
        suspension_id="susp-1", data=ERASED_PAYLOAD
    )
    with pytest.raises(TranscriptErasedError):
        await build_messages_from_run_log(store, run.run_id)
    # The bystander keeps every word.
    assert (await all_run_records(store, bystander.run_id))[1].payload == _transcript(other)


async def test_after_forgetting_the_rules_go_on_without_the_words(
    stores: tuple[MongoStore, MongoMemoryStore],
) -> None:
    store, memory = stores
    session_id = await open_session(store)
    run = await _run_of(store, session_id, "ana")
    await _said(store, run, "first words")
    await memory.forget_principal(TENANT, "ana")

    # A redelivered write of an erased record cannot be compared: a final conflict, not a loop.
    said = ordinary(run, "said", payload=_transcript("first words"), record_type=TRANSCRIPT_MESSAGES_APPENDED)
    await refused(ErrorCode.EVENT_CONFLICT, store.append_run_record(said))
    # A later write (the run still runs) is sealed under a fresh key: readable, the old stay erased.
    await store.append_run_record(ordinary(run, "later", payload=b'{"n":1}'))
    payloads: dict[str, Any] = {r.event_key: r.payload for r in await all_run_records(store, run.run_id)}
    assert payloads == {"started": ERASED_PAYLOAD, "said": ERASED_PAYLOAD, "later": b'{"n":1}'}
    assert (await store.database[RUNS].find_one({"_id": run.run_id})) is not None
