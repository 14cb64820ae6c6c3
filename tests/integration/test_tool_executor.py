"""The tool executor on the real embedded broker: one result per call, DLQ, commits, cancels.

Executors run in this process (`create_app(...).start()`), so tests can give them slow tools;
the calls and cancels go in as raw bytes with a plain producer, and the results and dead letters
are read with raw consumers outside any group (every partition, from the beginning): what any
consumer would see on the wire. Two executor processes share the work in
`test_tool_executor_processes.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import ConsumerRecord
from faststream import FastStream
from pydantic import Field

from quipu.contracts.envelope import derive_id
from quipu.contracts.runs import CancelRun
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.topics import Topic
from quipu.services.domain.shipped_tools import default_catalog, shipped_toolset
from quipu.services.domain.tool_catalog import ToolArguments, ToolDefinition
from quipu.services.kit.settings import KafkaSettings
from quipu.services.tool_executor.app import ToolExecutorDeps, create_app
from quipu.services.tool_executor.settings import ToolExecutorSettings
from quipu.tools import ToolContext
from tests.owner_support import RawPublisher, TopicReader
from tests.timing import scaled

pytestmark = pytest.mark.slow

Records = list[ConsumerRecord[bytes, bytes]]


class Nap(ToolArguments):
    """Arguments of the test tool `nap`."""

    seconds: float = Field(description="How long to take.")


class Sleeper:
    """A slow tool that counts what it started, finished and had canceled."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.canceled: list[str] = []

    async def nap(self, arguments: Nap, context: ToolContext) -> dict[str, Any]:
        self.started.append(context.tool_use_id)
        try:
            await asyncio.sleep(arguments.seconds)
        except asyncio.CancelledError:
            self.canceled.append(context.tool_use_id)
            raise
        self.finished.append(context.tool_use_id)
        return {"slept": arguments.seconds}


class Rendezvous:
    """A tool whose calls each wait (at most `scaled(seconds)`) until `expected` of them run at once.

    Calls that run side by side all meet and return at once; calls run one after another never
    see more than one running, so the overlap shows without measuring how long anything took.
    """

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.running = 0
        self.most_at_once = 0
        self._all_in = asyncio.Event()

    async def meet(self, arguments: Nap, context: ToolContext) -> dict[str, Any]:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        if self.running >= self.expected:
            self._all_in.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_in.wait(), scaled(arguments.seconds))
        finally:
            self.running -= 1
        return {"met": self._all_in.is_set()}


def _deps(sleeper: Sleeper, rendezvous: Rendezvous | None = None) -> ToolExecutorDeps:
    catalog = default_catalog()
    catalog.register(ToolDefinition("nap", "Takes a while.", Nap, timeout_s=10.0, max_concurrency=50))
    implementations = {**shipped_toolset().implementations(), "nap": sleeper.nap}
    if rendezvous is not None:
        catalog.register(
            ToolDefinition("meet", "Waits for the others.", Nap, timeout_s=scaled(30.0), max_concurrency=50)
        )
        implementations["meet"] = rendezvous.meet
    return ToolExecutorDeps(catalog=catalog, implementations=implementations)


@asynccontextmanager
async def _executor(
    kafka: KafkaSettings, deps: ToolExecutorDeps | None = None, **settings: Any
) -> AsyncIterator[FastStream]:
    app = create_app(kafka, ToolExecutorSettings(**settings), deps)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


def _assignment(app: FastStream, calls_topic: str) -> set[int]:
    """The partitions of `tools.calls` this executor holds now."""
    assert app.broker is not None
    for subscriber in app.broker.subscribers:
        consumer = getattr(subscriber, "consumer", None)
        if consumer is not None and consumer._group_id is not None:
            return {tp.partition for tp in consumer.assignment() if tp.topic == calls_topic}
    return set()


async def _until(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + scaled(within)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.02)


def _results(records: Records) -> list[ToolCallCompleted]:
    return [ToolCallCompleted.model_validate_json(record.value or b"") for record in records]


