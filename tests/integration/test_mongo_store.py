"""The MongoDB store beyond the conformance suite: what only a real database can show.

Cursors that outlive the store object, bytes kept exactly in BSON, an index under every query the
store sends, UNAVAILABLE and the resent command, races between two store objects (separate
processes in production: the in-process turns do not serialise them, the database must), and
acknowledged writes that survive a SIGKILL of the server.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.store import Checkpoint, Record, RunStart, StartOutcome
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.storage_owner.mongo import TransactionPolicy
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.mongo_transaction import RECORDS, RUNS, SESSIONS
from tests.conformance.builders import (
    all_run_records,
    all_session_records,
    changed,
    child_start,
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
    suspend,
    suspension,
    terminal,
)
from tests.owner_support import CommandLog, as_finds, client_on, database_answering, plan_stages
from tests.timing import scaled

Client = AsyncMongoClient[dict[str, Any]]


@pytest.fixture
async def store(stack: EmbeddedStack, database: str) -> AsyncIterator[MongoStore]:
    """A MongoStore with its own client on this test's database."""
    opened = await MongoStore.connect(stack.mongo_uri, database)
    yield opened
    await opened.close()


# --- cursors and bytes --------------------------------------------------------------------------


async def test_cursor_stays_valid_across_a_restart(stack: EmbeddedStack, database: str) -> None:
    first = await MongoStore.connect(stack.mongo_uri, database)
    session_id = await open_session(first)
    run = await running_root(first, session_id)
    for index in range(5):
        await first.append_run_record(ordinary(run, f"event-{index}"))
    run_page = await first.list_run_records(run.run_id, "", 2)
    session_page = await first.list_session_run_records(session_id, "", 2)
    await first.close()

    # A new store object (a restarted owner) reads the secret the first one generated.
    second = await MongoStore.connect(stack.mongo_uri, database)
    try:
        rest = await second.list_run_records(run.run_id, run_page.next_cursor, 10)
        assert [record.id for record in rest.records] == ["3", "4", "5", "6"]
        session_rest = await second.list_session_run_records(session_id, session_page.next_cursor, 10)
        assert len(session_rest.records) == 4
    finally:
        await second.close()

    # The secret is what makes them valid: a store with another one refuses the same cursor.
    other = await MongoStore.connect(stack.mongo_uri, database, cursor_secret=b"another secret")
    try:
        await refused(ErrorCode.INVALID_CURSOR, other.list_run_records(run.run_id, run_page.next_cursor, 10))
    finally:
        await other.close()


async def test_an_explicit_cursor_secret_is_used_as_given(stack: EmbeddedStack, database: str) -> None:
    secret = b"from the settings"
    first = await MongoStore.connect(stack.mongo_uri, database, cursor_secret=secret)
    session_id = await open_session(first)
    run = await running_root(first, session_id)
    await first.append_run_record(ordinary(run, "one"))
    page = await first.list_run_records(run.run_id, "", 1)
    await first.close()
    second = await MongoStore.connect(stack.mongo_uri, database, cursor_secret=secret)
    try:
        assert len((await second.list_run_records(run.run_id, page.next_cursor, 5)).records) == 1
    finally:
        await second.close()


async def test_payload_and_checkpoint_bytes_are_kept_exactly(store: MongoStore) -> None:
    _, run = await session_with_root(store, labels={"a.b": "1", "$x": "2", "": "empty", "nul\x00": "3"})
    # Not canonical JSON on purpose: whitespace, escapes, raw non-ASCII, NFD vs NFC.
    payload = b'{ "text" :"caf\xc3\xa9 / cafe\xcc\x81",\n"esc":"\\u00e9\\ud83d\\ude00", "n": 1.50 }'
    record = ordinary(run, "exact", payload=payload)
    await store.append_run_record(record)
    data = bytes(range(256)) * 3
    await suspend(store, run, data=data)

    [_, stored, _] = await all_run_records(store, run.run_id)
    assert stored.payload == payload
    assert stored.same_content(record)
    assert await store.load_run_suspension(run.run_id) == Checkpoint(suspension_id="susp-1", data=data)
    assert (await store.load_run(run.run_id)).labels == {"a.b": "1", "$x": "2", "": "empty", "nul\x00": "3"}

    # In the database they rest sealed (BSON binary, never the text); see test_sealing.py.
    raw = await store.database[RECORDS].find_one({"run_id": run.run_id, "event_key": "exact"})
    assert raw is not None and isinstance(raw["payload"], bytes) and b"caf" not in raw["payload"]


