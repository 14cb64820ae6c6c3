"""Services as they are deployed, in processes of their own: idle CPU, load, scaling, isolation.

Every figure comes from child processes on a fresh topic prefix of the embedded stack
(bench.fleet), loaded from this process; `python -m bench.fleet_bench [SCENARIO...]` runs some
of them (idle, load, scaling, planner, executor, isolation) and merges their keys into
bench/results/latest.json, `make bench` runs them all. The box is shared: each scenario reports
the 1-minute load average it ran under (`*_load_avg_1m`).

- idle: every service of the catalog in its own process (`python -m quipu.services.<name>`, the
  gateway included), one warm-up run, then nothing to do for `IDLE_WINDOW_S`:
  `idle_cpu_pct_all_services` is the CPU time of every service process and the broker (Tansu)
  over the window, as a share of one core; `_services` and `_broker` split it.
  `idle_kafka_requests_per_s` (`_fetches_`, `_heartbeats_`) counts what the services send the
  broker over the same window, exactly (bench/kafka_requests): unlike CPU, it does not move with
  the box's load. What idling
  costs: `idle_run_after_quiet_p50_ms`, a run after `QUIET_S` of quiet, against
  `idle_run_back_to_back_p50_ms` (`QUIET_RUNS` runs each). Then `IDLE_STREAMS` live event
  streams are opened in this process through one `EventFeed`, as the gateway serves its SSE
  clients, on sessions with nothing to show, once the runs' clients are
  closed:
  `idle_cpu_pct_with_open_streams` is the same share with them open, this process's included.
- load: every service in one process (`quipu up` without `--processes`): `LOAD_SESSIONS`
  clients at once, each running one turn in a fresh session ("calculate 6*7", the scripted
  model, one calculator call): `load_runs_per_s_200_sessions`, `load_overhead_p50_ms` /
  `_p99_ms` (publish RunRequested -> its terminal event on runs.events), and
  `rss_mb_all_services`, that process's peak resident memory (VmHWM) at the end of the load.
- scaling: owner, planner and default executor each in its own process; runs/s with
  `SCALING_SESSIONS` clients running `SCALING_RUNS_PER_SESSION` turns each, first with one copy of
  each, then with a second planner (`planner_scaling_2v1` = runs/s 2 planners / 1), then with a
  second owner as well (`owner_scaling_2v1` = runs/s 2 owners / 1, both with 2 planners). Each
  step waits until the consumer groups are stable with the new copy in them.
- planner: the same three processes, but the planner's model takes `MODEL_CALL_S` to answer (the
  scripted model's `QUIPU_MODEL_SCRIPTED_LATENCY_S`, as a remote model would) and each planner copy
  handles `MODEL_IN_FLIGHT` messages a topic at once, so a copy's model calls, not the box's CPU,
  bound its runs/s: `planner_scaling_2v1_model_bound` = runs/s 2 planners / 1. With the instant
  model of `scaling`, the whole deployment is CPU-bound on a small box and no second copy of
  anything can add runs/s; this is the limit a planner copy has in use.
- executor: the bench's I/O-bound toolset (`wait_io`, `IO_CALL_MS` of awaiting) on dedicated
  executors, each copy taking `IO_IN_FLIGHT` calls at once, so one copy answers at most
  IO_IN_FLIGHT / IO_CALL_MS calls a second: `IO_CALLS` calls published at once, answered first
  by one copy then by two (`tool_executor_scaling_2v1` = calls/s 2 copies / 1). Both copies have
  answered before the second measure starts (each answer names its process).
- isolation: a slow and a fast toolset served by one process (as an App serves its toolsets).
  The fast one's call round trip (publish -> result on tools.results) p50 with the slow one idle
  (before and after) and with it busy (`SLOW_BUSY` calls of `SLOW_CALL_MS` kept in flight, more
  than its executor takes at once): `toolset_isolation_fast_p50_ms_with_slow_busy` /
  `_alone` and their ratio `toolset_isolation_ratio` (1 = the slow toolset costs the fast nothing).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from bench.fleet import Fleet, Runs, ToolCalls, fleet, rss_mb
from bench.report import Figures
from bench.run_instruments import progress, to_ms
from bench.toolsets import fast, io_bound, slow
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services import catalog
from quipu.services.kit.event_feed import EventFeed, FedStream
from quipu.services.kit.run_events import StartAt

IDLE_SETTLE_S = 3.0
"""After the warm-up run, time for its follow-ups (transcript, facts, enrichment) to finish."""
IDLE_WINDOW_S = 10.0
QUIET_S = 3.0
"""Longer than the embedded `idle_after_s`: every consumer fetches with its idle wait."""
QUIET_RUNS = 5
IDLE_STREAMS = 10
"""Live event streams open with nothing to show (UIs left open)."""

LOAD_SESSIONS = 200
LOAD_DEADLINE_S = 120.0

SCALING_SESSIONS = 16
SCALING_RUNS_PER_SESSION = 2
SCALING_DEADLINE_S = 60.0
WARMUP_RUNS = 3

MODEL_CALL_S = 0.5
MODEL_IN_FLIGHT = 2
MODEL_BOUND_RUNS_PER_SESSION = 6
"""More turns than `scaling`'s: at a few runs/s a copy, the first and last runs' ramp would weigh."""

IO_CALL_MS = 200
IO_IN_FLIGHT = 4
IO_CALLS = 160

FAST_CALLS = 60
SLOW_CALL_MS = 1500
SLOW_BUSY = 48
"""Slow calls kept in flight: more than the executor's default 32 at once, so some wait."""

