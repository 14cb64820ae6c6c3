"""Helpers for the storage-owner tests: an owner process, raw topic readers, raw command bytes.

The owner tests talk to a real `python -m services.storage_owner` process on the embedded stack.
They watch the topics the owner writes (`storage.replies`, `runs.events`, `storage.commands.dlq`)
with raw aiokafka consumers outside any consumer group (no join, every partition, from the
beginning), so what they see is what any consumer would see on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from pymongo import AsyncMongoClient

from contracts.commands import StoreOperation
from contracts.errors import ErrorCode, StoreError
from deploy.local.services import ServiceProcess
from deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from services.kit.store.client import REPLY_TO_HEADER, KafkaStore
from services.storage_owner.adapters import client_options

OWNER_MODULE = "services.storage_owner"

Document = dict[str, Any]


# --- the owner process ------------------------------------------------------------------------


class Owner:
    """A storage-owner process for one topic prefix and database; start, kill and stop are async.

    `ServiceProcess` waits for its child synchronously; here the waits run in a worker thread so
    the event loop (and the blocking guard of tests/conftest.py) is never held.
    """

    def __init__(
        self,
        stack: EmbeddedStack,
        prefix: str,
        database: str,
        log_path: Path | None,
        *,
        mongo_app_name: str = "",
    ) -> None:
        """`mongo_app_name` names the owner's MongoDB client (failpoints can target it alone)."""
        self.environment = {
            **stack.environment(),
            "QUIPU_KAFKA_TOPIC_PREFIX": prefix,
            "QUIPU_MONGO_DATABASE": database,
        }
        if mongo_app_name:
            separator = "&" if "?" in stack.mongo_uri else "?"
            self.environment["QUIPU_MONGO_URI"] = f"{stack.mongo_uri}{separator}appName={mongo_app_name}"
        self.log_path = log_path
        self.process: ServiceProcess | None = None

    def start(self) -> Owner:
        """Spawn a fresh owner process (after a kill, a new process with the same settings)."""
        self.process = ServiceProcess(OWNER_MODULE, self.environment, self.log_path).start()
        return self

    async def kill(self) -> None:
        """SIGKILL the process and wait until it is gone."""
        if self.process is not None:
            await asyncio.to_thread(self.process.kill)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL what is left."""
        if self.process is not None:
            await asyncio.to_thread(self.process.stop, 15.0)

    @property
    def pid(self) -> int | None:
        """Process id of the current owner process."""
        if self.process is None or self.process.process is None:
            return None
        return self.process.process.pid

    @property
    def running(self) -> bool:
        """Whether the current process is alive."""
        return self.process is not None and self.process.running

    def log_tail(self, size: int = 4000) -> str:
        """The end of the owner's log, for failure messages."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_bytes()[-size:].decode(errors="replace")


async def wait_until_serving(store: KafkaStore, owner: Owner, within: float = 30.0) -> None:
    """Wait until the owner answers a read (its consumer group is joined and it is applying)."""
    deadline = time.monotonic() + within
    while True:
        try:
            await store.load_session_status("owner-readiness-probe")
        except StoreError as error:
            if error.code is ErrorCode.SESSION_NOT_FOUND:
                return
            if not owner.running:
                raise AssertionError(f"the owner exited:\n{owner.log_tail()}") from error
            if time.monotonic() > deadline:
                raise AssertionError(f"the owner did not answer:\n{owner.log_tail()}") from error


# --- topics -----------------------------------------------------------------------------------


async def create_topic(bootstrap: str, name: str, partitions: int = 8) -> None:
    """Create one extra topic (a test's own reply topic); the prefix fixture deletes it later."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


class TopicReader:
    """Reads every partition of one topic from the beginning, outside any consumer group."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.records: list[ConsumerRecord[bytes, bytes]] = []
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=10,
        )
        self._arrived = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> TopicReader:
        """Assign every partition, positioned at the beginning, and read in the background."""
        await self._consumer.start()
        partitions: set[int] | None = None
        for _ in range(100):
            partitions = self._consumer.partitions_for_topic(self.topic)
            if partitions:
                break
            await self._consumer._client.force_metadata_update()
            await asyncio.sleep(0.05)
        assert partitions, f"topic {self.topic} does not exist"
        assigned = [TopicPartition(self.topic, number) for number in sorted(partitions)]
        self._consumer.assign(assigned)
        await self._consumer.seek_to_beginning(*assigned)
        self._task = asyncio.create_task(self._read(), name=f"read {self.topic}")
        return self

    async def stop(self) -> None:
        """Stop reading and close the consumer."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._consumer.stop()

    async def __aenter__(self) -> TopicReader:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def _read(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            fresh = [record for records in batches.values() for record in records]
            if fresh:
                async with self._arrived:
                    self.records.extend(fresh)
                    self._arrived.notify_all()

    async def wait_for(
        self, condition: Callable[[list[ConsumerRecord[bytes, bytes]]], bool], within: float = 20.0
    ) -> list[ConsumerRecord[bytes, bytes]]:
        """Wait until `condition(records read so far)` holds; return the records."""
        async with self._arrived:
            try:
                await asyncio.wait_for(self._arrived.wait_for(lambda: condition(self.records)), within)
            except TimeoutError:
                raise AssertionError(
                    f"{self.topic}: condition not met within {within} s ({len(self.records)} records read)"
                ) from None
        return list(self.records)

    def values(self) -> list[Any]:
        """Every record's value decoded as JSON (skipping values that are not JSON)."""
        decoded = []
        for record in self.records:
            try:
                decoded.append(json.loads(record.value or b""))
            except ValueError:
                continue
        return decoded


