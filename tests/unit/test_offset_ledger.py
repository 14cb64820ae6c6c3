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
