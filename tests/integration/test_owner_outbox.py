"""The tool calls a step's command carries, published by the storage owner after the commit
(docs/store-contract.md §6.4, the outbox).

- A step carrying calls commits, then each call goes to its toolset's calls topic (`tools.calls`
  for the default toolset, `tools.calls.<toolset>` else): a call read there finds its step's
  records in the store. An exact retry of the step publishes the same calls again (same ids).
- A refused step (EVENT_CONFLICT, RUN_NOT_ACTIVE) publishes none of its calls.
- A step written in an ended session commits (a running run may still write) but publishes none
  of its calls, not even on its exact retry: the planner closes the run instead.
- A call of another run than the step's records is refused before anything is applied.

The owner is a separate process on the real embedded broker and database. "Nothing was published"
is shown with a barrier: the calls topics are keyed by run id, so a later step of the same run (or
of a run whose id lands on the same partition) that carries a call publishes on the same
partition, after everything before it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from quipu.contracts.commands import AppendRunRecords, DispatchedCall
from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import Record, RunStart
from quipu.contracts.tools import DEFAULT_TOOLSET, ToolCallRequested
from quipu.contracts.topics import Topic, toolset_calls_topic
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack, create_topics
from quipu.services.kit.run_events import partition_for_key
from quipu.services.kit.store_client import KafkaStore
from tests.conformance.builders import (
    all_run_records,
    complete,
    keys,
    ordinary,
    refused,
    session_with_root,
    uid,
)
from tests.owner_support import Served, TopicReader

pytestmark = pytest.mark.slow

GPU = "gpu"


@dataclass
class Calls:
    """The module's owner and readers of the default and the `gpu` toolset's calls topics."""

    served: Served
    default: TopicReader
    gpu: TopicReader

    @property
    def store(self) -> KafkaStore:
        return self.served.store

    def of(self, reader: TopicReader, run_id: str) -> list[ToolCallRequested]:
        """Every call of one run read so far on one topic, in partition order."""
        calls = reader.parsed(ToolCallRequested)
        return [call for call in calls if call.run_id == run_id]

    async def wait(self, reader: TopicReader, run_id: str, count: int) -> list[ToolCallRequested]:
        """Wait until at least `count` calls of the run were read on `reader`'s topic; return them."""
        await reader.wait_for(lambda _: len(self.of(reader, run_id)) >= count, within=10.0)
        return self.of(reader, run_id)


@pytest.fixture(scope="module")
async def calls(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Calls]:
    """An owner on a prefix and database of this module's own, and readers of two calls topics."""
    name = f"obox{uuid.uuid4().hex[:8]}"
    prefix = f"{name}."
    await create_topics(stack.bootstrap, prefix, toolsets=[GPU])
    log_path = tmp_path_factory.mktemp("owner") / "owner.log"
    async with (
        Served(stack, prefix, name, log_path) as served,
        TopicReader(stack.bootstrap, served.topic(Topic.TOOLS_CALLS.value)) as default,
        TopicReader(stack.bootstrap, served.topic(toolset_calls_topic(GPU))) as gpu,
    ):
        yield Calls(served, default, gpu)


def call(run: RunStart, use: str, toolset: str = DEFAULT_TOOLSET) -> DispatchedCall:
    """A call of `run`'s tool use `use`, for `toolset`."""
    return DispatchedCall(
        toolset=toolset,
        call=ToolCallRequested(
            event_id=f"call-{run.run_id}-{use}",
            run_id=run.run_id,
            session_id=run.session_id,
            agent_id=run.agent_id,
            tool_use_id=use,
            tool_name="calculator",
            input={"expression": "6*7"},
        ),
    )


def step(run: RunStart, key: str) -> list[Record]:
    """A step's records (an assistant message stands for them: the owner does not read them)."""
    return [ordinary(run, key, payload=b'{"phase":"executing_tools"}')]


