"""The gateway's HTTP surface over the in-memory store and a recording publisher (no broker).

What a client sees: status codes, `{code, message}` error bodies, the messages a request
publishes, the OpenAPI document and the page. The same routes run against the real owner in
tests/integration/test_gateway.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from quipu.contracts import asyncapi
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.runs import CancelRun, RunKind, RunRequested
from quipu.contracts.store import CancellationReason, RunStatus, Session, SessionOwner
from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.gateway.access import accepted_elsewhere
from quipu.services.gateway.adapters import EventStreams
from quipu.services.gateway.app import create_app
from quipu.services.gateway.handlers import GatewayDeps
from quipu.services.kit.settings import KafkaSettings
from tests.conformance.builders import complete, ordinary, running_root, suspend
from tests.support.gateway_keys import TestKeys

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9", flavour="tansu")


class RecordingPublisher:
    """A RunPublisher that keeps what it was given."""

    def __init__(self) -> None:
        self.sent: list[RunRequested | CancelRun] = []

    async def publish(self, message: RunRequested | CancelRun) -> None:
        self.sent.append(message)


class Gateway:
    """An app on an in-memory store, its publisher and an HTTP client."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.publisher = RecordingPublisher()
        self.keys = TestKeys()
        self.app: FastAPI = create_app(
            KAFKA,
            deps=GatewayDeps(store, self.publisher, EventStreams(KAFKA), tenant_id="t1"),
            settings=self.keys.settings(),
        )
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://gw",
            headers=self.keys.issue("ana", "t1"),
        )


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    made = Gateway(InMemoryStore())
    async with made.app.router.lifespan_context(made.app), made.client:
        yield made


def error_of(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"code", "message"} and body["message"], body
    return response.status_code, body["code"]


async def session(gateway: Gateway, session_id: str = "s-1") -> str:
    response = await gateway.client.post("/v1/sessions", json={"session_id": session_id})
    assert response.status_code == 201, response.text
    return session_id


# --- sessions -------------------------------------------------------------------------------------


async def test_create_session_with_and_without_an_id(gateway: Gateway) -> None:
    named = await gateway.client.post("/v1/sessions", json={"session_id": "s-named"})
    assert named.status_code == 201
    assert named.json()["session_id"] == "s-named" and named.json()["status"] == "active"
    assert named.json()["ended_at"] is None

    for request in (gateway.client.post("/v1/sessions"), gateway.client.post("/v1/sessions", json={})):
        generated = await request
        assert generated.status_code == 201
        assert len(generated.json()["session_id"]) == 36  # a uuid4

    again = await gateway.client.post("/v1/sessions", json={"session_id": "s-named"})
    assert again.json() == named.json()  # the stored session, first created_at kept


async def test_session_lifecycle_and_its_errors(gateway: Gateway) -> None:
    client = gateway.client
    assert error_of(await client.get("/v1/sessions/nope")) == (404, "SESSION_NOT_FOUND")
    assert error_of(await client.post("/v1/sessions/nope/end")) == (404, "SESSION_NOT_FOUND")
    assert error_of(await client.delete("/v1/sessions/nope")) == (404, "SESSION_NOT_FOUND")

    await session(gateway)
    assert error_of(await client.delete("/v1/sessions/s-1")) == (409, "SESSION_ACTIVE")
    ended = await client.post("/v1/sessions/s-1/end")
    assert ended.status_code == 200 and ended.json()["status"] == "ended" and ended.json()["ended_at"]
    assert (await client.get("/v1/sessions/s-1")).json()["status"] == "ended"

    purged = await client.delete("/v1/sessions/s-1")
    assert purged.status_code == 204 and purged.content == b""
    assert (await client.delete("/v1/sessions/s-1")).status_code == 204  # idempotent
    assert error_of(await client.get("/v1/sessions/s-1")) == (410, "SESSION_PURGED")
    assert error_of(await client.post("/v1/sessions", json={"session_id": "s-1"})) == (410, "SESSION_PURGED")


async def test_purge_refused_while_a_run_is_running(gateway: Gateway) -> None:
    await session(gateway)
    await running_root(gateway.store, "s-1")
    await gateway.client.post("/v1/sessions/s-1/end")
    assert error_of(await gateway.client.delete("/v1/sessions/s-1")) == (409, "SESSION_HAS_ACTIVE_RUNS")


