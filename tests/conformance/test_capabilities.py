"""What each store says it can do beyond the contract's operations (`Store`, `MemoryStore`).

A direct store (in memory, MongoDB) applies every call before it returns: it cannot have a call
under way unanswered, publishes no tool calls and reaches no other memory store, so a planner over
it never pipelines a start. The storage owner's Kafka client can do all of it; its memory client
admits a turn owner-side in one command.
"""

from __future__ import annotations

import asyncio

import pytest

from quipu.contracts.store import LogBasis, RunStatus
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import all_run_records, one_shot, ordinary, terminal, uid
from tests.conformance.memory_builders import scope, turn
from tests.conformance.memory_implementations import OwnerStores

OWNER_CLIENT = "kafka"
"""The implementation that is the storage owner's client; the others are direct stores."""


def _name(request: pytest.FixtureRequest, fixture: str) -> str:
    name: str = request.node.callspec.params[fixture]
    return name


async def test_only_the_owners_client_pipelines(store: Store, request: pytest.FixtureRequest) -> None:
    client = _name(request, "store") == OWNER_CLIENT
    assert (store.pipeline is not None) is client
    assert (store.outbox is not None) is client
    assert (store.owner_memory is not None) is client


async def test_only_the_owners_memory_client_claims_sessions_owner_side(
    memory_store: MemoryStore, request: pytest.FixtureRequest
) -> None:
    assert (memory_store.turn_claims is not None) is (_name(request, "memory_store") == OWNER_CLIENT)


async def test_a_start_under_way_is_applied_before_the_step_sent_behind_it(store: Store) -> None:
    pipeline = store.pipeline
    if pipeline is None:
        pytest.skip("a direct store applies each call before it returns")
    start = one_shot()
    under_way = await pipeline.sent(store.start_one_shot_run(start.run, start.started))
    # Sent once the start is (not answered): the owner applies it after the start, on its log.
    step = asyncio.ensure_future(
        store.append_run_records([ordinary(start.run, "step")], follows=LogBasis.of([start.started]))
    )
    assert (await under_way).run_status is RunStatus.RUNNING
    [appended] = await step
    assert appended.inserted
    assert [record.event_key for record in await all_run_records(store, start.run.run_id)] == [
        "started",
        "step",
    ]


async def test_a_start_under_way_is_applied_before_the_terminal_sent_behind_it(store: Store) -> None:
    pipeline = store.pipeline
    if pipeline is None:
        pytest.skip("a direct store applies each call before it returns")
    start = one_shot()
    under_way = await pipeline.sent(store.start_one_shot_run(start.run, start.started))
    closing = store.record_run_terminal(
        terminal(start.run), [ordinary(start.run, "answer")], follows=LogBasis.of([start.started])
    )
    closed = asyncio.ensure_future(closing)
    assert (await under_way).run_status is RunStatus.RUNNING
    assert (await closed).inserted
    assert (await store.load_run(start.run.run_id)).status is RunStatus.COMPLETED
    assert [record.event_key for record in await all_run_records(store, start.run.run_id)] == [
        "started",
        "answer",
        "terminal",
    ]


async def test_the_owners_client_reaches_the_owners_memory(owner_stores: OwnerStores) -> None:
    memory = owner_stores.store.owner_memory
    if memory is None:
        pytest.skip("a direct store keeps no memory of its own")
    # A turn recorded in the owner's memory store is read back through the runtime client's.
    session_id = uid("session")
    who = scope()
    await owner_stores.memory.append_history_turn(turn(session_id, who))
    rows = await memory.list_history(session_id, 0, 10)
    assert [row.text for row in rows] == ["user says 0 — ¿qué tal? 🙂", "assistant answers 0"]
