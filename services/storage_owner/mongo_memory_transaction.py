"""One operation of the memory store in one MongoDB transaction, every text sealed at rest.

Encryption: every principal has a random 256-bit data key, stored in `memory_keys` wrapped
(AES-GCM) by the owner's master key (`QUIPU_OWNER_MASTER_KEY`, else one generated once and kept
in `meta`). History texts, summaries, profiles, fact texts (current and audit), the recorded
changes of an idempotency key and the index terms are sealed with AES-256-GCM under the data key;
the associated data names the document (collection and id), so a ciphertext moved to another
document does not open. Identifiers, sequences, versions and times stay in clear: they are what
the queries and the indexes need. Every write that seals something also bumps the key document,
so a write racing `forget_principal` meets a write conflict and is retried after it (then under
a fresh key) instead of committing words under a key that is gone.

Layout (collections prefixed `memory_`; every query path is indexed, see INDEXES):

- `memory_keys`: `_id` = key id of (tenant, principal); wrapped data key.
- `memory_sessions`: `_id` = session id; the session's owner and last seq.
- `memory_history`: one row per message; unique `(session_id, seq)`, `(session_id, turn_id)`.
- `memory_summaries`: `_id` = session id.
- `memory_facts`: `_id` = fact id; `memory_audit`: `_id` = fact id/version, index `fact_id`.
- `memory_fact_changes`: `_id` = hash of (tenant, principal, idempotency key).
- `memory_profiles`: `_id` = hash of the scope.
- `memory_index`: `_id` = fact id.
- `memory_forgotten`: forget's marks (`tombstone`), `_id` = a digest only: the person's, with the
  time of their last forget, and one for every turn a forget erased, with the forget's time
  (`turn`, index `(turn, at)`: expired turn marks are dropped). No words, no id in clear.

All but `memory_keys` and `memory_forgotten` carry `(tenant_id, principal_id)`, indexed, for the
principal's reads and for forgetting.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from pydantic import TypeAdapter
from pymongo import ASCENDING, AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from quipu.contracts.memory import (
    Fact,
    FactChanged,
    HistoryMessage,
    HistoryRole,
    IndexEntry,
    MemoryScope,
    Profile,
    Provenance,
    SessionSummary,
)
from quipu.services.domain.memory.tombstone import Forgetting, digest, person_mark, turn_mark
from quipu.services.domain.memory.transaction import MemorySession, MemoryTransaction
from quipu.services.storage_owner.keys import KEYS, Keyring, PrincipalKeys, unwrap, wrap
from quipu.services.storage_owner.mongo import Document, TransactionLoop, TransactionPolicy, WriteRaceError

T = TypeVar("T")


SESSIONS = "memory_sessions"
HISTORY = "memory_history"
SUMMARIES = "memory_summaries"
FACTS = "memory_facts"
AUDIT = "memory_audit"
FACT_CHANGES = "memory_fact_changes"
PROFILES = "memory_profiles"
INDEX = "memory_index"
FORGOTTEN = "memory_forgotten"
COLLECTIONS = (KEYS, SESSIONS, HISTORY, SUMMARIES, FACTS, AUDIT, FACT_CHANGES, PROFILES, INDEX, FORGOTTEN)

_CHANGES = TypeAdapter(list[FactChanged])


# --- one transaction ----------------------------------------------------------------------------


class _Collections:
    def __init__(self, database: AsyncDatabase[Document]) -> None:
        self.keys: AsyncCollection[Document] = database[KEYS]
        self.sessions: AsyncCollection[Document] = database[SESSIONS]
        self.history: AsyncCollection[Document] = database[HISTORY]
        self.summaries: AsyncCollection[Document] = database[SUMMARIES]
        self.facts: AsyncCollection[Document] = database[FACTS]
        self.audit: AsyncCollection[Document] = database[AUDIT]
        self.fact_changes: AsyncCollection[Document] = database[FACT_CHANGES]
        self.profiles: AsyncCollection[Document] = database[PROFILES]
        self.index: AsyncCollection[Document] = database[INDEX]
        self.forgotten: AsyncCollection[Document] = database[FORGOTTEN]


def _principal_of(document: Document) -> tuple[str, str]:
    return (document["tenant_id"], document["principal_id"])


def _who(tenant_id: str, principal_id: str) -> Document:
    return {"tenant_id": tenant_id, "principal_id": principal_id}


def _scope_fields(scope: MemoryScope) -> Document:
    return {"tenant_id": scope.tenant_id, "principal_id": scope.principal_id, "agent_id": scope.agent_id}


def _scope(document: Document) -> MemoryScope:
    return MemoryScope(
        tenant_id=document["tenant_id"], principal_id=document["principal_id"], agent_id=document["agent_id"]
    )


def _profile_id(scope: MemoryScope) -> str:
    return digest("profile", scope.tenant_id, scope.principal_id, scope.agent_id)


def _changes_id(scope: MemoryScope, idempotency_key: str) -> str:
    return digest("changes", scope.tenant_id, scope.principal_id, idempotency_key)


class MongoMemoryTransaction:
    """The `MemoryTransaction` port inside one MongoDB transaction; seals and opens texts."""

    def __init__(
        self,
        collections: _Collections,
        session: AsyncClientSession,
        keyring: Keyring,
        *,
        guessing: bool = False,
    ) -> None:
        self._c = collections
        self._session = session
        self._keys = PrincipalKeys(collections.keys, session, keyring)
        self._guessing = guessing
        self._guessed: set[str] = set()
        """Sessions answered absent unread (`likely_absent`) and not inserted yet."""
        self.opened_for: set[tuple[str, str]] = set()
        """Whose keys (tenant, principal) opened the texts this transaction read: the people whose
        words its result holds, known without reading anything again."""

    async def _seal_text(self, tenant_id: str, principal_id: str, text: str, context: str) -> bytes:
        # Fenced: a write racing forget_principal conflicts with it (see module docs).
        return wrap(await self._keys.writing_key(tenant_id, principal_id, fence=True), text.encode(), context)

    async def _open_text(self, document: Document, field: str, context: str) -> str | None:
        key = await self._keys.reading_key(*_principal_of(document))
        if key is None:
            return None
        text = unwrap(key, bytes(document[field]), context).decode()
        self.opened_for.add(_principal_of(document))
        return text

    # -- history -------------------------------------------------------------------------------

    async def load_session(self, session_id: str, *, likely_absent: bool = False) -> MemorySession | None:
        if likely_absent and self._guessing:
            self._guessed.add(session_id)
            return None
        document = await self._c.sessions.find_one({"_id": session_id}, session=self._session)
        if document is None:
            return None
        return MemorySession(session_id=session_id, scope=_scope(document), last_seq=document["last_seq"])

    async def save_session(self, session: MemorySession) -> None:
        document = {"_id": session.session_id, **_scope_fields(session.scope), "last_seq": session.last_seq}
        if session.session_id in self._guessed:
            # Taken for new: the insert is what confirms it (the retry reads what was there).
            try:
                await self._c.sessions.insert_one(document, session=self._session)
            except DuplicateKeyError as error:
                raise WriteRaceError("a session this operation took for new was there") from error
            self._guessed.discard(session.session_id)
            return
        await self._c.sessions.replace_one(
            {"_id": session.session_id}, document, upsert=True, session=self._session
        )

    async def confirm(self) -> None:
        """Read each session answered absent unread and not inserted, in the snapshot: WriteRaceError
        when one is there (the attempt is retried, reading it)."""
        guessed, self._guessed = self._guessed, set()
        for session_id in sorted(guessed):
            if await self._c.sessions.find_one({"_id": session_id}, {"_id": True}, session=self._session):
                raise WriteRaceError("a session this operation took for new was there")

    async def _history_rows(self, query: Document, limit: int) -> list[HistoryMessage]:
        cursor = self._c.history.find(query, sort=[("seq", ASCENDING)], limit=limit, session=self._session)
        rows = []
        async for document in cursor:
            context = f"{HISTORY}/{document['session_id']}/{document['seq']}"
            text = await self._open_text(document, "text", context)
            if text is None:
                continue
            rows.append(
                HistoryMessage(
                    session_id=document["session_id"],
                    seq=document["seq"],
                    turn_id=document["turn_id"],
                    role=HistoryRole(document["role"]),
                    text=text,
                    principal_id=document["principal_id"],
                    agent_id=document["agent_id"],
                    created_at=document["created_at"],
                )
            )
        return rows

    async def find_turn(self, session_id: str, turn_id: str) -> list[HistoryMessage]:
        return await self._history_rows({"session_id": session_id, "turn_id": turn_id}, 0)

    async def insert_history(self, session: MemorySession, rows: list[HistoryMessage]) -> None:
        scope = session.scope
        documents = [
            {
                "session_id": row.session_id,
                "seq": row.seq,
                "turn_id": row.turn_id,
                "role": row.role.value,
                "text": await self._seal_text(
                    scope.tenant_id, scope.principal_id, row.text, f"{HISTORY}/{row.session_id}/{row.seq}"
                ),
                "tenant_id": scope.tenant_id,
                "principal_id": row.principal_id,
                "agent_id": row.agent_id,
                "created_at": row.created_at,
            }
            for row in rows
        ]
        try:
            await self._c.history.insert_many(documents, session=self._session)
        except DuplicateKeyError as error:
            raise WriteRaceError(f"history seq of {session.session_id!r} was taken") from error

    async def list_history(self, session_id: str, after_seq: int, limit: int) -> list[HistoryMessage]:
        # Seqs are gapless: the closed window (after, after + limit] is the page, and a closed
        # range keeps SecantusDB from reading the rest of the session (PLATFORM_NOTES).
        window = {"$gt": after_seq, "$lte": after_seq + limit}
        return await self._history_rows({"session_id": session_id, "seq": window}, limit)

    async def history_tail(self, session_id: str, count: int) -> list[HistoryMessage]:
        session = await self.load_session(session_id)
        if session is None or session.last_seq == 0:
            return []  # a session's first turn: claimed, nothing recorded yet
        window = {"$gt": session.last_seq - count, "$lte": session.last_seq}
        return await self._history_rows({"session_id": session_id, "seq": window}, count)

    # -- summaries -----------------------------------------------------------------------------

    async def load_summary(self, session_id: str) -> SessionSummary | None:
        document = await self._c.summaries.find_one({"_id": session_id}, session=self._session)
        if document is None:
            return None
        text = await self._open_text(document, "text", f"{SUMMARIES}/{session_id}/{document['version']}")
        if text is None:
            return None
        return SessionSummary(
            session_id=session_id,
            text=text,
            cursor=document["cursor"],
            version=document["version"],
            model=document["model"],
            updated_at=document["updated_at"],
        )

    async def save_summary(self, session: MemorySession, summary: SessionSummary) -> None:
        scope = session.scope
        context = f"{SUMMARIES}/{summary.session_id}/{summary.version}"
        document = {
            "_id": summary.session_id,
            "tenant_id": scope.tenant_id,
            "principal_id": scope.principal_id,
            "text": await self._seal_text(scope.tenant_id, scope.principal_id, summary.text, context),
            "cursor": summary.cursor,
            "version": summary.version,
            "model": summary.model,
            "updated_at": summary.updated_at,
        }
        # Conditional on the version read in this snapshot: a racing save makes this one retry.
        if summary.version == 1:
            try:
                await self._c.summaries.insert_one(document, session=self._session)
            except DuplicateKeyError as error:
                raise WriteRaceError(f"summary of {summary.session_id!r} was inserted meanwhile") from error
            return
        result = await self._c.summaries.replace_one(
            {"_id": summary.session_id, "version": summary.version - 1}, document, session=self._session
        )
        if result.matched_count != 1:
            raise WriteRaceError(f"summary of {summary.session_id!r} changed meanwhile")

    # -- facts ---------------------------------------------------------------------------------

    async def load_fact_changes(self, scope: MemoryScope, idempotency_key: str) -> list[FactChanged] | None:
        identifier = _changes_id(scope, idempotency_key)
        document = await self._c.fact_changes.find_one({"_id": identifier}, session=self._session)
        if document is None:
            return None
        text = await self._open_text(document, "changes", f"{FACT_CHANGES}/{identifier}")
        return None if text is None else _CHANGES.validate_json(text)

    async def save_fact_changes(
        self, scope: MemoryScope, idempotency_key: str, changes: list[FactChanged]
    ) -> None:
        identifier = _changes_id(scope, idempotency_key)
        sealed = await self._seal_text(
            scope.tenant_id,
            scope.principal_id,
            _CHANGES.dump_json(changes).decode(),
            f"{FACT_CHANGES}/{identifier}",
        )
        try:
            await self._c.fact_changes.insert_one(
                {"_id": identifier, **_who(scope.tenant_id, scope.principal_id), "changes": sealed},
                session=self._session,
            )
        except DuplicateKeyError as error:
            raise WriteRaceError(f"idempotency key {idempotency_key!r} was used meanwhile") from error

    async def _fact_document(self, fact: Fact, identifier: str, context: str) -> Document:
        scope = fact.scope
        return {
            "_id": identifier,
            "fact_id": fact.fact_id,
            **_scope_fields(scope),
            "text": await self._seal_text(scope.tenant_id, scope.principal_id, fact.text, context),
            "created_at": fact.created_at,
            "updated_at": fact.updated_at,
            "provenance": fact.provenance.model_dump(mode="python"),
            "version": fact.version,
        }

    async def _fact(self, document: Document, context: str) -> Fact | None:
        text = await self._open_text(document, "text", context)
        if text is None:
            return None
        return Fact(
            fact_id=document["fact_id"],
            scope=_scope(document),
            text=text,
            created_at=document["created_at"],
            updated_at=document["updated_at"],
            provenance=Provenance.model_validate(document["provenance"]),
            version=document["version"],
        )

    async def load_fact(self, fact_id: str) -> Fact | None:
        document = await self._c.facts.find_one({"_id": fact_id}, session=self._session)
        return (
            None
            if document is None
            else await self._fact(document, f"{FACTS}/{fact_id}/{document['version']}")
        )

    async def fact_id_used(self, fact_id: str) -> bool:
        if await self._c.facts.find_one({"_id": fact_id}, {"_id": True}, session=self._session) is not None:
            return True
        return (
            await self._c.audit.find_one({"fact_id": fact_id}, {"_id": True}, session=self._session)
            is not None
        )

    async def save_fact(self, fact: Fact) -> None:
        document = await self._fact_document(fact, fact.fact_id, f"{FACTS}/{fact.fact_id}/{fact.version}")
        if fact.version == 1:
            try:
                await self._c.facts.insert_one(document, session=self._session)
            except DuplicateKeyError as error:
                raise WriteRaceError(f"fact {fact.fact_id!r} was inserted meanwhile") from error
            return
        result = await self._c.facts.replace_one(
            {"_id": fact.fact_id, "version": fact.version - 1}, document, session=self._session
        )
        if result.matched_count != 1:
            raise WriteRaceError(f"fact {fact.fact_id!r} changed meanwhile")

    async def remove_fact(self, fact_id: str) -> None:
        await self._c.facts.delete_one({"_id": fact_id}, session=self._session)

    async def archive_fact(self, fact: Fact) -> None:
        identifier = f"{fact.fact_id}/{fact.version}"
        document = await self._fact_document(fact, identifier, f"{AUDIT}/{identifier}")
        try:
            await self._c.audit.insert_one(document, session=self._session)
        except DuplicateKeyError as error:
            raise WriteRaceError(f"version {identifier!r} was archived meanwhile") from error

    async def principal_facts(self, tenant_id: str, principal_id: str) -> list[Fact]:
        facts = []
        async for document in self._c.facts.find(_who(tenant_id, principal_id), session=self._session):
            fact = await self._fact(document, f"{FACTS}/{document['_id']}/{document['version']}")
            if fact is not None:
                facts.append(fact)
        return facts

    async def principal_audit(self, tenant_id: str, principal_id: str) -> list[Fact]:
        facts = []
        async for document in self._c.audit.find(_who(tenant_id, principal_id), session=self._session):
            fact = await self._fact(document, f"{AUDIT}/{document['_id']}")
            if fact is not None:
                facts.append(fact)
        return facts

    # -- profiles ------------------------------------------------------------------------------

    async def save_profile(self, profile: Profile) -> None:
        scope = profile.scope
        identifier = _profile_id(scope)
        document = {
            "_id": identifier,
            **_scope_fields(scope),
            "text": await self._seal_text(
                scope.tenant_id, scope.principal_id, profile.text, f"{PROFILES}/{identifier}"
            ),
            "source_turns": profile.source_turns,
            "updated_at": profile.updated_at,
        }
        await self._c.profiles.replace_one({"_id": identifier}, document, upsert=True, session=self._session)

    async def load_profile(self, scope: MemoryScope) -> Profile | None:
        identifier = _profile_id(scope)
        document = await self._c.profiles.find_one({"_id": identifier}, session=self._session)
        if document is None:
            return None
        text = await self._open_text(document, "text", f"{PROFILES}/{identifier}")
        if text is None:
            return None
        return Profile(
            scope=scope, text=text, source_turns=document["source_turns"], updated_at=document["updated_at"]
        )

    # -- the derived index ---------------------------------------------------------------------

    async def _entry(self, document: Document) -> IndexEntry | None:
        terms = await self._open_text(
            document, "terms", f"{INDEX}/{document['_id']}/{document['fact_version']}"
        )
        if terms is None:
            return None
        return IndexEntry(
            fact_id=document["_id"],
            scope=_scope(document),
            fact_version=document["fact_version"],
            terms=json.loads(terms),
            length=document["length"],
            indexed_at=document["indexed_at"],
        )

    async def load_index_entry(self, fact_id: str) -> IndexEntry | None:
        document = await self._c.index.find_one({"_id": fact_id}, session=self._session)
        return None if document is None else await self._entry(document)

    async def save_index_entry(self, entry: IndexEntry) -> None:
        scope = entry.scope
        context = f"{INDEX}/{entry.fact_id}/{entry.fact_version}"
        document = {
            "_id": entry.fact_id,
            **_scope_fields(scope),
            "fact_version": entry.fact_version,
            "terms": await self._seal_text(
                scope.tenant_id, scope.principal_id, json.dumps(entry.terms), context
            ),
            "length": entry.length,
            "indexed_at": entry.indexed_at,
        }
        await self._c.index.replace_one({"_id": entry.fact_id}, document, upsert=True, session=self._session)

    async def delete_index_entries(self, scope: MemoryScope, fact_ids: list[str]) -> None:
        # One `_id` lookup each: SecantusDB answers `_id $in` plus other fields with a full scan.
        for fact_id in dict.fromkeys(fact_ids):
            await self._c.index.delete_one(
                {"_id": fact_id, **_who(scope.tenant_id, scope.principal_id)}, session=self._session
            )

    async def principal_index(self, tenant_id: str, principal_id: str) -> list[IndexEntry]:
        entries = []
        async for document in self._c.index.find(_who(tenant_id, principal_id), session=self._session):
            entry = await self._entry(document)
            if entry is not None:
                entries.append(entry)
        return entries

    # -- forgetting ----------------------------------------------------------------------------

    async def data_key(self, tenant_id: str, principal_id: str, *, create: bool) -> bytes | None:
        """The principal's data key (made when missing and `create`), for sealing topic messages."""
        if create:
            # Not fenced: key handouts must not conflict with the principal's own writes.
            return await self._keys.writing_key(tenant_id, principal_id, fence=False)
        return await self._keys.reading_key(tenant_id, principal_id)

    async def shred_key(self, tenant_id: str, principal_id: str, at: datetime) -> None:
        """Delete the principal's data key (every sealed text of theirs becomes unreadable) and mark
        them forgotten at `at`, in one transaction: from its commit on, their late words are refused."""
        await self._keys.shred(tenant_id, principal_id)
        await self._mark(person_mark(tenant_id, principal_id), {"at": at, "turn": False})

    async def _mark(self, mark: str, fields: Document) -> None:
        await self._c.forgotten.replace_one(
            {"_id": mark}, {"_id": mark, **fields}, upsert=True, session=self._session
        )

    async def forgetting(self, tenant_id: str, principal_id: str, turn_marks: Sequence[str]) -> Forgetting:
        person = person_mark(tenant_id, principal_id)
        marks = [person, *turn_marks]
        # One `_id` lookup per mark: a write names one turn or a few.
        found = [await self._c.forgotten.find_one({"_id": mark}, session=self._session) for mark in marks]
        return Forgetting(
            forgotten_at=found[0]["at"] if found[0] is not None else None,
            erased_turn=any(document is not None for document in found[1:]),
        )

    async def drop_turn_marks(self, before: datetime) -> None:
        await self._c.forgotten.delete_many({"turn": True, "at": {"$lt": before}}, session=self._session)

    async def forget(self, tenant_id: str, principal_id: str, at: datetime) -> int:
        who = _who(tenant_id, principal_id)
        await self.shred_key(tenant_id, principal_id, at)
        turns = {
            (document["session_id"], document["turn_id"])
            async for document in self._c.history.find(
                who, {"session_id": True, "turn_id": True}, session=self._session
            )
        }
        for session_id, turn_id in sorted(turns):
            await self._mark(
                turn_mark(tenant_id, principal_id, session_id, turn_id), {"at": at, "turn": True}
            )
        erased = 0
        for collection in (
            self._c.history,
            self._c.summaries,
            self._c.facts,
            self._c.audit,
            self._c.profiles,
        ):
            erased += (await collection.delete_many(who, session=self._session)).deleted_count
        erased += (await self._c.index.delete_many(who, session=self._session)).deleted_count
        await self._c.sessions.delete_many(who, session=self._session)
        await self._c.fact_changes.delete_many(who, session=self._session)
        return erased


# --- the runner ---------------------------------------------------------------------------------


class MongoMemoryTransactions(TransactionLoop["MongoMemoryTransaction"]):
    """The `MemoryTransactionRunner` over MongoDB: one transaction per operation, retried whole."""

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
        self._keyring = keyring

    def _open(
        self, session: AsyncClientSession, *, reading: bool = False, retrying: bool = False
    ) -> MongoMemoryTransaction:
        collections = self._reading if reading else self._collections
        return MongoMemoryTransaction(collections, session, self._keyring, guessing=not (reading or retrying))

    async def _finish(self, transaction: MongoMemoryTransaction) -> None:
        await transaction.confirm()

    async def _confirm(self, transaction: MongoMemoryTransaction) -> None:
        await transaction.confirm()

    async def run(self, operation: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        return await self.run_transaction(operation)

    async def run_mongo(self, operation: Callable[[MongoMemoryTransaction], Awaitable[T]]) -> T:
        """`run` with the MongoDB transaction itself (for what only this backend does: shredding)."""
        return await self.run_transaction(operation)
