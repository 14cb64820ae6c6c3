"""A planner over a direct store never pipelines a start, even for a message's first delivery.

A direct store (here the in-memory one) applies each call before it returns and keeps no order of
calls under way (`Store.pipeline` is None), so a first step could not follow a start it had not
answered: the planner awaits the start before it asks the model. Over the owner's Kafka client the
same delivery is pipelined (tests/integration/test_planner_pipeline.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import TypeAdapter

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.runs import RunRequested
from quipu.contracts.store import AppendResult, LogBasis, Record, RunStatus
from quipu.contracts.transcript import Part, TextPart, ToolUsePart
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.models.function import FunctionModel
from quipu.services.domain.models.port import ModelRequest
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.kit.delivery import Delivery
from quipu.services.planner.adapters import SessionHistoryContext
from quipu.services.planner.orchestrator import Planner, ReadyDeps
from quipu.services.planner.settings import PlannerSettings
from tests.support.announced import announced
from tests.support.consumed import Message
from tests.support.planner_bus import Bus

AGENT = AgentDefinition(id="echo", instructions="Answer briefly.")


async def _nowhere(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
    raise AssertionError("nothing is dead-lettered")


class NotingBasis(InMemoryStore):
    """The in-memory store, noting the log each step said it followed (None: it named none)."""

    def __init__(self) -> None:
        super().__init__()
        self.follows: list[LogBasis | None] = []

    async def append_run_records(
        self, records: Sequence[Record], *, follows: LogBasis | None = None
    ) -> list[AppendResult]:
        self.follows.append(follows)
        return await super().append_run_records(records, follows=follows)


async def test_a_first_delivery_over_a_direct_store_is_started_before_the_model_is_asked() -> None:
    store = NotingBasis()
    seen: list[RunStatus] = []

    async def answer(request: ModelRequest) -> list[Part]:
        run_id = request.call_key.split("/")[0]
        seen.append((await store.load_run(run_id)).status)
        if len(seen) == 1:
            return [ToolUsePart(id="tu-1", name="calculator", input={"expression": "6*7"})]
        return [TextPart(text="42.")]

    model = FunctionModel(answer)
    deps = ReadyDeps(
        store=store,
        model=model,
        registry=announced(),
        agents=AgentRegistry([AGENT]),
        context=SessionHistoryContext(store),
    )
    planner = Planner(deps, Bus(), PlannerSettings(pipeline_starts=True))
    request = RunRequested(run_id="r-direct", agent_id=AGENT.id, text="hi")
    message = Message(request.model_dump_json().encode(), first_delivery=True)
    await Delivery(_nowhere).handle(message, TypeAdapter(RunRequested), planner.on_run_requested)
    assert message.acked == 1
    assert seen[0] is RunStatus.RUNNING  # the start was answered (written) before the model was asked
    assert store.follows[0] is None  # the first step was sent after it, naming no assumed log
