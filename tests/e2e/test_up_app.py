"""`quipu up --app`: a user's module with one agent and two tools, answered through `quipu run`, offline.

The module is written to a tmp directory that is not importable from the repository, and
`quipu up --app weather_app:app --processes` is started from there as a real process, so the
toolset's executor is a `quipu serve tools --app` child (the one-process form is what
`tests/e2e/test_own_project.py` runs, in a fresh virtualenv, for the README's module). A
`quipu run --agent forecaster` process from elsewhere is answered by the scripted model, which
calls both tools; each tool writes a line to a file when it runs, so the test sees them run in
the executor, and the run's transcript (`quipu runs show`) holds their results.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quipu.services.cli.state import STATE_FILE_ENV
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(scaled(400)))]

USER_MODULE = '''
import os
from pathlib import Path

import quipu

weather = quipu.Toolset("weather", version="1")


def ran(line: str) -> None:
    with Path(os.environ["WEATHER_CALLS"]).open("a") as calls:
        calls.write(line + "\\n")


@weather.tool(timeout_s=10)
async def forecast(city: str) -> str:
    """Tomorrow's forecast for a city."""
    ran(f"forecast {city}")
    return f"sunny-7731 in {city}"


@weather.tool
def rainfall(city: str, days: int = 1) -> float:
    """Millimetres of rain expected in a city over the next days."""
    ran(f"rainfall {city}")
    return 0.25 * days


forecaster = quipu.Agent(
    id="forecaster",
    instructions="You answer questions about the weather with your tools.",
    tools=[forecast, rainfall, "current_time"],
)

app = quipu.App(agents=[forecaster], toolsets=[weather])
'''

START_S = 240.0
"""From `quipu up` to its state file: with --processes eight interpreters start on a busy host."""


class Up:
    """A `quipu up --app` process and its files."""

    def __init__(self, folder: Path, processes: bool) -> None:
        self.folder = folder
        self.state_file = folder / "up.json"
        self.calls = folder / "calls.txt"
        self.log_path = folder / "up.log"
        self.environment = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("QUIPU_", "ANTHROPIC_")) and key != "PYTHONPATH"
        }
        self.environment |= {
            STATE_FILE_ENV: str(self.state_file),
            "QUIPU_GATEWAY_API_KEYS_FILE": str(folder / "gateway-keys.json"),
            "QUIPU_MODEL_PROVIDER": "scripted",
            "WEATHER_CALLS": str(self.calls),
        }
        mode = ["--processes"] if processes else []
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "quipu.services.cli", "up", "--app", "weather_app:app",
                 "--gateway-port", "0", *mode],
                cwd=folder,
                env=self.environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def state(self) -> dict[str, Any]:
        deadline = time.monotonic() + scaled(START_S)
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"quipu up exited early:\n{self.log()[-4000:]}"
            try:
                state: dict[str, Any] = json.loads(self.state_file.read_text())
            except (OSError, ValueError):
                state = {}
            if state.get("ready"):  # with --processes the file is written as the children start
                return state
            time.sleep(0.2)
        raise AssertionError(f"not ready within {scaled(START_S)} s:\n{self.log()[-4000:]}")

    def quipu(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        """A `quipu` client command, run from another directory than the app's."""
        return subprocess.run(
            [sys.executable, "-m", "quipu.services.cli", *args],
            cwd=self.folder.parent,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=scaled(timeout),
            check=False,
        )

    def executor_members(self) -> str:
        """Members of the toolset's consumer group, as `quipu status` shows them."""
        status = self.quipu("status", timeout=60)
        rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in status.stdout.splitlines()]
        [executors] = [row for row in rows if row[:2] == ["tool-executor-weather", "tools.calls.weather"]]
        return executors[2]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=scaled(60))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "weather_app.py").write_text(textwrap.dedent(USER_MODULE))
    running = Up(folder, processes=True)
    try:
        yield running
    finally:
        running.stop()
        print(running.log()[-4000:])


def test_up_with_an_app_answers_its_agent_with_its_tools(up: Up) -> None:
    state = up.state()
    log = up.log()
    assert "tools-weather" in state["services"], log
    assert "announced: weather" in log  # up said it is up once the toolset could be called

    question = "forecast and rainfall for Lima, please"
    turn = up.quipu("run", "--agent", "forecaster", question, "--timeout", "150")
    output = turn.stdout
    assert turn.returncode == 0, output + turn.stderr
    assert output.rstrip().splitlines()[-1].startswith("✓ completed")
    ran = up.calls.read_text().splitlines()
    assert sorted(line.split()[0] for line in ran) == ["forecast", "rainfall"], ran

    run_id = re.search(r"run (\S+)", output + turn.stderr)
    assert run_id is not None, output + turn.stderr
    shown = up.quipu("runs", "show", run_id.group(1), timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "sunny-7731" in shown.stdout  # the forecast tool's result is in the transcript

    assert up.executor_members() == "1"  # the toolset's executor, alone in its own group
    # A second copy, started by hand in another terminal with no QUIPU_KAFKA_*: it finds the stack
    # through the state file, as client commands do, and joins the toolset's group.
    with (up.folder / "copy.log").open("wb") as copy_log:
        copy = subprocess.Popen(
            [sys.executable, "-m", "quipu.services.cli", "serve", "tools", "--app", "weather_app:app"],
            cwd=up.folder,
            env=up.environment,
            stdout=copy_log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + scaled(90)
        copy_output = up.folder / "copy.log"
        # Its own log says when it holds partitions of the group; only then is `quipu status` (an
        # interpreter of its own each time) asked.
        while "partitions assigned" not in copy_output.read_text(errors="replace"):
            assert copy.poll() is None, copy_output.read_text()
            assert time.monotonic() < deadline, "the second copy was assigned no partitions"
            time.sleep(0.1)
        while up.executor_members() != "2":
            assert copy.poll() is None, copy_output.read_text()
            assert time.monotonic() < deadline, "the second copy did not join the toolset's group"
            time.sleep(0.5)
        assert "stack: quipu up (pid" in copy_output.read_text()
    finally:
        copy.terminate()
        copy.wait(timeout=scaled(30))

    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(timeout=scaled(60)) == 0
    assert not up.state_file.exists()
