"""The planner as a FastStream application."""

from __future__ import annotations

from faststream import FastStream
from faststream.kafka import KafkaBroker

from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.memory.context import ContextSource, MemoryContextSource
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.models.factory import make_model
from quipu.services.domain.toolset_registry import ToolsetRegistry
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer
from quipu.services.kit.delivery import Delivery
from quipu.services.kit.keys import message_seals
from quipu.services.kit.lifecycle import Opened, Running, ServiceDefinition, service_app
from quipu.services.kit.publishing import broker_publisher
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.kit.topic_replay import catch_up, follow_registries
from quipu.services.planner import handlers
from quipu.services.planner.adapters import CallRouter, PublishedTurns, SessionHistoryContext, SessionOwners
from quipu.services.planner.orchestrator import Planner, PlannerDeps, ReadyDeps
from quipu.services.planner.settings import PlannerSettings

SERVICE = "planner"


def check_timeouts(kafka: KafkaSettings, settings: PlannerSettings) -> None:
    """Refuse a model timeout that, with its retries, could outlive the consumer's poll interval.

    One message's worst case is a model call, plus, when the request overflows its budget, two
    compaction calls and four token counts.
    """
    per_attempt_s = (
        settings.model_timeout_s + 2 * settings.compaction_timeout_s + 4 * settings.count_tokens_timeout_s
    )
    worst_s = per_attempt_s * settings.retry_attempts
    if worst_s * 1000 >= kafka.max_poll_interval_ms:
        raise ValueError(
            f"(model_timeout_s + 2 x compaction_timeout_s + 4 x count_tokens_timeout_s) x "
            f"retry_attempts = {worst_s:g} s must stay below the consumer's "
            f"max_poll_interval_ms={kafka.max_poll_interval_ms}"
        )


def memory_context(
    memory: MemoryStore, published: PublishedTurns, settings: PlannerSettings
) -> MemoryContextSource:
    """The memory context source: facts, profile, rolling summary and literal window from `memory`,
    plus the turns this planner published that the recorder has not recorded yet."""
    return MemoryContextSource(
        memory,
        window_messages=settings.history_messages,
        facts_k=settings.facts_k,
        index_timeout_s=settings.memory_index_timeout_s,
        recent_turns=published,
    )


def create_app(
    kafka: KafkaSettings, settings: PlannerSettings | None = None, deps: PlannerDeps | None = None
) -> FastStream:
    """The planner application; `deps` replaces any of store, model, agents, context source.

    The tools it offers are those announced on `tools.registry`, and nothing else.

    The agents it serves are those registered on `agents.registry` (besides `deps.agents`, when
    given: a planner embedded in a test; a registered agent replaces a given one of the same id).

    The context source is `deps.context`, else the memory one over `deps.memory`, else (with
    `use_memory`) the memory one over the owner's memory commands, else the run-log history.
    """
    settings = settings or PlannerSettings()
    check_timeouts(kafka, settings)
    # Runs carry their principal's words: what the planner reads and writes is sealed under their key.
    seals = message_seals(settings.keys)
    given = deps or PlannerDeps()
    registry = given.registry or ToolsetRegistry()
    agents = given.agents if given.agents is not None else AgentRegistry()
    readers = handlers.registry_readers(registry, agents)

    async def open_planner(broker: KafkaBroker, opened: Opened) -> Planner:
        # Before the broker starts the groups that bring runs: a run taken first finds every tool
        # and agent registered before this planner started.
        await catch_up(kafka, readers, within_s=settings.registry_catch_up_s, client_id=f"{SERVICE}-registry")
        store = given.store or await opened.start(KafkaStore.for_service(kafka, settings, seals=seals))
        topics = broker_publisher(broker, kafka, seals)
        publisher = PublishedTurns(
            topics,
            calls=CallRouter(topics, registry),
            turns_per_session=max(1, settings.history_messages // 2),
        )
        owner_memory = store.owner_memory
        context: ContextSource
        if given.context is not None:
            context = given.context
        elif given.memory is not None:
            context = memory_context(given.memory, publisher, settings)
        elif settings.use_memory and owner_memory is not None:
            context = memory_context(owner_memory, publisher, settings)
        else:
            context = SessionHistoryContext(store, settings.history_messages)
        model = given.model or make_model(
            settings.model, max_poll_interval_ms=int(settings.model_timeout_s * 1000)
        )
        # Sessions are claimed where their owner is recorded and their history kept: the storage owner.
        memory = given.memory or owner_memory
        ready = ReadyDeps(
            store=store,
            model=model,
            registry=registry,
            agents=agents,
            context=context,
            owners=SessionOwners.over(store, memory) if memory is not None else None,
        )
        return Planner(ready, publisher, settings)

    def subscribe(
        broker: KafkaBroker, delivery: Delivery, planner: Running[Planner]
    ) -> list[ConcurrentConsumer]:
        follow_registries(broker, kafka, readers)
        return handlers.register(broker, kafka, planner, delivery, settings)

    return service_app(
        kafka,
        settings,
        name=SERVICE,
        attempts=settings.retry_attempts,
        seals=seals,
        open=open_planner,
        subscribe=subscribe,
    )


DEFINITION = ServiceDefinition(
    SERVICE, PlannerSettings, lambda connections, settings: create_app(connections.kafka, settings)
)
