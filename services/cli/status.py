"""`quipu status`: what runs, and how far each consumer group lags behind its topic.

Lag is the fetch high-watermark of each partition minus the group's committed offset, summed over
the topic's partitions. Both are read the way that works on the embedded Tansu broker as well as
on Apache Kafka: the committed offsets through OffsetFetch (a consumer of the group that never
joins it, so nothing is rebalanced), the high-watermark from a fetch response. ListOffsets is not
used because Tansu under-reports the end offset after a multi-record batch, and the admin call
for group offsets fails there. Group members come from DescribeGroups, one group per request
(Tansu garbles every group after the first of a response); Tansu notices a member that died
only after its session timeout, so a just-killed service still counts for a moment.
What cannot be measured is said, never shown as 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from rich.console import Group
from rich.table import Table
from rich.text import Text

from quipu.contracts.topics import Topic
from quipu.services import catalog
from quipu.services.catalog import Consumer
from quipu.services.cli.state import CLIENT_ID, alive
from quipu.services.kit.settings import KafkaSettings

CONSUMERS: tuple[Consumer, ...] = tuple(
    consumer for service in catalog.SERVICES for consumer in service.consumers
)
"""Every grouped subscriber of the services, as deployed (the KEDA scalers use the same pairs)."""


@dataclass(frozen=True)
class GroupLag:
    """What was measured of one consumer group; None where it could not be measured."""

    consumer: Consumer
    members: int | None
    lag: int | None
    unmeasured: str = ""
    """Why `members` or `lag` is missing."""


async def measure(
    kafka: KafkaSettings, consumers: Sequence[Consumer] = CONSUMERS, timeout_s: float = 5.0
) -> list[GroupLag]:
    """Members and lag of each consumer group."""
    groups = [kafka.topic_prefix + consumer.group for consumer in consumers]
    members, members_error = await _members(kafka, groups, timeout_s)
    lags, lag_errors = await _lags(kafka, consumers, timeout_s)
    return [
        GroupLag(
            consumer,
            members.get(group),
            lags.get(consumer),
            "; ".join(filter(None, (members_error, lag_errors.get(consumer, "")))),
        )
        for consumer, group in zip(consumers, groups, strict=True)
    ]


async def _members(kafka: KafkaSettings, groups: list[str], timeout_s: float) -> tuple[dict[str, int], str]:
    admin = AIOKafkaAdminClient(
        bootstrap_servers=kafka.bootstrap,
        client_id=f"{CLIENT_ID}-status",
        request_timeout_ms=int(timeout_s * 1000),
    )
    members: dict[str, int] = {}
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        # One group per request: Tansu misencodes every group after the first of a DescribeGroups
        # response (garbled fields; three groups break the decoding).
        for group in groups:
            [response] = await asyncio.wait_for(admin.describe_consumer_groups([group]), timeout_s)
            for error_code, described, _state, _type, _protocol, group_members, *_ in response.groups:
                if error_code == 0 and described == group:
                    members[group] = len(group_members)
    except (KafkaError, TimeoutError, OSError, ValueError) as error:
        return members, f"members not measured ({type(error).__name__})"
    finally:
        with contextlib.suppress(KafkaError, OSError):
            await admin.close()
    return members, ""


async def _lags(
    kafka: KafkaSettings, consumers: Sequence[Consumer], timeout_s: float
) -> tuple[dict[Consumer, int], dict[Consumer, str]]:
    lags: dict[Consumer, int] = {}
    failures: dict[Consumer, str] = {}
    reader = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap,
        client_id=f"{CLIENT_ID}-status",
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
        max_partition_fetch_bytes=1024,  # only the high-watermark is wanted, not the records
    )
    await reader.start()
    try:
        committed: dict[TopicPartition, int] = {}
        partitions: dict[Consumer, list[TopicPartition]] = {}
        for consumer in consumers:
            try:
                partitions[consumer] = await _partitions(reader, kafka.topic_prefix + consumer.topic_name)
                committed |= await _committed(
                    kafka, kafka.topic_prefix + consumer.group, partitions[consumer]
                )
            except (KafkaError, TimeoutError, OSError) as error:
                failures[consumer] = f"committed offsets not measured ({type(error).__name__})"
                partitions.pop(consumer, None)
        every = [tp for tps in partitions.values() for tp in tps]
        highwater = await _highwater(reader, every, committed, timeout_s)
        for consumer, tps in partitions.items():
            missing = [tp for tp in tps if tp not in highwater]
            if missing:
                failures[consumer] = f"no fetch answer for {len(missing)} of {len(tps)} partitions"
                continue
            lags[consumer] = sum(max(0, highwater[tp] - committed.get(tp, 0)) for tp in tps)
    finally:
        await reader.stop()
    return lags, failures


async def _partitions(reader: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    numbers = reader.partitions_for_topic(topic)
    if not numbers:
        await reader._client.force_metadata_update()
        numbers = reader.partitions_for_topic(topic)
    if not numbers:
        raise KafkaError(f"topic {topic} does not exist")
    return [TopicPartition(topic, number) for number in sorted(numbers)]


async def _committed(
    kafka: KafkaSettings, group: str, partitions: list[TopicPartition]
) -> dict[TopicPartition, int]:
    """The group's committed offsets (OffsetFetch); this consumer never joins the group."""
    offsets = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap,
        client_id=f"{CLIENT_ID}-status",
        group_id=group,
        enable_auto_commit=False,
    )
    await offsets.start()
    try:
        found = {tp: await offsets.committed(tp) for tp in partitions}
    finally:
        await offsets.stop()
    return {tp: offset for tp, offset in found.items() if offset is not None}


