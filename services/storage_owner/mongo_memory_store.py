"""The MongoDB repository behind the memory rules, with every text encrypted at rest
(`mongo_memory_transaction`).

`MongoMemoryStore` is `MemoryRules` (shared with the in-memory store) over
`MongoMemoryTransactions`: one multi-document transaction per operation, retried whole on a
transient conflict, like the runtime store's.

`forget_principal` shreds first: one transaction deletes the key (from then on every sealed
text of the principal is unreadable, whatever copy of it survives) and marks the person
forgotten, a second deletes the documents and marks every erased turn (`tombstone`). A text
whose key is gone reads as absent; a late write of the person's earlier words is refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from pymongo import ASCENDING, AsyncMongoClient, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

from quipu.contracts.sealed import SealedFor
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.rules import MemoryRules
from quipu.services.domain.memory.tombstone import DEFAULT_TURN_MARKS_KEEP
from quipu.services.domain.memory.transaction import MemoryTransactionRunner
from quipu.services.storage_owner.keys import MASTER_KEY_ID, Keyring
from quipu.services.storage_owner.mongo import (
    Document,
    MongoBacked,
    TransactionPolicy,
    prepare_database,
    with_own_client,
)
from quipu.services.storage_owner.mongo_memory_transaction import (
    AUDIT,
    COLLECTIONS,
    FACT_CHANGES,
    FACTS,
    FORGOTTEN,
    HISTORY,
    INDEX,
    PROFILES,
    SESSIONS,
    SUMMARIES,
    MongoMemoryTransactions,
)

_PRINCIPAL = [("tenant_id", ASCENDING), ("principal_id", ASCENDING)]
INDEXES: Mapping[str, list[IndexModel]] = {
    SESSIONS: [IndexModel(_PRINCIPAL, name="principal")],
    HISTORY: [
        IndexModel([("session_id", ASCENDING), ("seq", ASCENDING)], name="session_seq", unique=True),
        IndexModel([("session_id", ASCENDING), ("turn_id", ASCENDING)], name="session_turn"),
        IndexModel(_PRINCIPAL, name="principal"),
    ],
    SUMMARIES: [IndexModel(_PRINCIPAL, name="principal")],
    FACTS: [IndexModel(_PRINCIPAL, name="principal")],
    AUDIT: [IndexModel([("fact_id", ASCENDING)], name="fact"), IndexModel(_PRINCIPAL, name="principal")],
    FACT_CHANGES: [IndexModel(_PRINCIPAL, name="principal")],
    PROFILES: [IndexModel(_PRINCIPAL, name="principal")],
    INDEX: [IndexModel(_PRINCIPAL, name="principal")],
    FORGOTTEN: [IndexModel([("turn", ASCENDING), ("at", ASCENDING)], name="turn_at")],
}
"""Secondary indexes by collection; `memory_keys` is only read by `_id`."""


# --- the store ----------------------------------------------------------------------------------


class MongoMemoryStore(MemoryRules, MongoBacked):
    """The `MemoryStore` on MongoDB; build it with `connect` (owns its client) or `open` (shares one)."""

    def __init__(
        self,
        client: AsyncMongoClient[Document],
        database: AsyncDatabase[Document],
        master_key: bytes,
        *,
        policy: TransactionPolicy | None = None,
        owns_client: bool = False,
        clock: Callable[[], datetime] = utc_now_ms,
        turn_marks_keep: timedelta = DEFAULT_TURN_MARKS_KEEP,
    ) -> None:
        self.transactions = MongoMemoryTransactions(client, database, Keyring(master_key), policy)
        MemoryRules.__init__(self, self.transactions, clock, turn_marks_keep)
        MongoBacked.__init__(self, client, database, owns_client=owns_client)

    @classmethod
    async def open(
        cls,
        client: AsyncMongoClient[Document],
        database: str,
        *,
        master_key: bytes | None = None,
        policy: TransactionPolicy | None = None,
        owns_client: bool = False,
        clock: Callable[[], datetime] = utc_now_ms,
        turn_marks_keep: timedelta = DEFAULT_TURN_MARKS_KEEP,
    ) -> MongoMemoryStore:
        """A store on `database` through an existing (tz-aware) client; creates indexes and the key."""
        policy = policy or TransactionPolicy()
        db, found = await prepare_database(client, database, policy, INDEXES, {MASTER_KEY_ID: master_key})
        return cls(
            client,
            db,
            found[MASTER_KEY_ID],
            policy=policy,
            owns_client=owns_client,
            clock=clock,
            turn_marks_keep=turn_marks_keep,
        )

    @classmethod
    async def connect(
        cls,
        uri: str,
        database: str,
        *,
        master_key: bytes | None = None,
        policy: TransactionPolicy | None = None,
        server_selection_timeout_ms: int = 5_000,
        clock: Callable[[], datetime] = utc_now_ms,
        turn_marks_keep: timedelta = DEFAULT_TURN_MARKS_KEEP,
    ) -> MongoMemoryStore:
        """A store with its own client on `uri` (`retryWrites=false` unless the URI says otherwise)."""
        return await with_own_client(
            uri,
            server_selection_timeout_ms,
            lambda client: cls.open(
                client,
                database,
                master_key=master_key,
                policy=policy,
                owns_client=True,
                clock=clock,
                turn_marks_keep=turn_marks_keep,
            ),
        )

    def over(self, transactions: MemoryTransactionRunner) -> MongoMemoryStore:
        """This store with its rules applied over `transactions` (which wrap this store's own, to
        watch what they read): everything else, this store's own operations included, as it is."""
        view = copy.copy(self)
        MemoryRules.__init__(view, transactions, self._clock, self._turn_marks_keep)
        return view

    async def data_key(self, whose: SealedFor, *, create: bool) -> bytes | None:
        """The principal's data key (the owner's `KeySource`); None when they have none and not `create`."""
        return await self.transactions.run_mongo(
            lambda tx: tx.data_key(whose.tenant_id, whose.principal_id, create=create)
        )

    async def _forget(self, tenant_id: str, principal_id: str, at: datetime) -> int:
        """Shred the principal's key (and mark them forgotten) in its own transaction, then erase
        their documents."""
        await self.transactions.run_mongo(lambda tx: tx.shred_key(tenant_id, principal_id, at))
        return await super()._forget(tenant_id, principal_id, at)

    async def drop_collections(self) -> None:
        """Delete every memory collection (tests that share a database with the runtime store)."""
        for name in COLLECTIONS:
            await self.database.drop_collection(name)
