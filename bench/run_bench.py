"""The agent loop's overhead: a one-tool run against what its Kafka hops and store operations cost.

Everything runs in this process on the embedded stack: the storage owner (MongoStore and
MongoMemoryStore on SecantusDB), the planner (default settings: memory context over the owner's
memory commands; the offline `ScriptedModel`) and the tool executor, each
`create_app(...).start()`-ed as in tests/integration/test_planner_kafka.py. The run is
"calculate 6*7" in a fresh session: one calculator call (an instant tool), then a final answer.

Definitions (printed by `python -m bench`):

- run_overhead: perf_counter from just before the bench publishes `RunRequested` to the moment its
  reader of `runs.events` (every partition, no group) receives the run's terminal `workflow` event.
- The planner's store client is a `KafkaStore` subclass that times every command it sends
  (runtime and memory commands alike: both ride `KafkaStore.call`); a subclass, not a wrapper,
  because the planner only builds its memory context over a `KafkaStore`. Runs are sequential, so
  a command belongs to the run in flight when it was sent.
- Critical path: the planner's N commands sent before the terminal event (RecordRunTerminal
  included), in S steps: they follow one another, except that the memory context sends two at
  once (LoadSummary, HistoryTail: one step, 2 hops, both operations applied in turn by the
  owner). H = 2S + 3 Kafka hops: 1 request (runs.requested -> planner) + 2 per step but the last
  (commands -> owner, replies -> planner) + 1 for the terminal command + 1 for the terminal event
  (owner -> reader; the terminal reply is off the path) + 2 for the tool (tools.calls ->
  executor, tools.results -> planner).
- raw hop: aiokafka send_and_wait (the services' acks and idempotence) -> a group-less consumer
  (their fetch_max_wait_ms) on a topic of its own, services up and idle. Every consumer on the
  path has been waiting in a fetch when its message comes (Tansu's fetch does not wake on new
  data: PLATFORM_NOTES), so each sample waits a random 0-20 ms before its send; back-to-back
  (which hides that cost) is reported too.
- store operation: the runs' own commands (those of the first 20 sequential runs) replayed, one
  at a time, straight on a MongoStore / MongoMemoryStore of a fresh database on the same server.
- raw_hops_p50_ms = H x p50(raw hop) + sum over the path's N commands of p50(that operation,
  replayed): what the path costs if every hop and operation costs its floor and nothing else.
- run_overhead_vs_hops_ratio = run_overhead_p50 / raw_hops_p50 (target <= 1.5).

Then 50 sessions run at once, each client running its turns back to back (a fresh session per run,
created beforehand, so every run is the same first turn): runs/s and p50/p99 under load.
`python -m bench.run_bench --profile` also runs 20 sequential runs under cProfile (CPU time).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import io
import itertools
import os
import pstats
import random
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from quipu.contracts.events import RunEvent, RunPhase, StreamEventType
from quipu.contracts.runs import RunRequested
from quipu.contracts.store_operation import Backend, StoreOperation
from quipu.contracts.topics import Topic
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.models.port import ModelClient, ModelRequest, ModelResponse, TextDelta
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.domain.store.protocol import Store
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.publishing import producer_publisher
from quipu.services.kit.settings import KafkaSettings, ServiceSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.storage_owner.app import create_app as create_owner
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.tool_executor.app import create_app as create_executor

TEXT = "calculate 6*7"
WARMUP_RUNS = 5
SEQUENTIAL_RUNS = 40
REPLAYED_RUNS = 20
SESSIONS = 50
RUNS_PER_SESSION = 2
RAW_HOPS = 150
IDLE_GAP_S = 0.020
IDLE_CPU_S = 2.0
RUN_TIMEOUT_S = 300.0

DEFINITIONS = """\
run_overhead     publish RunRequested -> the run's terminal `workflow` event read on runs.events
                 ("calculate 6*7" in a fresh session: ScriptedModel, one calculator call, answer)
critical path    N = planner commands (runtime + memory, timed in its KafkaStore) sent before the
                 terminal event, in S steps (commands under way together are one step);
                 H = 1 request + 2 per step but the last + 1 terminal command + 1 terminal event
                 + 2 tool (call, result) = 2S + 3 hops, plus N store operations
