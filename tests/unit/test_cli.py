"""`quipu` without a broker: argument parsing, where it finds Kafka, and how events are shown.

Commands against a real owner and planner are in tests/e2e/test_cli.py.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from contracts.events import RunEvent, StreamEventType
from contracts.wire import utc_now_ms
from services import cli
from services.cli import EventPrinter, app

runner = CliRunner()

NO_KAFKA = {"QUIPU_KAFKA_BOOTSTRAP": ""}


def invoke(*args: str, state_file: Path | None = None, **env: str) -> Any:
    environment = {**NO_KAFKA, **env}
    if state_file is not None:
        environment[cli.STATE_FILE_ENV] = str(state_file)
    return runner.invoke(app, list(args), env=environment)


def test_help_lists_every_command() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("up", "serve", "run", "answer", "cancel", "runs", "sessions"):
        assert command in result.output
    sessions = invoke("sessions", "--help")
    assert all(name in sessions.output for name in ("end", "purge", "show"))


@pytest.mark.parametrize(
    "args",
    [
        ("run",),
        ("answer", "run-1"),
        ("sessions", "end"),
        ("runs", "show"),
        ("run", "hi", "--timeout", "0"),
        ("cancel", "run-1", "--reason", "because"),
        ("serve", "no-such-service"),
    ],
)
def test_bad_arguments_are_usage_errors(args: tuple[str, ...], tmp_path: Path) -> None:
    result = invoke(*args, state_file=tmp_path / "none.json")
    assert result.exit_code == 2, result.output


def test_an_answer_given_as_json_must_be_json(tmp_path: Path) -> None:
    result = invoke("answer", "run-1", "{not json", "--json", state_file=tmp_path / "none.json")
    assert result.exit_code == 2 and "not JSON" in result.output
    assert cli._parse_answer('{"ok": true}', as_json=True) == {"ok": True}
    assert cli._parse_answer('{"ok": true}', as_json=False) == '{"ok": true}'


def test_without_kafka_a_client_command_says_how_to_get_one(tmp_path: Path) -> None:
    result = invoke("sessions", "end", "s-1", state_file=tmp_path / "none.json")
    assert result.exit_code == 1
    assert "quipu up" in result.output and "QUIPU_KAFKA_BOOTSTRAP" in result.output


def test_settings_come_from_the_state_of_a_running_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "up.json"
    monkeypatch.setenv(cli.STATE_FILE_ENV, str(state))
    monkeypatch.delenv("QUIPU_KAFKA_BOOTSTRAP", raising=False)
    environment = {
        "QUIPU_KAFKA_BOOTSTRAP": "127.0.0.1:1234",
        "QUIPU_KAFKA_FLAVOUR": "tansu",
        "QUIPU_KAFKA_TOPIC_PREFIX": "p.",
    }
    state.write_text(json.dumps({"pid": os.getpid(), "environment": environment}))
    settings = cli.client_settings()
    assert (settings.bootstrap, settings.flavour, settings.topic_prefix) == ("127.0.0.1:1234", "tansu", "p.")
    assert settings.fetch_max_wait_ms == 10  # the Tansu values follow the flavour

    state.write_text(json.dumps({"pid": 2**22 + 12345, "environment": environment}))  # a dead process
    assert cli.read_state() is None
    state.write_text("{half")
    assert cli.read_state() is None


def test_the_environment_wins_over_the_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "up.json"
    state.write_text(json.dumps({"pid": os.getpid(), "environment": {"QUIPU_KAFKA_BOOTSTRAP": "a:1"}}))
    monkeypatch.setenv(cli.STATE_FILE_ENV, str(state))
    monkeypatch.setenv("QUIPU_KAFKA_BOOTSTRAP", "b:2")
    assert cli.client_settings().bootstrap == "b:2"


# --- showing events -----------------------------------------------------------------------------------


def event(kind: StreamEventType, key: str, payload: dict[str, Any], run_id: str = "run-1") -> RunEvent:
    return RunEvent(
        type=kind, event_key=key, run_id=run_id, session_id="s-1", timestamp=utc_now_ms(), payload=payload
    )


def shown(*events: RunEvent) -> str:
    out = io.StringIO()
    printer = EventPrinter(Console(file=out, width=200, color_system=None))
    for item in events:
        printer.show(item)
    printer.end_inline()
    return out.getvalue()


def turn(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"message": {"role": "assistant", "parts": list(parts)}}


def test_streamed_reply_is_written_inline_and_not_repeated_by_the_turn() -> None:
    text = shown(
        event(StreamEventType.WORKFLOW, "p", {"phase": "planning"}),
        event(StreamEventType.ASSISTANT_REPLY, "d0", {"text": "Hello ", "step": 1, "index": 0}),
        event(StreamEventType.ASSISTANT_REPLY, "d1", {"text": "there.", "step": 1, "index": 1}),
        event(StreamEventType.ASSISTANT_TURN, "t", turn({"kind": "text", "text": "Hello there."})),
        event(StreamEventType.WORKFLOW, "c", {"phase": "completed", "status": "success"}),
        event(StreamEventType.RUN_STREAM_END, "e", {}),
    )
    assert text == "· planning\nHello there.\n✓ completed\n"


def test_a_completed_run_says_the_tokens_its_model_calls_took() -> None:
    text = shown(
        event(StreamEventType.USAGE, "s1", {"input_tokens": 1200, "output_tokens": 30, "model": "m"}),
        event(StreamEventType.USAGE, "s2", {"input_tokens": 1300, "output_tokens": 12, "model": "m"}),
        event(StreamEventType.USAGE, "other", {"input_tokens": 5, "output_tokens": 5}, run_id="run-2"),
        event(StreamEventType.WORKFLOW, "c", {"phase": "completed", "status": "success"}),
    )
    assert text == "✓ completed  2,500 tokens in, 42 out\n"


def test_a_phase_change_in_the_middle_of_a_reply_waits_for_the_line_to_end() -> None:
    text = shown(
        event(StreamEventType.ASSISTANT_REPLY, "d0", {"text": "The calculator "}),
        event(StreamEventType.WORKFLOW, "p", {"phase": "synthesizing"}),
        event(StreamEventType.ASSISTANT_REPLY, "d1", {"text": "says 42."}),
        event(StreamEventType.ASSISTANT_TURN, "t", turn({"kind": "text", "text": "The calculator says 42."})),
    )
    assert text == "The calculator says 42.\n· synthesizing\n"


def test_a_turn_without_deltas_shows_its_text_and_tool_uses() -> None:
    text = shown(
        event(
            StreamEventType.ASSISTANT_TURN,
            "t",
            turn(
                {"kind": "thinking", "text": "hmm", "signature": "x"},
                {"kind": "text", "text": "Let me check."},
                {"kind": "tool_use", "id": "c1", "name": "current_time", "input": {"zone": "UTC"}},
            ),
        )
    )
    assert text == 'Let me check.\n→ current_time {"zone":"UTC"}\n'


def test_endings_questions_and_links() -> None:
    failed = {"phase": "failed", "status": "failed", "failure": {"message": "model down"}}
    canceled = {"phase": "canceled", "status": "canceled", "cancellation": {"reason": "user_requested"}}
    text = shown(
        event(StreamEventType.WORKFLOW, "f", failed),
        event(StreamEventType.WORKFLOW, "c", canceled),
        event(StreamEventType.WORKFLOW, "s", {"phase": "suspended", "status": "suspended"}),
        event(StreamEventType.AWAIT_CLARIFICATION, "a", {"prompt": "Which city?", "tool_use_id": "u1"}),
        event(
            StreamEventType.CHILD_RUN_LINKED,
            "l",
            {
                "tool_name": "math_agent",
                "tool_call_id": "c1",
                "child_run_id": "r2",
                "child_agent_id": "math_agent",
            },
        ),
        event(StreamEventType.PROMPT_RENDERED, "r", {"tokens": 3}),
    )
    assert text.splitlines() == [
        "✗ failed: model down",
        "✗ canceled (user_requested)",
        "⏸ waiting for an answer",
        "? Which city?",
        "↳ math_agent: child run r2 (math_agent)",
        '· prompt_rendered {"tokens":3}',
    ]


def test_model_text_is_not_read_as_markup() -> None:
    assert (
        shown(event(StreamEventType.ASSISTANT_REPLY, "d", {"text": "[bold]x[/bold]"})) == "[bold]x[/bold]\n"
    )


def test_choices_are_found_in_the_payload_or_its_details() -> None:
    asked = event(
        StreamEventType.AWAIT_CLARIFICATION, "a", {"prompt": "ok?", "details": {"choices": ["yes", "no"]}}
    )
    assert cli._choices(asked) == ["yes", "no"]
    assert cli._choices(event(StreamEventType.AWAIT_QUESTIONS, "a", {"choices": [1, 2]})) == []
