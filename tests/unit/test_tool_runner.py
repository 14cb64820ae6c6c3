"""One tool call to exactly one result: arguments, deadlines, limits, errors, size, input, cancel.

`ToolRunner` is the executor's logic without a broker: every outcome a model can see is checked
here through the result it would read (`ToolCallCompleted`).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import Field

from quipu.contracts.envelope import derive_id
from quipu.contracts.tools import AwaitKind, ToolCallCompleted
from quipu.contracts.transcript import TOOL_RESULT_MAX_BYTES, ToolResultPart, encode_json_value
from quipu.services.domain.shipped_tools import (
    ASK_USER,
    CALCULATOR,
    CURRENT_TIME,
    NOTES,
    NotesStore,
    default_catalog,
    shipped_toolset,
)
from quipu.services.domain.tool_catalog import ToolArguments, ToolCatalog, ToolDefinition, agent_tool
from quipu.services.tool_executor.adapters import RememberedResults
from quipu.services.tool_executor.logic import ToolRunner
from quipu.tools import ToolContext, ToolError, ToolImplementation
from tests.support.tool_calls import answer_of, tool_call


class Seconds(ToolArguments):
    """Arguments of the test tools."""

    seconds: float = Field(default=0.0, description="How long to take.")
    size: int = Field(default=0, description="How many characters to return.")


class Probe:
    """Test tools that take time, fail, return too much, or count what runs at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most_at_once = 0
        self.calls = 0
        self.started = asyncio.Event()

    async def slow(self, arguments: Seconds, _context: ToolContext) -> dict[str, Any]:
        self.calls += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.started.set()
        try:
            await asyncio.sleep(arguments.seconds)
        finally:
            self.running -= 1
        return {"slept": arguments.seconds}

    async def failing(self, _arguments: Seconds, _context: ToolContext) -> Any:
        raise RuntimeError("upstream said no; Authorization: Bearer abcdefghijklmnop, key sk-abcdefghijkl")

    async def refusing(self, _arguments: Seconds, _context: ToolContext) -> Any:
        raise ToolError("no such city")

    async def own_timeout(self, _arguments: Seconds, _context: ToolContext) -> Any:
        raise TimeoutError

    async def large(self, arguments: Seconds, _context: ToolContext) -> Any:
        return {"text": "x" * arguments.size}

    async def not_json(self, _arguments: Seconds, _context: ToolContext) -> Any:
        return {1, 2}

    async def fraction(self, _arguments: Seconds, _context: ToolContext) -> Any:
        return {"value": 0.1, "count": 3}


def _tool(name: str, *, timeout_s: float = 5.0, max_concurrency: int = 8) -> ToolDefinition:
    return ToolDefinition(name, f"The {name} test tool.", Seconds, timeout_s, max_concurrency)


def _runner(probe: Probe, *, max_timeout_s: float = 30.0, notes: NotesStore | None = None) -> ToolRunner:
    catalog = default_catalog()
    implementations: dict[str, ToolImplementation] = {
        **shipped_toolset(
            clock=lambda: datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC), notebook=notes
        ).implementations(),
        "slow": probe.slow,
        "narrow": probe.slow,
        "failing": probe.failing,
        "refusing": probe.refusing,
        "own_timeout": probe.own_timeout,
        "large": probe.large,
        "not_json": probe.not_json,
        "fraction": probe.fraction,
    }
    for name in ("slow", "failing", "refusing", "own_timeout", "large", "not_json", "fraction"):
        catalog.register(_tool(name, timeout_s=0.2 if name == "slow" else 5.0))
    catalog.register(_tool("narrow", max_concurrency=2))
    catalog.register(agent_tool("researcher", "Looks things up.", "agent-r"))
    return ToolRunner(catalog, implementations, RememberedResults(100), max_timeout_s=max_timeout_s)


def _as_transcript_part(result: ToolCallCompleted) -> ToolResultPart:
    """What the planner will build from the result: it must be a valid transcript part."""
    return ToolResultPart(tool_use_id=result.tool_use_id, content=result.content, is_error=result.is_error)


# --- results ----------------------------------------------------------------------------------------


async def test_a_result_answers_its_call_and_derives_its_id() -> None:
    request = tool_call(CALCULATOR, {"expression": "(17.5 - 2) * 3 ** 2"}, tenant_id="t", correlation_id="c")
    result = await answer_of(_runner(Probe()), request)
    assert result.content == {"expression": "(17.5 - 2) * 3 ** 2", "result": 139.5}
    assert not result.is_error and result.awaiting is None
    assert result.event_id == derive_id(request.event_id, "result")
    assert result.causation_id == request.event_id
    assert (result.run_id, result.session_id, result.agent_id) == ("run-1", "session-1", "agent-1")
    assert (result.tool_use_id, result.tool_name) == ("toolu_calculator", CALCULATOR)
    assert (result.tenant_id, result.correlation_id) == ("t", "c")
    assert result.partition_key() == "session-1"
    _as_transcript_part(result)


