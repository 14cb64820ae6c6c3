"""A client's side of a deployment, as a UI and the transcript recorder see it: open a session,
publish a turn, read the run's events and finished turns back from their topics."""

from __future__ import annotations

import uuid
from typing import Any

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.runs import RunRequested, TurnCompleted
from quipu.contracts.topics import Topic
from quipu.contracts.wire import utc_now_ms
from quipu.services.kit.store_client import KafkaStore
from tests.owner_support import RawPublisher, TopicReader


class Conversing:
    """Talks to a deployment on `prefix` through its topics; a test's deployment mixes it in and
    provides the store client, the readers of `runs.events` and `history.turns` and a publisher."""

    prefix: str
    store: KafkaStore
    events: TopicReader
    turns: TopicReader
    publisher: RawPublisher

    async def session(self) -> str:
        """A new session, created through the store client."""
        session_id = "s-" + uuid.uuid4().hex[:10]
        await self.store.create_session(session_id, utc_now_ms())
        return session_id

    async def publish(self, name: Topic, body: bytes, key: str) -> None:
        """Publish raw bytes to one of the deployment's topics."""
        await self.publisher.send(self.prefix + name.value, body, key=key.encode())

    async def request(self, request: RunRequested) -> RunRequested:
        """Publish a run request as a client would."""
        await self.publish(Topic.RUNS_REQUESTED, request.model_dump_json().encode(), request.partition_key())
        return request

    async def turn(
        self, session_id: str, text: str = "", agent_id: str = "assistant", **fields: Any
    ) -> RunRequested:
        """Request a run of `agent_id` in `session_id` (`fields` as for `RunRequested`)."""
        run_id = "r-" + uuid.uuid4().hex
        return await self.request(
            RunRequested(run_id=run_id, session_id=session_id, agent_id=agent_id, text=text, **fields)
        )

    def run_events(self, run_id: str) -> list[RunEvent]:
        """The events of one run read so far, in order."""
        return [event for event in self.events.parsed(RunEvent) if event.run_id == run_id]

    def closed(self, run_id: str) -> bool:
        """Whether the run's stream has ended."""
        return any(event.type is StreamEventType.RUN_STREAM_END for event in self.run_events(run_id))

    def logs(self) -> str:
        """What to show when a wait fails (a deployment of processes shows their logs)."""
        return ""

    async def until_closed(self, run_id: str, within: float = 30.0) -> list[RunEvent]:
        """Wait for the run's stream to end; its events."""
        try:
            await self.events.wait_for(lambda _: self.closed(run_id), within)
        except AssertionError as failed:
            raise AssertionError(f"run {run_id}: no run_stream_end ({failed})\n{self.logs()}") from None
        return self.run_events(run_id)

    def finished_turns(self, run_id: str) -> list[TurnCompleted]:
        """Every copy of the run's finished turn read from `history.turns`."""
        return [turn for turn in self.turns.parsed(TurnCompleted) if turn.run_id == run_id]
