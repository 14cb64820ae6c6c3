"""The bench's own toolsets, each served by a dedicated executor in a child process (bench.fleet).

Every tool answers with the id of the process that ran it, so the bench can tell when every copy
of an executor has its share of the partitions.
"""

from __future__ import annotations

import asyncio
import os

from quipu.tools import Toolset

io_bound = Toolset("benchio", version="1")
"""Calls that wait on something outside (a remote API): the executor only awaits them."""

slow = Toolset("benchslow", version="1")
"""A toolset whose calls take seconds; it must not delay any other toolset's calls."""

fast = Toolset("benchfast", version="1")
"""A toolset whose calls are instant."""


@io_bound.tool(timeout_s=30.0)
async def wait_io(milliseconds: int) -> str:
    """Waits as a call to a remote service would, then names the process that answered.

    Args:
        milliseconds: How long the remote service takes.
    """
    await asyncio.sleep(milliseconds / 1000)
    return str(os.getpid())


@slow.tool(timeout_s=60.0)
async def crunch(milliseconds: int) -> str:
    """Takes a long time (an I/O-bound wait), then names the process that answered.

    Args:
        milliseconds: How long it takes.
    """
    await asyncio.sleep(milliseconds / 1000)
    return str(os.getpid())


@fast.tool(timeout_s=10.0)
async def echo(text: str) -> str:
    """Answers at once with its input and the process that answered.

    Args:
        text: Anything.
    """
    return f"{os.getpid()}:{text}"


TOOLSETS = {toolset.name: toolset for toolset in (io_bound, slow, fast)}
