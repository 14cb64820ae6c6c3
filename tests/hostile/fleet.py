"""Every consuming service as a process of its own on one topic prefix, and a client's view of it.

`Fleet` starts the storage owner, planner, tool executor, transcript recorder, fact extractor and
enricher (`python -m quipu.services.<name>`, scripted models), stops them with SIGTERM and starts them
again. The test side reads topics outside any consumer group (`TopicReader`), publishes raw bytes
of any size, asks each consumer group how far it committed, and drives a normal run through the
whole chain: a tool call, the history, a fact and its index update.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from quipu.contracts.events import StreamEventType
from quipu.contracts.runs import RunRequested
from quipu.contracts.topics import Topic
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.services import ServiceProcess
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services import catalog
from quipu.services.kit.store_client import KafkaStore
from tests.owner_support import TopicReader
from tests.support.announced import publish_built_in_agents
from tests.timing import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]
SHUTDOWN_GRACE_S = 4.0
"""Each service's shutdown grace here (QUIPU_<SERVICE>_SHUTDOWN_GRACE_S)."""

_LARGEST_READ = 256 * 1024
"""Records bigger than this on a watched topic are hostile ones: never parsed."""

SERVICES: dict[str, str] = {
    service.name: str(service.definition().settings.model_config["env_prefix"])
    for service in catalog.CONSUMING
}
"""Service name -> its settings' environment prefix (`QUIPU_OWNER_`, ...)."""


def _groups_by_topic() -> dict[Topic, list[str]]:
    groups: dict[Topic, list[str]] = {}
    for service in catalog.CONSUMING:
        for group, consumed in service.consumes:
            groups.setdefault(consumed, []).append(group)
    return groups


GROUPS = _groups_by_topic()
"""The consumer groups that must commit every consumed topic to its end."""


