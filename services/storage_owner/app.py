"""The storage owner as a FastStream application: the only writer to MongoDB."""

from __future__ import annotations

from faststream import FastStream
from faststream.kafka import KafkaBroker

from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.store.protocol import Store
from quipu.services.kit.keys import KeyClient, MessageSeals
from quipu.services.kit.lifecycle import Opened, Running, ServiceDefinition, service_app
from quipu.services.kit.settings import KafkaSettings, KeySettings, MongoSettings
from quipu.services.storage_owner import handlers
from quipu.services.storage_owner.key_endpoint import KeyEndpoint
from quipu.services.storage_owner.keys import parse_master_key
from quipu.services.storage_owner.mongo import TransactionPolicy
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.settings import OwnerSettings

SERVICE = "storage-owner"


def _master_key(owner: OwnerSettings) -> bytes | None:
    return parse_master_key(owner.master_key.get_secret_value()) if owner.master_key else None


def _policy(owner: OwnerSettings) -> TransactionPolicy:
    return TransactionPolicy(group_max=owner.group_commit_max, document_hints=owner.document_hints)


async def _open_mongo_store(mongo: MongoSettings, owner: OwnerSettings) -> MongoStore:
    secret = owner.cursor_secret.get_secret_value().encode() if owner.cursor_secret else None
    return await MongoStore.connect(
        mongo.uri.get_secret_value(),
        mongo.database,
        cursor_secret=secret,
        master_key=_master_key(owner),
        policy=_policy(owner),
    )


async def _open_mongo_memory(
    mongo: MongoSettings, owner: OwnerSettings, store: Store | None
) -> MongoMemoryStore:
    """The memory store on the runtime store's client when it has one, else on a client of its own."""
    master_key, policy = _master_key(owner), _policy(owner)
    keep = owner.forget_turn_marks_keep
    if isinstance(store, MongoStore):
        return await MongoMemoryStore.open(
            store.client, mongo.database, master_key=master_key, policy=policy, turn_marks_keep=keep
        )
    return await MongoMemoryStore.connect(
        mongo.uri.get_secret_value(),
        mongo.database,
        master_key=master_key,
        policy=policy,
        turn_marks_keep=keep,
    )


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
    keys = keys or owner.keys
    stores: Running[handlers.OwnerStores] = Running("storage owner")
    # The seals are built before the stores open: they reach the keyring through what is open.
    keyring = handlers.OwnerKeyring(lambda: stores.get().memory)
    seals = MessageSeals(
        KeyClient(keyring, ttl_s=keys.cache_ttl_s) if keys.token_value else None, keep_source_keys=False
    )

    async def open_stores(_: KafkaBroker, opened: Opened) -> handlers.OwnerStores:
        runtime = store
        if runtime is None:
            if mongo is None:
                raise ValueError("the storage owner needs MongoSettings or a store")
            runtime = await _open_mongo_store(mongo, owner)
            opened.on_close(runtime.close)
        if memory is not None:
            serving = handlers.OwnerStores(runtime, memory)
        elif mongo is None:
            in_memory = InMemoryMemoryStore(turn_marks_keep=owner.forget_turn_marks_keep)
            serving = handlers.OwnerStores(runtime, in_memory)
        else:
            # Opened after the runtime store, so closed before the client it may share.
            mongo_memory = await _open_mongo_memory(mongo, owner, runtime)
            opened.on_close(mongo_memory.close)
            serving = handlers.OwnerStores(runtime, mongo_memory)
        if keys.token_value and owner.keys_port is not None:
            # Opened last, so closed first: it never serves from a closed store.
            endpoint = KeyEndpoint(
                handlers.OwnerKeyring(lambda: serving.memory),
                [keys.token_value, owner.previous_keys_token],
                owner.keys_host,
                owner.keys_port,
            )
            await opened.start(endpoint)
        return serving

    return service_app(
        kafka,
        owner,
        name=SERVICE,
        attempts=owner.retry_attempts,
        seals=seals,
        running=stores,
        open=open_stores,
        subscribe=lambda broker, delivery, running: [
            handlers.register(broker, kafka, running, delivery, owner, seals)
        ],
    )


DEFINITION = ServiceDefinition(
    SERVICE,
    OwnerSettings,
    lambda connections, owner: create_app(connections.kafka, connections.mongo, owner),
    reaches_mongo=True,
)
