"""Consumers no caller waits on fetch with the background wait; those on a run's path keep the short one.

On Tansu a fetch never wakes on new data, so every consumer fetches 1000 / fetch_max_wait_ms times a
second even when idle; the registries, cancels and the memory services are fetched with
`background_fetch_max_wait_ms` instead. Checked on the running consumers, real broker.
"""

from __future__ import annotations

import asyncio

from faststream import FastStream

from quipu.contracts.topics import Topic
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.kit.settings import KafkaSettings
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.transcript_recorder.app import create_app as create_recorder
from tests.timing import scaled


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


async def test_only_the_consumers_on_a_runs_path_fetch_with_the_short_wait(
    kafka_settings: KafkaSettings,
) -> None:
    fast, background = kafka_settings.fetch_max_wait_ms, kafka_settings.background_fetch_max_wait_ms
    assert background > fast  # the embedded values, else this test shows nothing
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