async def test_current_time_reads_the_clock_in_the_zone_asked() -> None:
    runner = _runner(Probe())
    utc = await answer_of(runner, tool_call(CURRENT_TIME, tool_use_id="a"))
    assert utc.content["iso"] == "2025-03-14T09:26:53+00:00" and utc.content["weekday"] == "Friday"
    madrid = await answer_of(runner, tool_call(CURRENT_TIME, {"timezone": "Europe/Madrid"}, tool_use_id="b"))
    assert (
        madrid.content["iso"] == "2025-03-14T10:26:53+01:00" and madrid.content["timezone"] == "Europe/Madrid"
    )
    bad = await answer_of(runner, tool_call(CURRENT_TIME, {"timezone": "Mars/Olympus"}, tool_use_id="c"))
    assert bad.is_error and "unknown time zone 'Mars/Olympus'" in bad.content
    escape = await answer_of(
        runner, tool_call(CURRENT_TIME, {"timezone": "../../etc/passwd"}, tool_use_id="d")
    )
    assert escape.is_error and "unknown time zone" in escape.content


async def test_numbers_travel_as_json_numbers_not_strings() -> None:
    # The transcript keeps numbers as Decimal, which pydantic writes as a string; the wire must not.
    result = await answer_of(_runner(Probe()), tool_call("fraction"))
    assert json.loads(result.model_dump_json())["content"] == {"value": 0.1, "count": 3}


async def test_ask_user_asks_instead_of_answering() -> None:
    request = tool_call(ASK_USER, {"question": "Which city?", "choices": ["Lima", "Cusco"]})
    result = await answer_of(_runner(Probe()), request)
    assert result.content is None and not result.is_error
    assert result.awaiting is not None
    assert result.awaiting.kind is AwaitKind.CLARIFICATION
    assert result.awaiting.prompt == "Which city?"
    assert result.awaiting.details == {"choices": ["Lima", "Cusco"]}
    open_question = await answer_of(_runner(Probe()), tool_call(ASK_USER, {"question": "Why?"}))
    assert open_question.awaiting is not None and open_question.awaiting.details == {"choices": []}


# --- errors the model reads ------------------------------------------------------------------------


async def test_invalid_arguments_are_an_error_result_the_model_can_act_on() -> None:
    result = await answer_of(_runner(Probe()), tool_call(CALCULATOR, {"expr": "1+1"}))
    assert result.is_error
    assert result.content == (
        "invalid arguments for calculator: expression: Field required; expr: Extra inputs are not permitted"
    )
    _as_transcript_part(result)


async def test_an_unknown_tool_is_an_error_result_naming_the_tools_there_are() -> None:
    result = await answer_of(_runner(Probe()), tool_call("shell", {"command": "rm -rf /"}))
    assert result.is_error
    assert result.content.startswith("unknown tool 'shell'; available tools: current_time, calculator")


async def test_an_agent_tool_is_never_run_by_the_executor() -> None:
    result = await answer_of(_runner(Probe()), tool_call("researcher", {"task": "look it up"}))
    assert result.is_error and "the planner runs it" in result.content


async def test_a_calculator_error_is_an_error_result() -> None:
    runner = _runner(Probe())
    for number, (expression, text) in enumerate(
        [
            ("__import__('os').system('id')", "not allowed in an arithmetic expression: function call"),
            ("9 ** 9 ** 9", "exponent is too large"),
            ("1 / 0", "division by zero"),
        ]
    ):
        result = await answer_of(
            runner, tool_call(CALCULATOR, {"expression": expression}, tool_use_id=f"c{number}")
        )
        assert result.is_error and text in result.content


async def test_a_timeout_is_an_error_result() -> None:
    probe = Probe()
    result = await answer_of(_runner(probe), tool_call("slow", {"seconds": 5}))
    assert result.is_error
    assert result.content == "slow timed out after 0.2 s (running)"
    assert result.duration_ms >= 150  # measured up to the deadline (a busy machine only adds to it)
    assert probe.running == 0  # the tool was stopped, not left running


async def test_a_request_can_shorten_the_deadline_but_not_pass_the_executor_cap() -> None:
    runner = _runner(Probe(), max_timeout_s=0.1)
    result = await answer_of(runner, tool_call("large", {"size": 1}, timeout_s=1000))
    assert not result.is_error
    definition = default_catalog().get(NOTES)
    assert runner.deadline(definition, tool_call(NOTES, timeout_s=1000)) == 0.1
    assert _runner(Probe()).deadline(definition, tool_call(NOTES, timeout_s=0.5)) == 0.5
    assert _runner(Probe()).deadline(definition, tool_call(NOTES)) == definition.timeout_s


