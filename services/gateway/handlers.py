"""The gateway's routes: each a few lines — load what a check needs, call the logic, publish or answer."""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from quipu.contracts import asyncapi
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.runs import CancelRun, RunRequested
from quipu.contracts.store import Page, RunMeta, Session
from quipu.contracts.transcript import TranscriptErasedError, TranscriptError, encode_messages
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain import run_requests
from quipu.services.domain.memory.context import run_sealing_principal
from quipu.services.domain.run_publisher import RunRequestSender
from quipu.services.domain.transcript import build_messages_from_run_log
from quipu.services.gateway import access, logic
from quipu.services.gateway.access import Caller
from quipu.services.gateway.adapters import EventStreams
from quipu.services.gateway.auth import RunsReader, RunsWriter
from quipu.services.gateway.logic import (
    AnswerRequest,
    CancelRequest,
    CreateSessionRequest,
    ErrorResponse,
    GatewayError,
    GatewayStore,
    Health,
    RunAccepted,
    RunPending,
    RunRequest,
    TranscriptResponse,
)
from quipu.services.kit.run_events import EventPosition, EventStreamError, InvalidPositionError, StartAt
from quipu.services.kit.sealing import sealing_for


@dataclass
class GatewayDeps:
    """What the routes need; `create_app` builds the Kafka-backed ones in its lifespan."""

    store: GatewayStore
    publisher: RunRequestSender
    streams: EventStreams
    tenant_id: str = ""
    """The default tenant: where sessions created without an owner belong."""
    accepted: access.AcceptedRuns = field(default_factory=access.AcceptedRuns)
    learn_accepted: Callable[[], Awaitable[None]] = access.nothing_to_learn
    """Learns into `accepted` what the other gateway copies accepted until now (`RequestedRuns`)."""

    async def session(self, caller: Caller, session_id: str) -> Session:
        """A session the caller may reach; 404 otherwise, as if it did not exist."""
        session = await self.store.load_session_status(session_id)
        return access.require_session(caller, session, default_tenant=self.tenant_id)

    async def own_session(self, caller: Caller, session_id: str) -> Session:
        """A session the caller may add turns to: their own."""
        session = await self.store.load_session_status(session_id)
        return access.require_own_session(caller, session, default_tenant=self.tenant_id)

    async def turn_session(self, caller: Caller, session_id: str) -> Session:
        """The caller's session for a new turn, created (owned by them) on first use, as
        `quipu run --session` does; another's is refused, an ended one is 409, a purged one 410."""
        try:
            session = await self.store.create_session(session_id, utc_now_ms(), caller.owner)
        except StoreError as error:
            if error.code is ErrorCode.SESSION_ENDED:
                # Whose it is first: another's ended session is as unknown as any other of theirs.
                await self.own_session(caller, session_id)
            raise
        return access.require_own_session(caller, session, default_tenant=self.tenant_id)

    async def run(self, caller: Caller, run_id: str) -> RunMeta:
        """A run the caller may reach (its session's owner, or a one-shot run's); 404 otherwise."""
        meta = await self.store.load_run(run_id)
        if meta.session_id:
            try:
                await self.session(caller, meta.session_id)
            except GatewayError as error:
                raise access.unknown_run(run_id) from error
        elif not access.reaches(caller, access.labelled_owner(meta), default_tenant=self.tenant_id):
            raise access.unknown_run(run_id)
        return meta

    async def publish(self, message: RunRequested | CancelRun) -> None:
        """Publish a run request or a cancel, and have the streams it will show on fetch at once."""
        await self.publisher.publish(message)
        self.streams.expect(message.session_id or message.run_id)

    async def accepted_session(self, caller: Caller, run_id: str) -> str | None:
        """The session of a run accepted lately for the caller, on any copy, that the planner has
        not started; None for a run nobody accepted."""
        session_id = self.accepted.session_of(run_id, caller.owner, time.monotonic())
        if session_id is None:
            await self.learn_accepted()
            session_id = self.accepted.session_of(run_id, caller.owner, time.monotonic())
        return session_id


def sealing_for_run(meta: RunMeta, caller: Caller) -> contextlib.AbstractContextManager[None]:
    """Reads of a run's records travel sealed under its principal's key (the owner the gateway
    stamped on it, else the caller who reaches it), so a forget reaches the replies too."""
    owner = access.labelled_owner(meta) or caller.owner
    return sealing_for(
        owner.tenant_id, run_sealing_principal(owner.principal_id, meta.session_id, meta.run_id)
    )


def _deps(request: Request) -> GatewayDeps:
    deps: GatewayDeps | None = getattr(request.app.state, "deps", None)
    if deps is None:
        raise GatewayError(503, "UNAVAILABLE", "the gateway is starting or stopping")
    return deps


Deps = Annotated[GatewayDeps, Depends(_deps)]

_ERRORS: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 409, 410, 503)
}

