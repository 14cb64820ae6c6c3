"""No caller reaches what belongs to another principal or another tenant, on any route or stream.

The routes come from the gateway's own `/openapi.json`: every operation there must have a case
below or be listed as public, so a new route fails this test until someone says how it is
checked. Principal A (tenant t1) owns sessions, runs, a one-shot run and facts, all carrying a
marker. Then, against the real storage owner on the embedded broker and database:

- B (another principal of t1), C (the admin of t2) and D (a principal named like A, in t2) send
  every case: each is refused (403/404, or 409 for a taken session id), no body carries A's
  marker, nothing is published, and A's sessions, runs, records and facts are as they were;
- then A (or A's tenant admin, for admin routes) sends the same cases and is served, which shows
  the refusals were for the caller and not for a malformed request.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from quipu.contracts.memory import FactOperation, FactOperationKind, MemoryScope, Provenance
from quipu.contracts.runs import CancelRun, RunRequested
from quipu.contracts.store import RunStart
from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.run_publisher import KafkaRunPublisher
from quipu.services.gateway import memory_routes
from quipu.services.gateway.access import OWNER_LABELS
from quipu.services.gateway.adapters import EventStreams
from quipu.services.gateway.app import EmbeddedServer, create_app
from quipu.services.gateway.handlers import GatewayDeps
from quipu.services.kit.memory_client import KafkaMemoryStore
from tests.conformance.builders import (
    ordinary,
    running_one_shot,
    running_root,
    snapshot,
    suspend,
)
from tests.integration.test_gateway_support import ServedStack, unique_name
from tests.support.gateway_keys import TestKeys
from tests.timing import scaled

MARK = "ANA-PRIVATE"
"""In every piece of A's data: no response to anyone else may carry it."""

PUBLIC = {("GET", "/healthz"), ("GET", "/asyncapi.json")}
"""Operations anyone may call: they reveal nothing of anyone's sessions, runs or memory."""

STREAMS = {("GET", "/v1/sessions/{session_id}/events")}


@dataclass
class World:
    """What A owns."""

    session: str
    ended: str
    run: RunStart
    suspended: RunStart
    one_shot: RunStart
    fact: str


Case = Callable[[World], tuple[str, dict[str, Any] | None]]
"""The concrete path (and JSON body) of an operation, aimed at A's things."""

CASES: dict[tuple[str, str], Case] = {
    ("POST", "/v1/sessions"): lambda w: ("/v1/sessions", {"session_id": w.session}),
    ("GET", "/v1/sessions/{session_id}"): lambda w: (f"/v1/sessions/{w.session}", None),
    ("POST", "/v1/sessions/{session_id}/end"): lambda w: (f"/v1/sessions/{w.session}/end", None),
    ("DELETE", "/v1/sessions/{session_id}"): lambda w: (f"/v1/sessions/{w.ended}", None),
    ("GET", "/v1/sessions/{session_id}/runs"): lambda w: (f"/v1/sessions/{w.session}/runs", None),
    ("GET", "/v1/sessions/{session_id}/events"): lambda w: (f"/v1/sessions/{w.session}/events", None),
    ("POST", "/v1/runs"): lambda w: (
        "/v1/runs",
        {"agent_id": "assistant", "text": "intruding", "session_id": w.session},
    ),
    ("GET", "/v1/runs/{run_id}"): lambda w: (f"/v1/runs/{w.run.run_id}", None),
    ("POST", "/v1/runs/{run_id}/cancel"): lambda w: (f"/v1/runs/{w.run.run_id}/cancel", None),
    ("POST", "/v1/runs/{run_id}/answer"): lambda w: (
        f"/v1/runs/{w.suspended.run_id}/answer",
        {"answer": "intruding"},
    ),
    ("GET", "/v1/runs/{run_id}/records"): lambda w: (f"/v1/runs/{w.run.run_id}/records", None),
    ("GET", "/v1/runs/{run_id}/transcript"): lambda w: (f"/v1/runs/{w.run.run_id}/transcript", None),
    # Memory is named by tenant and principal: "ana" of another tenant is another person.
    ("GET", "/v1/principals/{principal_id}/facts"): lambda w: ("/v1/principals/ana/facts?tenant_id=t1", None),
    ("DELETE", "/v1/principals/{principal_id}/facts/{fact_id}"): lambda w: (
        f"/v1/principals/ana/facts/{w.fact}?tenant_id=t1",
        None,
    ),
    ("GET", "/v1/principals/{principal_id}/export"): lambda w: (
        "/v1/principals/ana/export?tenant_id=t1",
        None,
    ),
    ("DELETE", "/v1/principals/{principal_id}"): lambda w: ("/v1/principals/ana?tenant_id=t1", None),
    ("POST", "/v1/memory/reindex"): lambda w: ("/v1/memory/reindex", {"tenant_id": "t1"}),
}

