"""Whose key seals the owner's answer, when the run it read is gone by the time it looks.

A purge can commit between the owner's read of a page and its look-up of the page's runs' person;
the words read are then nobody's the owner can name, and they must not go out in plaintext.
"""

from __future__ import annotations

import json
import uuid

import pytest

from quipu.contracts.commands import (
    AppendRunRecords,
    DispatchedCall,
    ListRunRecords,
    ListSessionRunRecords,
    StoreReply,
    encode_result,
)
from quipu.contracts.errors import ErrorCode
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store import Page
from quipu.contracts.tools import ToolCallRequested
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.storage_owner.logic import apply_command
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.their_person import TheirPerson, run_person
from tests.conformance.builders import ordinary, root_start, run_start, started_record

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
