"""The lifecycle workload every store figure is measured with: one run, start to finish."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from quipu.contracts.lifecycle import encode_run_completed, encode_run_started
from quipu.contracts.store import CancellationReason, Record, RunStart, RunStatus
from quipu.services.domain.store.protocol import Store

OPS_PER_RUN = 5
"""create_session, start_root_run, two appends, record_run_terminal."""


def _now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond - now.microsecond % 1000)


def _record(run: RunStart, key: str, type_: str, payload: bytes) -> Record:
    return Record(
        event_key=key,
        run_id=run.run_id,
        agent_id=run.agent_id,
        session_id=run.session_id,
        type=type_,
        payload=payload,
        timestamp=run.started_at,
    )


async def one_run(store: Store) -> None:
    """Five store commands: a session, a run that starts, records two steps and completes."""
    session_id = f"bench-{uuid.uuid4().hex}"
    start = RunStart(run_id=f"{session_id}-r", agent_id="bench", session_id=session_id, started_at=_now())
    await store.create_session(session_id, start.started_at)
    stopped = encode_run_completed(
        RunStatus.CANCELED, cancellation_reason=CancellationReason.SESSION_ENDED.value
    )
    await store.start_root_run(
        start,
        _record(start, "started", "run_started", encode_run_started(start)),
        _record(start, "stopped", "run_completed", stopped),
    )
    for step in range(2):
        await store.append_run_record(_record(start, f"step-{step}", "bench_step", b'{"step":%d}' % step))
    await store.record_run_terminal(
        _record(start, "completed", "run_completed", encode_run_completed(RunStatus.COMPLETED))
    )
