"""Conversation memory over a long session: is the model's input bounded, is each message summarised once?

One session of `TURNS` turns runs through the real planner (`Planner` on the in-memory runtime
store, context from `MemoryContextSource` over the in-memory `MemoryStore`) and the real
transcript recorder logic (each `TurnCompleted` the planner publishes is recorded and folded
before the next turn starts). The model is the offline `ScriptedModel`, summaries included: its
extractive summary (the key sentences of what is folded, the newest first) grows until the cap
holds it, as a real model's would.

In-memory stores are deliberate: these figures are about what the model is sent (token counts
by the local estimate) and how often the summarizer reads each message, not about broker or
database speed, and a 1,000-turn session runs in seconds this way.

Figures:

- `context_tokens_turn20`, `context_tokens_turn1000`: input tokens of the first model request
  of turn 20 and turn 1000 (system prompt, tools, memory blocks, window, the user's words);
- `context_ratio_turn1000_vs_turn20`: their ratio (target ≤ 1.1);
- `summary_input_tokens_per_turn_p50`: median input tokens of the summarizer call a turn makes
  (each turn past the window folds one turn);
- `summary_reads_per_message_max`: most times any history row was given to the summarizer (1).
"""

from __future__ import annotations

import hashlib
import re
import statistics
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field

from quipu.assistant import assistant
from quipu.contracts.agents import AgentDefinition
from quipu.contracts.runs import RunRequested, TurnCompleted
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.memory.context import MemoryContextSource
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.summary import Summarizer, read_summarizer_request
from quipu.services.domain.models.estimate import estimate_request_tokens
from quipu.services.domain.models.port import ModelRequest, ModelResponse, TextDelta
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.domain.toolset_registry import ToolsetRegistry
from quipu.services.kit.publishing import taken
from quipu.services.planner.adapters import PublishedTurns
from quipu.services.planner.logic.actions import Output
from quipu.services.planner.orchestrator import Planner, ReadyDeps
from quipu.services.planner.settings import PlannerSettings
from quipu.services.transcript_recorder.logic import TranscriptRecorder

TURNS = 1000
WINDOW = 12
SUMMARY_TOKENS = 300

AGENT = AgentDefinition(id="assistant", instructions=assistant.instructions)
"""The built-in assistant's instructions without tools: memory does not depend on tools, and
building five tool schemas per turn would make the run about schema generation, not memory."""

_TURN_MARK = re.compile(r"\bturn (\d+)\b")


def user_words(turn: int) -> str:
    """What the user says at turn `turn` (the same length every turn, so turns compare)."""
    return (
        f"This is turn {turn:04d}: please keep in mind that parcel {turn:04d} weighs "
        f"{turn % 97 + 3:02d} kilos and goes to warehouse {turn % 13 + 1:02d}."
    )


class CountingModel:
    """The scripted model, remembering the input tokens of every call and which turns each
    summarizer call read."""

    def __init__(self) -> None:
        self.inner = ScriptedModel()
        self.name = self.inner.name
        self.planner_tokens: dict[str, int] = {}
        """call_key -> input tokens, for the planner's calls."""
        self.summary_tokens: list[int] = []
        self.summary_reads: Counter[str] = Counter()
        """"<turn>/<role>" -> how many summarizer calls were given that message."""

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        tokens = estimate_request_tokens(request)
        fold = read_summarizer_request(request)
        if fold is not None:
            self.summary_tokens.append(tokens)
            for utterance in fold.new:
                for mark in dict.fromkeys(_TURN_MARK.findall(utterance.text)):
                    self.summary_reads[f"{int(mark)}/{utterance.role.value}"] += 1
        else:
            self.planner_tokens[request.call_key] = tokens
        return await self.inner.complete(request, on_text)

    async def count_tokens(self, request: ModelRequest) -> int:
        return await self.inner.count_tokens(request)


@dataclass
class Recording:
    """The planner's publisher: every finished turn goes straight to the recorder."""

    recorder: TranscriptRecorder
    turns: list[TurnCompleted] = field(default_factory=list)

    async def publish(self, message: Output) -> None:
        if isinstance(message, TurnCompleted):
            self.turns.append(message)
            await self.recorder.record(message)

    async def queue(self, message: Output) -> Awaitable[None]:
        await self.publish(message)
        return taken()


@dataclass
class LongConversation:
    """One session driven turn by turn through the planner and the recorder, in memory."""

    store: InMemoryStore
    memory: InMemoryMemoryStore
    model: CountingModel
    planner: Planner
    recording: Recording
    session_id: str
    run_ids: list[str] = field(default_factory=list)

    @classmethod
    async def start(cls, *, window: int = WINDOW, summary_tokens: int = SUMMARY_TOKENS) -> LongConversation:
        store, memory, model = InMemoryStore(), InMemoryMemoryStore(), CountingModel()
        recorder = TranscriptRecorder(memory, Summarizer(model, summary_tokens), window_messages=window)
        recording = Recording(recorder)
        published = PublishedTurns(recording, turns_per_session=window // 2)
        context = MemoryContextSource(memory, window_messages=window, recent_turns=published)
        deps = ReadyDeps(store, model, ToolsetRegistry(), AgentRegistry([AGENT]), context)  # no tools
        planner = Planner(deps, published, PlannerSettings(history_messages=window))
        session_id = "s-" + hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:10]
        await store.create_session(session_id, utc_now_ms())
        return cls(store, memory, model, planner, recording, session_id)

    async def turn(self, number: int) -> None:
        """Run turn `number` (from 1) to its end, recorded and folded."""
        run_id = f"{self.session_id}-t{number:05d}"
        self.run_ids.append(run_id)
        await self.planner.on_run_requested(
            RunRequested(
                run_id=run_id,
                session_id=self.session_id,
                agent_id="assistant",
                principal_id="bench-user",
                text=user_words(number),
            )
        )

    def input_tokens(self, number: int) -> int:
        """Input tokens of the first model call of turn `number`."""
        return self.model.planner_tokens[f"{self.run_ids[number - 1]}/step/1"]


async def run_conversation(turns: int = TURNS) -> tuple[LongConversation, float]:
    """Drive `turns` turns; the conversation and the seconds it took."""
    conversation = await LongConversation.start()
    started = time.perf_counter()
    for number in range(1, turns + 1):
        await conversation.turn(number)
    return conversation, time.perf_counter() - started


async def measure_memory(turns: int = TURNS) -> dict[str, float]:
    """The memory figures of `bench/results/latest.json`."""
    conversation, seconds = await run_conversation(turns)
    turn20, last = conversation.input_tokens(20), conversation.input_tokens(turns)
    reads = conversation.model.summary_reads
    return {
        "context_tokens_turn20": float(turn20),
        f"context_tokens_turn{turns}": float(last),
        f"context_ratio_turn{turns}_vs_turn20": last / turn20,
        "summary_input_tokens_per_turn_p50": float(statistics.median(conversation.model.summary_tokens)),
        "summary_reads_per_message_max": float(max(reads.values())),
        "memory_conversation_turns_per_s": turns / seconds,
    }
