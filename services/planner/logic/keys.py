"""A run's record types and keys, failure kinds, and the ids and times derived from them.

Record keys (per run; the store makes `(run_id, event_key)` unique):

| key | type | written when |
| --- | --- | --- |
| `started`, `stopped` | run_started, run_completed | the start (the store keeps one of them) |
| `context` | planner_context | after the start: principal, budgets, the parent's tool call |
| `memory-context` | memory_context | memory a new turn's context used: fact ids and versions, summary |
| `seed` | transcript_messages_seeded | history before the run (session turns, a predecessor) |
| `input` | transcript_messages_appended | the user's text, or the answer to a suspended tool use |
| `phase/<n>/<phase>` | run_phase_changed | planning / synthesizing before call n, executing_tools after |
| `step/<n>/assistant` | transcript_messages_appended | call n's message, parts in order, usage in meta |
| `step/<n>/compacted` | history_compacted | call n overflowed its budget: oldest history turns compacted |
| `tool-result/<tool_use_id>` | tool_result | one tool result as it arrives (first one wins) |
| `step/<n>/tool-results` | transcript_messages_appended | every result of call n's tool uses, in use order |
| `child/<tool_call_id>` | child_run_linked | on the parent, by the child's start |
| `cancel` | runtime.cancellation_intent | a CancelRun |
| `suspend/<tool_use_id>` | run_suspended | a tool waits for outside input |
| `completed`, `failed`, `canceled` | run_completed | the end |
"""

from __future__ import annotations

from quipu.contracts.envelope import derive_id
from quipu.contracts.events import RunPhase
from quipu.contracts.tools import TOOL_RESULT_RECORD

CONTEXT_TYPE = "planner_context"
"""Ordinary record (key `context`): principal, budgets and the parent's tool call of a run."""

TOOL_RESULT_TYPE = TOOL_RESULT_RECORD
"""Ordinary record (key `tool-result/<tool_use_id>`): one tool result as it arrived."""


MEMORY_CONTEXT_TYPE = "memory_context"
"""Ordinary record (key `memory-context`): the memory a turn's context used (facts, summary, window)."""

HISTORY_COMPACTED_TYPE = "history_compacted"
"""Ordinary record (key `step/<n>/compacted`): history dropped from call n and compacted into its summary."""

STARTED_KEY = "started"
STOPPED_KEY = "stopped"
CONTEXT_KEY = "context"
SEED_KEY = "seed"
MEMORY_CONTEXT_KEY = "memory-context"
INPUT_KEY = "input"
CANCEL_KEY = "cancel"
COMPLETED_KEY = "completed"
FAILED_KEY = "failed"
CANCELED_KEY = "canceled"

CHECKPOINT_VERSION = "1"
"""Version of the checkpoint JSON and of the `run_suspended` payload."""

BUDGET_EXHAUSTED = "budget_exhausted"
MODEL_ERROR = "model_error"
INVALID_TRANSCRIPT = "invalid_transcript"
INPUT_REQUIRED = "input_required"
CONTEXT_OVERFLOW = "context_overflow"
MISSING_TOOL = "missing_tool"
AGENT_REMOVED = "agent_removed"
"""Failure kinds the planner writes."""


def assistant_key(step: int) -> str:
    """Key of the assistant message of model call `step`."""
    return f"step/{step}/assistant"


def tool_results_key(step: int) -> str:
    """Key of the user message answering the tool uses of call `step`."""
    return f"step/{step}/tool-results"


def compacted_key(step: int) -> str:
    """Key of the compaction that made model call `step` fit its budget."""
    return f"step/{step}/compacted"


def tool_result_key(tool_use_id: str) -> str:
    """Key of one arrived tool result."""
    return f"tool-result/{tool_use_id}"


def phase_key(step: int, phase: RunPhase) -> str:
    """Key of a phase change around model call `step`."""
    return f"phase/{step}/{phase.value}"


def suspend_key(tool_use_id: str) -> str:
    """Key of the suspension waiting for the answer to `tool_use_id`."""
    return f"suspend/{tool_use_id}"


def link_key(tool_call_id: str, child_run_id: str, continuation: bool) -> str:
    """Key of `child_run_linked` on the parent; a child's continuation gets a key of its own."""
    return f"child/{tool_call_id}/{child_run_id}" if continuation else f"child/{tool_call_id}"


def child_run_id(parent_run_id: str, tool_use_id: str) -> str:
    """The run id of the child that answers an agent-tool use: the same on every redelivery."""
    return derive_id(parent_run_id, f"child/{tool_use_id}")
