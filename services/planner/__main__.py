"""`python -m quipu.services.planner`: the planner alone, against the configured Kafka (and its owner)."""

from quipu.services.planner.app import DEFINITION

if __name__ == "__main__":
    DEFINITION.main()