raw hop          aiokafka send_and_wait -> group-less consumer, same client settings, own topic,
                 0-20 ms idle before each send (the path's consumers wait in a fetch)
store op         the runs' own commands (20 runs) replayed one at a time on MongoStore and
                 MongoMemoryStore (fresh database, same server)
raw_hops_p50_ms  H x p50(raw hop) + sum over the N commands of p50(that operation, replayed)
ratio            run_overhead_p50 / raw_hops_p50 (target <= 1.5)"""

_STARTED = [time.perf_counter()]


def _progress(step: str) -> None:
    print(f"  [{time.perf_counter() - _STARTED[0]:6.1f} s] {step} done", file=sys.stderr, flush=True)


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _p(values: list[float], q: float) -> float:
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
        self._ends: dict[str, asyncio.Future[float]] = {}

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._settings.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self._settings.fetch_max_wait_ms,
        )
        await self._consumer.start()
        numbers = await _partitions(self._consumer, self._topic)
        partitions = [TopicPartition(self._topic, number) for number in sorted(numbers)]
        self._consumer.assign(partitions)
        await self._consumer.seek_to_beginning(*partitions)  # a fresh topic: nothing old to skip
        self._task = asyncio.create_task(self._read())

    def expect(self, run_id: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._ends[run_id] = future
        return future

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=1000)
            now = time.perf_counter()
            for records in batches.values():
                for record in records:
                    event = RunEvent.model_validate_json(record.value or b"")
                    if event.type is StreamEventType.WORKFLOW and RunPhase(event.payload["phase"]).terminal:
                        future = self._ends.pop(event.run_id, None)
                        if future is not None and not future.done():
                            future.set_result(now)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    for _ in range(50):
        numbers = consumer.partitions_for_topic(topic)
        if numbers:
            return set(numbers)
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)
    raise RuntimeError(f"topic {topic} does not exist")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stack_pids(stack: EmbeddedStack) -> dict[str, int]:
    pids: dict[str, int] = {}
    for pid in stack.pids:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            pids["tansu" if b"tansu" in cmdline.read() else "secantusdb"] = pid
    return pids


# --- the system ----------------------------------------------------------------------------------


@dataclass
class Run:
    """One run as the bench saw it (perf_counter seconds)."""

    run_id: str
    session_id: str
    published: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.published


@dataclass
class System:
    settings: KafkaSettings
    producer: AIOKafkaProducer
    setup_store: KafkaStore
    planner_store: TimedKafkaStore
    owner_spans: list[Span]
    model: TimedModel
    watcher: TerminalWatcher
    pids: dict[str, int]
    session_created: dict[str, datetime] = field(default_factory=dict)

    async def new_session(self) -> str:
        session_id = "s-" + uuid.uuid4().hex[:12]
        created = utc_now_ms()
        await self.setup_store.create_session(session_id, created)
        self.session_created[session_id] = created
        return session_id

    async def run(self, session_id: str) -> Run:
        """One run in `session_id`, from publishing its request to reading its terminal event."""
        request = RunRequested(
            run_id="r-" + uuid.uuid4().hex, session_id=session_id, agent_id="assistant", text=TEXT
        )
        end = self.watcher.expect(request.run_id)
        published = time.perf_counter()
        await producer_publisher(self.producer, self.settings).publish(request)
        return Run(request.run_id, session_id, published, await asyncio.wait_for(end, RUN_TIMEOUT_S))

    def cpu(self) -> dict[str, float]:
        return {name: _cpu_s(pid) for name, pid in self.pids.items()}


def _producer(settings: KafkaSettings) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        acks=settings.acks,
        enable_idempotence=settings.enable_idempotence,
    )


@contextlib.asynccontextmanager
async def _system(stack: EmbeddedStack) -> AsyncIterator[System]:
    prefix = f"rb{uuid.uuid4().hex[:8]}."
    database = prefix.rstrip(".")
    await create_topics(stack.bootstrap, prefix)
    settings = stack.kafka_settings(topic_prefix=prefix)
    mongo = await MongoStore.connect(stack.mongo_uri, database)
    memory = await MongoMemoryStore.open(mongo.client, database)
    owner_spans: list[Span] = []
    owner = create_owner(
        settings,
        store=cast(Store, TimedBackend(mongo, owner_spans)),
        memory=cast(MemoryStore, TimedBackend(memory, owner_spans)),
    )
    planner_store = TimedKafkaStore(settings, reply_timeout_s=10.0)
    model = TimedModel(ScriptedModel())
    planner = create_planner(settings, deps=PlannerDeps(store=planner_store, model=model))
    executor = create_executor(settings)
    setup_store = KafkaStore(settings, reply_timeout_s=10.0)
    producer = _producer(settings)
    watcher = TerminalWatcher(settings)
    await owner.start()
    await planner_store.start()
    await setup_store.start()
    await asyncio.gather(planner.start(), executor.start(), producer.start(), watcher.start())
    pids = {"bench": os.getpid(), **_stack_pids(stack)}
    try:
        yield System(settings, producer, setup_store, planner_store, owner_spans, model, watcher, pids)
    finally:
        await watcher.stop()
        await producer.stop()
        await planner.stop()
        await executor.stop()
        await planner_store.stop()
        await setup_store.stop()
        await owner.stop()
        await mongo.drop_database()
        await memory.close()
        await mongo.close()
        await delete_topics(stack.bootstrap, prefix)


# --- raw hops and store operations -----------------------------------------------------------------


async def _raw_hops(settings: KafkaSettings, count: int, idle_s: float) -> list[float]:
    """Produce -> consume round trips (seconds) on a topic of their own, the services' settings."""
    name = settings.topic_prefix + "bench.raw-hops"
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
    await admin.start()
    try:
        if name not in await admin.list_topics():
            await admin.create_topics([NewTopic(name, 1, 1)])
    finally:
        await admin.close()
    producer = _producer(settings)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
    )
    await producer.start()
    await consumer.start()
    partition = TopicPartition(name, 0)
    await _partitions(consumer, name)
    consumer.assign([partition])
    await consumer.seek_to_end(partition)
    await consumer.position(partition)
    waiting: dict[bytes, asyncio.Future[float]] = {}

    async def read() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            now = time.perf_counter()
            for records in batches.values():
                for record in records:
                    future = waiting.pop(record.value or b"", None)
                    if future is not None and not future.done():
                        future.set_result(now)

    reader = asyncio.create_task(read())
    samples: list[float] = []
    try:
        for index in range(count + 5):
            if idle_s:
                await asyncio.sleep(random.uniform(0, idle_s))
            value = f"{uuid.uuid4().hex}-{index}".encode()
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            waiting[value] = future
            started = time.perf_counter()
            await producer.send_and_wait(name, value)
            received = await asyncio.wait_for(future, 30.0)
            if index >= 5:
                samples.append(received - started)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await consumer.stop()
        await producer.stop()
    return samples


