"""Quipu services as child processes: what `quipu up --processes`, tests and fault drills start.

Each service runs as `python -m services.<name>` with the environment that points it at a stack.
`ServiceProcess` is one such process, started and stopped by its caller (tests, fault drills);
`Supervisor` runs a set of them the way `docker compose up` does: output shown line by line,
each exit noticed at once and followed by a restart with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from quipu.deploy.local.processes import die_with_parent


class ServiceProcess:
    """One service in its own process group, stoppable gracefully or killed outright."""

    def __init__(self, module: str, environment: Mapping[str, str], log_path: Path | None = None) -> None:
        self.module = module
        self._environment = {**os.environ, **environment}
        self._log_path = log_path
        self._log: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        """Spawn the service; its output goes to the log file (or is discarded)."""
        self._log = open(self._log_path, "ab") if self._log_path else None  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module],
            env=self._environment,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no commit, no goodbye — what a crash looks like."""
        self._signal(signal.SIGKILL)
        self._wait(5.0)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, wait, then SIGKILL whatever is left."""
        self._signal(signal.SIGTERM)
        if not self._wait(timeout):
            self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _signal(self, signum: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)

    def _wait(self, timeout: float) -> bool:
        if self.process is None:
            return True
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


# --- supervision: what `quipu up --processes` runs ------------------------------------------------


@dataclass(frozen=True)
class RestartPolicy:
    """How long a supervisor waits before starting a service that exited again.

    The first restart comes quickly (a crash is healed before a person notices); each further
    exit in a row doubles the wait up to `max_delay_s`, so a service that cannot start does not
    spin; a run of `stable_after_s` without an exit starts the count again.
    """

    initial_delay_s: float = 0.5
    max_delay_s: float = 10.0
    stable_after_s: float = 30.0

    def delay(self, exits_in_a_row: int) -> float:
        """The wait before the next start after `exits_in_a_row` (>= 1) exits in a row."""
        return float(min(self.max_delay_s, self.initial_delay_s * 2 ** max(0, exits_in_a_row - 1)))


def describe_exit(returncode: int) -> str:
    """`exit code 1`, or the signal that ended the process (`killed by SIGKILL`)."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


@dataclass
class ServiceState:
    """What a supervisor knows about one service right now."""

    name: str
    module: str
    """The module it runs as `python -m <module>`, or "" for a command of its own (`arguments`)."""
    arguments: tuple[str, ...] = ()
    """What follows the interpreter on its command line (`-m <module>` unless given)."""
    pid: int | None = None
    restarts: int = 0
    started_at: float = 0.0
    """Wall-clock time (`time.time()`) of the current process's start."""
    last_exit: str = ""

    @property
    def running(self) -> bool:
        """Whether a process of the service is alive now."""
        return self.pid is not None

    @property
    def command(self) -> tuple[str, ...]:
        """The arguments given to the interpreter to start it."""
        return self.arguments or ("-m", self.module)

    def as_json(self) -> dict[str, Any]:
        """The state as written to `quipu up`'s state file (read by `quipu status`)."""
        return {
            "module": self.module,
            "command": list(self.command),
            "pid": self.pid,
            "restarts": self.restarts,
            "started_at": self.started_at,
            "last_exit": self.last_exit,
        }


LineSink = Callable[[str, str], None]
"""Receives (service name, one line of its output or a supervisor notice)."""