GROUPS: dict[str, list[str]] = {
    service.name: [group for group, _ in service.consumes] for service in catalog.CONSUMING
}
"""Each consuming service's consumer groups (default names)."""


def _load() -> float:
    return os.getloadavg()[0]


def _settled_groups(services: dict[str, int]) -> dict[str, int]:
    return {group: copies for name, copies in services.items() for group in GROUPS[name]}


async def _warm(runs: Runs, count: int = WARMUP_RUNS) -> None:
    for session_id in await runs.sessions(count):
        await runs.run(session_id, timeout_s=120.0)


async def measure_idle(stack: EmbeddedStack) -> Figures:
    """Every service in its own process and the broker, nothing to do: CPU share of one core."""
    async with fleet(stack) as running:
        for service in catalog.SERVICES:
            running.service(service.name)
        await running.settled(_settled_groups(dict.fromkeys(GROUPS, 1)))
        async with Runs(running.settings) as runs:
            await _warm(runs, 1)
            await asyncio.sleep(IDLE_SETTLE_S)
            load = _load()
            requests_before, before = await running.kafka_requests(), running.cpu()
            await asyncio.sleep(IDLE_WINDOW_S)
            after, requests_after = running.cpu(), await running.kafka_requests()
            # What idling costs: a run after a quiet spell (every consumer idle) against runs back to back.
            after_quiet = []
            for session_id in await runs.sessions(QUIET_RUNS):
                await asyncio.sleep(QUIET_S)
                after_quiet.append(await runs.run(session_id))
            back_to_back = [await runs.run(session_id) for session_id in await runs.sessions(QUIET_RUNS)]
        # After the runs' own clients are gone: this process's CPU is then the streams'.
        with_streams = await _idle_with_streams(running, [f"idle-stream-{n}" for n in range(IDLE_STREAMS)])
        running.check_alive()
    shares = {name: 100 * (after[name] - before[name]) / IDLE_WINDOW_S for name in after}
    print(f"\nidle, every service in its own process ({IDLE_WINDOW_S:g} s window, % of one core):")
    for name, share in sorted(shares.items(), key=lambda item: -item[1]):
        print(f"  {name:44s} {share:6.1f}")
    print(
        f"  a run after {QUIET_S:g} s of quiet: p50 {to_ms(statistics.median(after_quiet)):.0f} ms; "
        f"back to back {to_ms(statistics.median(back_to_back)):.0f} ms ({QUIET_RUNS} runs each)"
    )
    requests = {name: requests_after[name] - requests_before.get(name, Counter()) for name in requests_after}
    by_kind = sum(requests.values(), Counter())
    print(f"  Kafka requests a second (exact): {by_kind.total() / IDLE_WINDOW_S:.1f}")
    for name, counts in sorted(requests.items(), key=lambda item: -item[1].total()):
        kinds = ", ".join(f"{kind} {count / IDLE_WINDOW_S:.1f}" for kind, count in counts.most_common())
        print(f"    {name:42s} {counts.total() / IDLE_WINDOW_S:5.1f}  {kinds}")
    services = sum(share for name, share in shares.items() if name != "tansu")
    return {
        "idle_kafka_requests_per_s": by_kind.total() / IDLE_WINDOW_S,
        "idle_kafka_fetches_per_s": by_kind["Fetch"] / IDLE_WINDOW_S,
        "idle_kafka_heartbeats_per_s": by_kind["Heartbeat"] / IDLE_WINDOW_S,
        "idle_cpu_pct_all_services": services + shares["tansu"],
        "idle_cpu_pct_services": services,
        "idle_cpu_pct_broker": shares["tansu"],
        "idle_run_after_quiet_p50_ms": to_ms(statistics.median(after_quiet)),
        "idle_run_back_to_back_p50_ms": to_ms(statistics.median(back_to_back)),
        "idle_load_avg_1m": max(load, _load()),
        "idle_streams_open": IDLE_STREAMS,
        "idle_cpu_pct_with_open_streams": with_streams,
    }