def _call(number: int, tool: str, arguments: dict[str, Any], **fields: Any) -> ToolCallRequested:
    values: dict[str, Any] = {
        "run_id": f"run-{number}",
        "session_id": f"session-{number}" if number % 2 else "",
        "agent_id": "agent-1",
        "principal_id": "ana",
        "tool_use_id": f"toolu_{number}",
        "tool_name": tool,
        "input": arguments,
        **fields,
    }
    return ToolCallRequested(**values)


async def _send(publisher: RawPublisher, kafka: KafkaSettings, calls: list[ToolCallRequested]) -> None:
    topic = kafka.topic_prefix + Topic.TOOLS_CALLS
    for call in calls:
        await publisher.send(topic, call.model_dump_json().encode(), key=call.run_id.encode())


async def _cancel(publisher: RawPublisher, kafka: KafkaSettings, run_id: str, session_id: str) -> None:
    cancel = CancelRun(run_id=run_id, session_id=session_id)
    await publisher.send(
        kafka.topic_prefix + Topic.RUNS_CONTROL,
        cancel.model_dump_json().encode(),
        key=(session_id or run_id).encode(),
    )


# --- one result per call --------------------------------------------------------------------------


async def test_every_call_gets_exactly_one_result_and_bad_messages_go_to_the_dlq(
    kafka_settings: KafkaSettings,
) -> None:
    prefix = kafka_settings.topic_prefix
    calls = [_call(number, "calculator", {"expression": f"{number} * {number}"}) for number in range(20)]
    calls += [
        _call(20, "current_time", {"timezone": "Europe/Madrid"}),
        _call(21, "notes", {"action": "set", "key": "city", "value": "Lima"}),
        _call(22, "ask_user", {"question": "Which city?", "choices": ["Lima", "Cusco"]}),
        _call(23, "calculator", {"expr": "1"}),  # the model got the argument name wrong
        _call(24, "shell", {"command": "id"}),  # no such tool
        _call(25, "calculator", {"expression": "__import__('os').system('id')"}),
    ]
    not_a_call = b'{"run_id": "run-x", "tool_use_id": "toolu_x"}'  # no agent_id, no tool_name
    async with (
        RawPublisher(kafka_settings.bootstrap) as publisher,
        TopicReader(kafka_settings.bootstrap, prefix + Topic.TOOLS_RESULTS) as results,
        TopicReader(kafka_settings.bootstrap, prefix + Topic.TOOLS_CALLS.dlq) as dead_letters,
        _executor(kafka_settings),
    ):
        calls_topic = prefix + Topic.TOOLS_CALLS
        await _send(publisher, kafka_settings, calls[:10])
        garbage_at = await publisher.send(calls_topic, b"not json at all", key=b"run-g")
        invalid_at = await publisher.send(calls_topic, not_a_call, key=b"run-x")
        await _send(publisher, kafka_settings, calls[10:])  # still served after the bad ones

        await results.wait_for(lambda records: len(records) >= len(calls))
        await dead_letters.wait_for(lambda records: len(records) >= 2)
        await asyncio.sleep(0.5)  # a duplicate would have arrived by now

    answered = _results(results.records)
    assert Counter(result.tool_use_id for result in answered) == Counter(call.tool_use_id for call in calls)
    by_use = {result.tool_use_id: result for result in answered}
    for call in calls:
        result = by_use[call.tool_use_id]
        assert result.event_id == derive_id(call.event_id, "result")
        assert (result.run_id, result.session_id) == (call.run_id, call.session_id)
    for record in results.records:
        result = ToolCallCompleted.model_validate_json(record.value or b"")
        assert record.key == result.partition_key().encode()  # the session, else the run
    for number in range(20):
        assert by_use[f"toolu_{number}"].content == {
            "expression": f"{number} * {number}",
            "result": number**2,
        }
    assert by_use["toolu_20"].content["timezone"] == "Europe/Madrid"
    assert by_use["toolu_21"].content == {"key": "city", "saved": True}
    asked = by_use["toolu_22"]
    assert asked.content is None and asked.awaiting is not None and asked.awaiting.prompt == "Which city?"
    assert by_use["toolu_23"].is_error and "expression: Field required" in by_use["toolu_23"].content
    assert by_use["toolu_24"].is_error and by_use["toolu_24"].content.startswith("unknown tool 'shell'")
    assert by_use["toolu_25"].is_error and "function call" in by_use["toolu_25"].content

    parked = sorted(dead_letters.records, key=lambda record: record.value or b"")
    assert [record.value for record in parked] == [b"not json at all", not_a_call]  # the bytes as sent
    assert [record.key for record in parked] == [b"run-g", b"run-x"]
    for record, (partition, offset) in zip(parked, [garbage_at, invalid_at], strict=True):
        headers = {key: value.decode() for key, value in record.headers}
        assert headers["x-dlq-reason"] == "invalid_payload"
        assert headers["x-dlq-topic"] == calls_topic
        assert (headers["x-dlq-partition"], headers["x-dlq-offset"]) == (str(partition), str(offset))
    assert "tool_name: Field required" in dict(parked[1].headers)["x-dlq-error"].decode()


