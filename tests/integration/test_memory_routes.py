"""The gateway's memory routes as a person uses them: see, export, delete, forget, reindex.

First over the in-memory store (`create_app(..., memory=MemoryDeps(...))`, no broker), then the
same routes on the real owner and broker, with the enricher running, where the gateway reaches
memory through the owner's Kafka client exactly as in production.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from quipu.contracts.memory import FactOperation, FactOperationKind, MemoryScope, Profile, Provenance
from quipu.contracts.runs import CancelRun, RunRequested
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.reindex import Principal
from quipu.services.domain.memory.retrieval_eval import ManualClock
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.enricher.adapters import Enricher
from quipu.services.enricher.app import create_app as create_enricher
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.gateway.adapters import EventStreams
from quipu.services.gateway.app import create_app
from quipu.services.gateway.handlers import GatewayDeps
from quipu.services.gateway.memory_routes import MemoryDeps
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from tests.integration.test_gateway_support import ServedStack, eventually, unique_name
from tests.support.gateway_keys import TestKeys
from tests.timing import scaled

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9", flavour="tansu")
ANA = MemoryScope(tenant_id="t1", principal_id="ana")
ANA_PLANNER = MemoryScope(tenant_id="t1", principal_id="ana", agent_id="planner")
BRUNO = MemoryScope(tenant_id="t1", principal_id="bruno")


class NoPublisher:
    """A RunPublisher that refuses to be used: the memory routes publish nothing."""

    async def publish(self, message: RunRequested | CancelRun) -> None:
        raise AssertionError(f"memory routes must not publish {message!r}")


async def _no_wait(_: float) -> None:
    return None


@dataclass
class Local:
    """The gateway over an in-memory memory store, the enricher beside it, and a client."""

    memory: InMemoryMemoryStore
    enricher: Enricher
    client: httpx.AsyncClient
    enricher_running: bool = True

    async def add(self, scope: MemoryScope, fact_id: str, text: str, turn: str = "t-1") -> None:
        operation = FactOperation(
            kind=FactOperationKind.NEW,
            fact_id=fact_id,
            text=text,
            provenance=Provenance(session_id="s-1", turn_id=turn, message_seq=1),
        )
        changes = await self.memory.apply_fact_operations(scope, [operation], f"new/{fact_id}")
        for change in changes if self.enricher_running else []:
            await self.enricher.on_fact_changed(change)

    async def entries(self, scope: MemoryScope) -> set[str]:
        entries = await self.memory._transactions.run(
            lambda tx: tx.principal_index(scope.tenant_id, scope.principal_id)
        )
        return {entry.fact_id for entry in entries}


@pytest.fixture
async def local() -> AsyncIterator[Local]:
    clock = ManualClock()
    memory = InMemoryMemoryStore(clock=clock)

    async def principals(tenant_id: str | None) -> list[Principal]:
        every = [
            Principal(tenant_id="t1", principal_id="ana"),
            Principal(tenant_id="t1", principal_id="bruno"),
        ]
        return [p for p in every if tenant_id is None or p.tenant_id == tenant_id]

    deps = GatewayDeps(InMemoryStore(), NoPublisher(), EventStreams(KAFKA), tenant_id="t1")
    keys = TestKeys()
    app: FastAPI = create_app(
        KAFKA, deps=deps, settings=keys.settings(), memory=MemoryDeps(memory, principals)
    )
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gw", headers=keys.admin("t1")
    )
    enricher = Enricher(memory, EnricherSettings(retry_delay_s=0), clock=clock, sleep=_no_wait)
    async with app.router.lifespan_context(app), client:
        yield Local(memory, enricher, client)


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["code"]
    return code


# --- over the in-memory store -------------------------------------------------------------------------


async def test_a_person_sees_their_facts_with_provenance(local: Local) -> None:
    await local.add(ANA, "f-1", "Lives in Madrid.", turn="t-7")
    await local.add(ANA_PLANNER, "f-2", "Plans trips by train.")
    await local.add(BRUNO, "f-3", "Lives in Lisbon.")
    response = await local.client.get("/v1/principals/ana/facts")  # tenant: the caller's
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["scope"] == {"tenant_id": "t1", "principal_id": "ana", "agent_id": ""}
    assert [fact["fact_id"] for fact in body["facts"]] == ["f-1", "f-2"]
    assert body["facts"][0]["provenance"] == {"session_id": "s-1", "turn_id": "t-7", "message_seq": 1}
    other_tenant = await local.client.get("/v1/principals/ana/facts", params={"tenant_id": "t2"})
    assert other_tenant.status_code == 404  # an admin of t1 reaches nothing of t2
    planner_only = await local.client.get("/v1/principals/ana/facts", params={"agent_id": "planner"})
    assert [fact["fact_id"] for fact in planner_only.json()["facts"]] == ["f-1", "f-2"]
    other_agent = await local.client.get("/v1/principals/ana/facts", params={"agent_id": "coder"})
    assert [fact["fact_id"] for fact in other_agent.json()["facts"]] == ["f-1"]


async def test_deleting_a_fact_removes_it_from_retrieval_and_the_index(local: Local) -> None:
    await local.add(ANA, "f-1", "Lives in Madrid.")
    await local.add(ANA, "f-2", "Works in Madrid.")
    response = await local.client.delete("/v1/principals/ana/facts/f-1")
    assert response.status_code == 200, response.text
    assert response.json() == {"fact_id": "f-1", "version": 2}
    assert await local.entries(ANA) == {"f-2"}  # dropped by the gateway, not left to the enricher
    assert [hit.fact.fact_id for hit in await local.memory.search_index(ANA, "Madrid", 5)] == ["f-2"]
    assert [hit.fact.fact_id for hit in await local.memory.search_authority(ANA, "Madrid", 5)] == ["f-2"]
    listed = await local.client.get("/v1/principals/ana/facts")
    assert [fact["fact_id"] for fact in listed.json()["facts"]] == ["f-2"]
    again = await local.client.delete("/v1/principals/ana/facts/f-1")  # a retried request
    assert (again.status_code, again.json()) == (200, response.json())
    unknown = await local.client.delete("/v1/principals/ana/facts/f-404")
    assert (unknown.status_code, error_code(unknown)) == (404, "FACT_NOT_FOUND")
    not_theirs = await local.client.delete("/v1/principals/bruno/facts/f-2")
    assert (not_theirs.status_code, error_code(not_theirs)) == (404, "FACT_NOT_FOUND")
    assert await local.entries(ANA) == {"f-2"}


async def test_export_holds_facts_previous_versions_and_the_profile(local: Local) -> None:
    await local.add(ANA, "f-1", "Lives in Madrid.")
    await local.add(ANA, "f-2", "Drinks coffee.")
    await local.client.delete("/v1/principals/ana/facts/f-2")
    await local.memory.save_profile(
        Profile(scope=ANA, text="A developer in Madrid.", source_turns=3, updated_at=utc_now_ms())
    )
    response = await local.client.get("/v1/principals/ana/export")
    assert response.status_code == 200
    assert "attachment" in response.headers["content-disposition"]
    body = response.json()
    assert [fact["text"] for fact in body["facts"]] == ["Lives in Madrid."]
    assert [fact["text"] for fact in body["audit"]] == ["Drinks coffee."]
    assert body["profile"]["text"] == "A developer in Madrid."


async def test_forgetting_a_person_erases_everything_of_theirs_only(local: Local) -> None:
    await local.add(ANA, "f-1", "Lives in Madrid.")
    await local.add(BRUNO, "f-2", "Lives in Lisbon.")
    response = await local.client.delete("/v1/principals/ana")
    assert response.status_code == 200, response.text
    assert response.json()["principal_id"] == "ana" and response.json()["erased"] >= 2  # fact + entry
    assert (await local.client.get("/v1/principals/ana/facts")).json()["facts"] == []
    exported = (await local.client.get("/v1/principals/ana/export")).json()
    assert exported["facts"] == exported["audit"] == [] and exported["profile"] is None
    assert await local.entries(ANA) == set()
    assert await local.memory.search_authority(ANA, "Madrid", 5) == []
    assert [
        fact["fact_id"] for fact in (await local.client.get("/v1/principals/bruno/facts")).json()["facts"]
    ] == ["f-2"]


async def test_reindex_one_principal_or_every_one(local: Local) -> None:
    local.enricher_running = False
    await local.add(ANA, "f-1", "Lives in Madrid.")
    await local.add(BRUNO, "f-2", "Lives in Lisbon.")
    assert await local.entries(ANA) == await local.entries(BRUNO) == set()
    one = await local.client.post("/v1/memory/reindex", json={"principal_id": "ana"})
    assert one.status_code == 200, one.text
    assert one.json() == {"principals": 1, "indexed": 1, "dropped": 0}
    assert await local.entries(ANA) == {"f-1"} and await local.entries(BRUNO) == set()
    every = await local.client.post("/v1/memory/reindex")
    assert every.json() == {"principals": 2, "indexed": 2, "dropped": 0}
    assert await local.entries(BRUNO) == {"f-2"}
    refused = await local.client.post("/v1/memory/reindex", json={"principal_id": ""})
    assert refused.status_code == 400


async def test_without_a_memory_store_the_routes_answer_503() -> None:
    deps = GatewayDeps(InMemoryStore(), NoPublisher(), EventStreams(KAFKA))
    keys = TestKeys()
    app = create_app(KAFKA, deps=deps, settings=keys.settings())
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw", headers=keys.issue("ana")
        ) as client,
    ):
        response = await client.get("/v1/principals/ana/facts")
    assert (response.status_code, error_code(response)) == (503, "UNAVAILABLE")


# --- on the real owner and broker -----------------------------------------------------------------------


@pytest.mark.slow
async def test_memory_routes_on_the_real_owner(stack: EmbeddedStack) -> None:
    async with ServedStack(stack, unique_name()) as served:
        memory = KafkaMemoryStore(served.store)
        enricher = create_enricher(served.kafka, EnricherSettings(store_reply_timeout_s=scaled(10.0)))
        keys = TestKeys()
        app = create_app(served.kafka, settings=keys.settings(tenant_id="t1"))
        await enricher.start()
        try:
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app),
                    base_url="http://gw",
                    timeout=scaled(30.0),
                    headers=keys.admin("t1"),
                ) as client,
            ):
                for fact_id, text in [("f-1", "Lives in Madrid."), ("f-2", "Works in Madrid.")]:
                    operation = FactOperation(
                        kind=FactOperationKind.NEW,
                        fact_id=fact_id,
                        text=text,
                        provenance=Provenance(session_id="s-1", turn_id="t-1"),
                    )
                    await memory.apply_fact_operations(ANA, [operation], f"new/{fact_id}")
                await memory.apply_fact_operations(
                    BRUNO,
                    [
                        FactOperation(
                            kind=FactOperationKind.NEW,
                            fact_id="f-3",
                            text="Lives in Lisbon.",
                            provenance=Provenance(session_id="s-2", turn_id="t-2"),
                        )
                    ],
                    "new/f-3",
                )

                async def indexed() -> bool:
                    return len(await memory.search_index(ANA, "Madrid", 5)) == 2

                await eventually(indexed)
                listed = await client.get("/v1/principals/ana/facts")
                assert [fact["fact_id"] for fact in listed.json()["facts"]] == ["f-1", "f-2"]

                deleted = await client.delete("/v1/principals/ana/facts/f-1")
                assert deleted.status_code == 200, deleted.text
                assert [hit.fact.fact_id for hit in await memory.search_index(ANA, "Madrid", 5)] == ["f-2"]
                assert [hit.fact.fact_id for hit in await memory.search_authority(ANA, "Madrid", 5)] == [
                    "f-2"
                ]
                assert (await client.delete("/v1/principals/ana/facts/f-404")).status_code == 404

                exported = (await client.get("/v1/principals/ana/export")).json()
                assert [fact["fact_id"] for fact in exported["audit"]] == ["f-1"]

                every = await client.post("/v1/memory/reindex", json={"tenant_id": "t1"})
                assert every.status_code == 200, every.text
                assert every.json() == {"principals": 2, "indexed": 2, "dropped": 1}

                forgotten = await client.delete("/v1/principals/ana")
                assert forgotten.status_code == 200 and forgotten.json()["erased"] >= 3
                assert (await client.get("/v1/principals/ana/facts")).json()["facts"] == []
                assert await memory.search_index(ANA, "Madrid", 5) == []
                assert [hit.fact.fact_id for hit in await memory.search_index(BRUNO, "Lisbon", 5)] == ["f-3"]
        finally:
            await enricher.stop()
