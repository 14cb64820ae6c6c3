"""A tool call redelivered after its executor died mid-call sees the same idempotency key, so a tool
that keys its effect by it charges once.

Two executor processes (`tests/chaos/charging_executor.py`) serve the user's tool `charge`, whose
effect is outside Quipu (a ledger file standing for a payment provider). The first executor runs
the call, writes the charge, and is SIGKILLed before it answers: nothing was published or
committed. The second executor joins the group, is delivered the very same call again, and runs
the tool again: it sees the same idempotency key, the bank refuses a second charge under it, and
the call gets exactly one result.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.topics import Topic
from quipu.deploy.local.services import ServiceProcess
from quipu.deploy.local.stack import EmbeddedStack
from tests.chaos.charging_executor import HOLD_ENV, JOURNAL_ENV, LEDGER_ENV, MODULE, read_lines
from tests.owner_support import RawPublisher, TopicReader
from tests.timing import eventually

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


class Executors:
    """Executor processes on this test's topics, each with its own log; all stopped at the end."""

    def __init__(self, environment: dict[str, str], folder: Path) -> None:
        self.environment = environment
        self.folder = folder
        self.started: list[tuple[ServiceProcess, Path]] = []

    def start(self, *, hold_after_effect: bool) -> tuple[ServiceProcess, Path]:
        log = self.folder / f"executor-{len(self.started)}.log"
        environment = {**self.environment, HOLD_ENV: "1" if hold_after_effect else "0"}
        process = ServiceProcess(MODULE, environment, log).start()
        self.started.append((process, log))
        return process, log

    def stop_all(self) -> None:
        for process, _ in self.started:
            process.stop(15.0)


@pytest.fixture
def executors(stack: EmbeddedStack, topic_prefix: str, tmp_path: Path) -> Iterator[Executors]:
    environment = {
        **stack.environment(),
        "QUIPU_KAFKA_TOPIC_PREFIX": topic_prefix,
        JOURNAL_ENV: str(tmp_path / "journal.jsonl"),
        LEDGER_ENV: str(tmp_path / "ledger.jsonl"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
    }
    started = Executors(environment, tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


def _assigned(log: Path) -> bool:
    return log.exists() and "partitions assigned" in log.read_text(errors="replace")


async def test_a_call_redelivered_after_a_crash_sees_the_same_key_and_charges_once(
    stack: EmbeddedStack, topic_prefix: str, executors: Executors, tmp_path: Path
) -> None:
    journal, ledger = tmp_path / "journal.jsonl", tmp_path / "ledger.jsonl"
    call = ToolCallRequested(
        run_id="run-pay-1",
        session_id="session-pay-1",
        agent_id="cashier",
        tool_use_id="toolu_pay_0001",
        tool_name="charge",
        input={"amount_cents": 1250},
    )
    first, first_log = executors.start(hold_after_effect=True)

    async def first_assigned() -> bool:
        assert first.running, first_log.read_text(errors="replace")[-3000:]
        return _assigned(first_log)

    await eventually(first_assigned, within=30.0, what="the first executor holds the calls' partitions")

    async with (
        RawPublisher(stack.bootstrap) as publisher,
        TopicReader(stack.bootstrap, topic_prefix + Topic.TOOLS_RESULTS) as results,
    ):
        await publisher.send(
            topic_prefix + Topic.TOOLS_CALLS, call.model_dump_json().encode(), key=call.run_id.encode()
        )

        async def charged_by_the_first() -> bool:
            return any(line["event"] == "charged" for line in read_lines(journal))

        await eventually(charged_by_the_first, within=30.0, what="the first executor charged")
        # After the effect, before any result: the call is neither answered nor committed.
        await asyncio.to_thread(first.kill)
        assert results.records == []

        executors.start(hold_after_effect=False)
        await results.wait_for(lambda records: len(records) >= 1, within=60.0)
        await asyncio.sleep(0.5)  # a second result would have come by now

    executions = read_lines(journal)
    starts = [line for line in executions if line["event"] == "start"]
    assert len(starts) == 2 and starts[0]["pid"] != starts[1]["pid"], executions  # run again elsewhere
    assert {line["key"] for line in starts} == {call.tool_use_id}  # the same key both times
    assert [line["event"] for line in executions] == ["start", "charged", "start", "already charged"]
    assert [(line["key"], line["amount_cents"]) for line in read_lines(ledger)] == [(call.tool_use_id, 1250)]

    [record] = results.records
    result = ToolCallCompleted.model_validate_json(record.value or b"")
    assert (result.tool_use_id, result.is_error) == (call.tool_use_id, False)
    assert result.content == {"receipt": call.tool_use_id, "charged_now": False}
