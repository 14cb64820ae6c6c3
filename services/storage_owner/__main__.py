"""`python -m quipu.services.storage_owner`: the owner alone, against the configured Kafka and MongoDB."""

from quipu.services.storage_owner.app import DEFINITION

if __name__ == "__main__":
    DEFINITION.main()
