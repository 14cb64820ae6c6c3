"""The executor's MCP client against a real MCP server process (tests/mcp_servers/files_server.py).

The server is written with the SDK's server API and started as a subprocess: over stdio (the
executor starts it) and over streamable HTTP on a loopback port (started here, as an operator
would). Each call goes through the `ToolRunner`, as the executor runs it: arguments, deadline,
cancellation and the result or error the model reads.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog
from mcp_types.version import LATEST_HANDSHAKE_VERSION

from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.mcp import McpOAuth, McpToolset
from quipu.services.domain.tool_catalog import ToolCatalog
from quipu.services.kit.lifecycle import Opened
from quipu.services.tool_executor.adapters import RememberedResults
from quipu.services.tool_executor.logic import ToolRunner
from quipu.services.tool_executor.mcp_client import McpTools, McpUnavailableError
from quipu.tools import ToolImplementation
from tests.timing import eventually, scaled

SERVER = Path(__file__).parents[1] / "mcp_servers" / "files_server.py"
TOKEN = "t0ken-" + uuid.uuid4().hex
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}
SERVER_START_S = 60.0
"""A call after a crash waits for a new server: its start imports the SDK, ~25 s on a busy 2-core box."""

pytestmark = pytest.mark.slow


def served_folder(path: Path) -> Path:
    (path / "poem.txt").write_text("the river keeps its knots")
    return path


@dataclass
class Served:
    """An MCP server's tools as the executor runs them, and each list it served since it opened."""

    tools: McpTools
    runner: ToolRunner
    root: Path
    served: list[list[str]] = field(default_factory=list)

    async def serve(self, catalog: ToolCatalog, implementations: Mapping[str, ToolImplementation]) -> None:
        self.runner.serve(catalog, implementations)  # what the executor does before it announces
        self.served.append(catalog.names())

    async def call(
        self, tool_name: str, arguments: dict[str, Any], run_id: str = "", timeout_s: float | None = None
    ) -> ToolCallCompleted:
        return await self.deliver(
            ToolCallRequested(
                run_id=run_id or "r-" + uuid.uuid4().hex,
                agent_id="librarian",
                tool_use_id="toolu_" + uuid.uuid4().hex[:12],
                tool_name=tool_name,
                input=arguments,
                timeout_s=timeout_s,
            )
        )

    async def deliver(self, request: ToolCallRequested) -> ToolCallCompleted:
        result = await self.runner.run(request)
        assert result is not None
        return result


async def serve(toolset: McpToolset, opened: Opened, root: Path) -> Served:
    tools = McpTools(toolset)
    catalog, implementations = await tools.open(opened)
    runner = ToolRunner(
        catalog, implementations, RememberedResults(100), max_timeout_s=scaled(SERVER_START_S)
    )
    served = Served(tools, runner, root)
    tools.follow(served.serve)
    return served


