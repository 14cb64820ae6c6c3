"""Helpers for the gateway and CLI tests (no tests here): a served stack, a planner stand-in, an SSE client.

- `ServedStack`: this module's own topics, the real storage owner in process on the embedded
  broker and database, and a Kafka store client.
- `StandInPlanner`: what the planner does on the wire, scripted, so the gateway and the CLI can
  be tested while the real planner is built elsewhere. It consumes `runs.requested` and
  `runs.control` outside any group, drives the run through the real owner (which publishes the
  durable events after each commit) and publishes the deltas the planner would
  (`assistant_reply`, `await_clarification`) itself. The text decides the script: "ask" suspends
  with a question, "fail" fails, "wait" runs until canceled, anything else completes.
- `SSEStream`: an SSE client over a real HTTP connection that parses events and comments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from faststream import FastStream

from quipu.contracts.errors import StoreError
from quipu.contracts.events import RUN_PHASE_CHANGED, RunEvent, StreamEventType
from quipu.contracts.lifecycle import (
    Failure,
    encode_cancellation_intent,
    encode_run_completed,
    encode_run_started,
    encode_run_suspended,
)
from quipu.contracts.runs import CancelRun, RunKind, RunRequested
from quipu.contracts.store import Checkpoint, Record, RunStart, RunStatus, StartOutcome
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.kit.producers import Producer, shared_producer
from quipu.services.kit.settings import KafkaSettings, MongoSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.storage_owner.app import create_app as create_owner
from tests.timing import scaled

QUESTION = "Which city do you mean?"


# --- the served stack -------------------------------------------------------------------------------


class ServedStack:
    """Topics under a unique prefix, the storage owner in this process, and a store client."""

    def __init__(self, stack: EmbeddedStack, name: str) -> None:
        self.stack = stack
        self.prefix = f"{name}."
        self.kafka: KafkaSettings = stack.kafka_settings(topic_prefix=self.prefix)
        self.mongo: MongoSettings = stack.mongo_settings(database=name)
        self.owner: FastStream = create_owner(self.kafka, self.mongo)
        self.store = KafkaStore(self.kafka, reply_timeout_s=scaled(10.0))

    def topic(self, name: Topic) -> str:
        """The physical name of a registry topic."""
        return self.prefix + name.value

    async def __aenter__(self) -> ServedStack:
        await create_topics(self.stack.bootstrap, self.prefix)
        await self.owner.start()
        await self.store.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.store.stop()
        await self.owner.stop()
        with contextlib.suppress(Exception):
            await delete_topics(self.stack.bootstrap, self.prefix)


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    """Wait until `check()` is true; fail after `scaled(within)` seconds."""
    deadline = time.monotonic() + scaled(within)
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {scaled(within):.1f} s: {check}")
        await asyncio.sleep(0.05)


def unique_name() -> str:
    """A name valid as a topic prefix and database name."""
    return "q" + uuid.uuid4().hex[:12]


# --- the planner stand-in ---------------------------------------------------------------------------


def _record(run: RunStart, key: str, record_type: str, payload: bytes) -> Record:
    return Record(
        event_key=f"{run.run_id}/{key}",
        run_id=run.run_id,
        agent_id=run.agent_id,
        session_id=run.session_id,
        type=record_type,
        payload=payload,
        timestamp=utc_now_ms(),
    )


@dataclass
class StandInPlanner:
    """A scripted planner on the real wire; `requests` and `cancels` keep what it consumed.

    It reads its topics from the beginning: start one per served stack (a module fixture), or
    it replays the requests of earlier tests.
    """

    served: ServedStack
    requests: list[RunRequested] = field(default_factory=list)
    cancels: list[CancelRun] = field(default_factory=list)
    errors: list[StoreError] = field(default_factory=list)
    _runs: dict[str, RunStart] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _consumer: AIOKafkaConsumer | None = None
    _producer: Producer | None = None

    async def __aenter__(self) -> StandInPlanner:
        bootstrap = self.served.stack.bootstrap
        # The owner's producer, as a planner of the owner's process publishes: its deltas then
        # follow on the partition what the owner queued before it answered (replies are taken as
        # they are queued in-process, before the broker has the owner's events).
        kafka = self.served.kafka
        self._producer = shared_producer(kafka, kafka.client_id)
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=10
        )
        await self._consumer.start()
        partitions = []
        for name in (Topic.RUNS_REQUESTED, Topic.RUNS_CONTROL):
            topic = self.served.topic(name)
            numbers: set[int] | None = None
            for _ in range(50):
                numbers = self._consumer.partitions_for_topic(topic)
                if numbers:
                    break
                await self._consumer._client.force_metadata_update()
                await asyncio.sleep(0.05)
            assert numbers, topic
            partitions += [TopicPartition(topic, number) for number in sorted(numbers)]
        self._consumer.assign(partitions)
        await self._consumer.seek_to_beginning(*partitions)
        self._task = asyncio.create_task(self._consume(), name="stand-in planner")
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    async def _consume(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for message in records:
                    try:
                        if message.topic == self.served.topic(Topic.RUNS_CONTROL):
                            await self._cancel(CancelRun.model_validate_json(message.value or b""))
                        else:
                            await self._run(RunRequested.model_validate_json(message.value or b""))
                    except StoreError as error:  # a test asserts `errors` when it matters
                        self.errors.append(error)

    async def _delta(self, run: RunStart, kind: StreamEventType, key: str, payload: dict[str, Any]) -> None:
        assert self._producer is not None
        event = RunEvent(
            type=kind,
            event_key=f"{run.run_id}/{key}",
            run_id=run.run_id,
            session_id=run.session_id,
            timestamp=utc_now_ms(),
            payload=payload,
        )
        acknowledged = await self._producer.send(
            self.served.topic(Topic.RUNS_EVENTS),
            event.model_dump_json().encode(),
            key=(run.session_id or run.run_id).encode(),
        )
        await acknowledged

    async def _run(self, request: RunRequested) -> None:
        self.requests.append(request)
        store = self.served.store
        run = RunStart(
            run_id=request.run_id,
            agent_id=request.agent_id,
            session_id=request.session_id,
            predecessor_run_id=request.predecessor_run_id,
            started_at=utc_now_ms(),
        )
        started = _record(run, "started", "run_started", encode_run_started(run))
        stopped = _record(
            run,
            "stopped",
            "run_completed",
            encode_run_completed(RunStatus.CANCELED, cancellation_reason="session_ended"),
        )
        stamp = {"timestamp": run.started_at}
        started, stopped = started.model_copy(update=stamp), stopped.model_copy(update=stamp)
        if run.session_id:
            result = await store.start_root_run(run, started, stopped)
            if result.decision is StartOutcome.STOP:
                return
        else:
            await store.start_one_shot_run(run, started)
        self._runs[run.run_id] = run
        planning = json.dumps({"phase": "planning"}).encode()
        await store.append_run_record(_record(run, "planning", RUN_PHASE_CHANGED, planning))
        if request.kind is RunKind.RESUME:
            await self._answer(run, f"Noted: {request.answer}.", f"answer: {request.answer}")
        elif "ask" in request.text:
            await self._delta(run, StreamEventType.AWAIT_CLARIFICATION, "await", {"question": QUESTION})
            checkpoint = Checkpoint(suspension_id="q1", data=b"resume-here")
            suspended = encode_run_suspended("q1", "1", 1, ["ask_user"])
            await store.record_run_suspension(
                checkpoint, _record(run, "suspended", "run_suspended", suspended)
            )
        elif "fail" in request.text:
            failure = Failure(message="the model is unreachable", kind="model_error", retryable=False)
            completed = encode_run_completed(RunStatus.FAILED, failure=failure)
            await store.record_run_terminal(_record(run, "done", "run_completed", completed))
        elif "wait" not in request.text:
            await self._answer(run, "Hello there, friend.", request.text)

    async def _answer(self, run: RunStart, reply: str, said: str) -> None:
        store = self.served.store
        words = reply.split(" ")
        for index, word in enumerate(words):
            chunk = word if index == len(words) - 1 else word + " "
            await self._delta(run, StreamEventType.ASSISTANT_REPLY, f"reply/{index}", {"delta": chunk})
        messages = [
            {"role": "user", "parts": [{"kind": "text", "text": said}]},
            {"role": "assistant", "parts": [{"kind": "text", "text": reply}]},
        ]
        await store.append_run_record(
            _record(run, "turn", TRANSCRIPT_MESSAGES_APPENDED, json.dumps(messages).encode())
        )
        completed = encode_run_completed(RunStatus.COMPLETED)
        await store.record_run_terminal(_record(run, "done", "run_completed", completed))

    async def _cancel(self, cancel: CancelRun) -> None:
        self.cancels.append(cancel)
        run = self._runs.get(cancel.run_id)
        if run is None:
            return
        store = self.served.store
        await store.record_run_cancellation(
            _record(run, "cancel", "runtime.cancellation_intent", encode_cancellation_intent(cancel.reason))
        )
        canceled = encode_run_completed(RunStatus.CANCELED, cancellation_reason=cancel.reason.value)
        await store.record_run_terminal(_record(run, "canceled", "run_completed", canceled))


# --- an SSE client ----------------------------------------------------------------------------------


@dataclass
class SSEMessage:
    """One parsed server-sent event (or a comment, with `comment` set)."""

    id: str = ""
    event: str = ""
    data: str = ""
    retry: str = ""
    comment: str = ""

    def run_event(self) -> RunEvent:
        """The data as a RunEvent."""
        return RunEvent.model_validate_json(self.data)


class SSEStream:
    """Reads one SSE response in the background; events and comments land in queues."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.events: asyncio.Queue[SSEMessage] = asyncio.Queue()
        self.comments: asyncio.Queue[SSEMessage] = asyncio.Queue()
        self.retry = ""
        self._task = asyncio.create_task(self._read(), name="sse reader")

    async def _read(self) -> None:
        current = SSEMessage()
        async for line in self.response.aiter_lines():
            if line == "":
                if current.comment and not (current.event or current.data):
                    await self.comments.put(current)
                elif current.event or current.data:
                    await self.events.put(current)
                current = SSEMessage()
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "":
                current.comment = value
            elif name == "retry":
                self.retry = value
            elif name in ("id", "event", "data"):
                setattr(current, name, value)

    async def next(self, within: float = 10.0) -> SSEMessage:
        """The next event."""
        return await asyncio.wait_for(self.events.get(), scaled(within))

    async def take(self, count: int, within: float = 10.0) -> list[SSEMessage]:
        """The next `count` events."""
        return [await self.next(within) for _ in range(count)]

    async def nothing_more(self, quiet: float = 0.8) -> None:
        """Assert no event arrives for `quiet` seconds."""
        with contextlib.suppress(TimeoutError):
            extra = await asyncio.wait_for(self.events.get(), quiet)
            raise AssertionError(f"unexpected event {extra}")

    async def close(self) -> None:
        """Stop reading (the caller closes the response)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@contextlib.asynccontextmanager
async def sse(client: httpx.AsyncClient, path: str, **headers: str) -> AsyncIterator[SSEStream]:
    """Open an event stream; closing the context disconnects."""
    async with client.stream("GET", path, headers=headers or None) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        assert response.headers["content-type"].startswith("text/event-stream")
        stream = SSEStream(response)
        try:
            yield stream
        finally:
            await stream.close()