async def _replay(uri: str, paths: list[tuple[Run, list[Span]]], system: System) -> dict[str, list[float]]:
    """Each run's commands again, one at a time, on the owner's backends over a fresh database."""
    database = f"bench_replay_{uuid.uuid4().hex[:8]}"
    store = await MongoStore.connect(uri, database)
    memory = await MongoMemoryStore.open(store.client, database)
    durations: dict[str, list[float]] = defaultdict(list)
    try:
        for run, spans in paths:
            await store.create_session(run.session_id, system.session_created[run.session_id])
            for span in spans:
                assert span.command is not None
                backend: object = memory if span.command.backend is Backend.MEMORY else store
                started = time.perf_counter()
                await getattr(backend, span.command.method)(**span.command.arguments())
                durations[span.op].append(time.perf_counter() - started)
    finally:
        await store.drop_database()
        await memory.close()
        await store.close()
    return durations


# --- measuring -------------------------------------------------------------------------------------


def _within(spans: list[Span], start: float, end: float) -> list[Span]:
    return [span for span in spans if start <= span.started < end]


@dataclass
class Sequential:
    runs: list[Run]
    cpu_s: dict[str, float]
    wall_s: float


async def _sequential(system: System, count: int) -> Sequential:
    sessions = [await system.new_session() for _ in range(count)]
    before = system.cpu()
    started = time.perf_counter()
    runs = [await system.run(session_id) for session_id in sessions]
    wall = time.perf_counter() - started
    after = system.cpu()
    await asyncio.sleep(0.5)  # the last RecordRunTerminal's reply may land after its event
    return Sequential(runs, {name: after[name] - before[name] for name in after}, wall)


