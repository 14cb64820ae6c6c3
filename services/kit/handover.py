"""A record this process published is handed to the consumer of the process that reads it next.

On a run's path inside one process (`quipu up`, the run bench) most hops go from a service to a
consumer of the same process: the planner's command to the owner, the owner's tool call to the
executor, the result back. Such a consumer was fetching anyway, but on Tansu a fetch does not wake
on new data (PLATFORM_NOTES), so the record waited for the fetch in flight to come back and for
the next one: 3-5 ms a hop after the broker's acknowledgement, of which the acknowledgement is
1.6. The publisher holds the record as the broker does (its key, value, headers and create time,
at the offset the broker acknowledged), so `hand` gives it to that consumer at once, in the shape
its next fetch would have: the consumer reads it with `getone`/`getmany` as any other, commits its
offset as any other, and its fetch in flight finds its position moved on and drops what it
brings (aiokafka discards a fetch response whose offset is no longer the position).

A record is handed only when that changes nothing but the wait:

- the broker acknowledged it with `acks=all` (on Kafka a consumer could read it from then on; a
  leader's acknowledgement alone comes before the record is safe, and before consumers see it);
- the consumer stands exactly at its offset, or holds handed records that end just before it:
  every earlier record of the partition has been read, so the order is the log's;
- the partition is assigned to the consumer now, not paused, and nothing fetched from the broker
  waits unread in it (a rebalance or a seek after the hand-over makes aiokafka drop it, as it drops
  a fetch's records then);
- the consumer has no deserializer (the services' consumers read bytes).

Otherwise nothing happens and the consumer fetches the record as before. A redelivery after a
crash comes from the broker, as every record does: the hand-over never was durable. Only paced
consumers (kit.fetch_pace: on Tansu) and the store client's replies are handed records; on Kafka a
fetch returns as data comes.

aiokafka keeps what a fetch brought in `Fetcher._records` as a `FetchResult` over a
`PartitionRecords`; a handed record is a `FetchResult` over `_Handed`, which reads as one. Those
are private (aiokafka is pinned below 0.15); tests check that a handed record is the one a fetch
returns, field by field.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.consumer.fetcher import FetchResult

CREATE_TIME = 0
"""A record's timestamp type when its producer set the time (the broker's default)."""


@dataclass(frozen=True)
class HandedRecord:
    """A record as the broker keeps it, acknowledged to its producer in this process."""

    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    """Its create time (ms), as the broker acknowledged it."""

    def at(self, partition: TopicPartition, offset: int) -> ConsumerRecord[bytes, bytes]:
        """The record as a fetch of `offset` of `partition` returns it."""
        return ConsumerRecord(
            partition.topic,
            partition.partition,
            offset,
            self.timestamp,
            CREATE_TIME,
            self.key,
            self.value,
            None,
            -1 if self.key is None else len(self.key),
            len(self.value),
            self.headers,
        )


class _Handed:
    """Handed records of one partition, consecutive, in the shape of aiokafka's `PartitionRecords`:
    an iterator whose `next_fetch_offset` is the position after the last record taken."""

    def __init__(self, record: ConsumerRecord[bytes, bytes]) -> None:
        self._waiting = collections.deque([record])
        self.next_fetch_offset: int = record.offset
        self.end: int = record.offset + 1
        """The offset a record must have to follow these."""

    def add(self, record: ConsumerRecord[bytes, bytes]) -> None:
        self._waiting.append(record)
        self.end = record.offset + 1

    def __iter__(self) -> _Handed:
        return self

    def __next__(self) -> ConsumerRecord[bytes, bytes]:
        if not self._waiting:
            raise StopIteration
        record = self._waiting.popleft()
        self.next_fetch_offset = record.offset + 1
        return record


def hand(consumer: AIOKafkaConsumer, partition: TopicPartition, offset: int, record: HandedRecord) -> bool:
    """Give `consumer` the `record` at `offset` of `partition` as its next fetch would, when that
    changes nothing but the wait (the module docstring); whether it did."""
    client: Any = consumer
    fetcher = client._fetcher
    subscription = client._subscription.subscription
    assignment = None if subscription is None else subscription.assignment
    if client._closed or assignment is None or not assignment.active or partition not in assignment.tps:
        return False
    if fetcher._key_deserializer is not None or fetcher._value_deserializer is not None:
        return False
    state = assignment.state_value(partition)
    if state.paused or not state.has_valid_position:
        return False
    buffered = fetcher._records.get(partition)
    handed = getattr(buffered, "_partition_records", None)
    if isinstance(handed, _Handed) and handed.end == offset:
        handed.add(record.at(partition, offset))
    elif buffered is None and state.position == offset:
        fetcher._records[partition] = FetchResult(
            partition,
            assignment=assignment,
            partition_records=_Handed(record.at(partition, offset)),
            backoff=fetcher._prefetch_backoff,
        )
    else:
        return False
    # The log reaches past the record: known now, not at the next fetch (kit.fetch_pace parks a
    # consumer read to its partitions' high watermarks).
    if state.highwater is None or state.highwater <= offset:
        state.highwater = offset + 1
    for waiter in list(fetcher._fetch_waiters):
        fetcher._notify(waiter)
    return True