async def _idle_with_streams(running: Fleet, sessions: list[str]) -> float:
    """The services', the broker's and this process's CPU share with a live stream open on each of
    `sessions` (nothing to show), read as the gateway reads its SSE clients' (one `EventFeed`), once
    every stream has been quiet past `idle_after_s`."""
    feed = EventFeed(running.settings, client_id="bench-streams")
    streams = [await feed.open(session_id=session_id, start_at=StartAt.NOW) for session_id in sessions]
    reading = [asyncio.create_task(_follow(stream)) for stream in streams]
    try:
        await asyncio.sleep(IDLE_SETTLE_S)
        before, own = running.cpu(), time.process_time()
        await asyncio.sleep(IDLE_WINDOW_S)
        after, own = running.cpu(), time.process_time() - own
    finally:
        for task in reading:
            task.cancel()
        await asyncio.gather(*reading, return_exceptions=True)
        for stream in streams:
            await stream.stop()
    share = 100 * (sum(after.values()) - sum(before.values()) + own) / IDLE_WINDOW_S
    print(f"  with {len(sessions)} live event streams open, nothing to show: {share:.1f} % of one core")
    return share


async def _follow(stream: FedStream) -> None:
    while True:
        await stream.read(timeout_s=1.0)


async def measure_load(stack: EmbeddedStack) -> Figures:
    """Every service in one process, LOAD_SESSIONS clients at once: runs/s, latency, memory."""
    async with fleet(stack) as running:
        process = running.child("all", ["all"])
        await running.settled(_settled_groups(dict.fromkeys(GROUPS, 1)))
        assert process.process is not None
        pid = process.process.pid
        async with Runs(running.settings) as runs:
            await _warm(runs)
            await asyncio.sleep(IDLE_SETTLE_S)
            before, idle_started = running.cpu()["all-0"], time.perf_counter()
            await asyncio.sleep(IDLE_WINDOW_S / 2)
            idle_one_process = (running.cpu()["all-0"] - before) / (time.perf_counter() - idle_started)
            rss_idle, _ = rss_mb(pid)
            sessions = await runs.sessions(LOAD_SESSIONS)
            load = _load()
            result = await runs.at_once([[session_id] for session_id in sessions], LOAD_DEADLINE_S)
            rss_now, rss_peak = rss_mb(pid)
        running.check_alive()
    ended = len(result.latencies)
    print(
        f"\n{LOAD_SESSIONS} sessions, every service in one process: {ended} runs ended in "
        f"{result.wall_s:.1f} s ({result.unfinished} had not by the {LOAD_DEADLINE_S:g} s deadline); "
        f"RSS idle {rss_idle:.0f} MB, after {rss_now:.0f} MB, peak {rss_peak:.0f} MB; "
        f"idle CPU of that process {idle_one_process:.0%} of a core"
    )
    figures: Figures = {
        "load_runs_per_s_200_sessions": result.runs_per_s,
        "load_runs_unfinished_200_sessions": float(result.unfinished),
        "rss_mb_all_services": rss_peak,
        "rss_mb_all_services_idle": rss_idle,
        "idle_cpu_pct_one_process": 100 * idle_one_process,
        "load_load_avg_1m": max(load, _load()),
    }
    for key, q in (("load_overhead_p50_ms", 0.5), ("load_overhead_p99_ms", 0.99)):
        value = result.quantile(q)
        figures[key] = None if value is None else to_ms(value)
        if value is None:
            print(
                f"  {key} not measured: {result.unfinished} runs had not ended by the deadline "
                "(the quantile is above it)"
            )
    return figures


