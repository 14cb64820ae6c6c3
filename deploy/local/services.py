"""Quipu services as child processes: what `quipu up --processes`, tests and fault drills start.

Each service runs as `python -m services.<name>` with the environment that points it at a stack.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO


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
