"""Fetch waits: consumers no caller waits on fetch with the background wait, those on a run's path
with the short one, and a consumer with nothing to read fetches with the idle wait until a record comes.

On Tansu a fetch never wakes on new data, so every consumer fetches 1000 / fetch_max_wait_ms times a
second even when idle; the registries, cancels and the memory services are fetched with
`background_fetch_max_wait_ms` instead, and an idle one with `idle_fetch_max_wait_ms`
(kit.fetch_pace). Checked on the running consumers, real broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from faststream import FastStream

from quipu.contracts.runs import CancelRun
from quipu.contracts.topics import Topic
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.kit import fetch_pace
from quipu.services.kit.fetch_pace import FetchPace
from quipu.services.kit.publishing import TopicPublisher, producer_publisher
from quipu.services.kit.settings import KafkaSettings
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.transcript_recorder.app import create_app as create_recorder
from tests.support.group_less import group_less
from tests.timing import eventually, scaled

T = TypeVar("T")


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """`predicate` as a check for `eventually`."""

    async def check() -> bool:
        return predicate()

    return check


@dataclass
class _Paced:
    """Consumers outside any group, each assigned partition 0 of its topic, with their paces (not
    started), and a producer."""

    partitions: list[TopicPartition]
    consumers: list[AIOKafkaConsumer]
    paces: list[FetchPace]
    producer: AIOKafkaProducer


@contextlib.asynccontextmanager
async def _paced(
    settings: KafkaSettings,
    *topics: Topic,
    on_call: Collection[Topic] = (),
    background: Collection[Topic] = (),
) -> AsyncIterator[_Paced]:
    partitions = [TopicPartition(settings.topic_prefix + topic.value, 0) for topic in topics]
    chosen = [settings.in_background() if topic in background else settings for topic in topics]
    consumers = [group_less(each) for each in chosen]
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, enable_idempotence=False)
    await asyncio.gather(producer.start(), *(consumer.start() for consumer in consumers))
    paces = [
        FetchPace(consumer, each, on_call=topic in on_call)
        for consumer, each, topic in zip(consumers, chosen, topics, strict=True)
    ]
    try:
        for consumer, partition in zip(consumers, partitions, strict=True):
            consumer.assign([partition])
        yield _Paced(partitions, consumers, paces, producer)
    finally:
        await asyncio.gather(*(pace.stop() for pace in paces))
        await asyncio.gather(producer.stop(), *(consumer.stop() for consumer in consumers))


async def _of_a_planners_consumers(settings: KafkaSettings, read: Callable[[AIOKafkaConsumer], T]) -> list[T]:
    """`read` of each consumer of a planner's subscribers, while it runs."""
    planner = create_planner(settings, deps=PlannerDeps(model=ScriptedModel()))
    async with asyncio.timeout(scaled(60)):
        await planner.start()
        try:
            assert planner.broker is not None
            consumers = [getattr(subscriber, "consumer", None) for subscriber in planner.broker.subscribers]
            return [read(consumer) for consumer in consumers if consumer is not None]
        finally:
            await planner.stop()


def _waits(app: FastStream, kafka: KafkaSettings) -> dict[str, int]:
    """The fetch wait of each running subscriber, by the (unprefixed) topic it reads."""
    assert app.broker is not None
    waits: dict[str, int] = {}
    for subscriber in app.broker.subscribers:
        consumer = getattr(subscriber, "consumer", None)
        assert consumer is not None
        for name in consumer.subscription():
            waits[name.removeprefix(kafka.topic_prefix)] = consumer._fetcher._fetch_max_wait_ms
    return waits


async def _read(consumer: AIOKafkaConsumer, received: list[bytes] | None = None) -> None:
    """Read as a service's subscriber does, until cancelled, keeping the values in `received`."""
    while True:
        batches = await consumer.getmany(timeout_ms=1000)
        if received is not None:
            received.extend(record.value or b"" for records in batches.values() for record in records)


@contextlib.asynccontextmanager
async def _reading(paced: _Paced) -> AsyncIterator[list[bytes]]:
    """Its paces started and its consumers read (`_read`): the values they read, in order."""
    received: list[bytes] = []
    readers = [asyncio.create_task(_read(consumer, received)) for consumer in paced.consumers]
    try:
        for pace in paced.paces:
            pace.start()
        yield received
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


