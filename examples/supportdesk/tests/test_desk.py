"""The desk's own tests, offline: each tool called as Quipu's executor calls it (`quipu.testing`)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client
from supportdesk.help_centre import server as help_centre
from supportdesk.status import service_status
from supportdesk.status_page import StatusPage
from supportdesk.tickets import Ledger, open_ticket, ticket_id

from quipu.contracts.transcript import Message
from quipu.testing import ArgumentError, ModelRequest, ScriptedModel, TextPart, ToolUsePart, run_tool
from quipu.tools import ToolContext, ToolError


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    path = tmp_path / "tickets.jsonl"
    monkeypatch.setenv("SUPPORTDESK_LEDGER", str(path))
    return Ledger(path)


@pytest.fixture
def status_page(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatusPage]:
    with StatusPage() as page:
        monkeypatch.setenv("SUPPORTDESK_STATUS_URL", page.url)
        yield page


def call(tool_use_id: str, seconds: float = 30.0) -> ToolContext:
    """The context of one tool use, as an executor gives it (a deadline `seconds` from now)."""
    return ToolContext(run_id="run-1", tool_use_id=tool_use_id).with_deadline(seconds)


async def test_a_call_delivered_twice_opens_one_ticket(ledger: Ledger) -> None:
    arguments = {"customer": "ana@example.com", "summary": "The parcel never arrived.", "priority": "urgent"}
    first = await run_tool(open_ticket, arguments, call("toolu_a"))
    again = await run_tool(open_ticket, arguments, call("toolu_a"))  # the same tool use, redelivered
    other = await run_tool(open_ticket, arguments, call("toolu_b"))  # the customer asked a second time
    assert first == again != other
    assert ticket_id("toolu_a") in first and "(urgent)" in first
    assert [ticket.idempotency_key for ticket in ledger.all()] == ["toolu_a", "toolu_b"]


async def test_a_ticket_needs_a_customer_and_a_known_priority(ledger: Ledger) -> None:
    with pytest.raises(ArgumentError, match="customer"):
        await run_tool(open_ticket, {"customer": "", "summary": "x"}, call("toolu_c"))
    with pytest.raises(ArgumentError, match="priority"):
        await run_tool(open_ticket, {"customer": "bo", "summary": "x", "priority": "asap"}, call("toolu_d"))
    assert ledger.all() == []


async def test_the_status_comes_from_the_status_page(status_page: StatusPage) -> None:
    said = await run_tool(service_status, {"service": "payments"}, call("toolu_s"))
    assert said == "payments is degraded: card payments take up to a minute to confirm"


async def test_a_status_page_slower_than_the_deadline_gets_an_answer_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with StatusPage(delay_s=600) as page:
        monkeypatch.setenv("SUPPORTDESK_STATUS_URL", page.url)
        with pytest.raises(ToolError, match="did not answer about shipping in time"):
            await run_tool(service_status, {"service": "shipping"}, call("toolu_t", seconds=1.0))


async def test_a_status_page_that_is_down_is_said_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    with StatusPage() as page:
        gone = page.url  # the port is closed once the block ends
    monkeypatch.setenv("SUPPORTDESK_STATUS_URL", gone)
    with pytest.raises(ToolError, match="could not be read"):
        await run_tool(service_status, {"service": "checkout"}, call("toolu_u"))


async def test_the_help_centre_answers_over_mcp() -> None:
    async with Client(help_centre) as client:
        listed = await client.list_tools()
        [search] = [each for each in listed.tools if each.name == "search_articles"]
        assert search.input_schema["required"] == ["query"]
        found = await client.call_tool("search_articles", {"query": "my parcel is late"})
        nothing = await client.call_tool("search_articles", {"query": "zzz"})
    assert not found.is_error and "A parcel is late" in found.content[0].text  # type: ignore[union-attr]
    assert "The help centre has:" in nothing.content[0].text  # type: ignore[union-attr]


async def test_the_offline_model_opens_a_ticket_with_what_the_turn_says(ledger: Ledger) -> None:
    request_text = "open_ticket customer=ana@example.com: my parcel never arrived"
    offered = [open_ticket.spec(), service_status.spec()]
    user = Message(role="user", parts=(TextPart(text=request_text),))
    request = ModelRequest(system="You are a desk.", messages=[user], tools=offered)
    response = await ScriptedModel().complete(request)
    [use] = [part for part in response.parts if isinstance(part, ToolUsePart)]
    assert use.name == "open_ticket"  # the tool the text names, not every tool offered
    assert (use.input["customer"], use.input["summary"]) == ("ana@example.com", "my parcel never arrived")
    said = await run_tool(open_ticket, use.input, call(use.id))
    assert said.startswith(f"Ticket {ticket_id(use.id)} is open")
    assert len(ledger.all()) == 1


def test_the_status_page_stops_on_ctrl_c_even_started_in_the_background() -> None:
    # A shell without job control starts background commands with SIGINT ignored (CI jobs,
    # `nohup ... &`); the page must still stop on Ctrl-C as it says.
    page = f"trap '' INT; exec {shlex.quote(sys.executable)} -m supportdesk.status_page --port 0"
    ignoring = subprocess.Popen(["sh", "-c", page], stdout=subprocess.PIPE, text=True)
    try:
        assert ignoring.stdout is not None
        assert "status page on http://" in ignoring.stdout.readline()
        ignoring.send_signal(signal.SIGINT)
        assert ignoring.wait(timeout=60) == 0
    finally:
        ignoring.kill()
