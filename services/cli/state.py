"""Where the stack is: the state file a running `quipu up` writes, and the Kafka a client talks to.

`quipu up` writes `QUIPU_STATE_FILE` (default `~/.cache/quipu/up.json`): its pid, the environment
that points programs at its stack, the gateway's address and, under `--processes`, each service's
pid and restarts. Client commands read it when `QUIPU_KAFKA_BOOTSTRAP` is not set, and say which
stack they talk to; a second `quipu up` on the same file is refused while the first is alive.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quipu.services.cli.output import fail, note
from quipu.services.kit.settings import KafkaSettings

STATE_FILE_ENV = "QUIPU_STATE_FILE"
CLIENT_ID = "quipu-cli"


def state_file() -> Path:
    """Where `quipu up` leaves the environment that points clients at it."""
    configured = os.environ.get(STATE_FILE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "quipu" / "up.json"


def shown_path(path: Path) -> str:
    """`path` with the home directory written as `~`."""
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home) :] if text.startswith(home + os.sep) else text


def alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_state(path: Path | None = None) -> dict[str, Any] | None:
    """The state of a running `quipu up`, or None (no file, unreadable, or its process is gone)."""
    try:
        state: dict[str, Any] = json.loads((path or state_file()).read_text())
    except (OSError, ValueError):
        return None
    pid = state.get("pid")
    if not isinstance(pid, int) or not alive(pid):
        return None
    return state


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file in one step, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(state))
    partial.replace(path)


def remove_state(path: Path, pid: int) -> None:
    """Remove the state file if it is still the one process `pid` wrote."""
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        return


@dataclass(frozen=True)
class Target:
    """The Kafka a client command talks to, and where that came from."""

    kafka: KafkaSettings
    source: str
    """`QUIPU_KAFKA_BOOTSTRAP`, or `quipu up (pid N, <state file>)`."""
    state: dict[str, Any] | None


def adopt_key_channel() -> None:
    """A client of a running `quipu up` seals and opens words with its key channel: the variables
    it left (the URL and the token's file, never the token) become this process's defaults, so
    every key setting built afterwards reads them. A client pointed elsewhere keeps its own."""
    if os.environ.get("QUIPU_KAFKA_BOOTSTRAP"):
        return
    state = read_state(state_file())
    environment: dict[str, str] = (state or {}).get("environment", {})
    for name in ("QUIPU_KEYS_URL", "QUIPU_KEYS_TOKEN_FILE"):
        if name in environment:
            os.environ.setdefault(name, environment[name])


SERVICE_ENVIRONMENT = (
    "QUIPU_KAFKA_BOOTSTRAP",
    "QUIPU_KAFKA_FLAVOUR",
    "QUIPU_KAFKA_TOPIC_PREFIX",
    "QUIPU_KEYS_URL",
    "QUIPU_KEYS_TOKEN_FILE",
)
"""What a service started beside a running `quipu up` takes from it: its Kafka and its key channel."""


def adopt_running_stack() -> str | None:
    """Point a service started by hand (`quipu serve tools` in another terminal) at the running
    `quipu up`, as client commands are: its Kafka and key channel become this process's defaults.
    Returns where they came from, or None when QUIPU_KAFKA_BOOTSTRAP is set or nothing runs."""
    if os.environ.get("QUIPU_KAFKA_BOOTSTRAP"):
        return None
    path = state_file()
    state = read_state(path)
    if state is None:
        return None
    environment: dict[str, str] = state.get("environment", {})
    for name in SERVICE_ENVIRONMENT:
        if name in environment:
            os.environ.setdefault(name, environment[name])
    return f"quipu up (pid {state['pid']}, {shown_path(path)})"


def client_target() -> Target:
    """Kafka from QUIPU_KAFKA_*, else from a running `quipu up`; fail when there is neither."""
    if os.environ.get("QUIPU_KAFKA_BOOTSTRAP"):
        return Target(KafkaSettings(client_id=CLIENT_ID), "QUIPU_KAFKA_BOOTSTRAP", None)
    path = state_file()
    state = read_state(path)
    if state is None:
        fail(
            f"no Kafka to talk to: no running `quipu up` left {shown_path(path)} ({STATE_FILE_ENV}); "
            "start `quipu up` (in another terminal) or set QUIPU_KAFKA_BOOTSTRAP"
        )
    environment: dict[str, str] = state.get("environment", {})
    kafka = KafkaSettings(
        bootstrap=environment["QUIPU_KAFKA_BOOTSTRAP"],
        flavour=environment.get("QUIPU_KAFKA_FLAVOUR", "kafka"),
        topic_prefix=environment.get("QUIPU_KAFKA_TOPIC_PREFIX", ""),
        client_id=CLIENT_ID,
    )
    return Target(kafka, f"quipu up (pid {state['pid']}, {shown_path(path)})", state)


def client_settings() -> KafkaSettings:
    """Kafka settings for a client command; says on stderr which stack it talks to."""
    target = client_target()
    note(f"stack: {target.source} · kafka {target.kafka.bootstrap}")
    return target.kafka
