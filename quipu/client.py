"""`quipu.Client`: talk to a Quipu deployment from any Python program, over its Kafka topics.

    async with Client(KafkaSettings(bootstrap="127.0.0.1:9092")) as client:
        run_id = await client.run("calculate 6*7", session_id="s-1", principal_id="ada")
        async for streamed in client.follow(run_id):      # until the run's stream ends
            print(streamed.position, streamed.event.type)
        status = await client.status(run_id)              # RunMeta: suspended, completed, ...
        if status.status is RunStatus.SUSPENDED:
            run_id = await client.answer(run_id, "yes")   # its continuation, in the same session
        print((await client.result(run_id)).text)

It does what `quipu run`, `quipu answer` and `quipu cancel` do, with the same pieces: requests
are built by `quipu.services.domain.run_requests` and published by the one run-request publisher
(sealed under the person's key when the deployment has a key channel); events are read as the
gateway reads its SSE streams (one `EventFeed` a client: one consumer however many streams you
follow); statuses and transcripts come from the storage owner. Every event comes with its
`EventPosition`: pass the last one you handled as `after=` to pick up where you left off, in
this process or another.

Errors are typed: `RequestRefusedError` (the run is not in a state the request applies to),
`StoreError` (the owner refused, or `UNAVAILABLE`: nothing answered in time), `EventStreamError`
(the events cannot be read), pydantic's `ValidationError` (a turn out of bounds).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.events import RunEvent, RunPhase, StreamEventType
from quipu.contracts.lifecycle import decode_run_suspended
from quipu.contracts.store import (
    CancellationReason,
    LifecycleType,
    RunMeta,
    RunStatus,
    Session,
    SessionOwner,
)
from quipu.contracts.transcript import Message, TextPart
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.context import run_sealing_principal
from quipu.services.domain.run_publisher import KafkaRunPublisher, RunRequestSender
from quipu.services.domain.run_requests import (
    Turn,
    cancel_request,
    require_open,
    resume_request,
    turn_request,
)
from quipu.services.domain.store.protocol import Store
from quipu.services.domain.transcript import build_messages_from_run_log
from quipu.services.kit.event_feed import EventFeed, FedStream
from quipu.services.kit.keys import message_seals
from quipu.services.kit.run_events import EventPosition, StartAt, StreamedEvent
from quipu.services.kit.sealing import sealing_for
from quipu.services.kit.settings import KafkaSettings, StoreClientSettings
from quipu.services.kit.store_client import KafkaStore

QUESTIONS_WITHIN_S = 10.0
"""How long `follow` waits after a suspended run's end for the questions it waits on."""


