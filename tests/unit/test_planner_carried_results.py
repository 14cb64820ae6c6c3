"""The tool result that completes a step rides in the next command (docs/store-contract.md §6.4).

The next step's AppendRunRecords, or the terminal with the answer, carries the result, its
transcript message and the phase, so the result costs no write of its own. What must stay true:

- Nothing is recorded before that command commits: a crash after the model call leaves nothing,
  and the redelivered result asks the model again (a call never recorded, so none repeated).
- A cancel arriving while the model answers is decided on at the next write, and no effect of a
  step the store refused goes out.
- Results arriving while others of their step are missing are written alone, at once (a handler
  never holds one message waiting for another), and two copies taking the last two at once
  (a rebalance) still finish the run once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from quipu.contracts.runs import CancelRun, RunRequested
from quipu.contracts.store import LogBasis, Record, RunStatus
from quipu.contracts.tools import ToolCallRequested
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.models.port import ModelRequest, ModelResponse, TextDelta
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.domain.transcript import build_messages_from_run_log, validate_planner_transcript
from quipu.services.planner.orchestrator import Planner
from quipu.services.planner.settings import PlannerSettings
from tests.timing import scaled
from tests.unit.test_planner_runs import (
    FakeModel,
    Harness,
    YieldingStore,
    calls,
    make_harness,
    result_for,
    tool_then_answer,
)


class PlannerCrashError(Exception):
    """Stands for the planner process dying: the message is not acknowledged, so it comes again."""


class CrashingOnceStore(InMemoryStore):
    """The first terminal is never sent: the planner "dies" after the model call, before the commit."""

    crashed = False

    async def record_run_terminal(
        self, record: Record, records: Sequence[Record] = (), *, follows: LogBasis | None = None
    ) -> Any:
        if not self.crashed:
            self.crashed = True
            raise PlannerCrashError
        return await super().record_run_terminal(record, records, follows=follows)


async def test_a_crash_after_the_model_call_records_nothing_so_the_model_is_asked_again() -> None:
    h = make_harness(tool_then_answer(("calculator", {"expression": "6*7"})), store=CrashingOnceStore())
    request = await h.start("calculate 6*7")
    [call] = h.bus.of(ToolCallRequested)
    before = await h.keys(request.run_id)

    with pytest.raises(PlannerCrashError):
        await h.deliver(result_for(call, 42))
    assert len(h.model.requests) == 2
    assert await h.keys(request.run_id) == before  # not even the result: it rode in the lost command

    await h.deliver(result_for(call, 42))  # the redelivery

    assert len(h.model.requests) == 3  # asked again: the first answer was never recorded
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    keys = await h.keys(request.run_id)
    assert keys[len(before) :] == [*carried(call), "completed"]


class HeldModel(FakeModel):
    """A `FakeModel` whose call of step 2 waits until the test lets it answer."""

    def __init__(self, answer: Any) -> None:
        super().__init__(answer)
        self.answering = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        if request.call_key.endswith("/step/2"):
            self.answering.set()
            await self.release.wait()
        return await super().complete(request, on_text)


def asks_again(request: ModelRequest) -> ModelResponse:
    """Asks for the calculator at each step."""
    return calls(request, ("calculator", {"expression": "1+1"}))


@dataclass
class Held:
    """A run whose step-2 model call is under way, held, on the result of its one call."""

    h: Harness
    model: HeldModel
    request: RunRequested
    call: ToolCallRequested
    taking: asyncio.Task[None]

    def cancel(self) -> CancelRun:
        return CancelRun(run_id=self.request.run_id, session_id=self.request.session_id)


async def held_model_call() -> Held:
    model = HeldModel(asks_again)
    h = make_harness(model)
    request = await h.start("calculate")
    [call] = h.bus.of(ToolCallRequested)
    taking = asyncio.create_task(h.deliver(result_for(call, 2)))
    await asyncio.wait_for(model.answering.wait(), scaled(5.0))
    return Held(h, model, request, call, taking)


def carried(call: ToolCallRequested) -> list[str]:
    """The keys of the step 2 that carries `call`'s result, in log order."""
    return [
        f"tool-result/{call.tool_use_id}",
        "step/1/tool-results",
        "phase/2/synthesizing",
        "step/2/assistant",
    ]


