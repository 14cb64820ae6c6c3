"""Request bodies are limited at the transport: an oversized body is refused before it is read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.gateway.adapters import EventStreams
from quipu.services.gateway.app import EmbeddedServer, create_app
from quipu.services.gateway.handlers import GatewayDeps
from tests.support.gateway_keys import TestKeys
from tests.timing import scaled
from tests.unit.test_gateway import KAFKA, RecordingPublisher

LIMIT = 64 * 1024


@pytest.fixture
async def served() -> AsyncIterator[tuple[EmbeddedServer, dict[str, str], RecordingPublisher]]:
    keys = TestKeys()
    publisher = RecordingPublisher()
    deps = GatewayDeps(InMemoryStore(), publisher, EventStreams(KAFKA))
    server = EmbeddedServer(create_app(KAFKA, deps=deps, settings=keys.settings(max_body_bytes=LIMIT)))
    await server.start()
    try:
        yield server, keys.issue("ana"), publisher
    finally:
        await server.stop()


async def _status_of_a_post(
    server: EmbeddedServer, headers: dict[str, str], framing: str, body: bytes
) -> bytes:
    """The status line a raw `POST /v1/runs` gets: its headers, then `body`, never anything more."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(
            (
                "POST /v1/runs HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                f"Authorization: {headers['Authorization']}\r\n{framing}\r\n\r\n"
            ).encode()
            + body
        )
        await writer.drain()
        # A server that waited for the rest of the body would never answer.
        return await asyncio.wait_for(reader.readline(), scaled(10))
    finally:
        writer.close()


async def test_a_declared_50_mb_body_is_refused_before_a_byte_of_it_is_sent(
    served: tuple[EmbeddedServer, dict[str, str], RecordingPublisher],
) -> None:
    server, headers, publisher = served
    status = await _status_of_a_post(server, headers, f"Content-Length: {50 * 1024 * 1024}", b"")
    assert status.startswith(b"HTTP/1.1 413"), status
    assert publisher.sent == []


async def test_a_chunked_body_is_refused_once_it_passes_the_limit(
    served: tuple[EmbeddedServer, dict[str, str], RecordingPublisher],
) -> None:
    server, headers, publisher = served
    chunk = b"x" * 8192
    # Twice the limit, and no last chunk: the body never completes.
    chunks = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * (2 * LIMIT // len(chunk))
    status = await _status_of_a_post(server, headers, "Transfer-Encoding: chunked", chunks)
    assert status.startswith(b"HTTP/1.1 413"), status
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=scaled(20)) as client:
        within = await client.post("/v1/runs", json={"agent_id": "a", "text": "x" * (LIMIT // 2)})
        assert within.status_code == 202, within.text
    assert len(publisher.sent) == 1
