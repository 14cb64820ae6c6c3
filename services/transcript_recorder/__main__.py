"""`python -m quipu.services.transcript_recorder`: the recorder, against the configured Kafka (and owner)."""

from quipu.services.transcript_recorder.app import DEFINITION

if __name__ == "__main__":
    DEFINITION.main()
