"""The lifecycle workload every store figure is measured with: one run, start to finish."""

from __future__ import annotations

import uuid

from quipu.contracts.lifecycle import encode_run_completed, encode_run_started
from quipu.contracts.store import CancellationReason, RunStart, RunStatus
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.store.protocol import Store

OPS_PER_RUN = 5
"""create_session, start_root_run, two appends, record_run_terminal."""


async def one_run(store: Store) -> None:
    """Five store commands: a session, a run that starts, records two steps and completes."""
    session_id = f"bench-{uuid.uuid4().hex}"
    start = RunStart(
        run_id=f"{session_id}-r", agent_id="bench", session_id=session_id, started_at=utc_now_ms()
    )
    await store.create_session(session_id, start.started_at)
    stopped = encode_run_completed(
        RunStatus.CANCELED, cancellation_reason=CancellationReason.SESSION_ENDED.value
    )
    await store.start_root_run(
        start,
        start.record("started", "run_started", encode_run_started(start)),
        start.record("stopped", "run_completed", stopped),
    )
    for step in range(2):
        await store.append_run_record(start.record(f"step-{step}", "bench_step", b'{"step":%d}' % step))
    await store.record_run_terminal(
        start.record("completed", "run_completed", encode_run_completed(RunStatus.COMPLETED))
    )
