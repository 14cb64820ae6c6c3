"""The fact extractor as a FastStream application: curated memory proposed by a model, decided by code."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from faststream import FastStream
from faststream.kafka import KafkaBroker

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.topics import Topic
from quipu.services.domain.agent_publisher import agent_reader
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.models.port import ModelClient
from quipu.services.fact_extractor import handlers
from quipu.services.fact_extractor.adapters import FactExtractor, open_memory_store, open_model
from quipu.services.fact_extractor.settings import FactExtractorSettings
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer
from quipu.services.kit.delivery import Delivery
from quipu.services.kit.lifecycle import Opened, Running, ServiceDefinition, service_app
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.topic_replay import catch_up, follow_registries

SERVICE = "fact-extractor"

MODEL_CALLS_PER_TURN = 2
"""The extraction call, and the profile call on every N-th turn."""


@dataclass
class FactExtractorDeps:
    """What the extractor talks to; anything left None is built from the environment at startup."""

    memory: MemoryStore | None = None
    model: ModelClient | None = None
    agents: Mapping[str, AgentDefinition] | None = None
    """Agents known besides agents.registry (default: none; a test's), which is applied to them."""


def check_timeouts(kafka: KafkaSettings, settings: FactExtractorSettings) -> None:
    """Refuse model timeouts that, with retries, could outlive the consumer's poll interval."""
    worst_s = settings.model_timeout_s * settings.retry_attempts * MODEL_CALLS_PER_TURN
    if worst_s * 1000 >= kafka.max_poll_interval_ms:
        raise ValueError(
            f"model_timeout_s x retry_attempts x {MODEL_CALLS_PER_TURN} = {worst_s:g} s must stay below "
            f"the consumer's max_poll_interval_ms={kafka.max_poll_interval_ms}"
        )


def create_app(
    kafka: KafkaSettings,
    settings: FactExtractorSettings | None = None,
    deps: FactExtractorDeps | None = None,
) -> FastStream:
    """The extractor application; `deps` replaces the memory store, the model or the agent registry."""
    settings = settings or FactExtractorSettings()
    kafka = kafka.in_background()  # nobody waits on an extraction: its consumers fetch less often
    check_timeouts(kafka, settings)
    given = deps or FactExtractorDeps()
    # An agent registered on agents.registry with memory_opt_out feeds no memory either.
    agents = _registry_of(given.agents) if given.agents is not None else AgentRegistry()
    readers = [(Topic.AGENTS_REGISTRY.value, agent_reader(agents))]

    async def open_extractor(_: KafkaBroker, opened: Opened) -> FactExtractor:
        await catch_up(kafka, readers, within_s=settings.registry_catch_up_s, client_id=f"{SERVICE}-registry")
        memory = given.memory or await opened.start(open_memory_store(kafka, settings))
        return FactExtractor(memory, given.model or open_model(kafka, settings), settings, agents=agents)

    def subscribe(
        broker: KafkaBroker, delivery: Delivery, extractor: Running[FactExtractor]
    ) -> list[ConcurrentConsumer]:
        follow_registries(broker, kafka, readers)
        return [handlers.register(broker, kafka, extractor, delivery, settings)]

    return service_app(
        kafka,
        settings,
        name=SERVICE,
        # The pid in the client id tells the copies apart in the broker's view of the group.
        client_id=f"{SERVICE}-{os.getpid()}",
        attempts=settings.retry_attempts,
        open=open_extractor,
        subscribe=subscribe,
    )


def _registry_of(agents: Mapping[str, AgentDefinition]) -> AgentRegistry:
    return agents if isinstance(agents, AgentRegistry) else AgentRegistry(agents.values())


DEFINITION = ServiceDefinition(
    SERVICE, FactExtractorSettings, lambda connections, settings: create_app(connections.kafka, settings)
)
