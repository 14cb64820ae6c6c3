"""An MCP server as the executor's tools: the one module that imports the `mcp` SDK.

`McpTools(toolset).open(opened)` connects (stdio: the command as a subprocess; else streamable
HTTP), lists the server's tools and returns the catalog and implementations the `ToolRunner`
runs, so an MCP tool goes through the same validation, deadline, cancellation, concurrency limit
and record of results as any other (see `quipu.mcp` for what a user is promised).

One task owns the connection (`McpConnection`): the SDK's client is an anyio context that must be
entered and left by the same task, and the owner is also what connects again when it drops. It
learns that the connection dropped from the transport's read side ending (a stdio server that
exits, even while idle) or from a call failing on it; it then leaves the old client and enters a
new one, waiting between failed attempts (doubling, capped). Calls wait for a connection, bounded
by their deadline.

The owner also follows the server's tool list: a server announces a change with
`notifications/tools/list_changed` (on a 2026-07-28 session only to a client that opened a
`subscriptions/listen` stream, which the owner keeps open; before that, sent to every session),
and a new session after a drop may find another list. Either way the owner lists the tools
again and, when they differ from what was announced, hands them to `McpTools.follow`'s listener
(the executor serves and announces them).

Nothing here logs arguments, results or the server's error texts: only tool names, error types
and counts.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TextIO

import anyio
import httpx2
from jsonschema.exceptions import SchemaError
from jsonschema.validators import Draft202012Validator, validator_for
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client._transport import TransportStreams
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp.shared.message import SessionMessage
from mcp_types import CallToolResult, EmbeddedResource, TextContent, ToolListChangedNotification
from mcp_types import Tool as McpTool
from mcp_types.jsonrpc import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, ValidationError

from quipu.contracts.errors import QuipuError
from quipu.mcp import McpToolset
from quipu.services.domain.tool_catalog import TOOL_NAME_PATTERN, ToolCatalog, ToolDefinition
from quipu.services.kit.lifecycle import Opened
from quipu.services.kit.logging import get_logger
from quipu.tools import ToolContext, ToolError, ToolImplementation

logger = get_logger(__name__)

FIRST_RECONNECT_DELAY_S = 0.1
MAX_RECONNECT_DELAY_S = 5.0
"""Waits between failed connection attempts double from the first up to this."""

CLOSE_GRACE_S = 5.0
"""How long closing waits for the SDK to end the session (it stops a stdio server within ~4 s)."""

MAX_TOOL_PAGES = 100
"""A server whose `tools/list` pages never end is cut here."""

MAX_RELISTEN_DELAY_S = 60.0
"""Waits between `subscriptions/listen` streams that end (each end re-lists the tools) double up to this."""


class McpUnavailableError(QuipuError):
    """Raised when an executor cannot reach its MCP server at start-up within `connect_timeout_s`."""


# --- what the model sees: an MCP tool as a definition --------------------------------------------


class McpArguments(BaseModel):
    """Arguments of an MCP tool: passed to the server as given; the server validates them.

    Each MCP tool gets a subclass whose JSON schema is the tool's own `inputSchema`.
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    input_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The MCP tool's `inputSchema`, unchanged (pydantic's own would describe no field)."""
        return copy.deepcopy(cls.input_schema)

    def values(self) -> dict[str, Any]:
        """The arguments as the model gave them."""
        return dict(self.__pydantic_extra__ or {})


def arguments_model(tool_name: str, input_schema: Mapping[str, Any]) -> type[McpArguments]:
    """The arguments model of one MCP tool."""
    return type(
        f"{tool_name}Arguments",
        (McpArguments,),
        {"input_schema": dict(input_schema), "__doc__": f"Arguments of the MCP tool `{tool_name}`."},
    )


def schema_fault(schema: Mapping[str, Any]) -> str | None:
    """Why `schema` cannot be a tool's argument schema, or None: it must be a valid JSON schema
    (of the draft its `$schema` names, else 2020-12) of an object, as every model provider asks."""
    if schema.get("type") != "object":
        return "its inputSchema is not a JSON schema of type object"
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as error:
        where = "/".join(str(step) for step in error.absolute_path) or "its root"
        return f"its inputSchema is not a valid JSON schema (keyword {error.validator!r} at {where})"
    return None


def definition_of(tool: McpTool, toolset: McpToolset) -> ToolDefinition | None:
    """The definition of an MCP tool, or None (with a warning naming why) for a tool no model could
    be offered: a name Quipu's models refuse, or an input schema that is not a JSON schema."""
    if not TOOL_NAME_PATTERN.fullmatch(tool.name):
        logger.warning(
            "MCP tool left out: its name does not match the tool name pattern",
            toolset=toolset.name,
            tool_name=tool.name[:128],
            pattern=TOOL_NAME_PATTERN.pattern,
        )
        return None
    fault = schema_fault(tool.input_schema)
    if fault is not None:
        logger.warning(f"MCP tool left out: {fault}", toolset=toolset.name, tool_name=tool.name)
        return None
    description = (tool.description or tool.title or "").strip() or f"The MCP tool {tool.name}."
    return ToolDefinition(
        name=tool.name,
        description=description,
        arguments=arguments_model(tool.name, tool.input_schema),
        timeout_s=toolset.timeout_s,
        max_concurrency=toolset.max_concurrency,
    )


