"""The topic registry is the one place that routes a payload: every entry is executable and total.

Every payload model the registry names round-trips through its topic's JSON; every key function
gives a key for any such payload, the same key before and after the wire; and a payload's topic
follows from its type.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from quipu.contracts.events import RunEvent
from quipu.contracts.topics import TOPICS, Topic, TopicSpec, UnroutablePayloadError, spec_for, spec_of
from quipu.services.kit.run_events import RunEventReader
from quipu.services.kit.settings import KafkaSettings
from tests.contract.samples import models

ENTRIES = [(spec, model) for spec in TOPICS for model in spec.models]
"""Every (topic, payload model) pair the registry names."""

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9")
"""Settings for readers that are built, never started."""

SAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _id(entry: tuple[TopicSpec[Any], type[BaseModel]]) -> str:
    return f"{entry[0].topic.value}:{entry[1].__name__}"


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_every_payload_the_registry_names_round_trips_and_routes_to_its_topic(
    entry: tuple[TopicSpec[Any], type[BaseModel]],
) -> None:
    spec, model = entry

    @SAMPLES
    @given(models(model))
    def check(payload: BaseModel) -> None:
        decoded = spec.adapter.validate_json(payload.model_dump_json())
        assert type(decoded) is model and decoded == payload
        assert spec_for(payload) is spec

    check()


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_every_key_function_is_total_and_survives_the_wire(
    entry: tuple[TopicSpec[Any], type[BaseModel]],
) -> None:
    spec, model = entry

    @SAMPLES
    @given(models(model))
    def check(payload: BaseModel) -> None:
        key = spec.key_for(payload)
        assert key is None or isinstance(key, bytes)
        # A consumer that re-keys what it read (a DLQ replay, a retry) computes the same key.
        assert spec.key_for(spec.adapter.validate_json(payload.model_dump_json())) == key
        partition_key = getattr(payload, "partition_key", None)
        if partition_key is not None:
            assert key == partition_key().encode(), "the model's own partition_key() agrees"

    check()


@SAMPLES
@given(st.data())
def test_only_the_reply_topic_leaves_the_partition_to_its_producer(data: st.DataObject) -> None:
    for spec, model in ENTRIES:
        unkeyed = spec.key_for(data.draw(models(model))) is None
        assert unkeyed == (spec.topic is Topic.STORAGE_REPLIES), spec.topic


def test_a_payload_no_topic_carries_is_refused() -> None:
    class Stray(BaseModel):
        run_id: str = "r"

    with pytest.raises(UnroutablePayloadError):
        spec_for(Stray())


@SAMPLES
@given(models(RunEvent))
def test_a_session_stream_reads_the_partition_its_events_are_keyed_to(event: RunEvent) -> None:
    assume(event.session_id or event.run_id)
    reader = RunEventReader(KAFKA, session_id=event.session_id, run_id=event.run_id)
    assert spec_of(Topic.RUNS_EVENTS).key_for(event) == reader.key.encode()


def test_every_registry_topic_is_one_spec() -> None:
    assert [spec.topic for spec in TOPICS] == list(Topic)
    assert all(spec_of(spec.topic) is spec for spec in TOPICS)