async def _measured(runs: Runs, turns: int) -> tuple[float, float]:
    """Runs/s of `SCALING_SESSIONS` clients running `turns` turns each, after a warm-up, and the
    load average it ran under."""
    await _warm(runs)
    sessions = await runs.sessions(SCALING_SESSIONS * turns)
    clients = [sessions[i::SCALING_SESSIONS] for i in range(SCALING_SESSIONS)]
    load = _load()
    result = await runs.at_once(clients, SCALING_DEADLINE_S)
    if result.unfinished:
        print(
            f"  {result.unfinished} runs had not ended after {SCALING_DEADLINE_S:g} s (counted as not done)"
        )
    return result.runs_per_s, max(load, _load())


async def _another(running: Fleet, copies: dict[str, int], name: str, **environment: str) -> dict[str, int]:
    """Start one more copy of service `name`; return the copies once every group is stable with it."""
    running.service(name, **environment)
    copies = copies | {name: copies[name] + 1}
    await running.settled(_settled_groups(copies))
    return copies


async def measure_scaling(stack: EmbeddedStack) -> Figures:
    """Runs/s with one copy of each service, then a second planner, then a second owner."""
    async with fleet(stack) as running:
        for name in ("storage_owner", "planner", "tool_executor"):
            running.service(name)
        copies = {"storage_owner": 1, "planner": 1, "tool_executor": 1}
        await running.settled(_settled_groups(copies))
        async with Runs(running.settings) as runs:
            one, load_one = await _measured(runs, SCALING_RUNS_PER_SESSION)
            progress("scaling: one copy each")
            copies = await _another(running, copies, "planner")
            two_planners, load_two = await _measured(runs, SCALING_RUNS_PER_SESSION)
            progress("scaling: two planners")
            await _another(running, copies, "storage_owner")
            two_owners, load_three = await _measured(runs, SCALING_RUNS_PER_SESSION)
            progress("scaling: two owners")
        running.check_alive()
    print(
        f"\nscaling, runs/s ({SCALING_SESSIONS} clients x {SCALING_RUNS_PER_SESSION} turns): one of each "
        f"{one:.2f} (load {load_one:.1f}); 2 planners {two_planners:.2f} (load {load_two:.1f}); "
        f"2 planners and 2 owners {two_owners:.2f} (load {load_three:.1f})"
    )
    return {
        "planner_scaling_2v1": two_planners / one,
        "owner_scaling_2v1": two_owners / two_planners,
        "scaling_runs_per_s_1_planner_1_owner": one,
        "scaling_runs_per_s_2_planners_1_owner": two_planners,
        "scaling_runs_per_s_2_planners_2_owners": two_owners,
        "scaling_load_avg_1m": max(load_one, load_two, load_three),
    }


