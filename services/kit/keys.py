"""The principals' data keys as a service sees them, and the sealing of topic messages with them.

    keys = KeyClient(HttpKeySource(settings))     # or the owner's own source, in its process
    seals = MessageSeals(keys)
    body = await seals.encode(event)              # sealed when `event.sealed_for` is set
    plain = await seals.open(body)                # MessageErasedError: the principal was forgotten

Keys come over a channel that keeps nothing: the storage owner answers `POST /v1/keys` directly
(HTTP on the deployment's network, a service token), never through a topic or a log, and a key
is held only in this process's memory for `KeySettings.cache_ttl_s`: one fetch per principal per
TTL per process. A forget made by this process's owner drops the key at once (`KeyClient.drop`);
one made elsewhere reaches this process's cache within the TTL, while the copies on topics are
unreadable to everyone else at once (their key is gone from the owner).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import httpx
from pydantic import BaseModel, Field

from quipu.contracts.sealed import SEALED_FOR_FIELD, SealedFor
from quipu.services.kit import sealing
from quipu.services.kit.delivery import MessageErasedError, PermanentError, RetryableError
from quipu.services.kit.sealing import current_sealing_for
from quipu.services.kit.settings import KeySettings

KEYS_PATH = "/v1/keys"
"""The owner's key endpoint."""


class KeyUnavailableError(RetryableError):
    """Raised when the key channel does not answer (the owner is away): try again later."""


class UnsealableMessageError(PermanentError):
    """Raised when a sealed message can never open here: altered, or no key channel configured."""


class KeyRequest(BaseModel):
    """A request to the key endpoint: whose data key, and whether to make one when there is none."""

    tenant_id: str = Field(default="", description="Tenant of the principal.")
    principal_id: str = Field(min_length=1, description="The principal.")
    create: bool = Field(default=False, description="Make a key when the principal has none (a writer).")

    def whose(self) -> SealedFor:
        """The principal asked about."""
        return SealedFor(tenant_id=self.tenant_id, principal_id=self.principal_id)


class DataKey(BaseModel):
    """The key endpoint's answer (never logged, never written anywhere)."""

    key: str = Field(description="The data key, padded base64 of 32 bytes.")


class KeySource(Protocol):
    """Where data keys come from: the owner's keyring, or its endpoint."""

    async def data_key(self, whose: SealedFor, *, create: bool) -> bytes | None:
        """The principal's data key; None when they have none (forgotten, and `create` is false)."""
        ...


class HttpKeySource:
    """The owner's key endpoint over HTTP; nothing of the exchange is kept or logged."""

    def __init__(self, settings: KeySettings) -> None:
        self._settings = settings
        self._token = settings.token_value
        if not settings.url or not self._token:
            raise ValueError("the key channel needs QUIPU_KEYS_URL and QUIPU_KEYS_TOKEN (or _TOKEN_FILE)")
        self._client = httpx.AsyncClient(base_url=settings.url, timeout=settings.timeout_s)

    async def data_key(self, whose: SealedFor, *, create: bool) -> bytes | None:
        """Ask the owner; KeyUnavailableError when it does not answer as it should.

        Refused (401), the token is read again: a token file (a mounted Secret) rotated under the
        running service is picked up at once, without a restart.
        """
        request = KeyRequest(tenant_id=whose.tenant_id, principal_id=whose.principal_id, create=create)
        response = await self._ask(request)
        if response.status_code == 401 and self._settings.token_file is not None:
            try:
                token = self._settings.token_value
            except OSError:
                token = ""  # the file is being replaced: the refusal below stands, the caller retries
            if token and token != self._token:
                self._token = token
                response = await self._ask(request)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise KeyUnavailableError(f"the key endpoint answered {response.status_code}")
        try:
            return base64.b64decode(DataKey.model_validate_json(response.content).key, validate=True)
        except (ValueError, binascii.Error) as error:
            raise KeyUnavailableError("the key endpoint's answer is not a key") from error

    async def _ask(self, request: KeyRequest) -> httpx.Response:
        headers = {"content-type": "application/json", "authorization": f"Bearer {self._token}"}
        try:
            return await self._client.post(KEYS_PATH, content=request.model_dump_json(), headers=headers)
        except httpx.HTTPError as error:
            raise KeyUnavailableError(f"the key endpoint did not answer ({type(error).__name__})") from error

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()


