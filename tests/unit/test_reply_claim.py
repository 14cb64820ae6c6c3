"""The claim group's plan: a replies partition of its own for each store client (kit.reply_claim)."""

from __future__ import annotations

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from quipu.services.kit.reply_claim import OnePartitionEach, plan_claims

PARTITIONS = range(8)


def test_members_keep_what_they_hold_and_newcomers_take_the_lowest_free_partitions() -> None:
    held = {"a": 5, "b": 0, "new-1": None, "new-2": None}
    assert plan_claims(PARTITIONS, held) == {"a": 5, "b": 0, "new-1": 1, "new-2": 2}


def test_a_held_partition_wins_over_a_newcomers_wish_for_it() -> None:
    # "0-new" sorts first, and it read partition 5 at random before its first claim.
    held = {"0-new": None, "z-old": 5}
    assert plan_claims(PARTITIONS, held, {"0-new": 5}) == {"z-old": 5, "0-new": 0}


def test_a_newcomer_keeps_the_partition_it_read_when_free() -> None:
    assert plan_claims(PARTITIONS, {"a": 2, "b": None}, {"b": 6}) == {"a": 2, "b": 6}


def test_two_members_holding_one_partition_are_told_apart() -> None:
    # After a split group heals, say: the first in member id order keeps it.
    assert plan_claims(PARTITIONS, {"a": 3, "b": 3}) == {"a": 3, "b": 0}


def test_a_partition_the_topic_lacks_is_not_kept() -> None:
    assert plan_claims(range(2), {"a": 7}) == {"a": 0}


def test_more_members_than_partitions_share_the_least_shared_ones() -> None:
    claims = plan_claims(range(2), {name: None for name in "abcde"})
    assert sorted(claims.values()) == [0, 0, 0, 1, 1]
    assert plan_claims(range(2), {"a": 1, "b": 1, "c": None}) == {"a": 1, "b": 0, "c": 0}


def test_no_partitions_no_claims() -> None:
    assert plan_claims((), {"a": 1}) == {}


class Cluster:
    """The one thing the assignor asks of cluster metadata."""

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(PARTITIONS) if topic == "storage.replies" else None


def test_the_assignor_fetches_nothing_and_tells_each_member_its_partition_and_sharers() -> None:
    told: list[tuple[int, int]] = []
    leader = OnePartitionEach("storage.replies", lambda number, sharers: told.append((number, sharers)))
    leader.preferred = 4
    members = {
        "m-1": leader.metadata(["storage.replies"]),
        "m-2": ConsumerProtocolMemberMetadata(0, ["storage.replies"], b"held:4"),
        "m-3": ConsumerProtocolMemberMetadata(0, ["storage.replies"], b"garbage"),
    }
    plan = leader.assign(Cluster(), members)

    assert all(assignment.partitions() == [] for assignment in plan.values())
    assert plan.keys() == members.keys()
    leader.on_assignment(plan["m-1"])
    assert told == [(0, 1)] and leader.held == 0  # m-2 holds 4; m-1 takes the lowest free
    assert leader.metadata(["storage.replies"]).user_data == b"held:0"
    leader.on_assignment(ConsumerProtocolMemberAssignment(0, [], b""))  # a leader without metadata
    assert told == [(0, 1)]
