"""Hostile input on every consumed topic, against the real services, broker and database.

Every consuming service runs as a process of its own (`Fleet`). Each of the eight topics consumed
in a group gets hand-made hostile messages (non-JSON, truncated, wrong types, 5 MB bodies,
500,000-deep nesting, non-UTF-8 headers, bad reply routes, absurd numbers) and bodies drawn by
hypothesis, each under a key of its own. Afterwards:

- every service still serves a normal run end to end (a tool call, the history, a fact, its index);
- every message that can never decode is on its topic's DLQ with a reason, and no `x-dlq-*` header
  and no log line holds a value from any hostile message;
- no consumer group has a partition it did not commit to the end, and no task died.

Then every service is stopped with SIGTERM (each must exit within its shutdown grace, not be
SIGKILLed), a poison message is put at the head of the partitions the next run will use, and the
restarted services serve that run within their restart budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiokafka import ConsumerRecord

from quipu.contracts.errors import StoreError
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from tests.hostile.fleet import GROUPS, Fleet
from tests.hostile.generators import MARKER, Hostile, drawn, hand_made, never_valid, poison
from tests.timing import eventually, scaled

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(int(scaled(300))),
    # The suite's own readers (aiokafka decodes fetched batches in the event loop) take whole
    # seconds over the 5 MB records; the services under test run in their own processes.
    pytest.mark.event_loop_block_threshold(15),
]

DRAWN_PER_TOPIC = 12
"""Hypothesis bodies per topic (bounded: the suite must stay a couple of minutes on 2 cores)."""

START_BUDGET_S = 60.0
"""From starting six processes on a busy 2-core machine to a run served through all of them."""

RESTART_BUDGET_S = 60.0
"""From restarting all six, with poison at the head of the partitions, to the next run served."""


@pytest.fixture(scope="module")
async def fleet(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    """The six consuming services on a prefix of their own, for this module."""
    async with Fleet(stack, tmp_path_factory.mktemp("hostile")) as started:
        yield started


@pytest.fixture(scope="module")
def drawn_bodies() -> list[Hostile]:
    """The Hypothesis bodies, drawn while no event loop runs: they take seconds of CPU, and a draw
    while the services' loop runs sees its `random` calls (Hypothesis warns of them)."""
    return drawn(DRAWN_PER_TOPIC)


async def _normal_run(fleet: Fleet, name: str, within: float) -> None:
    """A session with a principal: a tool call, then a fact; wait until every service did its part."""
    session_id, principal_id = f"{name}-session", f"{name}-principal"

    async def opened() -> bool:
        # The owner may still be joining its group (a restart): the budget covers that too.
        try:
            await fleet.session(session_id)
        except StoreError as error:
            if not error.retryable:
                raise
            return False
        return True

    await eventually(opened, within=within, what=f"{name}: the owner opened a session")
    await fleet.turn(session_id, principal_id, "calculate 6*7", run_id=f"{name}-run-1")
    await fleet.turn(session_id, principal_id, "my color is blue", run_id=f"{name}-run-2")

    async def served() -> bool:
        return (
            fleet.closed(f"{name}-run-1")
            and fleet.closed(f"{name}-run-2")
            and fleet.recorded(session_id)
            and fleet.fact_changed(principal_id)
        )

    try:
        await eventually(served, within=within, what=f"{name}: a run served by every service")
    except AssertionError:
        raise AssertionError(fleet.log_tails()) from None


async def _publish_hostile(
    fleet: Fleet, extra: list[Hostile]
) -> dict[Topic, list[tuple[Hostile, tuple[int, int]]]]:
    sent: dict[Topic, list[tuple[Hostile, tuple[int, int]]]] = {}
    for number, name in enumerate(GROUPS):
        sent[name] = []
        for index, message in enumerate([*hand_made(name), *extra]):
            key = f"hostile-{number}-{index}".encode()
            position = await fleet.publish(name, message.body, key=key, headers=message.headers)
            sent[name].append((message, position))
    return sent


def _never_valid_positions(
    sent: dict[Topic, list[tuple[Hostile, tuple[int, int]]]],
) -> dict[Topic, set[tuple[int, int]]]:
    return {
        name: {position for message, position in messages if never_valid(name, message)}
        for name, messages in sent.items()
    }


