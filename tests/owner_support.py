"""Helpers for the storage-owner tests: an owner process, raw topic readers, raw command bytes.

The owner tests talk to a real `python -m quipu.services.storage_owner` process on the embedded stack.
They watch the topics the owner writes (`storage.replies`, `runs.events`, `storage.commands.dlq`)
with raw aiokafka consumers outside any consumer group (no join, every partition, from the
beginning), so what they see is what any consumer would see on the wire.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import bson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from pydantic import BaseModel
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from quipu.contracts.commands import (
    REPLY_PARTITION_HEADER,
    REPLY_TO_HEADER,
    AppendRunRecord,
    CreateSession,
    RecordRunTerminal,
    StartRootRun,
    StoreOperation,
)
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.store import Record, RunStart
from quipu.contracts.topics import topic_names
from quipu.deploy.local.services import ServiceProcess
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.kit.delivery import MessageErasedError, PermanentError
from quipu.services.kit.keys import message_seals
from quipu.services.kit.settings import KeySettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.kit.topic_replay import at_the_end
from quipu.services.storage_owner.mongo import TransactionPolicy, client_options
from quipu.services.storage_owner.mongo_store import MongoStore
from tests.conformance.builders import (
    all_run_records,
    all_session_records,
    ms,
    ordinary,
    root_start,
    terminal,
)
from tests.timing import eventually, scaled

OWNER_MODULE = "quipu.services.storage_owner"

Document = dict[str, Any]
ModelT = TypeVar("ModelT", bound=BaseModel)


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
    deadline = time.monotonic() + scaled(within)
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


class TopicReader:
    """Reads every partition of one topic (or the `only` ones) from the beginning, outside any group."""

    def __init__(self, bootstrap: str, topic: str, *, only: Iterable[int] | None = None) -> None:
        self.topic = topic
        self._only = None if only is None else set(only)
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
        self.partitions: list[int] = []
        self._parsed_as: dict[type[BaseModel], list[Any]] = {}

    async def start(self) -> Self:
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
        self.partitions = sorted(partitions if self._only is None else partitions & self._only)
        assigned = [TopicPartition(self.topic, number) for number in self.partitions]
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

    async def __aenter__(self) -> Self:
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
                holds = self._arrived.wait_for(lambda: condition(self.records))
                await asyncio.wait_for(holds, scaled(within))
            except TimeoutError:
                waited = f"{scaled(within):.1f} s ({len(self.records)} records read)"
                raise AssertionError(f"{self.topic}: condition not met within {waited}") from None
        return list(self.records)

    def parsed(self, model: type[ModelT]) -> list[ModelT]:
        """Every record's value as `model`, in the order read (each record is validated once)."""
        parsed = self._parsed_as.setdefault(model, [])
        fresh = self.records[len(parsed) :]
        parsed.extend(model.model_validate_json(record.value or b"") for record in fresh)
        return list(parsed)

    def values(self) -> list[Any]:
        """Every record's value decoded as JSON (skipping values that are not JSON)."""
        decoded = []
        for record in self.records:
            try:
                decoded.append(json.loads(record.value or b""))
            except (ValueError, RecursionError):
                continue
        return decoded


async def wait_while_progressing(
    reader: TopicReader, done: Callable[[], bool], progress: Callable[[], int], *, stall_s: float
) -> None:
    """Wait until `done()`, failing only when `progress()` stops growing for `stall_s` seconds.

    A crash test asks "does the restarted owner catch up?", not "how fast is this machine?": on a
    loaded machine catching up takes longer, but a stalled partition makes no progress at all.
    """
    while not done():
        seen = progress()

        def moved(_: object, since: int = seen) -> bool:
            return done() or progress() > since

        try:
            await reader.wait_for(moved, within=stall_s)
        except AssertionError:
            raise AssertionError(f"no progress for {stall_s} s (stuck at {seen})") from None