class KeyClient:
    """Data keys cached in memory for a short time, one fetch at a time per principal.

    A missing key is never cached: a principal forgotten and then back (a new key) must not read
    as erased for the length of a TTL.
    """

    def __init__(
        self, source: KeySource, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self._ttl_s = ttl_s
        self._clock = clock
        self._cached: dict[SealedFor, tuple[float, bytes]] = {}
        self._fetching: dict[SealedFor, tuple[asyncio.Future[bytes | None], bool]] = {}

    async def key(self, whose: SealedFor, *, create: bool = False, fresh: bool = False) -> bytes | None:
        """The principal's data key (created when `create`); `fresh` skips the cache."""
        cached = self._cached.get(whose)
        if cached is not None and not fresh and self._clock() < cached[0]:
            return cached[1]
        while (pending := self._fetching.get(whose)) is not None:
            # One fetch at a time per principal: a burst of messages costs one round trip.
            future, creating = pending
            key = await asyncio.shield(future)
            if key is not None or creating or not create:
                return key
        fetch = asyncio.ensure_future(self._fetch(whose, create))
        self._fetching[whose] = (fetch, create)
        try:
            return await asyncio.shield(fetch)
        finally:
            if self._fetching.get(whose, (None, False))[0] is fetch:
                del self._fetching[whose]

    async def _fetch(self, whose: SealedFor, create: bool) -> bytes | None:
        key = await self.source.data_key(whose, create=create)
        if key is None:
            self._cached.pop(whose, None)
        else:
            self._cached[whose] = (self._clock() + self._ttl_s, key)
        return key

    def drop(self, whose: SealedFor) -> None:
        """Forget the cached key (this process's owner just shredded it)."""
        self._cached.pop(whose, None)


class OpenedMessage(NamedTuple):
    """A consumed message's plaintext, and the tag of the key it was sealed under (None: plaintext)."""

    body: bytes
    key_tag: bytes | None


class MessageSeals:
    """Seals the messages a service publishes and opens the ones it consumes (quipu.contracts.sealed).

    Without a `KeyClient` nothing is sealed, and a sealed message cannot be opened.

    Words keep their key: what a service seals while it handles a message sealed for the same
    principal (`sealing.sealing_as`) goes under the key that message came under, or nowhere
    (MessageErasedError, settled). A forget shreds that key, so a service still holding the
    person's words when its cache lets go of the key cannot bring them back under a key made
    anew. `keep_source_keys=False` is for the storage owner, whose own writes meet forget's
    marks instead (and whose replies must go out).
    """

    def __init__(self, keys: KeyClient | None, *, keep_source_keys: bool = True) -> None:
        self.keys = keys
        self._keep_source_keys = keep_source_keys

    @property
    def sealing(self) -> bool:
        """Whether this service has a key channel (and so seals what names a principal)."""
        return self.keys is not None

    async def close(self) -> None:
        """Close the key channel's client, when it has one."""
        close = getattr(self.keys.source if self.keys else None, "close", None)
        if close is not None:
            await close()

    async def encode(self, message: BaseModel) -> bytes:
        """The wire form of `message`: its words sealed when it names `sealed_for`, else plain JSON."""
        fields: frozenset[str] = getattr(type(message), "sealed_field_names", frozenset)()
        if not fields or self.keys is None:
            return message.model_dump_json().encode()
        # A message that names no one is sealed for the principal the service is working for.
        whose: SealedFor | None = getattr(message, SEALED_FOR_FIELD, None) or current_sealing_for()
        if whose is None or not whose.principal_id:
            return message.model_dump_json().encode()
        key = await self._sealing_key(whose)
        # Each part serialized by pydantic once; only the small clear part is handled as a dict.
        clear = json.loads(message.model_dump_json(exclude=set(fields)))
        clear[SEALED_FOR_FIELD] = whose.model_dump()
        return sealing.seal_message(key, clear, message.model_dump_json(include=set(fields)).encode())

    async def _sealing_key(self, whose: SealedFor) -> bytes:
        assert self.keys is not None
        key = await self.keys.key(whose, create=True)
        assert key is not None  # created when missing
        source = sealing.source_key_tag(whose) if self._keep_source_keys else None
        if source is None or sealing.key_tag(key) == source:
            return key
        # The cache may hold a key older than the message's: ask once more before refusing.
        key = await self.keys.key(whose, create=True, fresh=True)
        assert key is not None
        if sealing.key_tag(key) != source:
            raise MessageErasedError("words of a principal forgotten since they were sealed")
        return key

    async def open(self, body: bytes) -> bytes:
        """The plaintext JSON of a consumed message (a plaintext one is returned as it is).

        MessageErasedError: sealed under a key that is gone. UnsealableMessageError: altered, or
        this service has no key channel. KeyUnavailableError: the channel is away (retry).
        """
        return (await self.opened(body)).body

    async def opened(self, body: bytes) -> OpenedMessage:
        """`open`, also naming the key the message was sealed under (`sealing.sealing_as`)."""
        try:
            parts = sealing.sealed_parts(body)
        except sealing.SealError as error:
            raise UnsealableMessageError(str(error)) from error
        if parts is None:
            return OpenedMessage(body, None)
        clear, sealed = parts
        if self.keys is None:
            raise UnsealableMessageError("a sealed message, and no key channel configured (QUIPU_KEYS_URL)")
        whose = _whose(clear)
        key = await self.keys.key(whose)
        for attempt in ("cached", "fresh"):
            if key is None:
                raise MessageErasedError("sealed under the key of a forgotten principal")
            try:
                return OpenedMessage(sealing.open_message(key, clear, sealed), sealing.key_tag(key))
            except sealing.OtherKeyError:
                if attempt == "fresh":
                    raise MessageErasedError("sealed under a key the principal no longer has") from None
                # The cache may hold a key shredded since (and a new one made): ask once more.
                key = await self.keys.key(whose, fresh=True)
            except sealing.SealError as error:
                raise UnsealableMessageError(str(error)) from error
        raise AssertionError("unreachable")


def _whose(clear: dict[str, Any]) -> SealedFor:
    try:
        whose = SealedFor.model_validate(clear.get(SEALED_FOR_FIELD))
    except ValueError as error:
        raise UnsealableMessageError("a sealed message without a valid sealed_for") from error
    if not whose.principal_id:
        raise UnsealableMessageError("a sealed message sealed for no one")
    return whose


def message_seals(settings: KeySettings) -> MessageSeals:
    """The seals of a service configured by `settings`: over HTTP when a URL is set, else none."""
    if not settings.url or not settings.token_value:
        return MessageSeals(None)
    return MessageSeals(KeyClient(HttpKeySource(settings), ttl_s=settings.cache_ttl_s))
