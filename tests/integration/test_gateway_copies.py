"""Several gateway copies behind one load balancer: a run accepted by one copy is known to every
copy until the planner starts it (no planner runs here), and only to its owner; a copy reads what
the others accepted when a lookup misses, and fetches nothing meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from quipu.contracts.store import SessionOwner
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.gateway.access import OWNER_LABELS, AcceptedRuns
from quipu.services.gateway.adapters import RequestedRuns
from quipu.services.gateway.app import EmbeddedServer, create_app
from tests.integration.test_gateway_support import ServedStack, unique_name
from tests.support.gateway_keys import TestKeys
from tests.timing import scaled


@pytest.fixture(scope="module")
async def served(stack: EmbeddedStack) -> AsyncIterator[ServedStack]:
    async with ServedStack(stack, unique_name()) as served:
        yield served


async def test_a_run_accepted_by_one_copy_answers_202_on_another_to_its_owner_only(
    served: ServedStack,
) -> None:
    keys = TestKeys()
    servers = [EmbeddedServer(create_app(served.kafka, settings=keys.settings())) for _ in range(2)]
    for server in servers:
        await server.start()
    alice, bob = keys.issue("alice", "t1"), keys.issue("bob", "t1")
    try:
        async with (
            httpx.AsyncClient(base_url=servers[0].url, timeout=scaled(20)) as first,
            httpx.AsyncClient(base_url=servers[1].url, timeout=scaled(20)) as second,
        ):
            created = await first.post("/v1/sessions", json={"session_id": unique_name()}, headers=alice)
            assert created.status_code == 201, created.text
            session_id = created.json()["session_id"]
            body = {"agent_id": "assistant", "text": "hi", "session_id": session_id}
            turn = await first.post("/v1/runs", json=body, headers=alice)
            assert turn.status_code == 202, turn.text
            run_id = turn.json()["run_id"]

            # At once: the lookup's miss reads what the other copies accepted until now.
            pending = await second.get(f"/v1/runs/{run_id}", headers=alice)
            assert pending.status_code == 202, pending.text
            assert pending.headers["retry-after"] == "1"
            assert pending.json()["session_id"] == session_id
            assert (await second.get(f"/v1/runs/{run_id}", headers=bob)).status_code == 404
    finally:
        for server in reversed(servers):
            await server.stop()


async def test_a_copy_reads_the_requests_a_lookup_missed_to_their_end_and_is_paused_meanwhile(
    served: ServedStack,
) -> None:
    # Idle, a copy fetched runs.requested 4 times a second. Five requests in one batch: Tansu may
    # report the batch's end as its first offset + 1, and the whole batch must still be read.
    owner = SessionOwner(tenant_id="t1", principal_id="alice")
    labels = dict(zip(OWNER_LABELS, (owner.tenant_id, owner.principal_id), strict=True))
    runs = {unique_name(): unique_name() for _ in range(5)}
    accepted = AcceptedRuns()
    requested = RequestedRuns(served.kafka, accepted)
    producer = AIOKafkaProducer(
        bootstrap_servers=served.kafka.bootstrap, enable_idempotence=False, linger_ms=100
    )
    await asyncio.gather(requested.start(), producer.start())
    consumer = requested._consumer
    assert consumer is not None
    try:
        assert consumer.paused() == consumer.assignment() != set()
        topic = served.kafka.topic_prefix + Topic.RUNS_REQUESTED.value
        sent = [
            await producer.send(
                topic,
                json.dumps({"run_id": run_id, "session_id": session_id, "labels": labels}).encode(),
                partition=0,
            )
            for run_id, session_id in runs.items()
        ]
        await asyncio.gather(*sent)
        async with asyncio.timeout(scaled(20)):
            await requested.catch_up()
        now = time.monotonic()
        assert {run_id: accepted.session_of(run_id, owner, now) for run_id in runs} == runs
        assert consumer.paused() == consumer.assignment()
    finally:
        await asyncio.gather(requested.stop(), producer.stop())
