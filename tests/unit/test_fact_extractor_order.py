"""The extractor orders turns by principal: two sessions of one person are never extracted at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from faststream.kafka.annotations import KafkaMessage

from quipu.contracts.memory import HistoryRecorded, MemoryScope
from quipu.services.fact_extractor.handlers import by_principal


@dataclass
class Record:
    key: bytes | None


@dataclass
class Message:
    body: bytes
    raw_message: Record


def _recorded(session_id: str, principal_id: str, tenant_id: str = "acme") -> KafkaMessage:
    event = HistoryRecorded(
        session_id=session_id,
        turn_id=f"{session_id}-t1",
        scope=MemoryScope(tenant_id=tenant_id, principal_id=principal_id, agent_id="assistant"),
        first_seq=1,
        last_seq=2,
    )
    return cast(KafkaMessage, Message(event.model_dump_json().encode(), Record(session_id.encode())))


def test_two_sessions_of_one_principal_share_an_order_key() -> None:
    assert by_principal(_recorded("s-1", "ana")) == by_principal(_recorded("s-2", "ana")) == b"acme/ana"


def test_principals_and_tenants_are_ordered_apart() -> None:
    keys = {by_principal(_recorded("s-1", "ana")), by_principal(_recorded("s-1", "luis"))}
    keys.add(by_principal(_recorded("s-1", "ana", tenant_id="other")))
    assert len(keys) == 3


def test_a_message_that_is_not_a_turn_falls_back_to_its_kafka_key() -> None:
    for body in (b"{not json", b"[]", b'{"scope": "x"}', b"{}"):
        assert by_principal(cast(KafkaMessage, Message(body, Record(b"s-9")))) == b"s-9"
