"""The planner's publisher in unit tests: every message it sent, in order.

    bus = Bus()
    planner = Planner(deps, bus, PlannerSettings())
    ...
    assert bus.events(StreamEventType.WORKFLOW)

A queued message is recorded as it is queued (the order the broker would keep) and taken at once,
unless `holding()` is on: then each waits for `release()`, as a broker that has not answered yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.services.planner.logic.actions import Output


@dataclass
class Bus:
    """The planner's publisher: remembers every message in order."""

    messages: list[Output] = field(default_factory=list)
    unacknowledged: list[asyncio.Future[None]] = field(default_factory=list)
    """Acknowledgements of queued messages not given yet (while `holding`)."""
    holding: bool = False
    """Whether queued messages wait for `release()` before they count as taken."""

    async def publish(self, message: Output) -> None:
        self.messages.append(message)

    async def queue(self, message: Output) -> Awaitable[None]:
        self.messages.append(message)
        acknowledged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.holding:
            self.unacknowledged.append(acknowledged)
        else:
            acknowledged.set_result(None)
        return acknowledged

    def release(self) -> None:
        """The broker takes every message queued so far."""
        for acknowledged in self.unacknowledged:
            acknowledged.set_result(None)
        self.unacknowledged.clear()

    def of(self, kind: type[Any]) -> list[Any]:
        return [message for message in self.messages if isinstance(message, kind)]

    def events(self, type_: StreamEventType) -> list[RunEvent]:
        return [event for event in self.of(RunEvent) if event.type is type_]
