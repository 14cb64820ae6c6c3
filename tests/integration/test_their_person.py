"""Whose key seals the owner's answer, when the run it read is gone by the time it looks.

A purge can commit between the owner's read of a page and its look-up of the page's runs' person;
the words read are then nobody's the owner can name, and they must not go out in plaintext. A
history read's person comes from that read's own transaction, with no look-up after it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from quipu.contracts.commands import (
    AppendRunRecords,
    DispatchedCall,
    ListRunRecords,
    ListSessionRunRecords,
    StoreOperation,
    StoreReply,
    encode_result,
)
from quipu.contracts.errors import ErrorCode
from quipu.contracts.memory_commands import HistoryTail, ListHistory, LoadSessionMemory, LoadSummary
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store import Page
from quipu.contracts.tools import ToolCallRequested
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.storage_owner.logic import Announcement, apply_command
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.their_person import TheirPerson, WordsRead, run_person
from tests.conformance.builders import ordinary, root_start, run_start, started_record
from tests.conformance.memory_builders import record_turns, scope, summary, uid
from tests.owner_support import CommandLog, client_on

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("listing", ["run", "session"])
async def test_a_page_whose_run_is_gone_is_refused_rather_than_sent_in_plaintext(
    stack: EmbeddedStack, listing: str
) -> None:
    store = await MongoStore.connect(stack.mongo_uri, f"tp{uuid.uuid4().hex[:8]}")
    try:
        gone = root_start("s-gone").run  # never started here: as if purged since the page was read
        page = Page(records=[ordinary(gone, payload=json.dumps({"text": "words"}).encode())], next_cursor="")
        command = (
            ListRunRecords(correlation_id="c-1", run_id=gone.run_id, limit=10)
            if listing == "run"
            else ListSessionRunRecords(correlation_id="c-1", session_id="s-gone", limit=10)
        )
        reply = StoreReply(correlation_id="c-1", op=command.op, result=encode_result(page))
        sealed, _ = await TheirPerson(store, InMemoryMemoryStore()).seal(command, reply, [])
        assert sealed.result is None and sealed.error is not None
        assert sealed.error.code in (ErrorCode.RUN_NOT_FOUND, ErrorCode.SESSION_PURGED)
    finally:
        await store.close()


async def test_a_carried_tool_call_goes_out_sealed_for_the_runs_person_not_the_commands(
    stack: EmbeddedStack,
) -> None:
    """The owner publishes a step's tool calls (the outbox): the model's arguments may quote the
    user, so they are sealed under the run's person from the owner's data, as its records are."""
    store = await MongoStore.connect(stack.mongo_uri, f"tp{uuid.uuid4().hex[:8]}")
    try:
        run = run_start().model_copy(update={"tenant_id": "t-1", "principal_id": "alice"})
        await store.start_one_shot_run(run, started_record(run))
        use = ToolCallRequested(
            run_id=run.run_id, agent_id=run.agent_id, tool_use_id="use-1", tool_name="calculator"
        )
        command = AppendRunRecords(
            correlation_id="c-2",
            records=[ordinary(run, "step/1/assistant")],
            calls=[DispatchedCall(toolset="default", call=use)],
            sealed_for=SealedFor(tenant_id="t-1", principal_id="mallory"),
        )
        reply, announcements = await apply_command(store, command)
        assert reply.error is None
        _, sealed = await TheirPerson(store, InMemoryMemoryStore()).seal(command, reply, announcements)
        (carried,) = [each for each in sealed if isinstance(each, DispatchedCall)]
        assert carried.call.sealed_for == run_person(run)
        assert carried.call.sealed_for != command.sealed_for
    finally:
        await store.close()


# --- a history read's person, from the read's own transaction ---------------------------------


def _commands_on(log: CommandLog) -> list[tuple[str, str]]:
    """(command, collection) of every command logged, transactions' commits included."""
    return [(name, str(body.get(name, ""))) for name, body in log.commands]


