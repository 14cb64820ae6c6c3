"""Which partition of the replies topic a store client reads: one of its own, claimed in a group.

Every store client names a partition of `storage.replies` in its commands and reads that
partition alone. Picked at random, two clients would share one without knowing it and each would
fetch the other's replies (every client reading every reply grows as N² with service copies).
Instead every client is a member of one consumer group per deployment (`store-replies`), whose
assignor (`OnePartitionEach`) hands each member a partition number of its own: the one it already
reads when no other member holds it (so a member joining or leaving moves nobody else), else the
lowest free one. Only when there are more clients than partitions do some share one, the least
shared, and they know it (`ReplyClaim.shared`); a shared partition still works, since a client
passes over replies it does not wait for.

The group's members are assigned no partitions at all (the number travels in the assignment's
user data), so the claim never fetches: it only heartbeats, with a session of its own
(`KafkaSettings.reply_claim_session_timeout_ms`, Kafka's usual 10 s even on Tansu: nothing waits on
a claim). A member that dies is dropped after it, and its partition is free again.

What a reply's route may name does not change: the owner takes the topic from its settings and
only checks that the partition exists (docs/store-contract.md); a claim only keeps honest
clients off each other's partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from quipu.services.kit.settings import KafkaSettings

logger = structlog.get_logger(__name__)

CLAIM_GROUP = "store-replies"
"""The consumer group (prefixed like every group) whose members are the store clients."""


def plan_claims(
    partitions: Iterable[int],
    held: Mapping[str, int | None],
    preferred: Mapping[str, int | None] | None = None,
) -> dict[str, int]:
    """One partition for each member of `held` (member id -> the partition the group gave it last,
    if any); `preferred`: the partition a member reads before its first claim.

    A member keeps the partition it holds when that exists and no member before it (in member id
    order) keeps it too; then a member gets the partition it prefers when still free; the others
    get the lowest free partitions, and when none is free the least shared one (the lowest among
    equals). Deterministic: every leader plans the same.
    """
    numbers = sorted(set(partitions))
    if not numbers:
        return {}
    claims: dict[str, int] = {}
    for wishes in (held, preferred or {}):
        for member in sorted(set(held) - set(claims)):
            wish = wishes.get(member)
            if wish in numbers and wish not in claims.values():
                claims[member] = wish
    load = Counter(claims.values())
    for member in sorted(set(held) - set(claims)):
        chosen = min(numbers, key=lambda number: (load[number], number))
        claims[member] = chosen
        load[chosen] += 1
    return claims


_HELD, _PREFERRED = "held:", "preferred:"
"""How a member's join metadata says which partition it asks for, and why."""


def _wish(user_data: bytes, kind: str) -> int | None:
    text = user_data.decode("ascii", "replace")
    number = text.removeprefix(kind)
    return int(number) if text.startswith(kind) and number.isdigit() else None