# --- indexes ------------------------------------------------------------------------------------


async def test_every_query_the_store_sends_uses_an_index(stack: EmbeddedStack, database: str) -> None:
    log = CommandLog()
    client = client_on(stack.mongo_uri, event_listeners=[log])
    try:
        store = await MongoStore.open(client, database)
        # Every read and write path of the rules: sessions, starts of each kind, records,
        # listings (both windows and the open range), continuation, purge.
        session_id, parent = await session_with_root(store)
        child = await proceed(store, child_start(session_id, parent))
        await store.append_run_record(ordinary(child, "x"))
        await store.append_run_record(ordinary(child, "x"))
        await store.append_run_records([ordinary(child, "y"), ordinary(child, "z")])
        await store.record_run_terminal(terminal(child), [ordinary(child, "answer")])
        await suspend(store, parent)
        successor = root_start(session_id, predecessor_run_id=parent.run_id, started_at=ms(50))
        await store.start_root_run(*successor)
        await store.record_run_terminal(terminal(successor.run))
        await all_run_records(store, parent.run_id, limit=1)
        await all_session_records(store, session_id, limit=2)
        await store.list_runs_by_session(session_id, [])
        one_shot = await running_one_shot(store)
        await store.list_run_records(one_shot.run_id, "", 10)
        await store.load_run_suspension(parent.run_id)
        await store.end_session(session_id, ms(9))
        await store.purge_session(session_id)

        explained = 0
        for name, command in list(log.commands):
            for find in as_finds(name, command):
                if find["find"] not in (SESSIONS, RUNS, RECORDS):
                    continue
                plan = await client[database].command({"explain": find, "verbosity": "queryPlanner"})
                stages = plan_stages(plan["queryPlanner"]["winningPlan"])
                assert "COLLSCAN" not in stages, (find, stages)
                explained += 1
        # Every path above sent its reads (sessions and runs hinted once written; a new run and a
        # new step's own keys taken for new: their inserts check them).
        assert explained > 30
    finally:
        await client.close()


async def test_a_sessions_status_is_read_without_a_transaction(stack: EmbeddedStack, database: str) -> None:
    # The owner check of every turn: one document, whose transaction paid a commit for nothing.
    log = CommandLog()
    client = client_on(stack.mongo_uri, event_listeners=[log])
    try:
        store = await MongoStore.open(client, database)
        session_id = await open_session(store)
        log.commands.clear()
        assert (await store.load_session_status(session_id)).session_id == session_id
        assert [name for name, _ in log.commands] == ["find"]
        [(_, command)] = log.commands
        assert "startTransaction" not in command and command.get("readConcern") == {"level": "majority"}
        await refused(ErrorCode.SESSION_NOT_FOUND, store.load_session_status("no-such-session"))
    finally:
        await client.close()


async def test_indexes_exist_on_every_collection_that_is_queried(store: MongoStore) -> None:
    names = {
        collection: {index["name"] async for index in await store.database[collection].list_indexes()}
        for collection in (RUNS, RECORDS)
    }
    assert {"session_start_order"} <= names[RUNS]
    assert {"run_event_key", "run_seq", "session_seq"} <= names[RECORDS]
    # Opening the store again leaves them as they are (idempotent schema).
    await MongoStore.open(store.client, store.database.name)


# --- UNAVAILABLE and the resent command ---------------------------------------------------------


async def _fail_point(client: Client, mode: Any, data: dict[str, Any]) -> None:
    await client.admin.command({"configureFailPoint": "failCommand", "mode": mode, "data": data})


@pytest.fixture
async def faulty(stack: EmbeddedStack, database: str) -> AsyncIterator[tuple[MongoStore, Client]]:
    """A store whose client alone is hit by fail points (matched on its appName)."""
    app_name = f"faulty-{uuid.uuid4().hex[:8]}"
    client = client_on(stack.mongo_uri, appname=app_name)
    store = await MongoStore.open(client, database, policy=TransactionPolicy(commit_attempts=1))
    try:
        yield store, client
    finally:
        await _fail_point(client, "off", {})
        await client.close()


def _app(client: Client) -> str:
    return str(client.options.pool_options.metadata["application"]["name"])