async def _highwater(
    reader: AIOKafkaConsumer,
    partitions: list[TopicPartition],
    committed: dict[TopicPartition, int],
    timeout_s: float,
) -> dict[TopicPartition, int]:
    """Each partition's high-watermark, from fetch responses positioned at the committed offset."""
    if not partitions:
        return {}
    reader.assign(partitions)
    for tp in partitions:
        if tp in committed:
            reader.seek(tp, committed[tp])
        else:
            await reader.seek_to_beginning(tp)
    found: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < len(partitions) and time.monotonic() < deadline:
        await reader.getmany(timeout_ms=100, max_records=1)
        for tp in partitions:
            value = reader.highwater(tp)
            if value is not None:
                found[tp] = value
    return found


async def observe_consumer(kafka: KafkaSettings, topic: Topic, timeout_s: float) -> str:
    """What the group consuming `topic` shows, as a clause for a hint."""
    [consumer] = [consumer for consumer in CONSUMERS if consumer.topic is topic]
    try:
        [measured] = await asyncio.wait_for(measure(kafka, [consumer], timeout_s), 3 * timeout_s)
    except (KafkaError, TimeoutError, OSError) as error:
        return f"the broker did not say whether {consumer.service} is consuming ({type(error).__name__})"
    group = f"group {kafka.topic_prefix}{consumer.group} on {topic.value}"
    if measured.members == 0:
        return f"no {consumer.service} is consuming ({group} has no member): is it running? (`quipu status`)"
    members = "members not measured" if measured.members is None else f"{measured.members} member(s)"
    backlog = "lag not measured" if measured.lag is None else f"{measured.lag} message(s) not yet handled"
    return f"{consumer.service} is consuming ({group}: {members}, {backlog}); busy or stuck (`quipu status`)"


# --- showing it -------------------------------------------------------------------------------------


def services_table(state: dict[str, Any]) -> Table:
    """The services `quipu up` runs: pid, up or down, restarts, last exit."""
    table = Table(title_justify="left")
    for column in ("service", "pid", "state", "restarts", "last exit"):
        table.add_column(column, no_wrap=column != "last exit")
    services: dict[str, dict[str, Any]] = state.get("services", {})
    now = time.time()
    for name, service in services.items():
        pid = service.get("pid")
        running = isinstance(pid, int) and alive(pid)
        since = f"up {now - float(service.get('started_at') or now):.0f} s" if running else "down"
        table.add_row(
            name,
            str(pid or "-"),
            Text(since, style="green" if running else "bold red"),
            str(service.get("restarts", 0)),
            str(service.get("last_exit") or "-"),
        )
    return table


def lag_table(measured: list[GroupLag]) -> Group:
    """Each consumer group: members and lag (high-watermark - committed); below, what was not measured."""
    table = Table(title_justify="left")
    for column in ("group", "topic", "members", "lag"):
        table.add_column(column, no_wrap=True)
    for row in measured:
        table.add_row(
            row.consumer.group,
            row.consumer.topic_name,
            "?" if row.members is None else str(row.members),
            "?" if row.lag is None else str(row.lag),
        )
    reasons = [
        Text(f"{row.consumer.group}: {row.unmeasured}", style="yellow") for row in measured if row.unmeasured
    ]
    return Group(table, *reasons)
