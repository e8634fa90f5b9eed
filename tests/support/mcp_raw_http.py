"""A hand-written streamable HTTP MCP server for issue 29's tests (stdlib only): it starts, lists
its one tool (``t``) and answers calls as MCP says, in plain JSON responses, but answers
``ping`` with JSON-RPC's "method not found" (an old or minimal server: alive, without ping)::

    python -m tests.support.mcp_raw_http PORT      # http://127.0.0.1:PORT/mcp

Each request's method is appended to ``$MCP_TEST_LOG`` (one JSON line) when it is set."""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOLS = [{"name": "t", "description": "a tool", "inputSchema": {"type": "object"}}]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # no stream of server messages
        self._empty(405)

    def do_DELETE(self) -> None:
        self._empty(200)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        method, mid = body.get("method"), body.get("id")
        if os.environ.get("MCP_TEST_LOG"):
            with open(os.environ["MCP_TEST_LOG"], "a", encoding="utf-8") as f:
                f.write(json.dumps({"method": method, "tool": None, "pid": os.getpid()}) + "\n")
        if mid is None:
            self._empty(202)
            return
        answer: dict[str, Any]
        if method == "initialize":
            answer = {"result": {"protocolVersion": body["params"]["protocolVersion"],
                                 "capabilities": {"tools": {}},
                                 "serverInfo": {"name": "raw-http", "version": "1"}}}  # fmt: skip
        elif method == "tools/list":
            answer = {"result": {"tools": TOOLS}}
        elif method == "tools/call":
            answer = {"result": {"content": [{"type": "text", "text": "ok"}]}}
        else:  # ping too
            answer = {"error": {"code": -32601, "message": "Method not found"}}
        data = json.dumps({"jsonrpc": "2.0", "id": mid, **answer}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Mcp-Session-Id", "s1")
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