EXTRA_CASES: list[tuple[str, Case]] = [
    # The run routes aimed at A's one-shot run (owned through the labels the gateway stamps).
    ("GET", lambda w: (f"/v1/runs/{w.one_shot.run_id}", None)),
    ("GET", lambda w: (f"/v1/runs/{w.one_shot.run_id}/records", None)),
    ("GET", lambda w: (f"/v1/runs/{w.one_shot.run_id}/transcript", None)),
    ("POST", lambda w: (f"/v1/runs/{w.one_shot.run_id}/cancel", None)),
    ("POST", lambda w: ("/v1/memory/reindex", {"tenant_id": "t1", "principal_id": "ana"})),
    # A turn in A's ended session: refused as unknown, without telling that it has ended.
    ("POST", lambda w: ("/v1/runs", {"agent_id": "assistant", "text": "intruding", "session_id": w.ended})),
]

ADMIN_ONLY = {("POST", "/v1/memory/reindex")}
OWNER_LAST = [("POST", "/v1/sessions/{session_id}/end"), ("DELETE", "/v1/principals/{principal_id}")]
"""A's own requests run in table order, except these, which would erase what others use."""


@pytest.fixture(scope="module")
async def served(stack: EmbeddedStack) -> AsyncIterator[ServedStack]:
    async with ServedStack(stack, unique_name()) as served:
        yield served


class Published:
    """The real publisher, keeping what it sent."""

    def __init__(self, publisher: KafkaRunPublisher) -> None:
        self.publisher = publisher
        self.sent: list[RunRequested | CancelRun] = []

    async def publish(self, message: RunRequested | CancelRun) -> None:
        await self.publisher.publish(message)
        self.sent.append(message)


@dataclass
class Gateway:
    keys: TestKeys
    http: httpx.AsyncClient
    spec: dict[str, Any]
    published: Published


@pytest.fixture
async def gateway(served: ServedStack) -> AsyncIterator[Gateway]:
    keys = TestKeys()
    publisher = KafkaRunPublisher(served.kafka)
    await publisher.start()
    published = Published(publisher)
    deps = GatewayDeps(served.store, published, EventStreams(served.kafka, keepalive_s=0.3))
    app = create_app(
        served.kafka,
        deps=deps,
        settings=keys.settings(),
        memory=memory_routes.over_kafka(served.store, served.kafka),
    )
    server = EmbeddedServer(app)
    await server.start()
    http = httpx.AsyncClient(base_url=server.url, timeout=scaled(30.0))
    try:
        spec = (await http.get("/openapi.json")).json()
        yield Gateway(keys, http, spec, published)
    finally:
        await http.aclose()
        await server.stop()
        await publisher.stop()