class Supervisor:
    """Runs services as child processes and keeps them running, like `docker compose up`.

    Each child's output is read line by line and handed to `on_output` with the service's name;
    an exit is noticed the moment the process ends (its `wait()` resolves, no polling), reported
    to `on_notice` and followed by a restart after the policy's backoff. `on_change` is called
    whenever a pid changes, so the caller can publish the state (the state file).
    """

    def __init__(
        self,
        services: Sequence[tuple[str, str | Sequence[str]]],
        environment: Mapping[str, str],
        *,
        on_output: LineSink,
        on_notice: LineSink,
        on_change: Callable[[], None] = lambda: None,
        policy: RestartPolicy | None = None,
        stop_timeout_s: float = 15.0,
        stop_last: Collection[str] = (),
    ) -> None:
        # Each service is a module (`python -m <module>`) or the interpreter's arguments in full
        # (`-m quipu.services.cli serve tools --app ...`: what a user would run).
        self.states = {
            name: ServiceState(name, run, ()) if isinstance(run, str) else ServiceState(name, "", tuple(run))
            for name, run in services
        }
        self._environment = {**os.environ, **environment}
        self._on_output = on_output
        self._on_notice = on_notice
        self._on_change = on_change
        self._policy = policy or RestartPolicy()
        self._stop_timeout_s = stop_timeout_s
        self._stop_last = frozenset(stop_last)
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start every service (in the given order) and begin watching each."""
        for name in self.states:
            await self._spawn(name)
        self._watchers = [
            asyncio.create_task(self._watch(name), name=f"supervise-{name}") for name in self.states
        ]

    async def stop(self) -> None:
        """Stop watching, then SIGTERM the services and reap them: all at once, and those named in
        `stop_last` only once every other one has exited (they serve the others while they drain).

        Not one after another: each service leaving rebalanced the groups the others share (every
        store client's reply-claim group), and each later one first waited out that rebalance, which
        made stopping eight services take 10 to 45 s on a busy 2-core host.
        """
        self._stopping = True
        first = [name for name in self.states if name not in self._stop_last]
        for wave in (first, [name for name in self.states if name in self._stop_last]):
            await asyncio.gather(*(self._stop_one(name) for name in wave))
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def _stop_one(self, name: str) -> None:
        process = self._processes.get(name)
        if process is None or process.returncode is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self._stop_timeout_s)
        except TimeoutError:
            self._on_notice(name, f"did not stop within {self._stop_timeout_s:g} s; killed")
            _signal_group(process.pid, signal.SIGKILL)
            await process.wait()

    async def _spawn(self, name: str) -> asyncio.subprocess.Process:
        state = self.states[name]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *state.command,
            env=self._environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a Ctrl-C reaches `quipu up`, which stops it
            preexec_fn=die_with_parent(),
            limit=_LINE_LIMIT,
        )
        self._processes[name] = process
        state.pid, state.started_at = process.pid, time.time()
        self._on_change()
        return process

    async def _watch(self, name: str) -> None:
        state, exits_in_a_row = self.states[name], 0
        while True:
            process = self._processes[name]
            output = asyncio.create_task(self._pump(name, process))
            returncode = await process.wait()
            _signal_group(process.pid, signal.SIGKILL)  # whatever it left behind goes with it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(output), _DRAIN_S)
            output.cancel()
            if self._stopping:
                return
            lived_s = time.time() - state.started_at
            exits_in_a_row = 1 if lived_s >= self._policy.stable_after_s else exits_in_a_row + 1
            delay = self._policy.delay(exits_in_a_row)
            state.pid, state.last_exit = None, describe_exit(returncode)
            self._on_change()
            self._on_notice(
                name, f"exited ({state.last_exit}) after {lived_s:.1f} s; restarting in {delay:g} s"
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            state.restarts += 1
            restarted = await self._spawn(name)
            self._on_notice(name, f"restarted (pid {restarted.pid}, restart {state.restarts})")

    async def _pump(self, name: str, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while True:
            try:
                line = await process.stdout.readline()
            except ValueError:  # a line longer than the limit: show what there is of it
                line = await process.stdout.read(_LINE_LIMIT)
            if not line:
                return
            self._on_output(name, line.decode(errors="replace").rstrip("\n"))


_LINE_LIMIT = 1 << 20
_DRAIN_S = 1.0
"""After an exit, how long the last lines of output may take to arrive."""


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