class ReplyReader(TopicReader):
    """A `TopicReader` of a reply topic that groups the raw replies by correlation id."""

    def __init__(self, bootstrap: str, topic: str, *, only: Iterable[int] | None = None) -> None:
        super().__init__(bootstrap, topic, only=only)
        self._grouped: dict[str, list[dict[str, Any]]] = {}
        self._parsed = 0

    def replies(self) -> dict[str, list[dict[str, Any]]]:
        """Correlation id -> every reply received for it, in arrival order (parsed JSON).

        Each record is parsed once: waits re-evaluate this on every arrival, and a crash test
        reads hundreds of replies. The mapping is the reader's own: read it, do not change it.
        """
        for record in self.records[self._parsed :]:
            try:
                value = json.loads(record.value or b"")
            except (ValueError, RecursionError):
                continue
            if isinstance(value, dict) and isinstance(value.get("correlation_id"), str):
                self._grouped.setdefault(value["correlation_id"], []).append(value)
        self._parsed = len(self.records)
        return self._grouped

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
        partition: int | None = None,
    ) -> tuple[int, int]:
        """Publish and wait for the broker; return (partition, offset)."""
        metadata = await self._producer.send_and_wait(
            topic, value, key=key, headers=list((headers or {}).items()), partition=partition
        )
        return metadata.partition, metadata.offset

    async def send_command(
        self,
        topic: str,
        command: StoreOperation | bytes,
        reply_to: str,
        key: str = "",
        *,
        reply_partition: int | None = None,
    ) -> tuple[int, int]:
        """Publish a command (a model, or raw bytes) with a reply route.

        `reply_to` goes in the header older clients send (`quipu-reply-to`, which the owner only
        accepts naming its own replies topic); `reply_partition` adds the partition route
        KafkaStore sends (`quipu-reply-partition`).
        """
        if isinstance(command, StoreOperation):
            key = key or command.partition_key()
            command = command.model_dump_json().encode()
        headers = {REPLY_TO_HEADER: reply_to.encode()}
        if reply_partition is not None:
            headers[REPLY_PARTITION_HEADER] = str(reply_partition).encode()
        return await self.send(topic, command, key=key.encode() or None, headers=headers)


# --- the owner's database ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def owner_copy(
    uri: str, database: str, policy: TransactionPolicy | None = None
) -> AsyncIterator[MongoStore]:
    """A MongoStore of its own client on `database`, as one owner copy opens it (its hints its own)."""
    store = await MongoStore.connect(uri, database, policy=policy)
    try:
        yield store
    finally:
        await store.close()


def client_on(uri: str, **options: Any) -> AsyncMongoClient[Document]:
    """A client on `uri` with the options the owner uses, plus `options` (listeners, app name)."""
    return AsyncMongoClient(uri, **client_options(uri, 5_000), **options)


async def resting_bytes(database: AsyncDatabase[Document]) -> bytes:
    """Every document of every collection of `database`, as raw BSON, concatenated (what rests)."""
    dump = b""
    for name in sorted(await database.list_collection_names()):
        async for document in database[name].find({}):
            dump += bson.encode(document)
    return dump


def mongo_client(stack: EmbeddedStack, **options: Any) -> AsyncMongoClient[Document]:
    """A client on the stack's database server, with the options the owner uses."""
    return client_on(stack.mongo_uri, **options)


class CommandLog(monitoring.CommandListener):
    """Every command a client sent, for explaining the store's queries afterwards."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, Document]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands.append((event.command_name, dict(event.command)))

    def finds_of(self, collection: str) -> list[Document]:
        """The `find` commands sent to `collection`."""
        return [
            command for name, command in self.commands if name == "find" and command["find"] == collection
        ]

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def database_answering(uri: str, *, within: float = 30.0) -> None:
    """Wait until the database server on `uri` answers a ping (a server that is starting)."""

    async def answers() -> bool:
        client: AsyncMongoClient[Document] = AsyncMongoClient(uri, serverSelectionTimeoutMS=500)
        try:
            await client.admin.command("ping")
            return True
        except PyMongoError:
            return False
        finally:
            await client.close()

    await eventually(answers, within=within, what="the database server answering", interval=0.1)


def as_finds(name: str, command: Document) -> list[Document]:
    """The reads a logged command makes, as find commands to explain.

    SecantusDB explains every write as COLLSCAN, and a find on `_id` plus another field too,
    although both take the same time at 100 and 3,000 documents (they use `_id`): writes are
    explained as finds, and an `_id` equality as the `_id` lookup it is.
    """
    finds: list[Document]
    if name == "find":
        finds = [{key: command[key] for key in ("find", "filter", "sort", "limit") if key in command}]
    elif name == "delete":
        finds = [{"find": command["delete"], "filter": item["q"]} for item in command["deletes"]]
    elif name == "update":
        finds = [{"find": command["update"], "filter": item["q"]} for item in command["updates"]]
    elif name == "findAndModify":
        finds = [{"find": command["findAndModify"], "filter": command["query"]}]
    else:
        return []
    for find in finds:
        if isinstance(find.get("filter", {}).get("_id"), str):
            find["filter"] = {"_id": find["filter"]["_id"]}
    return finds


def plan_stages(plan: Any) -> list[str]:
    """Every stage name in an explain plan tree."""
    if isinstance(plan, dict):
        found = [plan["stage"]] if "stage" in plan else []
        for value in plan.values():
            found += plan_stages(value)
        return found
    if isinstance(plan, list):
        return [stage for item in plan for stage in plan_stages(item)]
    return []


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
        self.store = KafkaStore(self.settings, reply_timeout_s=scaled(10.0))

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


# --- a workload for crash tests ---------------------------------------------------------------


@dataclass
class SessionPlan:
    """One session's commands, in the order a worker sends them, and the records they must leave."""

    session_id: str
    run: RunStart
    commands: list[StoreOperation] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)