async def measure_planner(stack: EmbeddedStack) -> Figures:
    """Runs/s with one planner copy whose model calls bound it, then with two."""
    slow_model = {
        "QUIPU_MODEL_PROVIDER": "scripted",
        "QUIPU_MODEL_SCRIPTED_LATENCY_S": str(MODEL_CALL_S),
        "QUIPU_PLANNER_MAX_IN_FLIGHT": str(MODEL_IN_FLIGHT),
    }
    async with fleet(stack) as running:
        for name in ("storage_owner", "tool_executor"):
            running.service(name)
        running.service("planner", **slow_model)
        copies = {"storage_owner": 1, "planner": 1, "tool_executor": 1}
        await running.settled(_settled_groups(copies))
        async with Runs(running.settings) as runs:
            one, load_one = await _measured(runs, MODEL_BOUND_RUNS_PER_SESSION)
            progress("planner: one copy")
            await _another(running, copies, "planner", **slow_model)
            two, load_two = await _measured(runs, MODEL_BOUND_RUNS_PER_SESSION)
            progress("planner: two copies")
        running.check_alive()
    ceiling = 2 * MODEL_IN_FLIGHT / MODEL_CALL_S / 2  # two topics' slots, two model calls a run
    print(
        f"\nmodel-bound planner ({MODEL_CALL_S:g} s a call, {MODEL_IN_FLIGHT} in flight a topic: at most "
        f"{ceiling:g} runs/s a copy): one copy {one:.2f} runs/s (load {load_one:.1f}), two {two:.2f} "
        f"(load {load_two:.1f})"
    )
    return {
        "planner_scaling_2v1_model_bound": two / one,
        "planner_model_bound_runs_per_s_1_copy": one,
        "planner_model_bound_runs_per_s_2_copies": two,
        "planner_model_bound_load_avg_1m": max(load_one, load_two),
    }


async def _calls_per_s(calls: ToolCalls, count: int) -> tuple[float, set[str]]:
    started = time.perf_counter()
    answers = await asyncio.gather(
        *(calls.call(io_bound.name, "wait_io", {"milliseconds": IO_CALL_MS}) for _ in range(count))
    )
    return count / (time.perf_counter() - started), {answer.content for answer in answers}


async def _until_answered_by(calls: ToolCalls, copies: int) -> None:
    """Calls until `copies` processes have answered (each answer names its process)."""
    seen: set[str] = set()
    deadline = time.monotonic() + 60.0
    while len(seen) < copies:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {copies} executor copies answered")
        _, pids = await _calls_per_s(calls, 16)
        seen |= pids


async def measure_executor(stack: EmbeddedStack) -> Figures:
    """Calls/s of an I/O-bound toolset on one executor copy, then on two."""
    group = f"tool-executor-{io_bound.name}"
    limits = {"QUIPU_TOOLS_MAX_IN_FLIGHT": str(IO_IN_FLIGHT)}
    async with fleet(stack, toolsets=[io_bound.name]) as running:
        running.child("executor", [f"toolset:{io_bound.name}"], **limits)
        await running.settled({group: 1})
        async with ToolCalls(running.settings) as calls:
            await _until_answered_by(calls, 1)
            load = _load()
            one, _ = await _calls_per_s(calls, IO_CALLS)
            running.child("executor", [f"toolset:{io_bound.name}"], **limits)
            await running.settled({group: 2})
            await _until_answered_by(calls, 2)
            two, pids = await _calls_per_s(calls, IO_CALLS)
            load = max(load, _load())
        running.check_alive()
    ceiling = IO_IN_FLIGHT / (IO_CALL_MS / 1000)
    print(
        f"\nI/O-bound tool ({IO_CALL_MS} ms, {IO_IN_FLIGHT} in flight a copy: at most {ceiling:g} calls/s "
        f"a copy): one copy {one:.1f} calls/s, two {two:.1f} ({len(pids)} answered the last {IO_CALLS})"
    )
    return {
        "tool_executor_scaling_2v1": two / one,
        "tool_executor_io_calls_per_s_1_copy": one,
        "tool_executor_io_calls_per_s_2_copies": two,
        "tool_executor_load_avg_1m": load,
    }