async def test_a_restarted_executor_does_not_answer_again(kafka_settings: KafkaSettings) -> None:
    """Offsets are committed once calls are answered: the next executor starts after them."""
    prefix = kafka_settings.topic_prefix
    first = [_call(number, "calculator", {"expression": f"{number} + 1"}) for number in range(12)]
    later = [_call(number, "calculator", {"expression": f"{number} + 1"}) for number in range(12, 16)]
    async with (
        RawPublisher(kafka_settings.bootstrap) as publisher,
        TopicReader(kafka_settings.bootstrap, prefix + Topic.TOOLS_RESULTS) as results,
    ):
        async with _executor(kafka_settings):
            await _send(publisher, kafka_settings, first)
            await results.wait_for(lambda records: len(records) >= len(first))
        # A new executor, with no memory of what the first one answered.
        async with _executor(kafka_settings):
            await _send(publisher, kafka_settings, later)
            await results.wait_for(lambda records: len(records) >= len(first) + len(later))
            await asyncio.sleep(0.5)
    answered = Counter(result.tool_use_id for result in _results(results.records))
    assert answered == Counter(call.tool_use_id for call in first + later)


# --- concurrency and cancel -------------------------------------------------------------------------


async def test_slow_calls_of_one_run_run_side_by_side(kafka_settings: KafkaSettings) -> None:
    """A run's parallel tool uses share a partition; they must not wait for each other."""
    rendezvous = Rendezvous(expected=10)
    calls = [
        _call(0, "meet", {"seconds": 5.0}, tool_use_id=f"toolu_meet{number}", run_id="run-wide")
        for number in range(10)
    ]
    async with (
        RawPublisher(kafka_settings.bootstrap) as publisher,
        TopicReader(kafka_settings.bootstrap, kafka_settings.topic_prefix + Topic.TOOLS_RESULTS) as results,
        _executor(kafka_settings, _deps(Sleeper(), rendezvous)),
    ):
        await _send(publisher, kafka_settings, calls)
        await results.wait_for(lambda records: len(records) >= len(calls), within=60.0)
    assert rendezvous.most_at_once == len(calls), f"at most {rendezvous.most_at_once} of 10 calls ran at once"
    assert Counter(result.tool_use_id for result in _results(results.records)) == Counter(
        call.tool_use_id for call in calls
    )


