"""`python -m quipu.services.fact_extractor`: the fact extractor alone, against the configured Kafka."""

from __future__ import annotations

import asyncio

from quipu.services.fact_extractor.app import SERVICE, create_app
from quipu.services.fact_extractor.settings import FactExtractorSettings
from quipu.services.kit.lifecycle import serve
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import KafkaSettings, ServiceSettings


def main() -> None:
    """Read the settings once, configure logging and serve until SIGTERM (then stop within the grace)."""
    configure_logging(ServiceSettings(service_name=SERVICE))
    settings = FactExtractorSettings()
    app = create_app(KafkaSettings(), settings)
    asyncio.run(serve(app, settings))


if __name__ == "__main__":
    main()
