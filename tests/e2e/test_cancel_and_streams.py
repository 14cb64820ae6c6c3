"""Cancellation, suspension and the live event streams, end to end through the gateway and `quipu run`.

Every service is its own process (tests/e2e/agent_support.py): the storage owner, the planner
(scripted model), the tool executor (the shipped tools, journaled; the calculator takes 1.7 s so
a cancel lands while it runs) and the gateway (`python -m quipu.services.gateway`). The test is a
user: it talks HTTP to the gateway, follows the session's Server-Sent Events with httpx, and runs
`quipu run` (the typer command itself, in a worker thread, as a shell would).

- A turn that called the math_agent is canceled while the child's calculator runs: both runs
  end `canceled` with reason `user_requested` in the store (LoadRun, the intent record, the
  `run_completed` record) and on the stream (terminal `workflow` with `cancellation.reason`);
  the executor canceled the child's call in flight and answered nothing.
- `confirm ...` suspends (an `await_clarification` event); a cancel cannot end a suspended run;
  the answer starts a continuation in the same session that completes, and the predecessor
  names it as its successor.
- `quipu run` and the SSE endpoint show the same events of a run, in the same order.
- the gateway refuses (409) the cancel of a suspended run, which the store refuses too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.lifecycle import decode_run_completed, decode_run_started
from quipu.contracts.store import LifecycleType, RunStatus
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services import cli
from quipu.services.cli.render import EventPrinter
from quipu.services.domain.transcript import build_messages_from_run_log, validate_planner_transcript
from quipu.services.planner.logic.view import final_text
from tests.e2e.agent_support import (
    Deployment,
    distinct,
    eventually,
    phases,
    terminal_workflow,
)
from tests.support.gateway_keys import ADMIN_PRINCIPAL
from tests.timing import scaled

pytestmark = pytest.mark.slow

CALCULATOR_DELAY_S = 1.7
"""Long enough for a cancel to reach a running calculator; within the tool's 2 s deadline."""


class SseFollower:
    """A client of `GET /v1/sessions/{id}/events`: every event received, with its SSE id."""

    def __init__(self, base_url: str, session_id: str, headers: dict[str, str]) -> None:
        self.session_id = session_id
        self.events: list[RunEvent] = []
        self.ids: list[str] = []
        self._client = httpx.AsyncClient(
            base_url=base_url, timeout=httpx.Timeout(scaled(10.0), read=None), headers=headers
        )
        self._opened = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> SseFollower:
        self._task = asyncio.create_task(self._read(), name=f"sse {self.session_id}")
        opened = asyncio.create_task(self._opened.wait())
        await asyncio.wait({opened, self._task}, timeout=scaled(20.0), return_when=asyncio.FIRST_COMPLETED)
        if not self._opened.is_set():
            opened.cancel()
            if self._task.done():
                await self._task  # raises what went wrong
            raise AssertionError(f"the event stream of {self.session_id} did not open")
        return self

    async def _read(self) -> None:
        path = f"/v1/sessions/{self.session_id}/events"
        async with self._client.stream("GET", path) as response:
            assert response.status_code == 200, await response.aread()
            assert response.headers["content-type"].startswith("text/event-stream")
            fields: dict[str, str] = {}
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    self._opened.set()  # the stream's opening comment
                elif not line:
                    if "data" in fields:
                        event = RunEvent.model_validate_json(fields["data"])
                        assert fields.get("event") == event.type.value
                        self.ids.append(fields.get("id", ""))
                        self.events.append(event)
                    fields = {}
                else:
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")

    def of(self, run_id: str) -> list[RunEvent]:
        return [event for event in self.events if event.run_id == run_id]

    async def until(self, run_id: str, type_: StreamEventType, within: float = 30.0) -> RunEvent:
        def found() -> RunEvent | None:
            if self._task is not None and self._task.done():
                raise AssertionError(f"the event stream ended: {self._task!r}")
            return next((e for e in self.of(run_id) if e.type is type_), None)

        found_event: RunEvent = await eventually(
            found, within, f"{type_.value} of {run_id} on the SSE stream"
        )
        return found_event

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task
        await self._client.aclose()


@pytest.fixture(scope="module")
async def deployment(
    stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployment]:
    name = f"cancel{uuid.uuid4().hex[:8]}"
    async with Deployment(
        stack,
        f"{name}.",
        name,
        tmp_path_factory.mktemp("cancel-and-streams"),
        tool_delays={"calculator": CALCULATOR_DELAY_S},
        with_gateway=True,
    ) as deployment:
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=deployment.gateway_url, timeout=scaled(5.0)) as http:

            async def gateway_up() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return (await http.get("/healthz")).status_code == 200
                return False

            await eventually(gateway_up, 45.0, "the gateway answers", interval=0.1)
        session = await deployment.session()
        warm = await deployment.turn(session, "what time is it")  # every service answered once
        await deployment.until_closed(warm.run_id, within=45.0)
        print(f"deployment serving after {time.monotonic() - started:.1f} s")
        yield deployment


