"""`python -m services.fact_extractor`: the fact extractor alone, against the configured Kafka."""

from __future__ import annotations

import asyncio

from services.fact_extractor.app import SERVICE, create_app
from services.fact_extractor.settings import FactExtractorSettings
from services.kit.logging import configure_logging
from services.kit.settings import KafkaSettings, ServiceSettings


def main() -> None:
    """Read the settings once, configure logging and serve until interrupted."""
    configure_logging(ServiceSettings(service_name=SERVICE))
    app = create_app(KafkaSettings(), FactExtractorSettings())
    asyncio.run(app.run())


if __name__ == "__main__":
    main()