async def test_a_cancel_taken_by_the_same_copy_during_the_model_call_ends_the_run_at_the_next_step() -> None:
    held = await held_model_call()
    h = held.h
    canceling = asyncio.create_task(h.deliver(held.cancel()))
    await asyncio.sleep(0)  # its turn: the cancel reaches the run's lock, held by the result
    held.model.release.set()
    await asyncio.gather(held.taking, canceling)

    meta = await h.store.load_run(held.request.run_id)
    assert (meta.status, meta.cancellation_reason) == (RunStatus.CANCELED, "user_requested")
    assert (await h.keys(held.request.run_id))[-7:] == [
        *carried(held.call),
        "phase/2/executing_tools",
        "cancel",
        "canceled",
    ]
    assert len(h.model.requests) == 2


async def test_a_cancel_another_copy_writes_during_the_model_call_refuses_the_step_and_its_call() -> None:
    held = await held_model_call()
    h = held.h
    other = Planner(h.planner.deps, h.bus, PlannerSettings())  # no lock shared: another process
    await other.on_cancel(held.cancel())
    assert await h.status(held.request.run_id) is RunStatus.CANCELED
    held.model.release.set()
    await held.taking

    # The step (and the result in it) came after the close: refused, and its call never published.
    keys = await h.keys(held.request.run_id)
    assert keys[-2:] == ["cancel", "canceled"]
    assert f"tool-result/{held.call.tool_use_id}" not in keys
    assert h.bus.of(ToolCallRequested) == [held.call]
    assert len(h.model.requests) == 2


@pytest.mark.parametrize("copies", [1, 2])
async def test_the_last_two_results_of_a_step_arriving_at_once_finish_the_run_once(copies: int) -> None:
    """Each result sees the other missing, so each is written alone; whichever then reads both
    carries nothing more and goes on. Two copies (a rebalance) share no lock."""
    uses = [("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"})]
    store = YieldingStore()
    h = make_harness(tool_then_answer(*uses), store=store)
    planners = [h.planner, Planner(h.planner.deps, h.bus, PlannerSettings())][:copies]
    request = await h.start("two at once")
    first, second = h.bus.of(ToolCallRequested)

    await asyncio.gather(
        planners[0].on_tool_result(result_for(first, 2)), planners[-1].on_tool_result(result_for(second, 4))
    )

    assert await h.status(request.run_id) is RunStatus.COMPLETED
    keys = await h.keys(request.run_id)
    for call in (first, second):
        assert keys.count(f"tool-result/{call.tool_use_id}") == 1
    assert keys.count("step/2/assistant") == 1 and keys.count("completed") == 1
    messages = await build_messages_from_run_log(store, request.run_id)
    validate_planner_transcript(messages)
    assert [part.content for part in messages[2].parts] == [2, 4]  # type: ignore[union-attr]


async def test_a_result_that_leaves_another_missing_is_written_at_once() -> None:
    uses = [("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"})]
    h = make_harness(tool_then_answer(*uses))
    request = await h.start("two")
    first, second = h.bus.of(ToolCallRequested)

    await h.deliver(result_for(first, 2))

    assert (await h.keys(request.run_id))[-1] == f"tool-result/{first.tool_use_id}"
    assert len(h.model.requests) == 1
    await h.deliver(result_for(second, 4))  # this one completes the step: it rides in the terminal
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert (await h.keys(request.run_id))[-5:] == [*carried(second), "completed"]


class CancelLostOnceStore(InMemoryStore):
    """The first cancellation intent is never sent: the planner "dies" just before it."""

    lost = False

    async def record_run_cancellation(self, record: Record) -> Any:
        if not self.lost:
            self.lost = True
            raise PlannerCrashError
        return await super().record_run_cancellation(record)


async def test_a_step_written_in_an_ended_session_is_not_dispatched_by_a_redelivery_either() -> None:
    """A crash after that step's commit, before the cancel: the redelivered result finds a step
    whose calls were never published, and reads the session's status before sending them."""
    h = make_harness(asks_again, store=CancelLostOnceStore())
    request = await h.start("calculate")
    [call] = h.bus.of(ToolCallRequested)
    await h.store.end_session(request.session_id, utc_now_ms())
    with pytest.raises(PlannerCrashError):
        await h.deliver(result_for(call, 2))
    assert "step/2/assistant" in await h.keys(request.run_id)

    await h.deliver(result_for(call, 2))  # the redelivery

    meta = await h.store.load_run(request.run_id)
    assert (meta.status, meta.cancellation_reason) == (RunStatus.CANCELED, "session_ended")
    assert h.bus.of(ToolCallRequested) == [call]
    assert len(h.model.requests) == 2