async def test_a_timeout_the_tool_raises_itself_is_reported_as_its_failure() -> None:
    result = await answer_of(_runner(Probe()), tool_call("own_timeout"))
    assert result.is_error and result.content == "own_timeout failed: TimeoutError"


async def test_an_exception_is_an_error_result_without_traceback_or_secrets() -> None:
    result = await answer_of(_runner(Probe()), tool_call("failing"))
    assert result.is_error
    assert result.content.startswith("failing failed: RuntimeError: upstream said no")
    assert "abcdefghijklmnop" not in result.content and "sk-abcdefghijkl" not in result.content
    assert "Traceback" not in result.content and "[REDACTED]" in result.content
    _as_transcript_part(result)


async def test_a_tool_error_is_given_as_the_tool_wrote_it() -> None:
    result = await answer_of(_runner(Probe()), tool_call("refusing"))
    assert result.is_error and result.content == "no such city"


async def test_a_value_that_is_not_json_is_an_error_result() -> None:
    result = await answer_of(_runner(Probe()), tool_call("not_json"))
    assert result.is_error and "returned a value that is not JSON" in result.content


# --- size ------------------------------------------------------------------------------------------


async def test_content_up_to_64_kib_is_given_whole() -> None:
    overhead = len(encode_json_value({"text": ""}))
    result = await answer_of(_runner(Probe()), tool_call("large", {"size": TOOL_RESULT_MAX_BYTES - overhead}))
    assert len(encode_json_value(result.content)) == TOOL_RESULT_MAX_BYTES
    assert result.content["text"].startswith("xxx")


async def test_content_over_64_kib_becomes_the_omission_marker() -> None:
    overhead = len(encode_json_value({"text": ""}))
    result = await answer_of(
        _runner(Probe()), tool_call("large", {"size": TOOL_RESULT_MAX_BYTES - overhead + 1})
    )
    assert not result.is_error
    assert result.content["omitted"] is True and result.content["reason"] == "size_limit"
    assert result.content["bounds"] == {
        "size_bytes": TOOL_RESULT_MAX_BYTES + 1,
        "limit_bytes": TOOL_RESULT_MAX_BYTES,
    }
    assert result.content["preview"].startswith('{"text":"xxx') and len(result.content["preview"]) == 1000
    assert len(result.model_dump_json()) < 2000
    _as_transcript_part(result)


# --- limits, idempotence, cancel ---------------------------------------------------------------------


async def test_a_tool_never_runs_more_calls_at_once_than_its_limit() -> None:
    probe = Probe()
    runner = _runner(probe)
    calls = [tool_call("narrow", {"seconds": 0.05}, tool_use_id=f"n{number}") for number in range(6)]
    results = await asyncio.gather(*(answer_of(runner, call) for call in calls))
    assert probe.most_at_once == 2
    assert all(not result.is_error for result in results)


async def test_waiting_for_a_slot_counts_against_the_deadline() -> None:
    probe = Probe()
    runner = _runner(probe)
    first = [tool_call("narrow", {"seconds": 0.5}, tool_use_id=f"n{number}") for number in range(2)]
    late = tool_call("narrow", {"seconds": 0}, tool_use_id="late", timeout_s=0.1)
    results = await asyncio.gather(*(answer_of(runner, call) for call in [*first, late]))
    assert (
        results[2].is_error and results[2].content == "narrow timed out after 0.1 s (waiting for a free slot)"
    )


async def test_a_redelivered_call_is_answered_again_without_running_again() -> None:
    notes = NotesStore()
    runner = _runner(Probe(), notes=notes)
    first_set = tool_call(NOTES, {"action": "set", "key": "city", "value": "Lima"}, tool_use_id="set-1")
    second_set = tool_call(NOTES, {"action": "set", "key": "city", "value": "Cusco"}, tool_use_id="set-2")
    first = await answer_of(runner, first_set)
    await answer_of(runner, second_set)
    again = await answer_of(runner, first_set)  # redelivered after the second set
    assert again == first  # the very same event: same id, same time
    read = await answer_of(runner, tool_call(NOTES, {"action": "get", "key": "city"}, tool_use_id="get-1"))
    assert read.content == {"key": "city", "found": True, "value": "Cusco"}  # the first set did not run twice


