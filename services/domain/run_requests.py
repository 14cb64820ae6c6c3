"""What a client asks of the planner: a turn, the answer to a suspended run, a cancellation.

    turn = Turn(agent_id="assistant", text="hello", session_id="s-1")
    request = turn_request(turn, tenant_id="acme", principal_id="ada")    # RunRequested, kind turn
    answer = resume_request(await store.load_run(run_id), "yes")          # kind resume
    cancel = cancel_request(await store.load_run(run_id), CancellationReason.USER_REQUESTED)

The gateway, `quipu run` and `quipu.Client` build their messages here, so a request means the
same whoever publishes it. Ids are derived: a request's `event_id` follows from its run id, so
publishing the same request again is an exact retry for the planner. A request that cannot apply
to the run as the store holds it is refused with `RequestRefusedError` before anything is sent.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.envelope import derive_id
from quipu.contracts.errors import ErrorCode, QuipuError
from quipu.contracts.runs import CancelRun, RunKind, RunRequested
from quipu.contracts.store import CancellationReason, RunMeta, RunStatus, Session, SessionStatus

MAX_TEXT_CHARS = 200_000
"""Longest turn accepted (characters): far beyond any prompt, short of a message too large to send."""

RUN_NOT_SUSPENDED = "RUN_NOT_SUSPENDED"
"""Code of an answer to a run that is not waiting for one."""


class RequestRefusedError(QuipuError):
    """Raised when a request cannot apply to the run or session as the store holds it (never retried)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def invalid(self) -> bool:
        """Whether the request itself is malformed, rather than in conflict with the stored state."""
        return self.code == ErrorCode.INVALID_ARGUMENT.value


class Turn(BaseModel):
    """A user turn for an agent, in a session or as a one-shot run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent_id: str = Field(min_length=1, max_length=256, description="Agent that runs the turn.")
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="What the user said.")
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


def new_id() -> str:
    """A fresh identifier for a session or run."""
    return str(uuid.uuid4())


def request_event_id(run_id: str) -> str:
    """The event id of a run's request: derived from the run, so a resent request repeats it."""
    return derive_id(run_id, "run_requested")


def require_open(session: Session) -> None:
    """A new turn needs an active session: an ended one could only cancel it at once."""
    if session.status is not SessionStatus.ACTIVE:
        raise RequestRefusedError(
            ErrorCode.SESSION_ENDED.value, f"session {session.session_id!r} has ended; start a new one"
        )


def turn_request(turn: Turn, *, tenant_id: str = "", principal_id: str = "") -> RunRequested:
    """The RunRequested (kind turn) of `turn`, for the caller's tenant and principal."""
    run_id = turn.run_id or new_id()
    return RunRequested(
        event_id=request_event_id(run_id),
        tenant_id=tenant_id,
        correlation_id=run_id,
        kind=RunKind.TURN,
        run_id=run_id,
        session_id=turn.session_id or "",
        agent_id=turn.agent_id,
        principal_id=principal_id,
        text=turn.text,
        labels=turn.labels,
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

    Refused when the run is not suspended, was answered already, or has no session (one-shot
    runs have no continuations: a continuation names its predecessor's session). An answer that
    names no one speaks for the run's own person (the planner inherits them): its request is
    sealed under their key, as the continuation's records are.
    """
    if meta.status is not RunStatus.SUSPENDED:
        raise RequestRefusedError(
            RUN_NOT_SUSPENDED, f"run {meta.run_id!r} is {meta.status.value}, not waiting for an answer"
        )
    if meta.successor_run_id:
        raise RequestRefusedError(
            ErrorCode.RUN_CONFLICT.value,
            f"run {meta.run_id!r} was answered already; its continuation is {meta.successor_run_id!r}",
        )
    if not meta.session_id:
        raise RequestRefusedError(RUN_NOT_SUSPENDED, f"one-shot run {meta.run_id!r} cannot be continued")
    successor = run_id or new_id()
    return RunRequested(
        event_id=request_event_id(successor),
        tenant_id=tenant_id or meta.tenant_id,
        correlation_id=successor,
        causation_id=meta.run_id,
        kind=RunKind.RESUME,
        run_id=successor,
        session_id=meta.session_id,
        agent_id=meta.agent_id,
        principal_id=principal_id or meta.principal_id,
        predecessor_run_id=meta.run_id,
        answer=answer,
        labels=meta.labels,
    )


def cancel_request(meta: RunMeta, reason: CancellationReason, *, tenant_id: str = "") -> CancelRun:
    """The CancelRun for the run `meta`; refused when it already ended, or for the store's own reason."""
    if reason is CancellationReason.SESSION_ENDED:
        raise RequestRefusedError(
            ErrorCode.INVALID_ARGUMENT.value,
            "session_ended is recorded by the store when a session ends, not requested",
        )
    if meta.status.closed:
        # A suspended run is closed too (its next step is an answer, never a cancellation).
        raise RequestRefusedError(
            ErrorCode.RUN_NOT_ACTIVE.value, f"run {meta.run_id!r} is {meta.status.value}, not running"
        )
    return CancelRun(
        event_id=derive_id(meta.run_id, f"cancel/{reason.value}"),
        tenant_id=tenant_id,
        correlation_id=meta.run_id,
        run_id=meta.run_id,
        session_id=meta.session_id,
        reason=reason,
    )