def _position_of(letter: ConsumerRecord[bytes, bytes]) -> tuple[int, int]:
    headers = dict(letter.headers)
    try:
        return int(headers["x-dlq-partition"]), int(headers["x-dlq-offset"])
    except (KeyError, ValueError):
        return -1, -1


def _own_headers(letter: ConsumerRecord[bytes, bytes]) -> dict[str, str]:
    return {
        name: (value or b"").decode(errors="replace")
        for name, value in letter.headers
        if name.startswith("x-dlq-")
    }


async def test_hostile_messages_are_dead_lettered_and_every_service_keeps_serving(
    drawn_bodies: list[Hostile], fleet: Fleet
) -> None:
    await _normal_run(fleet, "warmup", within=START_BUDGET_S)
    sent = await _publish_hostile(fleet, drawn_bodies)

    invalid = await asyncio.to_thread(_never_valid_positions, sent)
    assert all(invalid.values()), "every topic got messages that can never decode"

    def parked(name: Topic) -> set[tuple[int, int]]:
        return {_position_of(letter) for letter in fleet.readers[name.dlq].records}

    async def all_parked() -> bool:
        return all(invalid[name] <= parked(name) for name in invalid)

    try:
        await eventually(all_parked, within=90.0, what="every never-valid message dead-lettered")
    except AssertionError:
        missing = {name.value: sorted(invalid[name] - parked(name)) for name in invalid}
        raise AssertionError(f"not dead-lettered: {missing}\n{fleet.log_tails()}") from None

    await _normal_run(fleet, "after", within=60.0)

    for name in GROUPS:
        for letter in fleet.readers[name.dlq].records:
            headers = _own_headers(letter)
            if _position_of(letter) in invalid[name]:
                assert headers["x-dlq-reason"] == "invalid_payload"
                assert headers["x-dlq-error"], "a dead letter says what was wrong"
            assert MARKER not in str(headers), f"{name.value}: an input value in {headers}"

    async def nothing_behind() -> bool:
        return not await fleet.behind()

    try:
        await eventually(nothing_behind, within=30.0, what="every partition committed to its end")
    except AssertionError:
        raise AssertionError(f"stuck: {await fleet.behind()}\n{fleet.log_tails()}") from None
    logs = fleet.logs()
    assert MARKER not in logs, "a hostile message's content reached a log line"
    assert "Task exception was never retrieved" not in logs, "a consumer task died"
    assert fleet.not_running() == []


async def test_a_restart_with_poison_at_the_head_of_a_partition_serves_within_its_budget(
    fleet: Fleet,
) -> None:
    stopped = await fleet.stop_all()
    killed = {name: seconds for name, (seconds, status) in stopped.items() if status == -9}
    assert not killed, f"SIGKILLed after outliving their shutdown grace: {killed}\n{fleet.log_tails()}"
    print("SIGTERM to exit:", {name: round(seconds, 2) for name, (seconds, _) in stopped.items()})

    # At the head of the partition each topic will carry the next run on (docs/wire.md, keys).
    keys = {Topic.TOOLS_CALLS: b"poisoned-run-1", Topic.MEMORY_CHANGES: b"poisoned-principal"}
    for name in GROUPS:
        for message in poison():
            await fleet.publish(name, message.body, key=keys.get(name, b"poisoned-session"))

    fleet.start_all()
    await _normal_run(fleet, "poisoned", within=RESTART_BUDGET_S)

    async def nothing_behind() -> bool:
        return not await fleet.behind()

    await eventually(nothing_behind, within=30.0, what="every partition committed past the poison")
    assert "Task exception was never retrieved" not in fleet.logs()
    assert fleet.not_running() == []


def test_the_generators_make_what_the_suite_claims() -> None:
    """Cheap checks of the hostile set itself, so that a weakened generator cannot pass unseen."""
    cases = {message.case for message in hand_made(Topic.STORAGE_COMMANDS)}
    assert {
        "5 MB",
        "500,000 deep",
        "truncated",
        "wrong types",
        "absurd numbers",
        "headers not utf-8",
    } <= cases
    assert sum(case.startswith("reply route") for case in cases) >= 5
    [five_mb, nested] = [message.body or b"" for message in poison()]
    assert len(five_mb) > 5 * 1024 * 1024
    assert nested.count(b"[") == 500_000
    bodies = drawn(DRAWN_PER_TOPIC)
    assert len({message.body for message in bodies}) >= DRAWN_PER_TOPIC // 2
    assert all(MARKER.encode() in (message.body or b"") for message in bodies if message.body)
