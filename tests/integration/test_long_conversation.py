"""A 1,000-turn conversation: the model's input stays bounded and every message is summarised once.

The real planner, context source and recorder logic drive one session turn by turn (the driver
is `bench.memory_bench`, so the test and the benchmark measure the same thing). In-memory
stores and the scripted model keep it to seconds of CPU: what is checked is what the model is
sent, not how fast a broker is.
"""

from __future__ import annotations

import pytest

from bench.memory_bench import WINDOW, run_conversation
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(scaled(300)))]

TURNS = 1000


async def test_a_thousand_turns_keep_the_input_bounded_and_summarise_each_message_once() -> None:
    conversation, seconds = await run_conversation(TURNS)
    print(f"{TURNS} turns in {seconds:.1f} s (the speed is `make bench`'s)")

    turn20, last = conversation.input_tokens(20), conversation.input_tokens(TURNS)
    print(f"input tokens: turn 20 {turn20}, turn {TURNS} {last} (x{last / turn20:.3f})")
    assert last <= 1.1 * turn20
    peak = max(conversation.input_tokens(number) for number in range(20, TURNS + 1))
    assert peak <= 1.1 * turn20

    window_turns = WINDOW // 2
    folded = {
        f"{number}/{side}" for number in range(1, TURNS - window_turns + 1) for side in ("user", "assistant")
    }
    reads = conversation.model.summary_reads
    assert set(reads) == folded  # the last window's turns are not folded yet; the rest are
    assert set(reads.values()) == {1}  # each exactly once

    summary = await conversation.memory.load_summary(conversation.session_id)
    assert summary is not None
    assert summary.cursor == 2 * (TURNS - window_turns)
    assert summary.version == TURNS - window_turns  # one fold per turn past the window
    rows = await conversation.memory.history_tail(conversation.session_id, 2)
    assert rows[-1].seq == 2 * TURNS
    # The work per turn stays bounded too: a fold reads the summary and the new messages, never
    # the history so far, so the late folds are no bigger than the early ones.
    folds = conversation.model.summary_tokens
    assert max(folds) <= 1.1 * max(folds[:100])
