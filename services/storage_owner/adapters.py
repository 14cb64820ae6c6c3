"""The MongoDB repository behind the store's transaction port (STORE_CONTRACT §6.1, §8).

`MongoStore` is `RuleStore` (every contract rule, shared with the in-memory store) over
`MongoTransactions`: each operation runs in one multi-document transaction, retried whole with
bounded, jittered attempts when it meets another writer. Every save is conditional on the revision
the operation read (insert at revision 1, else replace where `revision == state.revision - 1`), so a
racing writer is detected even where MongoDB itself would not report a write conflict; that, plus
MongoDB's own write conflicts, is what admits exactly one of several racing continuations.

Layout (one database):

- `sessions`: `_id` = session id. A live session holds the `SessionState`; a purged one is replaced
  by its tombstone `{_id, tombstone: true, purged_at}`. Keeping the tombstone in the session's
  own document means one read answers both "tombstoned?" and "which session?" (one round trip
  less on every session-scoped operation), the id can never be inserted again (duplicate `_id`),
  and a purge conflicts with every concurrent session-scoped write, which all bump the document.
- `runs`: `_id` = run id; the `RunState` (checkpoint and bookkeeping included). Index
  `(session_id, start_order)` serves ListRunsBySession and the purge cascade.
- `records`: one document per record with its per-run `seq` and per-session `session_seq` (0 when
  sessionless). Unique `(run_id, event_key)` and `(run_id, seq)`; `(session_id, session_seq)`
  serves session listings and the purge cascade.
- `meta`: the generated cursor secret, so cursors stay valid across restarts (and the generated
  master key when none is configured, see `keys`).

Sealing: every record payload and every suspension checkpoint is sealed (`kit.sealing`) under the
data key of the run's principal (`RunStart.principal_id`, else the session's anonymous one, else
the run's own; `keys`), the one the principal's memory uses, so forgetting the principal makes
their run logs unreadable at once. Record documents name that principal (`tenant_id`,
`principal_id`) so each opens alone, in any listing. The rules see plaintext: the transaction
opens what it reads and seals what it writes, so an exact retry compares the received bytes with
the stored plaintext, never two ciphertexts (sealing uses a random nonce). A value whose key is
gone reads as `ERASED_PAYLOAD`: ids, sequences, types and times stay, so the rules, paging and
retries go on (a retry of an erased record is an EVENT_CONFLICT, final), and readers say
"erased". Record documents written before sealing (no `principal_id`) read as stored.

Every query path hits an index: SecantusDB answers an unindexed find at ~5/s (PLATFORM_NOTES);
tests/integration/test_mongo_store.py explains every query the store sends. Listings read a
closed sequence window, because SecantusDB reads a whole open range before applying the limit.
Operations on one session take turns inside the process (`KeyedTurns`) so that they do not abort
each other; across processes the conditional saves and the transactions decide.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pymongo import ASCENDING, AsyncMongoClient, IndexModel, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    DocumentTooLarge,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from quipu.contracts.errors import ErrorCode, QuipuError, StoreError
from quipu.contracts.store import ERASED_PAYLOAD, Checkpoint, Record
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.store.rules import RuleStore
from quipu.services.domain.store.state import RunState, SessionState, StoreTransaction
from quipu.services.kit.sealing import BrokenSealError, OtherKeyError, open_sealed, seal
from quipu.services.storage_owner.keys import KEYS, MASTER_KEY_ID, Keyring, PrincipalKeys, sealing_principal

T = TypeVar("T")
X = TypeVar("X")

Document = dict[str, Any]

SESSIONS = "sessions"
RUNS = "runs"
RECORDS = "records"
META = "meta"

CURSOR_SECRET_ID = "cursor_secret"
_BSON_OBJECT_TOO_LARGE = 10334

INDEXES: Mapping[str, list[IndexModel]] = {
    RUNS: [IndexModel([("session_id", ASCENDING), ("start_order", ASCENDING)], name="session_start_order")],
    RECORDS: [
        IndexModel([("run_id", ASCENDING), ("event_key", ASCENDING)], name="run_event_key", unique=True),
        IndexModel([("run_id", ASCENDING), ("seq", ASCENDING)], name="run_seq", unique=True),
        IndexModel([("session_id", ASCENDING), ("session_seq", ASCENDING)], name="session_seq"),
    ],
}
"""Secondary indexes by collection; `sessions` and `meta` are only read by `_id`."""


class WriteRaceError(QuipuError):
    """Raised inside a transaction when a conditional save finds that another writer came first."""

    retryable = True


@dataclass(frozen=True)
class TransactionPolicy:
    """How operations are committed and retried."""

    write_concern: WriteConcern = field(default_factory=lambda: WriteConcern(w="majority", j=True))
    """Majority and journaled: on MongoDB an acknowledged commit survives SIGKILL. SecantusDB
    ignores `j` on commitTransaction (0-82 of 120 journaled commits survived a SIGKILL): run it
    with `--sync-on-commit` wherever durability matters (120/120)."""
    read_concern: ReadConcern = field(default_factory=lambda: ReadConcern("snapshot"))
    """Every read of an operation sees one snapshot."""
    max_attempts: int = 12
    """Tries of one operation that keeps meeting other writers, before UNAVAILABLE."""
    commit_attempts: int = 3
    """Tries of a commit whose outcome is unknown, before UNAVAILABLE."""
    backoff_initial: float = 0.002
    """Upper bound of the first (full-jitter) pause between attempts, in seconds."""
    backoff_max: float = 0.1
    """Cap of the pause between attempts, in seconds."""

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, initial * 2^(attempt-1))]."""
        return random.uniform(0, min(self.backoff_max, self.backoff_initial * 2 ** (attempt - 1)))


