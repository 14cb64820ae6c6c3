"""Store throughput three ways, in one run on the same database server:

- raw: a MongoDB transaction inserting two documents (the floor any lifecycle write pays);
- direct: lifecycle commands through `MongoStore`;
- kafka: the same commands through the Kafka client, the storage owner and `MongoStore`.

Each path runs the same number of commands one at a time (latency-bound, what one planner sees),
and the Kafka path once more with concurrent sessions (what the owner sustains).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

from pymongo import AsyncMongoClient

from bench.workload import OPS_PER_RUN, one_run
from quipu.deploy.local.stack import EmbeddedStack, create_topics
from quipu.services.domain.store.protocol import Store
from quipu.services.kit.settings import MongoSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.storage_owner.app import create_app
from quipu.services.storage_owner.mongo_store import MongoStore

RUNS = 60
RAW_TRANSACTIONS = 300
CONCURRENT_SESSIONS = 16


async def _rate(count: int, action: Callable[[], Awaitable[None]]) -> float:
    started = time.perf_counter()
    for _ in range(count):
        await action()
    return count / (time.perf_counter() - started)


async def _raw_transactions_per_s(uri: str) -> float:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(uri)
    collection = client[f"bench_raw_{uuid.uuid4().hex[:8]}"]["pairs"]
    await collection.insert_one({"_id": "warm"})

    async def transaction() -> None:
        async with client.start_session() as session, await session.start_transaction():
            await collection.insert_one({"side": "a"}, session=session)
            await collection.insert_one({"side": "b"}, session=session)

    try:
        return await _rate(RAW_TRANSACTIONS, transaction)
    finally:
        await client.drop_database(collection.database.name)
        await client.close()


async def _store_ops_per_s(store: Store) -> float:
    await one_run(store)
    runs_per_s = await _rate(RUNS, lambda: one_run(store))
    return runs_per_s * OPS_PER_RUN


async def _concurrent_ops_per_s(store: Store) -> float:
    started = time.perf_counter()
    per_session = max(1, RUNS // CONCURRENT_SESSIONS)

    async def session() -> None:
        for _ in range(per_session):
            await one_run(store)

    await asyncio.gather(*(session() for _ in range(CONCURRENT_SESSIONS)))
    return per_session * CONCURRENT_SESSIONS * OPS_PER_RUN / (time.perf_counter() - started)


async def measure_store() -> dict[str, float]:
    """The store figures of `bench/results/latest.json`."""
    with EmbeddedStack() as stack:
        raw = await _raw_transactions_per_s(stack.mongo_uri)
        direct_store = await MongoStore.connect(stack.mongo_uri, f"bench_direct_{uuid.uuid4().hex[:8]}")
        try:
            direct = await _store_ops_per_s(direct_store)
        finally:
            await direct_store.close()
        prefix = f"bench{uuid.uuid4().hex[:6]}."
        kafka_settings = stack.kafka_settings(topic_prefix=prefix)
        await create_topics(stack.bootstrap, prefix)
        owner = create_app(
            kafka_settings,
            MongoSettings(uri=stack.mongo_uri, database=f"bench_owner_{uuid.uuid4().hex[:8]}"),
        )
        await owner.start()
        try:
            async with KafkaStore(kafka_settings) as client:
                via_kafka = await _store_ops_per_s(client)
                via_kafka_concurrent = await _concurrent_ops_per_s(client)
        finally:
            await owner.stop()
    return {
        "raw_txn_ops_per_s": raw,
        "store_direct_ops_per_s": direct,
        "store_kafka_ops_per_s": via_kafka,
        "store_kafka_concurrent_ops_per_s": via_kafka_concurrent,
        "store_direct_vs_raw_ratio": direct / raw,
        "store_kafka_vs_raw_ratio": via_kafka / raw,
    }
