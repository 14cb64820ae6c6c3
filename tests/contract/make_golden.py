"""Writes the golden messages once per schema version: `python -m tests.contract.make_golden`.

Golden files are never rewritten for an existing version: they are what old producers sent, and
`test_golden.py` proves that today's models still read them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from quipu.contracts.commands import (
    AppendRunRecord,
    CreateSession,
    RecordRunSuspension,
    StartChildRun,
    StoreReply,
)
from quipu.contracts.errors import ErrorBody, ErrorCode
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.lifecycle import encode_child_run_linked, encode_run_completed, encode_run_started
from quipu.contracts.memory import FactOperation, FactOperationKind, HistoryTurn, MemoryScope, Provenance
from quipu.contracts.memory_commands import AppendHistoryTurn, ApplyFactOperations
from quipu.contracts.store import CancellationReason, Checkpoint, RunStart, RunStatus

GOLDEN = Path(__file__).parent / "golden"
AT = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
META = {"event_id": "e-1", "occurred_at": AT, "tenant_id": "t-1", "correlation_id": "c-1", "causation_id": ""}


def _samples() -> dict[str, str]:
    child = RunStart(run_id="r-2", agent_id="math", session_id="s-1", parent_run_id="r-1", started_at=AT)

    parent = RunStart(run_id="r-1", agent_id="assistant", session_id="s-1", started_at=AT)
    stopped = encode_run_completed(
        RunStatus.CANCELED, cancellation_reason=CancellationReason.SESSION_ENDED.value
    )
    return {
        "create_session.v1.json": CreateSession(session_id="s-1", created_at=AT, **META).model_dump_json(),
        "start_child_run.v1.json": StartChildRun(
            run=child,
            parent_link=parent.record(
                "child/call-1",
                "child_run_linked",
                encode_child_run_linked("math", "call-1", "r-2", "math"),
            ),
            started=child.record("started", "run_started", encode_run_started(child)),
            stopped=child.record("stopped", "run_completed", stopped),
            **META,
        ).model_dump_json(),
        "append_run_record.v1.json": AppendRunRecord(
            record=parent.record("step/1", "note", b'{"x":1}'), **META
        ).model_dump_json(),
        "record_run_suspension.v1.json": RecordRunSuspension(
            checkpoint=Checkpoint(suspension_id="q-1", data=b"\x00\xff"),
            record=parent.record(
                "suspend",
                "run_suspended",
                b'{"suspension_id":"q-1","version":"1","pending_count":1,"required_tools":["ask_user"]}',
            ),
            **META,
        ).model_dump_json(),
        "append_history_turn.v1.json": AppendHistoryTurn(
            turn=HistoryTurn(
                session_id="s-1",
                turn_id="r-1",
                scope=MemoryScope(tenant_id="t-1", principal_id="p-1", agent_id="assistant"),
                user_text="¿Qué base de datos uso?",
                assistant_text="PostgreSQL 16.",
                created_at=AT,
            ),
            **META,
        ).model_dump_json(),
        "apply_fact_operations.v1.json": ApplyFactOperations(
            scope=MemoryScope(tenant_id="t-1", principal_id="p-1", agent_id="assistant"),
            operations=[
                FactOperation(
                    kind=FactOperationKind.NEW,
                    fact_id="f-1",
                    text="Uses PostgreSQL 16.",
                    provenance=Provenance(session_id="s-1", turn_id="r-1", message_seq=1),
                ),
                FactOperation(
                    kind=FactOperationKind.DELETE,
                    fact_id="f-0",
                    provenance=Provenance(session_id="s-1", turn_id="r-1"),
                ),
            ],
            idempotency_key="extract/r-1",
            **META,
        ).model_dump_json(),
        "store_reply_error.v1.json": StoreReply(
            correlation_id="c-1",
            op="LoadRun",
            error=ErrorBody(code=ErrorCode.RUN_NOT_FOUND, message="run not found", retryable=False),
        ).model_dump_json(),
        "run_event_workflow.v1.json": RunEvent(
            type=StreamEventType.WORKFLOW,
            event_key="completed",
            run_id="r-1",
            session_id="s-1",
            timestamp=AT,
            payload={"phase": "completed", "status": "success"},
            **META,
        ).model_dump_json(),
    }


def main() -> None:
    """Write the golden files that do not exist yet."""
    GOLDEN.mkdir(exist_ok=True)
    for name, text in _samples().items():
        path = GOLDEN / name
        if not path.exists():
            path.write_text(text + "\n")


if __name__ == "__main__":
    main()
