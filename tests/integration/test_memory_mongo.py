"""The memory store on MongoDB: encryption at rest, crypto-shredding, indexes, and the owner's events.

- Every text (history, summaries, facts and their audit, profiles, recorded changes, index terms)
  is sealed: scanning every collection's raw BSON finds none of them.
- `forget_principal` leaves nothing of the person in any collection (their id and their words),
  and shreds their key: their old ciphertexts, put back, no longer open.
- A ciphertext moved to another document, or read with another master key, does not open.
- Every query the store sends is answered from an index.
- The owner process publishes `HistoryRecorded` (history.recorded, keyed by session) and
  `FactChanged` (memory.changes, keyed by principal) after commit, again on an exact retry.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import FactChanged, HistoryAppendResult, HistoryRecorded, Profile
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.memory.ranking import build_index_entry
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.storage_owner.keys import KEYS, parse_master_key
from quipu.services.storage_owner.mongo_memory_store import INDEXES, MongoMemoryStore
from quipu.services.storage_owner.mongo_memory_transaction import FORGOTTEN, HISTORY
from tests.conformance.memory_builders import (
    BASE,
    SteppedClock,
    ms,
    new,
    other_agent,
    record_turns,
    refused,
    remember,
    scope,
    summary,
    turn,
    turn_marks_expire_after_their_keep,
    uid,
    update,
)
from tests.owner_support import (
    CommandLog,
    Served,
    TopicReader,
    as_finds,
    client_on,
    plan_stages,
    resting_bytes,
)

Document = dict[str, Any]
Client = AsyncMongoClient[Document]


@pytest.fixture
async def store(stack: EmbeddedStack, database: str) -> AsyncIterator[MongoMemoryStore]:
    """A MongoMemoryStore with its own client on this test's database."""
    opened = await MongoMemoryStore.connect(stack.mongo_uri, database)
    yield opened
    await opened.close()


async def _fill(store: MongoMemoryStore, marker: str) -> tuple[Any, str, list[str]]:
    """Write every kind of memory for one person; every text carries `marker`. Returns the texts."""
    who = scope()
    session_id = uid("session")
    texts = [f"{marker} user", f"{marker} assistant", f"{marker} summary", f"{marker} profile"]
    first = turn(session_id, who, 0).model_copy(update={"user_text": texts[0], "assistant_text": texts[1]})
    await store.append_history_turn(first)
    await store.append_history_turn(turn(session_id, who, 1))
    await store.save_summary(summary(session_id, 2, 1, texts[2]))
    await store.save_profile(Profile(scope=who, text=texts[3], source_turns=1, updated_at=ms()))
    fact_texts = [f"{marker} fact one", f"{marker} fact two", f"{marker} fact agentb"]
    one, _ = await remember(store, who, *fact_texts[:2])
    await remember(store, other_agent(who, "agent-b"), fact_texts[2])
    await store.apply_fact_operations(who, [update(one.fact_id, f"{marker} fact reworded")], uid("key"))
    for fact in await store.list_facts(other_agent(who, "")):
        await store.upsert_index_entry(build_index_entry(fact, ms(1)))
    return who, session_id, [*texts, *fact_texts, f"{marker} fact reworded"]


async def test_every_text_is_sealed_at_rest(store: MongoMemoryStore) -> None:
    marker = f"zebra{uuid.uuid4().hex[:8]}"
    who, session_id, texts = await _fill(store, marker)

    dump = await resting_bytes(store.database)
    assert marker.encode() not in dump
    # Index terms are words of the facts: sealed too.
    assert b"reworded" not in dump and b"agentb" not in dump

    rows = await store.list_history(session_id, 0, 10)
    assert [row.text for row in rows[:2]] == texts[:2]
    assert (await store.load_summary(session_id)) is not None
    assert {f.text for f in await store.list_facts(other_agent(who, ""))} == {
        f"{marker} fact reworded",
        f"{marker} fact two",
        f"{marker} fact agentb",
    }
    assert [hit.fact.text for hit in await store.search_index(who, "reworded", 3)] == [
        f"{marker} fact reworded"
    ]


async def test_forget_leaves_nothing_of_the_person_and_shreds_their_key(store: MongoMemoryStore) -> None:
    marker = f"okapi{uuid.uuid4().hex[:8]}"
    who, session_id, _ = await _fill(store, marker)
    bystander, bystander_session, _ = await _fill(store, f"heron{uuid.uuid4().hex[:8]}")
    rows_before = [document async for document in store.database[HISTORY].find({"session_id": session_id})]
    assert rows_before

    # 4 history rows, 1 summary, 3 facts, 1 audit entry, 1 profile, 3 index entries.
    assert await store.forget_principal(who.tenant_id, who.principal_id) == 13

    dump = await resting_bytes(store.database)
    for trace in (who.principal_id, session_id, marker):
        assert trace.encode() not in dump, trace
    assert await store.database[KEYS].count_documents({}) == 1  # the bystander's key only
    assert bystander.principal_id.encode() in dump
    assert len(await store.list_history(bystander_session, 0, 10)) == 4

    # Their old ciphertexts, restored from a copy, no longer open: the key that sealed them is gone.
    await store.database[HISTORY].insert_many(rows_before)
    assert await store.list_history(session_id, 0, 10) == []
    assert await store.history_tail(session_id, 10) == []


