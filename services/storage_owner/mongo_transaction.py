"""One operation of the runtime store in one MongoDB transaction: its documents, conditional
saves and sealing (STORE_CONTRACT §6.1, §8).

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
- `records`: the records of an operation, consecutive records of one run in one *range* document
  (`seq` and `session_seq` its first record's, `last_seq` and `last_session_seq` its last's, the
  keys in an `event_key` array, the records in `records`), a record alone in a document of its
  own (its `seq`, `session_seq` (0 when sessionless) and `event_key`): a step of five records is
  one insert and one entry of each index, not five (a transaction inserting five record
  documents cost SecantusDB 5.6 ms, one holding the five 3.2). Databases written before ranges
  hold only documents of one record, which read as they always did. Unique `(run_id,
  event_key)` (multikey over a range's keys) and `(run_id, seq)`; `(session_id, session_seq)`
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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

import bson
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, InsertOne, ReplaceOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import ClientBulkWriteException, DocumentTooLarge, PyMongoError

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.store import ERASED_PAYLOAD, Checkpoint, Record
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.context import run_sealing_principal
from quipu.services.domain.store.state import RunState, SessionState, StoreTransaction
from quipu.services.kit.sealing import BrokenSealError, OtherKeyError, open_sealed, seal
from quipu.services.storage_owner.document_hints import AttemptDocuments, DocumentHints, Key
from quipu.services.storage_owner.keys import KEYS, Keyring, PrincipalKeys, fingerprint
from quipu.services.storage_owner.mongo import Document, TransactionLoop, TransactionPolicy, WriteRaceError

T = TypeVar("T")

SESSIONS = "sessions"
RUNS = "runs"
RECORDS = "records"
_DUPLICATE_KEY = 11000
_BSON_OBJECT_TOO_LARGE = 10334
_MAX_BSON_SIZE = 16 * 1024 * 1024
_WRITE_CONFLICT = 112


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
    fields = {key: value for key, value in document.items() if key not in ("_id", "checkpoint", SEALED_BY)}
    fields["labels"] = dict(fields["labels"])
    return RunState.model_validate({**fields, "checkpoint": checkpoint})


SEALED_BY = "sealed_by"
"""A run document's fingerprint of the data key every record of its log is sealed under, kept while
its `log_chain` stands for that log: a principal forgotten meanwhile (their records erased, the next
sealed under a fresh key) leaves the chain standing for words no longer readable, so a run whose
records lie under two keys keeps no chain, and one whose key is gone has none that stands."""


def run_owner(run: RunState) -> tuple[str, str]:
    """(tenant, principal) whose data key seals the run's texts."""
    return run.tenant_id, run_sealing_principal(run.principal_id, run.session_id, run.run_id)


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


def _refuse_too_large(document: Document) -> int:
    """DocumentTooLarge before sending a document over MongoDB's 16 MiB limit: the database's own
    refusal comes back as an error whose message pymongo formats with the whole document in it,
    which held the owner's event loop for seconds. Returns the document's BSON size."""
    size = len(bson.encode(document))
    if size > _MAX_BSON_SIZE:
        raise DocumentTooLarge("a record or run is over the 16 MiB BSON document limit")
    return size


MAX_RANGE_RECORDS = 128
"""Records one document holds at most: how far before a window a range that reaches into it begins."""

_SHARED = ("run_id", "session_id", "tenant_id", "principal_id")
"""The fields every record of one range document has in common (one run's, sealed for its owner)."""


def _follows(previous: Document, document: Document) -> bool:
    """Whether `document` (one record's) continues `previous`'s range: the next record of the same
    run, and of its session."""
    return (
        all(previous[field] == document[field] for field in _SHARED)
        and document["seq"] == previous["seq"] + 1
        and (
            document["session_seq"] == previous["session_seq"] + 1
            or document["session_seq"] == 0 == previous["session_seq"]
        )
    )


