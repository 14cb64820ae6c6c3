"""The `status` toolset: whether one of the shop's services is up, asked of its status page over HTTP.

A network call can be slow, so the toolset runs apart from the others (`quipu serve tools --app
supportdesk.status:status` adds copies) and the call keeps to its deadline: it gives up a moment
before the executor would, with an answer the model can act on. A canceled run needs nothing here:
the executor cancels an `async` tool's task, which interrupts the request where it waits.
"""

from __future__ import annotations

import asyncio
import math
from typing import Literal

import httpx

from quipu import ToolContext, ToolError, Toolset
from supportdesk.settings import DeskSettings

status = Toolset("status", version="1")

Service = Literal["checkout", "payments", "shipping"]

MARGIN_S = 0.5
"""How long before the executor's deadline the call gives up, to answer with its own reason."""

LONGEST_WAIT_S = 10.0
"""The longest the call waits outside an executor (where there is no deadline)."""


@status.tool(timeout_s=15.0, max_concurrency=8)
async def service_status(service: Service, context: ToolContext) -> str:
    """Whether one of the shop's services is working now, from the shop's status page.

    Args:
        service: Which service: checkout (the basket and the order form), payments or shipping.
    """
    url = f"{DeskSettings().status_url.rstrip('/')}/status/{service}"
    left = context.seconds_left()
    budget = LONGEST_WAIT_S if math.isinf(left) else left - MARGIN_S
    try:
        async with asyncio.timeout(max(budget, 0.0)), httpx.AsyncClient() as client:
            response = await client.get(url)
            response.raise_for_status()
    except TimeoutError:
        raise ToolError(f"the status page did not answer about {service} in time; try again later") from None
    except httpx.HTTPError as error:
        raise ToolError(f"the status page could not be read ({type(error).__name__})") from None
    state = response.json()
    return f"{service} is {state['state']}: {state['note']}"