router = APIRouter(prefix="/v1", responses=_ERRORS)

# --- sessions -------------------------------------------------------------------------------------


@router.post("/sessions", status_code=201, response_model=Session, tags=["sessions"])
async def create_session(
    deps: Deps, caller: RunsWriter, body: Annotated[CreateSessionRequest | None, Body()] = None
) -> Session:
    """Create a session owned by the caller (an active one of theirs with that id is returned as it is).

    Optional: `POST /v1/runs` creates its session on first use. Who owns it is the credential's
    principal, never a body field.
    """
    session_id = (body.session_id if body else None) or run_requests.new_id()
    session = await deps.store.create_session(session_id, utc_now_ms(), caller.owner)
    if session.owner != caller.owner:
        raise GatewayError(409, logic.SESSION_ID_TAKEN, f"session id {session_id!r} is taken; choose another")
    return session


@router.get("/sessions/{session_id}", response_model=Session, tags=["sessions"])
async def get_session(deps: Deps, caller: RunsReader, session_id: str) -> Session:
    """A session's status."""
    return await deps.session(caller, session_id)


@router.post("/sessions/{session_id}/end", response_model=Session, tags=["sessions"])
async def end_session(deps: Deps, caller: RunsWriter, session_id: str) -> Session:
    """End a session: its running runs may still finish; new runs stop at once."""
    await deps.session(caller, session_id)
    return await deps.store.end_session(session_id, utc_now_ms())


@router.delete("/sessions/{session_id}", status_code=204, response_class=Response, tags=["sessions"])
async def purge_session(deps: Deps, caller: RunsWriter, session_id: str) -> None:
    """Purge an ended session with no running run: its runs and records are deleted, the id is never
    reusable.

    What the person told the agent there and it kept as facts is their memory, not the session's:
    it stays (listed with the session it came from by `GET /v1/principals/{principal_id}/facts`;
    delete a fact with `DELETE /v1/principals/{principal_id}/facts/{fact_id}`, or everything with
    `DELETE /v1/principals/{principal_id}`).
    """
    try:
        await deps.session(caller, session_id)
    except StoreError as error:
        if error.code is not ErrorCode.SESSION_PURGED:
            raise
        return  # purged already (whose it was is gone with it): purging is idempotent
    await deps.store.purge_session(session_id)


@router.get("/sessions/{session_id}/runs", response_model=list[RunMeta], tags=["sessions"])
async def list_session_runs(deps: Deps, caller: RunsReader, session_id: str) -> list[RunMeta]:
    """Every run of the session, in start order."""
    await deps.session(caller, session_id)
    return await deps.store.list_runs_by_session(session_id, [])


