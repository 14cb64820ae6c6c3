"""`quipu` without a broker: argument parsing, where it finds Kafka, and how events are shown.

Commands against a real owner and planner are in tests/e2e/test_cli.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from quipu.agents import Agent
from quipu.app import App
from quipu.contracts.events import RunEvent, StreamEventType, capped_value
from quipu.contracts.store import RunMeta, RunStatus, SessionOwner, StartOutcome
from quipu.contracts.wire import utc_now_ms
from quipu.services import cli
from quipu.services.cli import app, client, launch, render, state
from quipu.services.cli import apps as cli_apps
from quipu.services.cli import output as cli_output
from quipu.services.cli.apps import readiness, toolset_consumers
from quipu.services.cli.render import EventPrinter
from quipu.services.cli.settings import CliSettings
from quipu.services.domain.toolset_registry import announce
from quipu.services.kit.settings import KafkaSettings
from quipu.tools import Toolset
from tests.timing import scaled

runner = CliRunner()

NO_KAFKA = {"QUIPU_KAFKA_BOOTSTRAP": ""}


def invoke(*args: str, state_file: Path | None = None, **env: str) -> Any:
    environment = {**NO_KAFKA, **env}
    if state_file is not None:
        environment[state.STATE_FILE_ENV] = str(state_file)
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
    assert cli.parse_answer('{"ok": true}', as_json=True) == {"ok": True}
    assert cli.parse_answer('{"ok": true}', as_json=False) == '{"ok": true}'


def test_without_kafka_a_client_command_says_how_to_get_one(tmp_path: Path) -> None:
    result = invoke("sessions", "end", "s-1", state_file=tmp_path / "none.json")
    assert result.exit_code == 1
    assert "quipu up" in result.output and "QUIPU_KAFKA_BOOTSTRAP" in result.output


def test_settings_come_from_the_state_of_a_running_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "up.json"
    monkeypatch.setenv(state.STATE_FILE_ENV, str(path))
    monkeypatch.delenv("QUIPU_KAFKA_BOOTSTRAP", raising=False)
    environment = {
        "QUIPU_KAFKA_BOOTSTRAP": "127.0.0.1:1234",
        "QUIPU_KAFKA_FLAVOUR": "tansu",
        "QUIPU_KAFKA_TOPIC_PREFIX": "p.",
    }
    path.write_text(json.dumps({"pid": os.getpid(), "environment": environment}))
    settings = state.client_settings()
    assert (settings.bootstrap, settings.flavour, settings.topic_prefix) == ("127.0.0.1:1234", "tansu", "p.")
    assert settings.fetch_max_wait_ms == 10  # the Tansu values follow the flavour

    path.write_text(json.dumps({"pid": 2**22 + 12345, "environment": environment}))  # a dead process
    assert state.read_state() is None
    path.write_text("{half")
    assert state.read_state() is None


def test_the_environment_wins_over_the_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "up.json"
    path.write_text(json.dumps({"pid": os.getpid(), "environment": {"QUIPU_KAFKA_BOOTSTRAP": "a:1"}}))
    monkeypatch.setenv(state.STATE_FILE_ENV, str(path))
    monkeypatch.setenv("QUIPU_KAFKA_BOOTSTRAP", "b:2")
    assert state.client_settings().bootstrap == "b:2"


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
    assert client.choices_of(asked) == ["yes", "no"]
    assert client.choices_of(event(StreamEventType.AWAIT_QUESTIONS, "a", {"choices": [1, 2]})) == []


# --- starting fast ------------------------------------------------------------------------------------

HEAVY = (
    "aiokafka",
    "faststream",
    "pydantic_settings",
    "quipu.services.kit",
    "quipu.services.gateway",
    "contracts",
    "rich.markdown",
)
"""What `quipu --help` or a mistyped command must not import: a command imports what it does when it runs."""


@pytest.mark.parametrize("argv", [["--help"], ["no-such-command"], ["sessions", "--help"]])
def test_help_and_a_mistyped_command_do_not_import_the_runtime(argv: list[str]) -> None:
    probe = (
        "import sys\n"
        "from quipu.services.cli import app\n"
        "try:\n"
        f"    app({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=scaled(60), check=False
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


# --- the message, from an argument, stdin or a file ---------------------------------------------------


def test_the_message_comes_from_the_argument_a_file_or_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("x" * 200_000 + "\n")
    assert cli.message_text(None, prompt) == "x" * 200_000  # the editor's final newline dropped
    assert cli.message_text("hello", None) == "hello"
    monkeypatch.setattr(sys, "stdin", io.StringIO("from a pipe\n\n"))
    assert cli.message_text("-", None) == "from a pipe\n"
    with pytest.raises(typer.BadParameter, match="not both"):
        cli.message_text("hello", prompt)
    prompt.write_text("  \n")
    with pytest.raises(typer.BadParameter, match="empty"):
        cli.message_text(None, prompt)


def test_run_reads_stdin_when_told_to(tmp_path: Path) -> None:
    empty = runner.invoke(
        app, ["run", "-"], input="\n", env={**NO_KAFKA, state.STATE_FILE_ENV: str(tmp_path / "n")}
    )
    assert empty.exit_code == 2 and "the message is empty" in empty.output
    missing = invoke("run", "--file", str(tmp_path / "nope.txt"), state_file=tmp_path / "n")
    assert missing.exit_code == 2 and "cannot read" in missing.output


# --- which stack, and `quipu up`'s start-up edges -----------------------------------------------------


def test_a_client_says_which_stack_it_talks_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "up.json"
    monkeypatch.setenv(state.STATE_FILE_ENV, str(path))
    monkeypatch.delenv("QUIPU_KAFKA_BOOTSTRAP", raising=False)
    path.write_text(json.dumps({"pid": os.getpid(), "environment": {"QUIPU_KAFKA_BOOTSTRAP": "127.0.0.1:9"}}))
    state.client_settings()
    said = capsys.readouterr().err
    assert f"stack: quipu up (pid {os.getpid()}, {path})" in said and "kafka 127.0.0.1:9" in said


def test_up_refuses_to_take_over_a_live_stack(tmp_path: Path) -> None:
    path = tmp_path / "up.json"
    path.write_text(json.dumps({"pid": os.getpid(), "environment": {"QUIPU_KAFKA_BOOTSTRAP": "127.0.0.1:9"}}))
    result = invoke("up", "--gateway-port", "0", state_file=path)
    assert result.exit_code == 1, result.output
    assert f"another `quipu up` (pid {os.getpid()}) is running" in result.output
    assert "QUIPU_STATE_FILE=" in result.output
    assert json.loads(path.read_text())["pid"] == os.getpid()  # the live stack's file is left alone


@pytest.mark.parametrize("processes", [False, True])
def test_up_fails_fast_when_the_gateway_port_is_taken(tmp_path: Path, processes: bool) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke(
            "up",
            "--gateway-port",
            str(port),
            *(["--processes"] if processes else []),
            state_file=tmp_path / "up.json",
        )
    assert result.exit_code == 1, result.output
    assert f"port {port} is taken" in result.output and "--gateway-port 0" in result.output
    assert "starting the embedded broker" not in result.output
    assert not (tmp_path / "up.json").exists()


def test_the_command_shown_is_one_that_works_here(monkeypatch: pytest.MonkeyPatch) -> None:
    script = Path(sys.executable).parent / "quipu"
    monkeypatch.setenv("PATH", "/nonexistent")
    shown = launch.quipu_command()
    if script.exists():
        assert Path(shown).resolve() == script.resolve() and os.access(shown, os.X_OK)
    else:
        assert shown == f"{sys.executable} -m quipu.services.cli"
    monkeypatch.setenv("PATH", str(script.parent))
    module_command = f"{sys.executable} -m quipu.services.cli"
    assert launch.quipu_command() == ("quipu" if script.exists() else module_command)


# --- ids whole, counts per status ---------------------------------------------------------------------


def test_run_ids_are_never_cut_at_80_columns() -> None:
    run_id = "0f8c2a8e-6b1d-4c59-9a0e-3f1d2b7c9e41"
    metas = [
        RunMeta(
            run_id=run_id if index == 0 else f"{run_id[:-2]}x{index}",
            agent_id="a-rather-long-agent-name",
            session_id="s-1",
            parent_run_id="",
            started_at=utc_now_ms(),
            labels={},
            status=status,
            start_outcome=StartOutcome.PROCEED,
            successor_run_id="",
            cancellation_reason="",
            updated_at=utc_now_ms(),
        )
        for index, status in enumerate([RunStatus.COMPLETED, RunStatus.COMPLETED, RunStatus.SUSPENDED])
    ]
    out = io.StringIO()
    terminal = Console(file=out, width=80, color_system=None)
    terminal.print(render.runs_table(metas))
    terminal.print(render.meta_lines(metas[0]))
    text = out.getvalue()
    assert text.count(run_id) == 2, text
    assert "2 completed, 1 suspended" in text
    printer = EventPrinter(terminal)
    long_id = "child-" + run_id + "-" + run_id
    printer.show(event(StreamEventType.CHILD_RUN_LINKED, "l", {"tool_name": "ask", "child_run_id": long_id}))
    assert long_id in out.getvalue().replace("\n", "") and long_id in out.getvalue()


def test_runs_are_counted_per_status() -> None:
    assert render.count_by_status(["completed", "suspended", "completed", "failed"]) == (
        "2 completed, 1 failed, 1 suspended"
    )
    assert render.count_by_status([]) == ""


# --- hints say what was observed ----------------------------------------------------------------------


class SilentReader:
    """A stream with no event at all."""

    async def read(self, timeout_s: float = 1.0) -> list[Any]:
        await asyncio.sleep(min(timeout_s, 0.05))
        return []


async def test_a_silent_run_says_what_the_planner_group_shows(capsys: pytest.CaptureFixture[str]) -> None:
    async def diagnosis() -> str:
        return "no planner is consuming (group planner-requests on runs.requested has no member)"

    follower = client.RunFollower(
        SilentReader(),  # type: ignore[arg-type]
        EventPrinter(Console(file=io.StringIO())),
        quiet_diagnosis=diagnosis,
    )
    with pytest.raises(cli_output.CliError, match=r"did not finish within 0\.6 s"):
        await follower.until_closed("run-1", timeout_s=0.6, hint_after_s=0.2)
    said = capsys.readouterr().err
    assert (
        "no event of the run after" in said
        and "group planner-requests on runs.requested has no member" in said
    )

    guessing = client.RunFollower(SilentReader(), EventPrinter(Console(file=io.StringIO())))  # type: ignore[arg-type]
    with pytest.raises(cli_output.CliError):
        await guessing.until_closed("run-1", timeout_s=0.6, hint_after_s=0.2)
    assert "is the planner running" not in capsys.readouterr().err  # no guess without an observation


def test_the_store_timeouts_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIPU_CLI_STORE_REPLY_TIMEOUT_S", "30")
    monkeypatch.setenv("QUIPU_CLI_STORE_ATTEMPTS", "5")
    settings = CliSettings()
    store = client.store_client(KafkaSettings(bootstrap="127.0.0.1:9"), settings)
    assert (store._reply_timeout_s, store._attempts) == (30.0, 5)


def test_a_tool_end_says_which_tool_how_it_ended_how_long_and_what_it_returned() -> None:
    long = {"rows": [f"row-{n}" for n in range(40)]}
    text = shown(
        event(
            StreamEventType.TOOL_END,
            "t1",
            {
                "tool_use_id": "u1",
                "tool_name": "calculator",
                "is_error": False,
                "result": 42,
                "duration_ms": 12,
            },
        ),
        event(
            StreamEventType.TOOL_END,
            "t2",
            {"tool_name": "weather", "is_error": True, "result": "no such\ncity", "duration_ms": 1500},
        ),
        event(StreamEventType.TOOL_END, "t3", {"tool_name": "search", "result": long, "duration_ms": 3}),
        event(StreamEventType.TOOL_END, "t4", {"tool_name": "fetch", "result": capped_value("x" * 99_999)}),
    )
    first, second, third, fourth = text.splitlines()
    assert first == "⚙ calculator ok 12 ms → 42"
    assert second == "⚙ weather error 1,500 ms → no such city"
    assert third.startswith('⚙ search ok 3 ms → {"rows":["row-0",') and third.endswith("…")
    assert len(third) < 120
    assert fourth.startswith('⚙ fetch ok → "xxx') and fourth.endswith("…") and len(fourth) < 120


def test_a_turn_refused_as_someone_elses_session_says_to_pass_the_right_principal() -> None:
    refused = {
        "phase": "failed",
        "status": "failed",
        "failure": {
            "message": "session s-1 belongs to another principal",
            "kind": "SESSION_PRINCIPAL_MISMATCH",
        },
    }
    [line] = shown(event(StreamEventType.WORKFLOW, "refused", refused)).splitlines()
    assert line.startswith("✗ refused: this session belongs to another principal") and "--principal" in line


def test_a_purge_names_the_owner_of_the_facts_that_stay_when_it_is_known() -> None:
    owned = render.facts_outlive_purge(SessionOwner(tenant_id="t1", principal_id="ana")).plain
    assert owned.startswith("facts learned in it stay in ana's memory: `quipu memory list ana --tenant t1`")
    anonymous = render.facts_outlive_purge(None).plain
    assert "the person's memory" in anonymous and "`quipu memory list PRINCIPAL`" in anonymous


# --- --app: the user's App ----------------------------------------------------------------------------


def test_the_help_says_what_app_and_toolset_take() -> None:
    serve = invoke("serve", "--help")
    assert serve.exit_code == 0
    for said in ("--app MODULE:ATTRIBUTE", "--toolset NAME", "tools (a toolset of --app)", "mypkg.app:app"):
        assert said in serve.output, serve.output
    up = invoke("up", "--help")
    assert "--app MODULE:ATTRIBUTE" in up.output and "quipu.App" in up.output, up.output


def test_up_with_an_app_that_does_not_load_fails_before_anything_starts(tmp_path: Path) -> None:
    result = invoke("up", "--app", "nowhere_to_be_found:app", state_file=tmp_path / "up.json")
    assert result.exit_code == 1, result.output
    assert "--app nowhere_to_be_found:app: no module 'nowhere_to_be_found'" in result.output
    assert "starting the embedded broker" not in result.output
    assert not (tmp_path / "up.json").exists()


def test_serve_tools_needs_an_app_and_other_services_refuse_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "two_toolsets.py").write_text(
        "import quipu\napp = quipu.App(toolsets=[quipu.Toolset('maps'), quipu.Toolset('files')])\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    bare = invoke("serve", "tools")
    assert bare.exit_code == 1 and "give --app MODULE:ATTRIBUTE" in bare.output, bare.output
    which = invoke("serve", "tools", "--app", "two_toolsets:app")
    assert which.exit_code == 1 and "2 toolsets (maps, files); name one (--toolset)" in which.output
    missing = invoke("serve", "tools", "--app", "two_toolsets:app", "--toolset", "mail")
    assert missing.exit_code == 1 and "no toolset 'mail'; it has: maps, files" in missing.output
    planner = invoke("serve", "planner", "--app", "two_toolsets:app")
    assert planner.exit_code == 2 and "planner needs no user code" in planner.output


def test_up_processes_runs_each_toolset_as_the_command_a_user_would() -> None:
    app = App(toolsets=[Toolset("maps"), Toolset("files")])
    services = launch.supervised_services("mypkg.app:app", app)
    names = [name for name, _ in services]
    assert names[-1] == "gateway" and names.index("tools-maps") > names.index("tool_executor")
    assert dict(services)["tools-files"] == (
        "-m",
        "quipu.services.cli",
        "serve",
        "tools",
        "--app",
        "mypkg.app:app",
        "--toolset",
        "files",
    )
    assert dict(services)["planner"] == "quipu.services.planner"  # the planner takes no user code


def test_status_measures_the_group_of_each_toolset_up_runs() -> None:
    [weather] = toolset_consumers({"toolsets": ["weather"]})
    assert (weather.service, weather.group, weather.topic_name) == (
        "tools-weather",
        "tool-executor-weather",
        "tools.calls.weather",
    )
    assert toolset_consumers(None) == () == toolset_consumers({})


def test_up_names_what_keeps_an_app_from_its_runs() -> None:
    maps = Toolset("maps")

    @maps.tool
    def distance(origin: str, destination: str) -> float:
        """Kilometres between two places."""
        return 1.0

    class Served:  # a toolset whose tools only its server knows (an MCP server)
        name, version = "files", "1"

        def tool_names(self) -> frozenset[str] | None:
            return None

    walker = Agent(id="walker", instructions="You walk.", tools=[distance, "read_file", "grep"])
    app = App(agents=[walker], toolsets=[maps, Served()])
    maps_announced = announce("maps", "1", maps.catalog(), at=utc_now_ms())
    assert readiness(app, {"maps": maps_announced}) == [
        "not announced (its executor is still starting?): files"
    ]
    files = Toolset("files")
    files.tool(name="read_file", description="Reads a file.")(distance.function)
    files_announced = announce("files", "1", files.catalog(), at=utc_now_ms())
    assert readiness(app, {"maps": maps_announced, "files": files_announced}) == [
        "agent 'walker' names tools no toolset announced: grep"
    ]


def test_a_service_started_by_hand_finds_the_running_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "up.json"
    monkeypatch.setenv(state.STATE_FILE_ENV, str(path))
    for name in (*state.SERVICE_ENVIRONMENT, "QUIPU_MONGO_URI"):
        monkeypatch.setenv(name, "")  # recorded, so what the test sets is undone afterwards
        monkeypatch.delenv(name)
    assert state.adopt_running_stack() is None  # nothing runs: the service's own settings stand
    environment = {
        "QUIPU_KAFKA_BOOTSTRAP": "127.0.0.1:1234",
        "QUIPU_KAFKA_TOPIC_PREFIX": "p.",
        "QUIPU_KEYS_URL": "http://127.0.0.1:9",
        "QUIPU_MONGO_URI": "mongodb://127.0.0.1:9/",
    }
    path.write_text(json.dumps({"pid": os.getpid(), "environment": environment}))
    assert state.adopt_running_stack() == f"quipu up (pid {os.getpid()}, {state.shown_path(path)})"
    settings = KafkaSettings()
    assert (settings.bootstrap, settings.topic_prefix) == ("127.0.0.1:1234", "p.")
    assert os.environ["QUIPU_KEYS_URL"] == "http://127.0.0.1:9"
    assert "QUIPU_MONGO_URI" not in os.environ  # a tool executor never holds the database's address

    monkeypatch.setenv("QUIPU_KAFKA_BOOTSTRAP", "elsewhere:9092")
    assert state.adopt_running_stack() is None  # the environment wins


def test_quipu_serve_mcp_finds_the_running_up_like_serve_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "up.json"
    monkeypatch.setenv(state.STATE_FILE_ENV, str(path))
    for name in state.SERVICE_ENVIRONMENT:
        monkeypatch.setenv(name, "")  # recorded, so what the test sets is undone afterwards
        monkeypatch.delenv(name)
    environment = {"QUIPU_KAFKA_BOOTSTRAP": "127.0.0.1:1234", "QUIPU_KEYS_URL": "http://127.0.0.1:9"}
    path.write_text(json.dumps({"pid": os.getpid(), "environment": environment}))
    served: list[tuple[str, str]] = []

    class Definition:
        def main(self) -> None:
            served.append((os.environ["QUIPU_KAFKA_BOOTSTRAP"], os.environ["QUIPU_KEYS_URL"]))

    monkeypatch.setattr(cli_apps, "toolset_definition", lambda toolset: Definition())
    cli_apps.serve_mcp("files", None, [sys.executable, "-m", "server"], "1", 10.0)
    assert served == [("127.0.0.1:1234", "http://127.0.0.1:9")]