# --- documents ----------------------------------------------------------------------------------


def _session_document(state: SessionState) -> Document:
    return {"_id": state.session.session_id, **state.model_dump(mode="python")}


def _session_state(document: Document) -> SessionState | None:
    if document.get("tombstone"):
        return None
    return SessionState.model_validate({key: value for key, value in document.items() if key != "_id"})


def _run_document(state: RunState, checkpoint: Document | None) -> Document:
    document = state.model_dump(mode="python")
    # Label keys are arbitrary strings ("." "$" or NUL would be unsafe or invalid as BSON keys).
    document["labels"] = [[key, value] for key, value in state.labels.items()]
    document["checkpoint"] = checkpoint
    return {"_id": state.run_id, **document}


def _run_state(document: Document, checkpoint: Checkpoint | None) -> RunState:
    fields = {key: value for key, value in document.items() if key not in ("_id", "checkpoint")}
    fields["labels"] = dict(fields["labels"])
    return RunState.model_validate({**fields, "checkpoint": checkpoint})


def _owner(run: RunState) -> tuple[str, str]:
    """(tenant, principal) whose data key seals the run's texts."""
    return run.tenant_id, sealing_principal(run.principal_id, run.session_id, run.run_id)


def _record_context(run_id: str, event_key: str) -> str:
    return f"{RECORDS}/{run_id}/{event_key}"


def _checkpoint_context(run_id: str) -> str:
    return f"{RUNS}/{run_id}/checkpoint"


def _opened(key: bytes | None, sealed: bytes, context: str) -> bytes:
    """The plaintext, or ERASED_PAYLOAD when the key it was sealed under is gone."""
    if key is None:
        return ERASED_PAYLOAD
    try:
        return open_sealed(key, sealed, context)
    except OtherKeyError:
        return ERASED_PAYLOAD  # forgotten, and a fresh key made since for a later write
    except BrokenSealError as error:
        raise StoreError(ErrorCode.UNAVAILABLE, str(error)) from error


# --- one transaction ----------------------------------------------------------------------------