async def test_transient_transaction_errors_are_retried_inside_the_store(
    faulty: tuple[MongoStore, Client],
) -> None:
    store, client = faulty
    _, run = await session_with_root(store)
    before = store.transactions.attempts
    await _fail_point(
        client,
        {"times": 2},
        {
            "failCommands": ["bulkWrite"],
            "errorCode": 112,
            "errorLabels": ["TransientTransactionError"],
            "appName": _app(client),
        },
    )
    result = await store.append_run_record(ordinary(run, "after-conflicts"))
    assert result.inserted is True
    assert store.transactions.attempts - before == 3
    assert [record.event_key for record in await all_run_records(store, run.run_id)] == [
        "started",
        "after-conflicts",
    ]


async def test_unknown_commit_result_is_unavailable_and_the_resent_command_returns_the_original(
    faulty: tuple[MongoStore, Client],
) -> None:
    store, client = faulty
    _, run = await session_with_root(store)
    record = ordinary(run, "maybe-written")
    # The commit is applied, then its reply carries a write concern error: the outcome is unknown.
    await _fail_point(
        client,
        {"times": 1},
        {
            "failCommands": ["commitTransaction"],
            "writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"},
            "appName": _app(client),
        },
    )
    error = await refused(ErrorCode.UNAVAILABLE, store.append_run_record(record))
    assert error.retryable is True
    again = await store.append_run_record(record)
    assert (again.record_id, again.inserted) == ("2", False)
    assert len(await all_run_records(store, run.run_id)) == 2


async def test_a_closed_client_is_unavailable_and_a_new_store_answers_the_resent_command(
    stack: EmbeddedStack, database: str
) -> None:
    store = await MongoStore.connect(stack.mongo_uri, database)
    _, run = await session_with_root(store)
    await store.close()
    record = ordinary(run, "after-close")
    await refused(ErrorCode.UNAVAILABLE, store.append_run_record(record))
    restarted = await MongoStore.connect(stack.mongo_uri, database)
    try:
        first = await restarted.append_run_record(record)
        again = await restarted.append_run_record(record)
        assert (first.record_id, first.inserted) == ("2", True)
        assert (again.record_id, again.inserted) == ("2", False)
    finally:
        await restarted.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_no_server_is_unavailable_within_the_selection_timeout() -> None:
    # Without the setting pymongo would look for a server for its default 30 s.
    async with asyncio.timeout(scaled(10)):
        with pytest.raises(StoreError) as raised:
            await MongoStore.connect(
                f"mongodb://127.0.0.1:{_closed_port()}/", "nothing", server_selection_timeout_ms=300
            )
    assert raised.value.code is ErrorCode.UNAVAILABLE


async def test_a_document_over_the_bson_limit_is_invalid_argument_and_writes_nothing(
    store: MongoStore,
) -> None:
    _, run = await session_with_root(store)
    huge = b'"' + b"a" * (17 * 1024 * 1024) + b'"'
    await refused(ErrorCode.INVALID_ARGUMENT, store.append_run_record(ordinary(run, "huge", payload=huge)))
    assert len(await all_run_records(store, run.run_id)) == 1
    assert (await store.append_run_record(ordinary(run, "small"))).record_id == "2"


# --- range documents: a step's records in one document --------------------------------------------


async def _a_session_of_steps(store: MongoStore) -> tuple[str, RunStart, list[Record]]:
    """A session whose root run wrote steps of 5, 1 and 3 records and closed with 2 more."""
    session_id, run = await session_with_root(store)
    for size in (5, 1, 3):
        await store.append_run_records([ordinary(run) for _ in range(size)])
    await store.record_run_terminal(terminal(run), [ordinary(run) for _ in range(2)])
    return session_id, run, await all_run_records(store, run.run_id)


def _as_sent(stored: list[Record]) -> list[Record]:
    """Stored records as their writer sent them (the store assigns the ids)."""
    return [record.model_copy(update={"id": ""}) for record in stored]


async def _read_at_every_page_size(
    store: MongoStore, session_id: str, run: RunStart, expected: list[Record]
) -> None:
    for limit in range(1, len(expected) + 2):
        assert keys(await all_run_records(store, run.run_id, limit=limit)) == keys(expected), limit
        assert keys(await all_session_records(store, session_id, limit=limit)) == keys(expected), limit
        assert [record.id for record in await all_run_records(store, run.run_id, limit=limit)] == [
            str(index) for index in range(1, len(expected) + 1)
        ]