def served_tools(listed: list[McpTool], toolset: McpToolset) -> list[tuple[ToolDefinition, McpTool]]:
    """What is served of a server's list: each tool a model can be offered, by the name the server
    gives it. A name the list holds twice is left out both times (with a warning): a call by that
    name could reach either, under a schema and description the model was not shown."""
    counts = Counter(tool.name for tool in listed)
    for name in sorted(name for name, count in counts.items() if count > 1):
        logger.warning(
            "MCP tools left out: the server lists two tools of one name",
            toolset=toolset.name,
            tool_name=name[:128],
            times=counts[name],
        )
    served = []
    for tool in listed:
        definition = definition_of(tool, toolset) if counts[tool.name] == 1 else None
        if definition is not None:
            served.append((definition, tool))
    return served


def may_resend(tool: McpTool) -> bool:
    """Whether a call whose connection dropped may be sent again: the server says it is read-only
    or idempotent (hints, but the only word the server gives on it)."""
    hints = tool.annotations
    return hints is not None and bool(hints.read_only_hint or hints.idempotent_hint)


# --- what the model reads: a tool result as content -----------------------------------------------


def block_content(block: Any) -> Any:
    """One content block: its text, or its description without inline binary data."""
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, EmbeddedResource):
        text = getattr(block.resource, "text", None)
        if text is not None:
            return {"type": "resource", "uri": str(block.resource.uri), "text": text}
    described: dict[str, Any] = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    data = described.pop("data", None)
    if isinstance(data, str):
        described["omitted"] = f"{len(data)} characters of base64 data not shown"
    return described


def result_value(tool_name: str, result: CallToolResult) -> Any:
    """The result the model reads: structured content if any, else the text; raises ToolError for
    a result the server marks as an error (the model reads its text)."""
    parts = [block_content(block) for block in result.content]
    texts = [part for part in parts if isinstance(part, str)]
    if result.is_error:
        raise ToolError("\n".join(texts) or (json.dumps(parts) if parts else f"{tool_name} failed"))
    if result.structured_content is not None:
        return result.structured_content
    if len(texts) == len(parts):
        return "\n".join(texts)
    return parts


# --- the connection ---------------------------------------------------------------------------------


@asynccontextmanager
async def watched(
    transport: AbstractAsyncContextManager[TransportStreams], on_end: Callable[[], None]
) -> AsyncIterator[TransportStreams]:
    """`transport`, calling `on_end` when its read side ends (the server exited or hung up)."""
    async with transport as (read, write):
        forward, received = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def pump() -> None:
            try:
                async with forward:
                    async for item in read:
                        await forward.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the session closed first: we are leaving anyway
            finally:
                on_end()

        async with anyio.create_task_group() as group:
            group.start_soon(pump)
            try:
                yield received, write
            finally:
                group.cancel_scope.cancel()


HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
"""The SDK's own defaults: a response stream may stay open for minutes (calls have their deadline)."""


@asynccontextmanager
async def http_transport(
    url: str, headers: Mapping[str, str], auth: httpx2.Auth | None = None
) -> AsyncIterator[TransportStreams]:
    """The streamable HTTP transport to `url`, every request carrying `headers` and `auth`."""
    async with (
        httpx2.AsyncClient(headers=dict(headers), timeout=HTTP_TIMEOUT, auth=auth) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


# --- credentials: read where a deployment keeps its secrets, never logged -------------------------


def secret_reader(env: str, file: str | Path | None, what: str) -> Callable[[], str]:
    """Reads a secret: the environment variable `env` (once, now) or the file (now and at each
    call, so a rotated file takes effect). Raises McpUnavailableError naming where it looked."""
    if env:
        value = os.environ.get(env, "").strip()
        if not value:
            raise McpUnavailableError(f"{what}: the environment variable {env} is not set")
        return lambda: value
    path = Path(file or "")

    def read() -> str:
        return path.read_text(encoding="utf-8").strip()

    try:
        first = read()
    except OSError as error:
        raise McpUnavailableError(f"{what}: cannot read {path} ({type(error).__name__})") from None
    if not first:
        raise McpUnavailableError(f"{what}: {path} is empty")
    return read


class BearerToken(httpx2.Auth):
    """`Authorization: Bearer <token>` on every request, the token read from its source each time."""

    def __init__(self, token: Callable[[], str]) -> None:
        self._token = token

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        """Send `request` with the token."""
        request.headers["Authorization"] = f"Bearer {self._token()}"
        yield request


class RememberedTokens(TokenStorage):
    """The OAuth tokens of one executor, in its memory: a restarted executor asks for a new one."""

    def __init__(self) -> None:
        self._tokens: OAuthToken | None = None
        self._client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        """The token last issued, if any."""
        return self._tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Keep the token just issued."""
        self._tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        """The client's registration (client credentials need none)."""
        return self._client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Keep the client's registration."""
        self._client = client_info


def http_auth(toolset: McpToolset) -> httpx2.Auth | None:
    """How `toolset`'s requests authenticate (None: only its headers); raises McpUnavailableError
    when a secret it names cannot be read."""
    what = f"the credentials of toolset {toolset.name!r}"
    if toolset.bearer_token_env or toolset.bearer_token_file is not None:
        return BearerToken(secret_reader(toolset.bearer_token_env, toolset.bearer_token_file, what))
    oauth = toolset.oauth
    if oauth is None:
        return None
    secret = secret_reader(oauth.client_secret_env, oauth.client_secret_file, what)
    return ClientCredentialsOAuthProvider(
        server_url=toolset.url,
        storage=RememberedTokens(),
        client_id=oauth.client_id,
        client_secret=secret(),
        token_endpoint_auth_method=oauth.token_endpoint_auth_method,
        scope=oauth.scope or None,
        issuer=oauth.issuer,
    )


LIST_TIMEOUT_S = 10.0
"""How long listing the tools again (after a change, or on a new session) may take."""


async def listed_tools(client: Client) -> list[McpTool]:
    """Every tool `client`'s server lists (all pages, at most MAX_TOOL_PAGES)."""
    tools: list[McpTool] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def tool_shapes(tools: list[McpTool]) -> dict[str, str]:
    """What the executor serves of each tool (description, schema, hints) as sorted JSON, by name."""
    return {
        tool.name: json.dumps(
            [
                tool.description,
                tool.title,
                tool.input_schema,
                tool.annotations and tool.annotations.model_dump(),
            ],
            sort_keys=True,
            default=str,
        )
        for tool in tools
    }


ToolsChanged = Callable[[list[McpTool]], Awaitable[None]]
"""Told the server's whole new tool list when it differs from the one last served."""


def innermost(error: BaseException | None) -> BaseException | None:
    """The first error inside task groups' exception groups: the one that says what failed."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


class ConnectionLostError(QuipuError):
    """The connection a call was sent on dropped before its answer; not retryable, since the call
    may have taken effect."""


class McpConnection:
    """One MCP server's session, held by a task of its own and entered again when it drops."""

    def __init__(self, toolset: McpToolset) -> None:
        self._toolset = toolset
        self._client: Client | None = None
        self._connected = asyncio.Event()
        """Set while `_client` is a live session."""
        self._lost = asyncio.Event()
        """Set when the session in use dropped (or is being closed): the owner leaves it."""
        self._closing = False
        self._owner: asyncio.Task[None] | None = None
        self._last_error: BaseException | None = None
        self._server_log_file: TextIO | None = None
        self._auth: httpx2.Auth | None = None
        self._announced: dict[str, str] | None = None
        """What is served of each tool (`tool_shapes`), by name."""
        self._tools_changed: ToolsChanged | None = None
        self._following = asyncio.Event()
        """Set once a listener follows the tool list: until then a change waits (it is not lost)."""
        self._maybe_changed = asyncio.Event()
        """Set when the tool list may have changed: the owner lists the tools again."""
        self.connections = 0
        """How many sessions were established (1 + reconnections); each is a generation."""

    def _transport(self) -> AbstractAsyncContextManager[TransportStreams]:
        toolset = self._toolset
        if toolset.url:
            return http_transport(toolset.url, toolset.headers, self._auth)
        command, *args = toolset.command
        parameters = StdioServerParameters(command=command, args=args, env=dict(toolset.env), cwd=toolset.cwd)
        # The server's stderr is its own log, which may quote what it was called with: never ours.
        return stdio_client(parameters, errlog=self._server_log())

    def _server_log(self) -> TextIO:
        if self._server_log_file is None:
            where = self._toolset.server_log or os.devnull
            self._server_log_file = open(where, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        return self._server_log_file

    async def start(self) -> None:
        """Connect; raises McpUnavailableError when no session is up within `connect_timeout_s`, or
        when a credential the toolset names cannot be read."""
        self._auth = http_auth(self._toolset)
        self._owner = asyncio.create_task(self._hold(), name=f"mcp {self._toolset.name}")
        try:
            async with asyncio.timeout(self._toolset.connect_timeout_s):
                await self._connected.wait()
        except TimeoutError:
            await self.stop()
            error = innermost(self._last_error)
            why = f": {type(error).__name__}" if error is not None else ""
            if error is not None and not self._toolset.url:
                why += f": {error}"  # a command's failure names the program; an HTTP one may quote the URL
            raise McpUnavailableError(
                f"MCP server of toolset {self._toolset.name!r} ({self._toolset.transport}) not reachable "
                f"within {self._toolset.connect_timeout_s:g} s{why}"
            ) from None

    async def stop(self) -> None:
        """Leave the session (a stdio server is stopped) and stop connecting."""
        self._closing = True
        self._lose(self.connections)
        owner, self._owner = self._owner, None
        if owner is not None:
            try:
                async with asyncio.timeout(CLOSE_GRACE_S):
                    await asyncio.shield(owner)
            except TimeoutError:
                owner.cancel()
                await asyncio.gather(owner, return_exceptions=True)
        if self._server_log_file is not None:
            self._server_log_file.close()
            self._server_log_file = None
        self._connected.set()  # wakes the calls waiting for a session: they see it is closing

    @property
    def protocol_version(self) -> str | None:
        """The MCP protocol version of the live session, None while there is none."""
        return self._client.protocol_version if self._client is not None else None

    def _lose(self, generation: int) -> None:
        """The session of `generation` dropped: stop handing it out, and have the owner leave it."""
        if generation == self.connections:
            self._client = None
            self._connected.clear()
            self._lost.set()

    async def _hold(self) -> None:
        delay = FIRST_RECONNECT_DELAY_S
        while not self._closing:
            self._lost.clear()
            generation = self.connections + 1
            try:
                transport = watched(self._transport(), partial(self._lose, generation))
                async with Client(transport, cache=None, message_handler=self._on_message) as client:
                    self.connections = generation
                    self._client = client
                    self._last_error = None
                    self._connected.set()
                    delay = FIRST_RECONNECT_DELAY_S
                    if generation > 1:
                        logger.info("reconnected to the MCP server", toolset=self._toolset.name)
                        self._maybe_changed.set()  # a new session (or a new server) may list other tools
                    await self._serve_session(client)
            except Exception as error:  # whatever the transport raises, the answer is to connect again
                self._last_error = error
            finally:
                self._lose(generation)
            if self._closing:
                return
            logger.warning(
                "MCP server connection lost; connecting again",
                toolset=self._toolset.name,
                error_type=type(self._last_error).__name__ if self._last_error else None,
                retry_in_s=delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RECONNECT_DELAY_S)

    async def _serve_session(self, client: Client) -> None:
        """Follow the session's tool list until it is lost."""
        async with anyio.create_task_group() as group:
            capabilities = client.server_capabilities.tools
            if (
                client.protocol_version in MODERN_PROTOCOL_VERSIONS
                and capabilities
                and capabilities.list_changed
            ):
                group.start_soon(self._listen, client)
            group.start_soon(self._follow_tools, client)
            await self._lost.wait()
            group.cancel_scope.cancel()

    async def _on_message(self, message: IncomingMessage) -> None:
        # A server before 2026-07-28 sends the change to every session, unasked.
        if isinstance(message, ToolListChangedNotification):
            self._maybe_changed.set()

    async def _listen(self, client: Client) -> None:
        """Keep a `subscriptions/listen` stream for tool list changes open (2026-07-28 sessions)."""
        delay = FIRST_RECONNECT_DELAY_S
        while True:
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    async for _ in subscription:
                        self._maybe_changed.set()
                        delay = FIRST_RECONNECT_DELAY_S
            except Exception as error:  # a lost stream (or a refused one): listen again, later
                logger.info(
                    "MCP change stream ended", toolset=self._toolset.name, error_type=type(error).__name__
                )
            # No replay: whatever changed while no stream was open is found by listing again.
            self._maybe_changed.set()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RELISTEN_DELAY_S)

    async def _follow_tools(self, client: Client) -> None:
        """List the tools again each time they may have changed; hand a changed list to the listener."""
        while True:
            await self._maybe_changed.wait()
            await self._following.wait()
            self._maybe_changed.clear()
            try:
                async with asyncio.timeout(LIST_TIMEOUT_S):
                    tools = await listed_tools(client)
            except (
                Exception
            ) as error:  # a dropped session is noticed by the owner; a slow list is tried later
                logger.warning(
                    "listing the MCP server's tools again failed",
                    toolset=self._toolset.name,
                    error_type=type(error).__name__,
                )
                await self._retry_later()
                continue
            await self._changed(tools)

    async def _changed(self, tools: list[McpTool]) -> None:
        shapes, announced = tool_shapes(tools), self._announced or {}
        if shapes == announced or self._tools_changed is None:
            return
        logger.info(
            "the MCP server's tools changed: announcing them",
            toolset=self._toolset.name,
            added=sorted(set(shapes) - set(announced)),
            removed=sorted(set(announced) - set(shapes)),
            changed=sorted(name for name in set(shapes) & set(announced) if shapes[name] != announced[name]),
        )
        try:
            await self._tools_changed(tools)
        except Exception as error:  # the announcement failed (the broker?): the next try sends it
            logger.warning(
                "serving the MCP server's changed tools failed",
                toolset=self._toolset.name,
                error_type=type(error).__name__,
            )
            await self._retry_later()
            return
        self._announced = shapes

    async def _retry_later(self) -> None:
        await asyncio.sleep(MAX_RECONNECT_DELAY_S)
        self._maybe_changed.set()

    def follow(self, tools_changed: ToolsChanged) -> None:
        """Have `tools_changed` told each new tool list that differs from the one last served."""
        self._tools_changed = tools_changed
        self._following.set()

    async def _session(self) -> tuple[Client, int]:
        """The live client and its generation, once there is one (callers' deadlines bound the wait)."""
        while True:
            if self._closing:
                raise ToolError(f"the MCP server of toolset {self._toolset.name!r} is shutting down")
            await self._connected.wait()
            client = self._client
            if client is not None:
                return client, self.connections

    async def list_tools(self) -> list[McpTool]:
        """Every tool the server lists (all pages); a later session's list is checked against it."""
        client, _ = await self._session()
        tools = await listed_tools(client)
        self._announced = tool_shapes(tools)
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], *, resend: bool) -> CallToolResult:
        """`tools/call`; sent once more on a new connection when `resend` and the first one dropped.

        Raises ConnectionLostError when the connection dropped and the call may not be sent again,
        MCPError for the server's refusal, ValidationError for an answer that is not MCP.
        """
        for attempt in (1, 2):
            client, generation = await self._session()
            try:
                return await client.call_tool(name, arguments)
            except MCPError as error:
                if error.code != CONNECTION_CLOSED:
                    raise
            except ValidationError:
                raise
            except Exception:  # a transport failure: the session is in an unknown state
                pass
            self._lose(generation)
            if not resend or attempt == 2:
                raise ConnectionLostError(name)
            logger.info("MCP call sent again after its connection dropped", toolset=self._toolset.name)
        raise AssertionError("unreachable")  # pragma: no cover


