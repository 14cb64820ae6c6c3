"""Publishing agents on `agents.registry`: what `quipu agents apply|delete` and an App at start-up do.

    await publish_agents(kafka_settings, [forecaster, helper])      # quipu.Agent or AgentDefinition
    await remove_agents(kafka_settings, ["forecaster"])

Every planner copy follows the registry, so an agent published here is served from then on, with
no restart. The same definition always gives the same `event_id` (`domain.agents.defined`), so
copies of an App that publish it at start-up publish one id.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaProducer

from quipu.contracts.agents import AgentChanged, AgentDefinition
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.agents import defined, removed
from quipu.services.kit.publishing import producer_publisher
from quipu.services.kit.settings import KafkaSettings


async def publish_agents(
    settings: KafkaSettings, agents: Iterable[AgentDefinition], *, client_id: str = "quipu-agents"
) -> list[AgentChanged]:
    """Define (or redefine) each agent on `agents.registry`; returns the entries, once the broker took
    every one (PublishError when it did not)."""
    at = utc_now_ms()
    return await _publish(settings, [defined(agent, at=at) for agent in agents], client_id)


async def remove_agents(
    settings: KafkaSettings, agent_ids: Iterable[str], *, client_id: str = "quipu-agents"
) -> list[AgentChanged]:
    """Remove each agent from `agents.registry`: runs for it are refused from then on."""
    at = utc_now_ms()
    return await _publish(settings, [removed(agent_id, at=at) for agent_id in agent_ids], client_id)


async def _publish(
    settings: KafkaSettings, entries: list[AgentChanged], client_id: str
) -> list[AgentChanged]:
    if not entries:
        return entries
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        client_id=client_id,
        acks=settings.acks,
        enable_idempotence=settings.enable_idempotence,
    )
    await producer.start()
    try:
        publisher = producer_publisher(producer, settings)
        for entry in entries:
            await publisher.publish(entry)
    finally:
        await producer.stop()
    return entries