async def test_session_runs_in_start_order(gateway: Gateway) -> None:
    await session(gateway)
    first = await running_root(gateway.store, "s-1")
    second = await running_root(gateway.store, "s-1")
    runs = (await gateway.client.get("/v1/sessions/s-1/runs")).json()
    assert [run["run_id"] for run in runs] == [first.run_id, second.run_id]


# --- run requests ---------------------------------------------------------------------------------


async def test_a_turn_in_a_session_is_published_for_the_planner(gateway: Gateway) -> None:
    await session(gateway)
    response = await gateway.client.post(
        "/v1/runs",
        json={
            "agent_id": "assistant",
            "text": "hello",
            "session_id": "s-1",
            "labels": {"channel": "web"},
        },
    )
    assert response.status_code == 202, response.text
    accepted = response.json()
    [sent] = gateway.publisher.sent
    assert isinstance(sent, RunRequested)
    assert accepted == {"run_id": sent.run_id, "session_id": "s-1", "event_id": sent.event_id}
    assert sent.kind is RunKind.TURN and sent.agent_id == "assistant" and sent.text == "hello"
    # The principal and tenant come from the caller's key, and are stamped on the run's labels.
    assert sent.principal_id == "ana" and sent.tenant_id == "t1"
    assert sent.labels == {"channel": "web", "quipu.tenant_id": "t1", "quipu.principal_id": "ana"}
    assert sent.partition_key() == "s-1"


async def test_a_turn_without_a_session_is_a_one_shot_run_keyed_by_its_run(gateway: Gateway) -> None:
    response = await gateway.client.post("/v1/runs", json={"agent_id": "assistant", "text": "hi"})
    assert response.status_code == 202
    [sent] = gateway.publisher.sent
    assert isinstance(sent, RunRequested)
    assert sent.session_id == "" and sent.partition_key() == sent.run_id == response.json()["run_id"]


async def test_an_accepted_run_not_started_yet_answers_202_to_its_caller_only(gateway: Gateway) -> None:
    await session(gateway)
    accepted = await gateway.client.post("/v1/runs", json={"agent_id": "a", "text": "x", "session_id": "s-1"})
    run_id = accepted.json()["run_id"]
    # No planner here: the store knows nothing of the run yet, as under load for seconds.
    pending = await gateway.client.get(f"/v1/runs/{run_id}")
    assert pending.status_code == 202 and pending.headers["retry-after"] == "1"
    assert pending.json()["status"] == "requested" and pending.json()["session_id"] == "s-1"
    assert "/v1/sessions/s-1/events" in pending.json()["message"]
    other = gateway.keys.issue("bo", "t1")
    assert error_of(await gateway.client.get(f"/v1/runs/{run_id}", headers=other)) == (404, "RUN_NOT_FOUND")
    assert error_of(await gateway.client.get("/v1/runs/never-asked")) == (404, "RUN_NOT_FOUND")
    started = await running_root(gateway.store, "s-1", run_id=run_id)
    meta = await gateway.client.get(f"/v1/runs/{run_id}")
    assert meta.status_code == 200 and meta.json()["run_id"] == started.run_id


async def test_a_tenant_admin_administers_a_session_but_does_not_speak_in_it(gateway: Gateway) -> None:
    await session(gateway)
    admin = gateway.keys.admin("t1")
    seen = await gateway.client.get("/v1/sessions/s-1", headers=admin)
    assert seen.status_code == 200 and seen.json()["owner"] == {"tenant_id": "t1", "principal_id": "ana"}
    turn = {"agent_id": "a", "text": "as somebody else", "session_id": "s-1"}
    assert error_of(await gateway.client.post("/v1/runs", json=turn, headers=admin)) == (403, "FORBIDDEN")
    assert gateway.publisher.sent == []
    assert (await gateway.client.post("/v1/sessions/s-1/end", headers=admin)).status_code == 200
    elsewhere = gateway.keys.admin("t2")
    assert error_of(await gateway.client.get("/v1/sessions/s-1", headers=elsewhere)) == (
        404,
        "SESSION_NOT_FOUND",
    )


