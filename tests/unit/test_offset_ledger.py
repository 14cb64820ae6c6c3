"""Commits while calls finish out of order: never past a call that has not been answered."""

from __future__ import annotations

from quipu.services.kit.concurrent_delivery import OffsetLedger

TOPIC = "tools.calls"


def test_the_position_waits_for_the_oldest_call_in_flight() -> None:
    ledger = OffsetLedger()
    tickets = [ledger.begin(TOPIC, 0, offset) for offset in (10, 11, 12)]
    ledger.settle(tickets[2])
    assert ledger.uncommitted(tickets[2]) == 10  # nothing new: 10 is still running
    ledger.committed(tickets[2], 10)
    ledger.settle(tickets[1])
    assert ledger.uncommitted(tickets[1]) is None
    ledger.settle(tickets[0])
    assert ledger.uncommitted(tickets[0]) == 13  # all three done: past the newest
    ledger.committed(tickets[0], 13)
    assert ledger.uncommitted(tickets[0]) is None
    assert ledger.in_flight(TOPIC, 0) == 0


def test_partitions_are_independent() -> None:
    ledger = OffsetLedger()
    stuck = ledger.begin(TOPIC, 0, 5)
    free = ledger.begin(TOPIC, 1, 7)
    ledger.settle(free)
    assert ledger.uncommitted(free) == 8
    assert ledger.uncommitted(stuck) == 5
    assert ledger.in_flight(TOPIC, 0) == 1 and ledger.in_flight(TOPIC, 1) == 0


def test_a_call_never_settled_holds_its_partition() -> None:
    ledger = OffsetLedger()
    never = ledger.begin(TOPIC, 0, 1)
    later = [ledger.begin(TOPIC, 0, offset) for offset in range(2, 50)]
    for ticket in later:
        ledger.settle(ticket)
    assert ledger.uncommitted(never) == 1


def test_a_forgotten_partition_ignores_tickets_of_its_old_assignment() -> None:
    ledger = OffsetLedger()
    old = ledger.begin(TOPIC, 0, 3)
    ledger.forget({(TOPIC, 0)})
    new = ledger.begin(TOPIC, 0, 3)  # delivered again under the new assignment
    ledger.settle(old)
    assert ledger.uncommitted(old) is None
    assert ledger.uncommitted(new) == 3  # the new delivery is still running
    ledger.committed(old, 100)
    ledger.settle(new)
    assert ledger.uncommitted(new) == 4


def test_only_messages_appended_after_the_assignment_are_first_deliveries() -> None:
    ledger = OffsetLedger()
    # The assignment's first fetch found offsets 3 to 6 (high watermark 7): any of them may have
    # been begun by the partition's previous owner.
    backlog = [ledger.begin(TOPIC, 0, offset, highwater=7) for offset in (3, 4, 5, 6)]
    assert not any(ticket.first_delivery for ticket in backlog)
    assert ledger.begin(TOPIC, 0, 7, highwater=9).first_delivery
    assert ledger.begin(TOPIC, 0, 8).first_delivery
    # A new assignment reads its own watermark: what was new under the old one is backlog now.
    ledger.forget({(TOPIC, 0)})
    assert not ledger.begin(TOPIC, 0, 8, highwater=12).first_delivery
    assert ledger.begin(TOPIC, 0, 12).first_delivery


def test_without_a_watermark_that_came_with_the_message_nothing_is_a_first_delivery() -> None:
    ledger = OffsetLedger()
    assert not ledger.begin(TOPIC, 0, 5).first_delivery  # none known
    assert not ledger.begin(TOPIC, 0, 9).first_delivery
    assert not ledger.begin(TOPIC, 1, 5, highwater=5).first_delivery  # not past the message itself
    assert not ledger.begin(TOPIC, 1, 6, highwater=20).first_delivery  # read once, at the first


def test_a_watermark_read_before_the_first_message_makes_that_message_new() -> None:
    ledger = OffsetLedger()
    ledger.watermark(TOPIC, 0, 4)  # an (empty) fetch of the new assignment: the partition ends at 4
    assert ledger.begin(TOPIC, 0, 4, highwater=5).first_delivery  # appended after: no one began it
    ledger.watermark(TOPIC, 1, 4)
    assert not ledger.begin(TOPIC, 1, 3, highwater=5).first_delivery  # there before: backlog
    ledger.forget({(TOPIC, 2)})
    ledger.watermark(TOPIC, 2, 9)
    ledger.forget({(TOPIC, 2)})  # revoked before any message: the old watermark is not kept
    assert not ledger.begin(TOPIC, 2, 9, highwater=10).first_delivery
