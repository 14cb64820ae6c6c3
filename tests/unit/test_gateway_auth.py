"""Gateway credentials: API keys (hashed, scoped, revocable) and OIDC JWTs against a local JWKS file.

Every /v1 route names its caller; health, page and docs stay open.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from pydantic import SecretStr

from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.reindex import Principal
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.gateway.access import Scope
from quipu.services.gateway.adapters import EventStreams
from quipu.services.gateway.api_keys import digest, split_key
from quipu.services.gateway.app import create_app
from quipu.services.gateway.auth import presented_token
from quipu.services.gateway.handlers import GatewayDeps
from quipu.services.gateway.memory_routes import MemoryDeps
from quipu.services.gateway.settings import GatewaySettings
from tests.support.gateway_keys import TestKeys
from tests.unit.test_gateway import KAFKA, RecordingPublisher

ISSUER = "https://id.example.test/"
AUDIENCE = "quipu-gateway"


class Issuer:
    """A signing key pair and its JWKS file: tokens as an OIDC provider would mint them."""

    def __init__(self, directory: Path, kid: str = "k1") -> None:
        self.kid = kid
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        self.jwks = directory / "jwks.json"
        self.jwks.write_text(json.dumps({"keys": [{**public, "kid": kid, "use": "sig", "alg": "RS256"}]}))

    def token(self, **overrides: Any) -> str:
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "ana",
            "tenant_id": "t1",
            "scope": "runs:read runs:write openid",
            "iat": now,
            "exp": now + 300,
            **overrides,
        }
        claims = {name: value for name, value in claims.items() if value is not None}
        return jwt.encode(claims, self.private, algorithm="RS256", headers={"kid": self.kid})


async def _client(settings: GatewaySettings) -> AsyncIterator[httpx.AsyncClient]:
    deps = GatewayDeps(InMemoryStore(), RecordingPublisher(), EventStreams(KAFKA), tenant_id="t1")

    async def principals(_tenant_id: str | None) -> list[Principal]:
        return []

    app = create_app(
        KAFKA, deps=deps, settings=settings, memory=MemoryDeps(InMemoryMemoryStore(), principals)
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
    ):
        yield client


@pytest.fixture
def keys(tmp_path: Path) -> TestKeys:
    return TestKeys(tmp_path)


@pytest.fixture
def issuer(tmp_path: Path) -> Issuer:
    return Issuer(tmp_path)


@pytest.fixture
async def guarded(keys: TestKeys, issuer: Issuer) -> AsyncIterator[httpx.AsyncClient]:
    settings = keys.settings(oidc_issuer=ISSUER, oidc_audience=AUDIENCE, oidc_jwks=str(issuer.jwks))
    async for client in _client(settings):
        yield client


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_caller_without_a_valid_credential_is_refused_with_401(guarded: httpx.AsyncClient) -> None:
    for headers in (
        {},
        _bearer("wrong"),
        _bearer("qk_0000_forged"),
        {"authorization": "Basic qk_a_b"},
    ):
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


async def test_a_key_lets_its_principal_in_by_header_or_cookie(
    guarded: httpx.AsyncClient, keys: TestKeys
) -> None:
    headers = keys.issue("ana", "t1")
    by_header = await guarded.post("/v1/sessions", json={"session_id": "s-1"}, headers=headers)
    assert by_header.status_code == 201, by_header.text
    assert by_header.json()["owner"] == {"tenant_id": "t1", "principal_id": "ana"}
    guarded.cookies.set("quipu_token", headers["Authorization"].removeprefix("Bearer "))
    by_cookie = await guarded.get("/v1/sessions/s-1")
    assert by_cookie.status_code == 200 and by_cookie.json()["session_id"] == "s-1"
    assert (await guarded.get("/v1/principals/ana/facts")).status_code == 200


async def test_a_revoked_key_is_refused_at_the_next_request(
    guarded: httpx.AsyncClient, keys: TestKeys
) -> None:
    headers = keys.issue("ana", "t1")
    assert (await guarded.post("/v1/sessions", headers=headers)).status_code == 201
    key_id, _ = split_key(headers["Authorization"].removeprefix("Bearer ")) or ("", "")
    assert keys.file.revoke(key_id) is not None
    refused = await guarded.post("/v1/sessions", headers=headers)
    assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHENTICATED"


async def test_a_key_does_only_what_its_scopes_allow(guarded: httpx.AsyncClient, keys: TestKeys) -> None:
    reader = keys.issue("ana", "t1", [Scope.RUNS_READ, Scope.MEMORY_READ])
    for method, path in (
        ("POST", "/v1/sessions"),
        ("POST", "/v1/runs"),
        ("DELETE", "/v1/principals/ana"),
        ("POST", "/v1/memory/reindex"),
    ):
        response = await guarded.request(method, path, headers=reader)
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["code"] == "FORBIDDEN"
    assert (await guarded.get("/v1/principals/ana/facts", headers=reader)).status_code == 200


def test_the_keys_file_keeps_only_a_digest_of_the_secret(keys: TestKeys) -> None:
    key = keys.issue("ana", "t1")["Authorization"].removeprefix("Bearer ")
    key_id, secret = split_key(key) or ("", "")
    text = keys.file.path.read_text()
    assert secret not in text and digest(secret) in text and key_id in text
    assert keys.file.path.stat().st_mode & 0o077 == 0  # readable by its owner only


async def test_an_oidc_token_names_its_principal_tenant_and_scopes(
    guarded: httpx.AsyncClient, issuer: Issuer
) -> None:
    created = await guarded.post("/v1/sessions", headers=_bearer(issuer.token()))
    assert created.status_code == 201, created.text
    assert created.json()["owner"] == {"tenant_id": "t1", "principal_id": "ana"}
    # The token grants runs:* only: memory is out of its reach.
    facts = await guarded.get("/v1/principals/ana/facts", headers=_bearer(issuer.token()))
    assert facts.status_code == 403
    scp = issuer.token(scope=None, scp=["memory:read"])
    assert (await guarded.get("/v1/principals/ana/facts", headers=_bearer(scp))).status_code == 200


async def test_oidc_tokens_failing_any_check_are_refused(
    guarded: httpx.AsyncClient, issuer: Issuer, tmp_path: Path
) -> None:
    (tmp_path / "other").mkdir()
    stranger = Issuer(tmp_path / "other")
    now = int(time.time())
    refused = {
        "expired": issuer.token(iat=now - 4000, exp=now - 3600),
        "other issuer": issuer.token(iss="https://evil.example.test/"),
        "other audience": issuer.token(aud="someone-else"),
        "no tenant": issuer.token(tenant_id=None),
        "no subject": issuer.token(sub=None),
        "no expiry": issuer.token(exp=None),
        "signed by another key": stranger.token(),
        # "" is PyJWT's spelling of no key for alg=none (its `encode` is not typed to take None).
        "unsigned": jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "ana", "tenant_id": "t1"}, "", "none"),
        "symmetric with the public key as secret": jwt.encode(
            {"iss": ISSUER, "aud": AUDIENCE, "sub": "ana", "tenant_id": "t1", "exp": now + 60},
            json.loads(issuer.jwks.read_text())["keys"][0]["n"],  # the public modulus as the secret
            algorithm="HS256",
            headers={"kid": issuer.kid},
        ),
    }
    for why, token in refused.items():
        response = await guarded.post("/v1/sessions", headers=_bearer(token))
        assert response.status_code == 401, (why, response.text)


async def test_a_gateway_with_no_credential_configured_lets_nobody_in() -> None:
    async for client in _client(GatewaySettings()):
        assert (await client.post("/v1/sessions")).status_code == 401
        assert (await client.get("/healthz")).status_code == 200


def test_the_retired_shared_tokens_setting_stops_the_gateway_with_directions() -> None:
    with pytest.raises(ValueError, match="quipu keys create"):
        create_app(KAFKA, settings=GatewaySettings(api_tokens=SecretStr("alpha")))


async def test_health_page_and_docs_stay_open(guarded: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/", "/openapi.json", "/docs", "/asyncapi.json"):
        assert (await guarded.get(path)).status_code == 200, path


def test_the_presented_credential_is_the_header_else_the_cookie() -> None:
    assert presented_token("Bearer  a1 ", None) == "a1"
    assert presented_token("bearer a1", "cookie") == "a1"  # the header wins
    assert presented_token("Token a1", "cookie") is None  # a header of another scheme is not retried
    assert presented_token(None, "c1") == "c1" and presented_token(None, "") is None
    assert presented_token(None, "a%3Bb%3D") == "a;b="  # the page percent-encodes the cookie


@pytest.fixture
def jwks_url(issuer: Issuer) -> Iterator[str]:
    """The issuer's JWKS served over HTTP on loopback, as an identity provider publishes it."""
    document = issuer.jwks.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    finally:
        server.shutdown()
        server.server_close()


async def test_the_jwks_can_come_from_the_issuers_url(
    keys: TestKeys, issuer: Issuer, jwks_url: str, tmp_path: Path
) -> None:
    settings = keys.settings(oidc_issuer=ISSUER, oidc_audience=AUDIENCE, oidc_jwks=jwks_url)
    async for client in _client(settings):
        created = await client.post("/v1/sessions", headers=_bearer(issuer.token()))
        assert created.status_code == 201, created.text
        assert created.json()["owner"] == {"tenant_id": "t1", "principal_id": "ana"}
        (tmp_path / "forger").mkdir()
        forged = Issuer(tmp_path / "forger", kid=issuer.kid).token()  # same key id, another key
        assert (await client.post("/v1/sessions", headers=_bearer(forged))).status_code == 401
