"""The fleet bench's machinery: services in child processes on one topic prefix of the embedded
stack, and the drivers that load them from this process (runs, and tool calls straight to an
executor), with what the figures are read from (CPU time, resident memory, consumer groups).

Each service runs as the deployment runs it, `python -m quipu.services.<name>` (one process per
copy), or, for what no such command starts, as `python -m bench.fleet_child ROLE...` (every
service in one process; the bench's own toolsets). Children get the stack's environment, the
fleet's prefix and database, the offline scripted model and WARNING logs (to a file each).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from bench.run_instruments import (
    TerminalWatcher,
    expecting,
    process_cpu_s,
    resolve_each,
    topic_partitions,
)
from quipu.assistant import app as assistant_app
from quipu.contracts.runs import RunRequested
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.topics import Topic, toolset_calls_topic
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.services import ServiceProcess
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.agent_publisher import publish_agents
from quipu.services.kit.publishing import producer_publisher
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore

READY_TIMEOUT_S = 120.0
"""How long a fleet may take to start on a busy box (a group join is a second or more on Tansu)."""

ROLES_ENV = "BENCH_FLEET_ROLES"
"""The roles a `bench.fleet_child` process runs (space-separated)."""

REQUEST_COUNTER = Path(__file__).parent / "kafka_requests"
"""Put first on every child's PYTHONPATH: its `sitecustomize` counts the child's Kafka requests."""
REQUESTS_DIR_ENV = "BENCH_KAFKA_REQUESTS_DIR"


def rss_mb(pid: int) -> tuple[float, float]:
    """A process's resident memory now and at its peak (VmRSS, VmHWM), in MB (Linux /proc)."""
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in {"VmRSS", "VmHWM"}:
                fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


