"""`python -m quipu.services.tool_executor`: the tool executor alone, against the configured Kafka."""

from quipu.services.tool_executor.app import DEFINITION

if __name__ == "__main__":
    DEFINITION.main()
