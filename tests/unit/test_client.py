"""`quipu.Client` builds the requests the gateway and `quipu run` build, over any store.

An in-memory store stands in for the storage owner and a recording publisher for the broker:
what is checked is what the Client would put on `runs.requested` and `runs.control`.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import quipu
from quipu.client import Client, RunResult
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.runs import CancelRun, RunKind, RunRequested
from quipu.contracts.store import CancellationReason, RunStatus, SessionOwner, SessionStatus
from quipu.contracts.transcript import Message, TextPart, ToolUsePart
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.run_publisher import request_principal
from quipu.services.domain.run_requests import MAX_TEXT_CHARS, RequestRefusedError, request_event_id
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.kit.settings import KafkaSettings
from tests.conformance.builders import (
    complete,
    open_session,
    root_start,
    running_root,
    session_with_root,
    suspend,
)


class RecordingPublisher:
    """Keeps what would have been published."""

    def __init__(self) -> None:
        self.sent: list[RunRequested | CancelRun] = []

    async def publish(self, message: RunRequested | CancelRun) -> None:
        self.sent.append(message)


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore()


@pytest.fixture
def sent() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def client(store: InMemoryStore, sent: RecordingPublisher) -> Client:
    return Client(
        KafkaSettings(bootstrap="127.0.0.1:9"),
        tenant_id="acme",
        principal_id="ada",
        store=store,
        publisher=sent,
    )


def test_client_is_exported_from_the_import_root() -> None:
    assert quipu.Client is Client
    assert "Client" in quipu.__all__


async def test_a_turn_creates_its_session_for_the_principal_and_publishes_one_request(
    client: Client, store: InMemoryStore, sent: RecordingPublisher
) -> None:
    run_id = await client.run("hello there", session_id="s-1", agent_id="helper", labels={"k": "v"})

    (request,) = sent.sent
    assert isinstance(request, RunRequested)
    assert request.kind is RunKind.TURN
    assert (request.run_id, request.session_id, request.agent_id) == (run_id, "s-1", "helper")
    assert (request.tenant_id, request.principal_id, request.text) == ("acme", "ada", "hello there")
    assert request.labels == {"k": "v"}
    assert request.event_id == request_event_id(run_id) and request.correlation_id == run_id
    session = await store.load_session_status("s-1")
    assert session.owner == SessionOwner(tenant_id="acme", principal_id="ada")


async def test_the_same_run_id_is_the_same_request_and_a_call_may_speak_for_another_principal(
    client: Client, sent: RecordingPublisher
) -> None:
    first = await client.run("hi", session_id="s-2", run_id="run-fixed")
    again = await client.run("hi", session_id="s-2", run_id="run-fixed", principal_id="grace")

    assert first == again == "run-fixed"
    assert sent.sent[0].event_id == sent.sent[1].event_id
    assert [message.principal_id for message in sent.sent if isinstance(message, RunRequested)] == [
        "ada",
        "grace",
    ]


async def test_without_a_session_the_turn_is_a_one_shot_run(
    client: Client, store: InMemoryStore, sent: RecordingPublisher
) -> None:
    await client.run("once")

    (request,) = sent.sent
    assert isinstance(request, RunRequested) and request.session_id == ""
    assert request.partition_key() == request.run_id


async def test_a_turn_in_an_ended_session_is_refused_before_anything_is_sent(
    client: Client, store: InMemoryStore, sent: RecordingPublisher
) -> None:
    await store.create_session("s-ended", utc_now_ms())
    ended = await store.end_session("s-ended", utc_now_ms())
    assert ended.status is SessionStatus.ENDED

    with pytest.raises(RequestRefusedError) as refused:
        await client.run("too late", session_id="s-ended")

    assert refused.value.code == ErrorCode.SESSION_ENDED.value
    assert sent.sent == []


async def test_a_turn_over_the_limit_is_a_validation_error_and_nothing_is_sent(
    client: Client, sent: RecordingPublisher
) -> None:
    with pytest.raises(ValidationError, match=f"at most {MAX_TEXT_CHARS} characters"):
        await client.run("x" * (MAX_TEXT_CHARS + 1), session_id="s-3")
    with pytest.raises(ValidationError):
        await client.run("", session_id="s-3")
    assert sent.sent == []


async def test_an_answer_continues_the_suspended_run_in_its_session(
    client: Client, store: InMemoryStore, sent: RecordingPublisher
) -> None:
    session_id, root = await session_with_root(store)
    await suspend(store, root)

    continuation = await client.answer(root.run_id, {"city": "Quito"}, continuation_id="run-next")

    (request,) = sent.sent
    assert isinstance(request, RunRequested) and continuation == "run-next"
    assert request.kind is RunKind.RESUME
    assert (request.session_id, request.agent_id, request.predecessor_run_id) == (
        session_id,
        root.agent_id,
        root.run_id,
    )
    assert request.answer == {"city": "Quito"} and request.causation_id == root.run_id
    assert (request.tenant_id, request.principal_id) == ("acme", "ada")


async def test_an_answer_from_a_client_that_names_no_one_speaks_for_the_runs_person(
    store: InMemoryStore, sent: RecordingPublisher
) -> None:
    # The continuation is the suspended run's person's (the planner inherits them), so its request
    # is sealed under their key: forgetting them reaches the answer on runs.requested too.
    session_id = await open_session(store)
    start = root_start(session_id)
    run = start.run.model_copy(update={"tenant_id": "acme", "principal_id": "erin"})
    await store.start_root_run(run, start.started, start.stopped)
    await suspend(store, run)
    worker = Client(KafkaSettings(bootstrap="127.0.0.1:9"), store=store, publisher=sent)

    await worker.answer(run.run_id, "yes")

    (request,) = sent.sent
    assert isinstance(request, RunRequested)
    assert (request.tenant_id, request.principal_id) == ("acme", "erin")
    assert request_principal(request) == "erin"


async def test_an_answer_to_a_run_that_waits_for_none_is_refused(
    client: Client, store: InMemoryStore, sent: RecordingPublisher
) -> None:
    _, root = await session_with_root(store)
    with pytest.raises(RequestRefusedError) as refused:
        await client.answer(root.run_id, "yes")
    assert refused.value.code == "RUN_NOT_SUSPENDED" and "running" in refused.value.message
    assert sent.sent == []


async def test_a_cancel_names_the_run_and_the_reason_and_is_refused_once_the_run_ended(
    client: Client, store: InMemoryStore, sent: RecordingPublisher
) -> None:
    session_id, root = await session_with_root(store)

    await client.cancel(root.run_id)

    (cancel,) = sent.sent
    assert isinstance(cancel, CancelRun)
    assert (cancel.run_id, cancel.session_id, cancel.reason) == (
        root.run_id,
        session_id,
        CancellationReason.USER_REQUESTED,
    )
    assert cancel.tenant_id == "acme"
    with pytest.raises(RequestRefusedError) as refused:
        await client.cancel(root.run_id, CancellationReason.SESSION_ENDED)
    assert refused.value.invalid

    other = await running_root(store, session_id)
    await complete(store, other)
    with pytest.raises(RequestRefusedError, match="not running"):
        await client.cancel(other.run_id)
    assert len(sent.sent) == 1


async def test_status_is_the_stored_run_and_an_unknown_run_is_a_store_error(
    client: Client, store: InMemoryStore
) -> None:
    _, root = await session_with_root(store)
    assert (await client.status(root.run_id)).status is RunStatus.RUNNING
    with pytest.raises(StoreError) as missing:
        await client.status("run-nobody")
    assert missing.value.code is ErrorCode.RUN_NOT_FOUND


async def test_pending_inputs_is_what_the_last_suspension_waits_for(
    client: Client, store: InMemoryStore
) -> None:
    _, root = await session_with_root(store)
    await suspend(store, root)
    assert await client.pending_inputs(root.run_id) == 1


async def test_a_result_says_what_the_agent_said_last(store: InMemoryStore) -> None:
    _, root = await session_with_root(store)
    meta = await store.load_run(root.run_id)
    messages = [
        Message(role="user", parts=[TextPart(text="calculate 6*7")]),
        Message(
            role="assistant", parts=[TextPart(text="Calling "), ToolUsePart(id="t1", name="c", input={})]
        ),
        Message(role="assistant", parts=[TextPart(text="The calculator "), TextPart(text="says 42.")]),
    ]
    assert RunResult(meta=meta, messages=messages).text == "The calculator says 42."
    assert RunResult(meta=meta, messages=messages[:1]).text == ""
    assert RunResult(meta=meta, messages=messages).status is RunStatus.RUNNING