ServedTools = Callable[[ToolCatalog, Mapping[str, ToolImplementation]], Awaitable[None]]
"""Serves (and announces) a toolset's new catalog and implementations."""


class McpTools:
    """The tools of one MCP server, for a `ToolExecutorDeps.source`."""

    def __init__(self, toolset: McpToolset) -> None:
        self.toolset = toolset
        self.connection = McpConnection(toolset)

    async def open(self, opened: Opened) -> tuple[ToolCatalog, dict[str, ToolImplementation]]:
        """Connect, list the server's tools, and say how each is called (closed with the executor)."""
        await self.connection.start()
        opened.on_close(self.connection.stop)
        listed = await self.connection.list_tools()
        catalog, implementations = self._served(listed)
        logger.info(
            "MCP server connected",
            toolset=self.toolset.name,
            transport=self.toolset.transport,
            protocol_version=self.connection.protocol_version,
            tools=len(catalog),
            left_out=len(listed) - len(catalog),
        )
        return catalog, implementations

    def follow(self, serve: ServedTools) -> None:
        """From now on, have `serve` serve each changed tool list of the server (see the module doc)."""

        async def changed(listed: list[McpTool]) -> None:
            await serve(*self._served(listed))

        self.connection.follow(changed)

    def _served(self, listed: list[McpTool]) -> tuple[ToolCatalog, dict[str, ToolImplementation]]:
        served = served_tools(listed, self.toolset)
        catalog = ToolCatalog(definition for definition, _ in served)
        implementations = {
            definition.name: self._caller(definition.name, resend=may_resend(tool))
            for definition, tool in served
        }
        return catalog, implementations

    def _caller(self, name: str, *, resend: bool) -> ToolImplementation:
        connection, toolset = self.connection, self.toolset.name

        async def call(arguments: McpArguments, _context: ToolContext) -> Any:
            try:
                result = await connection.call_tool(name, arguments.values(), resend=resend)
            except ConnectionLostError:
                raise ToolError(
                    f"the MCP server of toolset {toolset!r} went away during the call to {name}; the call "
                    "may or may not have taken effect and was not sent again"
                ) from None
            except MCPError as error:
                raise ToolError(f"the MCP server refused the call to {name}: {error.message}") from None
            except ValidationError:
                raise ToolError(f"the MCP server answered {name} with a result that is not MCP") from None
            return result_value(name, result)

        return call
