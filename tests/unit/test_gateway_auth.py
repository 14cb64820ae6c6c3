"""Gateway API tokens: every /v1 route wants one when they are configured; health, page and docs do not."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from services.gateway.adapters import EventStreams
from services.gateway.app import create_app
from services.gateway.auth import is_known, parse_tokens, presented_token
from services.gateway.handlers import GatewayDeps
from services.gateway.memory_routes import MemoryDeps
from services.gateway.settings import GatewaySettings
from services.kit.memory.memory_store import InMemoryMemoryStore
from services.kit.memory.reindex import Principal
from services.kit.store.memory import InMemoryStore
from tests.unit.test_gateway import KAFKA, RecordingPublisher

TOKENS = "alpha-token-1, beta-token-2"


async def _client(api_tokens: str | None) -> AsyncIterator[httpx.AsyncClient]:
    settings = GatewaySettings(api_tokens=SecretStr(api_tokens) if api_tokens is not None else None)
    deps = GatewayDeps(InMemoryStore(), RecordingPublisher(), EventStreams(KAFKA), tenant_id="t1")
    memory = InMemoryMemoryStore()

    async def principals(_tenant_id: str | None) -> list[Principal]:
        return []

    app = create_app(KAFKA, deps=deps, settings=settings, memory=MemoryDeps(memory, principals))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
    ):
        yield client


@pytest.fixture
async def guarded() -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(TOKENS):
        yield client


@pytest.fixture
async def unguarded() -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(None):
        yield client


async def test_a_caller_without_a_known_token_is_refused_with_401(guarded: httpx.AsyncClient) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic alpha-token-1"}):
        for method, path in (
            ("POST", "/v1/sessions"),
            ("GET", "/v1/sessions/s-1"),
            ("GET", "/v1/sessions/s-1/events"),
            ("GET", "/v1/principals/ana/facts"),
            ("DELETE", "/v1/principals/ana"),
        ):
            response = await guarded.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.json()["code"] == "UNAUTHENTICATED"
            assert response.headers["www-authenticate"] == "Bearer"


async def test_either_configured_token_lets_the_caller_in_by_header_or_cookie(
    guarded: httpx.AsyncClient,
) -> None:
    by_header = await guarded.post(
        "/v1/sessions", json={"session_id": "s-1"}, headers={"Authorization": "Bearer alpha-token-1"}
    )
    assert by_header.status_code == 201, by_header.text
    guarded.cookies.set("quipu_token", "beta-token-2")
    by_cookie = await guarded.get("/v1/sessions/s-1")
    assert by_cookie.status_code == 200 and by_cookie.json()["session_id"] == "s-1"
    facts = await guarded.get("/v1/principals/ana/facts")
    assert facts.status_code == 200, facts.text


async def test_health_page_and_docs_stay_open(guarded: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/", "/openapi.json", "/docs"):
        assert (await guarded.get(path)).status_code == 200, path


async def test_without_tokens_the_gateway_is_open(unguarded: httpx.AsyncClient) -> None:
    assert (await unguarded.post("/v1/sessions", json={"session_id": "s-1"})).status_code == 201


def test_tokens_are_parsed_and_compared_exactly() -> None:
    tokens = parse_tokens(" a1 ,, b2 ,")
    assert tokens == ("a1", "b2")
    assert is_known("a1", tokens) and is_known("b2", tokens)
    assert not is_known("a", tokens) and not is_known("a1 ", tokens) and not is_known(None, tokens)
    assert not is_known("a1", ())
    assert presented_token("Bearer  a1 ", None) == "a1"
    assert presented_token("bearer a1", "cookie") == "a1"  # the header wins
    assert presented_token("Token a1", "cookie") is None  # a header of another scheme is not retried
    assert presented_token(None, "c1") == "c1" and presented_token(None, "") is None
    assert presented_token(None, "a%3Bb%3D") == "a;b="  # the page percent-encodes the cookie