@dataclass
class _Pair:
    """A consumer of `runs.control` (`holder`, the partition the process publishes to) and one of
    `tools.results` (`other`), paced and read as services read them."""

    paced: _Paced
    holder: FetchPace
    other: FetchPace
    publisher: TopicPublisher
    """Publishes as the process's services do (its records are the process's own)."""
    received: list[bytes]


@contextlib.asynccontextmanager
async def _holder_and_other(settings: KafkaSettings) -> AsyncIterator[_Pair]:
    async with (
        _paced(settings, Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS) as paced,
        _reading(paced) as received,
    ):
        holder, other = paced.paces
        yield _Pair(paced, holder, other, producer_publisher(paced.producer, settings), received)


async def test_only_the_consumers_on_a_runs_path_fetch_with_the_short_wait(
    kafka_settings: KafkaSettings,
) -> None:
    fast, background = kafka_settings.fetch_max_wait_ms, kafka_settings.background_fetch_max_wait_ms
    assert background > fast  # the embedded values, else this test shows nothing
    kafka_settings = kafka_settings.model_copy(update={"idle_after_s": 3600.0})  # none idles here
    planner = create_planner(kafka_settings, deps=PlannerDeps(model=ScriptedModel()))
    recorder = create_recorder(kafka_settings)
    async with asyncio.timeout(scaled(60)):
        await asyncio.gather(planner.start(), recorder.start())
        try:
            planner_waits, recorder_waits = _waits(planner, kafka_settings), _waits(recorder, kafka_settings)
        finally:
            await asyncio.gather(planner.stop(), recorder.stop())

    on_the_path = {Topic.RUNS_REQUESTED: fast, Topic.TOOLS_RESULTS: fast}
    assert {name: planner_waits.pop(name) for name in on_the_path} == on_the_path
    assert planner_waits.keys() >= {Topic.RUNS_CONTROL, Topic.TOOLS_REGISTRY}
    assert set(planner_waits.values()) == {background}  # the rest: cancels, registries
    assert recorder_waits == {Topic.HISTORY_TURNS: background}


async def test_an_idle_consumer_fetches_with_the_idle_wait_until_a_record_comes(
    kafka_settings: KafkaSettings,
) -> None:
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})
    assert settings.idle_fetch_max_wait_ms > settings.fetch_max_wait_ms
    name = settings.topic_prefix + Topic.RUNS_CONTROL.value
    consumer = group_less(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, enable_idempotence=False)
    await asyncio.gather(consumer.start(), producer.start())
    pace = FetchPace(consumer, settings)
    try:
        consumer.assign([TopicPartition(name, 0)])
        received: list[bytes] = []

        async def read() -> None:
            while True:
                batches = await consumer.getmany(timeout_ms=1000)
                received.extend(record.value or b"" for records in batches.values() for record in records)

        reader = asyncio.create_task(read())
        pace.start()
        await eventually(
            holds(lambda: pace.wait_ms == settings.idle_fetch_max_wait_ms), within=10, what="the idle wait"
        )
        await producer.send_and_wait(name, b"news", partition=0)
        await eventually(holds(lambda: received == [b"news"]), within=10, what="the record read")
        await eventually(
            holds(lambda: pace.wait_ms == settings.fetch_max_wait_ms), within=10, what="the short wait again"
        )
        pace.wake()
        assert pace.wait_ms == settings.fetch_max_wait_ms
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    finally:
        await pace.stop()
        await asyncio.gather(consumer.stop(), producer.stop())


async def test_a_services_consumers_fetch_with_the_idle_wait_once_quiet(
    kafka_settings: KafkaSettings,
) -> None:
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})
    planner = create_planner(settings, deps=PlannerDeps(model=ScriptedModel()))

    def requests_idle() -> bool:
        return _waits(planner, settings)[Topic.RUNS_REQUESTED] == settings.idle_fetch_max_wait_ms

    async with asyncio.timeout(scaled(60)):
        await planner.start()
        try:
            await eventually(holds(requests_idle), within=10, what="the planner's requests consumer idle")
            # The background ones keep their own wait: it is longer than the idle one.
            assert _waits(planner, settings)[Topic.RUNS_CONTROL] == settings.background_fetch_max_wait_ms
        finally:
            await planner.stop()


