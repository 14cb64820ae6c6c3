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
  included), in S steps: they follow one another, except that a turn's first step sends three at
  once (the session owner check, ClaimSessionForTurn, beside the memory context's LoadSummary and
  HistoryTail: one step, 2 hops, the operations applied in turn by the owner), and that a new
  turn's first step is sent behind its start before the start is answered (the planner pipelines
  the start: one step, both applied in turn by the owner, the step only on the log the start
  wrote). H = 2S + 3 - D Kafka hops: 1 request (runs.requested -> planner) + 2 per step but the
  last (commands -> owner, replies -> planner) + 1 for the terminal command + 1 for the terminal
  event (owner -> reader; the terminal reply is off the path) + 2 for the tool (tools.calls ->
  executor, tools.results -> planner), less 1 for each of the D steps whose command carries the
  tool calls (the owner publishes them after the commit: the run goes on through the call, and
  that step's reply travels beside the call and the tool, off the path).
- Answer path: the same count for a plain turn ("hello" in a fresh session: the model answers at
  once, no tool), measured over its own sequential runs: H = 2S + 1 (no tool hops, no step
  carrying calls). Its first answer closes the run, so its terminal is its first write after the
  start, sent behind the start before the start is answered (RecordRunTerminal `follows`): the
  start and the terminal are one step. `answer_run_kafka_hops_on_path`,
  `answer_run_store_ops_on_path`, `answer_run_store_writes_on_path`, `answer_run_overhead_p50_ms`
  and p99 are the one-tool run's figures for that turn.
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

Then 50 sessions run at once, each client running four turns back to back (a fresh session per run,
created beforehand, so every run is the same first turn; 200 runs): runs/s and p50/p99 under load.
The CPU of those runs, per run, is read for each process (this one with every service, the
broker, the database): `run_cpu_ms_all_processes_50_sessions` is their sum, and
`runs_per_s_cpu_bound_50_sessions` = cores x 1000 / that sum, the rate at which the box's cores
would be full: what 50 sessions can reach on this machine however the path is shaped.
Every Kafka request this process sends (the services in it, and the bench's own producer, run-end
watcher and store client) is counted by kind (bench/kafka_requests): `run_kafka_fetches_per_run`
and `run_kafka_requests_per_run` over the sequential runs, `run_kafka_fetches_per_run_50_sessions`
over the 50 sessions. Exact counts, but a waiting consumer fetches every `fetch_max_wait_ms`
(Tansu), so a run that takes longer on a busy box sends more: compare them side by side.
`run_db_commands_per_run`: every command the owner's database client sent during the sequential
runs (a pymongo command listener), per run; exact and independent of the box's speed.
`python -m bench.run_bench --profile` also runs 20 sequential runs under cProfile (CPU time).
`run_bench_box_ms`: what a fixed piece of pure-Python work took this process, before and after
the sequential runs (the larger): on a shared machine every span of a run moves with it, so
figures of two benches compare only at a like figure (bench/run_instruments.box_ms).
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import itertools
import os
import pstats
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from bench.kafka_requests.sitecustomize import count_requests
from bench.run_instruments import STARTED, Span, box_ms, progress, quantile, to_ms
from bench.run_system import ANSWER_TEXT, TEXT, Run, System, raw_hops, replay, started_system
from quipu.contracts.commands import AppendRunRecords
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import ServiceSettings

WARMUP_RUNS = 5
SEQUENTIAL_RUNS = 40
ANSWER_RUNS = 20
REPLAYED_RUNS = 20
SESSIONS = 50
RUNS_PER_SESSION = 4
"""Runs each of the 50 clients makes, one after another: 200 in all, a few seconds, so that one slow
spell of the box does not set the figure alone."""
RAW_HOPS = 150
IDLE_GAP_S = 0.020
IDLE_CPU_S = 2.0
WRITE_OPS = ("start_", "append_run_record", "record_run_")
"""Store methods that write a run (prefixes): the path's store writes are its commands calling them."""

DEFINITIONS = """\
run_overhead     publish RunRequested -> the run's terminal `workflow` event read on runs.events
                 ("calculate 6*7" in a fresh session: ScriptedModel, one calculator call, answer)
critical path    N = planner commands (runtime + memory, timed in its KafkaStore) sent before the
                 terminal event, in S steps (commands under way together are one step: the
                 owner check and memory read, a pipelined start and the first step sent behind it);
                 H = 1 request + 2 per step but the last + 1 terminal command + 1 terminal event
                 + 2 tool (call, result) - 1 per step whose command carries the tool calls (the
                 owner publishes them; its reply is off the path) = 2S + 3 - D hops, plus N store
                 operations, of which W are runtime-store writes (starts, appends, cancellation,
                 suspension, terminal)
answer path      the same for a plain turn ("hello": answered at once, no tool), own sequential
                 runs: H = 2S + 1 (its terminal is sent behind its pipelined start: one step)
raw hop          aiokafka send_and_wait -> group-less consumer, same client settings, own topic,
                 0-20 ms idle before each send (the path's consumers wait in a fetch)
store op         the runs' own commands (20 runs) replayed one at a time on MongoStore and
                 MongoMemoryStore (fresh database, same server)
raw_hops_p50_ms  H x p50(raw hop) + sum over the N commands of p50(that operation, replayed)
ratio            run_overhead_p50 / raw_hops_p50 (target <= 1.5)
kafka requests   every request this process's Kafka clients send (services and the bench's own),
                 exact, per run: run_kafka_fetches_per_run (Fetch) and run_kafka_requests_per_run
                 (every kind) over the sequential runs; run_kafka_fetches_per_run_50_sessions
database         every command the owner's database client sends (finds, writes, commits),
                 exact, per sequential run: run_db_commands_per_run"""


# --- measuring -------------------------------------------------------------------------------------


def _within(spans: list[Span], start: float, end: float) -> list[Span]:
    return [span for span in spans if start <= span.started < end]


@dataclass
class Sequential:
    runs: list[Run]
    cpu_s: dict[str, float]
    wall_s: float
    requests: Counter[str]
    """This process's Kafka requests during the runs, by kind."""
    database_commands: Counter[str]
    """The owner's database commands during the runs, by name (and collection)."""


async def _sequential(system: System, count: int, requests: Counter[str], text: str = TEXT) -> Sequential:
    sessions = [await system.new_session() for _ in range(count)]
    before, requests_before = system.cpu(), requests.copy()
    commands_before = system.database_commands.counts.copy()
    started = time.perf_counter()
    runs = [await system.run(session_id, text) for session_id in sessions]
    wall = time.perf_counter() - started
    after, requests_after = system.cpu(), requests.copy()
    commands = system.database_commands.counts - commands_before
    await asyncio.sleep(0.5)  # the last RecordRunTerminal's reply may land after its event
    cpu = {name: after[name] - before[name] for name in after}
    return Sequential(runs, cpu, wall, requests_after - requests_before, commands)


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
    requests: Counter[str]
    """This process's Kafka requests during the runs, by kind."""


async def _concurrent(system: System, requests: Counter[str]) -> Concurrent:
    sessions = [[await system.new_session() for _ in range(RUNS_PER_SESSION)] for _ in range(SESSIONS)]
    latencies: list[float] = []

    async def client(own: list[str]) -> None:
        for session_id in own:
            latencies.append((await system.run(session_id)).seconds)

    before, requests_before = system.cpu(), requests.copy()
    started = time.perf_counter()
    await asyncio.gather(*(client(own) for own in sessions))
    ended = time.perf_counter()
    after, requests_after = system.cpu(), requests.copy()
    wall = ended - started
    planner = [span.duration for span in _within(system.planner_store.spans, started, ended)]
    owner = [span.duration for span in _within(system.owner_spans, started, ended)]
    return Concurrent(
        latencies,
        wall,
        {name: after[name] - before[name] for name in after},
        sum(planner) / wall,
        sum(owner) / wall,
        to_ms(statistics.mean(planner)),
        to_ms(statistics.mean(owner)),
        requests_after - requests_before,
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
    """Commands the planner has under way at once (the owner check and the memory read go together)."""

    spans: list[Span]

    @property
    def started(self) -> float:
        return self.spans[0].started

    @property
    def ended(self) -> float:
        return max(span.ended for span in self.spans)


def _steps(spans: list[Span]) -> list[Step]:
    """The run's commands grouped into steps: a command sent before any command of the step under
    way was answered joins it (sent together, so it waited on none of them); one sent after an
    answer depends on it and opens the next step, even while the step's other commands are still
    under way (the owner check's second command while the memory read goes on). On the path a
    step costs 2 hops plus its operations (the owner applies them one at a time)."""
    steps: list[Step] = []
    for span in sorted(spans, key=lambda span: span.started):
        if steps and span.started < min(sent.ended for sent in steps[-1].spans):
            steps[-1].spans.append(span)
        else:
            steps.append(Step([span]))
    return steps


def carries_calls(step: Step) -> bool:
    """Whether a step's command carries tool calls for the owner to publish (the outbox)."""
    return any(isinstance(span.command, AppendRunRecords) and span.command.calls for span in step.spans)


def path_hops(spans: list[Span], tool_round_trips: int = 1) -> int:
    """The Kafka hops on a run's path: the module docstring's H = 2S + 3 - D for the one-tool run,
    2S + 1 for a plain turn (2 hops a tool round trip)."""
    steps = _steps(spans)
    return 2 * len(steps) + 1 + 2 * tool_round_trips - sum(carries_calls(step) for step in steps[:-1])


@dataclass
class PathFigures:
    """A sequential set of runs' critical path, counted by its most common shape."""

    shapes: Counter[tuple[str, ...]]
    shape: tuple[str, ...]
    hops: int
    latencies: list[float]

    @classmethod
    def of(cls, paths: list[tuple[Run, list[Span]]], tool_round_trips: int) -> PathFigures:
        shapes = Counter(tuple(span.op for span in spans) for _, spans in paths)
        hops = Counter(path_hops(spans, tool_round_trips) for _, spans in paths).most_common(1)[0][0]
        latencies = [run.seconds for run, _ in paths]
        return cls(shapes, shapes.most_common(1)[0][0], hops, latencies)

    @property
    def writes(self) -> int:
        return sum(op.startswith(WRITE_OPS) for op in self.shape)


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
        closing = _within(system.owner_spans, last.started, end)
        if closing:
            rows["  command -> its backend call starts"].append(closing[0].started - last.started)
            rows["  inside RecordRunTerminal's backend call"].append(
                sum(backend.duration for backend in closing)
            )
            rows["  backend done -> event read"].append(end - closing[-1].ended)
    return {name: to_ms(statistics.mean(values)) for name, values in rows.items()}


async def measure_runs(profile: bool = False) -> dict[str, float]:
    """The agent-loop figures of `bench/results/latest.json` (`profile`: also cProfile 20 runs)."""
    # The services' INFO lines (one per tool call) would bury the figures; WARNING keeps errors.
    configure_logging(ServiceSettings(log_level="WARNING"))
    print(DEFINITIONS)
    STARTED[0] = time.perf_counter()
    load = [os.getloadavg()[0]]
    requests = count_requests()
    with EmbeddedStack() as stack:
        async with started_system(stack) as system:
            for _ in range(WARMUP_RUNS):
                await system.run(await system.new_session())
            idle = await _idle_cpu(system)
            progress("warm-up runs")
            hops_idle = await raw_hops(system.settings, RAW_HOPS, IDLE_GAP_S)
            hops_back_to_back = await raw_hops(system.settings, RAW_HOPS, 0.0)
            progress("raw hops")
            box = [box_ms()]
            sequential = await _sequential(system, SEQUENTIAL_RUNS, requests)
            box.append(box_ms())
            paths = _paths(system, sequential.runs)
            progress("sequential runs")
            answers = PathFigures.of(
                _paths(system, (await _sequential(system, ANSWER_RUNS, requests, ANSWER_TEXT)).runs), 0
            )
            progress("sequential plain turns")
            replayed = await replay(stack.mongo_uri, paths[:REPLAYED_RUNS], system)
            progress("commands replayed")
            concurrent = await _concurrent(system, requests)
            progress(f"{SESSIONS} sessions")
            load.append(os.getloadavg()[0])
            if profile:
                await _profiled(system)
    op_p50 = {op: statistics.median(values) for op, values in replayed.items()}
    tool_run = PathFigures.of(paths, 1)
    shape, hops, latencies = tool_run.shape, tool_run.hops, tool_run.latencies
    path_ops = Counter(shape)
    store_floor = sum(op_p50[op] * count for op, count in path_ops.items())
    hop_p50 = statistics.median(hops_idle)
    raw = hops * hop_p50 + store_floor
    p50 = statistics.median(latencies)
    breakdown = _breakdown(system, paths)
    _print_details(
        system, breakdown, sequential, op_p50, path_ops, tool_run.shapes, concurrent, idle, hop_p50, hops
    )
    print("plain-turn path shapes seen (runs: commands in order):")
    for order, seen in answers.shapes.most_common():
        print(f"  {seen}: {' '.join(order)}")
    runs = len(concurrent.latencies)
    all_cpu_per_run = sum(concurrent.cpu_s.values()) / runs
    return {
        "run_overhead_p50_ms": to_ms(p50),
        "run_overhead_p99_ms": to_ms(quantile(latencies, 0.99)),
        "raw_hops_p50_ms": to_ms(raw),
        "run_overhead_vs_hops_ratio": p50 / raw,
        "runs_per_s_50_sessions": runs / concurrent.wall_s,
        "run_overhead_p50_ms_50_sessions": to_ms(statistics.median(concurrent.latencies)),
        "run_overhead_p99_ms_50_sessions": to_ms(quantile(concurrent.latencies, 0.99)),
        "run_store_ops_on_path": float(len(shape)),
        "run_store_writes_on_path": float(tool_run.writes),
        "run_kafka_hops_on_path": float(hops),
        "answer_run_overhead_p50_ms": to_ms(statistics.median(answers.latencies)),
        "answer_run_overhead_p99_ms": to_ms(quantile(answers.latencies, 0.99)),
        "answer_run_store_ops_on_path": float(len(answers.shape)),
        "answer_run_store_writes_on_path": float(answers.writes),
        "answer_run_kafka_hops_on_path": float(answers.hops),
        "raw_hop_p50_ms": to_ms(hop_p50),
        "raw_hop_p99_ms": to_ms(quantile(hops_idle, 0.99)),
        "raw_hop_back_to_back_p50_ms": to_ms(statistics.median(hops_back_to_back)),
        "raw_store_ops_on_path_p50_ms": to_ms(store_floor),
        "run_cpu_ms_bench_process": to_ms(sequential.cpu_s["bench"] / len(latencies)),
        "run_cpu_ms_bench_process_50_sessions": to_ms(concurrent.cpu_s["bench"] / runs),
        "run_idle_cpu_pct_bench_process": 100 * idle["bench"],
        "run_kafka_fetches_per_run": sequential.requests["Fetch"] / len(latencies),
        "run_kafka_requests_per_run": sequential.requests.total() / len(latencies),
        "run_db_commands_per_run": sequential.database_commands.total() / len(latencies),
        "run_kafka_fetches_per_run_50_sessions": concurrent.requests["Fetch"] / runs,
        "run_cpu_ms_all_processes_50_sessions": to_ms(all_cpu_per_run),
        "runs_per_s_cpu_bound_50_sessions": (os.cpu_count() or 1) / all_cpu_per_run,
        "run_bench_load_avg_1m": max(load),
        "run_bench_box_ms": max(box),
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
    hop = to_ms(hop_p50)
    print(f"  (raw hop p50 {hop:.2f} ms; x {hops} hops on the path: {hop * hops:.1f})")
    owner_ops = statistics.median(
        len(_within(system.owner_spans, run.published, run.ended)) for run in sequential.runs
    )
    print(f"  (the owner applied {owner_ops:g} operations per run window, p50)")
    print("path shapes seen (runs: commands in order):")
    for order, seen in shapes.most_common():
        print(f"  {seen}: {' '.join(order)}")
    print("commands replayed on the backends, p50 ms x count on the most common path:")
    for op, count in sorted(path_ops.items()):
        print(f"  {op:44s} {to_ms(op_p50[op]):8.2f} x {count}")
    runs = len(concurrent.latencies)
    count = len(sequential.runs)
    print("CPU: idle share of a core | ms per run sequential | ms per run, 50 sessions:")
    for name in sequential.cpu_s:
        per_run = (to_ms(sequential.cpu_s[name] / count), to_ms(concurrent.cpu_s[name] / runs))
        print(f"  {name:44s} {idle[name]:6.0%} | {per_run[0]:8.1f} | {per_run[1]:8.1f}")
    print(
        f"50 sessions: {runs} runs in {concurrent.wall_s:.1f} s; planner commands in flight "
        f"{concurrent.planner_commands_in_flight:.2f} (mean {concurrent.command_ms:.1f} ms each); "
        f"owner inside its backends {concurrent.owner_busy:.0%} of the time "
        f"({concurrent.backend_op_ms:.1f} ms an op); "
        f"bench process at {concurrent.cpu_s['bench'] / concurrent.wall_s:.0%} of a core"
    )
    print("Kafka requests per run, this process (exact) | sequential | 50 sessions:")
    for kind, _ in (sequential.requests + concurrent.requests).most_common():
        per_run = (sequential.requests[kind] / count, concurrent.requests[kind] / runs)
        print(f"  {kind:44s} {per_run[0]:8.1f} | {per_run[1]:8.1f}")
    print("the owner's database commands per run (exact), sequential:")
    for name, seen in sequential.database_commands.most_common():
        print(f"  {name:44s} {seen / count:8.1f}")


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