def _ranges(documents: list[Document]) -> list[Document]:
    """What to insert for `documents` (one a record, in order): consecutive records of one run in
    one range document (one insert, one entry of each index, instead of one a record), each range
    at most `MAX_RANGE_RECORDS` records and 16 MiB; a record alone keeps its own document."""
    groups: list[list[Document]] = []
    sizes: list[int] = []
    for document in documents:
        size = _refuse_too_large(document)
        group = groups[-1] if groups else None
        if group is not None and len(group) < MAX_RANGE_RECORDS and _follows(group[-1], document):
            group.append(document)
            sizes[-1] += size
        else:
            groups.append([document])
            sizes.append(size)
    return [ranged for group, size in zip(groups, sizes, strict=True) for ranged in _fitted(group, size)]


def _fitted(group: list[Document], singles_size: int) -> list[Document]:
    """`group` in range documents that fit; `singles_size`, at least its records' documents' sizes
    summed. A range holds each record once (less the fields they share) and its key once more, so
    it is under twice that: under a third of the limit it fits without being encoded to measure."""
    if len(group) == 1:
        return group
    document = _range_document(group)
    if singles_size <= _MAX_BSON_SIZE // 3 or len(bson.encode(document)) <= _MAX_BSON_SIZE:
        return [document]
    half = len(group) // 2
    return _fitted(group[:half], singles_size) + _fitted(group[half:], singles_size)


def _range_document(group: list[Document]) -> Document:
    first, last = group[0], group[-1]
    return {
        **{field: first[field] for field in _SHARED},
        "seq": first["seq"],
        "last_seq": last["seq"],
        "session_seq": first["session_seq"],
        "last_session_seq": last["session_seq"],
        # An array: the unique (run_id, event_key) index holds each key of the range.
        "event_key": [document["event_key"] for document in group],
        "records": [
            {key: value for key, value in document.items() if key not in (*_SHARED, "seq", "session_seq")}
            for document in group
        ],
    }


