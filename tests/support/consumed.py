"""A consumed message as `kit.delivery.Delivery.handle` sees one, for tests that hand it messages
without a broker: where it was read, its body and headers, whether its consumer marked it a first
delivery, and how often it was acked or nacked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Record:
    """Where the message was read (aiokafka's raw record, as far as delivery looks)."""

    topic: str = "t.commands"
    partition: int = 3
    offset: int = 42
    key: bytes | None = b"session-1"


@dataclass
class Message:
    """A consumed message; counts its acks and nacks."""

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    raw_message: Record = field(default_factory=Record)
    acked: int = 0
    nacked: int = 0
    first_delivery: bool = False

    async def ack(self) -> None:
        self.acked += 1

    async def nack(self) -> None:
        self.nacked += 1
