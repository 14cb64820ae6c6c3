"""`python -m quipu.services.tool_executor`: the tool executor alone, against the configured Kafka."""

from __future__ import annotations

import asyncio

from quipu.services.kit.lifecycle import serve
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import KafkaSettings, ServiceSettings
from quipu.services.tool_executor.app import SERVICE, create_app
from quipu.services.tool_executor.settings import ToolExecutorSettings


def main() -> None:
    """Read the settings once, configure logging and serve until SIGTERM (then stop within the grace)."""
    configure_logging(ServiceSettings(service_name=SERVICE))
    settings = ToolExecutorSettings()
    app = create_app(KafkaSettings(), settings)
    asyncio.run(serve(app, settings))


if __name__ == "__main__":
    main()
