"""docs/wire.md is what the contracts and the delivery wrapper say, never a stale copy."""

from __future__ import annotations

from typing import Any

from quipu.contracts import wire_doc
from quipu.contracts.commands import REPLY_PARTITION_HEADER, REPLY_TO_HEADER, STORE_COMMAND
from quipu.contracts.store import LifecycleType
from quipu.contracts.topics import TOPICS
from quipu.services.kit.delivery import DeadLetterLimits, Delivery, RetryPolicy
from tests.support.consumed import Message
from tests.unit.test_delivery import Broker


def test_the_committed_wire_document_is_the_generated_one() -> None:
    committed = wire_doc.DOC_PATH.read_text(encoding="utf-8")
    assert committed == wire_doc.render(), "docs/wire.md is stale: run python -m quipu.contracts.wire_doc"
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


async def _letter_headers(body: bytes, **limits: Any) -> set[str]:
    """The x-dlq-* headers of the dead letter Delivery writes for an undecodable `body`."""
    broker = Broker()
    delivery = Delivery(broker, RetryPolicy(attempts=1), DeadLetterLimits(attempts=1, **limits))
    await delivery.handle(Message(body, headers={"trace": "t"}), STORE_COMMAND, _never)
    [(_, _, _, headers)] = broker.sent
    return {name for name in headers if name.startswith("x-dlq-")}


async def _never(_: object) -> None:
    raise AssertionError("an invalid command is never applied")


async def test_the_dead_letter_headers_documented_are_the_ones_delivery_writes() -> None:
    written = (
        await _letter_headers(b"not json")
        | await _letter_headers(b"x" * 20_000, max_bytes=10_000)
        | await _letter_headers(b"not json", max_original_headers_bytes=1)
    )
    documented = {name for name, _ in wire_doc.DEAD_LETTER_HEADERS}
    assert written == documented
