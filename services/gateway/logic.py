"""Pure logic of the gateway: request bodies, the messages they become, checks, and error mapping.

No I/O here: handlers load what a check needs through the store port and publish what these
functions build through the publisher port.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.envelope import derive_id
from quipu.contracts.errors import ErrorCode, QuipuError, StoreError
from quipu.contracts.runs import CancelRun, RunKind, RunRequested
from quipu.contracts.store import (
    CancellationReason,
    Page,
    RunMeta,
    RunStatus,
    Session,
    SessionOwner,
    SessionStatus,
)
from quipu.contracts.transcript import Message

# --- ports --------------------------------------------------------------------------------------


class GatewayStore(Protocol):
    """The store operations the gateway uses (every `Store` has them; the Kafka client in production)."""

    async def create_session(
        self, session_id: str, created_at: datetime, owner: SessionOwner | None = None
    ) -> Session:
        """CreateSession (with the owner recorded on a new session)."""
        ...

    async def end_session(self, session_id: str, ended_at: datetime) -> Session:
        """EndSession."""
        ...

    async def load_session_status(self, session_id: str) -> Session:
        """LoadSessionStatus."""
        ...

    async def purge_session(self, session_id: str) -> None:
        """PurgeSession."""
        ...

    async def load_run(self, run_id: str) -> RunMeta:
        """LoadRun."""
        ...

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Page:
        """ListRunRecords."""
        ...

    async def list_runs_by_session(self, session_id: str, statuses: list[RunStatus]) -> list[RunMeta]:
        """ListRunsBySession."""
        ...


class RunPublisher(Protocol):
    """Publishes run requests to `runs.requested` and cancellations to `runs.control`."""

    async def publish(self, message: RunRequested | CancelRun) -> None:
        """Send one message, keyed by its session (its run when sessionless); return once acknowledged."""
        ...


# --- errors -------------------------------------------------------------------------------------


class ErrorResponse(BaseModel):
    """The body of every error the gateway answers."""

    code: str = Field(
        description="Stable error code: a store code (docs/store-contract.md §5) or a gateway one."
    )
    message: str = Field(description="Human-readable explanation.")


class GatewayError(QuipuError):
    """Raised by a gateway check that refuses a request; carries the HTTP status to answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


INVALID_REQUEST = "INVALID_ARGUMENT"
"""Code of a request the gateway itself refuses as malformed (same code as the store's)."""
RUN_NOT_SUSPENDED = "RUN_NOT_SUSPENDED"
"""Code of an answer to a run that is not waiting for one."""
ROUTE_NOT_FOUND = "NOT_FOUND"
"""Code of a path the gateway does not serve."""
SESSION_ID_TAKEN = "SESSION_ID_TAKEN"
"""Code of a new session whose id another principal's session already has."""
TRANSCRIPT_UNAVAILABLE = "TRANSCRIPT_UNAVAILABLE"
"""Code of a run whose transcript cannot be rebuilt (none recorded yet, or undecodable)."""
TRANSCRIPT_ERASED = "TRANSCRIPT_ERASED"
"""Code of a run whose words were erased: its principal was forgotten (410 Gone)."""

_NOT_FOUND = {ErrorCode.SESSION_NOT_FOUND, ErrorCode.RUN_NOT_FOUND, ErrorCode.RUN_SUSPENSION_NOT_FOUND}
_BAD_REQUEST = {ErrorCode.INVALID_ARGUMENT, ErrorCode.INVALID_CURSOR}


def http_status(code: ErrorCode) -> int:
    """The HTTP status of a store error: 404 missing, 410 purged, 400 invalid, 503 unavailable, else 409.

    A purged session is gone for good (its id is never reusable), hence 410 rather than 404.
    Every other contract error is a conflict with the state the store holds.
    """
    if code in _NOT_FOUND:
        return 404
    if code is ErrorCode.SESSION_PURGED:
        return 410
    if code in _BAD_REQUEST:
        return 400
    if code is ErrorCode.UNAVAILABLE:
        return 503
    return 409


def error_of(error: StoreError) -> GatewayError:
    """The HTTP answer to a store error."""
    return GatewayError(http_status(error.code), error.code.value, error.message)


# --- request and response bodies ----------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CreateSessionRequest(_Body):
    """Create a session; the gateway picks the id when none is given."""

    session_id: str | None = Field(
        default=None, min_length=1, max_length=256, description="Session id; a uuid4 when omitted."
    )


class RunRequest(_Body):
    """A user turn for an agent, in a session or as a one-shot run."""

    agent_id: str = Field(min_length=1, max_length=256, description="Agent that runs the turn.")
    text: str = Field(min_length=1, max_length=200_000, description="What the user said.")
    session_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Session of the turn, created on first use; omitted: a one-shot run.",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels recorded on the run.")
    run_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Run id; a uuid4 when omitted. Resending with the same id asks for the same run.",
    )


class CancelRequest(_Body):
    """Ask for a run to be canceled."""

    reason: CancellationReason = Field(
        default=CancellationReason.USER_REQUESTED,
        description="user_requested (default) or engine_canceled; session_ended is the store's own.",
    )