@router.get(
    "/sessions/{session_id}/events",
    response_class=StreamingResponse,
    tags=["sessions"],
    responses={200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events."}},
)
async def session_events(
    deps: Deps,
    caller: RunsReader,
    session_id: str,
    start: Annotated[StartAt, Query(alias="from", description="Without a resume position.")] = (
        StartAt.BEGINNING
    ),
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    after: Annotated[
        str | None, Query(description="Resume after this event id (for clients that cannot set headers).")
    ] = None,
) -> StreamingResponse:
    """The session's run events, live, as Server-Sent Events.

    Each event: `id: <partition>-<offset>`, `event: <type>`, `data: <RunEvent JSON>`. Reconnecting
    with `Last-Event-ID` resumes just after that event; otherwise the stream starts at the
    beginning of the session's history, or at `?from=now`. Idle streams get a comment every ~15 s.
    """
    await deps.session(caller, session_id)  # 404 / 410 before any stream opens
    resume = last_event_id or after
    try:
        position = EventPosition.parse(resume) if resume else None
        reader = await deps.streams.open(session_id, after=position, start_at=start)
    except InvalidPositionError as error:
        # The text is ours: the caller's position is never echoed back.
        message = f"Last-Event-ID (or after): {error}; reconnect without it, or with ?from=now"
        raise GatewayError(400, logic.INVALID_REQUEST, message) from error
    except EventStreamError as error:
        raise GatewayError(503, "UNAVAILABLE", str(error)) from error
    return StreamingResponse(
        deps.streams.body(reader),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(deps.streams.release, reader),
    )


# --- runs -----------------------------------------------------------------------------------------


@router.post("/runs", status_code=202, response_model=RunAccepted, tags=["runs"])
async def request_run(deps: Deps, caller: RunsWriter, body: RunRequest) -> RunAccepted:
    """Ask an agent for a turn as the caller; follow it on the session's event stream.

    The session is created on first use (as `quipu run --session` does), owned by the caller; a
    session of somebody else's is refused before anything is published.
    """
    labels = access.owner_labels(caller, body.labels)
    if body.session_id:
        await deps.turn_session(caller, body.session_id)
    stamped = body.model_copy(update={"labels": labels})
    message = run_requests.turn_request(stamped, tenant_id=caller.tenant_id, principal_id=caller.principal_id)
    await deps.publish(message)
    deps.accepted.add(message.run_id, caller.owner, message.session_id, time.monotonic())
    return logic.accepted(message)


@router.get(
    "/runs/{run_id}",
    response_model=RunMeta,
    tags=["runs"],
    responses={202: {"model": RunPending, "description": "Accepted here, not started by the planner yet."}},
)
async def get_run(deps: Deps, caller: RunsReader, run_id: str) -> RunMeta | JSONResponse:
    """A run's identity and current state; 202 while a run this gateway accepted waits for the planner."""
    try:
        return await deps.run(caller, run_id)
    except StoreError as error:
        if error.code is not ErrorCode.RUN_NOT_FOUND:
            raise
        session_id = await deps.accepted_session(caller, run_id)
        if session_id is None:
            raise
    follow = f"follow /v1/sessions/{session_id}/events" if session_id else "ask again"
    pending = RunPending(
        run_id=run_id,
        session_id=session_id,
        message=f"accepted and queued for the planner, not started yet: {follow}",
    )
    return JSONResponse(pending.model_dump(), status_code=202, headers={"Retry-After": "1"})


@router.post("/runs/{run_id}/cancel", status_code=202, response_model=RunAccepted, tags=["runs"])
async def cancel_run(
    deps: Deps, caller: RunsWriter, run_id: str, body: Annotated[CancelRequest | None, Body()] = None
) -> RunAccepted:
    """Ask for a run to be canceled; the first accepted reason is permanent."""
    meta = await deps.run(caller, run_id)
    message = run_requests.cancel_request(meta, (body or CancelRequest()).reason, tenant_id=caller.tenant_id)
    await deps.publish(message)
    return logic.accepted(message)


@router.post("/runs/{run_id}/answer", status_code=202, response_model=RunAccepted, tags=["runs"])
async def answer_run(deps: Deps, caller: RunsWriter, run_id: str, body: AnswerRequest) -> RunAccepted:
    """Answer a suspended run as the caller: its continuation starts in the same session."""
    meta = await deps.run(caller, run_id)
    if meta.session_id:
        await deps.own_session(caller, meta.session_id)
    message = run_requests.resume_request(
        meta, body.answer, principal_id=caller.principal_id, run_id=body.run_id, tenant_id=caller.tenant_id
    )
    await deps.publish(message)
    deps.accepted.add(message.run_id, caller.owner, message.session_id, time.monotonic())
    return logic.accepted(message)


@router.get("/runs/{run_id}/records", response_model=Page, tags=["runs"])
async def list_run_records(
    deps: Deps,
    caller: RunsReader,
    run_id: str,
    cursor: Annotated[str, Query(description="From a previous page's next_cursor; empty: the start.")] = "",
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 100,
) -> Page:
    """A page of the run's records in order (payloads are base64 JSON bytes)."""
    meta = await deps.run(caller, run_id)
    with sealing_for_run(meta, caller):
        return await deps.store.list_run_records(run_id, cursor, limit)


@router.get(
    "/runs/{run_id}/transcript",
    response_class=Response,
    tags=["runs"],
    responses={200: {"model": TranscriptResponse, "description": "The run's messages, in order."}},
)
async def get_transcript(deps: Deps, caller: RunsReader, run_id: str) -> Response:
    """The run's transcript, rebuilt from its records (exact JSON: numbers keep their digits)."""
    meta = await deps.run(caller, run_id)
    try:
        with sealing_for_run(meta, caller):
            messages = await build_messages_from_run_log(deps.store, run_id)
    except TranscriptErasedError as error:
        raise GatewayError(410, logic.TRANSCRIPT_ERASED, "the run's principal was forgotten") from error
    except TranscriptError as error:
        raise GatewayError(422, logic.TRANSCRIPT_UNAVAILABLE, str(error)) from error
    head = json.dumps({"run_id": run_id})[:-1].encode()  # '{"run_id": "..."' without the brace
    return Response(
        content=head + b', "messages": ' + encode_messages(messages) + b"}",
        media_type="application/json",
    )


health_router = APIRouter()


@health_router.get("/healthz", response_model=Health, tags=["health"])
async def health(deps: Deps) -> Health:
    """Liveness, and how many event streams are open."""
    return Health(status="ok", open_streams=deps.streams.open_count)


@functools.cache
def wire_document() -> bytes:
    """The AsyncAPI document, generated once per process (pydantic takes about a second)."""
    return asyncapi.render().encode()


@health_router.get("/asyncapi.json", tags=["wire"], response_class=Response)
async def wire() -> Response:
    """The AsyncAPI 3 document of every Kafka topic (docs/asyncapi.json): open to all, as it
    describes the wire and carries no one's data."""
    return Response(content=wire_document(), media_type="application/json")
