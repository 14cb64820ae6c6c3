"""Pure logic of the gateway: request bodies, the messages they become, checks, and error mapping.

No I/O here: handlers load what a check needs through the store port and publish what these
functions build through the publisher port.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.errors import ErrorCode, QuipuError, StoreError
from quipu.contracts.runs import CancelRun, RunRequested
from quipu.contracts.store import (
    CancellationReason,
    Page,
    RunMeta,
    RunStatus,
    Session,
    SessionOwner,
)
from quipu.contracts.transcript import Message
from quipu.services.domain.run_requests import RequestRefusedError, Turn

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


def refusal_of(error: RequestRefusedError) -> GatewayError:
    """The HTTP answer to a request that cannot apply to the run as stored: 400 malformed, else 409."""
    return GatewayError(400 if error.invalid else 409, error.code, error.message)


# --- request and response bodies ----------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CreateSessionRequest(_Body):
    """Create a session; the gateway picks the id when none is given."""

    session_id: str | None = Field(
        default=None, min_length=1, max_length=256, description="Session id; a uuid4 when omitted."
    )


class RunRequest(Turn):
    """A user turn for an agent, in a session or as a one-shot run (the body of POST /v1/runs)."""


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


def accepted(message: RunRequested | CancelRun) -> RunAccepted:
    """The 202 body of a published request."""
    return RunAccepted(run_id=message.run_id, session_id=message.session_id, event_id=message.event_id)