async def test_a_new_request_for_an_answered_tool_use_gets_the_answer_under_its_own_id() -> None:
    probe = Probe()
    runner = _runner(probe)
    first = await answer_of(runner, tool_call("slow", {"seconds": 0}))
    repeat = tool_call("slow", {"seconds": 0})
    again = await answer_of(runner, repeat)
    assert probe.calls == 1
    assert again.event_id == derive_id(repeat.event_id, "result") != first.event_id
    assert again.content == first.content


async def test_a_duplicate_of_a_running_call_shares_its_execution() -> None:
    probe = Probe()
    runner = _runner(probe)
    call = tool_call("slow", {"seconds": 0.05})
    results = await asyncio.gather(answer_of(runner, call), answer_of(runner, call))
    assert probe.calls == 1 and results[0] == results[1]


async def test_a_canceled_run_answers_nothing_and_runs_no_more_calls() -> None:
    probe = Probe()
    runner = _runner(probe)
    slow = [tool_call("slow", {"seconds": 0.15}, tool_use_id=f"s{number}") for number in range(3)]
    other = tool_call("slow", {"seconds": 0.01}, run_id="run-2", tool_use_id="other")
    pending = [asyncio.create_task(runner.run(call)) for call in [*slow, other]]
    await probe.started.wait()
    assert runner.cancel_run("run-1") == 3
    results = await asyncio.gather(*pending)
    assert results[:3] == [None, None, None]
    assert results[3] is not None and not results[3].is_error
    assert probe.running == 0
    assert await runner.run(tool_call("slow", {"seconds": 0}, tool_use_id="later")) is None
    assert runner.is_canceled("run-1") and not runner.is_canceled("run-2")


async def test_shutting_down_cancels_the_call_without_pretending_the_run_was_canceled() -> None:
    probe = Probe()
    runner = _runner(probe)
    task = asyncio.create_task(runner.run(tool_call("slow", {"seconds": 0.15})))
    await probe.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert probe.running == 0 and runner.running() == 0


def test_every_tool_the_executor_runs_needs_an_implementation() -> None:
    catalog = ToolCatalog([_tool("slow")])
    with pytest.raises(ValueError, match="without an implementation"):
        ToolRunner(catalog, {}, RememberedResults(1), max_timeout_s=1)
    with pytest.raises(ValueError, match="does not run"):
        ToolRunner(
            catalog, {"slow": Probe().slow, "other": Probe().slow}, RememberedResults(1), max_timeout_s=1
        )


# --- a changed list (an MCP server's) ------------------------------------------------------------------


async def test_serving_a_new_list_runs_its_tools_and_refuses_the_removed_ones() -> None:
    probe = Probe()
    runner = ToolRunner(
        ToolCatalog([_tool("slow")]), {"slow": probe.slow}, RememberedResults(100), max_timeout_s=5.0
    )
    running = asyncio.create_task(
        answer_of(runner, tool_call("slow", {"seconds": 0.2}, tool_use_id="before"))
    )
    await probe.started.wait()

    runner.serve(ToolCatalog([_tool("fraction")]), {"fraction": probe.fraction})

    added = await answer_of(runner, tool_call("fraction"))
    removed = await answer_of(runner, tool_call("slow", tool_use_id="after"))
    assert added.content == {"value": 0.1, "count": 3}
    assert removed.is_error and removed.content == "unknown tool 'slow'; available tools: fraction"
    assert not (await running).is_error  # a call already running ends with the tool it started with


async def test_a_tool_kept_in_a_new_list_keeps_its_concurrency_slots() -> None:
    probe = Probe()
    narrow = _tool("narrow", max_concurrency=2)
    runner = ToolRunner(
        ToolCatalog([narrow]), {"narrow": probe.slow}, RememberedResults(100), max_timeout_s=5.0
    )
    first = [
        asyncio.create_task(answer_of(runner, tool_call("narrow", {"seconds": 0.1}, tool_use_id=f"a{n}")))
        for n in range(2)
    ]
    await probe.started.wait()

    runner.serve(ToolCatalog([narrow]), {"narrow": probe.slow})
    later = [answer_of(runner, tool_call("narrow", {"seconds": 0.05}, tool_use_id=f"b{n}")) for n in range(2)]
    await asyncio.gather(*first, *later)

    assert probe.most_at_once == 2


def test_a_list_whose_tools_and_implementations_differ_is_refused() -> None:
    probe = Probe()
    runner = ToolRunner(
        ToolCatalog([_tool("slow")]), {"slow": probe.slow}, RememberedResults(100), max_timeout_s=5.0
    )

    with pytest.raises(ValueError, match="without an implementation"):
        runner.serve(ToolCatalog([_tool("slow"), _tool("large")]), {"slow": probe.slow})
    assert runner.catalog.names() == ["slow"]  # the list it served is kept
