"""Whose key seals the owner's answer, when the run it read is gone by the time it looks.

A purge can commit between the owner's read of a page and its look-up of the page's runs' person;
the words read are then nobody's the owner can name, and they must not go out in plaintext.
"""

from __future__ import annotations

import json
import uuid

import pytest

from quipu.contracts.commands import ListRunRecords, ListSessionRunRecords, StoreReply, encode_result
from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import Page
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.their_person import TheirPerson
from tests.conformance.builders import ordinary, root_start

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
