"""Stream events the storage owner publishes on `runs.events` after a commit (STORE_CONTRACT §11).

- A terminal record makes `workflow` (phase and status) then `run_stream_end` visible, keyed by the
  session id, each with an `event_key`; an exact retry publishes them again with the same keys, so
  consumers de-duplicating on (run_id, type, event_key) see each once.
- A refused command publishes nothing.
- A start under an ended session (decision `stop`) publishes the canceled `workflow`.
- A child start publishes `child_run_linked` on the parent.

The owner is a separate process on the real embedded broker and database; the test reads
`runs.events` with a raw consumer outside any group. "Nothing was published" is shown with a
barrier: a later command of the same session publishes on the same partition, after the commands
before it, so once its events are read every earlier event would have been read too.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from quipu.contracts.commands import RecordRunTerminal
from quipu.contracts.errors import ErrorCode
from quipu.contracts.events import RunEvent
from quipu.contracts.lifecycle import Failure
from quipu.contracts.store import CancellationReason, RunStart, RunStatus, StartOutcome
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.kit.store_client import KafkaStore
from tests.conformance.builders import (
    child_start,
    ended_session,
    intent,
    ms,
    one_shot_child,
    open_session,
    ordinary,
    refused,
    root_start,
    running_one_shot,
    running_root,
    session_with_root,
    start,
    suspension,
    terminal,
    uid,
)
from tests.owner_support import RawPublisher, Served, TopicReader, mongo_client

pytestmark = pytest.mark.slow


@dataclass
class Events:
    """The module's owner and a reader of its `runs.events`."""

    served: Served
    reader: TopicReader

    @property
    def store(self) -> KafkaStore:
        return self.served.store

    def of(self, run_id: str) -> list[tuple[ConsumerRecord[bytes, bytes], RunEvent]]:
        """Every event of one run read so far, in partition order, with its Kafka record."""
        found = []
        for record in self.reader.records:
            event = RunEvent.model_validate_json(record.value or b"")
            if event.run_id == run_id:
                found.append((record, event))
        return found

    def types(self, run_id: str) -> list[tuple[str, str]]:
        """(type, event_key) of every event of one run, in order."""
        return [(event.type.value, event.event_key) for _, event in self.of(run_id)]

    async def wait(self, run_id: str, count: int) -> list[tuple[ConsumerRecord[bytes, bytes], RunEvent]]:
        """Wait until at least `count` events of the run were read; return them."""
        await self.reader.wait_for(lambda _: len(self.of(run_id)) >= count, within=10.0)
        return self.of(run_id)

    async def barrier(self, session_id: str) -> None:
        """Publish an event on the session's partition, after everything sent so far; wait for it."""
        run = await running_root(self.store, session_id, run_id=uid("barrier"), started_at=ms(900))
        await self.store.record_run_terminal(terminal(run, key="barrier-end", timestamp=ms(901)))
        await self.wait(run.run_id, 2)


@pytest.fixture(scope="module")
async def events(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Events]:
    """An owner on a prefix and database of this module's own, and a reader of its events."""
    name = f"oevt{uuid.uuid4().hex[:8]}"
    log_path = tmp_path_factory.mktemp("owner") / "owner.log"
    async with (
        Served(stack, f"{name}.", name, log_path) as served,
        TopicReader(stack.bootstrap, served.topic(Topic.RUNS_EVENTS.value)) as reader,
    ):
        yield Events(served, reader)


def _closing_pair(events: list[tuple[ConsumerRecord[bytes, bytes], RunEvent]], key: str) -> dict[str, Any]:
    """Check a `workflow` + `run_stream_end` pair; return the workflow payload."""
    (workflow_record, workflow), (end_record, end) = events
    assert (workflow.type.value, end.type.value) == ("workflow", "run_stream_end")
    assert (workflow.event_key, end.event_key) == (key, f"{key}/end")
    assert workflow_record.partition == end_record.partition
    assert workflow_record.offset < end_record.offset, "workflow comes before run_stream_end"
    return workflow.payload


async def test_a_terminal_publishes_workflow_then_run_stream_end_after_its_commit(
    stack: EmbeddedStack, events: Events
) -> None:
    store = events.store
    session_id, run = await session_with_root(store, labels={"team": "blue"})
    await store.append_run_record(ordinary(run, "step-1", record_type="tool_start"))
    closing = terminal(run, key="the-end", timestamp=ms(50))

    # Sent raw, without waiting for the reply: the events alone must prove the commit happened.
    async with RawPublisher(stack.bootstrap) as publisher:
        await publisher.send_command(
            events.served.topic(Topic.STORAGE_COMMANDS.value),
            RecordRunTerminal(record=closing, correlation_id=uid("c")),
            events.served.topic(Topic.STORAGE_REPLIES.value),
        )
    published = await events.wait(run.run_id, 1)
    client = mongo_client(stack)
    try:
        database = client[events.served.database]
        stored_run = await database["runs"].find_one({"_id": run.run_id})
        stored_terminal = await database["records"].find_one({"run_id": run.run_id, "event_key": "the-end"})
    finally:
        await client.close()
    assert stored_run is not None and stored_run["status"] == "completed", "an event before the commit"
    assert stored_terminal is not None

    published = await events.wait(run.run_id, 2)
    assert _closing_pair(published, "the-end") == {"phase": "completed", "status": "success"}
    for record, event in published:
        assert record.key == session_id.encode(), "keyed by session id"
        assert (event.session_id, event.timestamp) == (session_id, ms(50))
    assert events.types(run.run_id) == [("workflow", "the-end"), ("run_stream_end", "the-end/end")]

    # An exact retry publishes the same events again: same keys, so consumers drop the copies.
    retry = await store.record_run_terminal(closing)
    assert retry.inserted is False
    again = await events.wait(run.run_id, 4)
    assert [event.dedup_key() for _, event in again[2:]] == [event.dedup_key() for _, event in again[:2]]
    assert [event.payload for _, event in again[2:]] == [event.payload for _, event in again[:2]]


