"""The tool executor as a FastStream application: runs tool calls, answers each exactly once."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

from faststream import FastStream
from faststream.kafka import KafkaBroker

from quipu import __version__
from quipu.contracts.tools import DEFAULT_TOOLSET
from quipu.contracts.topics import toolset_calls_topic
from quipu.contracts.wire import utc_now_ms
from quipu.mcp import McpToolset
from quipu.services.domain.shipped_tools import default_catalog, shipped_toolset
from quipu.services.domain.tool_catalog import ToolCatalog
from quipu.services.domain.toolset_registry import announce
from quipu.services.kit.keys import message_seals
from quipu.services.kit.lifecycle import Opened, Running, ServiceDefinition, service_app
from quipu.services.kit.publishing import broker_publisher
from quipu.services.kit.settings import KafkaSettings
from quipu.services.tool_executor import handlers
from quipu.services.tool_executor.adapters import RememberedResults
from quipu.services.tool_executor.logic import CompletedCalls, ToolRunner
from quipu.services.tool_executor.settings import ToolExecutorSettings
from quipu.tools import ToolImplementation, Toolset

SERVICE = "tool-executor"


class ToolSource(Protocol):
    """Tools an executor learns only when it opens (an MCP server's): what it announces and runs."""

    async def open(self, opened: Opened) -> tuple[ToolCatalog, Mapping[str, ToolImplementation]]:
        """Connect (closing through `opened`) and return the tools' catalog and implementations."""
        ...

    def follow(
        self, serve: Callable[[ToolCatalog, Mapping[str, ToolImplementation]], Awaitable[None]]
    ) -> None:
        """From now on, call `serve` with the tools each time the source's list changes."""
        ...


@dataclass
class ToolExecutorDeps:
    """The toolset this executor serves: its name and version, its tools' definitions and
    implementations, and the record of results."""

    catalog: ToolCatalog = field(default_factory=default_catalog)
    implementations: Mapping[str, ToolImplementation] = field(
        default_factory=lambda: shipped_toolset().implementations()
    )
    completed_calls: CompletedCalls | None = None
    toolset: str = DEFAULT_TOOLSET
    """Announced on `tools.registry`; its calls come on `toolset_calls_topic(toolset)`."""
    version: str = __version__
    source: ToolSource | None = None
    """When set, the catalog and implementations come from it at start-up instead."""

    @classmethod
    def serving(cls, *toolsets: Toolset, completed_calls: CompletedCalls | None = None) -> ToolExecutorDeps:
        """The default toolset: the shipped tools and those of `toolsets` (your own `@tool`
        functions), on `tools.calls`."""
        implementations: dict[str, ToolImplementation] = {}
        for toolset in (shipped_toolset(), *toolsets):
            implementations.update(toolset.implementations())
        return cls(default_catalog(*toolsets), implementations, completed_calls)

    @classmethod
    def dedicated(
        cls, toolset: Toolset | McpToolset, completed_calls: CompletedCalls | None = None
    ) -> ToolExecutorDeps:
        """`toolset` alone, on its own topic `tools.calls.<name>`: it scales apart from the rest.

        An `McpToolset`'s server is connected when the executor starts, and its tools announced.
        """
        if isinstance(toolset, McpToolset):
            from quipu.services.tool_executor.mcp_client import McpTools  # noqa: PLC0415 - the SDK is heavy

            return cls(
                ToolCatalog(),
                {},
                completed_calls,
                toolset=toolset.name,
                version=toolset.version,
                source=McpTools(toolset),
            )
        return cls(
            ToolCatalog(toolset.definitions()),
            toolset.implementations(),
            completed_calls,
            toolset=toolset.name,
            version=toolset.version,
        )


def create_app(
    kafka: KafkaSettings,
    settings: ToolExecutorSettings | None = None,
    deps: ToolExecutorDeps | None = None,
) -> FastStream:
    """The executor application; pass `deps` to run other tools (tests add slow or failing ones)."""
    settings = settings or ToolExecutorSettings()
    if settings.max_timeout_s * 1000 >= kafka.max_poll_interval_ms:
        raise ValueError("max_timeout_s must be shorter than the consumer's max_poll_interval_ms")
    given = deps or ToolExecutorDeps()
    # A call's input and its result are the run's principal's words: sealed under their key.
    seals = message_seals(settings.keys)

    async def open_runner(_: KafkaBroker, opened: Opened) -> ToolRunner:
        catalog, implementations = given.catalog, given.implementations
        if given.source is not None:
            catalog, implementations = await given.source.open(opened)
        return ToolRunner(
            catalog,
            implementations,
            given.completed_calls or RememberedResults(settings.remembered_results),
            max_timeout_s=settings.max_timeout_s,
            canceled_runs_capacity=settings.remembered_cancels,
        )

    calls_topic = toolset_calls_topic(given.toolset)
    # A toolset's copies form a group of their own: one toolset's rebalances never pause another's.
    group = settings.group if given.toolset == DEFAULT_TOOLSET else f"{settings.group}-{given.toolset}"
    running: Running[ToolRunner] = Running(SERVICE.replace("-", " "))
    app = service_app(
        kafka,
        settings,
        name=SERVICE,
        running=running,
        # The pid in the client id tells the copies apart in the broker's view of the group.
        client_id=f"{SERVICE}-{os.getpid()}",
        attempts=settings.retry_attempts,
        seals=seals,
        open=open_runner,
        subscribe=lambda broker, delivery, runner: [
            handlers.register(
                broker, kafka, settings, runner, delivery, seals, calls_topic=calls_topic, group=group
            )
        ],
    )

    async def announce_toolset() -> None:
        # Once subscribed: every copy announces the same content at start-up (idempotent).
        broker = cast(KafkaBroker, app.broker)  # service_app built it: always a KafkaBroker
        publisher, runner = broker_publisher(broker, kafka), running.get()
        await publisher.publish(announce(given.toolset, given.version, runner.catalog, at=utc_now_ms()))

        async def serve(catalog: ToolCatalog, implementations: Mapping[str, ToolImplementation]) -> None:
            # Served before announced: a call the planner routes on the announcement finds its tool.
            runner.serve(catalog, implementations)
            await publisher.publish(announce(given.toolset, given.version, catalog, at=utc_now_ms()))

        if given.source is not None:
            given.source.follow(serve)

    app.after_startup(announce_toolset)
    return app


DEFINITION = ServiceDefinition(
    SERVICE, ToolExecutorSettings, lambda connections, settings: create_app(connections.kafka, settings)
)


def dedicated_definition(toolset: Toolset | McpToolset) -> ServiceDefinition[ToolExecutorSettings]:
    """`toolset`'s own executor (`quipu serve tools --app`): its topic, its group, its announcement;
    any number of copies share its calls."""
    return ServiceDefinition(
        SERVICE,
        ToolExecutorSettings,
        lambda connections, settings: create_app(
            connections.kafka, settings, ToolExecutorDeps.dedicated(toolset)
        ),
    )