def operations(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """Every (method, path) the gateway documents."""
    return {(method.upper(), path) for path, item in spec["paths"].items() for method in item}


async def a_world(served: ServedStack, http: httpx.AsyncClient, ana: dict[str, str]) -> World:
    """A's sessions (created through the gateway), runs, records and facts, each carrying the marker."""
    session = (await http.post("/v1/sessions", headers=ana)).json()["session_id"]
    ended = (await http.post("/v1/sessions", headers=ana)).json()["session_id"]
    assert (await http.post(f"/v1/sessions/{ended}/end", headers=ana)).status_code == 200
    labels = {"note": MARK}
    run = await running_root(served.store, session, labels=labels)
    words = [{"role": "user", "parts": [{"kind": "text", "text": f"{MARK} words"}]}]
    await served.store.append_run_record(
        ordinary(run, payload=json.dumps(words).encode(), record_type=TRANSCRIPT_MESSAGES_APPENDED)
    )
    suspended = await running_root(served.store, session, labels=labels)
    await suspend(served.store, suspended)
    owner = dict(zip(OWNER_LABELS, ("t1", "ana"), strict=True))
    one_shot = await running_one_shot(served.store, labels={**labels, **owner})
    memory = KafkaMemoryStore(served.store)
    fact = f"f-{unique_name()}"
    operation = FactOperation(
        kind=FactOperationKind.NEW,
        fact_id=fact,
        text=f"{MARK}: lives in Madrid.",
        provenance=Provenance(session_id=session, turn_id="t-1"),
    )
    await memory.apply_fact_operations(MemoryScope(tenant_id="t1", principal_id="ana"), [operation], fact)
    return World(session, ended, run, suspended, one_shot, fact)


async def state_of(served: ServedStack, world: World) -> dict[str, Any]:
    """Everything of A's that a write could change."""
    runs = [world.run.run_id, world.suspended.run_id, world.one_shot.run_id]
    facts = await KafkaMemoryStore(served.store).list_facts(MemoryScope(tenant_id="t1", principal_id="ana"))
    return {
        "store": await snapshot(served.store, runs=runs, sessions=[world.session, world.ended]),
        "facts": facts,
    }


async def send(
    http: httpx.AsyncClient, method: str, case: Case, world: World, headers: dict[str, str]
) -> httpx.Response:
    path, body = case(world)
    if method == "GET" and path.endswith("/events"):
        # A stream that is let in never ends: read its head only.
        async with http.stream(method, path, headers=headers) as response:
            await response.aread() if response.status_code != 200 else None
            return response
    return await http.request(method, path, headers=headers, json=body)


async def test_no_caller_reaches_another_principals_or_tenants_things(
    served: ServedStack, gateway: Gateway
) -> None:
    documented = operations(gateway.spec)
    unchecked = documented - set(CASES) - PUBLIC
    assert not unchecked, f"routes neither checked here nor public: {sorted(unchecked)}"
    assert set(CASES) <= documented, f"cases for routes that no longer exist: {set(CASES) - documented}"

    keys = gateway.keys
    ana = keys.issue("ana", "t1")
    world = await a_world(served, gateway.http, ana)
    before = await state_of(served, world)
    intruders = {
        "another principal of the tenant": keys.issue("bo", "t1"),
        "the admin of another tenant": keys.admin("t2"),
        "the same principal id in another tenant": keys.issue("ana", "t2"),
    }
    cases = [(method, case, path) for (method, path), case in CASES.items()]
    cases += [(method, case, "extra") for method, case in EXTRA_CASES]
    for who, headers in intruders.items():
        for method, case, route in cases:
            response = await send(gateway.http, method, case, world, headers)
            allowed = {403, 404} | ({409} if route == "/v1/sessions" else set())
            where = (who, method, case(world)[0], response.status_code, response.text[:200])
            assert response.status_code in allowed, where
            assert MARK not in response.text, where
    assert gateway.published.sent == []
    assert await state_of(served, world) == before

    # The owner (or the owner's tenant admin, for admin routes) is served by the very same requests.
    tenant_admin = keys.admin("t1")
    ordered = sorted(
        CASES.items(), key=lambda item: OWNER_LAST.index(item[0]) if item[0] in OWNER_LAST else -1
    )
    for (method, path), case in ordered:
        headers = tenant_admin if (method, path) in ADMIN_ONLY else ana
        response = await send(gateway.http, method, case, world, headers)
        assert 200 <= response.status_code < 300, (method, path, response.status_code, response.text[:300])
    assert {message.tenant_id for message in gateway.published.sent} == {"t1"}