async def test_a_step_publishes_its_calls_to_their_toolsets_after_its_commit_and_again_on_an_exact_retry(
    calls: Calls,
) -> None:
    store = calls.store
    _, run = await session_with_root(store)
    records = step(run, "step/1")
    carried = [call(run, "use-a"), call(run, "use-b", GPU)]

    first = await store.append_run_records(records, carried)
    assert [result.inserted for result in first] == [True]
    (on_default,) = await calls.wait(calls.default, run.run_id, 1)
    (on_gpu,) = await calls.wait(calls.gpu, run.run_id, 1)
    assert (on_default.tool_use_id, on_gpu.tool_use_id) == ("use-a", "use-b")
    assert on_default.input == {"expression": "6*7"}
    # Published after the commit: the step's record is in the store once its call is seen.
    assert (run.run_id, "step/1") in keys(await all_run_records(store, run.run_id))

    retried = await store.append_run_records(records, carried)
    assert [result.inserted for result in retried] == [False]
    again = await calls.wait(calls.default, run.run_id, 2)
    assert [each.event_id for each in again] == [on_default.event_id] * 2
    assert [each.event_id for each in await calls.wait(calls.gpu, run.run_id, 2)] == [on_gpu.event_id] * 2


async def test_a_refused_step_publishes_none_of_its_calls(calls: Calls) -> None:
    store = calls.store
    _, run = await session_with_root(store)
    await store.append_run_records(step(run, "step/1"), [call(run, "first")])
    other_content = [ordinary(run, "step/1", payload=b'{"phase":"planning"}')]
    await refused(ErrorCode.EVENT_CONFLICT, store.append_run_records(other_content, [call(run, "conflict")]))

    _, closed = await session_with_root(store)
    await complete(store, closed)
    await refused(
        ErrorCode.RUN_NOT_ACTIVE, store.append_run_records(step(closed, "late"), [call(closed, "late")])
    )

    await store.append_run_records(step(run, "step/2"), [call(run, "barrier")])
    read = await calls.wait(calls.default, run.run_id, 2)
    assert [each.tool_use_id for each in read] == ["first", "barrier"]
    assert calls.of(calls.default, closed.run_id) == []


async def test_a_step_in_an_ended_session_commits_but_publishes_none_of_its_calls(calls: Calls) -> None:
    store = calls.store
    session_id, run = await session_with_root(store)
    await store.end_session(session_id, utc_now_ms())
    records = step(run, "step/1")

    first = await store.append_run_records(records, [call(run, "withheld")])
    retried = await store.append_run_records(records, [call(run, "withheld")])

    assert [(each.inserted, each.session_status) for each in first + retried] == [
        (True, "ended"),
        (False, "ended"),
    ]
    assert (run.run_id, "step/1") in keys(await all_run_records(store, run.run_id))
    partitions = calls.default.partitions
    wanted = partition_for_key(run.run_id, partitions)
    barrier_id = next(
        candidate
        for candidate in (uid("run") for _ in range(10_000))
        if partition_for_key(candidate, partitions) == wanted
    )
    _, barrier = await session_with_root(store, run_id=barrier_id)
    await store.append_run_records(step(barrier, "step/1"), [call(barrier, "barrier")])
    await calls.wait(calls.default, barrier.run_id, 1)
    assert calls.of(calls.default, run.run_id) == []


async def test_a_call_of_another_run_or_a_toolset_name_out_of_the_rule_is_refused_and_nothing_applied(
    calls: Calls,
) -> None:
    """Built without validation, as a client of another language could send it: the owner decides."""
    store = calls.store
    _, run = await session_with_root(store)
    _, other = await session_with_root(store)
    stray = call(other, "stray")
    elsewhere = DispatchedCall.model_construct(toolset="gpu.dlq", call=call(run, "elsewhere").call)
    for carried in (stray, elsewhere):
        key = uid("step")
        command = AppendRunRecords.model_construct(records=step(run, key), calls=[carried])
        await refused(ErrorCode.INVALID_ARGUMENT, store.call(command))
        assert key not in {record.event_key for record in await all_run_records(store, run.run_id)}
    await store.append_run_records(step(run, "barrier"), [call(run, "barrier")])
    assert [each.tool_use_id for each in await calls.wait(calls.default, run.run_id, 1)] == ["barrier"]
    assert calls.of(calls.default, other.run_id) == []
