"""A user's own code, installed and run as its user runs it: a fresh venv, `quipu up --app`, `quipu run`.

One virtualenv for the module, made as a user makes one: the wheel of this Quipu built and
installed into it by pip (dependencies from pip's cache; no bytecode compiled ahead, the only
shortcut, which Python does on first import anyway). Then, with only that venv's commands and no
model key (the offline scripted model answers):

- the README's "Your own agent in 30 lines" module, copied out of the README into an empty folder,
  is served by `quipu up --app weather:app` and answers a `quipu run --agent forecaster`, its two
  tools called;
- the example project `examples/supportdesk` is pip-installed with its test extra, its own tests
  pass with its own pytest, and `quipu up --app supportdesk.app:app` serves its two agents and
  three toolsets (one an MCP server): a `quipu run --agent desk` opens a ticket (the ledger holds
  one line per idempotency key), asks the status agent (a child run that asks the status page over
  HTTP) while a `quipu serve tools` copy of the status toolset shares its calls, and searches the
  help centre over MCP.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

from quipu.services.cli.state import STATE_FILE_ENV
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600))]

REPOSITORY = Path(__file__).resolve().parents[2]
README = REPOSITORY / "README.md"
EXAMPLE = REPOSITORY / "examples" / "supportdesk"
TICKET_TURN = "open_ticket customer=ana@example.com: my parcel never arrived"
THIRTY_LINES_HEADING = "## Your own agent in 30 lines"


def thirty_line_module() -> tuple[str, str]:
    """The README's own-agent module: (its file name, from its first line `# name.py`; its source)."""
    section = README.read_text().split(THIRTY_LINES_HEADING, 1)[1]
    source = section.split("```python\n", 1)[1].split("```", 1)[0]
    name = re.fullmatch(r"# (\w+\.py)", source.splitlines()[0])
    assert name is not None, "the module's first line names its file"
    return name.group(1), source