@dataclass
class Concurrent:
    latencies: list[float]
    wall_s: float
    cpu_s: dict[str, float]
    planner_commands_in_flight: float
    """Mean number of the planner's commands under way (sum of their durations / wall)."""
    owner_busy: float
    """Share of the wall time the owner spent inside its backends (it applies one at a time)."""
    command_ms: float
    backend_op_ms: float


async def _concurrent(system: System) -> Concurrent:
    sessions = [[await system.new_session() for _ in range(RUNS_PER_SESSION)] for _ in range(SESSIONS)]
    latencies: list[float] = []

    async def client(own: list[str]) -> None:
        for session_id in own:
            latencies.append((await system.run(session_id)).seconds)

    before = system.cpu()
    started = time.perf_counter()
    await asyncio.gather(*(client(own) for own in sessions))
    ended = time.perf_counter()
    after = system.cpu()
    wall = ended - started
    planner = [span.duration for span in _within(system.planner_store.spans, started, ended)]
    owner = [span.duration for span in _within(system.owner_spans, started, ended)]
    return Concurrent(
        latencies,
        wall,
        {name: after[name] - before[name] for name in after},
        sum(planner) / wall,
        sum(owner) / wall,
        _ms(statistics.mean(planner)),
        _ms(statistics.mean(owner)),
    )


async def _idle_cpu(system: System) -> dict[str, float]:
    """Share of a core each process uses with the services up and nothing to do."""
    before = system.cpu()
    await asyncio.sleep(IDLE_CPU_S)
    after = system.cpu()
    return {name: (after[name] - before[name]) / IDLE_CPU_S for name in after}


def _paths(system: System, runs: list[Run]) -> list[tuple[Run, list[Span]]]:
    """Each sequential run with the planner commands sent between its request and its end."""
    return [(run, _within(system.planner_store.spans, run.published, run.ended)) for run in runs]


@dataclass
class Step:
    """Commands the planner has under way at once (the memory context sends two together)."""

    spans: list[Span]

    @property
    def started(self) -> float:
        return self.spans[0].started

    @property
    def ended(self) -> float:
        return max(span.ended for span in self.spans)


def _steps(spans: list[Span]) -> list[Step]:
    """The run's commands grouped into steps: a command sent before the previous one was answered
    joins its step. On the path a step costs 2 hops plus its operations (the owner applies them
    one at a time)."""
    steps: list[Step] = []
    for span in sorted(spans, key=lambda span: span.started):
        if steps and span.started < steps[-1].ended:
            steps[-1].spans.append(span)
        else:
            steps.append(Step([span]))
    return steps


def _breakdown(system: System, paths: list[tuple[Run, list[Span]]]) -> dict[str, float]:
    """Where one sequential run's time goes: the mean of each span over the runs, ms.

    Means, so that the spans add up: request -> first step, the steps but the last, the gaps
    between steps (planner, model, answer-text publishes, and once the tool round trip), and
    terminal command -> event (command hop, RecordRunTerminal, event hop). Each step is split at
    the owner's backend calls: send -> first backend call starts (hop + owner decoding), inside
    the backends, and last backend call done -> reply resolved at the planner (owner reply
    publish + hop + client decoding); in a step of two, the second waits at the owner (the rest).
    """
    rows: dict[str, list[float]] = defaultdict(list)
    for run, spans in paths:
        start, end = run.published, run.ended
        steps = _steps(spans)
        body, last = steps[:-1], steps[-1]
        to_owner = from_owner = inside = 0.0
        for step in body:
            applied = _within(system.owner_spans, step.started, step.ended)
            if applied:
                to_owner += applied[0].started - step.started
                inside += sum(backend.duration for backend in applied)
                from_owner += step.ended - applied[-1].ended
        steps_time = sum(step.ended - step.started for step in body)
        gaps = [b.started - a.ended for a, b in itertools.pairwise(steps)]
        tool = max(gaps)
        model = sum(span.duration for span in _within(system.model.spans, start, end))
        publishes = sum(span.duration for span in _within(system.model.publishes, start, end))
        rows["total"].append(run.seconds)
        rows["request -> first command"].append(steps[0].started - start)
        rows["steps but the last (commands and replies)"].append(steps_time)
        rows["  send -> owner's backend starts"].append(to_owner)
        rows["  inside the owner's backends"].append(inside)
        rows["  backend done -> reply at the planner"].append(from_owner)
        rows["  the rest (a step's 2nd command waits)"].append(steps_time - to_owner - inside - from_owner)
        rows["gaps between steps"].append(sum(gaps))
        rows["  tool round trip (largest gap)"].append(tool)
        rows["  model (ScriptedModel)"].append(model - publishes)
        rows["  answer-text publishes (awaited)"].append(publishes)
        rows["  planner, other"].append(sum(gaps) - tool - model)
        rows["terminal command -> event"].append(end - last.started)
    return {name: _ms(statistics.mean(values)) for name, values in rows.items()}


