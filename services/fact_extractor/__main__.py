"""`python -m quipu.services.fact_extractor`: the fact extractor alone, against the configured Kafka."""

from quipu.services.fact_extractor.app import DEFINITION

if __name__ == "__main__":
    DEFINITION.main()
