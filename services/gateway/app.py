"""The gateway as a FastAPI application: HTTP for clients, Server-Sent Events for UIs.

It owns no state: sessions and runs live in the store (reached through the storage owner),
run requests and cancellations go to the planner over Kafka, and event streams read
`runs.events`. Any number of copies can serve behind a load balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from quipu.contracts.errors import StoreError
from quipu.services.domain.run_publisher import KafkaRunPublisher
from quipu.services.domain.run_requests import RequestRefusedError
from quipu.services.gateway import logic, memory_routes
from quipu.services.gateway.access import AcceptedRuns
from quipu.services.gateway.adapters import EventStreams, RequestedRuns
from quipu.services.gateway.auth import Authenticator, authenticate
from quipu.services.gateway.body_limit import BodyLimit
from quipu.services.gateway.handlers import GatewayDeps, health_router, router, wire_document
from quipu.services.gateway.logic import GatewayError
from quipu.services.gateway.settings import GatewaySettings
from quipu.services.kit.keys import message_seals
from quipu.services.kit.logging import get_logger
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore

SERVICE = "gateway"

logger = get_logger(__name__)
STATIC = Path(__file__).parent / "static"


def _error(status: int, code: str, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(
        logic.ErrorResponse(code=code, message=message).model_dump(), status_code=status, headers=headers
    )


async def _gateway_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, GatewayError)
    return _error(error.status, error.code, error.message)


async def _store_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StoreError)
    refusal = logic.error_of(error)
    return _error(refusal.status, refusal.code, refusal.message)


async def _refused_request(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestRefusedError)
    refusal = logic.refusal_of(error)
    return _error(refusal.status, refusal.code, refusal.message)


async def _validation_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    problems = [
        f"{'.'.join(str(part) for part in problem.get('loc', ()))}: {problem.get('msg', '')}"
        for problem in error.errors()
    ]
    return _error(400, logic.INVALID_REQUEST, "; ".join(problems) or "invalid request")


async def _http_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    code = logic.ROUTE_NOT_FOUND if error.status_code == 404 else f"HTTP_{error.status_code}"
    return _error(error.status_code, code, str(error.detail))


@contextlib.asynccontextmanager
async def kafka_deps(
    kafka_settings: KafkaSettings, settings: GatewaySettings
) -> AsyncIterator[tuple[GatewayDeps, KafkaStore]]:
    """The gateway's clients over Kafka (and its store client, for the memory routes), started in
    order and stopped in reverse."""
    # One key cache for the store client, the run publisher and every event stream: a fetch per
    # person per TTL, and a forget through the memory routes lets go of the person's key for all.
    seals = message_seals(settings.keys)
    store = KafkaStore.for_service(kafka_settings, settings, tenant_id=settings.tenant_id, seals=seals)
    publisher = KafkaRunPublisher(kafka_settings, client_id=SERVICE, seals=seals)
    streams = EventStreams(kafka_settings, keepalive_s=settings.keepalive_s, seals=seals)
    accepted = AcceptedRuns()
    requested = RequestedRuns(kafka_settings, accepted, client_id=SERVICE)
    await store.start()
    try:
        await publisher.start()
        try:
            await requested.start()
            try:
                tenant = settings.tenant_id
                built = GatewayDeps(
                    store,
                    publisher,
                    streams,
                    tenant_id=tenant,
                    accepted=accepted,
                    learn_accepted=requested.catch_up,
                )
                yield built, store
            finally:
                streams.close()
                await requested.stop()
        finally:
            await publisher.stop()
    finally:
        await store.stop()
        await seals.close()


def create_app(
    kafka_settings: KafkaSettings,
    deps: GatewayDeps | None = None,
    settings: GatewaySettings | None = None,
    memory: memory_routes.MemoryDeps | None = None,
) -> FastAPI:
    """The gateway; without `deps` its lifespan starts a Kafka store client and a producer.

    With `deps` (tests: an in-memory store, a recording publisher) the caller owns them, and the
    memory routes use `memory` (any MemoryStore; without it they answer 503).
    """
    settings = settings or GatewaySettings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Built once, off the loop: on the first `/openapi.json` or `/docs` request it would hold
        # the loop (and every open stream) for the second pydantic takes (FastAPI keeps the result);
        # the AsyncAPI document likewise.
        await asyncio.to_thread(app.openapi)
        await asyncio.to_thread(wire_document)
        if deps is not None:
            app.state.deps = deps
            app.state.memory = memory
            try:
                yield
            finally:
                deps.streams.close()
                app.state.deps = app.state.memory = None
            return
        async with kafka_deps(kafka_settings, settings) as (built, store):
            app.state.deps = built
            app.state.memory = memory or memory_routes.over_kafka(store, kafka_settings)
            try:
                yield
            finally:
                app.state.deps = app.state.memory = None

    # Swagger UI and ReDoc from the assets `fastapi-offline` ships: `/docs` renders with no network.
    app = FastAPIOffline(
        title="Quipu gateway",
        summary="Sessions, runs and live run events (SSE) of the Quipu agent runtime.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.deps = app.state.memory = None
    app.state.authenticator = Authenticator.from_settings(settings)
    if not app.state.authenticator.configured:
        logger.warning(
            "the gateway accepts no credential: issue keys (`quipu keys create`) and set "
            "QUIPU_GATEWAY_API_KEYS_FILE, or configure QUIPU_GATEWAY_OIDC_*"
        )
    # Every /v1 route authenticates (its own dependency then checks scope and ownership).
    app.include_router(router, dependencies=[Depends(authenticate)])
    app.include_router(memory_routes.router, dependencies=[Depends(authenticate)])
    app.include_router(health_router)
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(StoreError, _store_error)
    app.add_exception_handler(RequestRefusedError, _refused_request)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        """The live event page."""
        return FileResponse(STATIC / "index.html", media_type="text/html")

    return app


def open_streams(app: FastAPI) -> EventStreams | None:
    """The app's event streams while it serves (None before start-up and after shutdown)."""
    deps: GatewayDeps | None = app.state.deps
    return deps.streams if deps is not None else None


