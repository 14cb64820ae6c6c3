"""The MongoDB repository behind the store's transaction port (STORE_CONTRACT §6.1, §8).

`MongoStore` is `RuleStore` (every contract rule, shared with the in-memory store) over
`MongoTransactions` (`mongo_transaction`): each operation runs in one multi-document
transaction, retried whole when it meets another writer (`mongo.TransactionLoop`).

Every query path hits an index: SecantusDB answers an unindexed find at ~5/s (PLATFORM_NOTES);
tests/integration/test_mongo_store.py explains every query the store sends. Listings read a
closed sequence window, because SecantusDB reads a whole open range before applying the limit.
Operations on one session take turns inside the process (`KeyedTurns`) so that they do not abort
each other; across processes the conditional saves and the transactions decide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from pymongo import ASCENDING, AsyncMongoClient, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

from quipu.contracts.sealed import SealedFor
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.store.rules import RuleStore
from quipu.services.domain.store.state import RunState, StoreTransaction
from quipu.services.storage_owner.keys import MASTER_KEY_ID, Keyring
from quipu.services.storage_owner.mongo import (
    Document,
    MongoBacked,
    TransactionPolicy,
    prepare_database,
    with_own_client,
)
from quipu.services.storage_owner.mongo_transaction import RECORDS, RUNS, MongoTransactions, run_owner

CURSOR_SECRET_ID = "cursor_secret"

INDEXES: Mapping[str, list[IndexModel]] = {
    RUNS: [IndexModel([("session_id", ASCENDING), ("start_order", ASCENDING)], name="session_start_order")],
    RECORDS: [
        IndexModel([("run_id", ASCENDING), ("event_key", ASCENDING)], name="run_event_key", unique=True),
        IndexModel([("run_id", ASCENDING), ("seq", ASCENDING)], name="run_seq", unique=True),
        IndexModel([("session_id", ASCENDING), ("session_seq", ASCENDING)], name="session_seq"),
    ],
}
"""Secondary indexes by collection; `sessions` and `meta` are only read by `_id`."""


class MongoStore(RuleStore, MongoBacked):
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
        RuleStore.__init__(self, self.transactions, cursor_secret, clock)
        MongoBacked.__init__(self, client, database, owns_client=owns_client)

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
        db, found = await prepare_database(
            client, database, policy, INDEXES, {CURSOR_SECRET_ID: cursor_secret, MASTER_KEY_ID: master_key}
        )
        secret, key = found[CURSOR_SECRET_ID], found[MASTER_KEY_ID]
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

    async def run_owner(self, run_id: str) -> SealedFor | None:
        """Whose data key seals the run's texts (None: no such run)."""

        async def read(transaction: StoreTransaction) -> RunState | None:
            return await transaction.load_run(run_id)

        state = await self.transactions.run(read)
        if state is None:
            return None
        tenant_id, principal_id = run_owner(state)
        return SealedFor(tenant_id=tenant_id, principal_id=principal_id)