class KeyedTurns:
    """In-process turns per key: operations on one session (or sessionless run) take turns.

    Each operation waits for its turn on the first document it reads, which the rules make its
    session (or, sessionless, its run), and holds it until its transaction ends. Writers of one
    session in this process then never abort each other: in batches of 4 concurrent appends to one
    run, 2.8 transactions per append and 14.6 ms became 1 and ~6 ms. It is only an optimisation:
    the conditional saves and MongoDB's write conflicts still decide between processes, and
    between operations whose documents lie under different keys (a one-shot child's parent).
    """

    def __init__(self) -> None:
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}

    async def wait(self, key: str) -> None:
        """Wait for `key`'s turn; pair with `done`."""
        lock, waiting = self._turns.get(key, (asyncio.Lock(), 0))
        self._turns[key] = (lock, waiting + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._leave(key)
            raise

    def done(self, key: str) -> None:
        """End `key`'s turn."""
        self._turns[key][0].release()
        self._leave(key)

    def _leave(self, key: str) -> None:
        lock, waiting = self._turns[key]
        if waiting == 1:
            del self._turns[key]
        else:
            self._turns[key] = (lock, waiting - 1)


class _Collections:
    def __init__(self, database: AsyncDatabase[Document]) -> None:
        self.sessions: AsyncCollection[Document] = database[SESSIONS]
        self.runs: AsyncCollection[Document] = database[RUNS]
        self.records: AsyncCollection[Document] = database[RECORDS]
        self.keys: AsyncCollection[Document] = database[KEYS]


class MongoTransaction:
    """The `StoreTransaction` port inside one MongoDB transaction.

    Documents read are remembered for the rest of the transaction (a snapshot reads the same
    anyway), so the rules may load a run or a session twice for one round trip.
    """

    def __init__(
        self, collections: _Collections, session: AsyncClientSession, turns: KeyedTurns, keyring: Keyring
    ) -> None:
        self._collections = collections
        self._session = session
        self._turns = turns
        self._keys = PrincipalKeys(collections.keys, session, keyring)
        self._turn: str | None = None
        self._sessions: dict[str, Document | None] = {}
        self._runs: dict[str, RunState | None] = {}

    async def _take_turn(self, key: str) -> None:
        if self._turn is None:
            self._turn = key
            await self._turns.wait(key)

    def end_turn(self) -> None:
        """Let the next operation on this transaction's key go (called when the transaction ends)."""
        if self._turn is not None:
            self._turns.done(self._turn)
            self._turn = None

    async def _session_document(self, session_id: str) -> Document | None:
        await self._take_turn(f"session:{session_id}")
        if session_id not in self._sessions:
            self._sessions[session_id] = await self._collections.sessions.find_one(
                {"_id": session_id}, session=self._session
            )
        return self._sessions[session_id]

    async def is_tombstoned(self, session_id: str) -> bool:
        document = await self._session_document(session_id)
        return document is not None and bool(document.get("tombstone"))

    async def load_session(self, session_id: str) -> SessionState | None:
        document = await self._session_document(session_id)
        return _session_state(document) if document is not None else None

    async def save_session(self, state: SessionState) -> None:
        document = _session_document(state)
        await self._save(self._collections.sessions, document, state.revision)
        self._sessions[state.session.session_id] = document

    async def load_run(self, run_id: str) -> RunState | None:
        await self._take_turn(f"run:{run_id}")
        if run_id not in self._runs:
            document = await self._collections.runs.find_one({"_id": run_id}, session=self._session)
            self._runs[run_id] = await self._run_state(document) if document is not None else None
        return self._runs[run_id]

    async def save_run(self, state: RunState) -> None:
        await self._save(self._collections.runs, await self._run_document(state), state.revision)
        self._runs[state.run_id] = state

    # -- sealing -----------------------------------------------------------------------------

    async def _run_document(self, state: RunState) -> Document:
        checkpoint = None
        if state.checkpoint is not None:
            key = await self._keys.writing_key(*_owner(state), fence=False)
            data = seal(key, state.checkpoint.data, _checkpoint_context(state.run_id))
            checkpoint = {"suspension_id": state.checkpoint.suspension_id, "data": data}
        return _run_document(state, checkpoint)

    async def _run_state(self, document: Document) -> RunState:
        sealed = document.get("checkpoint")
        checkpoint = None
        if sealed is not None:
            if "principal_id" in document:
                principal_id = sealing_principal(
                    document["principal_id"], document["session_id"], document["run_id"]
                )
                key = await self._keys.reading_key(document["tenant_id"], principal_id)
                data = _opened(key, bytes(sealed["data"]), _checkpoint_context(document["_id"]))
            else:
                data = bytes(sealed["data"])  # written before sealing
            checkpoint = Checkpoint(suspension_id=sealed["suspension_id"], data=data)
        return _run_state(document, checkpoint)

    async def _record_document(self, run: RunState, record: Record, session_sequence: int) -> Document:
        tenant_id, principal_id = _owner(run)
        key = await self._keys.writing_key(tenant_id, principal_id, fence=False)
        document = record.model_dump(mode="python", exclude={"id"})
        document["payload"] = seal(key, record.payload, _record_context(record.run_id, record.event_key))
        document["seq"] = int(record.id)
        document["session_seq"] = session_sequence
        document["tenant_id"] = tenant_id
        document["principal_id"] = principal_id
        return document

    async def _record(self, document: Document) -> Record:
        fields = {
            key: value
            for key, value in document.items()
            if key not in ("_id", "seq", "session_seq", "tenant_id", "principal_id")
        }
        if "principal_id" in document:
            key = await self._keys.reading_key(document["tenant_id"], document["principal_id"])
            context = _record_context(document["run_id"], document["event_key"])
            fields["payload"] = _opened(key, bytes(document["payload"]), context)
        return Record(id=str(document["seq"]), **fields)

    async def _save(self, collection: AsyncCollection[Document], document: Document, revision: int) -> None:
        """Insert at revision 1, else replace the document written at `revision - 1`."""
        if revision == 1:
            try:
                await collection.insert_one(document, session=self._session)
            except DuplicateKeyError as error:
                raise WriteRaceError(
                    f"{collection.name} {document['_id']!r} was inserted meanwhile"
                ) from error
            return
        result = await collection.replace_one(
            {"_id": document["_id"], "revision": revision - 1}, document, session=self._session
        )
        if result.matched_count != 1:
            raise WriteRaceError(f"{collection.name} {document['_id']!r} changed meanwhile")

    async def load_record(self, run_id: str, event_key: str) -> Record | None:
        document = await self._collections.records.find_one(
            {"run_id": run_id, "event_key": event_key}, {"_id": False}, session=self._session
        )
        return await self._record(document) if document is not None else None

    async def insert_record(self, run: RunState, record: Record, session_sequence: int) -> None:
        document = await self._record_document(run, record, session_sequence)
        try:
            await self._collections.records.insert_one(document, session=self._session)
        except DuplicateKeyError as error:
            # The rules checked the key and the sequence in this snapshot: another writer won.
            raise WriteRaceError(f"record {record.event_key!r} of {record.run_id!r} was taken") from error

    async def list_records(self, run_id: str, after: int, limit: int) -> list[Record]:
        run = self._runs.get(run_id)
        rows = await self._window(
            {"run_id": run_id}, "seq", after, limit, run.record_count if run is not None else None
        )
        return [await self._record(document) for document in rows]

    async def list_session_records(self, session_id: str, after: int, limit: int) -> list[tuple[int, Record]]:
        document = self._sessions.get(session_id)
        count = document.get("record_count") if document is not None else None
        rows = await self._window({"session_id": session_id}, "session_seq", after, limit, count)
        return [(row["session_seq"], await self._record(row)) for row in rows]

    async def _window(
        self, scope: Document, sequence: str, after: int, limit: int, count: int | None
    ) -> list[Document]:
        """Up to `limit` records of `scope` with `sequence` > after, in order.

        SecantusDB reads every index entry a range matches before it applies the limit, so an
        open range (`> after`) costs as much as the rest of the log. Sequences are gapless (each is
        the previous count + 1 under a conditional save, and a purge removes a session whole),
        so the closed window (after, after + limit] holds exactly the next page. Should the count
        read in this transaction promise more than the window returned, the open range is used.
        """
        window = {"$gt": after, "$lte": after + limit} if count is not None else {"$gt": after}
        rows = await self._find_sorted({**scope, sequence: window}, sequence, limit)
        if count is not None and len(rows) < min(limit, count - after):
            rows = await self._find_sorted({**scope, sequence: {"$gt": after}}, sequence, limit)
        return rows

    async def _find_sorted(self, query: Document, sequence: str, limit: int) -> list[Document]:
        cursor = self._collections.records.find(
            query, {"_id": False}, sort=[(sequence, ASCENDING)], limit=limit, session=self._session
        )
        return [document async for document in cursor]

    async def list_runs(self, session_id: str) -> list[RunState]:
        cursor = self._collections.runs.find(
            {"session_id": session_id}, sort=[("start_order", ASCENDING)], session=self._session
        )
        runs = [await self._run_state(document) async for document in cursor]
        self._runs.update((run.run_id, run) for run in runs)
        return runs

    async def purge(self, session_id: str) -> None:
        tombstone: Document = {"_id": session_id, "tombstone": True, "purged_at": utc_now_ms()}
        loaded = self._sessions.get(session_id)
        if loaded is None or loaded.get("tombstone"):
            # The rules load the session first; without it, overwrite whatever is there.
            await self._collections.sessions.replace_one(
                {"_id": session_id}, tombstone, upsert=True, session=self._session
            )
        else:
            result = await self._collections.sessions.replace_one(
                {"_id": session_id, "revision": loaded["revision"]}, tombstone, session=self._session
            )
            if result.matched_count != 1:
                raise WriteRaceError(f"session {session_id!r} changed meanwhile")
        self._sessions[session_id] = tombstone
        await self._collections.runs.delete_many({"session_id": session_id}, session=self._session)
        await self._collections.records.delete_many({"session_id": session_id}, session=self._session)
        self._runs = {
            run_id: run for run_id, run in self._runs.items() if run and run.session_id != session_id
        }


# --- the runner ---------------------------------------------------------------------------------


def _unavailable(error: BaseException) -> StoreError:
    return StoreError(ErrorCode.UNAVAILABLE, f"database unavailable: {type(error).__name__}: {error}")


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, WriteRaceError):
        return True
    if isinstance(error, ServerSelectionTimeoutError):
        # No server within the selection timeout: trying again at once would only wait again.
        return False
    return isinstance(error, PyMongoError) and error.has_error_label("TransientTransactionError")


