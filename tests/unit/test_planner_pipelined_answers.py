"""A run whose first model answer closes it (a plain turn) sends its terminal behind its start.

Over a store that pipelines (here the in-memory one, answering a start sent through `pipeline`
only once the run's next write has been sent, as the owner's reply is still on its way while the
planner sends its next command), the planner calls the model while the start is unanswered and
sends the terminal right behind it, naming the start's records as the log it was decided on
(RecordRunTerminal `follows`). A start that did not simply succeed leaves nothing of the answer:
the terminal is refused, no text is streamed, and the run goes on from the start's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from pydantic import TypeAdapter

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.events import StreamEventType
from quipu.contracts.runs import RunRequested, TurnCompleted
from quipu.contracts.store import LifecycleType, LogBasis, Record, RunStatus
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.domain.store.protocol import Pipeline
from quipu.services.kit.delivery import Delivery
from quipu.services.planner.logic.keys import STARTED_KEY
from tests.support.consumed import Message
from tests.timing import scaled
from tests.unit.test_planner_runs import Harness, make_harness, says, tool_then_answer, turn

T = TypeVar("T")


class RepliesOnTheirWay(InMemoryStore):
    """Applies a call sent through `pipeline` at once, in order, and answers it once the run's
    next write is sent (or, for a planner that waits for the answer first, after a while): `noted`
    says in which order the writes went out and the start was answered, and what each followed."""

    def __init__(self) -> None:
        super().__init__()
        self.noted: list[str] = []
        self.follows: dict[str, LogBasis | None] = {}
        self.refused: dict[str, ErrorCode] = {}
        self._next_write = asyncio.Event()

    @property
    def pipeline(self) -> Pipeline:  # type: ignore[override]  # a direct store has none; this one does
        return self

    async def sent(self, operation: Awaitable[T]) -> asyncio.Task[T]:
        try:
            answer: T | StoreError = await operation
        except StoreError as error:
            answer = error

        async def reply() -> T:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._next_write.wait(), scaled(2.0))
            self.noted.append("start answered")
            if isinstance(answer, StoreError):
                raise answer
            return answer

        return asyncio.ensure_future(reply())

    async def _noting(self, what: str, follows: LogBasis | None, write: Awaitable[T]) -> T:
        self.noted.append(what)
        self.follows[what] = follows
        self._next_write.set()
        try:
            return await write
        except StoreError as error:
            self.refused[what] = error.code
            raise

    async def append_run_records(self, records: Sequence[Record], *, follows: LogBasis | None = None) -> Any:
        return await self._noting("step", follows, super().append_run_records(records, follows=follows))

    async def record_run_terminal(
        self, record: Record, records: Sequence[Record] = (), *, follows: LogBasis | None = None
    ) -> Any:
        closing = super().record_run_terminal(record, records, follows=follows)
        return await self._noting("terminal", follows, closing)


async def _nowhere(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
    raise AssertionError("nothing is dead-lettered")


async def first_delivery(h: Harness, request: RunRequested) -> None:
    """`request` handled as its message's first delivery (it cannot be a redelivery: pipelined)."""
    message = Message(request.model_dump_json().encode(), first_delivery=True)
    await Delivery(_nowhere).handle(message, TypeAdapter(RunRequested), h.planner.on_run_requested)
    assert message.acked == 1


async def test_a_plain_turns_terminal_goes_out_before_its_start_is_answered() -> None:
    store = RepliesOnTheirWay()
    h = make_harness(lambda request: says("Hello there."), store=store)
    request = turn("hi", await h.session())

    await first_delivery(h, request)

    assert store.noted == ["terminal", "start answered"]
    follows = store.follows["terminal"]
    assert follows is not None and follows.keys == [STARTED_KEY, "context", "input", "phase/1/planning"]
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert (await h.keys(request.run_id))[-2:] == ["step/1/assistant", "completed"]
    deltas = h.bus.events(StreamEventType.ASSISTANT_REPLY)
    assert "".join(event.payload["text"] for event in deltas) == "Hello there."
    [finished] = h.bus.of(TurnCompleted)
    assert finished.assistant_text == "Hello there."


async def test_a_tool_turns_step_goes_out_before_its_start_is_answered_as_before() -> None:
    store = RepliesOnTheirWay()
    h = make_harness(tool_then_answer(("calculator", {"expression": "6*7"})), store=store)
    request = turn("calculate 6*7", await h.session())

    await first_delivery(h, request)

    assert store.noted == ["step", "start answered"]
    assert store.follows["step"] is not None
    assert await h.status(request.run_id) is RunStatus.RUNNING  # waiting for its tool's result


async def test_a_plain_turn_whose_session_had_ended_leaves_nothing_of_its_answer() -> None:
    store = RepliesOnTheirWay()
    h = make_harness(lambda request: says("Never shown."), store=store)
    session_id = await h.session()
    await store.end_session(session_id, utc_now_ms())
    request = turn("hi", session_id)

    await first_delivery(h, request)

    # The model was asked while the start was on its way; the start stopped the run, so the
    # terminal behind it was refused, and the run goes on from the stop: nothing it said is kept.
    assert len(h.model.requests) == 1
    assert store.noted == ["terminal", "start answered"]
    assert store.refused == {"terminal": ErrorCode.RUN_LOG_MOVED}
    types = [record.type for record in await h.records(request.run_id)]
    assert types == [LifecycleType.RUN_STARTED.value, LifecycleType.RUN_COMPLETED.value]
    meta = await store.load_run(request.run_id)
    assert (meta.status, meta.cancellation_reason) == (RunStatus.CANCELED, "session_ended")
    assert h.bus.events(StreamEventType.ASSISTANT_REPLY) == []
    assert h.bus.of(TurnCompleted) == []