@dataclass(frozen=True)
class Virtualenv:
    """A fresh virtualenv with this Quipu installed from its wheel."""

    root: Path

    def command(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def install(self, *requirements: str) -> None:
        """`pip install` into this venv (pip of the test's interpreter, `--python` pointed here)."""
        done = subprocess.run(
            [sys.executable, "-m", "pip", "--python", self.command("python"), "install", "--quiet",
             "--no-compile", *requirements],
            capture_output=True, text=True, timeout=scaled(300), check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def venv(quipu_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Virtualenv:
    made = Virtualenv(tmp_path_factory.mktemp("venv"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(made.root)], check=True)
    made.install(str(quipu_wheel))
    return made


def user_environment(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell: no stack of the test's, no model key, state files in `home`."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("QUIPU_", "VIRTUAL_ENV", "PYTHON"))
    }
    environment[STATE_FILE_ENV] = str(home / "up.json")
    environment["QUIPU_GATEWAY_API_KEYS_FILE"] = str(home / "gateway-keys.json")
    return environment | extra


class Up:
    """`quipu up --app SPEC` of the venv as a process in `folder`, stopped with Ctrl-C at the end."""

    def __init__(self, venv: Virtualenv, spec: str, folder: Path, environment: dict[str, str]) -> None:
        self.venv, self.spec, self.folder, self.environment = venv, spec, folder, environment
        self.log = folder / "up.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.state: dict[str, Any] = {}

    def __enter__(self) -> Self:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [self.venv.command("quipu"), "up", "--app", self.spec, "--gateway-port", "0"],
                cwd=self.folder, env=self.environment, stdout=log, stderr=subprocess.STDOUT,
            )
        self.state = self._wait_for_state(within=90)
        return self

    def _wait_for_state(self, within: float) -> dict[str, Any]:
        state_file = Path(self.environment[STATE_FILE_ENV])
        deadline = time.monotonic() + scaled(within)
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.output()
            try:
                state: dict[str, Any] = json.loads(state_file.read_text())
            except (OSError, ValueError):
                state = {}
            if state.get("ready"):  # every toolset of the app announced: its tools can be called
                return state
            time.sleep(0.1)
        raise AssertionError(f"quipu up --app {self.spec} was not ready within {scaled(within):.0f} s")

    @contextmanager
    def copy_of(self, toolset: str) -> Iterator[None]:
        """One more executor of `toolset`: `quipu serve tools`, with the environment the banner lists."""
        log = self.folder / f"serve-tools-{toolset}.log"
        environment = self.environment | self.state["environment"]
        with log.open("wb") as output:
            copy = subprocess.Popen(
                [self.venv.command("quipu"), "serve", "tools", "--app", self.spec, "--toolset", toolset],
                cwd=self.folder, env=environment, stdout=output, stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + scaled(60)
            while "partitions assigned" not in log.read_text(errors="replace"):  # its share of the calls
                assert copy.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.1)
            yield
        finally:
            copy.terminate()
            copy.wait(timeout=scaled(30))

    def quipu(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        """One `quipu` command of the venv against this stack, as from another terminal."""
        return subprocess.run(
            [self.venv.command("quipu"), *arguments], cwd=self.folder, env=self.environment,
            capture_output=True, text=True, timeout=scaled(120), check=False,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout=scaled(30))
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        if kind is None:
            assert code == 0, self.output()[-3000:]


def answered(turn: subprocess.CompletedProcess[str]) -> str:
    """The output of a `quipu run` that completed (else fail, showing what it said)."""
    assert turn.returncode == 0, turn.stdout + turn.stderr
    assert turn.stdout.rstrip().splitlines()[-1].startswith("✓ completed"), turn.stdout
    return turn.stdout


def test_the_readme_agent_in_30_lines_answers_offline(venv: Virtualenv, tmp_path: Path) -> None:
    name, source = thirty_line_module()
    assert len(source.splitlines()) <= 30
    (tmp_path / name).write_text(source)
    with Up(venv, f"{name.removesuffix('.py')}:app", tmp_path, user_environment(tmp_path)) as up:
        said = answered(up.quipu("run", "--agent", "forecaster", "the forecast for Lima, and to_fahrenheit"))
    assert "⚙ forecast ok" in said and "⚙ to_fahrenheit ok" in said
    assert "The forecast says" in said and "The to_fahrenheit says" in said


@dataclass(frozen=True)
class Installed:
    """The venv with the example project installed from `checkout`, a copy of it as a user has one."""

    venv: Virtualenv
    checkout: Path


@pytest.fixture(scope="module")
def desk_installed(venv: Virtualenv, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    checkout = tmp_path_factory.mktemp("checkout") / EXAMPLE.name
    left_behind = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*")  # by a developer's work
    shutil.copytree(EXAMPLE, checkout, ignore=left_behind)
    venv.install(f"{checkout}[test]")
    return Installed(venv, checkout)


def test_the_example_projects_own_tests_pass_where_it_is_installed(
    desk_installed: Installed, tmp_path: Path
) -> None:
    ran = subprocess.run(
        [desk_installed.venv.command("python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=desk_installed.checkout, env=user_environment(tmp_path), capture_output=True, text=True,
        timeout=scaled(120), check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"\b\d+ passed\b", ran.stdout)


@dataclass
class StatusPage:
    """The example's stand-in status page, run from the venv as its README says."""

    process: subprocess.Popen[str]
    url: str


@pytest.fixture
def status_page(desk_installed: Installed) -> Iterator[StatusPage]:
    python = desk_installed.venv.command("python")
    command = [python, "-m", "supportdesk.status_page", "--port", "0", "--delay", "0.2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        found = re.search(r"status page on (http://\S+)", process.stdout.readline())
        assert found is not None
        yield StatusPage(process, found.group(1))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=scaled(10))


def ledger_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_support_desk_runs_with_quipu_up_app(
    desk_installed: Installed, status_page: StatusPage, tmp_path: Path
) -> None:
    ledger = tmp_path / "tickets.jsonl"
    environment = user_environment(
        tmp_path, SUPPORTDESK_LEDGER=str(ledger), SUPPORTDESK_STATUS_URL=status_page.url
    )
    with Up(desk_installed.venv, "supportdesk.app:app", tmp_path, environment) as up:
        ticket = answered(up.quipu("run", "--agent", "desk", TICKET_TURN))
        with up.copy_of("status"):  # the README's "Scaling a toolset": a second executor shares the calls
            status = answered(up.quipu("run", "--agent", "desk", "ask the status_agent if payments work"))
        articles = answered(up.quipu("run", "--agent", "desk", "search_articles about a late parcel"))

    [opened] = ledger_lines(ledger)  # the one tool use wrote one line, keyed by its idempotency key
    assert opened["idempotency_key"].startswith("toolu_")
    assert "⚙ open_ticket ok" in ticket and f"Ticket {opened['ticket_id']} is open" in ticket

    # The child run's answer, from the status page: "<service> is <state>: <note>".
    assert "↳ status_agent: child run" in status and "⚙ status_agent ok" in status
    assert re.search(r"The service_status says (checkout|payments|shipping) is (up|degraded): ", status)

    # The offline model asks for what the turn said after the tool's name.
    assert (opened["customer"], opened["summary"]) == ("ana@example.com", "my parcel never arrived")
    assert '"query":"a late parcel"' in articles and "A parcel is late:" in articles