async def test_failed_and_canceled_terminals_and_a_suspension_say_how_the_run_closed(events: Events) -> None:
    store = events.store
    session_id, failing = await session_with_root(store)
    canceled = await running_root(store, session_id)
    suspending = await running_root(store, session_id)
    failure = Failure(message="the tool exploded", kind="tool_error", retryable=True, code="E42")
    await store.record_run_terminal(terminal(failing, RunStatus.FAILED, failure=failure, key="failed"))
    await store.record_run_cancellation(intent(canceled, CancellationReason.USER_REQUESTED))
    await store.record_run_terminal(
        terminal(canceled, RunStatus.CANCELED, reason=CancellationReason.USER_REQUESTED, key="canceled")
    )
    checkpoint, suspended = suspension(suspending, key="paused")
    await store.record_run_suspension(checkpoint, suspended)

    assert _closing_pair(await events.wait(failing.run_id, 2), "failed") == {
        "phase": "failed",
        "status": "failed",
        "failure": {"message": "the tool exploded", "kind": "tool_error", "retryable": True},
    }
    assert _closing_pair(await events.wait(canceled.run_id, 2), "canceled") == {
        "phase": "canceled",
        "status": "canceled",
        "cancellation": {"reason": "user_requested"},
    }
    assert _closing_pair(await events.wait(suspending.run_id, 2), "paused") == {
        "phase": "suspended",
        "status": "suspended",
    }
    await events.barrier(session_id)
    # The cancellation intent and the starts published nothing; each close published its pair once.
    assert [len(events.of(run.run_id)) for run in (failing, canceled, suspending)] == [2, 2, 2]


async def test_refused_commands_publish_nothing(events: Events) -> None:
    store = events.store
    session_id, run = await session_with_root(store)
    closing = terminal(run, key="done")
    await store.record_run_terminal(closing)
    await events.wait(run.run_id, 2)

    await refused(ErrorCode.RUN_TERMINAL_CONFLICT, store.record_run_terminal(terminal(run, key="done-again")))
    await refused(
        ErrorCode.EVENT_CONFLICT,
        store.record_run_terminal(closing.model_copy(update={"timestamp": ms(77)})),
    )
    checkpoint, suspended = suspension(run)
    await refused(ErrorCode.RUN_TERMINAL_CONFLICT, store.record_run_suspension(checkpoint, suspended))
    late_child = child_start(session_id, run, link_key="late-link")
    await refused(ErrorCode.RUN_NOT_ACTIVE, start(store, late_child))
    ghost = root_start(session_id).run
    await refused(ErrorCode.RUN_NOT_FOUND, store.record_run_terminal(terminal(ghost, key="ghost-end")))
    phase = ordinary(run, "phase-after-close", payload=b'{"phase":"planning"}')
    await refused(ErrorCode.RUN_NOT_ACTIVE, store.append_run_record(phase))

    await events.barrier(session_id)
    assert events.types(run.run_id) == [("workflow", "done"), ("run_stream_end", "done/end")]
    assert events.of(ghost.run_id) == []
    assert events.of(late_child.run.run_id) == []


async def test_a_start_under_an_ended_session_publishes_the_canceled_workflow(events: Events) -> None:
    store = events.store
    session_id = await ended_session(store)
    stopped_start = root_start(session_id, stopped_key="stopped-by-end", started_at=ms(5))
    result = await start(store, stopped_start)
    assert result.decision is StartOutcome.STOP

    published = await events.wait(stopped_start.run.run_id, 2)
    assert _closing_pair(published, "stopped-by-end") == {
        "phase": "canceled",
        "status": "canceled",
        "cancellation": {"reason": "session_ended"},
    }
    assert {record.key for record, _ in published} == {session_id.encode()}
    assert {event.timestamp for _, event in published} == {ms(5)}

    # A start that proceeds publishes nothing (its run has not closed).
    active = await open_session(store)
    proceeding = await running_root(store, active)
    await events.barrier(active)
    assert events.of(proceeding.run_id) == []