def _too_large(error: BaseException) -> bool:
    return isinstance(error, DocumentTooLarge) or (
        isinstance(error, OperationFailure) and error.code == _BSON_OBJECT_TOO_LARGE
    )


class TransactionLoop(Generic[X]):
    """One MongoDB transaction per operation, retried whole on a transient conflict.

    Shared by the runtime store and the memory store: a subclass says how to open its transaction
    object on a session (`_open`) and what to release when the attempt ends (`_close`).
    """

    def __init__(self, client: AsyncMongoClient[Document], policy: TransactionPolicy | None) -> None:
        self._client = client
        self._policy = policy or TransactionPolicy()
        self.attempts = 0
        """Transactions started, conflicts included (an operational figure)."""

    def _open(self, session: AsyncClientSession) -> X:
        raise NotImplementedError

    def _close(self, transaction: X) -> None:
        """Release what the attempt held (nothing by default)."""

    async def run_transaction(self, operation: Callable[[X], Awaitable[T]]) -> T:
        """Apply `operation` in one transaction, retried on conflicts; UNAVAILABLE when they persist."""
        policy = self._policy
        last: BaseException | None = None
        for attempt in range(1, policy.max_attempts + 1):
            if attempt > 1:
                await asyncio.sleep(policy.backoff(attempt - 1))
            self.attempts += 1
            try:
                return await self._attempt(operation)
            except StoreError:
                raise
            except (PyMongoError, DocumentTooLarge, WriteRaceError) as error:
                if _too_large(error):
                    # Permanent: resending would fail the same way (16 MiB per BSON document).
                    raise StoreError(ErrorCode.INVALID_ARGUMENT, f"document too large: {error}") from error
                if not _is_transient(error):
                    raise _unavailable(error) from error
                last = error
        assert last is not None
        raise StoreError(
            ErrorCode.UNAVAILABLE, f"gave up after {policy.max_attempts} conflicting attempts: {last}"
        ) from last

    async def _attempt(self, operation: Callable[[X], Awaitable[T]]) -> T:
        policy = self._policy
        async with self._client.start_session() as session:
            await session.start_transaction(
                read_concern=policy.read_concern, write_concern=policy.write_concern
            )
            transaction = self._open(session)
            try:
                try:
                    result = await operation(transaction)
                except BaseException:
                    await session.abort_transaction()
                    raise
                await self._commit(session)
                return result
            finally:
                self._close(transaction)

    async def _commit(self, session: AsyncClientSession) -> None:
        for attempt in range(1, self._policy.commit_attempts + 1):
            try:
                await session.commit_transaction()
                return
            except PyMongoError as error:
                unknown = error.has_error_label("UnknownTransactionCommitResult")
                if not unknown or attempt == self._policy.commit_attempts:
                    raise