async def measure_runs(profile: bool = False) -> dict[str, float]:
    """The agent-loop figures of `bench/results/latest.json` (`profile`: also cProfile 20 runs)."""
    # The services' INFO lines (one per tool call) would bury the figures; WARNING keeps errors.
    configure_logging(ServiceSettings(log_level="WARNING"))
    print(DEFINITIONS)
    _STARTED[0] = time.perf_counter()
    load = [os.getloadavg()[0]]
    with EmbeddedStack() as stack:
        async with _system(stack) as system:
            for _ in range(WARMUP_RUNS):
                await system.run(await system.new_session())
            idle = await _idle_cpu(system)
            _progress("warm-up runs")
            hops_idle = await _raw_hops(system.settings, RAW_HOPS, IDLE_GAP_S)
            hops_back_to_back = await _raw_hops(system.settings, RAW_HOPS, 0.0)
            _progress("raw hops")
            sequential = await _sequential(system, SEQUENTIAL_RUNS)
            paths = _paths(system, sequential.runs)
            _progress("sequential runs")
            replayed = await _replay(stack.mongo_uri, paths[:REPLAYED_RUNS], system)
            _progress("commands replayed")
            concurrent = await _concurrent(system)
            _progress(f"{SESSIONS} sessions")
            load.append(os.getloadavg()[0])
            if profile:
                await _profiled(system)
    op_p50 = {op: statistics.median(values) for op, values in replayed.items()}
    shapes = Counter(tuple(span.op for span in spans) for _, spans in paths)
    shape = shapes.most_common(1)[0][0]
    path_ops = Counter(shape)
    store_floor = sum(op_p50[op] * count for op, count in path_ops.items())
    step_counts = Counter(len(_steps(spans)) for _, spans in paths)
    hops = 2 * step_counts.most_common(1)[0][0] + 3
    hop_p50 = statistics.median(hops_idle)
    raw = hops * hop_p50 + store_floor
    latencies = [run.seconds for run in sequential.runs]
    p50 = statistics.median(latencies)
    breakdown = _breakdown(system, paths)
    _print_details(system, breakdown, sequential, op_p50, path_ops, shapes, concurrent, idle, hop_p50, hops)
    runs = len(concurrent.latencies)
    return {
        "run_overhead_p50_ms": _ms(p50),
        "run_overhead_p99_ms": _ms(_p(latencies, 0.99)),
        "raw_hops_p50_ms": _ms(raw),
        "run_overhead_vs_hops_ratio": p50 / raw,
        "runs_per_s_50_sessions": runs / concurrent.wall_s,
        "run_overhead_p50_ms_50_sessions": _ms(statistics.median(concurrent.latencies)),
        "run_overhead_p99_ms_50_sessions": _ms(_p(concurrent.latencies, 0.99)),
        "run_store_ops_on_path": float(len(shape)),
        "run_kafka_hops_on_path": float(hops),
        "raw_hop_p50_ms": _ms(hop_p50),
        "raw_hop_p99_ms": _ms(_p(hops_idle, 0.99)),
        "raw_hop_back_to_back_p50_ms": _ms(statistics.median(hops_back_to_back)),
        "raw_store_ops_on_path_p50_ms": _ms(store_floor),
        "run_cpu_ms_bench_process": _ms(sequential.cpu_s["bench"] / len(latencies)),
        "run_cpu_ms_bench_process_50_sessions": _ms(concurrent.cpu_s["bench"] / runs),
        "run_idle_cpu_pct_bench_process": 100 * idle["bench"],
        "run_bench_load_avg_1m": max(load),
    }


