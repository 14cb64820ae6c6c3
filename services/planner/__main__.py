"""`python -m quipu.services.planner`: the planner alone, against the configured Kafka (and its owner)."""

from __future__ import annotations

import asyncio

from quipu.services.kit.lifecycle import serve
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import KafkaSettings, ServiceSettings
from quipu.services.planner.app import SERVICE, create_app
from quipu.services.planner.settings import PlannerSettings


def main() -> None:
    """Read the settings once, configure logging and serve until SIGTERM (then stop within the grace)."""
    configure_logging(ServiceSettings(service_name=SERVICE))
    settings = PlannerSettings()
    app = create_app(KafkaSettings(), settings)
    asyncio.run(serve(app, settings))


if __name__ == "__main__":
    main()