@pytest.fixture
async def http(deployment: Deployment) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=deployment.gateway_url, timeout=scaled(15.0), headers=deployment.gateway_headers
    ) as client:
        yield client


@contextlib.asynccontextmanager
async def session_stream(deployment: Deployment, http: httpx.AsyncClient) -> AsyncIterator[SseFollower]:
    """A new session (through the gateway) and its event stream, followed from its beginning."""
    created = await http.post("/v1/sessions", json={})
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    follower = await SseFollower(deployment.gateway_url, session_id, deployment.gateway_headers).start()
    try:
        yield follower
    finally:
        await follower.stop()


def cancellation_of(events: list[RunEvent]) -> tuple[str, str, str]:
    """(phase, status, cancellation reason) of a run's terminal workflow event."""
    payload = terminal_workflow(events).payload
    return payload["phase"], payload["status"], payload.get("cancellation", {}).get("reason", "")


async def assert_canceled_in_store(deployment: Deployment, run_id: str, reason: str) -> None:
    """LoadRun, the intent record and the `run_completed` record all say `canceled` for `reason`."""
    meta = await deployment.store.load_run(run_id)
    assert (meta.status, meta.cancellation_reason) == (RunStatus.CANCELED, reason)
    records = await deployment.records(run_id)
    intents = [r for r in records if r.type == LifecycleType.CANCELLATION_INTENT.value]
    assert [json.loads(r.payload) for r in intents] == [{"reason": reason}]
    [terminal] = [r for r in records if r.type == LifecycleType.RUN_COMPLETED.value]
    completed = decode_run_completed(terminal.payload)
    assert (terminal.event_key, completed.run_status, completed.cancellation_reason) == (
        "canceled",
        RunStatus.CANCELED,
        reason,
    )


async def test_a_canceled_turn_ends_canceled_with_its_child_in_the_store_and_on_the_stream(
    deployment: Deployment, http: httpx.AsyncClient
) -> None:
    async with session_stream(deployment, http) as stream:
        accepted = await http.post(
            "/v1/runs",
            json={
                "agent_id": "assistant",
                "session_id": stream.session_id,
                "text": "ask the math_agent to calculate 6*7",
            },
        )
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        link = await stream.until(run_id, StreamEventType.CHILD_RUN_LINKED)
        child = link.payload["child_run_id"]
        await eventually(
            lambda: any(e.tool == "calculator" for e in deployment.executions(child)),
            30.0,
            "the child's calculator runs",
        )

        started = time.monotonic()
        canceled = await http.post(f"/v1/runs/{run_id}/cancel", json={"reason": "user_requested"})
        assert canceled.status_code == 202, canceled.text
        await stream.until(run_id, StreamEventType.RUN_STREAM_END)
        await stream.until(child, StreamEventType.RUN_STREAM_END)
        ended_s = time.monotonic() - started

        assert cancellation_of(stream.of(run_id)) == ("canceled", "canceled", "user_requested")
        assert cancellation_of(stream.of(child)) == ("canceled", "canceled", "user_requested")
    await assert_canceled_in_store(deployment, run_id, "user_requested")
    await assert_canceled_in_store(deployment, child, "user_requested")
    assert (await deployment.store.load_run(child)).parent_run_id == run_id

    # The executor canceled the child's calculator in flight, and answered nothing for it.
    await eventually(
        lambda: [e.event for e in deployment.executions(child)] == ["start", "canceled"],
        10.0,
        f"the child's calculator canceled: {deployment.executions(child)}",
    )
    assert deployment.tool_results(child) == []
    parent_keys = [record.event_key for record in await deployment.records(run_id)]
    assert not [key for key in parent_keys if key.startswith("tool-result/")]  # closed before any answer

    refused = await http.post(f"/v1/runs/{run_id}/cancel", json={})
    assert refused.status_code == 409 and refused.json()["code"] == "RUN_NOT_ACTIVE", refused.text
    print(f"cancel: both runs closed {ended_s * 1000:.0f} ms after the request")