async def test_a_resent_turn_with_its_run_id_repeats_the_event_id(gateway: Gateway) -> None:
    body = {"agent_id": "assistant", "text": "hi", "run_id": "run-fixed"}
    first = (await gateway.client.post("/v1/runs", json=body)).json()
    second = (await gateway.client.post("/v1/runs", json=body)).json()
    assert first == second and first["run_id"] == "run-fixed"


async def test_a_turn_is_refused_before_anything_is_published(gateway: Gateway) -> None:
    client = gateway.client
    assert error_of(await client.post("/v1/runs", json={"text": "hi"})) == (400, "INVALID_ARGUMENT")
    assert error_of(await client.post("/v1/runs", json={"agent_id": "a", "text": ""})) == (
        400,
        "INVALID_ARGUMENT",
    )
    assert error_of(await client.post("/v1/runs", json={"agent_id": "a", "text": "x", "extra": 1})) == (
        400,
        "INVALID_ARGUMENT",
    )
    assert error_of(await client.post("/v1/runs", content=b"{not json")) == (400, "INVALID_ARGUMENT")
    # Who the run acts for comes from the credential, never from the body.
    posing = {"agent_id": "a", "text": "x", "principal_id": "bo"}
    assert error_of(await client.post("/v1/runs", json=posing)) == (400, "INVALID_ARGUMENT")
    reserved = {"agent_id": "a", "text": "x", "labels": {"quipu.principal_id": "bo"}}
    assert error_of(await client.post("/v1/runs", json=reserved)) == (400, "INVALID_ARGUMENT")
    await session(gateway)
    await client.post("/v1/sessions/s-1/end")
    ended = {"agent_id": "a", "text": "x", "session_id": "s-1"}
    assert error_of(await client.post("/v1/runs", json=ended)) == (409, "SESSION_ENDED")
    assert gateway.publisher.sent == []


async def test_a_turn_into_a_new_session_creates_it_for_the_caller_as_the_cli_does(gateway: Gateway) -> None:
    new = {"agent_id": "a", "text": "x", "session_id": "s-new"}
    assert (await gateway.client.post("/v1/runs", json=new)).status_code == 202
    created = await gateway.store.load_session_status("s-new")
    assert created.status.value == "active" and created.owner is not None
    assert (created.owner.tenant_id, created.owner.principal_id) == ("t1", "ana")
    [sent] = gateway.publisher.sent
    assert isinstance(sent, RunRequested) and (sent.session_id, sent.principal_id) == ("s-new", "ana")
    assert (await gateway.client.post("/v1/runs", json=new)).status_code == 202  # then it is theirs


# --- cancel and answer ----------------------------------------------------------------------------


async def test_cancel_publishes_for_the_runs_session(gateway: Gateway) -> None:
    await session(gateway)
    run = await running_root(gateway.store, "s-1")
    response = await gateway.client.post(f"/v1/runs/{run.run_id}/cancel")
    assert response.status_code == 202
    [sent] = gateway.publisher.sent
    assert isinstance(sent, CancelRun)
    assert (sent.run_id, sent.session_id, sent.reason) == (
        run.run_id,
        "s-1",
        CancellationReason.USER_REQUESTED,
    )
    assert response.json()["event_id"] == sent.event_id

    engine = await gateway.client.post(f"/v1/runs/{run.run_id}/cancel", json={"reason": "engine_canceled"})
    assert engine.status_code == 202
    last = gateway.publisher.sent[-1]
    assert isinstance(last, CancelRun) and last.reason is CancellationReason.ENGINE_CANCELED


async def test_cancel_refusals(gateway: Gateway) -> None:
    client = gateway.client
    assert error_of(await client.post("/v1/runs/nope/cancel")) == (404, "RUN_NOT_FOUND")
    await session(gateway)
    run = await running_root(gateway.store, "s-1")
    own_reason = {"reason": "session_ended"}
    assert error_of(await client.post(f"/v1/runs/{run.run_id}/cancel", json=own_reason)) == (
        400,
        "INVALID_ARGUMENT",
    )
    bogus = {"reason": "because"}
    assert error_of(await client.post(f"/v1/runs/{run.run_id}/cancel", json=bogus)) == (
        400,
        "INVALID_ARGUMENT",
    )
    await complete(gateway.store, run)
    assert error_of(await client.post(f"/v1/runs/{run.run_id}/cancel")) == (409, "RUN_NOT_ACTIVE")
    assert gateway.publisher.sent == []


