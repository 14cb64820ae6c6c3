"""`quipu.McpToolset` and how an MCP tool and its results become Quipu's (no server; see
tests/integration/test_mcp_servers.py for the real process)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import structlog
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from mcp_types import Tool as McpTool
from typer.testing import CliRunner, Result

import quipu
from quipu.contracts.wire import utc_now_ms
from quipu.mcp import McpOAuth, McpToolset
from quipu.services import cli
from quipu.services.cli import apps as cli_apps
from quipu.services.domain.tool_catalog import ToolCatalog
from quipu.services.domain.toolset_registry import announce
from quipu.services.tool_executor.mcp_client import (
    McpUnavailableError,
    definition_of,
    may_resend,
    result_value,
    served_tools,
)
from quipu.tools import ToolError

FILES = McpToolset("files", command=["python", "-m", "files_server"], timeout_s=7.0)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "A file's name."}},
    "required": ["name"],
}


def test_a_declaration_names_one_way_to_reach_its_server() -> None:
    assert quipu.McpToolset is McpToolset and "McpToolset" in quipu.__all__
    assert FILES.command == ("python", "-m", "files_server") and FILES.transport == "stdio"
    assert McpToolset("search", url="https://search.internal/mcp").transport == "streamable-http"
    with pytest.raises(ValueError, match="exactly one of"):
        McpToolset("files")
    with pytest.raises(ValueError, match="exactly one of"):
        McpToolset("files", command=["x"], url="http://h/mcp")
    with pytest.raises(ValueError, match="list of arguments"):
        McpToolset("files", command="python -m files_server")
    with pytest.raises(ValueError, match="http"):
        McpToolset("files", url="file:///etc/passwd")
    with pytest.raises(ValueError, match="must match"):
        McpToolset("my files", command=["x"])
    with pytest.raises(ValueError, match="for a command"):
        McpToolset("files", url="http://h/mcp", env={"TOKEN": "t"})
    with pytest.raises(ValueError, match="headers are a url's"):
        McpToolset("files", command=["x"], headers={"Authorization": "Bearer t"})


def test_credentials_are_named_where_they_are_kept_one_way_per_url() -> None:
    oauth = McpOAuth(client_id="quipu", client_secret_env="SEARCH_SECRET", issuer="https://auth.example")
    assert McpToolset("search", url="https://h/mcp", bearer_token_env="SEARCH_TOKEN").bearer_token_env
    assert McpToolset("search", url="https://h/mcp", oauth=oauth).oauth is oauth
    assert quipu.McpOAuth is McpOAuth and "McpOAuth" in quipu.__all__
    with pytest.raises(ValueError, match="for a url, not a command"):
        McpToolset("files", command=["x"], bearer_token_file="/run/secrets/token")
    with pytest.raises(ValueError, match="one way to authenticate, not bearer_token_env and oauth"):
        McpToolset("search", url="https://h/mcp", bearer_token_env="SEARCH_TOKEN", oauth=oauth)
    with pytest.raises(ValueError, match="one way to authenticate, not an Authorization header"):
        McpToolset("search", url="https://h/mcp", headers={"authorization": "Bearer t"}, bearer_token_env="T")
    with pytest.raises(ValueError, match="exactly one of"):
        McpOAuth(client_id="quipu", issuer="https://auth.example")
    with pytest.raises(ValueError, match="exactly one of"):
        McpOAuth(client_id="q", issuer="https://a", client_secret_env="S", client_secret_file="/s")
    with pytest.raises(ValueError, match="issuer"):
        McpOAuth(client_id="quipu", issuer="auth.example", client_secret_env="S")


def test_its_repr_shows_neither_the_url_nor_the_environment() -> None:
    toolset = McpToolset("files", url="https://user:secret@h/mcp")
    assert "secret" not in repr(toolset)
    assert "t0ken" not in repr(
        McpToolset("files", url="https://h/mcp", headers={"Authorization": "Bearer t0ken"})
    )
    assert "hunter2" not in repr(McpToolset("files", command=["x"], env={"PASSWORD": "hunter2"}))


def test_importing_quipu_leaves_the_mcp_sdk_unloaded() -> None:
    code = "import sys, quipu; quipu.McpToolset('f', command=['x']); print('mcp' in sys.modules)"
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert output.stdout.strip() == "False"


def test_an_mcp_tool_is_announced_with_its_own_schema_and_description() -> None:
    tool = McpTool(name="read_file", description="Reads a file.", input_schema=SCHEMA)
    definition = definition_of(tool, FILES)
    assert definition is not None

    [announced] = announce("files", "1", ToolCatalog([definition]), at=utc_now_ms()).tools

    assert announced.name == "read_file" and announced.description == "Reads a file."
    assert announced.input_schema == SCHEMA and announced.timeout_s == 7.0
    # The server validates; the executor passes the model's arguments through unchanged.
    assert definition.parse_arguments({"name": "a.txt", "extra": [1]}).values() == {  # type: ignore[attr-defined]
        "name": "a.txt",
        "extra": [1],
    }


def test_a_tool_name_quipu_refuses_is_left_out() -> None:
    for name in ("files.list", "x" * 65, "read file"):
        assert definition_of(McpTool(name=name, description="d", input_schema=SCHEMA), FILES) is None
    untitled = definition_of(McpTool(name="stat", input_schema={"type": "object"}), FILES)
    assert untitled is not None and untitled.description  # the model picks tools by it: never empty


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "array", "items": {"type": "string"}}, "not a JSON schema of type object"),
        ({"properties": {"name": {"type": "string"}}}, "not a JSON schema of type object"),
        (
            {"type": "object", "properties": {"name": {"type": "strin"}}},
            "keyword 'anyOf' at properties/name/type",
        ),
        ({"type": "object", "required": "name"}, "keyword 'type' at required"),
        (
            {"type": "object", "properties": {"n": {"minLength": -1}}},
            "keyword 'minimum' at properties/n/minLength",
        ),
    ],
)
def test_a_tool_whose_schema_is_not_a_json_schema_is_left_out_saying_why(
    schema: dict[str, object], says: str
) -> None:
    with structlog.testing.capture_logs() as logs:
        assert definition_of(McpTool(name="read_file", description="d", input_schema=schema), FILES) is None

    [warning] = logs
    assert says in warning["event"] and warning["tool_name"] == "read_file" and warning["toolset"] == "files"


def test_a_schema_of_an_older_draft_is_checked_against_that_draft() -> None:
    draft_7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "items": [{"type": "string"}],
    }
    assert definition_of(McpTool(name="legacy", description="d", input_schema=draft_7), FILES) is not None


def test_two_tools_of_one_name_are_both_left_out_and_the_rest_served() -> None:
    listed = [
        McpTool(name="search", description="Searches the articles.", input_schema=SCHEMA),
        McpTool(name="read_file", description="Reads a file.", input_schema=SCHEMA),
        McpTool(name="search", description="Searches the tickets.", input_schema={"type": "object"}),
    ]
    with structlog.testing.capture_logs() as logs:
        served = served_tools(listed, FILES)

    assert [definition.name for definition, _ in served] == ["read_file"]
    [warning] = logs
    assert (
        "two tools of one name" in warning["event"]
        and warning["tool_name"] == "search"
        and warning["times"] == 2
    )


def test_only_a_read_only_or_idempotent_tool_is_sent_again() -> None:
    def hinted(**hints: bool) -> McpTool:
        return McpTool(name="t", input_schema=SCHEMA, annotations=ToolAnnotations(**hints))

    assert may_resend(hinted(read_only_hint=True)) and may_resend(hinted(idempotent_hint=True))
    assert not may_resend(hinted(destructive_hint=False))
    assert not may_resend(McpTool(name="t", input_schema=SCHEMA))


def test_a_result_is_its_structured_content_else_its_text() -> None:
    text = CallToolResult(content=[TextContent(text="line one"), TextContent(text="line two")])
    structured = CallToolResult(content=[TextContent(text="{}")], structured_content={"bytes": 3})
    image = CallToolResult(
        content=[TextContent(text="a chart"), ImageContent(data="QUJD", mime_type="image/png")]
    )

    assert result_value("t", text) == "line one\nline two"
    assert result_value("t", structured) == {"bytes": 3}
    chart, picture = result_value("t", image)
    assert chart == "a chart" and picture["mimeType"] == "image/png" and "data" not in picture


def test_an_is_error_result_raises_its_text_for_the_model() -> None:
    failed = CallToolResult(content=[TextContent(text="no file named a.txt")], is_error=True)

    with pytest.raises(ToolError, match=r"no file named a\.txt"):
        result_value("read_file", failed)
    with pytest.raises(ToolError, match="read_file failed"):
        result_value("read_file", CallToolResult(content=[], is_error=True))


# --- quipu serve mcp: what it takes ------------------------------------------------------------------


def serve(*args: str) -> Result:
    return CliRunner().invoke(cli.app, ["serve", *args], env={"QUIPU_KAFKA_BOOTSTRAP_SERVERS": ""})


def test_serve_mcp_help_says_what_each_form_takes() -> None:
    said = serve("--help").output
    for words in ("mcp", "--toolset", "--url", "COMMAND", "--header", "--server-log", "--timeout-s"):
        assert words in said
    for words in ("--bearer-token-env", "--bearer-token-file", "--oauth-client-id", "--oauth-issuer"):
        assert words in said


def test_serve_mcp_takes_where_the_credentials_are(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[McpToolset] = []
    monkeypatch.setattr(cli_apps, "toolset_definition", served.append)
    monkeypatch.setattr(cli_apps, "serve_beside_running_stack", lambda definition: None)
    url = ("mcp", "--toolset", "search", "--url", "http://h/mcp")

    assert serve(*url, "--bearer-token-env", "SEARCH_TOKEN").exit_code == 0
    assert serve(*url, "--bearer-token-file", "/run/secrets/search").exit_code == 0
    oauth = ("--oauth-client-id", "quipu", "--oauth-issuer", "https://auth.example", "--oauth-scope", "read")
    assert serve(*url, *oauth, "--oauth-client-secret-env", "SEARCH_SECRET").exit_code == 0

    by_env, by_file, by_oauth = served
    assert by_env.bearer_token_env == "SEARCH_TOKEN"
    assert str(by_file.bearer_token_file) == "/run/secrets/search"
    assert by_oauth.oauth == McpOAuth(
        client_id="quipu", issuer="https://auth.example", client_secret_env="SEARCH_SECRET", scope="read"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("mcp", "--", "python", "server.py"), "give --toolset NAME"),
        (("mcp", "--toolset", "files"), "exactly one of"),
        (("mcp", "--toolset", "files", "--url", "http://h/mcp", "--", "python"), "exactly one of"),
        (("mcp", "--toolset", "files", "--url", "ftp://h/mcp"), "http(s) URL"),
        (("mcp", "--toolset", "my files", "--", "python"), "must match"),
        (("mcp", "--toolset", "files", "--url", "http://h/mcp", "--header", "Bearer x"), "'NAME: VALUE'"),
        (("mcp", "--toolset", "files", "--url", "http://h/mcp", "--oauth-client-id", "q"), "--oauth-issuer"),
        (("mcp", "--toolset", "files", "--bearer-token-env", "T", "--", "python"), "not a command"),
    ],
)
def test_serve_mcp_refuses_what_no_executor_could_serve(args: tuple[str, ...], says: str) -> None:
    result = serve(*args)
    assert result.exit_code == 1 and says in result.output, result.output


def test_an_executor_that_cannot_start_says_why_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    class Unstartable:
        def main(self) -> None:
            raise McpUnavailableError(
                "the credentials of toolset 'search': the environment variable T is not set"
            )

    monkeypatch.setattr(cli_apps, "toolset_definition", lambda _toolset: Unstartable())
    result = serve("mcp", "--toolset", "search", "--url", "http://h/mcp", "--bearer-token-env", "T")

    assert result.exit_code == 1
    assert (
        "error: the credentials of toolset 'search': the environment variable T is not set" in result.output
    )
    assert "Traceback" not in result.output


def test_a_command_or_url_belongs_to_serve_mcp_only() -> None:
    assert serve("planner", "--url", "http://h/mcp").exit_code == 2
    assert serve("planner", "--", "python", "server.py").exit_code == 2
    assert serve("mcp", "--app", "mod:app", "--toolset", "files", "--", "python").exit_code == 2