async def _fast_p50(calls: ToolCalls) -> float:
    samples = []
    for number in range(FAST_CALLS):
        await asyncio.sleep(random.uniform(0, 0.02))  # the consumers wait in a fetch, as in use
        samples.append((await calls.call(fast.name, "echo", {"text": str(number)})).seconds)
    return statistics.median(samples)


async def _kept_busy(calls: ToolCalls, until: asyncio.Event) -> int:
    """SLOW_BUSY slow calls in flight until `until` is set; how many were answered."""
    answered = 0

    async def worker() -> None:
        nonlocal answered
        while not until.is_set():
            await calls.call(slow.name, "crunch", {"milliseconds": SLOW_CALL_MS})
            answered += 1

    await asyncio.gather(*(worker() for _ in range(SLOW_BUSY)))
    return answered


async def measure_isolation(stack: EmbeddedStack) -> Figures:
    """The fast toolset's p50 with the slow one idle, busy, idle again (one process serves both)."""
    async with fleet(stack, toolsets=[slow.name, fast.name]) as running:
        running.child("toolsets", [f"toolset:{slow.name}", f"toolset:{fast.name}"])
        await running.settled({f"tool-executor-{slow.name}": 1, f"tool-executor-{fast.name}": 1})
        async with ToolCalls(running.settings) as calls:
            await calls.call(slow.name, "crunch", {"milliseconds": 1})
            load = _load()
            before = await _fast_p50(calls)
            done = asyncio.Event()
            busy = asyncio.create_task(_kept_busy(calls, done))
            await asyncio.sleep(SLOW_CALL_MS / 1000)  # the slow executor full, calls waiting behind
            with_slow = await _fast_p50(calls)
            done.set()
            slow_answered = await busy
            after = await _fast_p50(calls)
            load = max(load, _load())
        running.check_alive()
    alone = statistics.mean([before, after])
    print(
        f"\ntoolset isolation: fast p50 {to_ms(before):.1f} ms idle, {to_ms(with_slow):.1f} ms with "
        f"{SLOW_BUSY} slow calls in flight ({slow_answered} answered meanwhile), "
        f"{to_ms(after):.1f} ms idle again"
    )
    return {
        "toolset_isolation_fast_p50_ms_alone": to_ms(alone),
        "toolset_isolation_fast_p50_ms_with_slow_busy": to_ms(with_slow),
        "toolset_isolation_ratio": with_slow / alone,
        "toolset_isolation_load_avg_1m": load,
    }


SCENARIOS: dict[str, Callable[[EmbeddedStack], Awaitable[Figures]]] = {
    "idle": measure_idle,
    "load": measure_load,
    "scaling": measure_scaling,
    "planner": measure_planner,
    "executor": measure_executor,
    "isolation": measure_isolation,
}


async def measure_fleet(names: list[str] | None = None) -> Figures:
    """The fleet figures of `bench/results/latest.json` (`names`: some scenarios only)."""
    figures: Figures = {}
    async with EmbeddedStack() as stack:
        for name in names or list(SCENARIOS):
            figures |= await SCENARIOS[name](stack)
            progress(f"fleet: {name}")
    return figures


if __name__ == "__main__":
    from bench.report import print_table, save

    results = asyncio.run(measure_fleet(sys.argv[1:] or None))
    print_table(results)
    print(f"\nwritten to {save(results)}")
