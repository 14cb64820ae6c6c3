"""Several gateway copies behind one load balancer: a run accepted by one copy is known to every
copy until the planner starts it (no planner runs here), and only to its owner."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.gateway.app import EmbeddedServer, create_app
from tests.integration.test_gateway_support import ServedStack, unique_name
from tests.support.gateway_keys import TestKeys
from tests.timing import eventually, scaled


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
        async with httpx.AsyncClient(base_url=servers[0].url, timeout=scaled(20)) as first, \
                httpx.AsyncClient(base_url=servers[1].url, timeout=scaled(20)) as second:
            created = await first.post("/v1/sessions", json={"session_id": unique_name()}, headers=alice)
            assert created.status_code == 201, created.text
            session_id = created.json()["session_id"]
            body = {"agent_id": "assistant", "text": "hi", "session_id": session_id}
            turn = await first.post("/v1/runs", json=body, headers=alice)
            assert turn.status_code == 202, turn.text
            run_id = turn.json()["run_id"]

            async def pending_on_the_other_copy() -> bool:
                return (await second.get(f"/v1/runs/{run_id}", headers=alice)).status_code == 202

            await eventually(pending_on_the_other_copy, within=20, what="the other copy answers 202")
            pending = await second.get(f"/v1/runs/{run_id}", headers=alice)
            assert pending.headers["retry-after"] == "1"
            assert pending.json()["session_id"] == session_id
            assert (await second.get(f"/v1/runs/{run_id}", headers=bob)).status_code == 404
    finally:
        for server in reversed(servers):
            await server.stop()
