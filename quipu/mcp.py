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

A server that wants credentials gets them from where a deployment keeps secrets, never from the
code or the command line: `bearer_token_env="SEARCH_TOKEN"` (a variable of the executor's
environment) or `bearer_token_file="/run/secrets/search-token"` (read at every request, so a
rotated Secret takes effect at once), or OAuth 2 client credentials,
`oauth=McpOAuth(client_id=..., client_secret_env=..., issuer=...)`: the executor asks the
server's authorization server for a token (discovered from the server's 401) and again when it
expires. The token and the secret are never logged, shown, or put in an announcement.

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
from typing import Literal
from urllib.parse import urlsplit

from quipu.services.domain.tool_catalog import DEFAULT_MAX_CONCURRENCY, DEFAULT_TIMEOUT_S, TOOL_NAME_PATTERN

__all__ = ["McpOAuth", "McpToolset"]

DEFAULT_CONNECT_TIMEOUT_S = 30.0
"""How long an executor waits for the server at start-up before it gives up."""


def one_secret(env: str, file: str | Path | None, what: str) -> None:
    """Raises ValueError unless exactly one of `env` (a variable's name) and `file` is given."""
    if bool(env) == (file is not None):
        raise ValueError(f"{what}: give exactly one of the environment variable's name or the file")


@dataclass(frozen=True)
class McpOAuth:
    """OAuth 2 client credentials for an MCP server behind an authorization server.

    `client_id` is the client's; its secret is read when the executor connects from the
    environment variable `client_secret_env` or the file `client_secret_file` (exactly one).
    `issuer` is the authorization server's issuer URL: the secret is only ever sent to the token
    endpoint of that issuer's metadata, whatever the MCP server's 401 points to. `scope` is asked
    for when given; `token_endpoint_auth_method` is how the secret is presented (HTTP Basic, or
    in the form body).
    """

    client_id: str
    issuer: str
    client_secret_env: str = ""
    client_secret_file: str | Path | None = None
    scope: str = ""
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"

    def __post_init__(self) -> None:
        if not self.client_id.strip():
            raise ValueError("McpOAuth needs a client_id")
        if urlsplit(self.issuer).scheme not in ("http", "https"):
            raise ValueError("McpOAuth: issuer must be the authorization server's http(s) issuer URL")
        one_secret(self.client_secret_env, self.client_secret_file, "McpOAuth's client secret")

    def __repr__(self) -> str:
        return f"McpOAuth(client_id={self.client_id!r})"


@dataclass(frozen=True)
class McpToolset:
    """An MCP server, reached by `command` (stdio) or `url` (streamable HTTP), served as toolset `name`.

    `version` is announced with its tools; `timeout_s` bounds each call (the executor's
    `max_timeout_s` caps it), `max_concurrency` the calls of one tool running at once in one
    executor; `headers` go with every HTTP request (url only); a url's credentials come from one of
    `bearer_token_env` (the name of the executor's environment variable holding the token),
    `bearer_token_file` (a file holding it, read at every request) or `oauth` (client
    credentials), read when the executor connects, never given here; `env` and
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
    bearer_token_env: str = ""
    bearer_token_file: str | Path | None = None
    oauth: McpOAuth | None = None

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
        self._check_credentials()
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

    def _check_credentials(self) -> None:
        given = [
            name
            for name, value in (
                (
                    "an Authorization header",
                    any(header.lower() == "authorization" for header in self.headers),
                ),
                ("bearer_token_env", bool(self.bearer_token_env)),
                ("bearer_token_file", self.bearer_token_file is not None),
                ("oauth", self.oauth is not None),
            )
            if value
        ]
        if given and not self.url:
            raise ValueError(f"toolset {self.name!r}: {given[0]} is for a url, not a command")
        if len(given) > 1:
            raise ValueError(
                f"toolset {self.name!r}: give one way to authenticate, not {' and '.join(given)}"
            )

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
