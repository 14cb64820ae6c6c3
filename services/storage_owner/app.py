"""The storage owner as a FastStream application: the only writer to MongoDB."""

from __future__ import annotations

from faststream import FastStream

from services.kit.broker import make_broker
from services.kit.delivery import Delivery, RetryPolicy
from services.kit.settings import KafkaSettings, MongoSettings
from services.kit.store.protocol import Store
from services.storage_owner import handlers
from services.storage_owner.adapters import MongoStore
from services.storage_owner.settings import OwnerSettings

SERVICE = "storage-owner"


async def _open_mongo_store(mongo: MongoSettings, owner: OwnerSettings) -> Store:
    secret = owner.cursor_secret.get_secret_value().encode() if owner.cursor_secret else None
    return await MongoStore.connect(mongo.uri.get_secret_value(), mongo.database, cursor_secret=secret)


def create_app(
    kafka: KafkaSettings,
    mongo: MongoSettings | None = None,
    owner: OwnerSettings | None = None,
    store: Store | None = None,
) -> FastStream:
    """The owner application; pass `store` to serve another backend (tests use the in-memory one)."""
    owner = owner or OwnerSettings()
    broker = make_broker(kafka, client_id=SERVICE)

    async def dead_letter(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        await broker.publish(body, topic=topic, key=key, headers=headers)

    delivery = Delivery(dead_letter, RetryPolicy(attempts=owner.retry_attempts))

    deps = handlers.OwnerDeps(store=store)
    handlers.register(
        broker, kafka, deps, delivery, group=owner.group, partition_workers=owner.partition_workers
    )

    opened: list[Store] = []

    async def open_store() -> None:
        # Hooks, not a lifespan: `app.start()` (in-process use) runs hooks, only `app.run()` lifespans.
        if deps.store is None:
            if mongo is None:
                raise ValueError("the storage owner needs MongoSettings or a store")
            deps.store = await _open_mongo_store(mongo, owner)
            opened.append(deps.store)

    async def close_store() -> None:
        for store_opened in opened:
            close = getattr(store_opened, "close", None)
            if close is not None:
                await close()
        opened.clear()
        deps.store = store

    return FastStream(broker, on_startup=[open_store], after_shutdown=[close_store])
