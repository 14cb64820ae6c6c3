"""`make demo`: the embedded stack, the storage owner, and a scripted session driven end to end.

Every lifecycle step goes through the Kafka store client to the storage owner, which commits it to
MongoDB and only then publishes its stream events; the events are printed live as they arrive on
`runs.events`, beside the steps that caused them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer
from rich.console import Console

from contracts.errors import StoreError
from contracts.events import RUN_PHASE_CHANGED, RunEvent
from contracts.lifecycle import (
    encode_cancellation_intent,
    encode_child_run_linked,
    encode_run_completed,
    encode_run_started,
    encode_run_suspended,
)
from contracts.store import CancellationReason, Checkpoint, Record, RunStart, RunStatus
from contracts.topics import Topic
from contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED
from contracts.wire import utc_now_ms
from deploy.local.stack import EmbeddedStack, create_topics
from services.kit.settings import KafkaSettings
from services.kit.store.client import KafkaStore
from services.kit.store.protocol import Store
from services.storage_owner.app import create_app

console = Console()


def _record(run: RunStart, key: str, type_: str, payload: bytes) -> Record:
    return Record(
        event_key=key,
        run_id=run.run_id,
        agent_id=run.agent_id,
        session_id=run.session_id,
        type=type_,
        payload=payload,
        timestamp=utc_now_ms(),
    )


def _start_records(run: RunStart) -> tuple[Record, Record]:
    started = _record(run, f"{run.run_id}/started", "run_started", encode_run_started(run))
    stopped = _record(
        run,
        f"{run.run_id}/stopped",
        "run_completed",
        encode_run_completed(RunStatus.CANCELED, run.labels, cancellation_reason="session_ended"),
    )
    stamped = {"timestamp": run.started_at}
    return started.model_copy(update=stamped), stopped.model_copy(update=stamped)


def _phase(run: RunStart, phase: str) -> Record:
    return _record(
        run, f"{run.run_id}/phase/{phase}", RUN_PHASE_CHANGED, json.dumps({"phase": phase}).encode()
    )


def _messages(run: RunStart, key: str, *messages: dict[str, Any]) -> Record:
    return _record(run, key, TRANSCRIPT_MESSAGES_APPENDED, json.dumps(list(messages)).encode())


async def _step(title: str, action: Callable[[], Awaitable[object]]) -> object:
    try:
        result = await action()
    except StoreError as error:
        console.print(f"[bold yellow]✗ {title}[/] → [yellow]{error.code.value}[/]")
        return error
    summary = getattr(result, "model_dump", lambda **_: result)(mode="json")
    console.print(f"[bold green]✓ {title}[/] → {json.dumps(summary)[:150]}")
    await asyncio.sleep(0.15)  # let the live events of this step print next to it
    return result


async def scripted_session(store: Store) -> None:
    """A conversation's lifecycle: a run with a child, a question to the user, its continuation,
    a cancellation, a start after the session ended, paging, and purge."""
    session_id = f"demo-{uuid.uuid4().hex[:6]}"
    await _step(f"create session {session_id}", lambda: store.create_session(session_id, utc_now_ms()))

    root = RunStart(
        run_id=f"{session_id}-run1", agent_id="assistant", session_id=session_id, started_at=utc_now_ms()
    )
    await _step("start root run", lambda: store.start_root_run(root, *_start_records(root)))
    await _step("phase: planning", lambda: store.append_run_record(_phase(root, "planning")))
    user_turn = {
        "role": "user",
        "parts": [{"kind": "text", "text": "What is 6 x 7, and ask the math agent."}],
    }
    tool_use = {
        "role": "assistant",
        "parts": [{"kind": "tool_use", "id": "call-1", "name": "math_agent", "input": {"q": "6*7"}}],
    }
    await _step(
        "record the turn so far",
        lambda: store.append_run_record(_messages(root, "turn-1", user_turn, tool_use)),
    )

    child = RunStart(
        run_id=f"{session_id}-child1",
        agent_id="math_agent",
        session_id=session_id,
        parent_run_id=root.run_id,
        started_at=utc_now_ms(),
    )
    link = _record(
        root,
        f"{root.run_id}/link/call-1",
        "child_run_linked",
        encode_child_run_linked("math_agent", "call-1", child.run_id, child.agent_id),
    )
    await _step(
        "start child run (agent as a tool)",
        lambda: store.start_child_run(child, link, *_start_records(child)),
    )
    await _step(
        "child completes",
        lambda: store.record_run_terminal(
            _record(child, f"{child.run_id}/done", "run_completed", encode_run_completed(RunStatus.COMPLETED))
        ),
    )

    checkpoint = Checkpoint(suspension_id="ask-1", data=b"\x00resume-after-question\xff")
    await _step(
        "suspend: ask the user to confirm",
        lambda: store.record_run_suspension(
            checkpoint,
            _record(
                root,
                f"{root.run_id}/suspend",
                "run_suspended",
                encode_run_suspended("ask-1", "1", 1, ["ask_user"]),
            ),
        ),
    )
    await _step("load the checkpoint", lambda: store.load_run_suspension(root.run_id))

    resumed = RunStart(
        run_id=f"{session_id}-run2",
        agent_id="assistant",
        session_id=session_id,
        predecessor_run_id=root.run_id,
        started_at=utc_now_ms(),
    )
    await _step(
        "continuation after the answer", lambda: store.start_root_run(resumed, *_start_records(resumed))
    )
    rival = resumed.model_copy(update={"run_id": f"{session_id}-run2b"})
    await _step(
        "a second continuation is refused", lambda: store.start_root_run(rival, *_start_records(rival))
    )
    await _step("phase: synthesizing", lambda: store.append_run_record(_phase(resumed, "synthesizing")))
    reply = {"role": "assistant", "parts": [{"kind": "text", "text": "6 x 7 = 42."}]}
    await _step("the answer", lambda: store.append_run_record(_messages(resumed, "turn-1/answer", reply)))
    intent = _record(
        resumed,
        f"{resumed.run_id}/cancel",
        "runtime.cancellation_intent",
        encode_cancellation_intent(CancellationReason.USER_REQUESTED),
    )
    await _step("user cancels", lambda: store.record_run_cancellation(intent))
    await _step(
        "a success after the cancellation is refused",
        lambda: store.record_run_terminal(
            _record(
                resumed, f"{resumed.run_id}/done", "run_completed", encode_run_completed(RunStatus.COMPLETED)
            )
        ),
    )
    canceled = _record(
        resumed,
        f"{resumed.run_id}/canceled",
        "run_completed",
        encode_run_completed(RunStatus.CANCELED, cancellation_reason="user_requested"),
    )
    await _step("the run ends canceled, reason kept", lambda: store.record_run_terminal(canceled))
    await _step("exact retry of that terminal", lambda: store.record_run_terminal(canceled))

    await _step("end the session", lambda: store.end_session(session_id, utc_now_ms()))
    late = RunStart(
        run_id=f"{session_id}-run3", agent_id="assistant", session_id=session_id, started_at=utc_now_ms()
    )
    await _step(
        "a run after the end stops at once", lambda: store.start_root_run(late, *_start_records(late))
    )

    page = await store.list_session_run_records(session_id, "", 5)
    console.print(f"[bold]session records[/], first page: {[r.type for r in page.records]}")
    while page.next_cursor:
        page = await store.list_session_run_records(session_id, page.next_cursor, 5)
        console.print(f"  next page: {[r.type for r in page.records]}")
    runs = await store.list_runs_by_session(session_id, [])
    console.print(f"[bold]runs[/]: {[(r.run_id.rsplit('-', 1)[-1], r.status.value) for r in runs]}")
    await _step("purge the session", lambda: store.purge_session(session_id))
    await _step("the purged session is gone", lambda: store.load_session_status(session_id))


async def _print_events(settings: KafkaSettings, stop: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(
        settings.topic_prefix + Topic.RUNS_EVENTS.value,
        bootstrap_servers=settings.bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
    )
    await consumer.start()
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=100)
            for messages in batches.values():
                for message in messages:
                    event = RunEvent.model_validate_json(message.value or b"{}")
                    console.print(
                        f"    [cyan]⚡ {event.type.value}[/] run={event.run_id.rsplit('-', 1)[-1]} "
                        f"{json.dumps(event.payload)[:100]}"
                    )
    finally:
        await consumer.stop()


async def run_demo() -> None:
    """Start everything, drive the session with live events, stop everything."""
    console.rule("[bold]Quipu demo: embedded Kafka (Tansu) + MongoDB wire (SecantusDB)")
    async with EmbeddedStack() as stack:
        prefix = f"demo{uuid.uuid4().hex[:6]}."
        await create_topics(stack.bootstrap, prefix)
        settings = stack.kafka_settings(topic_prefix=prefix)
        owner = create_app(settings, stack.mongo_settings(database=f"demo_{uuid.uuid4().hex[:6]}"))
        await owner.start()
        console.print(f"stack up: kafka {stack.bootstrap}, storage owner consuming {prefix}storage.commands")
        stop = asyncio.Event()
        events = asyncio.create_task(_print_events(settings, stop))
        try:
            async with KafkaStore(settings) as store:
                await scripted_session(store)
            await asyncio.sleep(0.5)
        finally:
            stop.set()
            await events
            await owner.stop()
    console.rule("[bold green]demo finished")


def main() -> None:
    """Entry point of `python -m services.demo`."""
    asyncio.run(run_demo())


if __name__ == "__main__":
    main()
