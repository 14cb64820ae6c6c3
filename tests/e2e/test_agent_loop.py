"""The agent loop end to end: storage owner, planner and tool executor as separate processes.

Each service runs as `python -m services.<name>` against the embedded broker and database, on a
topic prefix and database of this module's own, with the offline scripted model
(`QUIPU_MODEL_PROVIDER=scripted`: no test can reach a real model). The test is a client: it
creates a session with the store client, publishes `RunRequested` to `runs.requested`, and reads
`runs.events` and `history.turns` like a UI and the transcript recorder would.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.runs import RunRequested, TurnCompleted
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import (
    TRANSCRIPT_MESSAGES_SEEDED,
    TextPart,
    ToolResultPart,
    ToolUsePart,
    decode_messages,
)
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.services import ServiceProcess
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.transcript import build_messages_from_run_log, validate_planner_transcript
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.adapters import load_records
from tests.owner_support import Owner, RawPublisher, TopicReader, wait_until_serving
from tests.support.announced import publish_built_in_agents
from tests.timing import scaled

pytestmark = pytest.mark.slow


@dataclass
class Deployment:
    """Three service processes on one prefix, and a client's view of the topics."""

    prefix: str
    environment: dict[str, str]
    log_dir: Path
    owner: Owner
    planner: ServiceProcess
    executor: ServiceProcess
    store: KafkaStore
    events: TopicReader
    turns: TopicReader
    publisher: RawPublisher

    async def session(self) -> str:
        session_id = "s-" + uuid.uuid4().hex[:10]
        await self.store.create_session(session_id, utc_now_ms())
        return session_id

    async def publish(self, name: Topic, body: bytes, key: str) -> None:
        await self.publisher.send(self.prefix + name.value, body, key=key.encode())

    async def turn(self, session_id: str, text: str) -> RunRequested:
        request = RunRequested(
            run_id="r-" + uuid.uuid4().hex, session_id=session_id, agent_id="assistant", text=text
        )
        await self.publish(Topic.RUNS_REQUESTED, request.model_dump_json().encode(), session_id)
        return request

    def run_events(self, run_id: str) -> list[RunEvent]:
        parsed = [RunEvent.model_validate_json(r.value or b"") for r in self.events.records]
        return [event for event in parsed if event.run_id == run_id]

    async def until_closed(self, run_id: str, within: float = 30.0) -> list[RunEvent]:
        await self.events.wait_for(
            lambda _: any(e.type is StreamEventType.RUN_STREAM_END for e in self.run_events(run_id)), within
        )
        return self.run_events(run_id)

    def finished_turns(self, run_id: str) -> list[TurnCompleted]:
        parsed = [TurnCompleted.model_validate_json(r.value or b"") for r in self.turns.records]
        return [turn for turn in parsed if turn.run_id == run_id]

    def start_planner(self) -> ServiceProcess:
        self.planner = ServiceProcess(
            "quipu.services.planner", self.environment, self.log_dir / "planner.log"
        ).start()
        return self.planner

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_bytes()[-3000:].decode(errors='replace')}"
            for path in sorted(self.log_dir.glob("*.log"))
        )


@pytest.fixture(scope="module")
async def deployment(
    stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployment]:
    prefix = f"e2e{uuid.uuid4().hex[:8]}."
    database = prefix.rstrip(".")
    log_dir = tmp_path_factory.mktemp("agent-loop-logs")
    await create_topics(stack.bootstrap, prefix)
    await publish_built_in_agents(stack.kafka_settings(topic_prefix=prefix))  # as `quipu up` does
    environment = {
        **stack.environment(),
        "QUIPU_KAFKA_TOPIC_PREFIX": prefix,
        "QUIPU_MONGO_DATABASE": database,
        "QUIPU_MODEL_PROVIDER": "scripted",
        "QUIPU_JSON_LOGS": "true",
    }
    owner = Owner(stack, prefix, database, log_dir / "owner.log").start()
    planner = ServiceProcess("quipu.services.planner", environment, log_dir / "planner.log").start()
    executor = ServiceProcess("quipu.services.tool_executor", environment, log_dir / "executor.log").start()
    store = KafkaStore(stack.kafka_settings(topic_prefix=prefix), reply_timeout_s=scaled(10.0))
    events = TopicReader(stack.bootstrap, prefix + Topic.RUNS_EVENTS.value)
    turns = TopicReader(stack.bootstrap, prefix + Topic.HISTORY_TURNS.value)
    try:
        await store.start()
        await wait_until_serving(store, owner)
        await events.start()
        await turns.start()
        async with RawPublisher(stack.bootstrap) as publisher:
            deployment = Deployment(
                prefix, environment, log_dir, owner, planner, executor, store, events, turns, publisher
            )
            yield deployment
    finally:
        await events.stop()
        await turns.stop()
        await store.stop()
        # deployment.planner: a test may have replaced the planner with a restarted one.
        restarted = deployment.planner if "deployment" in locals() else planner
        for process in {id(p): p for p in (planner, restarted, executor)}.values():
            await asyncio.to_thread(process.stop, 15.0)
        await owner.stop()
        await delete_topics(stack.bootstrap, prefix)