async def test_a_suspended_turn_is_answered_and_continued_in_the_same_session(
    deployment: Deployment, http: httpx.AsyncClient
) -> None:
    async with session_stream(deployment, http) as stream:
        session = stream.session_id
        accepted = await http.post(
            "/v1/runs",
            json={"agent_id": "assistant", "session_id": session, "text": "confirm deleting the notes"},
        )
        assert accepted.status_code == 202, accepted.text
        first = accepted.json()["run_id"]
        ask = await stream.until(first, StreamEventType.AWAIT_CLARIFICATION)
        # The planner publishes the question once the suspension committed; the owner's closing
        # events may come before or after it (two producers): wait for both.
        await stream.until(first, StreamEventType.RUN_STREAM_END)
        assert ask.payload["prompt"] == "Do you confirm: deleting the notes?"
        assert ask.payload["details"]["choices"] == ["yes", "no"]
        assert phases(stream.of(first))[-1] == "suspended"
        assert (await http.get(f"/v1/runs/{first}")).json()["status"] == "suspended"

        # A suspended run cannot be canceled: the gateway refuses, it stays suspended and answerable.
        refused = await http.post(f"/v1/runs/{first}/cancel", json={})
        assert refused.status_code == 409 and refused.json()["code"] == "RUN_NOT_ACTIVE", refused.text
        meta = await deployment.store.load_run(first)
        assert (meta.status, meta.cancellation_reason) == (RunStatus.SUSPENDED, "")

        answered = await http.post(f"/v1/runs/{first}/answer", json={"answer": "yes"})
        assert answered.status_code == 202, answered.text
        second = answered.json()["run_id"]
        assert second != first and answered.json()["session_id"] == session
        await stream.until(second, StreamEventType.RUN_STREAM_END)
        assert phases(distinct(stream.of(second))) == ["synthesizing", "completed"]

    predecessor = await deployment.store.load_run(first)
    assert (predecessor.status, predecessor.successor_run_id) == (RunStatus.SUSPENDED, second)
    successor = await deployment.store.load_run(second)
    assert (successor.status, successor.session_id) == (RunStatus.COMPLETED, session)
    [started] = [r for r in await deployment.records(second) if r.type == LifecycleType.RUN_STARTED.value]
    assert decode_run_started(started.payload).predecessor_run_id == first
    messages = await build_messages_from_run_log(deployment.store, second)
    validate_planner_transcript(messages)
    assert final_text(messages) == 'You answered: "yes".'

    again = await http.post(f"/v1/runs/{first}/answer", json={"answer": "no"})
    assert again.status_code == 409 and again.json()["code"] == "RUN_CONFLICT", again.text


async def test_canceling_a_suspended_run_is_refused_by_the_gateway(
    deployment: Deployment, http: httpx.AsyncClient
) -> None:
    async with session_stream(deployment, http) as stream:
        turn = {"agent_id": "assistant", "session_id": stream.session_id, "text": "ask me a thing"}
        accepted = await http.post("/v1/runs", json=turn)
        run_id = accepted.json()["run_id"]
        await stream.until(run_id, StreamEventType.RUN_STREAM_END)
    assert (await deployment.store.load_run(run_id)).status is RunStatus.SUSPENDED
    refused = await http.post(f"/v1/runs/{run_id}/cancel", json={})
    assert refused.status_code == 409 and refused.json()["code"] == "RUN_NOT_ACTIVE", refused.text


async def test_quipu_run_shows_the_same_events_as_the_sse_stream(
    deployment: Deployment, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[RunEvent] = []
    show = EventPrinter.show

    def recording(printer: EventPrinter, event: RunEvent) -> None:
        shown.append(event)
        show(printer, event)

    monkeypatch.setattr(EventPrinter, "show", recording)
    environment = {
        "QUIPU_KAFKA_BOOTSTRAP": deployment.stack.bootstrap,
        "QUIPU_KAFKA_FLAVOUR": deployment.stack.kafka_flavour,
        "QUIPU_KAFKA_TOPIC_PREFIX": deployment.prefix,
    }
    async with session_stream(deployment, http) as stream:
        text = "calculate 6*7; ask the math_agent to calculate 2+3"
        # The session is the gateway caller's (its owner from the credential): the CLI names it.
        session = ["--session", stream.session_id, "--principal", ADMIN_PRINCIPAL]
        arguments = ["run", text, *session, "--no-interactive", "--timeout", "60"]
        started = time.monotonic()
        result: Any = await asyncio.to_thread(CliRunner().invoke, cli.app, arguments, env=environment)
        cli_s = time.monotonic() - started
        assert result.exit_code == 0, result.output
        assert "✓ completed" in result.output and "The calculator says 42." in result.output
        run_ids = {event.run_id for event in shown}
        assert len(run_ids) == 1, run_ids
        [run_id] = run_ids
        await stream.until(run_id, StreamEventType.RUN_STREAM_END)
        await asyncio.sleep(0.5)  # anything published after the end would show here (and not in the CLI)

        def identities(events: list[RunEvent]) -> list[tuple[str, str, str]]:
            return [(e.run_id, e.type.value, e.event_key) for e in events]

        assert identities(shown) == identities(stream.of(run_id))
    kinds = {event.type for event in shown}
    assert {
        StreamEventType.WORKFLOW,
        StreamEventType.ASSISTANT_REPLY,
        StreamEventType.ASSISTANT_TURN,
        StreamEventType.CHILD_RUN_LINKED,
        StreamEventType.RUN_STREAM_END,
    } <= kinds
    assert phases(shown) == ["planning", "executing_tools", "synthesizing", "completed"]
    print(f"quipu run: {len(shown)} events, {cli_s:.1f} s; the SSE stream showed the same")
