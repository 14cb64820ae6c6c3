"""The topic registry is the one place that routes a payload: every entry is executable and total.

Every payload model the registry names round-trips through its topic's JSON; every key function
gives a key for any such payload, the same key before and after the wire; a payload's topic
follows from its type; and nothing in the services sends to Kafka but `kit.publishing`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from quipu.contracts.commands import AppendRunRecords, DispatchedCall, RecordRunTerminal
from quipu.contracts.events import RunEvent
from quipu.contracts.store import Record
from quipu.contracts.topics import TOPICS, Topic, TopicSpec, UnroutablePayloadError, spec_for, spec_of
from quipu.contracts.wire import utc_now_ms
from quipu.services.kit.run_events import RunEventReader
from quipu.services.kit.settings import KafkaSettings
from quipu.services.planner.logic.actions import Output
from quipu.services.storage_owner.logic import Announcement
from tests.contract.samples import models

ROOT = Path(__file__).resolve().parents[2]

ENTRIES = [(spec, model) for spec in TOPICS for model in spec.models]
"""Every (topic, payload model) pair the registry names."""

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9")
"""Settings for readers that are built, never started."""

SAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _id(entry: tuple[TopicSpec[Any], type[BaseModel]]) -> str:
    return f"{entry[0].topic.value}:{entry[1].__name__}"


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
@SAMPLES
@given(data=st.data())
def test_every_payload_the_registry_names_round_trips_and_routes_to_its_topic(
    entry: tuple[TopicSpec[Any], type[BaseModel]], data: st.DataObject
) -> None:
    spec, model = entry
    payload = data.draw(models(model))
    decoded = spec.adapter.validate_json(payload.model_dump_json())
    assert type(decoded) is model and decoded == payload
    assert spec_for(payload) is spec


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
@SAMPLES
@given(data=st.data())
def test_every_key_function_is_total_and_survives_the_wire(
    entry: tuple[TopicSpec[Any], type[BaseModel]], data: st.DataObject
) -> None:
    spec, model = entry
    payload = data.draw(models(model))
    key = spec.key_for(payload)
    # Only a reply leaves its partition to the producer (the route its command names).
    assert isinstance(key, bytes) if spec.topic is not Topic.STORAGE_REPLIES else key is None
    # A consumer that re-keys what it read (a DLQ replay, a retry) computes the same key.
    assert spec.key_for(spec.adapter.validate_json(payload.model_dump_json())) == key
    partition_key = getattr(payload, "partition_key", None)
    if partition_key is not None:
        assert key == partition_key().encode(), "the model's own partition_key() agrees"


def test_a_payload_no_topic_carries_is_refused() -> None:
    class Stray(BaseModel):
        run_id: str = "r"

    with pytest.raises(UnroutablePayloadError):
        spec_for(Stray())


def test_everything_the_planner_and_the_owner_publish_has_a_topic() -> None:
    routed = {model for spec in TOPICS for model in spec.models}
    assert set(get_args(Output)) <= routed
    # A carried tool call goes out as its `call`, on the calls topic of its toolset.
    assert set(get_args(Announcement)) - {DispatchedCall} <= routed
    assert DispatchedCall.model_fields["call"].annotation in routed


@SAMPLES
@given(models(RunEvent))
def test_a_session_stream_reads_the_partition_its_events_are_keyed_to(event: RunEvent) -> None:
    assume(event.session_id or event.run_id)
    reader = RunEventReader(KAFKA, session_id=event.session_id, run_id=event.run_id)
    assert spec_of(Topic.RUNS_EVENTS).key_for(event) == reader.key.encode()


# --- every publish goes through the router -------------------------------------------------------

SENDS = {"send", "send_and_wait", "send_batch", "publish_batch"}
"""Producer methods that put a record on a topic of the caller's choosing."""

ALLOWED = {
    ("services/kit/publishing.py", "send"): "the router itself",
    ("services/kit/producers.py", "send"): "the process's producer, which the router sends through",
    ("services/kit/producers.py", "send_batch"): "the process's producer (FastStream's batch publish)",
    (
        "services/kit/broker.py",
        "dead_letter",
    ): "a dead letter goes to its source's .dlq with the original key",
    ("bench/run_system.py", "raw_hops"): "the bench's raw round trip on a topic of its own",
    (
        "services/tool_executor/mcp_client.py",
        "pump",
    ): "an in-memory anyio stream between an MCP transport and its session, not a topic",
}
"""Where raw sends are right, and why."""


def _raw_sends(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every raw send in a file: a producer send, or a FastStream
    `publish` told its topic."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                method = child.func.attr
                told_topic = len(child.args) > 1 or any(keyword.arg == "topic" for keyword in child.keywords)
                if method in SENDS or (method == "publish" and told_topic):
                    found.append((function, child.lineno))
            visit(child, name)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_every_publish_in_the_services_goes_through_the_registry_router() -> None:
    # The public API under quipu/ too; its links to the top-level folders count once.
    sources = sorted(
        {
            path.resolve()
            for folder in ("quipu", "services", "contracts", "deploy", "bench")
            for path in (ROOT / folder).rglob("*.py")
        }
    )
    raw = [
        f"{path.relative_to(ROOT)}:{line} in {function or 'module'}"
        for path in sources
        for function, line in _raw_sends(path)
        if (str(path.relative_to(ROOT)), function) not in ALLOWED
    ]
    assert not raw, f"publish through quipu.services.kit.publishing, not by hand: {raw}"


def test_the_publish_check_finds_a_raw_send() -> None:
    module = ROOT / "services" / "kit" / "publishing.py"
    assert _raw_sends(module), "the router's own sends are found, so the check can fail"


def test_every_registry_topic_is_one_spec() -> None:
    assert [spec.topic for spec in TOPICS] == list(Topic)
    assert all(spec_of(spec.topic) is spec for spec in TOPICS)


def test_a_step_of_records_is_keyed_by_its_session_else_its_run() -> None:
    # One session's commands apply in the order sent only when they share its key.
    sessioned = Record(
        event_key="k",
        run_id="r-1",
        agent_id="a",
        session_id="s-1",
        type="t",
        payload=b"{}",
        timestamp=utc_now_ms(),
    )
    sessionless = sessioned.model_copy(update={"session_id": ""})
    spec = spec_for(AppendRunRecords(records=[sessioned]))
    assert spec.key_for(AppendRunRecords(records=[sessioned])) == b"s-1"
    assert spec.key_for(AppendRunRecords(records=[sessionless])) == b"r-1"
    assert spec.key_for(RecordRunTerminal(record=sessioned, records=[sessioned])) == b"s-1"
