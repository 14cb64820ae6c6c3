"""`python -m quipu.services.enricher`: the enricher, against the configured Kafka (and its storage owner)."""

from quipu.services.enricher.app import DEFINITION

if __name__ == "__main__":
    DEFINITION.main()