@dataclass(frozen=True)
class RunResult:
    """How a run stands: its metadata, and its transcript as the model saw it."""

    meta: RunMeta
    messages: list[Message]

    @property
    def status(self) -> RunStatus:
        """The run's status (completed, failed, canceled, suspended, running...)."""
        return self.meta.status

    @property
    def text(self) -> str:
        """What the agent said last: the text parts of the transcript's last assistant message."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return "".join(part.text for part in message.parts if isinstance(part, TextPart))
        return ""


class RunEvents:
    """The events of a session, or of one run, in order, each with its position; an async iterator.

    With `run_id` it ends after that run's `run_stream_end` (for a suspended run, once the
    questions it waits on have arrived too, which the planner may publish just after); without,
    it follows the session until you stop. `position` is the last event handed out: give it as
    `after=` to resume.
    """

    def __init__(
        self,
        open_stream: Callable[[EventPosition | None, StartAt], Awaitable[FedStream]],
        *,
        run_id: str = "",
        after: EventPosition | None = None,
        start_at: StartAt = StartAt.BEGINNING,
        pending_inputs: Callable[[], Awaitable[int]] | None = None,
        poll_s: float = 0.5,
    ) -> None:
        self._open_stream = open_stream
        self._stream: FedStream | None = None
        self._closed = False
        self._run_id = run_id
        self._after = after
        self._start_at = start_at
        self._pending_inputs = pending_inputs
        self._poll_s = poll_s
        self._buffer: list[StreamedEvent] = []
        self._phase = ""
        self._questions = 0
        self._questions_deadline: float | None = None
        self._expected_questions = 0
        self.position: EventPosition | None = after

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamedEvent:
        if self._closed:
            raise StopAsyncIteration
        stream = self._stream or await self._start()
        while True:
            while self._buffer:
                streamed = self._buffer.pop(0)
                if self._run_id and streamed.event.run_id != self._run_id:
                    continue
                if self._finished() and not streamed.event.type.value.startswith("await_"):
                    continue  # after the end only the questions the suspended run asks
                self.position = streamed.position
                await self._note(streamed.event)
                return streamed
            if self._finished() and self._questions >= self._expected_questions:
                await self.aclose()
                raise StopAsyncIteration
            if self._questions_deadline is not None and time.monotonic() > self._questions_deadline:
                await self.aclose()
                raise StopAsyncIteration
            self._buffer.extend(await stream.read(timeout_s=self._poll_s))

    async def _start(self) -> FedStream:
        self._stream = await self._open_stream(self._after, self._start_at)
        return self._stream

    def _finished(self) -> bool:
        return bool(self._run_id) and self._phase == StreamEventType.RUN_STREAM_END.value

    async def _note(self, event: RunEvent) -> None:
        """Track where the followed run is: its terminal phase, its end, the questions it asks."""
        if not self._run_id:
            return
        if event.type.value.startswith("await_"):
            self._questions += 1
        elif event.type is StreamEventType.WORKFLOW and event.payload.get("phase") in _TERMINAL:
            self._phase = str(event.payload["phase"])
        elif event.type is StreamEventType.RUN_STREAM_END:
            suspended = self._phase == RunPhase.SUSPENDED.value
            self._phase = StreamEventType.RUN_STREAM_END.value
            if suspended and self._pending_inputs is not None:
                self._expected_questions = await self._pending_inputs()
                self._questions_deadline = time.monotonic() + QUESTIONS_WITHIN_S

    async def aclose(self) -> None:
        """Stop reading; safe to call more than once."""
        self._closed = True
        if self._stream is not None:
            await self._stream.stop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


_TERMINAL = {phase.value for phase in RunPhase if phase.terminal}


class Client:
    """A deployment's runs from Python: publish turns, follow events, answer, cancel, read results.

    `tenant_id` and `principal_id` are who this client speaks for (each call may name another
    principal); they go on every request, as the gateway puts a credential's on its requests.
    """

    def __init__(
        self,
        kafka: KafkaSettings | None = None,
        *,
        store_settings: StoreClientSettings | None = None,
        tenant_id: str = "",
        principal_id: str = "",
        client_id: str = "quipu-client",
        store: Store | None = None,
        publisher: RunRequestSender | None = None,
    ) -> None:
        """`kafka`: the deployment (QUIPU_KAFKA_* when not given); `store_settings`: how long a
        store call waits for the owner, and where the data keys come from (`keys`: QUIPU_KEYS_*
        when not given; none configured, nothing is sealed). `store` and `publisher` replace the
        Kafka-backed ones (tests: an in-memory store, a recording publisher); the caller starts
        and stops those."""
        self.kafka = kafka or KafkaSettings()
        self.tenant_id = tenant_id
        self.principal_id = principal_id
        self._client_id = client_id
        settings = store_settings or StoreClientSettings()
        # One key cache for everything this client seals and opens: a key is fetched once per TTL.
        self._seals = message_seals(settings.keys)
        self._feed = EventFeed(self.kafka, client_id=f"{client_id}-events", seals=self._seals)
        self._owned_store: KafkaStore | None = None
        self._owned_publisher: KafkaRunPublisher | None = None
        if store is None:
            store = self._owned_store = KafkaStore.for_service(
                self.kafka, settings, tenant_id=tenant_id, seals=self._seals
            )
        if publisher is None:
            publisher = self._owned_publisher = KafkaRunPublisher(
                self.kafka, client_id=client_id, seals=self._seals
            )
        self._store: Store = store
        self._publisher: RunRequestSender = publisher
        self._sessions: dict[str, str] = {}

    @property
    def store(self) -> Store:
        """The store (the storage owner's operations), for what this class does not wrap."""
        return self._store

    async def start(self) -> None:
        """Connect to the storage owner and the broker."""
        if self._owned_store is not None:
            await self._owned_store.start()
        try:
            if self._owned_publisher is not None:
                await self._owned_publisher.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Flush and disconnect; safe to call more than once."""
        try:
            if self._owned_publisher is not None:
                await self._owned_publisher.stop()
        finally:
            try:
                if self._owned_store is not None:
                    await self._owned_store.stop()
            finally:
                await self._seals.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    # --- requests ---------------------------------------------------------------------------------

    async def run(
        self,
        text: str,
        *,
        agent_id: str = "assistant",
        session_id: str | None = None,
        principal_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        run_id: str | None = None,
    ) -> str:
        """Ask `agent_id` for a turn; the run id. With `session_id` the session is created on first
        use (an ended one is refused); without, a one-shot run. The same `run_id` asks again for
        the same run (an exact retry)."""
        turn = Turn(
            agent_id=agent_id, text=text, session_id=session_id, labels=dict(labels or {}), run_id=run_id
        )
        principal = self.principal_id if principal_id is None else principal_id
        if turn.session_id:
            await self.open_session(turn.session_id, principal_id=principal)
        request = turn_request(turn, tenant_id=self.tenant_id, principal_id=principal)
        await self._publisher.publish(request)
        self._sessions[request.run_id] = request.session_id
        return request.run_id

    async def open_session(self, session_id: str, *, principal_id: str | None = None) -> Session:
        """The session, created (owned by the principal) when it does not exist; an ended one is refused."""
        try:
            session = await self._store.load_session_status(session_id)
        except StoreError as error:
            if error.code is not ErrorCode.SESSION_NOT_FOUND:
                raise
            principal = self.principal_id if principal_id is None else principal_id
            owner = SessionOwner(tenant_id=self.tenant_id, principal_id=principal) if principal else None
            session = await self._store.create_session(session_id, utc_now_ms(), owner)
        require_open(session)
        return session

    async def answer(
        self, run_id: str, answer: Any, *, principal_id: str | None = None, continuation_id: str | None = None
    ) -> str:
        """Answer the suspended run `run_id`; the id of its continuation (a run in the same session)."""
        principal = self.principal_id if principal_id is None else principal_id
        request = resume_request(
            await self._store.load_run(run_id),
            answer,
            principal_id=principal,
            run_id=continuation_id,
            tenant_id=self.tenant_id,
        )
        await self._publisher.publish(request)
        self._sessions[request.run_id] = request.session_id
        return request.run_id

    async def cancel(
        self, run_id: str, reason: CancellationReason = CancellationReason.USER_REQUESTED
    ) -> None:
        """Ask for the run to be canceled (refused once it ended or suspended)."""
        request = cancel_request(await self._store.load_run(run_id), reason, tenant_id=self.tenant_id)
        await self._publisher.publish(request)

    # --- reading ----------------------------------------------------------------------------------

    async def status(self, run_id: str) -> RunMeta:
        """The run's metadata and status as the store holds it (RUN_NOT_FOUND until the planner starts it)."""
        return await self._store.load_run(run_id)

    async def result(self, run_id: str) -> RunResult:
        """The run's status and transcript (`text`: what the agent said last)."""
        meta = await self._store.load_run(run_id)
        principal = run_sealing_principal(self.principal_id, meta.session_id, meta.run_id)
        with sealing_for(self.tenant_id, principal):  # the reply travels sealed like the records
            messages = await build_messages_from_run_log(self._store, run_id)
        return RunResult(meta=meta, messages=messages)

    async def pending_inputs(self, run_id: str) -> int:
        """How many answers the suspended run waits for (its last `run_suspended` record says)."""
        pending, cursor = 1, ""
        while True:
            page = await self._store.list_run_records(run_id, cursor, 500)
            for record in page.records:
                if record.type == LifecycleType.RUN_SUSPENDED.value:
                    pending = decode_run_suspended(record.payload).pending_count
            if not page.next_cursor:
                return pending
            cursor = page.next_cursor

    def events(
        self,
        session_id: str,
        *,
        after: EventPosition | str | None = None,
        start_at: StartAt = StartAt.BEGINNING,
    ) -> RunEvents:
        """Every event of the session from `after` (a position, or its text), else from `start_at`."""

        async def open_stream(position: EventPosition | None, start: StartAt) -> FedStream:
            return await self._feed.open(session_id=session_id, after=position, start_at=start)

        return RunEvents(open_stream, after=_position(after), start_at=start_at)

    def follow(
        self, run_id: str, *, session_id: str | None = None, after: EventPosition | str | None = None
    ) -> RunEvents:
        """The run's events until its stream ends (from `after`, else from the session's retained start).

        Its session is the one this client published it in, else `session_id`, else the store's
        (so a run another program published is followed once the planner has started it).
        """

        async def open_stream(position: EventPosition | None, start: StartAt) -> FedStream:
            session = session_id if session_id is not None else self._sessions.get(run_id)
            if session is None:
                session = (await self._store.load_run(run_id)).session_id
            return await self._feed.open(session_id=session, run_id=run_id, after=position, start_at=start)

        return RunEvents(
            open_stream,
            run_id=run_id,
            after=_position(after),
            pending_inputs=lambda: self.pending_inputs(run_id),
        )


def _position(after: EventPosition | str | None) -> EventPosition | None:
    return EventPosition.parse(after) if isinstance(after, str) else after