@pytest.mark.parametrize(
    "on_the_path", [(), (Topic.RUNS_REQUESTED,)], ids=["background only", "one on the path"]
)
async def test_a_process_whose_consumers_no_caller_waits_on_looks_out_with_the_background_idle_wait(
    kafka_settings: KafkaSettings, on_the_path: tuple[Topic, ...]
) -> None:
    # An idle transcript recorder, fact extractor or enricher fetched 4 times a second, as the
    # services a run waits on do; its work may start a second late after a quiet spell. A process
    # that also runs a consumer on a run's path looks out with that one's idle wait.
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})
    background = (Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS)
    slow = settings.in_background().idle_fetch_max_wait_ms
    assert slow > settings.idle_fetch_max_wait_ms  # the embedded values, else this test shows nothing
    async with _paced(settings, *background, *on_the_path, background=background) as paced, _reading(paced):
        await eventually(holds(lambda: all(pace.parked for pace in paced.paces)), within=10, what="parked")
        assert fetch_pace._lookout().wait_ms == (settings.idle_fetch_max_wait_ms if on_the_path else slow)


async def test_a_planner_follows_both_registries_with_one_consumer(kafka_settings: KafkaSettings) -> None:
    # An idle consumer costs the broker its fetches whatever it reads: one for both registries.
    subscriptions = await _of_a_planners_consumers(
        kafka_settings,
        lambda consumer: {name.removeprefix(kafka_settings.topic_prefix) for name in consumer.subscription()},
    )

    registries = {Topic.AGENTS_REGISTRY, Topic.TOOLS_REGISTRY}
    assert [names for names in subscriptions if names & registries] == [registries]


async def test_a_record_for_one_consumer_wakes_every_idle_consumer_of_the_process(
    kafka_settings: KafkaSettings,
) -> None:
    # A conversation under way: the planner's tool results follow its run request, so the first
    # record after a quiet spell brings every consumer of the process back to the short wait.
    settings = kafka_settings.model_copy(update={"idle_after_s": 1.0})

    async with _paced(settings, Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS) as paced:
        readers = [asyncio.create_task(_read(consumer)) for consumer in paced.consumers]
        try:
            for pace in paced.paces:
                pace.start()
            idle = settings.idle_fetch_max_wait_ms
            await eventually(
                holds(lambda: all(pace.wait_ms == idle for pace in paced.paces)), within=10, what="idle"
            )
            await paced.producer.send_and_wait(paced.partitions[0].topic, b"cancel", partition=0)
            await eventually(
                holds(lambda: all(pace.wait_ms == settings.fetch_max_wait_ms for pace in paced.paces)),
                within=10,
                what="both consumers on the short wait",
            )
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def test_an_idle_service_parks_its_consumers_until_a_record_comes(
    kafka_settings: KafkaSettings,
) -> None:
    # An idle planner's four consumers fetched 16 times a second between them: once all are idle
    # their partitions are paused (no fetch of their own) while one look-out fetches for them all.
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})
    planner = create_planner(settings, deps=PlannerDeps(model=ScriptedModel()))
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, enable_idempotence=False)

    def consumers() -> list[AIOKafkaConsumer]:
        assert planner.broker is not None
        found = [getattr(subscriber, "consumer", None) for subscriber in planner.broker.subscribers]
        return [consumer for consumer in found if consumer is not None]

    def parked() -> bool:
        held = [(consumer.assignment(), consumer.paused()) for consumer in consumers()]
        return all(assigned and paused == assigned for assigned, paused in held)

    def results() -> AIOKafkaConsumer:
        prefixed = settings.topic_prefix + Topic.TOOLS_RESULTS.value
        return next(consumer for consumer in consumers() if prefixed in consumer.subscription())

    async with asyncio.timeout(scaled(60)):
        await asyncio.gather(planner.start(), producer.start())
        try:
            await eventually(holds(parked), within=10, what="every consumer of the planner parked")
            # Not a cancel: nothing else runs here, and what does not validate goes to the DLQ.
            await producer.send_and_wait(settings.topic_prefix + Topic.RUNS_CONTROL.value, b"{", partition=3)
            await eventually(
                holds(
                    lambda: (
                        not any(consumer.paused() for consumer in consumers() if consumer is not results())
                    )
                ),
                within=10,
                what="every consumer but the one on call fetching again",
            )
            assert _waits(planner, settings)[Topic.RUNS_REQUESTED] == settings.fetch_max_wait_ms
            # Tool results come when the planner sent calls, and it says so: nothing else wakes them.
            assert results().paused() == results().assignment()
            fetch_pace.expect(results())
            assert not results().paused()
        finally:
            await asyncio.gather(planner.stop(), producer.stop())


