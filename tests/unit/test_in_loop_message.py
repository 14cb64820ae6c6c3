"""A handler's consumed message comes without a thread hop (`kit.broker.InLoopKafkaMessage`).

fast_depends runs a custom field's synchronous `use` in a worker thread, and FastStream's
`Context` (behind `KafkaMessage`) is one: every message handled cost a hop to a thread and back.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import pytest
from faststream.kafka import KafkaBroker, TestKafkaBroker
from faststream.kafka.annotations import KafkaMessage

from quipu.services.kit.broker import InLoopKafkaMessage


async def _hops_to_take_one_message(monkeypatch: pytest.MonkeyPatch, in_loop: bool) -> tuple[int, bytes]:
    hops: list[object] = []
    to_thread = anyio.to_thread.run_sync

    async def counted(function: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(function)
        return await to_thread(function, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    broker = KafkaBroker()
    taken: list[bytes] = []
    if in_loop:

        @broker.subscriber("in")
        async def take_in_loop(message: InLoopKafkaMessage) -> None:
            taken.append(message.body)

    else:

        @broker.subscriber("in")
        async def take(message: KafkaMessage) -> None:
            taken.append(message.body)

    async with TestKafkaBroker(broker) as test_broker:
        await test_broker.publish(b"hello", "in")
    return len(hops), taken[0]


async def test_the_message_is_given_without_a_thread_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    assert await _hops_to_take_one_message(monkeypatch, in_loop=True) == (0, b"hello")
    # FastStream's own annotation hops (what this guards against; a FastStream that stops doing
    # so makes this line fail, and the alias can go).
    hops, body = await _hops_to_take_one_message(monkeypatch, in_loop=False)
    assert hops >= 1 and body == b"hello"
