"""Publishing agents on `agents.registry` (`quipu agents apply|delete`, an App at start-up), and
reading what it holds (`quipu agents list`, and every service that serves agents: `agent_reader`).

    await publish_agents(kafka_settings, [forecaster, helper])      # quipu.Agent or AgentDefinition
    await remove_agents(kafka_settings, ["forecaster"])
    registry = await registered_agents(kafka_settings)              # registry.registered(): the ids

Every planner copy follows the registry, so an agent published here is served from then on, with
no restart. The same definition always gives the same `event_id` (`domain.agents.defined`), so
copies of an App that publish it at start-up publish one id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from quipu.contracts.agents import AgentChanged, AgentDefinition
from quipu.contracts.topics import Topic
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.agents import AgentRegistry, InvalidAgentEntryError, defined, removed
from quipu.services.kit.logging import get_logger
from quipu.services.kit.producers import new_producer
from quipu.services.kit.publishing import producer_publisher
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.topic_replay import read_to_end

logger = get_logger(__name__)


def agent_reader(agents: AgentRegistry) -> Callable[[bytes], None]:
    """What takes each record of agents.registry into `agents`: a record that is no entry, or that
    cannot be served, is skipped with a warning quoting nothing of it (every copy of a service reads
    it, so none dead-letters it)."""

    def take(body: bytes) -> None:
        try:
            entry = agents.take(body)
        except InvalidAgentEntryError as error:
            logger.warning("agent registry entry skipped", reason=str(error))
            return
        logger.info("agent registered" if entry.agent else "agent removed", agent_id=entry.agent_id)

    return take


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


async def registered_agents(
    settings: KafkaSettings, *, within_s: float = 30.0, client_id: str = "quipu-agents"
) -> tuple[AgentRegistry, int]:
    """What `agents.registry` holds now, read to its end as a planner reads it (no built-in agents),
    and how many records were skipped (not entries, or not servable). TopicMissingError when the
    deployment has no such topic; TimeoutError past `within_s`."""
    agents = AgentRegistry()
    skipped = 0

    def take(body: bytes) -> None:
        nonlocal skipped
        try:
            agents.take(body)
        except InvalidAgentEntryError:
            skipped += 1

    await read_to_end(settings, Topic.AGENTS_REGISTRY, take, within_s=within_s, client_id=client_id)
    return agents, skipped


async def _publish(
    settings: KafkaSettings, entries: list[AgentChanged], client_id: str
) -> list[AgentChanged]:
    if not entries:
        return entries
    producer = new_producer(settings, client_id)
    await producer.start()
    try:
        publisher = producer_publisher(producer, settings)
        for entry in entries:
            await publisher.publish(entry)
    finally:
        await producer.stop()
    return entries