async def test_a_ciphertext_opens_only_in_its_own_document(store: MongoMemoryStore) -> None:
    who, session_id = scope(), uid("session")
    await record_turns(store, session_id, who, 1)
    history = store.database[HISTORY]
    user = await history.find_one({"session_id": session_id, "seq": 1})
    assistant = await history.find_one({"session_id": session_id, "seq": 2})
    assert user is not None and assistant is not None
    await history.update_one({"_id": user["_id"]}, {"$set": {"text": assistant["text"]}})
    await refused(store.list_history(session_id, 0, 10), ErrorCode.UNAVAILABLE)


async def test_the_master_key_is_needed_and_kept(stack: EmbeddedStack, database: str) -> None:
    configured = base64.b64encode(secrets.token_bytes(32)).decode()
    key = parse_master_key(configured)
    who, session_id = scope(), uid("session")
    first = await MongoMemoryStore.connect(stack.mongo_uri, database, master_key=key)
    await record_turns(first, session_id, who, 1)
    await first.close()

    again = await MongoMemoryStore.connect(stack.mongo_uri, database, master_key=key)
    assert len(await again.list_history(session_id, 0, 10)) == 2
    await again.close()

    wrong = await MongoMemoryStore.connect(stack.mongo_uri, database, master_key=secrets.token_bytes(32))
    with pytest.raises(StoreError) as caught:
        await wrong.list_history(session_id, 0, 10)
    assert caught.value.code is ErrorCode.UNAVAILABLE
    await wrong.close()

    # Without a configured key, one is generated once and kept: a restart still reads.
    generated_db = f"{database}_generated"
    try:
        first = await MongoMemoryStore.connect(stack.mongo_uri, generated_db)
        await record_turns(first, session_id, who, 1)
        await first.close()
        again = await MongoMemoryStore.connect(stack.mongo_uri, generated_db)
        assert len(await again.list_history(session_id, 0, 10)) == 2
        await again.drop_database()
        await again.close()
    finally:
        client = client_on(stack.mongo_uri)
        await client.drop_database(generated_db)
        await client.close()

    for bad in ("short", base64.b64encode(b"x" * 16).decode()):
        with pytest.raises(ValueError, match="32"):
            parse_master_key(bad)


async def test_a_write_racing_forget_never_survives_without_its_key(store: MongoMemoryStore) -> None:
    who, session_id = scope(), uid("session")
    await record_turns(store, session_id, who, 1)
    writes = [store.append_history_turn(turn(uid("session"), who, index)) for index in range(6)]
    *outcomes, _ = await asyncio.gather(
        *writes, store.forget_principal(who.tenant_id, who.principal_id), return_exceptions=True
    )
    # Every turn was said before the forget: one that committed first was erased with the rest,
    # one that came after was refused; none made a new key or left a row.
    for outcome in outcomes:
        refusal = outcome if isinstance(outcome, StoreError) else None
        assert isinstance(outcome, HistoryAppendResult) or (
            refusal is not None and refusal.code is ErrorCode.PRINCIPAL_FORGOTTEN
        ), outcome
    assert await store.database[KEYS].count_documents({}) == 0
    assert await store.database[HISTORY].count_documents({"principal_id": who.principal_id}) == 0


async def test_turn_marks_expire_after_their_keep_and_the_persons_mark_stays(
    stack: EmbeddedStack, database: str
) -> None:
    clock, keep = SteppedClock(BASE + timedelta(days=1)), timedelta(days=30)
    store = await MongoMemoryStore.connect(stack.mongo_uri, database, clock=clock, turn_marks_keep=keep)
    try:
        await turn_marks_expire_after_their_keep(store, clock, keep)
        assert await store.database[FORGOTTEN].count_documents({"turn": True}) == 0
        assert await store.database[FORGOTTEN].count_documents({"turn": False}) == 2
    finally:
        await store.close()


# --- indexes ------------------------------------------------------------------------------------