async def test_a_steps_records_are_one_document_read_once_and_in_order_at_every_page_size(
    store: MongoStore,
) -> None:
    # Every record was a document: a step of five cost SecantusDB five inserts and five entries of
    # each of the three indexes (5.6 ms a transaction against 3.2 for one document of five).
    session_id, run, written = await _a_session_of_steps(store)
    documents = [document async for document in store.database[RECORDS].find({"run_id": run.run_id})]
    assert len(written) == 13 and len(documents) < len(written)
    step = written[1:6]
    assert (
        await store.database[RECORDS].count_documents(
            {"run_id": run.run_id, "event_key": {"$in": [record.event_key for record in step]}}
        )
        == 1
    )
    await _read_at_every_page_size(store, session_id, run, written)
    # Exact retries and conflicts are answered from inside a range, as from a document of its own.
    retried = await store.append_run_records(_as_sent(step[1:3]))
    assert [(result.record_id, result.inserted) for result in retried] == [("3", False), ("4", False)]
    [other] = _as_sent([changed(step[2], payload=b'{"other":1}')])
    await refused(ErrorCode.EVENT_CONFLICT, store.append_run_record(other))


async def test_a_database_of_one_document_a_record_reads_as_before_and_takes_ranges_after_it(
    store: MongoStore,
) -> None:
    # Databases written before ranges hold one document a record: no migration, the same reads.
    session_id, run, written = await _a_session_of_steps(store)
    collection = store.database[RECORDS]
    async for document in collection.find({"run_id": run.run_id, "records": {"$exists": True}}):
        shared = {field: document[field] for field in ("run_id", "session_id", "tenant_id", "principal_id")}
        singles = [
            {
                **shared,
                **record,
                "seq": document["seq"] + index,
                "session_seq": document["session_seq"] + index,
            }
            for index, record in enumerate(document["records"])
        ]
        await collection.delete_one({"_id": document["_id"]})
        await collection.insert_many(singles)
    assert await collection.count_documents({"run_id": run.run_id}) == len(written)
    await _read_at_every_page_size(store, session_id, run, written)

    later_run = await running_root(store, session_id)
    await store.append_run_records([ordinary(later_run) for _ in range(4)])
    later = await all_run_records(store, later_run.run_id)
    everything = await all_session_records(store, session_id)
    assert keys(everything) == keys(written) + keys(later)
    for limit in range(1, len(everything) + 2):
        assert keys(await all_session_records(store, session_id, limit=limit)) == keys(everything), limit
    retried = await store.append_run_records(_as_sent(written[1:3]))
    assert [result.inserted for result in retried] == [False, False]


async def test_a_step_too_large_for_one_document_is_split_across_documents(store: MongoStore) -> None:
    # Each record under 16 MiB, together over it: the step is still written, whole.
    session_id, run = await session_with_root(store)
    big = b'"' + b"a" * (9 * 1024 * 1024) + b'"'
    step = [ordinary(run, payload=big), ordinary(run, payload=big), ordinary(run)]
    results = await store.append_run_records(step)
    assert [result.record_id for result in results] == ["2", "3", "4"]
    assert await store.database[RECORDS].count_documents({"run_id": run.run_id}) == 3
    stored = await all_run_records(store, run.run_id, limit=2)
    assert [record.payload for record in stored[1:]] == [big, big, step[2].payload]
    assert keys(await all_session_records(store, session_id, limit=1)) == keys(stored)


# --- races between store objects: the database decides ------------------------------------------


async def test_racing_continuations_on_two_store_objects_admit_exactly_one(
    stack: EmbeddedStack, database: str
) -> None:
    stores = [await MongoStore.connect(stack.mongo_uri, database) for _ in range(2)]
    try:
        session_id = await open_session(stores[0])
        predecessor = await running_root(stores[0], session_id)
        await suspend(stores[0], predecessor)
        commands = [
            root_start(session_id, predecessor_run_id=predecessor.run_id, started_at=ms(100 + n))
            for n in range(8)
        ]
        results = await asyncio.gather(
            *(resending(partial(stores[n % 2].start_root_run, *c)) for n, c in enumerate(commands)),
            return_exceptions=True,
        )
        winners = [result for result in results if not isinstance(result, BaseException)]
        losers = [result for result in results if isinstance(result, StoreError)]
        assert len(winners) == 1 and winners[0].decision is StartOutcome.PROCEED
        assert [loser.code for loser in losers] == [ErrorCode.RUN_CONFLICT] * 7
        winner = commands[results.index(winners[0])]
        assert (await stores[1].load_run(predecessor.run_id)).successor_run_id == winner.run.run_id
        listed = await stores[1].list_runs_by_session(session_id, [])
        assert [meta.run_id for meta in listed] == [predecessor.run_id, winner.run.run_id]
    finally:
        for store in stores:
            await store.close()