class AnswerRequest(_Body):
    """The user's answer to a suspended run: starts its continuation."""

    answer: Any = Field(description="The answer (any JSON value: text, a choice, a confirmation...).")
    run_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Id of the continuation run; a uuid4 when omitted.",
    )


class RunAccepted(BaseModel):
    """A request published for the planner: what to follow on the session's event stream."""

    run_id: str = Field(description="The run the request starts (or cancels).")
    session_id: str = Field(description="Its session; empty for a one-shot run.")
    event_id: str = Field(description="event_id of the published message.")


class RunPending(BaseModel):
    """A run this gateway accepted that the planner has not started yet (GET answers 202 meanwhile)."""

    run_id: str = Field(description="The run.")
    session_id: str = Field(description="Its session; empty for a one-shot run.")
    status: str = Field(default="requested", description="`requested`: queued for the planner.")
    message: str = Field(
        description="What to do: ask again after Retry-After, or follow the session's events."
    )


class TranscriptResponse(BaseModel):
    """A run's transcript as the model saw it (docs/store-contract.md §10)."""

    run_id: str = Field(description="The run.")
    messages: list[Message] = Field(description="Messages in order, each with its ordered parts.")


class Health(BaseModel):
    """The gateway's own state."""

    status: str = Field(description="`ok` while serving.")
    open_streams: int = Field(description="Event streams open right now.")


# --- what requests become -----------------------------------------------------------------------


def new_id() -> str:
    """A fresh identifier for a session or run."""
    return str(uuid.uuid4())


def request_event_id(run_id: str) -> str:
    """The event id of a run's request: derived from the run, so a resent request repeats it."""
    return derive_id(run_id, "run_requested")


def require_open(session: Session) -> None:
    """A new turn needs an active session: an ended one could only cancel it at once."""
    if session.status is not SessionStatus.ACTIVE:
        raise GatewayError(
            409, ErrorCode.SESSION_ENDED.value, f"session {session.session_id!r} has ended; start a new one"
        )


def turn_request(body: RunRequest, *, tenant_id: str = "", principal_id: str = "") -> RunRequested:
    """The RunRequested (kind turn) a POST /v1/runs publishes, for the credential's tenant and principal."""
    run_id = body.run_id or new_id()
    return RunRequested(
        event_id=request_event_id(run_id),
        tenant_id=tenant_id,
        correlation_id=run_id,
        kind=RunKind.TURN,
        run_id=run_id,
        session_id=body.session_id or "",
        agent_id=body.agent_id,
        principal_id=principal_id,
        text=body.text,
        labels=body.labels,
    )


def resume_request(
    meta: RunMeta,
    answer: Any,
    *,
    principal_id: str = "",
    run_id: str | None = None,
    tenant_id: str = "",
) -> RunRequested:
    """The RunRequested (kind resume) that answers the suspended run `meta`.

    Refused with 409 when the run is not suspended, was answered already, or has no session
    (one-shot runs have no continuations, STORE_CONTRACT §6.3).
    """
    if meta.status is not RunStatus.SUSPENDED:
        raise GatewayError(
            409, RUN_NOT_SUSPENDED, f"run {meta.run_id!r} is {meta.status.value}, not waiting for an answer"
        )
    if meta.successor_run_id:
        raise GatewayError(
            409,
            ErrorCode.RUN_CONFLICT.value,
            f"run {meta.run_id!r} was answered already; its continuation is {meta.successor_run_id!r}",
        )
    if not meta.session_id:
        raise GatewayError(409, RUN_NOT_SUSPENDED, f"one-shot run {meta.run_id!r} cannot be continued")
    successor = run_id or new_id()
    return RunRequested(
        event_id=request_event_id(successor),
        tenant_id=tenant_id,
        correlation_id=successor,
        causation_id=meta.run_id,
        kind=RunKind.RESUME,
        run_id=successor,
        session_id=meta.session_id,
        agent_id=meta.agent_id,
        principal_id=principal_id,
        predecessor_run_id=meta.run_id,
        answer=answer,
        labels=meta.labels,
    )


def cancel_request(meta: RunMeta, reason: CancellationReason, *, tenant_id: str = "") -> CancelRun:
    """The CancelRun for the run `meta`; 409 when it already ended, 400 for the store's own reason."""
    if reason is CancellationReason.SESSION_ENDED:
        raise GatewayError(
            400, INVALID_REQUEST, "session_ended is recorded by the store when a session ends, not requested"
        )
    if meta.status.closed:
        # A suspended run is closed too (STORE_CONTRACT §9): it is answered, never canceled.
        raise GatewayError(
            409, ErrorCode.RUN_NOT_ACTIVE.value, f"run {meta.run_id!r} is {meta.status.value}, not running"
        )
    return CancelRun(
        event_id=derive_id(meta.run_id, f"cancel/{reason.value}"),
        tenant_id=tenant_id,
        correlation_id=meta.run_id,
        run_id=meta.run_id,
        session_id=meta.session_id,
        reason=reason,
    )


def accepted(message: RunRequested | CancelRun) -> RunAccepted:
    """The 202 body of a published request."""
    return RunAccepted(run_id=message.run_id, session_id=message.session_id, event_id=message.event_id)
