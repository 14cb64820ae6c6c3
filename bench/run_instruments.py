"""The run bench's instruments: timed spans of the planner's store commands and of the model, the
watcher of terminal events, the owner's database commands, CPU time of the stack's processes, and
the figures' arithmetic."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from pymongo import monitoring

from quipu.contracts.events import RunEvent, RunPhase, StreamEventType
from quipu.contracts.store_operation import StoreOperation
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.models.port import ModelClient, ModelRequest, ModelResponse, TextDelta
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore

STARTED = [time.perf_counter()]


class DatabaseCommands(monitoring.CommandListener):
    """Every command the owner's database client sends, counted by name and, for the commands that
    name one collection (finds, updates, inserts), by collection: `find sessions`, `bulkWrite`."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        target = event.command.get(event.command_name)
        name = event.command_name
        self.counts[f"{name} {target}" if isinstance(target, str) else name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def progress(step: str) -> None:
    print(f"  [{time.perf_counter() - STARTED[0]:6.1f} s] {step} done", file=sys.stderr, flush=True)


def box_ms() -> float:
    """Milliseconds this process takes for one fixed piece of pure-Python work (the median of
    five). On this kind of machine the same tree runs every span of a run up to ~1.5x slower from
    one bench to the next, all at once: two runs' figures compare through this one."""

    def work() -> int:
        total = 0
        for index in range(200_000):
            total += index * index % 7
        return total

    times: list[float] = []
    for _ in range(5):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def to_ms(seconds: float) -> float:
    return seconds * 1000.0


def quantile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# --- instruments ---------------------------------------------------------------------------------


@dataclass
class Span:
    """One timed call (perf_counter seconds); `command` is kept for the planner's commands."""

    op: str
    started: float
    ended: float
    command: StoreOperation | None = None

    @property
    def duration(self) -> float:
        return self.ended - self.started


class TimedKafkaStore(KafkaStore):
    """The planner's store client: every command it sends (runtime or memory) is timed and kept."""

    def __init__(self, settings: KafkaSettings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.spans: list[Span] = []

    async def call(self, command: StoreOperation) -> Any:
        started = time.perf_counter()
        try:
            return await super().call(command)
        finally:
            self.spans.append(Span(type(command).method, started, time.perf_counter(), command))


class TimedBackend:
    """A proxy around the owner's MongoStore or MongoMemoryStore: every operation is timed."""

    def __init__(self, inner: Any, spans: list[Span]) -> None:
        self._inner = inner
        self._spans = spans

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name.startswith("_") or not asyncio.iscoroutinefunction(attribute):
            return attribute

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await attribute(*args, **kwargs)
            finally:
                self._spans.append(Span(name, started, time.perf_counter()))

        return timed


class TimedModel:
    """The scripted model, timed; the planner's publishes of answer text (`on_text`) timed apart."""

    def __init__(self, inner: ModelClient) -> None:
        self._inner = inner
        self.name = inner.name
        self.spans: list[Span] = []
        self.publishes: list[Span] = []

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        timed_on_text = None
        if on_text is not None:
            callback = on_text

            async def timed_on_text(text: str) -> None:
                started = time.perf_counter()
                await callback(text)
                self.publishes.append(Span("on_text", started, time.perf_counter()))

        started = time.perf_counter()
        try:
            return await self._inner.complete(request, timed_on_text)
        finally:
            self.spans.append(Span("complete", started, time.perf_counter()))

    async def count_tokens(self, request: ModelRequest) -> int:
        started = time.perf_counter()
        try:
            return await self._inner.count_tokens(request)
        finally:
            self.spans.append(Span("count_tokens", started, time.perf_counter()))


class TerminalWatcher:
    """Reads every partition of runs.events (no group); resolves a future per run at its end."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._topic = settings.topic_prefix + Topic.RUNS_EVENTS.value
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._ends: dict[str, asyncio.Future[tuple[float, None]]] = {}

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._settings.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self._settings.fetch_max_wait_ms,
        )
        await self._consumer.start()
        numbers = await topic_partitions(self._consumer, self._topic)
        partitions = [TopicPartition(self._topic, number) for number in sorted(numbers)]
        self._consumer.assign(partitions)
        await self._consumer.seek_to_beginning(*partitions)  # a fresh topic: nothing old to skip
        self._task = asyncio.create_task(self._read())

    def expect(self, run_id: str) -> asyncio.Future[tuple[float, None]]:
        """Resolved with (perf_counter, None) when the run's terminal event is read."""
        future: asyncio.Future[tuple[float, None]] = asyncio.get_running_loop().create_future()
        self._ends[run_id] = future
        if self._consumer is not None:
            expecting(self._consumer)
        return future

    async def _read(self) -> None:
        assert self._consumer is not None

        def ended(value: bytes) -> tuple[str, None] | None:
            event = RunEvent.model_validate_json(value)
            if event.type is StreamEventType.WORKFLOW and RunPhase(event.payload["phase"]).terminal:
                return event.run_id, None
            return None

        await resolve_each(self._consumer, ended, self._ends)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()


T = TypeVar("T")


async def resolve_each(
    consumer: AIOKafkaConsumer,
    match: Callable[[bytes], tuple[str, T] | None],
    waiting: dict[str, asyncio.Future[tuple[float, T]]],
) -> None:
    """Forever: each record `match` names (id, value) resolves the future waiting for that id
    with (perf_counter when read, value). While nothing waits the consumer does not fetch: the
    bench's own fetches would load the broker an idle figure measures (`expecting` resumes it)."""
    while True:
        if not waiting:
            consumer.pause(*consumer.assignment())
        batches = await consumer.getmany(timeout_ms=1000)
        now = time.perf_counter()
        for records in batches.values():
            for record in records:
                matched = match(record.value or b"")
                future = waiting.pop(matched[0], None) if matched is not None else None
                if matched is not None and future is not None and not future.done():
                    future.set_result((now, matched[1]))


def expecting(consumer: AIOKafkaConsumer) -> None:
    """Fetch again (`resolve_each` pauses a consumer nothing waits on): call it before publishing."""
    consumer.resume(*consumer.assignment())


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    for _ in range(50):
        numbers = consumer.partitions_for_topic(topic)
        if numbers:
            return set(numbers)
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)
    raise RuntimeError(f"topic {topic} does not exist")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stack_pids(stack: EmbeddedStack) -> dict[str, int]:
    pids: dict[str, int] = {}
    for pid in stack.pids:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            pids["tansu" if b"tansu" in cmdline.read() else "secantusdb"] = pid
    return pids
