"""The kit's one service application on the real embedded broker: open → subscribe → serve → drain →
close, for a service built here and for every consuming service of the catalog.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from faststream.kafka import KafkaBroker
from faststream.kafka.subscriber.usecase import LogicSubscriber
from pydantic import TypeAdapter

from quipu.contracts.sealed import SealedFor
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services import catalog
from quipu.services.kit.broker import group_id, topic
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer, consume_concurrently
from quipu.services.kit.delivery import Delivery
from quipu.services.kit.keys import KeyClient, MessageSeals
from quipu.services.kit.lifecycle import Connections, Opened, Running, service_app
from quipu.services.kit.settings import ConsumerSettings, KafkaSettings, MongoSettings
from tests.owner_support import RawPublisher
from tests.timing import eventually, scaled

pytestmark = pytest.mark.slow

BODY = TypeAdapter(dict[str, str])
GROUP = "lifecycle-probe"

DEFINITIONS = {service.name: service.definition() for service in catalog.CONSUMING}
"""Imported here, at collection: importing a service inside the test would hold its event loop."""


async def committed(kafka: KafkaSettings, group: str, partition: TopicPartition) -> int | None:
    """The group's committed offset on `partition` (read without joining the group)."""
    reader = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group, enable_auto_commit=False)
    await reader.start()
    try:
        offset: int | None = await reader.committed(partition)
        return offset
    finally:
        await reader.stop()


async def test_a_service_opens_before_it_consumes_and_closes_after_what_was_in_flight_is_done(
    stack: EmbeddedStack, kafka_settings: KafkaSettings
) -> None:
    log: list[str] = []
    release = asyncio.Event()
    running_seen: list[Running[str]] = []
    consumers: list[ConcurrentConsumer] = []

    class Client:
        async def start(self) -> None:
            log.append("client started")

        async def stop(self) -> None:
            log.append("client stopped")

    class KeySource:
        async def data_key(self, whose: SealedFor, *, create: bool) -> bytes | None:
            raise AssertionError("nothing sealed is consumed here")

        async def close(self) -> None:
            log.append("seals closed")

    async def open_probe(_: KafkaBroker, opened: Opened) -> str:
        await opened.start(Client())
        log.append("opened")
        return "the probe"

    def subscribe(broker: KafkaBroker, delivery: Delivery, running: Running[str]) -> list[ConcurrentConsumer]:
        async def effect(body: dict[str, str]) -> None:
            log.append(f"handling {body['n']}")
            await release.wait()
            log.append(f"handled {body['n']} by {running.get()}")

        running_seen.append(running)
        consumers.append(
            consume_concurrently(
                broker,
                kafka_settings,
                Topic.HISTORY_TURNS,
                lambda message: delivery.handle(message, BODY, effect),
                group=GROUP,
                settings=settings,
            )
        )
        return consumers

    settings = ConsumerSettings(shutdown_grace_s=scaled(30.0))
    app = service_app(
        kafka_settings,
        settings,
        name="lifecycle-probe",
        attempts=1,
        seals=MessageSeals(KeyClient(KeySource())),
        open=open_probe,
        subscribe=subscribe,
    )
    await app.start()
    assert log == ["client started", "opened"]
    async with RawPublisher(stack.bootstrap) as publisher:
        partition, offset = await publisher.send(
            topic(kafka_settings, Topic.HISTORY_TURNS), b'{"n": "1"}', key=b"session-1"
        )

    async def in_flight() -> bool:
        return "handling 1" in log

    await eventually(in_flight, within=30, what="the message reached its handler")
    stopping = asyncio.create_task(app.stop())
    [consumer] = consumers

    async def draining() -> bool:
        return bool(consumer._closing)

    await eventually(draining, within=10, what="the stop began draining")
    assert "client stopped" not in log  # what the handler uses stays open while it runs
    release.set()
    await stopping

    assert log == [
        "client started",
        "opened",
        "handling 1",
        "handled 1 by the probe",
        "client stopped",
        "seals closed",
    ]
    with pytest.raises(RuntimeError, match="not started"):
        running_seen[0].get()
    where = TopicPartition(topic(kafka_settings, Topic.HISTORY_TURNS), partition)
    assert await committed(kafka_settings, group_id(kafka_settings, GROUP), where) == offset + 1


@pytest.mark.parametrize("name", list(DEFINITIONS))
async def test_every_consuming_service_starts_and_stops_through_its_definition(
    name: str, kafka_settings: KafkaSettings, mongo_settings: MongoSettings
) -> None:
    service = catalog.named(name)
    app = DEFINITIONS[name].app(Connections(kafka_settings, mongo_settings))
    await app.start()
    try:
        assert app.broker is not None
        subscribers = [
            subscriber for subscriber in app.broker.subscribers if isinstance(subscriber, LogicSubscriber)
        ]
        assert len(subscribers) == len(app.broker.subscribers)
        subscribed = {
            (subscriber.group_id, subscribed_topic)
            for subscriber in subscribers
            if subscriber.group_id is not None
            for subscribed_topic in subscriber.topic_names
        }
        assert subscribed == {
            (group_id(kafka_settings, group), topic(kafka_settings, consumed))
            for group, consumed in service.consumes
        }
    finally:
        await app.stop()