def plan_sessions(prefix: str, sessions: int, appends: int) -> list[SessionPlan]:
    """`sessions` sessions of `appends + 3` writes each: create, start, the appends, terminal."""
    plans = []
    for number in range(sessions):
        session_id = f"{prefix}s{number:02d}"
        start = root_start(session_id, run_id=f"{session_id}-run", started_at=ms(0))
        session = SessionPlan(session_id, start.run)
        steps = [
            ordinary(
                start.run,
                f"step-{step:02d}",
                record_type="tool_start",
                payload=json.dumps({"session": number, "step": step}).encode(),
                timestamp=ms(1 + step),
            )
            for step in range(appends)
        ]
        closing = terminal(start.run, timestamp=ms(100))
        session.commands = [
            CreateSession(session_id=session_id, created_at=ms(0)),
            StartRootRun(run=start.run, started=start.started, stopped=start.stopped),
            *(AppendRunRecord(record=step) for step in steps),
            RecordRunTerminal(record=closing),
        ]
        session.commands = [
            command.model_copy(update={"correlation_id": f"{session_id}-c{index:02d}"})
            for index, command in enumerate(session.commands)
        ]
        session.records = [start.started, *steps, closing]
        plans.append(session)
    return plans


def answered(replies: ReplyReader, ids: list[str]) -> int:
    """How many of `ids` have an answer so far."""
    received = replies.replies()
    return sum(1 for cid in ids if cid in received)


def assert_every_answer_succeeded_and_agrees(
    stream: list[StoreOperation], answers: dict[str, list[dict[str, Any]]]
) -> None:
    """No command failed; every answer to one command names the same records; one insert at most."""
    problems = []
    for command in stream:
        replies = answers[command.correlation_id]
        errors = [reply["error"] for reply in replies if reply["error"] is not None]
        if errors:
            problems.append(f"{command.correlation_id} {command.op}: {errors}")
            continue
        if isinstance(command, CreateSession):
            if len({json.dumps(reply["result"], sort_keys=True) for reply in replies}) != 1:
                problems.append(f"{command.correlation_id}: different sessions {replies}")
            continue
        appends = [
            reply["result"]["started"] if isinstance(command, StartRootRun) else reply["result"]
            for reply in replies
        ]
        if len({append["record_id"] for append in appends}) != 1:
            problems.append(f"{command.correlation_id}: different record ids {appends}")
        if sum(append["inserted"] for append in appends) > 1:
            problems.append(f"{command.correlation_id}: inserted more than once {appends}")
    assert not problems, f"{len(problems)} commands misapplied:\n" + "\n".join(problems[:20])