class MongoTransactions(TransactionLoop["MongoTransaction"]):
    """The `TransactionRunner` over MongoDB: one transaction per operation, retried whole."""

    def __init__(
        self,
        client: AsyncMongoClient[Document],
        database: AsyncDatabase[Document],
        keyring: Keyring,
        policy: TransactionPolicy | None = None,
    ) -> None:
        super().__init__(client, policy)
        self._collections = _Collections(database)
        self._turns = KeyedTurns()
        self._keyring = keyring

    def _open(self, session: AsyncClientSession) -> MongoTransaction:
        return MongoTransaction(self._collections, session, self._turns, self._keyring)

    def _close(self, transaction: MongoTransaction) -> None:
        transaction.end_turn()

    async def run(self, operation: Callable[[StoreTransaction], Awaitable[T]]) -> T:
        return await self.run_transaction(operation)


# --- the store ----------------------------------------------------------------------------------


async def ensure_indexes(database: AsyncDatabase[Document], indexes: Mapping[str, list[IndexModel]]) -> None:
    """Create every secondary index; idempotent (an existing identical index is left as it is)."""
    for name, models in indexes.items():
        await database[name].create_indexes(models)


async def load_generated_secret(
    database: AsyncDatabase[Document], write_concern: WriteConcern, secret_id: str
) -> bytes:
    """32 random bytes kept in `meta` under `secret_id`, generated by the first store that asks."""
    meta = database.get_collection(META, write_concern=write_concern)
    for _ in range(2):
        try:
            document = await meta.find_one_and_update(
                {"_id": secret_id},
                {"$setOnInsert": {"secret": secrets.token_bytes(32), "created_at": datetime.now(UTC)}},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError:
            continue  # another store inserted it at the same moment: read theirs
        if document is not None:
            return bytes(document["secret"])
    raise StoreError(ErrorCode.UNAVAILABLE, f"could not read {secret_id!r} from {META!r}")


def client_options(uri: str, server_selection_timeout_ms: int) -> dict[str, Any]:
    """Keyword options for `AsyncMongoClient`: UTC-aware dates, and no retryable writes unless asked.

    SecantusDB slows ~10x with retryable writes (PLATFORM_NOTES); operations are retried whole here
    and by the caller after UNAVAILABLE, so the driver's own write retry adds nothing.
    """
    options: dict[str, Any] = {"tz_aware": True, "serverSelectionTimeoutMS": server_selection_timeout_ms}
    if "retrywrites=" not in uri.lower():
        options["retryWrites"] = False
    return options


async def with_own_client(
    uri: str,
    server_selection_timeout_ms: int,
    open_store: Callable[[AsyncMongoClient[Document]], Awaitable[T]],
) -> T:
    """A store opened on a client of its own; the client is closed again if opening fails."""
    client: AsyncMongoClient[Document] = AsyncMongoClient(
        uri, **client_options(uri, server_selection_timeout_ms)
    )
    try:
        return await open_store(client)
    except BaseException:
        await client.close()
        raise


class MongoStore(RuleStore):
    """The `Store` on MongoDB; build it with `connect` (owns its client) or `open` (shares one)."""

    def __init__(
        self,
        client: AsyncMongoClient[Document],
        database: AsyncDatabase[Document],
        cursor_secret: bytes,
        master_key: bytes,
        *,
        policy: TransactionPolicy | None = None,
        owns_client: bool = False,
        clock: Callable[[], datetime] = utc_now_ms,
    ) -> None:
        self.transactions = MongoTransactions(client, database, Keyring(master_key), policy)
        super().__init__(self.transactions, cursor_secret, clock)
        self.client = client
        self.database = database
        self._owns_client = owns_client

    @classmethod
    async def open(
        cls,
        client: AsyncMongoClient[Document],
        database: str,
        *,
        cursor_secret: bytes | None = None,
        master_key: bytes | None = None,
        policy: TransactionPolicy | None = None,
        owns_client: bool = False,
        clock: Callable[[], datetime] = utc_now_ms,
    ) -> MongoStore:
        """A store on `database` through an existing client; creates indexes and the cursor secret.

        `master_key` wraps the principals' data keys (the memory store's, `keys`); unset, the one
        generated once and kept in `meta`. The client must be tz-aware (`client_options`);
        SecantusDB needs retryable writes off.
        """
        policy = policy or TransactionPolicy()
        db = client.get_database(database, write_concern=policy.write_concern)
        try:
            await ensure_indexes(db, INDEXES)
            secret = cursor_secret or await load_generated_secret(db, policy.write_concern, CURSOR_SECRET_ID)
            key = master_key or await load_generated_secret(db, policy.write_concern, MASTER_KEY_ID)
        except PyMongoError as error:
            raise _unavailable(error) from error
        return cls(client, db, secret, key, policy=policy, owns_client=owns_client, clock=clock)

    @classmethod
    async def connect(
        cls,
        uri: str,
        database: str,
        *,
        cursor_secret: bytes | None = None,
        master_key: bytes | None = None,
        policy: TransactionPolicy | None = None,
        server_selection_timeout_ms: int = 5_000,
        clock: Callable[[], datetime] = utc_now_ms,
    ) -> MongoStore:
        """A store with its own client on `uri` (`retryWrites=false` unless the URI says otherwise)."""
        return await with_own_client(
            uri,
            server_selection_timeout_ms,
            lambda client: cls.open(
                client,
                database,
                cursor_secret=cursor_secret,
                master_key=master_key,
                policy=policy,
                owns_client=True,
                clock=clock,
            ),
        )

    async def drop_database(self) -> None:
        """Delete every collection of this store (tests)."""
        await self.client.drop_database(self.database.name)

    async def close(self) -> None:
        """Close the client if this store opened it."""
        if self._owns_client:
            await self.client.close()
