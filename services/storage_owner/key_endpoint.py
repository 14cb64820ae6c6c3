"""The owner's key endpoint: data keys handed to services directly, over a channel that keeps nothing.

`POST /v1/keys` with `{tenant_id, principal_id, create}` and `Authorization: Bearer <QUIPU_KEYS_TOKEN>`
answers `{key}` (base64), 404 when the principal has no key (forgotten) and `create` is false, 401
without the token, 503 when the database is away. Nothing of a request or answer is logged (no
access log) or written anywhere: a key on a topic or in a log would outlive the forget.

During a rotation the endpoint also accepts the previous token
(`QUIPU_OWNER_KEYS_PREVIOUS_TOKEN`), so services move to the new one without being refused.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
from collections.abc import Generator, Sequence

import uvicorn
from fastapi import FastAPI, Header, HTTPException

from quipu.contracts.errors import StoreError
from quipu.services.kit.keys import KEYS_PATH, DataKey, KeyRequest, KeySource


def key_app(source: KeySource, tokens: Sequence[str]) -> FastAPI:
    """The key endpoint over `source`, for callers that present one of `tokens` (empty ones never match)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    expected = [f"Bearer {token}".encode() for token in tokens if token]

    @app.post(KEYS_PATH)
    async def data_key(request: KeyRequest, authorization: str = Header(default="")) -> DataKey:
        presented = authorization.encode()
        # Every token is compared (no early exit), so the time taken says nothing of which matched.
        if not sum(hmac.compare_digest(presented, token) for token in expected):
            raise HTTPException(status_code=401, detail="a service token is required")
        try:
            key = await source.data_key(request.whose(), create=request.create)
        except StoreError as error:
            raise HTTPException(status_code=503, detail=error.code.value) from error
        if key is None:
            raise HTTPException(status_code=404, detail="no key: the principal was forgotten")
        return DataKey(key=base64.b64encode(key).decode("ascii"))

    return app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The owner's process handles its signals; uvicorn would take SIGINT for itself.
        yield


class KeyEndpoint:
    """The key endpoint served by uvicorn inside the owner's event loop."""

    def __init__(self, source: KeySource, tokens: Sequence[str], host: str, port: int) -> None:
        config = uvicorn.Config(
            key_app(source, tokens), host=host, port=port, log_config=None, access_log=False, lifespan="off"
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen; raise when the port cannot be bound."""
        self._task = asyncio.create_task(self._serve(), name="key-endpoint")
        while not self._server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("the key endpoint stopped during start-up")
            await asyncio.sleep(0.01)

    async def _serve(self) -> None:
        try:
            await self._server.serve()
        except SystemExit as error:  # uvicorn exits when it cannot bind
            raise RuntimeError("the key endpoint could not listen") from error

    @property
    def port(self) -> int:
        """The port bound (useful with port 0)."""
        port: int = self._server.servers[0].sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        """Stop serving and wait for it."""
        self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