async def test_a_cancel_reaches_whichever_executor_runs_the_calls(kafka_settings: KafkaSettings) -> None:
    """Two executors in one group: each runs some of the canceled runs' calls; none answers them."""
    prefix = kafka_settings.topic_prefix
    sleepers = [Sleeper(), Sleeper()]
    canceled_runs = [f"run-c{number}" for number in range(8)]
    slow = [
        _call(number, "nap", {"seconds": 2.5}, run_id=run_id, session_id=f"session-c{number}")
        for number, run_id in enumerate(canceled_runs)
    ]
    kept = _call(99, "nap", {"seconds": 0.2}, run_id="run-kept")
    async with (
        RawPublisher(kafka_settings.bootstrap) as publisher,
        TopicReader(kafka_settings.bootstrap, prefix + Topic.TOOLS_RESULTS) as results,
        _executor(kafka_settings, _deps(sleepers[0])) as first,
        _executor(kafka_settings, _deps(sleepers[1])) as second,
    ):
        calls_topic = prefix + Topic.TOOLS_CALLS

        def shared() -> bool:
            held = [_assignment(first, calls_topic), _assignment(second, calls_topic)]
            return all(held) and held[0] | held[1] == set(range(8)) and not held[0] & held[1]

        await _until(shared, 15.0, "both executors hold some partitions")
        await _send(publisher, kafka_settings, [*slow, kept])
        await _until(
            lambda: sum(len(sleeper.started) for sleeper in sleepers) == len(slow) + 1,
            10.0,
            "every call started",
        )
        assert all(sleeper.started for sleeper in sleepers), "one executor ran every call"
        for call in slow:
            await _cancel(publisher, kafka_settings, call.run_id, call.session_id)
        await _until(
            lambda: sum(len(sleeper.canceled) for sleeper in sleepers) == len(slow),
            5.0,
            "every call canceled",
        )
        # A call of a canceled run that arrives after the cancel is not run at all.
        await _send(
            publisher, kafka_settings, [_call(0, "nap", {"seconds": 0}, run_id="run-c0", tool_use_id="late")]
        )
        await asyncio.sleep(2.7)  # past the naps' end: a result that was coming has come
    answered = [result.tool_use_id for result in _results(results.records)]
    assert answered == [kept.tool_use_id]
    assert sorted(use for sleeper in sleepers for use in sleeper.canceled) == sorted(
        c.tool_use_id for c in slow
    )
    assert all(not sleeper.finished or sleeper.finished == [kept.tool_use_id] for sleeper in sleepers)
    assert "late" not in [use for sleeper in sleepers for use in sleeper.started]


async def test_a_stopping_executor_lets_its_calls_finish(kafka_settings: KafkaSettings) -> None:
    sleeper = Sleeper()
    calls = [_call(number, "nap", {"seconds": 0.5}) for number in range(4)]
    async with (
        RawPublisher(kafka_settings.bootstrap) as publisher,
        TopicReader(kafka_settings.bootstrap, kafka_settings.topic_prefix + Topic.TOOLS_RESULTS) as results,
    ):
        async with _executor(kafka_settings, _deps(sleeper), shutdown_grace_s=5.0):
            await _send(publisher, kafka_settings, calls)
            await _until(lambda: len(sleeper.started) == len(calls), 10.0, "every call started")
        # Stopped while every call was running: each still answered before the broker closed.
        await results.wait_for(lambda records: len(records) >= len(calls), within=2.0)
    assert sorted(sleeper.finished) == sorted(call.tool_use_id for call in calls)
    assert json.loads(results.records[0].value or b"")["content"] == {"slept": 0.5}


async def test_calls_running_when_partitions_move_are_answered_once(kafka_settings: KafkaSettings) -> None:
    """A second executor joins while the first runs calls: they finish and commit before handing over."""
    prefix = kafka_settings.topic_prefix
    sleepers = [Sleeper(), Sleeper()]
    calls = [_call(number, "nap", {"seconds": 1.5}) for number in range(12)]
    async with (
        RawPublisher(kafka_settings.bootstrap) as publisher,
        TopicReader(kafka_settings.bootstrap, prefix + Topic.TOOLS_RESULTS) as results,
        _executor(kafka_settings, _deps(sleepers[0])) as first,
    ):
        await _until(lambda: len(_assignment(first, prefix + Topic.TOOLS_CALLS)) == 8, 10.0, "first joined")
        await _send(publisher, kafka_settings, calls)
        await _until(lambda: len(sleepers[0].started) == len(calls), 10.0, "every call started")
        async with _executor(kafka_settings, _deps(sleepers[1])) as second:
            await _until(lambda: bool(_assignment(second, prefix + Topic.TOOLS_CALLS)), 15.0, "second joined")
            await results.wait_for(lambda records: len(records) >= len(calls))
            await asyncio.sleep(0.5)
    answered = Counter(result.tool_use_id for result in _results(results.records))
    assert answered == Counter(call.tool_use_id for call in calls)
    assert sorted(sleepers[0].finished) == sorted(call.tool_use_id for call in calls)
    assert sleepers[1].started == []  # nothing was run twice
