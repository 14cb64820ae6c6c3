"""The planner offers only what toolsets announced and serves only the agents registered: helpers that
give a planner under test what a deployment's executors would have announced, and the built-in
assistant's agents as `quipu up` publishes them.

    registry = announced(shipped_toolset(), shop)     # an in-memory planner's view of tools.registry

A planner over Kafka learns its tools the way a deployment's does: start the tool executor (it
announces its toolset on `tools.registry`) before the planner.
"""

from __future__ import annotations

from datetime import UTC, datetime

from quipu.assistant import app as assistant_app
from quipu.contracts.tools import DEFAULT_TOOLSET
from quipu.services.domain.agent_publisher import publish_agents
from quipu.services.domain.shipped_tools import default_catalog
from quipu.services.domain.toolset_registry import ToolsetRegistry, announce
from quipu.services.kit.settings import KafkaSettings
from quipu.tools import Toolset

ANNOUNCED_AT = datetime(2026, 1, 1, tzinfo=UTC)


def announced(*toolsets: Toolset) -> ToolsetRegistry:
    """The view of a deployment whose default executor serves the shipped tools and `toolsets`
    beside them (`ToolExecutorDeps.serving(*toolsets)`), as its announcement makes it."""
    return ToolsetRegistry([announce(DEFAULT_TOOLSET, "1", default_catalog(*toolsets), at=ANNOUNCED_AT)])


async def publish_built_in_agents(kafka: KafkaSettings) -> None:
    """Publish the built-in assistant's agents on `agents.registry`, as `quipu up` does: a planner
    serves only the agents registered there."""
    await publish_agents(kafka, assistant_app.agents, client_id="tests")
