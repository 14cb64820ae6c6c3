"""The support desk as one Quipu app: two agents and three toolsets.

    quipu up --app supportdesk.app:app
    quipu run --agent desk "open_ticket: my parcel never arrived"

`desk` talks to customers: it searches the help centre (an MCP server), opens tickets, and asks
`status_agent`, as one of its tools, whether the shop's services are up. `status_agent` asks the
status page. Each toolset has executors of its own, so the slow status checks never delay a ticket.
"""

from __future__ import annotations

import sys

import quipu
from supportdesk.status import service_status, status
from supportdesk.tickets import open_ticket, tickets

help_centre = quipu.McpToolset("help_centre", command=[sys.executable, "-m", "supportdesk.help_centre"])

status_agent = quipu.Agent(
    id="status_agent",
    description="Says whether the shop's checkout, payments or shipping service is working now.",
    instructions=(
        "You check the shop's services on its status page and say plainly which are working, "
        "which are degraded and what that means for a customer."
    ),
    tools=[service_status],
    max_steps=4,
)

desk = quipu.Agent(
    id="desk",
    description="The shop's support desk.",
    instructions=(
        "You are the support desk of an online shop. Answer from the help centre's articles; when "
        "something may be broken on our side, ask the status_agent; when a customer's problem needs "
        "a person, open a ticket and give its id. Never promise what an article does not say."
    ),
    tools=[open_ticket, "search_articles", status_agent],
    max_steps=8,
)

app = quipu.App(agents=[desk, status_agent], toolsets=[tickets, status, help_centre])
