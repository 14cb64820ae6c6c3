"""`python -m quipu.services.enricher`: the enricher, against the configured Kafka (and its storage owner)."""

from __future__ import annotations

import asyncio

from quipu.services.enricher.app import SERVICE, create_app
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.kit.lifecycle import serve
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import KafkaSettings, ServiceSettings


def main() -> None:
    """Read the settings once, configure logging and serve until SIGTERM (then stop within the grace)."""
    configure_logging(ServiceSettings(service_name=SERVICE))
    settings = EnricherSettings()
    app = create_app(KafkaSettings(client_id=SERVICE), settings)
    asyncio.run(serve(app, settings))


if __name__ == "__main__":
    main()
