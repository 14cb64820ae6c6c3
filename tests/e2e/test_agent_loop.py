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

import pytest

from quipu.contracts.events import StreamEventType
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import (
    TRANSCRIPT_MESSAGES_SEEDED,
    TextPart,
    ToolResultPart,
    ToolUsePart,
    decode_messages,
)
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.transcript import build_messages_from_run_log, validate_planner_transcript
from quipu.services.planner.adapters import load_records
from tests.e2e.agent_support import Deployment, phases

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def deployment(
    stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployment]:
    prefix = f"e2e{uuid.uuid4().hex[:8]}."
    log_dir = tmp_path_factory.mktemp("agent-loop-logs")
    async with Deployment(stack, prefix, prefix.rstrip("."), log_dir, executor_module=EXECUTOR) as deployment:
        yield deployment


EXECUTOR = "quipu.services.tool_executor"
"""The product's own executor entry point (the other e2e files journal their tools)."""


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
    tool_results = await deployment.results.wait_for(
        lambda rs: sum(request.run_id.encode() in (r.value or b"") for r in rs) == 2
    )
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
    await deployment.kill_planner()
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