@pytest.mark.parametrize("read", ["tail", "page", "summary", "memory"])
async def test_a_history_read_is_sealed_for_its_person_in_one_transaction_that_reads_the_session_once(
    stack: EmbeddedStack, database: str, read: str
) -> None:
    """The person whose words a history read returns is the one whose key opened them in that
    read's own transaction: sealing the reply sends nothing more to the database (it used to read
    the session's owner again, in a second transaction)."""
    log = CommandLog()
    client = client_on(stack.mongo_uri, event_listeners=[log])
    try:
        memory = await MongoMemoryStore.open(client, database)
        ana = scope(principal_id="ana", tenant_id="acme")
        session_id = uid("s")
        await record_turns(memory, session_id, ana, 2)
        await memory.save_summary(summary(session_id, cursor=2, version=1, text="ana's earlier turns"))
        command: StoreOperation = {
            "tail": HistoryTail(correlation_id="c-3", session_id=session_id, count=12),
            "page": ListHistory(correlation_id="c-3", session_id=session_id, after_seq=0, limit=10),
            "summary": LoadSummary(correlation_id="c-3", session_id=session_id),
            "memory": LoadSessionMemory(correlation_id="c-3", session_id=session_id, count=12),
        }[read]
        people = TheirPerson(InMemoryStore(), memory)
        log.commands.clear()

        reply, _ = await people.apply(command)

        assert reply.error is None and reply.result
        assert reply.sealed_for == SealedFor(tenant_id="acme", principal_id="ana")
        sent = _commands_on(log)
        # At most one transaction, the read's own (a tail and a summary are read without one).
        assert sent.count(("commitTransaction", "1")) == (1 if read == "page" else 0), sent
        assert sent.count(("find", "memory_sessions")) == (1 if read in ("tail", "memory") else 0), sent
    finally:
        await client.close()


@pytest.mark.parametrize("read", ["tail", "memory"])
async def test_a_history_read_that_returns_nobodys_words_looks_up_no_one(
    stack: EmbeddedStack, database: str, read: str
) -> None:
    """A new session's first turn reads an empty tail (and no summary): no words, so no person
    to seal them for, and nothing refused."""
    log = CommandLog()
    client = client_on(stack.mongo_uri, event_listeners=[log])
    try:
        memory = await MongoMemoryStore.open(client, database)
        people = TheirPerson(InMemoryStore(), memory)
        session_id = uid("s")
        command: StoreOperation = {
            "tail": HistoryTail(correlation_id="c-4", session_id=session_id, count=12),
            "memory": LoadSessionMemory(correlation_id="c-4", session_id=session_id, count=12),
        }[read]
        log.commands.clear()

        reply, _ = await people.apply(command)

        assert reply.error is None
        assert reply.result == ([] if read == "tail" else {"summary": None, "tail": []})
        assert reply.sealed_for is None
        # The session (and the summary) only, no transaction.
        summary = [] if read == "tail" else [("find", "memory_summaries")]
        assert _commands_on(log) == [*summary, ("find", "memory_sessions")]
    finally:
        await client.close()


@pytest.mark.parametrize("noted", [set(), {("acme", "ana"), ("acme", "bea")}])
async def test_history_words_of_no_known_person_or_of_two_are_refused_not_sealed_for_someone(
    stack: EmbeddedStack, database: str, noted: set[tuple[str, str]]
) -> None:
    """Closed shut: words whose read noted no key that opened them (a read past the noting
    transactions), or two people's, are never sent under a key that is not surely theirs."""
    memory = await MongoMemoryStore.connect(stack.mongo_uri, database)
    try:
        session_id = uid("s")
        await record_turns(memory, session_id, scope(principal_id="ana", tenant_id="acme"), 1)
        rows = await memory.history_tail(session_id, 12)  # read past the noting: nobody noted
        command = HistoryTail(correlation_id="c-5", session_id=session_id, count=12)
        reply = StoreReply(correlation_id="c-5", op=command.op, result=encode_result(rows))
        read = WordsRead(memory)
        read.people = noted

        sealed, _ = await TheirPerson(InMemoryStore(), memory).seal(command, reply, [], read)

        assert sealed.result is None and sealed.error is not None
        assert sealed.error.code is ErrorCode.SESSION_PRINCIPAL_MISMATCH
    finally:
        await memory.close()


async def test_a_forget_committed_right_after_a_history_read_cannot_send_its_words_unsealed(
    stack: EmbeddedStack, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The person comes from the read itself, so a forget between the read and the sealing (it
    deletes the session's claim) cannot leave the words with nobody's key (they went out under the
    asker's, or in plaintext, when the owner looked the person up afterwards)."""
    memory = await MongoMemoryStore.connect(stack.mongo_uri, database)
    try:
        session_id = uid("s")
        await record_turns(memory, session_id, scope(principal_id="ana", tenant_id="acme"), 1)
        people = TheirPerson(InMemoryStore(), memory)
        sealing = people.seal

        async def forget_then_seal(*arguments: Any) -> tuple[StoreReply, list[Announcement]]:
            await memory.forget_principal("acme", "ana")
            return await sealing(*arguments)

        monkeypatch.setattr(people, "seal", forget_then_seal)
        reply, _ = await people.apply(HistoryTail(correlation_id="c-6", session_id=session_id, count=12))

        assert reply.error is None and reply.result
        assert reply.sealed_for == SealedFor(tenant_id="acme", principal_id="ana")
    finally:
        await memory.close()