class OnePartitionEach(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka is untyped
    """The claim group's assignor: a partition number of `topic` for each member (`plan_claims`),
    in the assignment's user data, with no partition assigned to fetch."""

    name = "quipu-one-partition-each"
    version = 0

    def __init__(self, topic: str, on_claim: Callable[[int, int], None]) -> None:
        """`on_claim(partition, sharers)` is called with each assignment this member gets."""
        self._topic = topic
        self._on_claim = on_claim
        self.held: int | None = None
        """The partition the group gave this member last: what it asks to keep at the next join."""
        self.preferred: int | None = None
        """The partition it reads before its first claim: what it asks for when that is free."""

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        """What this member sends when it joins: the topic, and the partition it reads now."""
        if self.held is not None:
            wish = f"{_HELD}{self.held}"
        else:
            wish = "" if self.preferred is None else f"{_PREFERRED}{self.preferred}"
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), wish.encode())

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """The leader's plan: each member's partition number and how many members share it."""
        partitions = cluster.partitions_for_topic(self._topic) or set()
        claims = plan_claims(
            partitions,
            {member: _wish(meta.user_data, _HELD) for member, meta in members.items()},
            {member: _wish(meta.user_data, _PREFERRED) for member, meta in members.items()},
        )
        sharers = Counter(claims.values())
        return {
            member: ConsumerProtocolMemberAssignment(self.version, [], f"{number}:{sharers[number]}".encode())
            for member, number in claims.items()
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """Learn this member's partition (nothing when the leader had no metadata for the topic)."""
        number, _, sharers = assignment.user_data.decode("ascii", "replace").partition(":")
        if number.isdigit() and sharers.isdigit():
            self.held = int(number)
            self._on_claim(int(number), int(sharers))


class ReplyClaim:
    """This client's membership of the claim group: the partition it was given, once given."""

    def __init__(self, settings: KafkaSettings, topic: str, on_claim: Callable[[int], None]) -> None:
        """`on_claim(partition)` is called whenever the group gives this member a partition."""
        self._settings = settings
        self._topic = topic
        self._on_claim = on_claim
        self.partition: int | None = None
        """The partition the group gave this member (None until the first assignment)."""
        self.shared = False
        """Whether other members were given the same partition (more clients than partitions)."""
        self._assignor = OnePartitionEach(topic, self._claimed)
        self._consumer: AIOKafkaConsumer | None = None
        self._polling: asyncio.Task[None] | None = None

    def prefer(self, partition: int) -> None:
        """Ask to keep `partition` (the one read before any claim) when this member joins."""
        self._assignor.preferred = partition

    def _claimed(self, partition: int, sharers: int) -> None:
        if sharers > 1 and not self.shared:
            logger.warning("store clients share a replies partition", partition=partition, sharers=sharers)
        self.partition, self.shared = partition, sharers > 1
        self._on_claim(partition)

    async def start(self) -> None:
        """Join the group in the background: the first claim comes after the join (a second or
        more on Tansu), and again after every rebalance."""
        settings = self._settings
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap,
            client_id=f"{settings.client_id}-store-replies-claim",
            group_id=settings.topic_prefix + CLAIM_GROUP,
            enable_auto_commit=False,
            session_timeout_ms=settings.reply_claim_session_timeout_ms,
            heartbeat_interval_ms=settings.reply_claim_session_timeout_ms // 3,
            max_poll_interval_ms=settings.max_poll_interval_ms,
            consumer_timeout_ms=settings.consumer_timeout_ms,
            partition_assignment_strategy=(self._assignor,),
        )
        await self._consumer.start()
        self._consumer.subscribe([self._topic])
        self._polling = asyncio.create_task(self._stay(), name="store-replies-claim")

    async def _stay(self) -> None:
        # A member that has not polled for max_poll_interval_ms leaves its group; with nothing
        # assigned a poll returns nothing, so polling often enough is all this does.
        assert self._consumer is not None
        timeout_ms = max(1_000, self._settings.max_poll_interval_ms // 4)
        while True:
            await self._consumer.getmany(timeout_ms=timeout_ms)

    async def stop(self) -> None:
        """Leave the group (the partition is free for the next member at once), without waiting
        for a join under way.

        aiokafka's stop waits for the group coordination it is in the middle of, and on Tansu a
        join is answered only once the group's rebalance is over: a client stopped within seconds
        of starting (a CLI command, a short program, a test) waited 5 s for a partition it would
        never use. The coordination is cancelled first instead; a member that had joined before
        still leaves the group at once, and one whose first join was under way is dropped by the
        broker after its session timeout, as a killed client is.
        """
        if self._polling is not None:
            self._polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._polling
        if self._consumer is not None:
            coordinating: asyncio.Task[None] | None = getattr(
                self._consumer._coordinator, "_coordination_task", None
            )
            if coordinating is not None and not coordinating.done():
                coordinating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await coordinating
            await self._consumer.stop()
