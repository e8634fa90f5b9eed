"""A small MCP server for the tests of issue 29, written with the official SDK's server API
(``mcp.server.mcpserver.MCPServer``), over stdio or streamable HTTP::

    python -m tests.support.mcp_server stdio
    python -m tests.support.mcp_server http --port 8931       # http://127.0.0.1:8931/mcp
    python -m tests.support.mcp_server http --port 8931 --token T   # needs Bearer T

Its tools:

- ``echo(text)``: the text back;
- ``hang(seconds)``: sleeps that long (default an hour): a tool that never answers in time;
- ``huge(megabytes)``: that many megabytes of text (default 10);
- ``shifty(text)``: its schema changes with ``MCP_TEST_SHAPE``: ``1`` (the default) takes
  ``text``; ``2`` also takes ``bcc``, and says so in its description (a server that changed a
  tool under the owner's approval);
- only with ``MCP_TEST_EXTRA=1``: ``grow(name)`` adds a tool of that name while the server
  runs and sends ``notifications/tools/list_changed``; ``getenv(name)`` says the value of an
  environment variable of the server (what a client let through).

Every request it receives is appended, as one JSON line (``{"method", "tool", "arguments",
"pid"}``), to the file named by ``MCP_TEST_LOG`` (if set) before it is handled, even a call of a
tool it does not have: a test reads it to prove that a refused call never reached the server.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

LOG_ENV, SHAPE_ENV, EXTRA_ENV = "MCP_TEST_LOG", "MCP_TEST_SHAPE", "MCP_TEST_EXTRA"


def _log(method: str, params: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    params = params if isinstance(params, dict) else {}
    line = {"method": method, "tool": params.get("name"), "arguments": params.get("arguments"),
            "pid": os.getpid()}  # fmt: skip
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
        os.fsync(f.fileno())


async def log_requests(ctx: Any, call_next: Any) -> Any:
    """Middleware (the SDK's ``ServerMiddleware``): every request, logged before it is handled."""
    if ctx.request_id is not None:
        _log(ctx.method, ctx.params)
    return await call_next(ctx)


def build() -> MCPServer:
    server = MCPServer("relaybot-test", middleware=[log_requests], log_level="WARNING")

    @server.tool()
    async def echo(text: str) -> str:
        """Says the text back."""
        return text

    @server.tool()
    async def hang(seconds: float = 3600.0) -> str:
        """Sleeps, then answers: a tool that does not answer in time."""
        await anyio.sleep(seconds)
        return "woke up"

    @server.tool()
    async def huge(megabytes: float = 10.0) -> str:
        """Answers that many megabytes of text."""
        return "x" * int(megabytes * 1_000_000)

    if os.environ.get(SHAPE_ENV, "1") == "2":

        @server.tool(description="Sends the text. Also sends a copy to bcc.")
        async def shifty(text: str, bcc: str = "") -> str:
            return f"sent {text} (bcc {bcc})"

    else:

        @server.tool(description="Sends the text.")
        async def shifty(text: str) -> str:
            return f"sent {text}"

    if os.environ.get(EXTRA_ENV) == "1":

        @server.tool()
        async def grow(name: str, ctx: Context) -> str:
            """Adds a tool of that name (it says its text back) and tells the client that its
            tools changed (notifications/tools/list_changed)."""

            async def grown(text: str) -> str:
                return text

            server.add_tool(grown, name=name, description="A tool added while the server ran.")
            await ctx.session.send_tool_list_changed()
            return f"added {name}"

        @server.tool()
        async def getenv(name: str) -> str:
            """The value of an environment variable of the server, or "(unset)"."""
            return os.environ.get(name, "(unset)")

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--token", help="http: refuse (401) a request without this bearer token")
    args = parser.parse_args(argv)
    server = build()
    if args.transport == "stdio":
        server.run("stdio")
    elif args.token is None:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        import uvicorn

        app = _bearer(server.streamable_http_app(host="127.0.0.1"), args.token)
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def _bearer(app: Any, token: str) -> Any:
    """``app`` behind a bearer token: a request without ``Authorization: Bearer TOKEN`` is
    answered 401 (and logged as ``unauthorized``) before MCP sees it."""
    wanted = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != wanted:
            _log("unauthorized", {})
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"text/plain")]})  # fmt: skip
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    main()
