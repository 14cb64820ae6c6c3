"""The live stream says what a tool returned: `tool_end` with the result (capped) and the duration.

The planner records each result as it arrives (`tool-result/<id>`); the storage owner streams that
record as a `tool_end` event once it commits, so a UI sees the result the model will see next.
"""

from __future__ import annotations

from typing import Any

from quipu.contracts.commands import AppendRunRecord
from quipu.contracts.events import EVENT_VALUE_MAX_BYTES, StreamEventType, capped_value
from quipu.contracts.store import AppendResult
from quipu.contracts.tools import TOOL_RESULT_RECORD, ToolCallRequested
from quipu.services.storage_owner.logic import events_after_commit
from tests.unit.test_planner_runs import make_harness, result_for, tool_then_answer


async def tool_end_of(result: Any, **fields: Any) -> dict[str, Any]:
    """Run one tool round trip; the `tool_end` payload the owner streams for its result record."""
    h = make_harness(tool_then_answer(("calculator", {"expression": "6*7"})))
    request = await h.start("calculate 6*7")
    [call] = h.bus.of(ToolCallRequested)
    await h.deliver(result_for(call, result, **fields))
    [record] = [r for r in await h.records(call.run_id) if r.type == TOOL_RESULT_RECORD]
    written = AppendResult(record_id="1", inserted=True, session_status="active")
    [event] = events_after_commit(AppendRunRecord(record=record), written)
    assert event.type is StreamEventType.TOOL_END
    assert (event.run_id, event.session_id, event.event_key) == (
        call.run_id,
        request.session_id,
        record.event_key,
    )
    assert event.payload["tool_use_id"] == call.tool_use_id
    return event.payload


async def test_tool_end_carries_the_result_and_how_long_the_tool_ran() -> None:
    payload = await tool_end_of({"expression": "6*7", "result": 42}, duration_ms=12.5)
    assert payload["tool_name"] == "calculator"
    assert payload["result"] == {"expression": "6*7", "result": 42}
    assert (payload["is_error"], payload["duration_ms"]) == (False, 12.5)


async def test_a_failed_tool_streams_its_error() -> None:
    payload = await tool_end_of("division by zero", is_error=True, duration_ms=0.25)
    assert (payload["result"], payload["is_error"], payload["duration_ms"]) == (
        "division by zero",
        True,
        0.25,
    )


async def test_a_large_result_is_capped_on_the_stream_but_whole_in_the_run() -> None:
    big = {"rows": ["x" * 100] * 200}
    payload = await tool_end_of(big, duration_ms=3.0)
    capped = payload["result"]
    assert capped["omitted"] is True and capped["reason"] == "size_limit"
    assert capped["bytes"] > EVENT_VALUE_MAX_BYTES and len(capped["preview"]) <= EVENT_VALUE_MAX_BYTES


def test_capping_keeps_small_values_and_cuts_multibyte_text_cleanly() -> None:
    assert capped_value({"a": 1}) == {"a": 1}
    cut = capped_value("é" * 5000, limit=101)
    assert cut["omitted"] and cut["bytes"] == 10002 and set(cut["preview"]) <= {'"', "é"}
