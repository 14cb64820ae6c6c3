"""What both MongoDB repositories share: the client's options, indexes, generated secrets, and
`TransactionLoop`, one transaction per operation retried whole under a `TransactionPolicy`."""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pymongo import AsyncMongoClient, IndexModel, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    ConnectionFailure,
    DocumentTooLarge,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from quipu.contracts.errors import ErrorCode, QuipuError, StoreError

T = TypeVar("T")
X = TypeVar("X")

Document = dict[str, Any]
META = "meta"
_BSON_OBJECT_TOO_LARGE = 10334


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
    single_read_concern: ReadConcern = field(default_factory=lambda: ReadConcern("majority"))
    """The reads of an operation applied outside any transaction (`TransactionLoop.read`): each
    sees what a majority committed, as the operations it follows committed it."""
    max_attempts: int = 12
    """Tries of one operation that keeps meeting other writers, before UNAVAILABLE."""
    commit_attempts: int = 3
    """Tries of a commit whose outcome is unknown, before UNAVAILABLE."""
    backoff_initial: float = 0.002
    """Upper bound of the first (full-jitter) pause between attempts, in seconds."""
    backoff_max: float = 0.1
    """Cap of the pause between attempts, in seconds."""
    group_max: int = 1
    """Operations that arrive together applied in one transaction, at most (group commit); 1
    applies each in its own. Suits a database that serialises writes (SecantusDB: one commit,
    one fsync, for the group); on a MongoDB replica set concurrent transactions scale instead."""
    group_transactions: int = 4
    """With group commit, transactions under way at once: an operation that finds one free runs
    at once (alone); operations waiting while all are busy form the next group."""
    document_hints: int = 4096
    """Sessions and runs documents kept from committed transactions for the next write to start
    from, confirmed before it commits (`document_hints`); 0 keeps none (every write finds them)."""

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, initial * 2^(attempt-1))]."""
        return random.uniform(0, min(self.backoff_max, self.backoff_initial * 2 ** (attempt - 1)))


# --- the runner ---------------------------------------------------------------------------------


def unavailable(error: BaseException) -> StoreError:
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


@dataclass
class _Queued:
    """An operation waiting for its group, and where its outcome goes."""

    operation: Callable[[Any], Awaitable[Any]]
    outcome: asyncio.Future[Any]

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.outcome.done():
            return  # its caller gave up waiting (canceled)
        if error is None:
            self.outcome.set_result(result)
        else:
            self.outcome.set_exception(error)


class _GroupBrokenError(QuipuError):
    """An operation of a group was refused after it had written: the group cannot commit."""

    retryable = True  # each operation of the group is applied again alone


class TransactionLoop(Generic[X]):
    """One MongoDB transaction per operation, retried whole on a transient conflict; or, with
    `TransactionPolicy.group_max` > 1, the operations that arrive together in one (group commit).

    Shared by the runtime store and the memory store: a subclass says how to open its transaction
    object on a session (`_open`), what to release when the attempt ends (`_close`) and whether
    an operation has written (`_wrote`).

    Group commit: operations are queued and taken by up to `group_transactions` drains, each
    applying the operations waiting when it is free (at most `group_max`) in one transaction, one
    after another, with one commit: an operation that finds a drain free runs at once, and groups
    form only while every drain is busy, so nothing waits that would not have waited. The rules
    check everything before their first write, so an operation refused by a rule (a `StoreError`)
    has written nothing: its refusal is its outcome and the others commit. Anything else that
    fails the group (a write conflict, another writer first, a document too large) aborts it, and
    each of its operations is then applied alone, retried as usual; an error that would fail
    every one alone (the database unreachable) is each one's outcome at once. An operation's
    outcome is given only after its group committed (or it was refused), so nothing is answered
    before it is durable. Groups under way at once are decided between by the database as
    transactions of different processes are (conditional saves, write conflicts); the in-process
    turns are not taken, since a group holding one session's turn could wait for another's.
    """

    def __init__(self, client: AsyncMongoClient[Document], policy: TransactionPolicy | None) -> None:
        self._client = client
        self._policy = policy or TransactionPolicy()
        self.attempts = 0
        """Transactions started, conflicts included (an operational figure)."""
        self.groups = 0
        """Groups of two or more operations committed in one transaction."""
        self.grouped = 0
        """Operations committed (or refused) inside those groups."""
        self.fallbacks = 0
        """Groups aborted whose operations were then applied alone."""
        self._queue: list[_Queued] = []
        self._drains: set[asyncio.Task[None]] = set()

    @property
    def grouping(self) -> bool:
        """Whether operations that arrive together share a transaction."""
        return self._policy.group_max > 1

    def _open(self, session: AsyncClientSession, *, reading: bool = False, retrying: bool = False) -> X:
        """The operation's transaction object on `session` (`reading`: outside any transaction,
        its collections read with `TransactionPolicy.single_read_concern`; `retrying`: an attempt
        after one failed, which takes no chance a first one may take)."""
        raise NotImplementedError

    def _close(self, transaction: X) -> None:
        """Release what the attempt held (nothing by default)."""

    def _wrote(self, transaction: X) -> bool:
        """Whether the operation on `transaction` sent a write (unknown: assume it did)."""
        return True

    async def _finish(self, transaction: X) -> None:
        """Complete the operation on `transaction` before its commit (send what it holds back)."""

    async def _confirm(self, transaction: X) -> None:
        """Before a refusal is given: make sure it was decided on what the database holds (a
        WriteRaceError, retried, when not). `_finish` does as much before a commit."""

    def _committed(self, transaction: X) -> None:
        """The transaction `transaction` was part of committed (before `_close`)."""

    async def run_transaction(self, operation: Callable[[X], Awaitable[T]]) -> T:
        """Apply `operation` in one transaction (perhaps its group's), retried on conflicts;
        UNAVAILABLE when they persist."""
        if not self.grouping:
            return await self._alone(operation)
        queued = _Queued(operation, asyncio.get_running_loop().create_future())
        self._queue.append(queued)
        if len(self._drains) < self._policy.group_transactions:
            drain = asyncio.create_task(self._drain(), name="group commit")
            self._drains.add(drain)
            drain.add_done_callback(self._drains.discard)
        result: T = await queued.outcome
        return result

    async def _drain(self) -> None:
        group: list[_Queued] = []
        try:
            while self._queue:
                size = self._policy.group_max
                group = [queued for queued in self._queue[:size] if not queued.outcome.done()]
                del self._queue[:size]
                if len(group) == 1:
                    await self._apply_alone(group[0])
                elif group:
                    await self._apply_group(group)
        except BaseException as error:
            # The drain itself is ending (its loop shuts down): nobody is left waiting forever.
            last = len(self._drains) <= 1
            for queued in [*group, *(self._queue if last else ())]:
                queued.settle(error=unavailable(error))
            if last:
                self._queue.clear()
            raise

    async def _apply_alone(self, queued: _Queued, *, retrying: bool = False) -> None:
        try:
            queued.settle(await self._alone(queued.operation, retrying=retrying))
        except Exception as error:
            queued.settle(error=error)

    async def _apply_group(self, group: list[_Queued]) -> None:
        self.attempts += 1
        try:
            outcomes = await self._group_attempt(group)
        except Exception as error:
            if isinstance(error, ConnectionFailure) and not _is_transient(error):
                # The database is out of reach: alone, each would wait for it in turn to fail.
                for queued in group:
                    queued.settle(error=unavailable(error))
                return
            # A conflict, or one operation's own failure: each alone gets its own outcome.
            self.fallbacks += 1
            for queued in group:
                await self._apply_alone(queued, retrying=True)
            return
        self.groups += 1
        self.grouped += len(group)
        for queued, (result, refusal) in zip(group, outcomes, strict=True):
            queued.settle(result, refusal)

    async def _group_attempt(self, group: list[_Queued]) -> list[tuple[Any, StoreError | None]]:
        """Every operation of `group` in one transaction: each one's result or rule refusal."""
        policy = self._policy
        outcomes: list[tuple[Any, StoreError | None]] = []
        async with self._client.start_session() as session:
            await session.start_transaction(
                read_concern=policy.read_concern, write_concern=policy.write_concern
            )
            opened: list[X] = []
            try:
                try:
                    for queued in group:
                        transaction = self._open(session)
                        opened.append(transaction)
                        try:
                            result = await queued.operation(transaction)
                        except StoreError as refusal:
                            if self._wrote(transaction):
                                raise _GroupBrokenError("refused after it wrote") from refusal
                            await self._confirm(transaction)
                            outcomes.append((None, refusal))
                            continue
                        await self._finish(transaction)
                        outcomes.append((result, None))
                except BaseException:
                    await session.abort_transaction()
                    raise
                await self._commit(session)
                for transaction in opened:
                    self._committed(transaction)
            finally:
                for transaction in opened:
                    self._close(transaction)
        return outcomes

    async def read(self, operation: Callable[[X], Awaitable[T]]) -> T:
        """Apply a read-only `operation` outside any transaction: its reads do not share a
        snapshot and nothing is committed, one round trip fewer than a transaction (a read-only
        one still pays its commit: ~0.7 ms of a 1.8 ms read of two documents on SecantusDB). For
        the operations whose answer one snapshot would not change (one document, or rows only
        ever appended); never grouped, it waits for no group. A read the driver could not retry
        is UNAVAILABLE."""
        try:
            async with self._client.start_session(causal_consistency=False) as session:
                transaction = self._open(session, reading=True)
                try:
                    return await operation(transaction)
                finally:
                    self._close(transaction)
        except PyMongoError as error:
            raise unavailable(error) from error

    async def _alone(self, operation: Callable[[X], Awaitable[T]], *, retrying: bool = False) -> T:
        policy = self._policy
        last: BaseException | None = None
        for attempt in range(1, policy.max_attempts + 1):
            if attempt > 1:
                await asyncio.sleep(policy.backoff(attempt - 1))
            self.attempts += 1
            try:
                return await self._attempt(operation, retrying=retrying or attempt > 1)
            except StoreError:
                raise
            except (PyMongoError, DocumentTooLarge, WriteRaceError) as error:
                if _too_large(error):
                    # Permanent: resending would fail the same way (16 MiB per BSON document).
                    raise StoreError(ErrorCode.INVALID_ARGUMENT, f"document too large: {error}") from error
                if not _is_transient(error):
                    raise unavailable(error) from error
                last = error
        assert last is not None
        raise StoreError(
            ErrorCode.UNAVAILABLE, f"gave up after {policy.max_attempts} conflicting attempts: {last}"
        ) from last

    async def _attempt(self, operation: Callable[[X], Awaitable[T]], *, retrying: bool) -> T:
        policy = self._policy
        async with self._client.start_session() as session:
            await session.start_transaction(
                read_concern=policy.read_concern, write_concern=policy.write_concern
            )
            transaction = self._open(session, retrying=retrying)
            try:
                try:
                    try:
                        result = await operation(transaction)
                    except StoreError:
                        await self._confirm(transaction)  # a refusal stands on the database's data
                        raise
                    await self._finish(transaction)
                except BaseException:
                    await session.abort_transaction()
                    raise
                await self._commit(session)
                self._committed(transaction)
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


async def prepare_database(
    client: AsyncMongoClient[Document],
    name: str,
    policy: TransactionPolicy,
    indexes: Mapping[str, list[IndexModel]],
    secrets: Mapping[str, bytes | None],
) -> tuple[AsyncDatabase[Document], dict[str, bytes]]:
    """Database `name` under the policy's write concern, with its indexes, and each secret of `secrets`:
    the one given, else the one generated once and kept in `meta`. A driver error is UNAVAILABLE."""
    database = client.get_database(name, write_concern=policy.write_concern)
    try:
        await ensure_indexes(database, indexes)
        found = {
            secret_id: given or await load_generated_secret(database, policy.write_concern, secret_id)
            for secret_id, given in secrets.items()
        }
    except PyMongoError as error:
        raise unavailable(error) from error
    return database, found


class MongoBacked:
    """What a store kept in one MongoDB database holds of it: the client, the database, and whether
    the store owns the client (it does when `connect` opened it; then `close` closes it)."""

    def __init__(
        self, client: AsyncMongoClient[Document], database: AsyncDatabase[Document], *, owns_client: bool
    ) -> None:
        self.client = client
        self.database = database
        self._owns_client = owns_client

    async def drop_database(self) -> None:
        """Delete the store's whole database (tests)."""
        await self.client.drop_database(self.database.name)

    async def close(self) -> None:
        """Close the client if this store opened it."""
        if self._owns_client:
            await self.client.close()


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