def _rows(document: Document) -> list[Document]:
    """A stored document as its records' documents, one a record (a range's, else itself)."""
    records = document.get("records")
    if records is None:
        return [document]
    shared = {field: document[field] for field in _SHARED}
    first_session_seq = document["session_seq"]
    return [
        {
            **shared,
            **record,
            "seq": document["seq"] + index,
            "session_seq": first_session_seq + index if first_session_seq else 0,
        }
        for index, record in enumerate(records)
    ]


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
    anyway), so the rules may load a run or a session twice for one round trip. Sessions and runs
    come from `documents`: the transaction's own, else a hint, confirmed before the commit
    (`document_hints`), else a find.
    """

    def __init__(
        self,
        collections: _Collections,
        session: AsyncClientSession,
        turns: KeyedTurns | None,
        keyring: Keyring,
        documents: AttemptDocuments,
        *,
        guessing: bool = False,
    ) -> None:
        self._collections = collections
        self._session = session
        self.documents = documents
        self._turns = turns
        self._keys = PrincipalKeys(collections.keys, session, keyring)
        self._turn: str | None = None
        self._sessions: dict[str, Document | None] = {}
        self._runs: dict[str, RunState | None] = {}
        self._run_documents: dict[str, Document | None] = {}
        self.wrote = False
        """Whether this operation sent a write (or may have: a data key made for sealing)."""
        self._pending: list[InsertOne[Document] | ReplaceOne[Document]] = []
        self._replacing = 0
        self._saving: list[tuple[Key, Document]] = []
        self._guessing = guessing
        self._guessed: dict[str, set[str]] = {}
        """Record keys answered absent unread (`likely_absent`), by run, until this transaction
        inserts them (the unique index then decides) or confirms them by a read."""

    @property
    def session(self) -> AsyncClientSession:
        """The database session the transaction runs on (a group's operations share one)."""
        return self._session

    async def _take_turn(self, key: str) -> None:
        if self._turn is None and self._turns is not None:
            self._turn = key
            await self._turns.wait(key)

    def end_turn(self) -> None:
        """Let the next operation on this transaction's key go (called when the transaction ends)."""
        if self._turn is not None and self._turns is not None:
            self._turns.done(self._turn)
            self._turn = None

    async def _session_document(self, session_id: str) -> Document | None:
        await self._take_turn(f"session:{session_id}")
        if session_id not in self._sessions:
            self._sessions[session_id] = await self._document(SESSIONS, session_id)
        return self._sessions[session_id]

    def _collection(self, name: str) -> AsyncCollection[Document]:
        return self._collections.sessions if name == SESSIONS else self._collections.runs

    async def _document(self, name: str, identifier: str, *, likely_absent: bool = False) -> Document | None:
        """A session's or run's document: as this transaction knows it, else as a hint has it,
        else absent when `likely_absent` (confirmed as a hint is), else found."""
        found, document = self.documents.lookup((name, identifier))
        if not found and likely_absent and self._guessing:
            self.documents.guess_absent((name, identifier))
        elif not found:
            await self.flush()
            document = await self._collection(name).find_one({"_id": identifier}, session=self._session)
            self.documents.read((name, identifier), document)
        return document

    async def confirm(self) -> None:
        """Read each hinted document this operation neither wrote nor read, and each record key
        answered absent unread and not inserted, in the snapshot: WriteRaceError when a document is
        not the hint's version or a key is there (the attempt is retried without them)."""
        for key, _ in self.documents.unconfirmed():
            found = await self._collection(key[0]).find_one({"_id": key[1]}, session=self._session)
            self.documents.confirm(key, found)
        guessed, self._guessed = self._guessed, {}
        for run_id, event_keys in guessed.items():
            if not event_keys:
                continue  # every one inserted
            query = {"run_id": run_id, "event_key": {"$in": sorted(event_keys)}}
            if await self._collections.records.find_one(query, {"_id": True}, session=self._session):
                raise WriteRaceError("a record this write took for new was there")

    async def is_tombstoned(self, session_id: str) -> bool:
        document = await self._session_document(session_id)
        return document is not None and bool(document.get("tombstone"))

    async def load_session(self, session_id: str) -> SessionState | None:
        document = await self._session_document(session_id)
        return _session_state(document) if document is not None else None

    async def save_session(self, state: SessionState) -> None:
        document = _session_document(state)
        await self._save(SESSIONS, document, state.revision)
        self._sessions[state.session.session_id] = document

    async def load_run(self, run_id: str, *, likely_absent: bool = False) -> RunState | None:
        await self._take_turn(f"run:{run_id}")
        if run_id not in self._runs:
            document = await self._document(RUNS, run_id, likely_absent=likely_absent)
            self._run_documents[run_id] = document
            self._runs[run_id] = await self._run_state(document) if document is not None else None
        return self._runs[run_id]

    async def save_run(self, state: RunState) -> None:
        document = await self._run_document(state)
        self._keep_log_seal(state, document)
        await self._save(RUNS, document, state.revision)
        self._runs[state.run_id] = state
        self._run_documents[state.run_id] = document

    def _keep_log_seal(self, state: RunState, document: Document) -> None:
        """Name the key the run's log is sealed under (`SEALED_BY`), or drop its chain when the
        log's records lie under more than one key, or under one this transaction cannot name."""
        if state.log_chain is None:
            return
        prior = self._run_documents.get(state.run_id)
        prior_count, prior_seal = (prior.get("record_count", 0), prior.get(SEALED_BY)) if prior else (0, None)
        key = self._keys.known(*run_owner(state))
        if key is None:
            # Nothing sealed here: no record was written, so the log and its key are as they were.
            if prior_seal is not None and prior_count == state.record_count:
                document[SEALED_BY] = prior_seal
            else:
                document["log_chain"] = None
            return
        seal = fingerprint(key)
        if prior_count == 0 or prior_seal == seal:
            document[SEALED_BY] = seal
        else:
            document["log_chain"] = None

    async def log_chain(self, run: RunState) -> str | None:
        if run.log_chain is None:
            return None
        document = self._run_documents.get(run.run_id)
        seal = document.get(SEALED_BY) if document is not None else None
        if seal is None:
            return None
        key = await self._keys.reading_key(*run_owner(run))  # the write seals under it: read anyway
        return run.log_chain if key is not None and fingerprint(key) == seal else None

    # -- sealing -----------------------------------------------------------------------------

    async def _run_document(self, state: RunState) -> Document:
        checkpoint = None
        if state.checkpoint is not None:
            self.wrote = True
            key = await self._keys.writing_key(*run_owner(state), fence=False)
            data = seal(key, state.checkpoint.data, _checkpoint_context(state.run_id))
            checkpoint = {"suspension_id": state.checkpoint.suspension_id, "data": data}
        return _run_document(state, checkpoint)

    async def _run_state(self, document: Document) -> RunState:
        sealed = document.get("checkpoint")
        checkpoint = None
        if sealed is not None:
            if "principal_id" in document:
                principal_id = run_sealing_principal(
                    document["principal_id"], document["session_id"], document["run_id"]
                )
                key = await self._keys.reading_key(document["tenant_id"], principal_id)
                data = _opened(key, bytes(sealed["data"]), _checkpoint_context(document["_id"]))
            else:
                data = bytes(sealed["data"])  # written before sealing
            checkpoint = Checkpoint(suspension_id=sealed["suspension_id"], data=data)
        return _run_state(document, checkpoint)

    async def _record_document(self, run: RunState, record: Record, session_sequence: int) -> Document:
        tenant_id, principal_id = run_owner(run)
        self.wrote = True  # the key may be created here
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

    async def _save(self, name: str, document: Document, revision: int) -> None:
        """Insert at revision 1, else replace the document written at `revision - 1` (at `flush`)."""
        _refuse_too_large(document)
        namespace = self._collection(name).full_name
        self._saving.append(((name, document["_id"]), document))
        if revision == 1:
            self._pending.append(InsertOne(document, namespace=namespace))
        else:
            filter_ = {"_id": document["_id"], "revision": revision - 1}
            self._pending.append(ReplaceOne(filter_, document, namespace=namespace))
            self._replacing += 1

    async def flush(self) -> None:
        """Send the writes saved so far in one command (MongoDB 8's client-level bulkWrite).

        The rules write only after every check, so an operation's records, run and session go in
        one round trip instead of one each; a refused operation sends none. An insert meeting an
        existing key, or a replace whose revision moved, means another writer came first.
        """
        if not self._pending:
            return
        if self._session.operation_time is None:
            # Nothing sent yet: the transaction's first command carries its read concern, which
            # bulkWrite does not take (SecantusDB refuses it). Reading the hints first sends a find.
            await self.confirm()
        writes, replacing, saving = self._pending, self._replacing, self._saving
        self._pending, self._replacing, self._saving = [], 0, []
        self.wrote = True
        try:
            result = await self._session.client.bulk_write(writes, session=self._session)
        except ClientBulkWriteException as error:
            if isinstance(error.error, PyMongoError):
                raise error.error from None  # its labels (TransientTransactionError) decide the retry
            codes = {failure.get("code") for failure in (error.details or {}).get("writeErrors") or []}
            if _BSON_OBJECT_TOO_LARGE in codes:
                # Its details hold the documents: only the rule travels on (a permanent refusal).
                raise DocumentTooLarge("a record is over the 16 MiB BSON document limit") from None
            if codes <= {_DUPLICATE_KEY, _WRITE_CONFLICT}:
                # The rules checked keys, sequences and revisions in this snapshot: another writer won.
                raise WriteRaceError("a record, run or session was written meanwhile") from error
            raise
        if result.matched_count != replacing:
            raise WriteRaceError("a run or session changed meanwhile")
        for key, document in saving:
            self.documents.read(key, document)  # each save matched the revision it was decided on

    async def load_record(self, run_id: str, event_key: str) -> Record | None:
        await self.flush()
        document = await self._collections.records.find_one(
            {"run_id": run_id, "event_key": event_key}, {"_id": False}, session=self._session
        )
        rows = [row for row in _rows(document) if row["event_key"] == event_key] if document else []
        return await self._record(rows[0]) if rows else None

    async def load_records(
        self, run_id: str, event_keys: list[str], *, likely_absent: Collection[str] = ()
    ) -> dict[str, Record]:
        if self._guessing and likely_absent:
            # A new step's keys: its insert confirms them (the unique index), else `confirm` reads.
            self._guessed.setdefault(run_id, set()).update(likely_absent)
            event_keys = [key for key in event_keys if key not in likely_absent]
            if not event_keys:
                return {}
        if len(event_keys) == 1:
            found = await self.load_record(run_id, event_keys[0])
            return {} if found is None else {found.event_key: found}
        await self.flush()
        cursor = self._collections.records.find(
            {"run_id": run_id, "event_key": {"$in": event_keys}}, {"_id": False}, session=self._session
        )
        wanted = set(event_keys)
        return {
            row["event_key"]: await self._record(row)
            async for document in cursor
            for row in _rows(document)
            if row["event_key"] in wanted
        }

    async def insert_records(self, rows: list[tuple[RunState, Record, int]]) -> None:
        namespace = self._collections.records.full_name
        documents = [await self._record_document(run, record, sequence) for run, record, sequence in rows]
        for _, record, _ in rows:
            self._guessed.get(record.run_id, set()).discard(record.event_key)
        for document in _ranges(documents):
            self._pending.append(InsertOne(document, namespace=namespace))

    async def list_records(self, run_id: str, after: int, limit: int) -> list[Record]:
        run = self._runs.get(run_id)
        rows = await self._window(
            {"run_id": run_id}, "seq", after, limit, run.record_count if run is not None else None
        )
        return [await self._record(row) for row in rows]

    async def list_session_records(self, session_id: str, after: int, limit: int) -> list[tuple[int, Record]]:
        document = self._sessions.get(session_id)
        count = document.get("record_count") if document is not None else None
        rows = await self._window({"session_id": session_id}, "session_seq", after, limit, count)
        return [(row["session_seq"], await self._record(row)) for row in rows]

    async def _window(
        self, scope: Document, sequence: str, after: int, limit: int, count: int | None
    ) -> list[Document]:
        """Up to `limit` records of `scope` with `sequence` > after, in order (one row each).

        SecantusDB reads every index entry a range matches before it applies the limit, so an
        open range (`> after`) costs as much as the rest of the log. Sequences are gapless (each is
        the previous count + 1 under a conditional save, and a purge removes a session whole),
        so the closed window (after, after + limit] holds exactly the next page, but for the
        records of a range document that begins at or before `after` (`_straddling`). Should the
        count read in this transaction promise more than the window returned, the open range is used.
        """
        window = {"$gt": after, "$lte": after + limit} if count is not None else {"$gt": after}
        rows = await self._rows_from(scope, sequence, window, after, limit, count)
        if count is not None and len(rows) < min(limit, count - after):
            rows = await self._rows_from(scope, sequence, {"$gt": after}, after, limit, None)
        return rows

    async def _rows_from(
        self, scope: Document, sequence: str, window: Document, after: int, limit: int, count: int | None
    ) -> list[Document]:
        documents = await self._find_sorted({**scope, sequence: window}, sequence, limit)
        rows = [row for document in documents for row in _rows(document)]
        behind = count is None or after < count
        if after > 0 and behind and (not rows or rows[0][sequence] != after + 1):
            rows = await self._straddling(scope, sequence, after) + rows
        return rows[:limit]

    async def _straddling(self, scope: Document, sequence: str, after: int) -> list[Document]:
        """The rows past `after` of the range document that holds `after` and what follows it."""
        await self.flush()
        lowest = max(0, after - MAX_RANGE_RECORDS)
        document = await self._collections.records.find_one(
            {**scope, sequence: {"$gt": lowest, "$lte": after}},
            {"_id": False},
            sort=[(sequence, DESCENDING)],
            session=self._session,
        )
        return [row for row in _rows(document) if row[sequence] > after] if document else []

    async def _find_sorted(self, query: Document, sequence: str, limit: int) -> list[Document]:
        await self.flush()
        cursor = self._collections.records.find(
            query, {"_id": False}, sort=[(sequence, ASCENDING)], limit=limit, session=self._session
        )
        return [document async for document in cursor]

    async def list_runs(self, session_id: str) -> list[RunState]:
        await self.flush()
        cursor = self._collections.runs.find(
            {"session_id": session_id}, sort=[("start_order", ASCENDING)], session=self._session
        )
        documents = [document async for document in cursor]
        for document in documents:
            self.documents.read((RUNS, document["_id"]), document)
        runs = [await self._run_state(document) for document in documents]
        self._runs.update((run.run_id, run) for run in runs)
        return runs

    async def purge(self, session_id: str) -> None:
        await self.flush()
        self.wrote = True
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
        self.documents.read((SESSIONS, session_id), tombstone)
        await self._collections.runs.delete_many({"session_id": session_id}, session=self._session)
        self.documents.gone(RUNS, "session_id", session_id)
        await self._collections.records.delete_many({"session_id": session_id}, session=self._session)
        self._runs = {
            run_id: run for run_id, run in self._runs.items() if run and run.session_id != session_id
        }


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
        self._reading = _Collections(database.with_options(read_concern=self._policy.single_read_concern))
        # Grouped, no turns: a group holding one session's turn could wait for another's (the
        # owner's consumer keeps each session's commands in order; the database decides the rest).
        self._turns = None if self.grouping else KeyedTurns()
        self._keyring = keyring
        size = self._policy.document_hints
        self._hints = DocumentHints(size) if size > 0 else None
        self._attempts: dict[int, AttemptDocuments] = {}
        """What each attempt under way knows, by its session (the operations of a group share it)."""

    def _open(
        self, session: AsyncClientSession, *, reading: bool = False, retrying: bool = False
    ) -> MongoTransaction:
        if reading:  # no snapshot to confirm a hint in: every document is found
            documents = AttemptDocuments(None)
        else:
            documents = self._attempts.setdefault(id(session), AttemptDocuments(self._hints))
        documents.opened += 1
        collections = self._reading if reading else self._collections
        return MongoTransaction(
            collections, session, self._turns, self._keyring, documents, guessing=not (reading or retrying)
        )

    def _close(self, transaction: MongoTransaction) -> None:
        documents = transaction.documents
        documents.opened -= 1
        if documents.opened == 0:
            # Before the turn ends: the session's next operation here starts from what this committed.
            documents.settle()
            self._attempts.pop(id(transaction.session), None)  # a read's is not there
        transaction.end_turn()

    def _wrote(self, transaction: MongoTransaction) -> bool:
        return transaction.wrote

    async def _finish(self, transaction: MongoTransaction) -> None:
        await transaction.flush()
        await transaction.confirm()

    async def _confirm(self, transaction: MongoTransaction) -> None:
        await transaction.confirm()

    def _committed(self, transaction: MongoTransaction) -> None:
        transaction.documents.committed = True

    async def run(self, operation: Callable[[StoreTransaction], Awaitable[T]]) -> T:
        return await self.run_transaction(operation)
