"""`quipu memory list|delete|export|forget|reindex` against the real storage owner.

The same operations as the gateway's memory routes, from a terminal: each command runs through
typer's CliRunner in a worker thread (its own event loop, as from a shell) while this test's loop
serves the owner.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from quipu.contracts.memory import FactOperation, FactOperationKind, HistoryTurn, MemoryScope, Provenance
from quipu.contracts.store import SessionOwner
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.cli import app
from quipu.services.kit.memory_client import KafkaMemoryStore
from tests.integration.test_gateway_support import ServedStack, unique_name

pytestmark = pytest.mark.slow

runner = CliRunner()
ANA = MemoryScope(tenant_id="t1", principal_id="ana")


async def quipu(served: ServedStack, *args: str, input: str | None = None) -> Any:
    """Run one `quipu` command in a worker thread, pointed at the served stack."""
    env = {
        "QUIPU_KAFKA_BOOTSTRAP": served.stack.bootstrap,
        "QUIPU_KAFKA_FLAVOUR": "tansu",
        "QUIPU_KAFKA_TOPIC_PREFIX": served.prefix,
    }
    return await asyncio.to_thread(runner.invoke, app, list(args), input=input, env=env)


async def test_memory_commands(stack: EmbeddedStack) -> None:
    async with ServedStack(stack, unique_name()) as served:
        memory = KafkaMemoryStore(served.store)
        await served.store.create_session("s-gone", utc_now_ms())
        said = HistoryTurn(
            session_id="s-gone",
            turn_id="t-2",
            scope=ANA,
            user_text="I take my coffee black.",
            assistant_text="Noted.",
            created_at=utc_now_ms(),
        )
        await memory.append_history_turn(said)
        for fact_id, text, session in [
            ("f-1", "Lives in Madrid.", "s-1"),
            ("f-2", "Drinks coffee black.", "s-gone"),
        ]:
            operation = FactOperation(
                kind=FactOperationKind.NEW,
                fact_id=fact_id,
                text=text,
                provenance=Provenance(session_id=session, turn_id="t-9"),
            )
            await memory.apply_fact_operations(ANA, [operation], f"new/{fact_id}")
        await served.store.end_session("s-gone", utc_now_ms())

        purged = await quipu(served, "sessions", "purge", "s-gone")
        assert purged.exit_code == 0, purged.output
        assert (
            "facts learned in it stay in ana's memory: `quipu memory list ana`" in purged.output
        )  # its history's
        await served.store.create_session(
            "s-owned", utc_now_ms(), SessionOwner(tenant_id="t1", principal_id="ana")
        )
        await served.store.end_session("s-owned", utc_now_ms())
        purged = await quipu(served, "sessions", "purge", "s-owned")
        assert (
            "stay in ana's memory: `quipu memory list ana --tenant t1`" in purged.output
        )  # its recorded owner

        listed = await quipu(served, "memory", "list", "ana", "--tenant", "t1")
        assert listed.exit_code == 0, listed.output
        assert "f-1  Lives in Madrid." in listed.output and "from session s-1, turn t-9" in listed.output
        assert "from session s-gone (purged), turn t-9" in listed.output
        assert "facts stay in memory after the session they came from is purged" in listed.output

        reindexed = await quipu(served, "memory", "reindex")  # every principal seen on memory.changes
        assert reindexed.exit_code == 0, reindexed.output
        assert "reindexed 1 principal(s): 2 entries written, 0 dropped" in reindexed.output
        assert [hit.fact.fact_id for hit in await memory.search_index(ANA, "coffee", 5)] == ["f-2"]

        deleted = await quipu(served, "memory", "delete", "ana", "f-2", "--tenant", "t1")
        assert deleted.exit_code == 0, deleted.output
        assert await memory.search_index(ANA, "coffee", 5) == []
        assert await memory.search_authority(ANA, "coffee", 5) == []
        missing = await quipu(served, "memory", "delete", "ana", "f-404", "--tenant", "t1")
        assert missing.exit_code == 1 and "FACT_NOT_FOUND" in missing.output

        exported = await quipu(served, "memory", "export", "ana", "--tenant", "t1")
        assert exported.exit_code == 0, exported.output
        body = json.loads(exported.stdout)
        assert [fact["fact_id"] for fact in body["facts"]] == ["f-1"]
        assert [fact["fact_id"] for fact in body["audit"]] == ["f-2"]

        one = await quipu(served, "memory", "reindex", "--principal", "ana", "--tenant", "t1")
        assert "reindexed 1 principal(s): 1 entries written, 1 dropped" in one.output

        kept = await quipu(served, "memory", "forget", "ana", "--tenant", "t1", input="n\n")
        assert kept.exit_code == 1 and await memory.list_facts(ANA) != []
        forgotten = await quipu(served, "memory", "forget", "ana", "--tenant", "t1", "--yes")
        assert forgotten.exit_code == 0, forgotten.output
        assert await memory.list_facts(ANA) == []
        assert await memory.search_index(ANA, "Madrid", 5) == []