@pytest.fixture(scope="module")
async def stdio(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    root = served_folder(tmp_path_factory.mktemp("stdio"))
    command = [sys.executable, str(SERVER), str(root)]
    toolset = McpToolset(
        "files", command=command, timeout_s=scaled(SERVER_START_S), connect_timeout_s=scaled(SERVER_START_S)
    )
    opened = Opened()
    try:
        yield await serve(toolset, opened, root)
    finally:
        await opened.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = served_folder(tmp_path_factory.mktemp("http"))
    process, url = http_process(root, "--token", TOKEN)
    try:
        yield url, root
    finally:
        process.terminate()
        process.wait(timeout=10)


def http_process(root: Path, *options: str) -> tuple[subprocess.Popen[bytes], str]:
    """The files server over HTTP on a free loopback port, and its MCP URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), str(root), "--http", str(port), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
async def http(http_server: tuple[str, Path]) -> AsyncIterator[Served]:
    url, root = http_server
    await listening(url)
    opened = Opened()
    remote = McpToolset("remote", url=url, headers=AUTHORIZED, timeout_s=scaled(SERVER_START_S))
    try:
        yield await serve(remote, opened, root)
    finally:
        await opened.close()


async def listening(url: str) -> None:
    port = int(url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])

    async def accepts() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        await writer.wait_closed()
        return True

    await eventually(accepts, within=30.0, what="the MCP server listening on its port", interval=0.1)


async def test_the_servers_tools_are_listed_with_their_schemas(stdio: Served) -> None:
    catalog = stdio.runner.catalog
    assert set(catalog.names()) == {
        "read_file",
        "file_size",
        "append_line",
        "crash",
        "read_once_flaky",
        "wait_forever",
        "add_echo_tool",
        "remove_tool",
    }
    # files.list is left out: Quipu's (and the models') tool names have no dots.
    read_file = catalog.get("read_file")
    assert read_file.description == "The text of a file in the served folder."
    schema = read_file.spec().input_schema
    assert schema["required"] == ["name"] and schema["properties"]["name"]["type"] == "string"


async def test_a_call_answers_with_the_servers_result(stdio: Served) -> None:
    read = await stdio.call("read_file", {"name": "poem.txt"})
    size = await stdio.call("file_size", {"name": "poem.txt"})

    assert not read.is_error and read.content == {"result": "the river keeps its knots"}
    assert not size.is_error and size.content == {"bytes": 25}


async def test_an_is_error_result_is_an_error_for_the_model(stdio: Served) -> None:
    missing = await stdio.call("read_file", {"name": "nowhere.txt"})
    misfit = await stdio.call("read_file", {"path": "poem.txt"})

    assert missing.is_error and "no file named nowhere.txt" in missing.content
    assert misfit.is_error and "name" in misfit.content  # the server's own validation, for the model


async def test_a_server_that_dies_mid_call_settles_the_call_and_comes_back(stdio: Served) -> None:
    (stdio.root / "more-tools").write_text("")  # the server that comes back lists one tool more
    with structlog.testing.capture_logs() as logs:
        crashed = await stdio.call("crash", {})

        async def served_anew() -> bool:
            return "delete_file" in stdio.runner.catalog

        await eventually(served_anew, within=SERVER_START_S, what="the new server's tools served")

    assert crashed.is_error and "went away during the call to crash" in crashed.content
    assert (stdio.root / "crashed").exists()
    # The executor is not wedged: the next call reaches a new server process.
    after = await stdio.call("read_file", {"name": "poem.txt"})
    assert not after.is_error and after.content == {"result": "the river keeps its knots"}
    assert stdio.tools.connection.connections >= 2
    [changed] = [line for line in logs if "tools changed" in line["event"]]
    assert changed["added"] == ["delete_file"] and changed["removed"] == []
    deleted = await stdio.call("delete_file", {"name": "crashed"})
    assert not deleted.is_error and not (stdio.root / "crashed").exists()


async def follows_the_servers_list(served: Served, how: str) -> None:
    """A tool the server adds is served; one it removes is not (the server says so `how`)."""
    name = f"echo_{how}_{uuid.uuid4().hex[:6]}"
    before = len(served.served)

    added = await served.call("add_echo_tool", {"name": name, "how": how})

    async def serving() -> bool:
        return name in served.runner.catalog

    await eventually(serving, within=20.0, what=f"{name} served once the server added it")
    assert not added.is_error and name in served.served[before]
    echoed = await served.call(name, {"text": "hello"})
    assert not echoed.is_error and echoed.content == {"result": f"{name}: hello"}
    assert served.runner.catalog.get(name).description == f"Answers with the text, after {name}."

    await served.call("remove_tool", {"name": name, "how": how})

    async def withdrawn() -> bool:
        return name not in served.runner.catalog

    await eventually(withdrawn, within=20.0, what=f"{name} withdrawn once the server removed it")
    gone = await served.call(name, {"text": "hello"})
    assert gone.is_error and f"unknown tool {name!r}" in gone.content
    assert "read_file" in served.runner.catalog  # the rest of the list is still served


async def test_a_stdio_servers_changed_tool_list_is_served(stdio: Served) -> None:
    await follows_the_servers_list(stdio, "listen")


async def test_an_http_servers_changed_tool_list_is_served(http: Served) -> None:
    await follows_the_servers_list(http, "listen")


async def test_a_changed_tool_list_is_served_from_an_http_server_before_2026(tmp_path: Path) -> None:
    root = served_folder(tmp_path)
    process, url = http_process(root, "--legacy")
    opened = Opened()
    try:
        await listening(url)
        served = await serve(McpToolset("old", url=url, timeout_s=scaled(SERVER_START_S)), opened, root)
        assert served.tools.connection.protocol_version == LATEST_HANDSHAKE_VERSION
        await follows_the_servers_list(served, "notification")
    finally:
        await opened.close()
        process.terminate()
        process.wait(timeout=10)


async def test_a_changed_tool_list_is_served_from_a_server_before_2026(tmp_path: Path) -> None:
    root = served_folder(tmp_path)
    command = [sys.executable, str(SERVER), str(root), "--legacy"]
    opened = Opened()
    try:
        toolset = McpToolset("old", command=command, connect_timeout_s=scaled(SERVER_START_S))
        served = await serve(toolset, opened, root)
        assert served.tools.connection.protocol_version == LATEST_HANDSHAKE_VERSION
        # Such a server sends notifications/tools/list_changed unasked (there is no listen stream).
        await follows_the_servers_list(served, "notification")
    finally:
        await opened.close()


async def test_a_read_only_call_whose_server_died_is_sent_once_more(stdio: Served) -> None:
    result = await stdio.call("read_once_flaky", {"name": "poem.txt"})

    assert (stdio.root / "flaked").exists()  # the first sending ended the server
    assert not result.is_error and result.content == {"result": "the river keeps its knots"}


async def test_canceling_the_run_cancels_the_mcp_request(stdio: Served) -> None:
    run_id = "r-" + uuid.uuid4().hex
    call = asyncio.create_task(stdio.call("wait_forever", {}, run_id=run_id))

    async def waiting() -> bool:
        return (stdio.root / "waiting").exists()

    await eventually(waiting, within=20.0, what="the server running the call")
    stdio.runner.cancel_run(run_id)

    async def canceled() -> bool:
        return (stdio.root / "canceled").exists()

    await eventually(canceled, within=20.0, what="the server told the request was canceled")
    with pytest.raises(AssertionError):  # a canceled call answers nothing
        await call


async def test_a_call_past_its_deadline_is_an_error_and_the_server_is_told(stdio: Served) -> None:
    for mark in ("waiting", "canceled"):
        (stdio.root / mark).unlink(missing_ok=True)

    late = await stdio.call("wait_forever", {}, timeout_s=0.5)

    assert late.is_error and "timed out after 0.5 s" in late.content

    async def canceled() -> bool:
        return (stdio.root / "canceled").exists()

    await eventually(canceled, within=20.0, what="the server told the late request was canceled")


async def test_a_redelivered_call_is_answered_again_without_calling_the_server(stdio: Served) -> None:
    request = ToolCallRequested(
        run_id="r-" + uuid.uuid4().hex,
        agent_id="librarian",
        tool_use_id="toolu_" + uuid.uuid4().hex[:12],
        tool_name="append_line",
        input={"name": "ledger.txt", "line": "paid"},
    )

    first = await stdio.deliver(request)
    again = await stdio.deliver(request)  # at-least-once: the same message, delivered twice

    assert first.content == {"result": 1} and again == first
    assert (stdio.root / "ledger.txt").read_text() == "paid\n"  # the effect happened once


async def test_a_streamable_http_server_is_served_the_same_way(http: Served) -> None:
    read = await http.call("read_file", {"name": "poem.txt"})
    missing = await http.call("file_size", {"name": "nowhere.txt"})

    assert "read_file" in http.runner.catalog and "files.list" not in http.runner.catalog
    assert read.content == {"result": "the river keeps its knots"}
    assert missing.is_error and "no file named nowhere.txt" in missing.content


async def test_an_http_server_that_refuses_the_executor_is_a_clear_error_at_start_up(
    http_server: tuple[str, Path],
) -> None:
    url, _ = http_server
    await listening(url)
    toolset = McpToolset("remote", url=url, connect_timeout_s=scaled(2.0))  # no Authorization header

    with pytest.raises(McpUnavailableError, match=r"'remote' .* not reachable") as refused:
        await McpTools(toolset).open(Opened())
    assert url not in str(refused.value)  # a URL may carry credentials: the error names the toolset


async def test_a_server_that_cannot_start_is_a_clear_error_at_start_up(tmp_path: Path) -> None:
    toolset = McpToolset("ghost", command=[str(tmp_path / "no-such-server")], connect_timeout_s=scaled(1.0))

    with pytest.raises(McpUnavailableError, match=r"'ghost' .* not reachable"):
        await McpTools(toolset).open(Opened())


async def test_closing_the_executor_ends_the_calls_waiting_for_a_server(tmp_path: Path) -> None:
    root = served_folder(tmp_path)
    # The server starts once: after the mark is left, every restart fails at once.
    script = f'test -e "{root}/no-restart" && exit 1; exec "{sys.executable}" "{SERVER}" "{root}"'
    opened = Opened()
    toolset = McpToolset("files", command=["sh", "-c", script], timeout_s=scaled(SERVER_START_S))
    served = await serve(toolset, opened, root)
    (root / "no-restart").write_text("")
    await served.call("crash", {})
    waiting = asyncio.create_task(served.call("read_file", {"name": "poem.txt"}))

    async def held() -> bool:
        return served.runner.running() == 1  # no server to send it to: it waits for one

    await eventually(held, within=10.0, what="the call waiting for a server")
    await opened.close()

    answered = await asyncio.wait_for(waiting, scaled(10.0))  # not at the call's deadline
    assert answered.is_error and "shutting down" in answered.content


# --- credentials from where a deployment keeps its secrets -------------------------------------------


async def read_a_file_through(toolset: McpToolset, root: Path) -> tuple[ToolCallCompleted, list[str]]:
    """Connect as `toolset`, read a file; the log lines written meanwhile, as text."""
    opened = Opened()
    with structlog.testing.capture_logs() as logs:
        try:
            served = await serve(toolset, opened, root)
            read = await served.call("read_file", {"name": "poem.txt"})
        finally:
            await opened.close()
    return read, [str(line) for line in logs]


async def test_a_bearer_token_is_read_from_the_environment_or_a_file_and_never_logged(
    http_server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = http_server
    await listening(url)
    monkeypatch.setenv("FILES_TOKEN", TOKEN)
    token_file = tmp_path / "files-token"
    token_file.write_text(TOKEN + "\n")  # as `kubectl create secret --from-file` often leaves it

    for toolset in (
        McpToolset("remote", url=url, bearer_token_env="FILES_TOKEN"),
        McpToolset("remote", url=url, bearer_token_file=token_file),
    ):
        read, logs = await read_a_file_through(toolset, root)

        assert read.content == {"result": "the river keeps its knots"}
        assert logs and not any(TOKEN in line for line in logs)
        assert TOKEN not in repr(toolset)


async def test_a_secret_that_cannot_be_read_is_a_clear_error_at_start_up(
    http_server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = http_server
    monkeypatch.delenv("FILES_TOKEN", raising=False)

    with pytest.raises(
        McpUnavailableError, match=r"'remote'.*the environment variable FILES_TOKEN is not set"
    ):
        await McpTools(McpToolset("remote", url=url, bearer_token_env="FILES_TOKEN")).open(Opened())
    with pytest.raises(McpUnavailableError, match=r"'remote'.*cannot read .*no-token"):
        await McpTools(McpToolset("remote", url=url, bearer_token_file=tmp_path / "no-token")).open(Opened())


@pytest.fixture(scope="module")
def oauth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = served_folder(tmp_path_factory.mktemp("oauth"))
    process, url = http_process(root, "--oauth", f"quipu:{TOKEN}")
    try:
        yield url, root
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_oauth_client_credentials_get_a_token_from_the_servers_authorization_server(
    oauth_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = oauth_server
    await listening(url)
    issuer = url.removesuffix("/mcp")
    monkeypatch.setenv("FILES_CLIENT_SECRET", TOKEN)
    oauth = McpOAuth(client_id="quipu", client_secret_env="FILES_CLIENT_SECRET", issuer=issuer)

    read, logs = await read_a_file_through(McpToolset("remote", url=url, oauth=oauth), root)

    assert read.content == {"result": "the river keeps its knots"}
    assert (root / "tokens-issued").read_text() == "1"  # one token, for the session and its calls
    assert not any(TOKEN in line for line in logs)


async def test_oauth_with_a_wrong_secret_is_a_clear_error_at_start_up(
    oauth_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = oauth_server
    await listening(url)
    monkeypatch.setenv("FILES_CLIENT_SECRET", "not-" + TOKEN)
    oauth = McpOAuth(
        client_id="quipu", client_secret_env="FILES_CLIENT_SECRET", issuer=url.removesuffix("/mcp")
    )
    toolset = McpToolset("remote", url=url, oauth=oauth, connect_timeout_s=scaled(2.0))

    with pytest.raises(McpUnavailableError, match=r"'remote' .* not reachable .*: OAuth") as refused:
        await McpTools(toolset).open(Opened())
    assert TOKEN not in str(refused.value)


async def test_an_expired_oauth_token_is_replaced_and_the_calls_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = served_folder(tmp_path)
    process, url = http_process(root, "--oauth", f"quipu:{TOKEN}", "--token-lifetime-s", "1")
    opened = Opened()
    try:
        await listening(url)
        monkeypatch.setenv("FILES_CLIENT_SECRET", TOKEN)
        oauth = McpOAuth(
            client_id="quipu", client_secret_env="FILES_CLIENT_SECRET", issuer=url.removesuffix("/mcp")
        )
        served = await serve(McpToolset("remote", url=url, oauth=oauth), opened, root)
        answers: list[ToolCallCompleted] = []

        async def renewed() -> bool:
            answers.append(await served.call("read_file", {"name": "poem.txt"}))
            return int((root / "tokens-issued").read_text()) >= 2

        await eventually(renewed, within=30.0, what="a second token once the first expired", interval=0.25)
    finally:
        await opened.close()
        process.terminate()
        process.wait(timeout=10)

    assert all(answer.content == {"result": "the river keeps its knots"} for answer in answers)
    assert served.tools.connection.connections == 1  # renewed inside the session, no reconnection