async def test_a_consumer_holding_records_it_has_not_handed_out_is_not_parked(
    kafka_settings: KafkaSettings,
) -> None:
    # Paused, its records would wait for the next record of the process, which may never come.
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})
    async with _paced(settings, Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS) as paced:
        holding, partition = paced.consumers[0], paced.partitions[0]
        for body in (b"one", b"two", b"three"):
            await paced.producer.send_and_wait(partition.topic, body, partition=0)
        for pace in paced.paces:
            pace.start()
        # The first has fetched records (its high watermark is known) but nobody read them.
        await eventually(
            holds(lambda: paced.paces[0].wait_ms == paced.paces[0].idle_ms), within=10, what="idle"
        )
        assert (holding.highwater(partition) or 0) >= 1
        # Decided in the tick that set the idle wait; the other, read to the end, parks on its own.
        assert not paced.paces[0].parked
        read: list[bytes | None] = []

        async def read_all() -> bool:
            batches = await holding.getmany(partition, timeout_ms=100)
            read.extend(record.value for record in batches.get(partition, []))
            return len(read) == 3

        await eventually(read_all, within=10, what="the three records read")
        assert read == [b"one", b"two", b"three"]
        await eventually(holds(lambda: all(pace.parked for pace in paced.paces)), within=10, what="parked")


async def test_a_consumer_on_call_parks_alone_and_no_other_consumers_record_wakes_it(
    kafka_settings: KafkaSettings,
) -> None:
    # The planner's results consumer fetched every 10 ms as long as any run of the process was under
    # way: every record of the process woke it. On call, it parks as soon as it has read what came,
    # while the others keep fetching, and only its service's `expect()` (or its own record) wakes it.
    settings = kafka_settings.model_copy(update={"idle_after_s": 3600.0})  # only the one on call parks

    async with _paced(
        settings, Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS, on_call={Topic.TOOLS_RESULTS}
    ) as paced:
        busy, on_call = paced.paces
        readers = [asyncio.create_task(_read(consumer)) for consumer in paced.consumers]
        try:
            for pace in paced.paces:
                pace.start()
            await eventually(holds(lambda: on_call.parked), within=10, what="the one on call parked")
            assert not busy.parked and busy.wait_ms == settings.fetch_max_wait_ms

            sent = time.monotonic()
            await paced.producer.send_and_wait(paced.partitions[0].topic, b"cancel", partition=0)
            await eventually(holds(lambda: busy.last_news > sent), within=10, what="the record seen")
            assert on_call.parked

            fetch_pace.expect(on_call.consumer)
            assert not on_call.parked and on_call.wait_ms == settings.fetch_max_wait_ms
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def test_a_record_for_a_parked_consumer_on_call_wakes_it_alone(kafka_settings: KafkaSettings) -> None:
    settings = kafka_settings.model_copy(update={"idle_after_s": 1.0})
    received: list[bytes] = []

    async with _paced(
        settings, Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS, on_call={Topic.TOOLS_RESULTS}
    ) as paced:
        other, on_call = paced.paces
        readers = [asyncio.create_task(_read(consumer, received)) for consumer in paced.consumers]
        try:
            for pace in paced.paces:
                pace.start()
            await eventually(holds(lambda: other.parked and on_call.parked), within=10, what="both parked")
            # Nobody expected it (a result for a call sent before a rebalance): the look-out finds it.
            await paced.producer.send_and_wait(paced.partitions[1].topic, b"result", partition=0)
            await eventually(holds(lambda: received == [b"result"]), within=10, what="the result read")
            assert other.parked
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def test_a_consumer_on_call_that_parks_again_before_its_fetch_came_back_still_gets_the_record(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clean-clone run once left every hostile tool result unread for 90 s: the look-out found
    # them and woke the planner's results consumer, which parked again one look (10 ms) later,
    # before its own fetch had come back (a busy box): read to the end of the watermarks it knew,
    # at the same marks, while the look-out had read past them and fetched on from there.
    settings = kafka_settings.model_copy(update={"idle_after_s": 1.0})
    async with (
        _paced(settings, Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS, on_call={Topic.TOOLS_RESULTS}) as paced,
        _reading(paced) as received,
    ):
        on_call = paced.paces[1]
        await eventually(holds(lambda: all(pace.parked for pace in paced.paces)), within=10, what="parked")
        lookout = fetch_pace._LOOKOUTS[asyncio.get_running_loop()]
        woken = on_call.wake
        parked_at_once: list[bool] = []

        def wake_and_look_at_once() -> None:  # its next look, come before its fetch did
            woken()
            monkeypatch.setattr(on_call, "wake", woken)
            lookout.park(on_call)
            parked_at_once.append(on_call.parked)

        monkeypatch.setattr(on_call, "wake", wake_and_look_at_once)
        await paced.producer.send_and_wait(paced.partitions[1].topic, b"result", partition=0)
        await eventually(holds(lambda: received == [b"result"]), within=10, what="the result read")
        assert parked_at_once == [False]  # the record found is due: it parks once it read it


async def test_the_lookout_fetches_a_partition_from_its_mark_again_once_it_read_past_it(
    kafka_settings: KafkaSettings,
) -> None:
    # It seeks a partition only when its mark changes: a partition it read past and was asked for
    # again at the same mark (its parked consumer woke and parked again) was fetched on from where
    # the look-out stood, and the records between were never seen.
    partition = TopicPartition(kafka_settings.topic_prefix + Topic.RUNS_CONTROL.value, 5)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap, enable_idempotence=False)
    consumer = group_less(kafka_settings)
    await asyncio.gather(producer.start(), consumer.start())
    follow = fetch_pace._Following(consumer)

    async def offsets_from(mark: int) -> list[int]:
        follow.to({partition: mark})
        offsets: list[int] = []
        async with asyncio.timeout(scaled(10)):
            while not offsets:
                offsets = follow.read(await consumer.getmany(timeout_ms=100)).get(partition, [])
        return offsets

    try:
        sent = [await producer.send_and_wait(partition.topic, b"x", partition=5) for _ in range(2)]
        mark = sent[0].offset
        assert await offsets_from(mark) == [mark, mark + 1]
        assert await offsets_from(mark) == [mark, mark + 1]
    finally:
        await asyncio.gather(producer.stop(), consumer.stop())