@dataclass
class Fleet:
    """The six consuming services on a prefix of their own, with readers of what a user can see."""

    stack: EmbeddedStack
    log_dir: Path
    prefix: str = field(default_factory=lambda: f"hx{uuid.uuid4().hex[:8]}.")
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    readers: dict[str, TopicReader] = field(default_factory=dict)
    store: KafkaStore = field(init=False)
    _producer: AIOKafkaProducer = field(init=False)
    _starts: int = 0
    _parsed: dict[Topic, list[dict[str, Any]]] = field(default_factory=dict)
    _parsed_count: dict[Topic, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.store = KafkaStore(self.stack.kafka_settings(topic_prefix=self.prefix), reply_timeout_s=10.0)
        # Bigger requests than any service may send: the broker takes 5 MB, the services' producers
        # are held to 1 MB (KafkaSettings.max_request_bytes).
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.stack.bootstrap,
            acks="all",
            enable_idempotence=False,
            max_request_size=16 * 1024 * 1024,
        )

    def topic(self, name: str) -> str:
        """The physical name of a registry topic (or a `.dlq`) under this fleet's prefix."""
        return self.prefix + name

    def environment(self) -> dict[str, str]:
        """What every service process gets: the stack, the prefix, scripted models, short graces."""
        graces = {f"{prefix}SHUTDOWN_GRACE_S": str(SHUTDOWN_GRACE_S) for prefix in SERVICES.values()}
        return {
            **self.stack.environment(),
            "QUIPU_KAFKA_TOPIC_PREFIX": self.prefix,
            "QUIPU_MONGO_DATABASE": self.prefix.rstrip("."),
            "QUIPU_MODEL_PROVIDER": "scripted",
            "QUIPU_JSON_LOGS": "true",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
            **graces,
        }

    async def __aenter__(self) -> Fleet:
        await create_topics(self.stack.bootstrap, self.prefix)
        # The planner and the fact extractor serve only registered agents, as in a deployment.
        await publish_built_in_agents(self.stack.kafka_settings(topic_prefix=self.prefix))
        try:
            self.start_all()
            await self._producer.start()
            await self.store.start()
            watched = [
                *(name.value for name in GROUPS),
                *(name.dlq for name in GROUPS),
                Topic.RUNS_EVENTS.value,
            ]
            for name in watched:
                self.readers[name] = await TopicReader(self.stack.bootstrap, self.topic(name)).start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the readers, clients and processes; drop the topics."""
        for reader in self.readers.values():
            with contextlib.suppress(Exception):
                await reader.stop()
        for stop in (self.store.stop, self._producer.stop):
            with contextlib.suppress(Exception):
                await stop()
        await self.stop_all()
        with contextlib.suppress(Exception):
            await delete_topics(self.stack.bootstrap, self.prefix)

    # -- processes --

    def start_all(self) -> None:
        """Start every service (again): a new process each, logging to a file of its own."""
        self._starts += 1
        for service in catalog.CONSUMING:
            log = self.log_dir / f"{self._starts:02d}-{service.name}.log"
            self.processes[service.name] = ServiceProcess(service.module, self.environment(), log).start()

    async def stop_all(self) -> dict[str, tuple[float, int | None]]:
        """SIGTERM every service at once; per service the seconds to exit and its exit status.

        A service that has not exited `SHUTDOWN_GRACE_S` (scaled) plus a margin after SIGTERM is
        SIGKILLed, and its status is then -9.
        """

        async def stop(process: ServiceProcess) -> tuple[float, int | None]:
            began = time.monotonic()
            await asyncio.to_thread(process.stop, scaled(SHUTDOWN_GRACE_S + 3.0))
            assert process.process is not None
            return time.monotonic() - began, process.process.returncode

        running = dict(self.processes)
        results = await asyncio.gather(*(stop(process) for process in running.values()))
        return dict(zip(running, results, strict=True))

    def not_running(self) -> list[str]:
        """The services whose process has exited."""
        return [name for name, process in self.processes.items() if not process.running]

    def logs(self) -> str:
        """Everything every service process logged so far."""
        return "\n".join(path.read_text(errors="replace") for path in sorted(self.log_dir.glob("*.log")))

    def log_tails(self, size: int = 3000) -> str:
        """The end of each service's log, for failure messages."""
        return "\n".join(
            f"--- {path.name}\n{path.read_bytes()[-size:].decode(errors='replace')}"
            for path in sorted(self.log_dir.glob("*.log"))
        )

    # -- the client's side --

    async def publish(
        self, name: Topic, body: bytes | None, *, key: bytes, headers: Mapping[str, bytes] | None = None
    ) -> tuple[int, int]:
        """Publish raw bytes; (partition, offset) once the broker has them."""
        metadata = await self._producer.send_and_wait(
            self.topic(name.value), body, key=key, headers=list((headers or {}).items())
        )
        return metadata.partition, metadata.offset

    async def session(self, session_id: str) -> str:
        """A new session through the owner."""
        await self.store.create_session(session_id, utc_now_ms())
        return session_id

    async def turn(self, session_id: str, principal_id: str, text: str, run_id: str) -> None:
        """Publish one user turn, keyed by its session as the gateway does."""
        request = RunRequested(
            run_id=run_id, session_id=session_id, agent_id="assistant", principal_id=principal_id, text=text
        )
        await self.publish(Topic.RUNS_REQUESTED, request.model_dump_json().encode(), key=session_id.encode())

    def closed(self, run_id: str) -> bool:
        """Whether the run's event stream ended."""
        return any(
            event.get("run_id") == run_id and event.get("type") == StreamEventType.RUN_STREAM_END.value
            for event in self._objects(Topic.RUNS_EVENTS)
        )

    def fact_changed(self, principal_id: str) -> bool:
        """Whether the owner announced a fact of `principal_id` (the extractor proposed it)."""
        return any(
            isinstance(change.get("scope"), dict) and change["scope"].get("principal_id") == principal_id
            for change in self._objects(Topic.MEMORY_CHANGES)
        )

    def recorded(self, session_id: str) -> bool:
        """Whether the recorder's history of the session was announced on `history.recorded`."""
        return any(value.get("session_id") == session_id for value in self._objects(Topic.HISTORY_RECORDED))

    def _objects(self, name: Topic) -> list[dict[str, Any]]:
        """The JSON objects read so far on `name`, parsed once each; hostile records are left out."""
        parsed = self._parsed.setdefault(name, [])
        seen = self._parsed_count.get(name, 0)
        records = self.readers[name.value].records
        for record in records[seen:]:
            if record.value is None or len(record.value) > _LARGEST_READ:
                continue
            with contextlib.suppress(ValueError, RecursionError):
                value = json.loads(record.value)
                if isinstance(value, dict):
                    parsed.append(value)
        self._parsed_count[name] = len(records)
        return parsed

    async def behind(self) -> list[str]:
        """Partitions some group has not committed to their end (empty: no partition is stuck)."""
        lagging = []
        for name, groups in GROUPS.items():
            ends: dict[int, int] = {}
            for record in self.readers[name.value].records:
                ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
            for group in groups:
                committed = await committed_offsets(
                    self.stack.bootstrap, self.prefix + group, self.topic(name.value), sorted(ends)
                )
                lagging += [
                    f"{group} {name.value}[{partition}] at {committed[partition]} of {end}"
                    for partition, end in ends.items()
                    if committed[partition] < end
                ]
        return lagging


async def committed_offsets(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """How far `group` committed each of `partitions` (0 when it never did), without joining it."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return {
            partition: (await consumer.committed(TopicPartition(topic, partition))) or 0
            for partition in partitions
        }
    finally:
        await consumer.stop()
