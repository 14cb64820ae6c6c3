"""Whose key seals what the owner publishes: the person whose words it carries, from the owner's data.

At rest, a run's records and checkpoint are sealed under the run's sealing principal
(`run_owner`), a history under its person, a fact under its scope. What the owner publishes about
them (a reply that reads them back, the stream events a write makes visible) is sealed under the
same key, found the same way: never the key a command names (`sealed_for` says whom the asker
works for, not whose words come back) nor a session's recorded owner (a session created without
one still holds its runs' words). A session's records page is sealed under its records' person;
a page that would hold two people's words under one key is refused (the planner never puts two
people's runs in one session; a direct writer could): list such a session per run. A history
read's person is the one whose key opened the texts its own transaction read (`apply`): the
owner learns it from that read, with no second transaction that reads the session again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from quipu.contracts.commands import (
    DispatchedCall,
    ListRunRecords,
    ListSessionRunRecords,
    LoadRunSuspension,
    StoreOperation,
    StoreReply,
)
from quipu.contracts.errors import ErrorCode, StoreRefusedError
from quipu.contracts.events import RunEvent
from quipu.contracts.memory_commands import (
    ForgetPrincipal,
    HistoryTail,
    ListHistory,
    LoadSessionMemory,
    LoadSummary,
)
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store import RunStart
from quipu.contracts.store_operation import Backend
from quipu.services.domain.memory.context import run_sealing_principal
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.memory.transaction import MemoryTransaction
from quipu.services.domain.store.protocol import Store
from quipu.services.storage_owner.logic import Announcement, apply_command, sealed_as
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_memory_transaction import MongoMemoryTransaction
from quipu.services.storage_owner.mongo_store import MongoStore

T = TypeVar("T")

_RUN_READS = ListRunRecords | LoadRunSuspension
_HISTORY_READS = ListHistory | HistoryTail | LoadSummary | LoadSessionMemory


def run_person(run: RunStart) -> SealedFor:
    """Whose key seals a run's words (the rule at rest, from the run's start)."""
    return SealedFor(
        tenant_id=run.tenant_id,
        principal_id=run_sealing_principal(run.principal_id, run.session_id, run.run_id),
    )


class WordsRead:
    """A MongoDB memory store whose transactions note whose keys opened the texts a read returned
    (one read: build one per command)."""

    def __init__(self, memory: MongoMemoryStore) -> None:
        self._transactions = memory.transactions
        self.memory: MemoryStore = memory.over(self)
        """The store to apply the read on: the same store, its rules over the noting transactions."""
        self.people: set[tuple[str, str]] = set()
        """(tenant, principal) of every key that opened a text of the read's committed attempt."""

    async def run(self, operation: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        """`operation` in one transaction of the store, noting whose keys opened what it read."""
        return await self._transactions.run_mongo(self._noting(operation))

    async def read(self, operation: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        """`operation` read outside a transaction, noting whose keys opened what it read."""
        return await self._transactions.read(self._noting(operation))

    def _noting(
        self, operation: Callable[[MemoryTransaction], Awaitable[T]]
    ) -> Callable[[MongoMemoryTransaction], Awaitable[T]]:
        async def noting(transaction: MongoMemoryTransaction) -> T:
            result = await operation(transaction)
            # Replaced, not added to: an attempt retried whole (a conflict) reads everything anew.
            self.people = set(transaction.opened_for)
            return result

        return noting


class TheirPerson:
    """Finds whose words a command's reply and events carry; run owners are kept (they never change)."""

    def __init__(self, store: Store, memory: MemoryStore, *, runs: int = 4096) -> None:
        self._stores = (store, memory)
        self._store = store if isinstance(store, MongoStore) else None
        self._memory = memory if isinstance(memory, MongoMemoryStore) else None
        self._runs = max(1, runs)
        self._owners: OrderedDict[str, SealedFor] = OrderedDict()

    async def apply(self, command: StoreOperation) -> tuple[StoreReply, list[Announcement]]:
        """`apply_command`, then `seal`; a history read on MongoDB's memory store notes whose words
        it read in its own transaction, so sealing its reply reads nothing more."""
        store, memory = self._stores
        read = None
        if self._memory is not None and isinstance(command, _HISTORY_READS):
            read = WordsRead(self._memory)
            memory = read.memory
        reply, announcements = await apply_command(store, command, memory)
        return await self.seal(command, reply, announcements, read)

    async def seal(
        self,
        command: StoreOperation,
        reply: StoreReply,
        announcements: Sequence[Announcement],
        read: WordsRead | None = None,
    ) -> tuple[StoreReply, list[Announcement]]:
        """The reply, the stream events and the tool calls sealed for the person whose words they carry.

        A refusal, and whatever this owner cannot place (a store that is not MongoDB's, a history
        read applied without `read`), keep the command's own `sealed_for`.
        """
        events = list(announcements)
        words_back = reply.error is None and reply.result is not None and _reads_words(command)
        stream = any(isinstance(event, RunEvent | DispatchedCall) for event in events)
        if isinstance(command, ForgetPrincipal) or not (words_back or stream):
            return reply, events  # nothing of anyone's words, or a forget (sealing it makes a key anew)
        try:
            whose = await self._person_of(command, reply, read)
        except StoreRefusedError as error:
            return StoreReply(correlation_id=reply.correlation_id, op=reply.op, error=error.to_body()), []
        if whose is None:
            return reply, events
        if words_back:
            reply = reply.model_copy(update={"sealed_for": whose})
        return reply, [
            sealed_as(event, whose) if isinstance(event, RunEvent | DispatchedCall) else event
            for event in events
        ]

    async def _person_of(
        self, command: StoreOperation, reply: StoreReply, read: WordsRead | None
    ) -> SealedFor | None:
        named = command.whose_words()
        if named is not None:
            return named  # a memory command's scope: where the store keeps it
        if isinstance(command, _HISTORY_READS):
            return _reader_of(command, read.people, reply) if read is not None else None
        if isinstance(command, ListSessionRunRecords):
            return await self._page_person(command.session_id, reply)
        run = getattr(command, "run", None)
        if isinstance(run, RunStart):
            return self._keep(run.run_id, run_person(run))
        if isinstance(command, _RUN_READS):
            return await self._read_run_person(command.run_id)
        run_id = _written_run(command)
        return await self._run_person(run_id) if run_id else None

    async def _read_run_person(self, run_id: str) -> SealedFor | None:
        """The person of a run whose words were just read; a run gone since (purged between the
        read and this look-up) is refused: what was read is then nobody's to seal for."""
        whose = await self._run_person(run_id)
        if whose is None and self._store is not None:
            raise StoreRefusedError(ErrorCode.RUN_NOT_FOUND, f"run {run_id} is gone (purged while read)")
        return whose

    async def _run_person(self, run_id: str) -> SealedFor | None:
        known = self._owners.get(run_id)
        if known is not None or self._store is None:
            return known
        found = await self._store.run_owner(run_id)
        return None if found is None else self._keep(run_id, found)

    async def _page_person(self, session_id: str, reply: StoreReply) -> SealedFor | None:
        if self._store is None:
            return None
        wanted = {record["run_id"] for record in reply.result["records"]}  # the Page's JSON form
        people = {await self._run_person(run_id) for run_id in sorted(wanted)}
        if None in people:
            raise StoreRefusedError(ErrorCode.SESSION_PURGED, f"session {session_id} was purged while read")
        if len(people) > 1:
            raise StoreRefusedError(
                ErrorCode.SESSION_PRINCIPAL_MISMATCH,
                f"a page of session {session_id} holds the records of more than one principal: "
                "list its runs one by one",
            )
        return next(iter(people), None)

    def _keep(self, run_id: str, whose: SealedFor) -> SealedFor:
        self._owners[run_id] = whose
        self._owners.move_to_end(run_id)
        while len(self._owners) > self._runs:
            self._owners.popitem(last=False)
        return whose


def _reader_of(command: _HISTORY_READS, people: set[tuple[str, str]], reply: StoreReply) -> SealedFor | None:
    """The one person whose words a history read returned (None: it returned none of anyone's).

    Words with no person, or with two, are refused: they are never sent under a key that is not
    surely theirs (the first would be a read past the noting transactions: a defect, closed shut).
    """
    if len(people) > 1 or (not people and _holds_words(reply.result)):
        raise StoreRefusedError(
            ErrorCode.SESSION_PRINCIPAL_MISMATCH,
            f"a history read of session {command.session_id} returned words of other than one "
            "known principal",
        )
    for tenant_id, principal_id in people:
        return SealedFor(tenant_id=tenant_id, principal_id=principal_id)
    return None


def _holds_words(result: Any) -> bool:
    """Whether a read's JSON result holds anything but empty containers and nulls (rows, a
    summary; a session's memory with neither is only its envelope)."""
    if isinstance(result, dict):
        return any(_holds_words(value) for value in result.values())
    if isinstance(result, list):
        return any(_holds_words(value) for value in result)
    return result is not None


def _written_run(command: StoreOperation) -> str:
    """The run a write's records belong to (one command writes to one run), or ""."""
    record = getattr(command, "record", None)
    records = getattr(command, "records", None) or [record]
    return str(getattr(records[0], "run_id", ""))


def _reads_words(command: StoreOperation) -> bool:
    """Whether the command's result reads a person's words back (a runtime write's result is ids)."""
    return command.backend is Backend.MEMORY or isinstance(command, _RUN_READS | ListSessionRunRecords)