async def test_a_parked_consumers_fetch_routine_does_not_look_at_its_paused_partitions_five_times_a_second(
    kafka_settings: KafkaSettings,
) -> None:
    # aiokafka's fetch routine wakes every consumer_timeout_ms (200) to look at a consumer's
    # partitions, all paused or not: idle, that was 5 wake-ups a second for every parked consumer
    # of the fleet. Parked, it waits longer (a resume or a rebalance wakes it at once).
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})

    def looks_every_s(pace: FetchPace) -> float:
        timeout: float = pace.consumer._fetcher._fetcher_timeout
        return timeout

    async with _paced(settings, Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS) as paced:
        readers = [asyncio.create_task(_read(consumer)) for consumer in paced.consumers]
        try:
            fetching = [looks_every_s(pace) for pace in paced.paces]
            for pace in paced.paces:
                pace.start()
            await eventually(
                holds(lambda: all(pace.parked for pace in paced.paces)), within=10, what="parked"
            )
            parked = [looks_every_s(pace) for pace in paced.paces]
            assert (
                parked == [fetch_pace.PARKED_LOOK_S] * len(parked)
                and max(fetching) < fetch_pace.PARKED_LOOK_S
            )
            paced.paces[0].wake()
            assert looks_every_s(paced.paces[0]) == fetching[0]
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def test_an_idle_consumer_alone_looks_at_its_partitions_twice_a_fetch(
    kafka_settings: KafkaSettings,
) -> None:
    # A consumer alone in its process does not park; on the idle wait it looked 20 times a second
    # (each an event-loop wake-up) while its fetch in flight held the next one back anyway.
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})
    async with _paced(settings, Topic.RUNS_CONTROL) as paced, _reading(paced):
        pace = paced.paces[0]
        await eventually(holds(lambda: pace.wait_ms == pace.idle_ms), within=10, what="the idle wait")
        assert pace._look_s == pace.idle_ms / 2000 > fetch_pace.TICK_S
        pace.wake()
        assert pace._look_s == fetch_pace.TICK_S


async def test_a_services_consumers_fetch_routines_sleep_as_long_as_the_settings_say(
    kafka_settings: KafkaSettings,
) -> None:
    # aiokafka's routine looked at every consumer's partitions 5 times a second (its default
    # consumer_timeout_ms, 200): an idle recorder woke 89 times a second, 15 of them for that.
    assert kafka_settings.consumer_timeout_ms > 200
    routines = await _of_a_planners_consumers(
        kafka_settings, lambda consumer: consumer._fetcher._fetcher_timeout
    )
    assert routines and set(routines) == {kafka_settings.consumer_timeout_ms / 1000}