async def test_a_child_start_publishes_child_run_linked_on_the_parent(events: Events) -> None:
    store = events.store
    session_id, parent = await session_with_root(store)
    child = child_start(session_id, parent, tool_name="research", tool_call_id="toolu_01", link_key="link-1")
    await start(store, child)

    [(record, linked)] = await events.wait(parent.run_id, 1)
    assert record.key == session_id.encode()
    assert (linked.type.value, linked.event_key, linked.session_id) == (
        "child_run_linked",
        "link-1",
        session_id,
    )
    assert linked.payload == {
        "tool_name": "research",
        "tool_call_id": "toolu_01",
        "child_run_id": child.run.run_id,
        "child_agent_id": child.run.agent_id,
    }
    retried = await start(store, child)  # an exact retry: the same event again
    assert retried.parent_link is not None and retried.parent_link.inserted is False
    again = await events.wait(parent.run_id, 2)
    assert again[1][1].dedup_key() == linked.dedup_key()
    assert events.of(child.run.run_id) == [], "the child's own start publishes nothing"

    # Sessionless: keyed by the parent's run id.
    lone_parent: RunStart = await running_one_shot(store)
    lone_child = one_shot_child(lone_parent, link_key="link-lone")
    await start(store, lone_child)
    [(lone_record, lone_linked)] = await events.wait(lone_parent.run_id, 1)
    assert lone_record.key == lone_parent.run_id.encode()
    assert (lone_linked.event_key, lone_linked.session_id) == ("link-lone", "")


async def test_appends_publish_non_terminal_phases_assistant_turns_and_their_usage_only(
    events: Events,
) -> None:
    store = events.store
    session_id, run = await session_with_root(store)
    messages = (
        b'[{"role":"user","parts":[{"kind":"text","text":"hi"}]},'
        b'{"role":"assistant","parts":[{"kind":"text","text":"hello"}],'
        b'"meta":{"usage":{"input_tokens":12,"output_tokens":3}}}]'
    )
    for record in (
        ordinary(run, "p1", payload=b'{"phase":"planning"}'),
        ordinary(run, "p2", payload=b'{"phase":"completed"}'),  # terminal phases come from the close
        ordinary(run, "t1", record_type="transcript_messages_appended", payload=messages),
        ordinary(run, "u1", record_type="usage", payload=b'{"input_tokens":1}'),
        ordinary(run, "bad", payload=b"not json"),
    ):
        await store.append_run_record(record)
    await events.barrier(session_id)
    published = events.of(run.run_id)
    assert [(event.type.value, event.event_key) for _, event in published] == [
        ("workflow", "p1"),
        ("assistant_turn", "t1/1"),
        ("usage", "t1/1"),
    ]
    assert published[0][1].payload == {"phase": "planning"}
    assert published[1][1].payload == {
        "message": {
            "role": "assistant",
            "parts": [{"kind": "text", "text": "hello"}],
            "meta": {"usage": {"input_tokens": 12, "output_tokens": 3}},
        }
    }
    assert published[2][1].payload == {"input_tokens": 12, "output_tokens": 3}


async def test_a_step_and_a_terminal_carrying_records_publish_their_records_events_in_order(
    events: Events,
) -> None:
    store = events.store
    session_id, run = await session_with_root(store)
    answer = (
        b'[{"role":"assistant","parts":[{"kind":"text","text":"42"}],'
        b'"meta":{"usage":{"input_tokens":5,"output_tokens":1}}}]'
    )
    await store.append_run_records(
        [
            ordinary(run, "phase-1", payload=b'{"phase":"planning"}'),
            ordinary(run, "bad", payload=b"not json"),  # no event, and the step's others still have theirs
            ordinary(run, "phase-2", payload=b'{"phase":"synthesizing"}'),
        ]
    )
    await store.record_run_terminal(
        terminal(run, key="the-end", timestamp=ms(60)),
        [ordinary(run, "answer", record_type="transcript_messages_appended", payload=answer)],
    )
    await events.barrier(session_id)
    assert events.types(run.run_id) == [
        ("workflow", "phase-1"),
        ("workflow", "phase-2"),
        ("assistant_turn", "answer/0"),
        ("usage", "answer/0"),
        ("workflow", "the-end"),
        ("run_stream_end", "the-end/end"),
    ]


async def test_a_start_carrying_first_records_publishes_their_events_only_when_it_proceeds(
    events: Events,
) -> None:
    store = events.store
    active = await open_session(store)
    proceeding = root_start(active)
    phase = ordinary(proceeding.run, "phase/1/planning", payload=b'{"phase":"planning"}')
    await store.start_root_run(*proceeding, [ordinary(proceeding.run, "context", payload=b'{"x":1}'), phase])

    ended = await ended_session(store)
    stopping = root_start(ended)
    stopped_phase = ordinary(stopping.run, "phase/1/planning", payload=b'{"phase":"planning"}')
    await store.start_root_run(*stopping, [stopped_phase])

    await events.barrier(active)
    assert events.types(proceeding.run.run_id) == [("workflow", "phase/1/planning")]
    # One command's events go out in order, a stopped start's closing pair last: a phase event
    # would have come before it.
    await events.wait(stopping.run.run_id, 2)
    assert [kind for kind, _ in events.types(stopping.run.run_id)] == ["workflow", "run_stream_end"]
