"""The storage owner as a FastStream application: the only writer to MongoDB."""

from __future__ import annotations

from faststream import FastStream

from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.store.protocol import Store
from quipu.services.kit.broker import broker_delivery, make_broker
from quipu.services.kit.keys import KeyClient, KeySettings, MessageSeals
from quipu.services.kit.settings import KafkaSettings, MongoSettings
from quipu.services.storage_owner import handlers
from quipu.services.storage_owner.key_endpoint import KeyEndpoint
from quipu.services.storage_owner.keys import parse_master_key
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.settings import OwnerSettings

SERVICE = "storage-owner"


def _master_key(owner: OwnerSettings) -> bytes | None:
    return parse_master_key(owner.master_key.get_secret_value()) if owner.master_key else None


async def _open_mongo_store(mongo: MongoSettings, owner: OwnerSettings) -> Store:
    secret = owner.cursor_secret.get_secret_value().encode() if owner.cursor_secret else None
    return await MongoStore.connect(
        mongo.uri.get_secret_value(), mongo.database, cursor_secret=secret, master_key=_master_key(owner)
    )


async def _open_mongo_memory(mongo: MongoSettings, owner: OwnerSettings, store: Store | None) -> MemoryStore:
    """The memory store on the runtime store's client when it has one, else on a client of its own."""
    master_key = _master_key(owner)
    if isinstance(store, MongoStore):
        return await MongoMemoryStore.open(store.client, mongo.database, master_key=master_key)
    return await MongoMemoryStore.connect(mongo.uri.get_secret_value(), mongo.database, master_key=master_key)


def create_app(
    kafka: KafkaSettings,
    mongo: MongoSettings | None = None,
    owner: OwnerSettings | None = None,
    store: Store | None = None,
    memory: MemoryStore | None = None,
    keys: KeySettings | None = None,
) -> FastStream:
    """The owner application; pass `store` (and `memory`) to serve other backends.

    Without `memory`, the memory store is MongoDB's when `mongo` is given, else in memory. With a
    key token (`keys`, QUIPU_KEYS_TOKEN) the owner seals what it publishes and, on
    `owner.keys_port`, serves the key endpoint; its own keys never leave its process otherwise.
    """
    owner = owner or OwnerSettings()
    keys = keys or KeySettings()
    broker = make_broker(kafka, client_id=SERVICE)

    deps = handlers.OwnerDeps(store=store, memory=memory)
    seals = MessageSeals(KeyClient(deps, ttl_s=keys.cache_ttl_s) if keys.token else None)
    delivery = broker_delivery(broker, kafka, attempts=owner.retry_attempts, opener=seals)
    consumer = handlers.register(broker, kafka, deps, delivery, owner, seals)
    endpoint: list[KeyEndpoint] = []

    opened: list[object] = []

    async def open_store() -> None:
        # Hooks, not a lifespan: `app.start()` (in-process use) runs hooks, only `app.run()` lifespans.
        if deps.store is None:
            if mongo is None:
                raise ValueError("the storage owner needs MongoSettings or a store")
            deps.store = await _open_mongo_store(mongo, owner)
            opened.append(deps.store)
        if deps.memory is None:
            if mongo is None:
                deps.memory = InMemoryMemoryStore()
            else:
                deps.memory = await _open_mongo_memory(mongo, owner, deps.store)
                opened.insert(0, deps.memory)  # closed before the client it may share
        if keys.token is not None and owner.keys_port is not None:
            served = KeyEndpoint(deps, keys.token.get_secret_value(), owner.keys_host, owner.keys_port)
            await served.start()
            endpoint.append(served)

    async def drain() -> None:
        # Before the broker stops: commands in flight can still reply and commit.
        await consumer.drain(owner.drain_grace_s)

    async def close_store() -> None:
        for served in endpoint:
            await served.stop()
        endpoint.clear()
        for store_opened in opened:
            close = getattr(store_opened, "close", None)
            if close is not None:
                await close()
        opened.clear()
        deps.store = store
        deps.memory = memory

    return FastStream(broker, on_startup=[open_store], on_shutdown=[drain], after_shutdown=[close_store])
