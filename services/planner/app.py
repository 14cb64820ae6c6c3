"""The planner as a FastStream application."""

from __future__ import annotations

from faststream import FastStream

from services.kit.agents import default_agents
from services.kit.broker import make_broker
from services.kit.delivery import Delivery, RetryPolicy
from services.kit.models.factory import ModelSettings, make_model
from services.kit.settings import KafkaSettings
from services.kit.store.client import KafkaStore
from services.kit.tool_catalog import default_catalog
from services.planner import handlers
from services.planner.adapters import KafkaPublisher, Planner, PlannerDeps, ReadyDeps, SessionHistoryContext
from services.planner.settings import PlannerSettings

SERVICE = "planner"


def check_timeouts(kafka: KafkaSettings, settings: PlannerSettings) -> None:
    """Refuse a model timeout that, with its retries, could outlive the consumer's poll interval."""
    worst_s = settings.model_timeout_s * settings.retry_attempts
    if worst_s * 1000 >= kafka.max_poll_interval_ms:
        raise ValueError(
            f"model_timeout_s x retry_attempts = {worst_s:g} s must stay below the consumer's "
            f"max_poll_interval_ms={kafka.max_poll_interval_ms}"
        )


def create_app(
    kafka: KafkaSettings, settings: PlannerSettings | None = None, deps: PlannerDeps | None = None
) -> FastStream:
    """The planner application; `deps` replaces any of store, model, catalog, agents, context source."""
    settings = settings or PlannerSettings()
    check_timeouts(kafka, settings)
    broker = make_broker(kafka, client_id=SERVICE)

    async def dead_letter(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        await broker.publish(body, topic=topic, key=key, headers=headers)

    delivery = Delivery(dead_letter, RetryPolicy(attempts=settings.retry_attempts))
    holder = handlers.PlannerHolder()
    handlers.register(broker, kafka, holder, delivery, group=settings.group)
    given = deps or PlannerDeps()
    opened: list[KafkaStore] = []

    async def build() -> None:
        # Hooks, not a lifespan: `app.start()` (in-process use) runs hooks, only `app.run()` lifespans.
        store = given.store
        if store is None:
            client = KafkaStore(kafka, reply_timeout_s=settings.store_reply_timeout_s)
            await client.start()
            opened.append(client)
            store = client
        model = given.model or make_model(
            ModelSettings(), max_poll_interval_ms=int(settings.model_timeout_s * 1000)
        )
        ready = ReadyDeps(
            store=store,
            model=model,
            catalog=given.catalog or default_catalog(),
            agents=given.agents or default_agents(),
            context=given.context or SessionHistoryContext(store, settings.history_messages),
        )
        holder.planner = Planner(ready, KafkaPublisher(broker, kafka), settings)

    async def close() -> None:
        for client in opened:
            await client.stop()
        opened.clear()
        holder.planner = None

    return FastStream(broker, on_startup=[build], after_shutdown=[close])