async def test_every_query_the_memory_store_sends_uses_an_index(stack: EmbeddedStack, database: str) -> None:
    async with _logged(stack, database) as (store, log):
        client = store.client
        who, session_id, _ = await _fill(store, "idx")
        await store.append_history_turn(turn(session_id, who, 0))  # an exact retry
        await store.list_history(session_id, 1, 2)
        await store.history_tail(session_id, 2)
        await store.load_summary(session_id)
        await store.fact_audit(who)
        await store.load_profile(who)
        await store.search_index(who, "idx", 5)
        await store.search_authority(who, "idx", 5)
        [fact, *_] = await store.list_facts(who)
        await store.delete_fact(who, fact.fact_id)
        await store.delete_fact(who, fact.fact_id)
        await store.delete_index_entries(who, [fact.fact_id])
        await store.export_principal(who)
        await store.forget_principal(who.tenant_id, who.principal_id)

        explained = 0
        for name, command in list(log.commands):
            for find in as_finds(name, command):
                if not str(find["find"]).startswith("memory_"):
                    continue
                plan = await client[database].command({"explain": find, "verbosity": "queryPlanner"})
                stages = plan_stages(plan["queryPlanner"]["winningPlan"])
                assert "COLLSCAN" not in stages, (find, stages)
                explained += 1
        assert explained > 40
        for collection, indexes in INDEXES.items():
            names = {index["name"] async for index in await store.database[collection].list_indexes()}
            assert {index.document["name"] for index in indexes} <= names


@contextlib.asynccontextmanager
async def _logged(stack: EmbeddedStack, database: str) -> AsyncIterator[tuple[MongoMemoryStore, CommandLog]]:
    """A store over `database` whose client logs every command it sends."""
    log = CommandLog()
    client = client_on(stack.mongo_uri, event_listeners=[log])
    try:
        yield await MongoMemoryStore.open(client, database), log
    finally:
        await client.close()


async def test_a_turns_reads_of_its_summary_and_tail_commit_nothing(
    stack: EmbeddedStack, database: str
) -> None:
    # Each was a transaction of its own, and a read-only transaction still pays its commit (a
    # round trip: 1.8 ms against 1.1 for two reads on SecantusDB), on every turn's path.
    async with _logged(stack, database) as (store, log):
        _, session_id, texts = await _fill(store, "reads")
        log.commands.clear()
        tail = await store.history_tail(session_id, 2)
        loaded = await store.load_summary(session_id)
        assert [row.seq for row in tail] == [3, 4] and loaded is not None and loaded.text == texts[2]
        assert {name for name, _ in log.commands} == {"find"}
        for _, command in log.commands:
            assert "startTransaction" not in command and command.get("readConcern") == {"level": "majority"}


async def test_the_tail_of_a_session_with_nothing_recorded_yet_is_one_read(
    stack: EmbeddedStack, database: str
) -> None:
    # Every session's first turn reads it, on the turn's path, right after claiming the session.
    async with _logged(stack, database) as (store, log):
        session_id = uid("session")
        await store.claim_session(session_id, scope())
        log.commands.clear()
        assert await store.history_tail(session_id, 12) == []
        assert [name for name, _ in log.commands] == ["find"]


# --- the owner's events ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_owner_announces_recorded_turns_and_fact_changes_also_on_retries(
    stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    name = f"omem{uuid.uuid4().hex[:8]}"
    log_path = tmp_path_factory.mktemp("owner") / "owner.log"
    async with (
        Served(stack, f"{name}.", name, log_path) as served,
        TopicReader(stack.bootstrap, served.topic(Topic.HISTORY_RECORDED.value)) as recorded,
        TopicReader(stack.bootstrap, served.topic(Topic.MEMORY_CHANGES.value)) as changes,
    ):
        memory = KafkaMemoryStore(served.store)
        who, session_id = scope(), uid("session")
        first = turn(session_id, who, 0)
        await memory.append_history_turn(first)
        assert not (await memory.append_history_turn(first)).inserted

        records = await recorded.wait_for(lambda records: len(records) >= 2, within=15.0)
        events = [HistoryRecorded.model_validate_json(record.value or b"") for record in records]
        assert [(e.session_id, e.turn_id, e.first_seq, e.last_seq) for e in events] == [
            (session_id, first.turn_id, 1, 2)
        ] * 2
        assert events[0].event_id == events[1].event_id and events[0].scope == who
        assert not events[0].memory_opt_out
        assert {record.key for record in records} == {session_id.encode()}

        key, operation = uid("key"), new(uid("fact"), "Keeps bees.")
        created = await memory.apply_fact_operations(who, [operation], key)
        assert await memory.apply_fact_operations(who, [operation], key) == created
        deleted = await memory.delete_fact(who, created[0].fact_id)
        await refused(memory.delete_fact(scope(), created[0].fact_id), ErrorCode.FACT_NOT_FOUND)

        records = await changes.wait_for(lambda records: len(records) >= 3, within=15.0)
        published = [FactChanged.model_validate_json(record.value or b"") for record in records]
        assert [change.event_id for change in published] == [
            created[0].event_id,
            created[0].event_id,
            deleted.event_id,
        ]
        assert {record.key for record in records} == {who.principal_id.encode()}
        assert published[0].text == "Keeps bees." and published[2].text == ""
