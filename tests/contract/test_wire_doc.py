"""docs/wire.md is what the contracts and the delivery wrapper say, never a stale copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts import wire_doc
from contracts.commands import REPLY_PARTITION_HEADER, REPLY_TO_HEADER, STORE_COMMAND
from contracts.store import LifecycleType
from contracts.topics import TOPICS
from services.kit.delivery import DeadLetterLimits, Delivery, RetryPolicy


def test_the_committed_wire_document_is_the_generated_one() -> None:
    committed = wire_doc.DOC_PATH.read_text(encoding="utf-8")
    assert committed == wire_doc.render(), "docs/wire.md is stale: run python -m contracts.wire_doc"
    assert wire_doc.main(["--check"]) == 0


def test_the_document_covers_every_topic_command_and_route_header() -> None:
    text = wire_doc.render()
    for spec in TOPICS:
        assert f"| `{spec.topic.value}` | {spec.key} |" in text
    for command in wire_doc._commands():
        assert f"### {command.__name__}" in text
    assert f"`{REPLY_PARTITION_HEADER}`" in text and f"`{REPLY_TO_HEADER}`" in text
    assert set(wire_doc.PAYLOADS) == {spec.topic for spec in TOPICS}
    for record_type in LifecycleType:
        assert f"`{record_type.value}`:" in text


@dataclass
class _Record:
    topic: str = "t.storage.commands"
    partition: int = 1
    offset: int = 7
    key: bytes | None = b"session"


@dataclass
class _Message:
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    raw_message: _Record = field(default_factory=_Record)

    async def ack(self) -> None:
        return None

    async def nack(self) -> None:
        return None


@dataclass
class _Broker:
    """Takes letters up to `max_bytes`; refuses the first `refuse` letters for good (not healing)."""

    max_bytes: int
    refuse: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)

    async def __call__(self, body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        if self.refuse > 0:
            self.refuse -= 1
            raise ValueError("refused")
        self.headers.append(headers)


async def _letter_headers(body: bytes, *, max_bytes: int = 1_048_576, refuse: int = 0) -> set[str]:
    broker = _Broker(max_bytes, refuse)
    delivery = Delivery(broker, RetryPolicy(attempts=1), DeadLetterLimits(max_bytes=max_bytes, attempts=1))
    await delivery.handle(_Message(body, {"trace": "t"}), STORE_COMMAND, _never)
    [headers] = broker.headers
    return {name for name in headers if name.startswith("x-dlq-")}


async def _never(_: object) -> None:
    raise AssertionError("an invalid command is never applied")


async def test_the_dead_letter_headers_documented_are_the_ones_delivery_writes() -> None:
    written = (
        await _letter_headers(b"not json")
        | await _letter_headers(b"x" * 20_000, max_bytes=10_000)
        | await _letter_headers(b"not json", refuse=1)
    )
    documented = {name for name, _ in wire_doc.DEAD_LETTER_HEADERS}
    assert written == documented