class ReplyReader(TopicReader):
    """A `TopicReader` of a reply topic that groups the raw replies by correlation id."""

    def replies(self) -> dict[str, list[dict[str, Any]]]:
        """Correlation id -> every reply received for it, in arrival order (parsed JSON)."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        for value in self.values():
            if isinstance(value, dict) and isinstance(value.get("correlation_id"), str):
                grouped.setdefault(value["correlation_id"], []).append(value)
        return grouped

    async def wait_for_replies(self, correlation_ids: Iterable[str], within: float = 20.0) -> None:
        """Wait until every correlation id has at least one reply."""
        wanted = set(correlation_ids)

        def answered(_: object) -> bool:
            return wanted <= set(self.replies())

        try:
            await self.wait_for(answered, within)
        except AssertionError:
            missing = sorted(wanted - set(self.replies()))
            raise AssertionError(f"{len(missing)} commands unanswered, e.g. {missing[:5]}") from None


# --- raw commands -----------------------------------------------------------------------------


class RawPublisher:
    """A plain producer (acks=all, no idempotence: Tansu) for bytes exactly as given."""

    def __init__(self, bootstrap: str) -> None:
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)

    async def __aenter__(self) -> RawPublisher:
        await self._producer.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._producer.stop()

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes | None] | None = None,
    ) -> tuple[int, int]:
        """Publish and wait for the broker; return (partition, offset)."""
        metadata = await self._producer.send_and_wait(
            topic, value, key=key, headers=list((headers or {}).items())
        )
        return metadata.partition, metadata.offset

    async def send_command(
        self, topic: str, command: StoreOperation | bytes, reply_to: str, key: str = ""
    ) -> tuple[int, int]:
        """Publish a command (a model, or raw bytes) with the reply header, as KafkaStore does."""
        if isinstance(command, StoreOperation):
            key = key or command.partition_key()
            command = command.model_dump_json().encode()
        return await self.send(
            topic, command, key=key.encode() or None, headers={REPLY_TO_HEADER: reply_to.encode()}
        )


# --- the owner's database ---------------------------------------------------------------------


def mongo_client(stack: EmbeddedStack) -> AsyncMongoClient[Document]:
    """A client on the stack's database server, with the options the owner uses."""
    return AsyncMongoClient(stack.mongo_uri, **client_options(stack.mongo_uri, 5_000))


async def database_dump(client: AsyncMongoClient[Document], database: str) -> dict[str, list[Document]]:
    """Every document of every collection of `database`, sorted by `_id`."""
    db = client[database]
    dump: dict[str, list[Document]] = {}
    for name in sorted(await db.list_collection_names()):
        dump[name] = [document async for document in db[name].find({}).sort("_id", 1)]
    return dump


# --- a served prefix --------------------------------------------------------------------------


class Served:
    """An owner process serving one topic prefix and database, and a store client talking to it."""

    def __init__(self, stack: EmbeddedStack, prefix: str, database: str, log_path: Path | None) -> None:
        self.stack = stack
        self.prefix = prefix
        self.database = database
        self.settings = stack.kafka_settings(topic_prefix=prefix)
        self.owner = Owner(stack, prefix, database, log_path)
        self.store = KafkaStore(self.settings, reply_timeout_s=10.0)

    def topic(self, name: str) -> str:
        """The physical name of a registry topic under this prefix."""
        return self.prefix + name

    async def __aenter__(self) -> Served:
        await create_topics(self.stack.bootstrap, self.prefix)
        self.owner.start()
        try:
            await self.store.start()
            await wait_until_serving(self.store, self.owner)
        except BaseException:
            await self.owner.stop()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        try:
            await self.store.stop()
        finally:
            await self.owner.stop()
            with contextlib.suppress(Exception):
                await delete_topics(self.stack.bootstrap, self.prefix)
