"""The `tickets` toolset: opening a ticket is an effect, so it is keyed by the call's idempotency key.

Quipu delivers a tool call at least once: an executor that dies after writing and before answering
leaves the call to be run again by the next one. `context.idempotency_key` is the same for every
delivery of one tool use, so the ledger holds at most one ticket per key, and a call delivered again
answers with the ticket the first delivery opened.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from quipu import ToolContext, Toolset
from supportdesk.settings import DeskSettings

tickets = Toolset("tickets", version="1")

Priority = Literal["low", "normal", "urgent"]


@dataclass(frozen=True)
class Ticket:
    """One line of the ledger."""

    ticket_id: str
    idempotency_key: str
    customer: str
    summary: str
    priority: str


class Ledger:
    """An append-only file of tickets, one JSON line each, at most one per idempotency key.

    Every executor copy on the host may write to it at once: an exclusive lock (flock) spans the
    look-up and the append, and the line is on disk (fsync) before the tool answers.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def open_once(self, key: str, customer: str, summary: str, priority: str) -> tuple[Ticket, bool]:
        """The ticket of `key`, written now if no earlier delivery wrote it; and whether it is new."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a+", encoding="utf-8") as ledger:
            fcntl.flock(ledger, fcntl.LOCK_EX)
            ledger.seek(0)
            for line in ledger:
                if line.strip() and (known := Ticket(**json.loads(line))).idempotency_key == key:
                    return known, False
            ticket = Ticket(ticket_id(key), key, customer, summary, priority)
            ledger.write(json.dumps(asdict(ticket)) + "\n")
            ledger.flush()
            os.fsync(ledger.fileno())
            return ticket, True

    def all(self) -> list[Ticket]:
        """Every ticket, oldest first."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [Ticket(**json.loads(line)) for line in lines if line.strip()]


def ticket_id(key: str) -> str:
    """A ticket's id, derived from its idempotency key: the same key always names the same ticket."""
    return "T-" + hashlib.sha256(key.encode()).hexdigest()[:8].upper()


@tickets.tool(timeout_s=10.0)
def open_ticket(
    customer: Annotated[str, Field(min_length=1, max_length=80)],
    summary: Annotated[str, Field(min_length=1, max_length=500)],
    priority: Priority = "normal",
    *,
    context: ToolContext,
) -> str:
    """Opens a support ticket for a customer's problem and says its id.

    Args:
        customer: The customer's name or e-mail address.
        summary: The problem in one or two sentences.
        priority: How soon someone must answer: urgent is within the hour.
    """
    ledger = Ledger(DeskSettings().ledger)
    ticket, _ = ledger.open_once(context.idempotency_key, customer, summary, priority)
    return f"Ticket {ticket.ticket_id} is open ({ticket.priority}); we will write to {ticket.customer}."