async def test_answer_starts_a_continuation_of_a_suspended_run(gateway: Gateway) -> None:
    await session(gateway)
    run = await running_root(gateway.store, "s-1", labels={"k": "v"})
    await suspend(gateway.store, run)
    response = await gateway.client.post(f"/v1/runs/{run.run_id}/answer", json={"answer": {"approved": True}})
    assert response.status_code == 202, response.text
    [sent] = gateway.publisher.sent
    assert isinstance(sent, RunRequested)
    assert sent.kind is RunKind.RESUME and sent.predecessor_run_id == run.run_id
    assert sent.run_id != run.run_id and sent.run_id == response.json()["run_id"]
    assert (sent.session_id, sent.agent_id, sent.answer) == ("s-1", run.agent_id, {"approved": True})
    assert sent.principal_id == "ana" and sent.labels == {"k": "v"}


async def test_answer_refusals(gateway: Gateway) -> None:
    client = gateway.client
    assert error_of(await client.post("/v1/runs/nope/answer", json={"answer": "x"})) == (404, "RUN_NOT_FOUND")
    await session(gateway)
    run = await running_root(gateway.store, "s-1")
    assert error_of(await client.post(f"/v1/runs/{run.run_id}/answer", json={"answer": "x"})) == (
        409,
        "RUN_NOT_SUSPENDED",
    )
    assert error_of(await client.post(f"/v1/runs/{run.run_id}/answer", json={})) == (400, "INVALID_ARGUMENT")
    await complete(gateway.store, run)
    assert error_of(await client.post(f"/v1/runs/{run.run_id}/answer", json={"answer": "x"})) == (
        409,
        "RUN_NOT_SUSPENDED",
    )
    assert gateway.publisher.sent == []


# --- reads ----------------------------------------------------------------------------------------