async def test_a_record_the_process_publishes_wakes_only_the_consumer_holding_its_partition(
    kafka_settings: KafkaSettings,
) -> None:
    # A fetch costs about the same whatever its partition count, so the lever is how many are sent:
    # a record one of the process's services sends wakes the one consumer it is for, which parks
    # again once it has handed it out, while the others stay parked behind the look-out.
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})

    async with _holder_and_other(settings) as pair:
        holder, other, publisher, received = pair.holder, pair.other, pair.publisher, pair.received
        cancels = 0

        async def both_parked_while_the_process_is_busy() -> bool:
            # The process's own records keep it busy.
            nonlocal cancels
            if other.parked and holder.parked:
                return True
            cancels += 1
            await publisher.publish(CancelRun(run_id=f"r-{cancels}", session_id="s-1"), partition=0)
            return False

        await eventually(both_parked_while_the_process_is_busy, within=10, what="both parked, busy")
        # While the process is busy the look-out fetches the parked partitions with the short
        # wait, as their consumers would have: a record from elsewhere is not seen later.
        lookout = fetch_pace._LOOKOUTS[asyncio.get_running_loop()]
        assert lookout.busy and lookout.wait_ms == settings.fetch_max_wait_ms
        other_news = other.last_news
        await publisher.publish(CancelRun(run_id="r-last", session_id="s-1"), partition=0)
        assert not holder.parked and holder.wait_ms == settings.fetch_max_wait_ms
        assert other.parked
        await eventually(holds(lambda: b"r-last" in b"".join(received)), within=10, what="the record read")
        await eventually(holds(lambda: holder.parked), within=10, what="the holder parked again")
        assert other.parked and other.last_news == other_news

        # A record from elsewhere wakes every consumer of the process, as before.
        await pair.paced.producer.send_and_wait(pair.paced.partitions[1].topic, b"result", partition=0)
        await eventually(holds(lambda: not holder.parked and not other.parked), within=10, what="both woken")


async def test_a_record_the_process_published_is_its_own_when_a_consumer_looks_late(
    kafka_settings: KafkaSettings,
) -> None:
    # A consumer compares its marks every 50 ms, later on a busy machine; with 50 ms remembered,
    # the owner's consumer took one of its process's own records for another's and woke every
    # consumer of the process for idle_after_s (a clean-clone run failed on that: the other
    # consumer of the test below woke). An offset published here is this process's whatever its age.
    async with _holder_and_other(kafka_settings) as pair:
        lookout = fetch_pace._LOOKOUTS[asyncio.get_running_loop()]
        partition = pair.paced.partitions[0]
        await pair.publisher.publish(CancelRun(run_id="r-late", session_id="s-1"), partition=0)
        [(offset, at)] = list(lookout._own[partition].items())[-1:]
        lookout._own[partition][offset] = at - 1.0  # as a look a second late finds it
        assert lookout.own(partition, range(offset, offset + 1))


async def test_after_a_quiet_spell_a_record_the_process_publishes_wakes_only_its_holder(
    kafka_settings: KafkaSettings,
) -> None:
    # A person's next turn after a pause: its first hop is the process's own record. Waking every
    # consumer for it cost each ~100 fetches a second for `idle_after_s`; the holder alone fetches
    # it, and the look-out fetches the others' partitions with the short wait from then on.
    settings = kafka_settings.model_copy(update={"idle_after_s": 0.3})

    async with _holder_and_other(settings) as pair:
        holder, other, publisher, received = pair.holder, pair.other, pair.publisher, pair.received
        lookout = fetch_pace._LOOKOUTS[asyncio.get_running_loop()]
        await eventually(
            holds(lambda: holder.parked and other.parked and not lookout.busy),
            within=10,
            what="both parked, the process quiet",
        )
        await publisher.publish(CancelRun(run_id="r-after-quiet", session_id="s-1"), partition=0)
        assert not holder.parked and other.parked
        assert lookout.busy and lookout.wait_ms == settings.fetch_max_wait_ms
        await eventually(
            holds(lambda: b"r-after-quiet" in b"".join(received)), within=10, what="the record read"
        )
        assert other.parked
