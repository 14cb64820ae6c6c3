"""`quipu` end to end: client commands against the real storage owner, and `quipu up` as a process.

Client commands run through typer's CliRunner in a worker thread (each command runs its own event
loop, as it does from a shell) while this test's loop serves the owner and the planner stand-in
of tests/integration/test_gateway_support.py. `quipu up` is started as a real process, used by a
`quipu run` process, and stopped with Ctrl-C (SIGINT).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.cli import app
from quipu.services.cli.state import STATE_FILE_ENV
from tests.integration.test_gateway_support import (
    QUESTION,
    ServedStack,
    StandInPlanner,
    eventually,
    unique_name,
)
from tests.owner_support import every_record_on_topics, readable_anywhere
from tests.timing import scaled

runner = CliRunner()


@pytest.fixture(scope="module")
async def served(stack: EmbeddedStack) -> AsyncIterator[ServedStack]:
    async with ServedStack(stack, unique_name()) as served:
        yield served


@pytest.fixture(scope="module")
async def planner(served: ServedStack) -> AsyncIterator[StandInPlanner]:
    async with StandInPlanner(served) as planner:
        yield planner


async def quipu(served: ServedStack, *args: str, input: str | None = None) -> Any:
    """Run one `quipu` command in a worker thread, pointed at the served stack."""
    env = {
        "QUIPU_KAFKA_BOOTSTRAP": served.stack.bootstrap,
        "QUIPU_KAFKA_FLAVOUR": "tansu",
        "QUIPU_KAFKA_TOPIC_PREFIX": served.prefix,
    }
    return await asyncio.to_thread(runner.invoke, app, list(args), input=input, env=env)


def session_id() -> str:
    return f"cli-test-{uuid.uuid4().hex[:10]}"


async def test_sessions_end_show_and_purge(served: ServedStack) -> None:
    session = session_id()
    await served.store.create_session(session, utc_now_ms())
    shown = await quipu(served, "sessions", "show", session)
    assert shown.exit_code == 0 and f"session {session}: active" in shown.output

    ended = await quipu(served, "sessions", "end", session)
    assert ended.exit_code == 0, ended.output
    assert f"session {session}: ended since" in ended.output
    assert (await served.store.load_session_status(session)).status.value == "ended"

    purged = await quipu(served, "sessions", "purge", session)
    assert purged.exit_code == 0 and "purged" in purged.output
    gone = await quipu(served, "sessions", "show", session)
    assert gone.exit_code == 1 and "SESSION_PURGED" in gone.output

    missing = await quipu(served, "sessions", "purge", "never-made")
    assert missing.exit_code == 1 and "SESSION_NOT_FOUND" in missing.output


async def test_purge_of_an_active_session_is_refused(served: ServedStack) -> None:
    session = session_id()
    await served.store.create_session(session, utc_now_ms())
    result = await quipu(served, "sessions", "purge", session)
    assert result.exit_code == 1 and "SESSION_ACTIVE" in result.output


async def test_run_shows_the_reply_live_and_exits_0(served: ServedStack, planner: StandInPlanner) -> None:
    session = session_id()
    result = await quipu(served, "run", "hello", "--session", session)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "· planning" in lines and "Hello there, friend." in lines and lines[-1].startswith("✓ completed")
    assert (await served.store.load_session_status(session)).status.value == "active"  # created for the run
    [request] = [r for r in planner.requests if r.session_id == session]
    assert (request.text, request.agent_id) == ("hello", "assistant")

    shown = await quipu(served, "runs", "show", request.run_id)
    assert shown.exit_code == 0
    assert "completed" in shown.output and "hello" in shown.output and "Hello there, friend." in shown.output


async def test_run_without_a_session_starts_one(served: ServedStack, planner: StandInPlanner) -> None:
    result = await quipu(served, "run", "hello", "--agent", "math_agent")
    assert result.exit_code == 0, result.output
    session = re.search(r"new session (\S+)", result.output)
    assert session is not None
    [request] = [r for r in planner.requests if r.session_id == session.group(1)]
    assert request.agent_id == "math_agent"


async def test_a_failed_run_exits_1(served: ServedStack, planner: StandInPlanner) -> None:
    result = await quipu(served, "run", "fail now", "--session", session_id())
    assert result.exit_code == 1
    assert "✗ failed: the model is unreachable" in result.output


async def test_a_suspended_run_is_answered_with_quipu_answer(
    served: ServedStack, planner: StandInPlanner
) -> None:
    session = session_id()
    asked = await quipu(served, "run", "ask me", "--session", session, "--no-interactive")
    assert asked.exit_code == 3, asked.output
    assert f"? {QUESTION}" in asked.output
    hint = re.search(r'quipu answer (\S+) "…"', asked.output)
    assert hint is not None
    run_id = hint.group(1)

    answered = await quipu(served, "answer", run_id, "Lima")
    assert answered.exit_code == 0, answered.output
    assert "Noted: Lima." in answered.output and "✓ completed" in answered.output
    again = await quipu(served, "answer", run_id, "Quito", "--no-follow")
    assert again.exit_code == 1 and "RUN_CONFLICT" in again.output


async def test_an_interactive_run_asks_and_resumes(served: ServedStack, planner: StandInPlanner) -> None:
    result = await quipu(served, "run", "ask me", "--session", session_id(), "--interactive", input="Quito\n")
    assert result.exit_code == 0, result.output
    assert f"? {QUESTION}" in result.output and "Noted: Quito." in result.output
    [resume] = [r for r in planner.requests if r.answer == "Quito"]
    assert resume.kind.value == "resume"


async def test_a_canceled_run_exits_1(served: ServedStack, planner: StandInPlanner) -> None:
    session = session_id()
    running = asyncio.ensure_future(quipu(served, "run", "wait for it", "--session", session))

    async def started() -> bool:
        return any(r.session_id == session for r in planner.requests) and not running.done()

    await eventually(started)
    [request] = [r for r in planner.requests if r.session_id == session]

    async def is_running() -> bool:
        try:
            return (await served.store.load_run(request.run_id)).status.value == "running"
        except Exception:
            return False

    await eventually(is_running)
    canceled = await quipu(served, "cancel", request.run_id)
    assert canceled.exit_code == 0, canceled.output
    result = await running
    assert result.exit_code == 1 and "✗ canceled (user_requested)" in result.output


async def test_a_run_in_an_ended_session_is_refused(served: ServedStack) -> None:
    session = session_id()
    await served.store.create_session(session, utc_now_ms())
    await served.store.end_session(session, utc_now_ms())
    result = await quipu(served, "run", "hello", "--session", session)
    assert result.exit_code == 1 and "SESSION_ENDED" in result.output


# --- quipu up as a process --------------------------------------------------------------------------


def _wait_for(path: Path, process: subprocess.Popen[bytes], within: float) -> dict[str, Any]:
    deadline = time.monotonic() + scaled(within)
    while time.monotonic() < deadline:
        assert process.poll() is None, "quipu up exited early"
        try:
            state: dict[str, Any] = json.loads(path.read_text())
            return state
        except (OSError, ValueError):
            time.sleep(0.1)
    raise AssertionError(f"quipu up did not write {path} within {within} s")


def _printed_key(log: Path, process: subprocess.Popen[bytes], within: float) -> str:
    """The local admin key `quipu up` printed (in the page's link)."""
    deadline = time.monotonic() + scaled(within)
    while time.monotonic() < deadline:
        assert process.poll() is None, "quipu up exited early"
        found = re.findall(r"#key=(qk_\S+)", log.read_text(errors="replace"))
        if found:
            return str(found[-1])
        time.sleep(0.1)
    raise AssertionError(f"quipu up printed no gateway key within {within} s")


WORD = "tamarind-7731"
"""A word of the turn `quipu up` serves: sealed on every topic it crosses."""


@pytest.mark.slow
def test_up_serves_a_run_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    state_file = tmp_path / "up.json"
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("QUIPU_KAFKA_", "QUIPU_MONGO_", "QUIPU_GATEWAY_"))
    }
    environment[STATE_FILE_ENV] = str(state_file)
    environment["QUIPU_GATEWAY_API_KEYS_FILE"] = str(tmp_path / "gateway-keys.json")
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "quipu.services.cli", "up", "--gateway-port", "0"],
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        state = _wait_for(state_file, up, within=60)
        assert state["pid"] == up.pid
        health = httpx.get(state["gateway_url"] + "/healthz", timeout=scaled(10))
        assert health.json() == {"status": "ok", "open_streams": 0}
        # One command is enough: `quipu up` issued itself an admin key and printed it.
        key = _printed_key(tmp_path / "up.log", up, within=30)
        unknown = f"{state['gateway_url']}/v1/sessions/none"
        assert httpx.get(unknown, timeout=scaled(10)).status_code == 401
        signed_in = httpx.get(unknown, headers={"Authorization": f"Bearer {key}"}, timeout=scaled(10))
        assert signed_in.json()["code"] == "SESSION_NOT_FOUND"
        if importlib.util.find_spec("quipu.services.planner") is not None:
            turn = subprocess.run(
                [sys.executable, "-m", "quipu.services.cli", "run", f"what time is it? {WORD}",
                 "--timeout", "60"],
                env=environment,
                capture_output=True,
                timeout=scaled(90),
                check=False,
            )
            output = turn.stdout.decode()
            assert turn.returncode == 0, output + turn.stderr.decode()
            assert output.rstrip().splitlines()[-1].startswith("✓ completed  ")  # then its tokens
            # The embedded default seals what it puts on its topics, as a deployment does: the
            # words went through every topic of the turn and are readable on none of them.
            environment_of_up: dict[str, str] = state["environment"]
            records = asyncio.run(every_record_on_topics(
                environment_of_up["QUIPU_KAFKA_BOOTSTRAP"], environment_of_up["QUIPU_KAFKA_TOPIC_PREFIX"]
            ))
            assert sum(map(len, records.values())) > 0
            assert readable_anywhere(records, WORD) == []
            assert "QUIPU_KEYS_TOKEN" not in environment_of_up  # the token stays in its own file
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=scaled(30)) == 0
        assert not state_file.exists()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        log.close()
    assert "stopped" in (tmp_path / "up.log").read_text()


async def test_a_200_kb_prompt_is_read_from_stdin_or_a_file(
    served: ServedStack, planner: StandInPlanner, tmp_path: Path
) -> None:
    prompt = (
        "hello " + "lorem ipsum dolor sit amet, " * 7_000
    )  # ~196 KB: too long for an argv on many systems
    session = session_id()
    piped = await quipu(served, "run", "-", "--session", session, input=prompt + "\n")
    assert piped.exit_code == 0, piped.output[-2000:]
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(prompt.upper())
    filed = await quipu(served, "run", "--file", str(prompt_file), "--session", session)
    assert filed.exit_code == 0, filed.output[-2000:]
    texts = [r.text for r in planner.requests if r.session_id == session]
    assert texts == [prompt, prompt.upper()]


async def test_a_prompt_over_the_limit_is_refused_in_one_line(served: ServedStack) -> None:
    result = await quipu(served, "run", "-", "--session", session_id(), input="x" * 200_001)
    assert result.exit_code == 2
    assert "at most 200000 characters" in result.output and "200,001 characters" in result.output