async def test_racing_appends_on_two_store_objects_get_contiguous_ids(
    stack: EmbeddedStack, database: str
) -> None:
    stores = [await MongoStore.connect(stack.mongo_uri, database) for _ in range(2)]
    try:
        session_id = await open_session(stores[0])
        run = await running_root(stores[0], session_id)
        records = [ordinary(run, f"event-{n:02d}") for n in range(16)]
        results = await asyncio.gather(
            *(resending(partial(stores[n % 2].append_run_record, r)) for n, r in enumerate(records))
        )
        assert sorted(int(result.record_id) for result in results) == list(range(2, 18))
        listed = await all_session_records(stores[1], session_id, limit=5)
        assert [record.id for record in listed] == [str(n) for n in range(1, 18)]
        # 18 operations; more transactions than that means the two stores really collided (~35).
        assert sum(store.transactions.attempts for store in stores) > 18
    finally:
        for store in stores:
            await store.close()


async def test_purge_racing_appends_from_another_store_object_recreates_nothing(
    stack: EmbeddedStack, database: str
) -> None:
    writer, purger = [await MongoStore.connect(stack.mongo_uri, database) for _ in range(2)]
    try:
        session_id = await open_session(writer)
        run = await running_root(writer, session_id)
        await suspend(writer, run)
        await writer.end_session(session_id, ms(5))
        late: list[Record] = [ordinary(run, f"late-{n}") for n in range(6)]

        async def append(record: Record) -> ErrorCode | None:
            try:
                await resending(lambda: writer.append_run_record(record))
            except StoreError as error:
                return error.code
            return None

        outcome = await asyncio.gather(
            resending(lambda: purger.purge_session(session_id)), *(append(record) for record in late)
        )
        # The run is suspended, so every append is refused: before the purge RUN_NOT_ACTIVE,
        # after it SESSION_PURGED; nothing may reappear either way.
        assert set(outcome[1:]) <= {ErrorCode.RUN_NOT_ACTIVE, ErrorCode.SESSION_PURGED}
        await refused(ErrorCode.RUN_NOT_FOUND, writer.load_run(run.run_id))
        assert await writer.database[RECORDS].count_documents({"session_id": session_id}) == 0
        assert await writer.database[RUNS].count_documents({"session_id": session_id}) == 0
    finally:
        await writer.close()
        await purger.close()


# --- durability ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _secantus(storage: Path, port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("secantusd-py", path=str(Path(sys.executable).parent)) or "secantusd-py"
    # SecantusDB ignores `j` on commitTransaction (measured: 0 to 82 of 120 journaled commits
    # survived a SIGKILL); `--sync-on-commit` makes every commit durable (120/120).
    return subprocess.Popen(
        [
            binary,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--storage-path",
            str(storage),
            "--sync-on-commit",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture
def storage_dir() -> Iterator[Path]:
    """A private SecantusDB storage directory."""
    path = Path(tempfile.mkdtemp(prefix="quipu-durability-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
async def test_acknowledged_writes_survive_sigkill_of_a_sync_on_commit_server(storage_dir: Path) -> None:
    port = _free_port()
    uri = f"mongodb://127.0.0.1:{port}/?retryWrites=false"
    server = _secantus(storage_dir, port)
    try:
        await database_answering(uri)
        store = await MongoStore.connect(uri, "durable")
        _, run = await session_with_root(store)
        acknowledged = [(await store.append_run_record(ordinary(run, f"e{n}"))).record_id for n in range(30)]
        checkpoint, record = suspension(run)
        await store.record_run_suspension(checkpoint, record)
        await store.close()
        # At once, before any background flush: only journaled commits are on disk.
        os.killpg(server.pid, signal.SIGKILL)
        await asyncio.to_thread(server.wait)

        server = _secantus(storage_dir, port)
        await database_answering(uri)
        reopened = await MongoStore.connect(uri, "durable")
        try:
            records = await all_run_records(reopened, run.run_id)
            assert [r.id for r in records[1:31]] == acknowledged
            assert await reopened.load_run_suspension(run.run_id) == checkpoint
        finally:
            await reopened.close()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            await asyncio.to_thread(server.wait)
