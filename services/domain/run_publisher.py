"""The one way run requests and cancellations reach the planner, from the gateway, `quipu run` and
`quipu.Client` alike.

    publisher = KafkaRunPublisher(kafka_settings, client_id="gateway")
    await publisher.start()
    await publisher.publish(turn_request(turn))      # runs.requested, keyed by the session
    await publisher.stop()

The topic and key follow from the message (`quipu.services.kit.publishing`); a request's words
are sealed under its run's principal's key when the deployment has a key channel
(`QUIPU_KEYS_URL`, `quipu.contracts.sealed`), so a forget reaches its copies on the topic too;
broker trouble is a retryable `StoreError(UNAVAILABLE)`, so every caller reports it the way it
reports a store that does not answer.
"""

from __future__ import annotations

from typing import Protocol

import structlog
from aiokafka import AIOKafkaProducer

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.runs import CancelRun, RunRequested
from quipu.services.domain.memory.context import run_sealing_principal
from quipu.services.kit.keys import MessageSeals, message_seals
from quipu.services.kit.producers import new_producer
from quipu.services.kit.publishing import PublishError, TopicPublisher, producer_publisher
from quipu.services.kit.sealing import sealing_for
from quipu.services.kit.settings import KafkaSettings, KeySettings

logger = structlog.get_logger(__name__)


class RunRequestSender(Protocol):
    """Publishes run requests to `runs.requested` and cancellations to `runs.control`."""

    async def publish(self, message: RunRequested | CancelRun) -> None:
        """Send one message, keyed by its session (its run when sessionless); return once acknowledged."""
        ...


def request_principal(message: RunRequested | CancelRun) -> str:
    """Whose key seals a request's words: its run's principal, as the run's records are sealed."""
    if isinstance(message, CancelRun):
        return ""  # a cancel carries no words
    return run_sealing_principal(message.principal_id, message.session_id, message.run_id)


class KafkaRunPublisher:
    """Publishes RunRequested to `runs.requested` and CancelRun to `runs.control`."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        client_id: str = "quipu",
        keys: KeySettings | None = None,
        seals: MessageSeals | None = None,
    ) -> None:
        """`keys`: where a request's words get their principal's key (default: `KeySettings()`);
        or `seals`, the caller's own (its one key cache; left open for its other clients)."""
        self._settings = settings
        self._client_id = client_id
        self._keys = keys if keys is not None else KeySettings()
        self._producer: AIOKafkaProducer | None = None
        self._publisher: TopicPublisher | None = None
        self._given_seals = seals
        self._seals: MessageSeals | None = None

    async def start(self) -> None:
        """Connect the producer."""
        self._producer = new_producer(self._settings, f"{self._client_id}-publisher")
        await self._producer.start()
        # A request's words are sealed under its principal's key.
        self._seals = self._given_seals or message_seals(self._keys)
        self._publisher = producer_publisher(self._producer, self._settings, self._seals)

    async def stop(self) -> None:
        """Flush and close the producer."""
        producer, self._producer, self._publisher = self._producer, None, None
        if producer is not None:
            await producer.stop()
        seals, self._seals = self._seals, None
        if seals is not None and seals is not self._given_seals:
            await seals.close()

    async def publish(self, message: RunRequested | CancelRun) -> None:
        """Send and wait for the broker's acknowledgement; broker trouble is UNAVAILABLE."""
        if self._publisher is None:
            raise StoreError(ErrorCode.UNAVAILABLE, "the publisher is not started")
        try:
            with sealing_for(message.tenant_id, request_principal(message)):
                await self._publisher.publish(message)
        except PublishError as error:
            raise StoreError(ErrorCode.UNAVAILABLE, f"could not publish: {error}") from error
        logger.info(
            "published",
            topic=self._publisher.topic_of(message),
            run_id=message.run_id,
            session_id=message.session_id,
            event_id=message.event_id,
        )
