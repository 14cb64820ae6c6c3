"""A run whose records the planner cannot read is a permanent failure that does not quote them.

The failure's message goes to the planner's log and the trigger's dead-letter header; a record's
payload is a person's words (and at rest, sealed), so the message names the record, never its
content.
"""

from __future__ import annotations

import json

import pytest

from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.kit.delivery import PermanentError, describe_error
from quipu.services.planner.adapters import load_view
from quipu.services.planner.logic.keys import CONTEXT_KEY, CONTEXT_TYPE
from tests.conformance.builders import ms, ordinary, root_start

WORDS = "my locker code is tangerine"


@pytest.mark.parametrize(
    ("record_type", "key", "payload"),
    [
        (CONTEXT_TYPE, CONTEXT_KEY, {"principal_id": "p", "max_steps": WORDS, "max_output_tokens": 10}),
        (
            TRANSCRIPT_MESSAGES_APPENDED,
            "input",
            [{"role": "user", "parts": [{"type": "text", "text": {WORDS: 1}}]}],
        ),
        (TRANSCRIPT_MESSAGES_APPENDED, "input", [{"role": WORDS, "parts": []}]),
    ],
)
async def test_an_unreadable_record_fails_the_run_for_good_without_its_content(
    record_type: str, key: str, payload: object
) -> None:
    store = InMemoryStore()
    session_id = "s-unreadable"
    await store.create_session(session_id, ms())
    start = root_start(session_id)
    await store.start_root_run(start.run, start.started, start.stopped)
    await store.append_run_record(
        ordinary(start.run, key, payload=json.dumps(payload).encode(), record_type=record_type)
    )
    with pytest.raises(PermanentError) as failed:
        await load_view(store, start.run.run_id)
    assert WORDS not in describe_error(failed.value)
    assert start.run.run_id in str(failed.value)  # which run it was stays said
