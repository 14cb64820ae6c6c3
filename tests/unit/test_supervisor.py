"""quipu.deploy.local.services.Supervisor: output shown line by line, an exit noticed and healed.

The supervised program is `tests/support/chatty_service.py`, a real child process; the test kills
it by pid, as `kill -9` would, and waits for the supervisor to say so and start it again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator

import pytest

from quipu.deploy.local import services
from quipu.deploy.local.services import RestartPolicy, Supervisor, describe_exit
from tests.timing import eventually

MODULE = "tests.support.chatty_service"


def test_restart_delays_double_up_to_the_cap() -> None:
    policy = RestartPolicy(initial_delay_s=0.5, max_delay_s=4.0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_an_exit_is_described_by_its_code_or_signal() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"


class Recorded:
    def __init__(self) -> None:
        self.output: list[tuple[str, str]] = []
        self.notices: list[tuple[str, str]] = []
        self.changes = 0

    def changed(self) -> None:
        self.changes += 1


@pytest.fixture
async def supervised() -> AsyncIterator[tuple[Supervisor, Recorded]]:
    recorded = Recorded()
    supervisor = Supervisor(
        [("first", MODULE), ("second", MODULE)],
        {},
        on_output=lambda name, line: recorded.output.append((name, line)),
        on_notice=lambda name, line: recorded.notices.append((name, line)),
        on_change=recorded.changed,
        policy=RestartPolicy(initial_delay_s=0.05),
        stop_timeout_s=5.0,
    )
    await supervisor.start()
    try:
        yield supervisor, recorded
    finally:
        await supervisor.stop()


async def test_each_line_of_each_service_is_shown_with_its_name(
    supervised: tuple[Supervisor, Recorded],
) -> None:
    supervisor, recorded = supervised
    pids = {name: state.pid for name, state in supervisor.states.items()}

    async def both_ready() -> bool:
        return {(name, f"ready {pid}") for name, pid in pids.items()} <= set(recorded.output)

    await eventually(both_ready, within=20, what="both services' first lines")
    assert ("first", '{"event": "a log line", "level": "warning"}') in recorded.output


async def test_a_killed_service_is_reported_and_started_again(
    supervised: tuple[Supervisor, Recorded],
) -> None:
    supervisor, recorded = supervised
    first = supervisor.states["first"]
    old_pid = first.pid
    assert old_pid is not None

    async def ready() -> bool:
        return ("first", f"ready {old_pid}") in recorded.output

    await eventually(ready, within=20, what="first ready")
    changes = recorded.changes

    os.kill(old_pid, signal.SIGKILL)

    async def reported() -> bool:
        return ("first", "exited (killed by SIGKILL)") in {(n, line[:26]) for n, line in recorded.notices}

    await eventually(reported, within=10, what="the exit reported")

    async def restarted() -> bool:
        return first.pid not in (None, old_pid) and ("first", f"ready {first.pid}") in recorded.output

    await eventually(restarted, within=20, what="a new process of the service")
    assert first.restarts == 1 and first.last_exit == "killed by SIGKILL"
    assert recorded.changes >= changes + 2  # down, then up again: the state file follows
    assert supervisor.states["second"].restarts == 0  # the other service was left alone
    assert any(line == f"restarted (pid {first.pid}, restart 1)" for _, line in recorded.notices)


async def test_a_service_that_keeps_failing_is_restarted_with_growing_waits() -> None:
    notices: list[str] = []
    supervisor = Supervisor(
        [("broken", MODULE)],
        {"CHATTY_EXIT_CODE": "3"},
        on_output=lambda _name, _line: None,
        on_notice=lambda _name, line: notices.append(line),
        policy=RestartPolicy(initial_delay_s=0.05, max_delay_s=0.2),
    )
    await supervisor.start()
    try:

        async def three_exits() -> bool:
            return sum(line.startswith("exited (exit code 3)") for line in notices) >= 3

        await eventually(three_exits, within=30, what="three exits")
    finally:
        await supervisor.stop()
    waits = [line.rsplit("restarting in ", 1)[1] for line in notices if "restarting in" in line]
    assert waits[:3] == ["0.05 s", "0.1 s", "0.2 s"]


async def test_stop_signals_every_service_at_once_and_those_named_last_after_the_others_exited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    supervisor = Supervisor(
        [("owner", MODULE), ("planner", MODULE), ("gateway", MODULE)],
        {"CHATTY_STOP_S": "1"},  # each takes a second to exit: one after another, the next waits it out
        on_output=lambda _name, _line: None,
        on_notice=lambda _name, _line: None,
        stop_last=("owner",),
    )
    await supervisor.start()
    pids = {name: state.pid for name, state in supervisor.states.items()}
    alive_when_signalled: dict[str, set[str]] = {}

    def alive(pid: int | None) -> bool:
        try:
            os.kill(pid or 0, 0)
        except ProcessLookupError:
            return False
        return pid is not None

    original = services._signal_group

    def signal_group(pid: int, signum: signal.Signals) -> None:
        if signum is signal.SIGTERM:
            [name] = [name for name, known in pids.items() if known == pid]
            alive_when_signalled[name] = {other for other, known in pids.items() if alive(known)}
        original(pid, signum)

    monkeypatch.setattr(services, "_signal_group", signal_group)
    await supervisor.stop()
    everyone = set(pids)
    assert alive_when_signalled["gateway"] == everyone  # not one of them had to exit first
    assert alive_when_signalled["planner"] == everyone
    assert alive_when_signalled["owner"] == {"owner"}  # it served the others until they were gone
