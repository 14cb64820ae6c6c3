"""Pipelined starts: a run's start sent and not answered yet while its first step is decided.

A planner may send a run's start, call the model while the start is on its way, and send the
first step right behind it on the run's key (`Store.pipeline`), or the terminal when the first
answer closes the run. The step or terminal names the log it was decided on (`LogBasis`: the
start's records), so the owner refuses it with RUN_LOG_MOVED, and publishes none of its calls or
events, unless the start wrote exactly that log. `PipelinedStarts` keeps the starts under way:
what the first write assumed, the text deltas held until the start is known to have simply
succeeded, and how the run goes on when it did not (`StartMissedError`). Which runs are pipelined
is the orchestrator's decision; this module only carries one through.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from quipu.contracts.errors import QuipuError, StoreRefusedError
from quipu.contracts.store import LogBasis, RunStatus, StartOutcome, StartResult
from quipu.services.domain.store.protocol import Pipeline
from quipu.services.kit.publishing import all_taken, taken
from quipu.services.planner.adapters import Publisher
from quipu.services.planner.logic.actions import Output
from quipu.services.planner.logic.view import RunView

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

StartAnswer = StartResult | StoreRefusedError
"""What a start came to: its result, or the owner's refusal."""

GoOn = Callable[[StartAnswer], Awaitable[RunView | None]]
"""How a run goes on from its start's answer when the start did not simply succeed."""


def simply_started(result: StartResult) -> bool:
    """This start wrote the run and it is running: its log is the start's records and nothing else."""
    return (
        result.decision is StartOutcome.PROCEED
        and result.started.inserted
        and result.run_status is RunStatus.RUNNING
    )


async def start_answer(start: Awaitable[StartResult]) -> StartAnswer:
    """The start's result, or the owner's refusal of it."""
    try:
        return await start
    except StoreRefusedError as error:
        return error


class StartMissedError(QuipuError):
    """Raised inside a pipelined run's first steps when its start did not simply succeed (the
    session had ended, the parent closed, the start was refused or met an earlier attempt): what
    was decided on the assumed log is dropped, and the run goes on from the start's answer (`then`)."""

    def __init__(self, then: Callable[[], Awaitable[RunView | None]]) -> None:
        super().__init__("the pipelined start did not simply succeed")
        self.then = then


@dataclass
class PendingStart:
    """A start sent and not answered yet: the log its run's first step is decided on (`basis`),
    how the run goes on when the start did not simply succeed, and the text deltas held until it
    is known that it did."""

    reply: asyncio.Task[StartResult]
    basis: LogBasis
    then: GoOn
    publisher: Publisher
    held: list[Output] = field(default_factory=list)

    def succeeded(self) -> bool:
        """Whether the start is answered and simply succeeded."""
        reply = self.reply
        if not reply.done() or reply.cancelled() or reply.exception() is not None:
            return False
        return simply_started(reply.result())

    async def settle(self) -> None:
        """Wait for the start's answer: return when it simply succeeded (the deltas held meanwhile
        go out), else raise StartMissedError (they are dropped, never published)."""
        outcome = await start_answer(self.reply)
        if isinstance(outcome, StartResult) and simply_started(outcome):
            await all_taken(await self._release())
            return

        async def then() -> RunView | None:
            return await self.then(outcome)

        raise StartMissedError(then)

    async def ahead_of(self, write: Awaitable[T]) -> T:
        """`write` (the first step or terminal, following `basis`) sent behind the start: its
        result once the start simply succeeded. Else it is awaited all the same (refused by the
        owner, as its log is not the run's), so what is read next comes after it."""
        step = asyncio.ensure_future(write)
        try:
            await self.settle()
        except StartMissedError:
            with contextlib.suppress(StoreRefusedError):
                await step
            raise
        except BaseException:
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
            raise
        return await step

    async def say(self, delta: Output) -> Awaitable[None]:
        """Queue a text delta once the start is known to have simply succeeded (behind those held
        before it), with what waits for the broker to take it; hold it before."""
        if not self.succeeded():
            self.held.append(delta)
            return taken()
        released = await self._release()
        acknowledged = await self.publisher.queue(delta)
        return all_taken([*released, acknowledged])

    async def _release(self) -> list[Awaitable[None]]:
        """Queue the deltas held, in order: what waits for the broker to take each."""
        held, self.held = self.held, []
        return [await self.publisher.queue(message) for message in held]


class Following(Protocol[T_co]):
    """A write that can name the log it was decided on (a step, a terminal)."""

    def __call__(self, *, follows: LogBasis | None) -> Awaitable[T_co]:
        """The write, following `follows` (None: no log, the write is unconditional)."""
        ...


class PipelinedStarts:
    """The starts under way in this planner, one per run, while their first step is decided.

    `begin` puts a start under way; the run's first write takes it: a step or a terminal is sent
    `behind` it, following the start's records, any other write comes `after` it (settled first).
    `say` holds a run's text deltas while its start is unanswered; `drop` cancels a start whose
    handling ended before any write.
    """

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self._pending: dict[str, PendingStart] = {}

    async def begin(
        self, run_id: str, start: Awaitable[StartResult], via: Pipeline, basis: LogBasis, then: GoOn
    ) -> None:
        """Send `start` through `via` without awaiting its answer; the run's first step follows
        `basis`, and the run goes on with `then` when the start did not simply succeed."""
        reply = await via.sent(start)
        self._pending[run_id] = PendingStart(reply, basis, then, self._publisher)

    async def behind(self, run_id: str, write: Following[T]) -> T:
        """`write`, sent right behind the run's start when that is under way (the run's first
        write, following the start's records: refused by the owner unless the start wrote exactly
        that log), else on its own, following no log."""
        pending = self._pending.pop(run_id, None)
        if pending is None:
            return await write(follows=None)
        return await pending.ahead_of(write(follows=pending.basis))

    async def after(self, run_id: str, write: Callable[[], Awaitable[T]]) -> T:
        """`write` (one that names no log: a cancellation, a suspension), once the run's start
        under way, if any, is known to have simply succeeded (else StartMissedError)."""
        pending = self._pending.pop(run_id, None)
        if pending is not None:
            await pending.settle()
        return await write()

    async def say(self, run_id: str, delta: Output) -> Awaitable[None]:
        """Queue a text delta of the run, held while its pipelined start is not known to have
        simply succeeded (a run that never was this request's must not stream its words): what
        waits for the broker to take it (and those released with it)."""
        pending = self._pending.get(run_id)
        if pending is None:
            return await self._publisher.queue(delta)
        return await pending.say(delta)

    async def drop(self, run_id: str) -> None:
        """A request's handling ended with its start still under way (an error before any write)."""
        pending = self._pending.pop(run_id, None)
        if pending is not None:
            pending.reply.cancel()
            await asyncio.gather(pending.reply, return_exceptions=True)