async def test_run_meta_records_and_paging(gateway: Gateway) -> None:
    await session(gateway)
    run = await running_root(gateway.store, "s-1")
    for index in range(3):
        await gateway.store.append_run_record(ordinary(run, f"step-{index}"))
    meta = (await gateway.client.get(f"/v1/runs/{run.run_id}")).json()
    assert meta["status"] == RunStatus.RUNNING.value and meta["session_id"] == "s-1"

    keys: list[str] = []
    cursor = ""
    while True:
        page = (
            await gateway.client.get(f"/v1/runs/{run.run_id}/records", params={"cursor": cursor, "limit": 2})
        ).json()
        keys += [record["event_key"] for record in page["records"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert keys == ["started", "step-0", "step-1", "step-2"]

    client = gateway.client
    assert error_of(await client.get("/v1/runs/nope")) == (404, "RUN_NOT_FOUND")
    assert error_of(await client.get("/v1/runs/nope/records")) == (404, "RUN_NOT_FOUND")
    bad_cursor = {"cursor": "forged"}
    assert error_of(await client.get(f"/v1/runs/{run.run_id}/records", params=bad_cursor)) == (
        400,
        "INVALID_CURSOR",
    )
    assert error_of(await client.get(f"/v1/runs/{run.run_id}/records", params={"limit": 0})) == (
        400,
        "INVALID_ARGUMENT",
    )


async def test_transcript_keeps_exact_numbers_and_order(gateway: Gateway) -> None:
    await session(gateway)
    run = await running_root(gateway.store, "s-1")
    assert error_of(await gateway.client.get(f"/v1/runs/{run.run_id}/transcript")) == (
        422,
        "TRANSCRIPT_UNAVAILABLE",
    )
    messages = [
        {"role": "user", "parts": [{"kind": "text", "text": "price of 1.10?"}]},
        {
            "role": "assistant",
            "parts": [{"kind": "tool_use", "id": "c1", "name": "quote", "input": {"amount": 1.10}}],
        },
    ]
    payload = json.dumps(messages).replace("1.1}", "1.10}").encode()
    await gateway.store.append_run_record(
        ordinary(run, "t1", payload=payload, record_type=TRANSCRIPT_MESSAGES_APPENDED)
    )
    response = await gateway.client.get(f"/v1/runs/{run.run_id}/transcript")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert b'"amount":1.10' in response.content
    body = response.json()
    assert body["run_id"] == run.run_id
    assert [message["role"] for message in body["messages"]] == ["user", "assistant"]
    assert body["messages"][1]["parts"][0]["name"] == "quote"
    assert error_of(await gateway.client.get("/v1/runs/nope/transcript")) == (404, "RUN_NOT_FOUND")


async def test_an_unavailable_store_is_503_with_retry_after() -> None:
    class DownStore(InMemoryStore):
        async def load_session_status(self, session_id: str) -> Session:
            raise StoreError(ErrorCode.UNAVAILABLE, "no reply from the storage owner")

        async def create_session(
            self, session_id: str, created_at: datetime, owner: SessionOwner | None = None
        ) -> Session:
            raise StoreError(ErrorCode.UNAVAILABLE, "no reply from the storage owner")

    made = Gateway(DownStore())
    async with made.app.router.lifespan_context(made.app), made.client:
        response = await made.client.get("/v1/sessions/s-1")
        assert error_of(response) == (503, "UNAVAILABLE") and response.headers["retry-after"] == "1"
        assert error_of(await made.client.post("/v1/sessions")) == (503, "UNAVAILABLE")


async def test_unknown_routes_docs_page_and_health(gateway: Gateway) -> None:
    assert error_of(await gateway.client.get("/v1/nothing")) == (404, "NOT_FOUND")
    assert (await gateway.client.get("/docs")).status_code == 200
    spec = (await gateway.client.get("/openapi.json")).json()
    assert "/v1/sessions/{session_id}/events" in spec["paths"]
    page = await gateway.client.get("/")
    assert page.status_code == 200 and "EventSource" in page.text
    assert (await gateway.client.get("/healthz")).json() == {"status": "ok", "open_streams": 0}


async def test_the_gateway_serves_the_committed_asyncapi_document(gateway: Gateway) -> None:
    response = await gateway.client.get("/asyncapi.json")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.content == asyncapi.DOC_PATH.read_bytes()


async def test_the_openapi_schema_is_built_at_startup_before_any_request() -> None:
    """Built on the first `/openapi.json` or `/docs` request it held the loop for a second under
    load (every open stream stalled); startup builds it in a thread instead."""
    made = Gateway(InMemoryStore())
    assert made.app.openapi_schema is None
    async with made.app.router.lifespan_context(made.app):
        assert made.app.openapi_schema is not None


async def test_the_docs_pages_load_every_asset_from_the_gateway_itself(gateway: Gateway) -> None:
    """`/docs` and `/redoc` must render with no network: every script, style and icon they load is
    served by the gateway (a CDN URL would leave an offline user with a blank page)."""
    for page in ("/docs", "/redoc"):
        html = (await gateway.client.get(page)).text
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html) + re.findall(
            r"""url: ?["']([^"']+)["']""", html
        )
        assert assets, html
        for asset in assets:
            assert asset.startswith("/"), f"{page} loads {asset} from outside the gateway"
            response = await gateway.client.get(asset)
            assert response.status_code == 200 and response.content, asset
    assert "SwaggerUIBundle" in (await gateway.client.get("/docs")).text


async def test_a_gateway_that_is_not_serving_answers_503() -> None:
    made = Gateway(InMemoryStore())
    async with made.client:  # no lifespan: no dependencies
        assert error_of(await made.client.get("/v1/sessions/s-1")) == (503, "UNAVAILABLE")


def test_a_run_another_copy_accepted_is_read_from_its_ids_and_owner_labels_only() -> None:
    owner_labels = {"quipu.tenant_id": "t1", "quipu.principal_id": "al"}
    stamped = {"run_id": "r-1", "session_id": "s-1", "labels": owner_labels, "sealed": "…", "text": "unread"}
    assert accepted_elsewhere(json.dumps(stamped).encode()) == (
        "r-1", SessionOwner(tenant_id="t1", principal_id="al"), "s-1"
    )
    unstamped = {**stamped, "labels": {}}
    for value in (json.dumps(unstamped).encode(), b"not json", b"[1]", b"[" * 100_000, b"\xff",
                  json.dumps({**stamped, "run_id": 7}).encode()):
        assert accepted_elsewhere(value) is None
