"""An MCP server as a toolset: its tools announced and called like those of any `Toolset`.

    import quipu

    files = quipu.McpToolset("files", command=["python", "-m", "mypkg.files_server"])   # stdio
    search = quipu.McpToolset("search", url="http://search.internal:8000/mcp")         # streamable HTTP

An `McpToolset` is a declaration: nothing is started or connected until an executor serves it
(`quipu serve mcp --toolset files -- python -m mypkg.files_server`, or a `quipu.App` that lists it).
That executor then

- starts the command as a subprocess and talks MCP over its stdin/stdout, or connects to the URL
  with the streamable HTTP transport; the server's environment is the SDK's few safe variables
  (`HOME`, `PATH`, ...) and `env`, never the executor's own (its keys and settings stay with it);
- lists the server's tools and announces them on `tools.registry` as toolset `name`: each MCP
  tool's name, description and `inputSchema`, with `timeout_s` as its deadline. A tool whose name
  Quipu refuses (`^[A-Za-z0-9_-]{1,64}$`: MCP also allows dots and longer names) is left out with a
  warning rather than renamed, so an agent always calls a tool by the name its server gives it;
- serves each call with `tools/call`: the structured content when the server gives one, else the
  text; a result the server marks `isError` goes back to the model as an error result;
- when the server dies or the connection drops, connects again (backoff doubling up to a few
  seconds). A call in flight then is answered with an error result, unless the server declares
  the tool read-only or idempotent (`readOnlyHint`, `idempotentHint`): that call is sent once more
  on the new connection. A call waits for a connection at most until its deadline;
- when the server says its tool list changed (`notifications/tools/list_changed`), or a new
  connection finds another list, lists the tools again and serves and announces the new list.

A canceled run cancels its MCP requests in flight (the SDK sends `notifications/cancelled`); a call
past its deadline is canceled the same way. The server validates the arguments itself: its refusal
is the error result the model reads. Several executors of one `McpToolset` share its calls, each
with a server of its own (stdio) or a connection of its own (HTTP).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from quipu.services.domain.tool_catalog import DEFAULT_MAX_CONCURRENCY, DEFAULT_TIMEOUT_S, TOOL_NAME_PATTERN

__all__ = ["McpToolset"]

DEFAULT_CONNECT_TIMEOUT_S = 30.0
"""How long an executor waits for the server at start-up before it gives up."""


@dataclass(frozen=True)
class McpToolset:
    """An MCP server, reached by `command` (stdio) or `url` (streamable HTTP), served as toolset `name`.

    `version` is announced with its tools; `timeout_s` bounds each call (the executor's
    `max_timeout_s` caps it), `max_concurrency` the calls of one tool running at once in one
    executor; `headers` go with every HTTP request (url only: `Authorization`, say); `env` and
    `cwd` are the subprocess's (stdio only), and its stderr is appended to the file
    `server_log` (else discarded: a server's own log may quote its arguments, and the executor's
    never does); `connect_timeout_s` bounds the first connection at start-up. Raises ValueError for
    a declaration no executor could serve.
    """

    name: str
    command: Sequence[str] = ()
    url: str = ""
    version: str = "1"
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    env: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    cwd: str | Path | None = None
    server_log: str | Path | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not TOOL_NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"toolset name {self.name!r} must match {TOOL_NAME_PATTERN.pattern}")
        if not self.version.strip():
            raise ValueError(f"toolset {self.name!r} needs a version")
        if isinstance(self.command, str):
            raise ValueError(f"toolset {self.name!r}: command is a list of arguments, not one string")
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        if bool(self.command) == bool(self.url):
            raise ValueError(f"toolset {self.name!r} needs exactly one of command=[...] or url=...")
        if self.headers and not self.url:
            raise ValueError(f"toolset {self.name!r}: headers are a url's, not a command's")
        if self.url:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"toolset {self.name!r}: url must be an http(s) URL such as http://host:8000/mcp"
                )
            if self.env or self.cwd is not None or self.server_log is not None:
                raise ValueError(
                    f"toolset {self.name!r}: env, cwd and server_log are for a command, not a url"
                )
        if not self.timeout_s > 0 or not self.connect_timeout_s > 0:
            raise ValueError(f"toolset {self.name!r}: timeout_s and connect_timeout_s must be positive")
        if self.max_concurrency < 1:
            raise ValueError(f"toolset {self.name!r}: max_concurrency must be at least 1")

    def tool_names(self) -> frozenset[str] | None:
        """None: the server says which tools it has once an executor connects (`quipu.App` reads this)."""
        return None

    @property
    def transport(self) -> str:
        """`stdio` or `streamable-http`."""
        return "stdio" if self.command else "streamable-http"

    def __repr__(self) -> str:
        # The URL and headers may carry credentials and the environment secrets: none is shown.
        return f"McpToolset({self.name!r}, transport={self.transport!r}, version={self.version!r})"