def phases(events: list[RunEvent]) -> list[str]:
    return [event.payload["phase"] for event in events if event.type is StreamEventType.WORKFLOW]


async def test_a_conversation_of_three_turns_keeps_its_history(deployment: Deployment) -> None:
    session = await deployment.session()
    started = time.monotonic()
    first = await deployment.turn(session, "calculate 6*7")
    try:
        events = await deployment.until_closed(first.run_id, within=45.0)  # includes the planner's start
    except AssertionError:
        raise AssertionError(deployment.logs()) from None
    first_s = time.monotonic() - started
    assert phases(events) == ["planning", "executing_tools", "synthesizing", "completed"]
    messages = await build_messages_from_run_log(deployment.store, first.run_id)
    validate_planner_transcript(messages)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert any(isinstance(p, ToolUsePart) and p.name == "calculator" for p in messages[1].parts)
    assert isinstance(messages[2].parts[0], ToolResultPart)

    started = time.monotonic()
    second = await deployment.turn(session, "note color=blue")
    assert phases(await deployment.until_closed(second.run_id))[-1] == "completed"
    third = await deployment.turn(session, "hello again")
    assert phases(await deployment.until_closed(third.run_id))[-1] == "completed"
    later_s = (time.monotonic() - started) / 2

    seeded = [
        r for r in await load_records(deployment.store, third.run_id) if r.type == TRANSCRIPT_MESSAGES_SEEDED
    ]
    [seed] = seeded
    history = decode_messages(seed.payload, "seed")
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]
    assert [m.parts[0].text for m in history if m.role == "user"] == [  # type: ignore[union-attr]
        "calculate 6*7",
        "note color=blue",
    ]
    assert all(isinstance(part, TextPart) for m in history for part in m.parts)  # no tool traffic
    await deployment.turns.wait_for(lambda _: bool(deployment.finished_turns(third.run_id)))
    print(f"first turn (cold planner) {first_s:.2f} s; later turns {later_s * 1000:.0f} ms each")


async def test_republished_messages_of_a_finished_run_change_nothing(deployment: Deployment) -> None:
    session = await deployment.session()
    request = await deployment.turn(session, "calculate 7*6; what time is it")
    await deployment.until_closed(request.run_id)
    await deployment.turns.wait_for(lambda _: len(deployment.finished_turns(request.run_id)) == 1)
    records = await load_records(deployment.store, request.run_id)
    replies = [e for e in deployment.run_events(request.run_id) if e.type is StreamEventType.ASSISTANT_REPLY]
    reader = TopicReader(deployment.environment["QUIPU_KAFKA_BOOTSTRAP"], deployment.prefix + "tools.results")
    await reader.start()
    try:
        tool_results = await reader.wait_for(
            lambda rs: sum(request.run_id.encode() in (r.value or b"") for r in rs) == 2
        )
    finally:
        await reader.stop()
    replay = [(Topic.RUNS_REQUESTED, request.model_dump_json().encode())]
    replay += [
        (Topic.TOOLS_RESULTS, r.value or b"")
        for r in tool_results
        if request.run_id.encode() in (r.value or b"")
    ]

    for name, body in replay:
        await deployment.publish(name, body, session)

    await deployment.turns.wait_for(
        lambda _: len(deployment.finished_turns(request.run_id)) == 1 + len(replay)
    )
    assert await load_records(deployment.store, request.run_id) == records
    again = [e for e in deployment.run_events(request.run_id) if e.type is StreamEventType.ASSISTANT_REPLY]
    assert again == replies  # no model call streamed anything new


async def test_a_request_published_while_the_planner_is_down_is_answered_after_restart(
    deployment: Deployment,
) -> None:
    await asyncio.to_thread(deployment.planner.kill)
    session = await deployment.session()
    request = await deployment.turn(session, "calculate 1+1")
    await asyncio.sleep(0.5)
    assert not deployment.run_events(request.run_id)

    started = time.monotonic()
    deployment.start_planner()
    try:
        events = await deployment.until_closed(request.run_id, within=45.0)
    except AssertionError:
        raise AssertionError(deployment.logs()) from None
    assert phases(events)[-1] == "completed"
    print(f"answered {time.monotonic() - started:.1f} s after the planner restarted")