async def assert_sessions_hold_exactly_their_records(store: KafkaStore, plans: list[SessionPlan]) -> None:
    """Each run: exactly its records, gapless ids 1..n in order, content as sent, closed."""
    problems = []
    for session in plans:
        records = await all_run_records(store, session.run.run_id)
        expected_ids = [str(number) for number in range(1, len(session.records) + 1)]
        if [record.id for record in records] != expected_ids:
            problems.append(f"{session.run.run_id}: ids {[record.id for record in records]}")
        if [record.event_key for record in records] != [record.event_key for record in session.records]:
            problems.append(f"{session.run.run_id}: keys {[record.event_key for record in records]}")
        elif not all(
            stored.same_content(sent) for stored, sent in zip(records, session.records, strict=True)
        ):
            problems.append(f"{session.run.run_id}: a record differs from the one sent")
        listed = await all_session_records(store, session.session_id)
        if [record.event_key for record in listed] != [record.event_key for record in session.records]:
            problems.append(
                f"{session.session_id}: session listing {[record.event_key for record in listed]}"
            )
        if (await store.load_run(session.run.run_id)).status.value != "completed":
            problems.append(f"{session.run.run_id}: not completed")
    assert not problems, f"{len(problems)} sessions wrong:\n" + "\n".join(problems)


def free_port() -> int:
    """A loopback port nobody listens on right now (for a server a test starts next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# --- everything on the wire -------------------------------------------------------------------


async def every_record_on_topics(
    bootstrap: str, prefix: str, within: float = 30.0
) -> dict[str, list[ConsumerRecord[bytes, bytes]]]:
    """Every record of every topic of `prefix` (dead-letter topics too), read from the beginning to
    the end each partition's last fetch reported, outside any consumer group."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=10
    )
    await consumer.start()
    found: dict[str, list[ConsumerRecord[bytes, bytes]]] = {name: [] for name in topic_names(prefix)}
    try:
        await asyncio.sleep(0)  # see RunEventReader.start: let the group-less coordinator start
        partitions: list[TopicPartition] = []
        for name in found:
            numbers: set[int] | None = None
            for _ in range(100):
                numbers = consumer.partitions_for_topic(name)
                if numbers:
                    break
                await consumer._client.force_metadata_update()
                await asyncio.sleep(0.05)
            assert numbers, f"topic {name} does not exist"
            partitions += [TopicPartition(name, number) for number in sorted(numbers)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + scaled(within)
        while True:
            batches = await consumer.getmany(*partitions, timeout_ms=200)
            for partition, records in batches.items():
                found[partition.topic] += records
            if await at_the_end(consumer, partitions):
                return found
            assert time.monotonic() < deadline, f"the ends of the topics of {prefix} not reached in time"
    finally:
        await consumer.stop()


def readable_anywhere(records: dict[str, list[ConsumerRecord[bytes, bytes]]], phrase: str) -> list[str]:
    """Where `phrase` is readable in any key, value or header of `records` (`topic@offset`), also
    inside the base64 strings of a JSON value (record payloads and checkpoints travel that way)."""
    needle = phrase.encode()
    places = []
    for name, found in records.items():
        for record in found:
            headers = b"".join(key.encode() + value for key, value in record.headers)
            parts = [record.key or b"", headers, *_readable_forms(record.value or b"")]
            if any(needle in part for part in parts):
                places.append(f"{name}@{record.partition}/{record.offset}")
    return places


async def opened_with_existing_keys(
    records: dict[str, list[ConsumerRecord[bytes, bytes]]], keys: KeySettings
) -> dict[str, list[ConsumerRecord[bytes, bytes]]]:
    """`records` with every sealed value opened with whatever key still exists, as a fresh
    consumer would (a key client with no cache of the test's making); one that does not open is
    kept as it is."""
    opened: dict[str, list[ConsumerRecord[bytes, bytes]]] = {}
    seals = message_seals(keys)
    try:
        for name, found in records.items():
            opened[name] = []
            for record in found:
                readable = record
                with contextlib.suppress(MessageErasedError, PermanentError):
                    readable = dataclasses.replace(record, value=await seals.open(record.value or b""))
                opened[name].append(readable)
    finally:
        await seals.close()
    return opened


def _readable_forms(value: bytes) -> list[bytes]:
    """`value`, and what every base64 string in it decodes to (a JSON value's strings)."""
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return [value]
    forms = [value]
    pending: list[Any] = [parsed]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += item.values()
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str) and len(item) % 4 == 0:
            with contextlib.suppress(binascii.Error, ValueError):
                forms.append(base64.b64decode(item, validate=True))
    return forms
