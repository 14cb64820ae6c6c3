"""A small MCP server written with the SDK's server API, run as a real process by the MCP tests.

    python tests/mcp_servers/files_server.py ROOT                 # stdio
    python tests/mcp_servers/files_server.py ROOT --http PORT     # streamable HTTP on 127.0.0.1:PORT/mcp
    python tests/mcp_servers/files_server.py ROOT --http PORT --token T   # ... `Authorization: Bearer T` only
    python tests/mcp_servers/files_server.py ROOT --http PORT --oauth ID:SECRET   # ... OAuth 2 tokens only
    python tests/mcp_servers/files_server.py ROOT --legacy        # speaks only the protocol before 2026-07-28
    python tests/mcp_servers/files_server.py ROOT --http PORT --legacy   # ... over streamable HTTP

With `--oauth` the process is also the authorization server (issuer http://127.0.0.1:PORT): it
issues tokens for the client credentials ID:SECRET at `/token`, publishes its metadata and the
MCP endpoint's protected-resource metadata (RFC 8414, RFC 9728), and refuses `/mcp` without a
token it issued (401 pointing at the metadata). It counts the tokens it issued in ROOT/tokens-issued.

It serves the files under ROOT. Besides the tools a user would write (read a file, its size,
append to one), it
has the ones the tests need to misbehave on purpose: one that kills the server mid-call, one that
does so only on its first call (and says it is read-only, so a dropped call may be sent again),
one that waits until it is canceled and leaves a mark when it is, and one whose name Quipu refuses.
Each mark is a file under ROOT, so the test reads what happened in the server process. Two change
the server's tool list while it runs (`add_echo_tool`, `remove_tool`) and tell the client so,
either way the protocol has: on the client's `subscriptions/listen` stream (2026-07-28) or with
a plain `notifications/tools/list_changed` (what servers before 2026-07-28 send).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import time
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp_types import ToolAnnotations
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def build(root: Path) -> MCPServer:
    """The server over the files of `root`."""
    server = MCPServer("files")

    def inside(name: str) -> Path:
        path = (root / name).resolve()
        if root.resolve() not in path.parents:
            raise ToolError(f"{name} is outside the served folder")
        return path

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def read_file(name: str) -> str:
        """The text of a file in the served folder."""
        path = inside(name)
        if not path.is_file():
            raise ToolError(f"no file named {name}")
        return path.read_text()

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def file_size(name: str) -> dict[str, int]:
        """How many bytes a file in the served folder holds."""
        path = inside(name)
        if not path.is_file():
            raise ToolError(f"no file named {name}")
        return {"bytes": path.stat().st_size}

    @server.tool()
    def append_line(name: str, line: str) -> int:
        """Appends a line to a file in the served folder; returns how many lines it holds now."""
        path = inside(name)
        with path.open("a") as file:
            file.write(line + "\n")
        return len(path.read_text().splitlines())

    @server.tool()
    def crash() -> str:
        """Ends the server process abruptly, mid-call."""
        (root / "crashed").write_text("")
        os._exit(3)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def read_once_flaky(name: str) -> str:
        """Like read_file, but the first call ends the server mid-call."""
        mark = root / "flaked"
        if not mark.exists():
            mark.write_text("")
            os._exit(3)
        return inside(name).read_text()

    @server.tool()
    async def wait_forever() -> str:
        """Waits until the call is canceled; leaves the mark `canceled` when it is."""
        (root / "waiting").write_text("")
        try:
            await asyncio.Event().wait()
        finally:
            (root / "canceled").write_text("")
        return "never"

    if (root / "more-tools").exists():  # a server upgraded between two starts

        @server.tool()
        def delete_file(name: str) -> str:
            """Deletes a file in the served folder."""
            inside(name).unlink()
            return "deleted"

    @server.tool(name="files.list")
    def list_files() -> list[str]:
        """Every file's name (its name has a dot, which Quipu's tool names refuse)."""
        return sorted(path.name for path in root.iterdir())

    changing_its_list(server)
    return server


def changing_its_list(server: MCPServer) -> None:
    """The tools that add and remove tools of `server` while it runs, telling the client `how`."""

    async def tell_tools_changed(context: Context, how: Literal["listen", "notification"]) -> None:
        if how == "listen":
            await context.notify_tools_changed()
        else:
            await context.session.send_tool_list_changed()

    @server.tool()
    async def add_echo_tool(name: str, how: Literal["listen", "notification"], context: Context) -> str:
        """Adds a tool called `name` that answers with its text, and tells the clients the list changed."""

        def echo(text: str) -> str:
            return f"{name}: {text}"

        server.add_tool(echo, name=name, description=f"Answers with the text, after {name}.")
        await tell_tools_changed(context, how)
        return "added"

    @server.tool()
    async def remove_tool(name: str, how: Literal["listen", "notification"], context: Context) -> str:
        """Removes the tool called `name`, and tells the clients the list changed."""
        server.remove_tool(name)
        await tell_tools_changed(context, how)
        return "removed"


async def serve_before_2026(server: MCPServer) -> None:
    """Serve stdio as a server before 2026-07-28 does: the initialize handshake only.

    (`MCPServer.run` serves both eras, the client's first request deciding which.)
    """
    lowlevel = server._lowlevel_server
    async with stdio_server() as (read, write), lowlevel.lifespan(lowlevel) as state:
        options = lowlevel.create_initialization_options()
        await serve_loop(lowlevel, read, write, lifespan_state=state, init_options=options)


def handshake_only(app: ASGIApp) -> ASGIApp:
    """`app` as a server before 2026-07-28 answers over HTTP: `server/discover` is an unknown
    method, so a client falls back to the initialize handshake (the SDK's HTTP app serves both)."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = json.loads(body or b"null")
        if isinstance(request, dict) and request.get("method") == "server/discover":
            refusal = {
                "jsonrpc": "2.0",
                "id": request.get("id"),
                "error": {"code": -32601, "message": "Method not found"},
            }
            await JSONResponse(refusal)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)

    return guarded


def bearer_only(app: ASGIApp, token: str) -> ASGIApp:
    """`app` for requests that carry `Authorization: Bearer <token>`; 401 for any other."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def oauth_only(
    app: ASGIApp, root: Path, port: int, client_id: str, client_secret: str, lifetime_s: int
) -> ASGIApp:
    """`app` behind OAuth 2 client credentials, with this process as the authorization server;
    a token it issues is refused `lifetime_s` seconds later."""
    origin = f"http://127.0.0.1:{port}"
    resource_metadata = f"{origin}/.well-known/oauth-protected-resource/mcp"
    issued: dict[str, float] = {}
    """Each token issued, and when it stops being accepted (monotonic)."""
    expected_basic = base64.b64encode(f"{quote(client_id, safe='')}:{quote(client_secret, safe='')}".encode())

    async def protected_resource(_request: Request) -> Response:
        return JSONResponse({"resource": f"{origin}/mcp", "authorization_servers": [origin]})

    async def authorization_server(_request: Request) -> Response:
        return JSONResponse(
            {
                "issuer": origin,
                "authorization_endpoint": f"{origin}/authorize",
                "token_endpoint": f"{origin}/token",
                "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                "response_types_supported": ["code"],
            }
        )

    async def token(request: Request) -> Response:
        form = await request.form()
        if request.headers.get("authorization", "").encode() != b"Basic " + expected_basic:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        if form.get("grant_type") != "client_credentials":
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        access_token = secrets.token_urlsafe(24)
        issued[access_token] = time.monotonic() + lifetime_s
        (root / "tokens-issued").write_text(str(len(issued)))
        return JSONResponse({"access_token": access_token, "token_type": "Bearer", "expires_in": lifetime_s})

    authorization = Starlette(
        routes=[
            Route("/.well-known/oauth-protected-resource/mcp", protected_resource),
            Route("/.well-known/oauth-protected-resource", protected_resource),
            Route("/.well-known/oauth-authorization-server", authorization_server),
            Route("/token", token, methods=["POST"]),
        ]
    )

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/mcp"):
            await (authorization if scope["type"] == "http" else app)(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"").decode()
        if issued.get(given.removeprefix("Bearer "), 0.0) < time.monotonic():
            challenge = f'Bearer resource_metadata="{resource_metadata}"'.encode()
            await send(
                {"type": "http.response.start", "status": 401, "headers": [(b"www-authenticate", challenge)]}
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    """Serve on stdio, or on streamable HTTP with --http PORT (behind a bearer token with --token)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--http", type=int, default=0, help="Serve streamable HTTP on this loopback port.")
    parser.add_argument("--token", default="", help="With --http: refuse requests without this bearer token.")
    parser.add_argument("--oauth", default="", help="With --http: OAuth 2 client credentials ID:SECRET only.")
    parser.add_argument(
        "--token-lifetime-s", type=int, default=3600, help="With --oauth: how long a token lasts."
    )
    parser.add_argument("--legacy", action="store_true", help="Speak only the protocol before 2026-07-28.")
    arguments = parser.parse_args()
    server = build(arguments.root)
    if arguments.legacy and not arguments.http:
        anyio.run(serve_before_2026, server)
        return
    if not arguments.http:
        server.run()
        return
    app: ASGIApp = server.streamable_http_app()
    if arguments.legacy:
        app = handshake_only(app)
    if arguments.token:
        app = bearer_only(app, arguments.token)
    if arguments.oauth:
        client_id, _, client_secret = arguments.oauth.partition(":")
        lifetime_s = arguments.token_lifetime_s
        app = oauth_only(app, arguments.root, arguments.http, client_id, client_secret, lifetime_s)
    uvicorn.run(app, host="127.0.0.1", port=arguments.http)


if __name__ == "__main__":
    main()