def _print_details(
    system: System,
    breakdown: dict[str, float],
    sequential: Sequential,
    op_p50: dict[str, float],
    path_ops: Counter[str],
    shapes: Counter[tuple[str, ...]],
    concurrent: Concurrent,
    idle: dict[str, float],
    hop_p50: float,
    hops: int,
) -> None:
    commands = sum(path_ops.values())
    print(f"\none sequential run, mean of each span (ms); {commands} commands on the path:")
    for name, value in breakdown.items():
        print(f"  {name:44s} {value:8.1f}")
    hop = _ms(hop_p50)
    print(f"  (raw hop p50 {hop:.2f} ms; x {hops // 2 - 2} steps but the last: {hop * (hops // 2 - 2):.1f})")
    owner_ops = statistics.median(
        len(_within(system.owner_spans, run.published, run.ended)) for run in sequential.runs
    )
    print(f"  (the owner applied {owner_ops:g} operations per run window, p50)")
    print("path shapes seen (runs: commands in order):")
    for order, seen in shapes.most_common():
        print(f"  {seen}: {' '.join(order)}")
    print("commands replayed on the backends, p50 ms x count on the most common path:")
    for op, count in sorted(path_ops.items()):
        print(f"  {op:44s} {_ms(op_p50[op]):8.2f} x {count}")
    runs = len(concurrent.latencies)
    count = len(sequential.runs)
    print("CPU: idle share of a core | ms per run sequential | ms per run, 50 sessions:")
    for name in sequential.cpu_s:
        per_run = (_ms(sequential.cpu_s[name] / count), _ms(concurrent.cpu_s[name] / runs))
        print(f"  {name:44s} {idle[name]:6.0%} | {per_run[0]:8.1f} | {per_run[1]:8.1f}")
    print(
        f"50 sessions: {runs} runs in {concurrent.wall_s:.1f} s; planner commands in flight "
        f"{concurrent.planner_commands_in_flight:.2f} (mean {concurrent.command_ms:.1f} ms each); "
        f"owner inside its backends {concurrent.owner_busy:.0%} of the time "
        f"({concurrent.backend_op_ms:.1f} ms an op); "
        f"bench process at {concurrent.cpu_s['bench'] / concurrent.wall_s:.0%} of a core"
    )


async def _profiled(system: System) -> None:
    """Sequential runs under cProfile (CPU time): the process's CPU by function and by package."""
    sessions = [await system.new_session() for _ in range(20)]
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for session_id in sessions:
        await system.run(session_id)
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    print(stream.getvalue())
    by_package: dict[str, float] = defaultdict(float)
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_package[_package(filename)] += tottime
    total = sum(by_package.values())
    print(
        f"CPU by package over 20 runs ({total:.2f} s, {total / 20 * 1000:.1f} ms a run, cProfile inflated):"
    )
    for name, seconds in sorted(by_package.items(), key=lambda item: -item[1])[:25]:
        print(f"  {name:44s} {seconds / 20 * 1000:7.2f} ms a run  {seconds / total:6.1%}")


def _package(filename: str) -> str:
    marker = "site-packages/"
    if marker in filename:
        return filename.split(marker, 1)[1].split("/", 1)[0]
    for root in ("/services/", "/contracts/", "/bench/", "/deploy/"):
        if root in filename:
            rest = filename.split(root, 1)[1]
            return root.strip("/") + "." + rest.split("/", 1)[0].removesuffix(".py")
    if filename.startswith("<") or "/lib/python" in filename:
        return "stdlib/" + filename.rsplit("/", 1)[-1]
    return filename


if __name__ == "__main__":
    from bench.report import print_table

    print_table(asyncio.run(measure_runs(profile="--profile" in sys.argv)))
