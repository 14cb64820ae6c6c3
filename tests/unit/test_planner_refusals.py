"""Requests the planner refuses before a run starts: the caller hears why, history loses nothing.

A turn whose principal is not its session's would be answered and then refused by the history
(the turn lost); a request into a session that does not exist, or one that does not validate,
used to go to the DLQ with nobody told. Each is refused before any model call, and the run's
stream gets a failed `workflow` with the typed reason, then `run_stream_end`.
"""

from __future__ import annotations

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.events import StreamEventType
from quipu.contracts.runs import RunRequested, TurnCompleted
from quipu.contracts.store import SessionOwner
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.summary import Summarizer
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.kit.delivery import PermanentError
from quipu.services.transcript_recorder.logic import TranscriptRecorder
from tests.unit.test_planner_runs import Harness, make_harness, says, turn


def harness_with_history() -> tuple[Harness, InMemoryMemoryStore]:
    """A planner whose sessions are claimed in `memory`, the store the recorder writes to."""
    memory = InMemoryMemoryStore()
    return make_harness(lambda request: says("Here you are."), history=memory), memory


def refusal(h: Harness, run_id: str) -> tuple[str, bool]:
    """The refusal's failure kind on the run's stream, and whether the stream was ended."""
    [workflow] = [event for event in h.bus.events(StreamEventType.WORKFLOW) if event.run_id == run_id]
    ended = any(event.run_id == run_id for event in h.bus.events(StreamEventType.RUN_STREAM_END))
    assert workflow.payload["phase"] == "failed" and workflow.payload["failure"]["message"]
    return str(workflow.payload["failure"]["kind"]), ended


async def record_every_turn(h: Harness, memory: InMemoryMemoryStore) -> int:
    """Give every finished turn to a real recorder, as `history.turns` would; how many it kept."""
    recorder = TranscriptRecorder(memory, Summarizer(ScriptedModel(), 200))
    for finished in h.bus.of(TurnCompleted):
        await recorder.record(finished)
    return len(h.bus.of(TurnCompleted))


async def test_a_turn_by_someone_else_in_alices_session_is_refused_before_any_model_call() -> None:
    h, memory = harness_with_history()
    session = await h.session()
    await h.deliver(turn("my name is Alice", session, principal_id="alice"))
    anonymous = turn("what is my name?", session)  # `quipu run --session S` without --principal
    mallory = turn("what is my name?", session, principal_id="mallory")

    for intruder in (anonymous, mallory):
        with pytest.raises(PermanentError, match="another principal"):
            await h.deliver(intruder)
        assert refusal(h, intruder.run_id) == (ErrorCode.SESSION_PRINCIPAL_MISMATCH.value, True)
        with pytest.raises(StoreError):
            await h.store.load_run(intruder.run_id)  # no run was started
    assert len(h.model.requests) == 1  # only alice's turn was answered

    await h.deliver(turn("thanks", session, principal_id="alice"))
    # Every answer given is in the history: the recorder refuses none of them.
    assert await record_every_turn(h, memory) == 2
    rows = await memory.list_history(session, 0, 500)
    assert [row.text for row in rows] == ["my name is Alice", "Here you are.", "thanks", "Here you are."]


async def test_a_session_the_gateway_created_is_its_creators_before_any_turn() -> None:
    h, memory = harness_with_history()
    session = await h.session(SessionOwner(tenant_id="t1", principal_id="alice"))
    bob = turn("what did alice say?", session, principal_id="bob", tenant_id="t1")
    with pytest.raises(PermanentError, match="another principal"):
        await h.deliver(bob)  # the first turn, straight onto `runs.requested`
    assert refusal(h, bob.run_id) == (ErrorCode.SESSION_PRINCIPAL_MISMATCH.value, True)
    assert h.model.requests == []

    await h.deliver(turn("hello", session, principal_id="alice", tenant_id="t1"))
    assert len(h.model.requests) == 1
    assert await record_every_turn(h, memory) == 1
    assert [row.text for row in await memory.list_history(session, 0, 500)] == ["hello", "Here you are."]


async def test_an_anonymous_session_stays_anonymous_and_its_turns_are_all_recorded() -> None:
    h, memory = harness_with_history()
    session = await h.session()
    await h.deliver(turn("hello", session))
    await h.deliver(turn("hello again", session))
    alice = turn("I am alice now", session, principal_id="alice")
    with pytest.raises(PermanentError):
        await h.deliver(alice)
    assert refusal(h, alice.run_id)[0] == ErrorCode.SESSION_PRINCIPAL_MISMATCH.value
    assert await record_every_turn(h, memory) == 2
    assert len(await memory.list_history(session, 0, 500)) == 4


async def test_the_tenant_of_a_turn_goes_with_it_to_the_history() -> None:
    h, memory = harness_with_history()
    session = await h.session()
    await h.deliver(turn("hi", session, principal_id="alice", tenant_id="t1"))
    other_tenant = turn("hi", session, principal_id="alice", tenant_id="t2")
    with pytest.raises(PermanentError):
        await h.deliver(other_tenant)
    [finished] = h.bus.of(TurnCompleted)
    assert finished.tenant_id == "t1"
    assert await record_every_turn(h, memory) == 1


async def test_a_request_into_a_session_that_does_not_exist_is_told_so_on_its_stream() -> None:
    h, _ = harness_with_history()
    request = turn("hello", "no-such-session")
    with pytest.raises(PermanentError, match="SESSION_NOT_FOUND"):
        await h.deliver(request)
    assert refusal(h, request.run_id) == (ErrorCode.SESSION_NOT_FOUND.value, True)
    assert h.model.requests == []
    [workflow] = h.bus.events(StreamEventType.WORKFLOW)
    assert workflow.session_id == "no-such-session"  # the stream the caller follows


async def test_a_request_naming_an_unknown_agent_is_told_so_on_its_stream() -> None:
    h, _ = harness_with_history()
    session = await h.session()
    request = RunRequested(run_id="r-nobody", session_id=session, agent_id="nobody", text="hi")
    with pytest.raises(PermanentError, match="not registered"):
        await h.deliver(request)
    assert refusal(h, request.run_id)[0] == "AGENT_NOT_FOUND"


async def test_an_invalid_request_that_names_its_run_is_told_why() -> None:
    h, _ = harness_with_history()
    await h.planner.on_invalid_request(b'{"run_id": "r-1", "session_id": "s-1"}', "agent_id: Field required")
    assert refusal(h, "r-1") == (ErrorCode.INVALID_ARGUMENT.value, True)
    [workflow] = h.bus.events(StreamEventType.WORKFLOW)
    assert workflow.session_id == "s-1" and "agent_id" in workflow.payload["failure"]["message"]


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"session_id": "s-1"}', b'{"run_id": 7}'])
async def test_an_invalid_request_without_a_run_id_has_no_stream_to_tell(body: bytes) -> None:
    h, _ = harness_with_history()
    await h.planner.on_invalid_request(body, "invalid")
    assert h.bus.messages == []


async def test_a_refusal_never_ends_a_run_that_exists() -> None:
    h, _ = harness_with_history()
    started = await h.start("hello")
    published = len(h.bus.messages)
    body = RunRequested(
        run_id=started.run_id, session_id=started.session_id, agent_id="x", text=""
    ).model_dump_json()
    await h.planner.on_invalid_request(body.encode(), "forged")
    assert len(h.bus.messages) == published
