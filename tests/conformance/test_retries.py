"""Resent commands (§2 "Exact retry", §5; the store half of §12 "Transport: a resent command
returns the original result"): every write, sent twice, answers the original result with
`inserted=false` and changes nothing the read operations can see."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from quipu.contracts.store import AppendResult, CancellationReason, RunStatus, StartResult
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    child_start,
    ended_session,
    intent,
    ms,
    one_shot,
    one_shot_child,
    open_session,
    ordinary,
    root_start,
    running_one_shot,
    session_with_root,
    snapshot,
    suspension,
    terminal,
)


def _as_retry(result: Any) -> Any:
    """What the resend of a write must answer: the original result, nothing inserted."""
    if isinstance(result, AppendResult):
        return result.model_copy(update={"inserted": False})
    if isinstance(result, StartResult):
        return result.model_copy(
            update={
                name: _as_retry(getattr(result, name))
                for name in ("started", "parent_link", "stopped")
                if getattr(result, name) is not None
            }
        )
    return result


Scenario = Callable[[Store], Awaitable[tuple[Callable[[], Awaitable[Any]], list[str], list[str]]]]


async def _create_session(store: Store) -> Any:
    session_id = await open_session(store)
    return (lambda: store.create_session(session_id, ms(0))), [], [session_id]


async def _end_session(store: Store) -> Any:
    session_id = await open_session(store)
    return (lambda: store.end_session(session_id, ms(2))), [], [session_id]


async def _root_proceed(store: Store) -> Any:
    session_id = await open_session(store)
    command = root_start(session_id, labels={"a": "b"})
    return (lambda: store.start_root_run(*command)), [command.run.run_id], [session_id]


async def _root_stop(store: Store) -> Any:
    session_id = await ended_session(store)
    command = root_start(session_id)
    return (lambda: store.start_root_run(*command)), [command.run.run_id], [session_id]


async def _child(store: Store) -> Any:
    session_id, parent = await session_with_root(store)
    command = child_start(session_id, parent)
    runs = [parent.run_id, command.run.run_id]
    return (lambda: store.start_child_run(*command)), runs, [session_id]


async def _one_shot(store: Store) -> Any:
    command = one_shot()
    return (lambda: store.start_one_shot_run(*command)), [command.run.run_id], []


async def _one_shot_child(store: Store) -> Any:
    parent = await running_one_shot(store)
    command = one_shot_child(parent)
    runs = [parent.run_id, command.run.run_id]
    return (lambda: store.start_one_shot_child_run(*command)), runs, []


async def _append(store: Store) -> Any:
    session_id, run = await session_with_root(store)
    record = ordinary(run, "step")
    return (lambda: store.append_run_record(record)), [run.run_id], [session_id]


async def _cancellation(store: Store) -> Any:
    session_id, run = await session_with_root(store)
    record = intent(run, CancellationReason.USER_REQUESTED)
    return (lambda: store.record_run_cancellation(record)), [run.run_id], [session_id]


async def _suspension(store: Store) -> Any:
    session_id, run = await session_with_root(store)
    checkpoint, record = suspension(run)
    return (lambda: store.record_run_suspension(checkpoint, record)), [run.run_id], [session_id]


async def _terminal(store: Store) -> Any:
    session_id, run = await session_with_root(store)
    record = terminal(run, RunStatus.FAILED)
    return (lambda: store.record_run_terminal(record)), [run.run_id], [session_id]


async def _purge(store: Store) -> Any:
    session_id = await ended_session(store)
    return (lambda: store.purge_session(session_id)), [], [session_id]


SCENARIOS: dict[str, Scenario] = {
    "CreateSession": _create_session,
    "EndSession": _end_session,
    "StartRootRun_proceed": _root_proceed,
    "StartRootRun_stop": _root_stop,
    "StartChildRun": _child,
    "StartOneShotRun": _one_shot,
    "StartOneShotChildRun": _one_shot_child,
    "AppendRunRecord": _append,
    "RecordRunCancellation": _cancellation,
    "RecordRunSuspension": _suspension,
    "RecordRunTerminal": _terminal,
    "PurgeSession": _purge,
}


@pytest.mark.parametrize("operation", list(SCENARIOS), ids=list(SCENARIOS))
async def test_resent_write_returns_the_original_result_and_writes_nothing(
    store: Store, operation: str
) -> None:
    send, runs, sessions = await SCENARIOS[operation](store)
    first = await send()
    before = await snapshot(store, runs=runs, sessions=sessions)
    for _ in range(2):
        assert await send() == _as_retry(first)
    assert await snapshot(store, runs=runs, sessions=sessions) == before