@dataclass
class Fleet:
    """Service processes on one prefix; `copies[label]` are the processes of one label."""

    stack: EmbeddedStack
    settings: KafkaSettings
    environment: dict[str, str]
    logs: Path
    copies: dict[str, list[ServiceProcess]] = field(default_factory=dict)

    def service(self, name: str, **environment: str) -> ServiceProcess:
        """One more copy of catalog service `name` (`python -m quipu.services.<name>`)."""
        return self._spawn(name, f"quipu.services.{name}", environment)

    def child(self, label: str, roles: Sequence[str], **environment: str) -> ServiceProcess:
        """One more `bench.fleet_child` process running `roles`."""
        return self._spawn(label, "bench.fleet_child", {ROLES_ENV: " ".join(roles), **environment})

    def _spawn(self, label: str, module: str, environment: dict[str, str]) -> ServiceProcess:
        copies = self.copies.setdefault(label, [])
        log = self.logs / f"{label}-{len(copies)}.log"
        process = ServiceProcess(module, {**self.environment, **environment}, log).start()
        copies.append(process)
        return process

    def pids(self) -> dict[str, int]:
        """Every child by `label-copy`, and the broker (`tansu`)."""
        pids = {
            f"{label}-{number}": process.process.pid
            for label, copies in self.copies.items()
            for number, process in enumerate(copies)
            if process.process is not None
        }
        return pids | {"tansu": broker_pid(self.stack)}

    def cpu(self) -> dict[str, float]:
        return {name: process_cpu_s(pid) for name, pid in self.pids().items()}

    async def kafka_requests(self) -> dict[str, collections.Counter[str]]:
        """Every child's Kafka requests so far, by kind (bench/kafka_requests), by `label-copy`."""
        directory = Path(self.environment[REQUESTS_DIR_ENV])
        children = {name: pid for name, pid in self.pids().items() if name != "tansu"}
        for pid in children.values():
            (directory / f"{pid}.json").unlink(missing_ok=True)
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10.0
        while not all((directory / f"{pid}.json").exists() for pid in children.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("a child did not write its Kafka request counts")
            await asyncio.sleep(0.02)
        return {
            name: collections.Counter(json.loads((directory / f"{pid}.json").read_text()))
            for name, pid in children.items()
        }

    def check_alive(self) -> None:
        """RuntimeError with the end of its log when a child has exited."""
        for label, copies in self.copies.items():
            for number, process in enumerate(copies):
                if not process.running:
                    tail = (self.logs / f"{label}-{number}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{label}-{number} exited:\n{tail}")

    async def settled(self, groups: dict[str, int]) -> None:
        """Wait until each consumer group (its default name) is stable with that many members."""
        wanted = {self.settings.topic_prefix + group: count for group, count in groups.items()}
        deadline = time.monotonic() + READY_TIMEOUT_S
        seen: dict[str, tuple[str, int]] = {}
        while True:
            self.check_alive()
            for name in wanted:
                seen[name] = await self._group_state(name)
            if all(seen[name] == ("Stable", count) for name, count in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumer groups not settled: {seen}")
            await asyncio.sleep(0.2)

    async def _group_state(self, name: str) -> tuple[str, int]:
        """A group's state and member count; ("unknown", 0) when the broker does not say (Tansu
        drops the connection when asked about a group nobody has joined yet)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.bootstrap)
        try:
            await admin.start()
            described = await admin.describe_consumer_groups([name])
        except KafkaError:
            return "unknown", 0
        finally:
            await admin.close()
        for response in described:
            for group in response.groups:
                return str(group[2]), len(group[5])
        return "unknown", 0

    async def stop(self) -> None:
        """SIGTERM every child at once, each killed when it has not exited within 15 s."""
        processes = [process for copies in self.copies.values() for process in copies]
        await asyncio.gather(*(asyncio.to_thread(process.stop, 15.0) for process in processes))


def broker_pid(stack: EmbeddedStack) -> int:
    for pid in stack.pids:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"tansu" in cmdline.read():
                return pid
    raise RuntimeError("the embedded stack runs no Tansu broker")


@contextlib.asynccontextmanager
async def fleet(stack: EmbeddedStack, toolsets: Sequence[str] = ()) -> AsyncIterator[Fleet]:
    """A fresh prefix and database with every registry topic (and each toolset's calls topic);
    the children are stopped and the topics deleted at the end."""
    prefix = f"fb{uuid.uuid4().hex[:8]}."
    await create_topics(stack.bootstrap, prefix)
    # The planner serves only registered agents: the built-in assistant's, as `quipu up` publishes them.
    await publish_agents(stack.kafka_settings(topic_prefix=prefix), assistant_app.agents)
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.bootstrap)
    await admin.start()
    try:
        extra = [NewTopic(prefix + toolset_calls_topic(name), 8, 1) for name in toolsets]
        if extra:
            await admin.create_topics(extra)
    finally:
        await admin.close()
    environment = {
        **stack.environment(),
        "QUIPU_KAFKA_TOPIC_PREFIX": prefix,
        "QUIPU_MONGO_DATABASE": prefix.rstrip("."),
        "QUIPU_MODEL_PROVIDER": "scripted",
        "QUIPU_LOG_LEVEL": "WARNING",
        "QUIPU_JSON_LOGS": "true",
        "QUIPU_GATEWAY_PORT": "0",
    }
    with tempfile.TemporaryDirectory(prefix="quipu-fleet-") as logs:
        requests = Path(logs) / "kafka-requests"
        requests.mkdir()
        environment[REQUESTS_DIR_ENV] = str(requests)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REQUEST_COUNTER), os.environ.get("PYTHONPATH")])
        )
        running = Fleet(stack, stack.kafka_settings(topic_prefix=prefix), environment, Path(logs))
        try:
            yield running
        finally:
            await running.stop()
            await delete_topics(stack.bootstrap, prefix)


def _producer(settings: KafkaSettings) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        acks=settings.acks,
        enable_idempotence=settings.enable_idempotence,
    )


class Runs:
    """Runs from this process: sessions created through the owner, `RunRequested` published, the
    end read on runs.events (the run bench's `TerminalWatcher`)."""

    TEXT = "calculate 6*7"

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._producer = _producer(settings)
        self._store = KafkaStore(settings, reply_timeout_s=30.0)
        self._watcher = TerminalWatcher(settings)

    async def __aenter__(self) -> Runs:
        await asyncio.gather(self._producer.start(), self._store.start(), self._watcher.start())
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._watcher.stop()
        await self._store.stop()
        await self._producer.stop()

    async def sessions(self, count: int) -> list[str]:
        """`count` fresh sessions, created twenty at a time."""
        names = ["s-" + uuid.uuid4().hex[:12] for _ in range(count)]
        for start in range(0, count, 20):
            await asyncio.gather(
                *(self._store.create_session(name, utc_now_ms()) for name in names[start : start + 20])
            )
        return names

    async def run(self, session_id: str, timeout_s: float = 300.0) -> float:
        """One run's seconds from publishing its request to reading its terminal event."""
        request = RunRequested(
            run_id="r-" + uuid.uuid4().hex, session_id=session_id, agent_id="assistant", text=self.TEXT
        )
        end = self._watcher.expect(request.run_id)
        published = time.perf_counter()
        await producer_publisher(self._producer, self._settings).publish(request)
        ended, _ = await asyncio.wait_for(end, timeout_s)
        return ended - published

    async def at_once(self, sessions: list[list[str]], deadline_s: float) -> Load:
        """Each list of sessions run by one client, turn after turn, all clients at once, for at
        most `deadline_s`: the runs that ended in time, those that did not, and the wall time."""
        latencies: list[float] = []

        async def client(own: list[str]) -> None:
            for session_id in own:
                latencies.append(await self.run(session_id, timeout_s=deadline_s))

        started = time.perf_counter()
        clients = [asyncio.create_task(client(own)) for own in sessions]
        _, pending = await asyncio.wait(clients, timeout=deadline_s)
        wall = time.perf_counter() - started
        for task in pending:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        return Load(latencies, sum(map(len, sessions)) - len(latencies), wall)


@dataclass
class Load:
    """Runs under load: the seconds of each that ended before the deadline, how many did not."""

    latencies: list[float]
    unfinished: int
    wall_s: float

    @property
    def runs_per_s(self) -> float:
        return len(self.latencies) / self.wall_s

    def quantile(self, q: float) -> float | None:
        """The q-quantile over every run (nearest rank), a run that did not end counting as
        slower than all that did; None when the rank falls on one that did not end."""
        rank = round(q * (len(self.latencies) + self.unfinished - 1))
        ordered = sorted(self.latencies)
        return ordered[rank] if rank < len(ordered) else None


@dataclass
class Answer:
    seconds: float
    content: str


class ToolCalls:
    """Tool calls published straight to a toolset's calls topic; results read on tools.results
    (every partition, no group), matched by tool use id."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._producer = _producer(settings)
        self._results = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=settings.fetch_max_wait_ms,
        )
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Future[tuple[float, str]]] = {}

    async def __aenter__(self) -> ToolCalls:
        await self._producer.start()
        await self._results.start()
        topic = self._settings.topic_prefix + Topic.TOOLS_RESULTS.value
        partitions = [
            TopicPartition(topic, number) for number in sorted(await topic_partitions(self._results, topic))
        ]
        self._results.assign(partitions)
        await self._results.seek_to_beginning(*partitions)  # a fresh topic: nothing old to skip
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self._results.stop()
        await self._producer.stop()

    async def _read(self) -> None:
        def answered(value: bytes) -> tuple[str, str]:
            result = ToolCallCompleted.model_validate_json(value)
            return result.tool_use_id, str(result.content)

        await resolve_each(self._results, answered, self._waiting)

    async def call(
        self, toolset: str, tool: str, arguments: dict[str, object], timeout_s: float = 120.0
    ) -> Answer:
        """One call of `tool` in a run of its own; its seconds from publish to result, and its content."""
        run_id = "r-" + uuid.uuid4().hex
        request = ToolCallRequested(
            run_id=run_id,
            session_id="s-" + run_id,
            agent_id="bench",
            tool_use_id="toolu_" + uuid.uuid4().hex,
            tool_name=tool,
            input=arguments,
        )
        future: asyncio.Future[tuple[float, str]] = asyncio.get_running_loop().create_future()
        self._waiting[request.tool_use_id] = future
        expecting(self._results)
        published = time.perf_counter()
        await producer_publisher(self._producer, self._settings).publish(
            request, within=toolset_calls_topic(toolset)
        )
        received, content = await asyncio.wait_for(future, timeout_s)
        return Answer(received - published, content)