class EmbeddedServer(uvicorn.Server):
    """uvicorn inside a running event loop (`quipu up`, tests): the caller owns the signals.

    `start()` returns once the socket listens; `stop()` ends open event streams first, so
    shutdown does not wait for clients that never leave.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, grace_s: int = 3) -> None:
        super().__init__(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_config=None,
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=grace_s,
            )
        )
        self.app = app
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Leave signal handling to the caller (uvicorn would take SIGINT for itself)."""
        yield

    async def start(self) -> None:
        """Serve in a task until `stop()`; raise if start-up fails."""
        self._task = asyncio.create_task(self._serve_without_exit(), name="gateway-http")
        while not self.started:
            if self._task.done():
                await self._task  # raises start-up errors
                raise RuntimeError("the gateway stopped during start-up")
            await asyncio.sleep(0.01)

    async def _serve_without_exit(self) -> None:
        # uvicorn calls sys.exit when it cannot bind; in a task that would stop the whole loop.
        try:
            await self.serve()
        except SystemExit as error:
            where = f"{self.config.host}:{self.config.port}"
            raise RuntimeError(f"the gateway could not listen on {where}") from error

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        sock: socket.socket = self.servers[0].sockets[0]
        port: int = sock.getsockname()[1]
        return port

    @property
    def url(self) -> str:
        """Base URL of the running server."""
        return f"http://{self.config.host}:{self.port}"

    async def stop(self) -> None:
        """End open streams, then shut the server down and wait for it."""
        streams = open_streams(self.app)
        if streams is not None:
            streams.close()
        self.should_exit = True
        if self._task is not None:
            await self._task
