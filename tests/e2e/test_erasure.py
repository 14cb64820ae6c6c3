"""Forgetting a person, end to end: after `forget`, nothing of theirs is readable anywhere.

Real service processes (owner, planner, tool executor, transcript recorder) on the embedded
broker and database. A person says a phrase in one turn (the scripted model echoes it, so their
model's answer carries it too) and has a second turn suspended on a question that repeats
another phrase (it rests in the checkpoint). Then the principal is forgotten through the owner,
as `quipu memory forget` does, and the test searches every collection of the database and every
service's log for either phrase: nothing readable. A bystander in another session keeps every
word. (The Kafka topics still carry the words until their retention: see the README.)
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from quipu.contracts.events import StreamEventType
from quipu.contracts.runs import RunRequested
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import TranscriptErasedError
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.transcript import build_messages_from_run_log
from quipu.services.kit.memory_client import KafkaMemoryStore
from tests.e2e.agent_support import Deployment, eventually
from tests.owner_support import client_on, resting_bytes

pytestmark = pytest.mark.timeout(300)

TENANT = "t-erase"


async def _turn(deployment: Deployment, session_id: str, principal_id: str, text: str) -> RunRequested:
    request = RunRequested(
        run_id="r-" + uuid.uuid4().hex,
        session_id=session_id,
        agent_id="assistant",
        principal_id=principal_id,
        tenant_id=TENANT,
        text=text,
    )
    await deployment.publish(Topic.RUNS_REQUESTED, request.model_dump_json().encode(), session_id)
    return request


async def _database_dump(stack: EmbeddedStack, database: str) -> bytes:
    """Every document of every collection of the deployment's database, as raw BSON."""
    client = client_on(stack.mongo_uri)
    try:
        return await resting_bytes(client[database])
    finally:
        await client.close()


def _service_logs(folder: Path) -> bytes:
    """Everything every service process logged."""
    return b"".join(path.read_bytes() for path in sorted(folder.glob("*.log")))


def _suspended(event: Any) -> bool:
    return event.type is StreamEventType.WORKFLOW and event.payload.get("phase") == "suspended"


async def test_after_forget_nothing_of_the_principal_is_readable_in_any_collection(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    name = f"erase{uuid.uuid4().hex[:8]}"
    said, asked, kept = (f"{word}{uuid.uuid4().hex[:8]}" for word in ("tangerine", "quince", "lemon"))
    async with Deployment(stack, f"{name}.", name, tmp_path) as deployment:
        deployment.start_recorder()
        session_id, other_session = await deployment.session(), await deployment.session()
        first = await _turn(deployment, session_id, "erin", f"my locker code is {said}")
        await deployment.until_closed(first.run_id, within=60)
        second = await _turn(deployment, session_id, "erin", f"ask me whether {asked} is ripe")
        await deployment.until_event(second.run_id, _suspended, 60, "suspension")
        bystander = await _turn(deployment, other_session, "bruno", f"my locker code is {kept}")
        await deployment.until_closed(bystander.run_id, within=60)

        memory = KafkaMemoryStore(deployment.store)
        recorded = await eventually(
            lambda: memory.list_history(session_id, 0, 10), 30, "erin's turn in the history"
        )
        assert any(said in row.text for row in recorded)
        before = await _database_dump(stack, name)
        assert said.encode() not in before  # sealed at rest even before forgetting

        await memory.forget_principal(TENANT, "erin")

        dump = await _database_dump(stack, name)
        for phrase in (said, asked):
            assert phrase.encode() not in dump, phrase
        assert await memory.list_history(session_id, 0, 10) == []
        for run_id in (first.run_id, second.run_id):
            with pytest.raises(TranscriptErasedError):
                await build_messages_from_run_log(deployment.store, run_id)
        kept_messages = await build_messages_from_run_log(deployment.store, bystander.run_id)
        assert any(kept in str(message.model_dump()) for message in kept_messages)
        # No service logged the words (logs never carry input values).
        logs = await asyncio.to_thread(_service_logs, tmp_path)
        assert logs and not any(phrase.encode() in logs for phrase in (said, asked, kept))
