"""The shipped tools over what they are given (a clock, a notebook), and the record of results given."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from quipu.contracts.tools import DEFAULT_TOOLSET, ToolCallCompleted
from quipu.services.domain.shipped_tools import NotesArguments, NotesStore, notes_tool, shipped_toolset
from quipu.services.tool_executor.adapters import RememberedResults
from quipu.testing import ArgumentError, run_tool
from quipu.tools import Tool, ToolContext, ToolError


def _context(
    run_id: str = "run-1", session_id: str = "", principal_id: str = "", tenant_id: str = ""
) -> ToolContext:
    return ToolContext(
        run_id=run_id,
        tool_use_id="toolu_1",
        session_id=session_id,
        principal_id=principal_id,
        tenant_id=tenant_id,
    )


async def test_notes_are_kept_per_person_then_session_then_run() -> None:
    store = NotesStore()
    notes = notes_tool(store)
    save = NotesArguments(action="set", key="city", value="Lima")
    read = NotesArguments(action="get", key="city")
    assert await notes(save, _context(principal_id="ana", session_id="s1")) == {"key": "city", "saved": True}
    # The same person in another session and run sees the note; someone else does not.
    assert (await notes(read, _context(principal_id="ana", session_id="s2", run_id="run-9")))[
        "value"
    ] == "Lima"
    assert await notes(read, _context(principal_id="bob", session_id="s1")) == {
        "key": "city",
        "found": False,
        "value": None,
    }
    # Without a person, the session's notebook; without a session, the run's.
    await notes(save, _context(session_id="s3"))
    assert (await notes(read, _context(session_id="s3", run_id="run-2")))["found"] is True
    assert (await notes(read, _context(run_id="run-3")))["found"] is False
    # Tenants never share a notebook.
    assert (await notes(read, _context(principal_id="ana", tenant_id="other")))["found"] is False


async def test_notes_list_their_keys_sorted() -> None:
    notes = notes_tool(NotesStore())
    context = _context(principal_id="ana")
    for key in ("b", "a", "c"):
        await notes(NotesArguments(action="set", key=key, value=key.upper()), context)
    assert await notes(NotesArguments(action="list"), context) == {"keys": ["a", "b", "c"]}


async def test_a_full_notebook_refuses_new_keys_but_takes_overwrites() -> None:
    notes = notes_tool(NotesStore(max_notes=2))
    context = _context(principal_id="ana")
    for key in ("a", "b"):
        await notes(NotesArguments(action="set", key=key, value="1"), context)
    await notes(NotesArguments(action="set", key="a", value="2"), context)
    try:
        await notes(NotesArguments(action="set", key="c", value="1"), context)
    except ToolError as error:
        assert "notebook is full" in str(error)
    else:
        raise AssertionError("a third note was accepted")


def test_remembered_results_forget_the_oldest_beyond_capacity() -> None:
    record = RememberedResults(capacity=2)
    for number in range(3):
        record.put(ToolCallCompleted(run_id="r", tool_use_id=f"t{number}", tool_name="x", content=number))
    assert record.get("r", "t0") is None
    assert [record.get("r", f"t{number}").content for number in (1, 2)] == [1, 2]  # type: ignore[union-attr]
    assert len(record) == 2


async def test_the_shipped_tools_are_tools_of_one_toolset_over_the_clock_and_notebook_given() -> None:
    notebook = NotesStore()
    moment = datetime(2026, 7, 28, 15, 30, tzinfo=UTC)
    toolset = shipped_toolset(clock=lambda: moment, notebook=notebook)

    assert (toolset.name, [each.name for each in toolset]) == (
        DEFAULT_TOOLSET,
        ["current_time", "calculator", "notes", "ask_user"],
    )
    assert all(isinstance(each, Tool) for each in toolset)
    now = await run_tool(toolset.get("current_time"), {"timezone": "America/Lima"})
    assert (now["date"], now["time"], now["utc_offset"]) == ("2026-07-28", "10:30:00", "-0500")
    context = _context(principal_id="ana")
    await run_tool(toolset.get("notes"), {"action": "set", "key": "city", "value": "Lima"}, context)
    assert notebook.get(NotesStore.scope(context), "city") == "Lima"
    with pytest.raises(ArgumentError, match="needs a value"):
        await run_tool(toolset.get("notes"), {"action": "set", "key": "city"}, context)
