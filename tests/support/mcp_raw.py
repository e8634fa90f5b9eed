"""A hand-written stdio MCP server for issue 29's tests: it starts and lists its one tool
(``t``) as MCP says, then answers every ``tools/call`` with a broken line: with the argument
``cut``, JSON cut short (not JSON-RPC: the client cannot match it to its call); with ``bytes``,
a whole answer with bytes inside its text that are not UTF-8; with ``storm``, it answers calls
but says its tools changed after every listing (they never do). Each request's method is
appended to ``$MCP_TEST_LOG`` (one JSON line) when it is set."""

from __future__ import annotations

import json
import os
import sys

TOOLS = [{"name": "t", "description": "a tool", "inputSchema": {"type": "object"}}]


def main() -> None:
    out = sys.stdout.buffer

    def send(obj: object) -> None:
        out.write(json.dumps(obj).encode() + b"\n")
        out.flush()

    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        mid, method = msg.get("id"), msg.get("method")
        if os.environ.get("MCP_TEST_LOG"):
            with open(os.environ["MCP_TEST_LOG"], "a", encoding="utf-8") as f:
                f.write(json.dumps({"method": method, "tool": None, "pid": os.getpid()}) + "\n")
        if mid is None:
            continue
        if method == "initialize":
            version = msg["params"]["protocolVersion"]
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": version, "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"}}})  # fmt: skip
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
            if sys.argv[1:] == ["storm"]:
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        elif method == "tools/call" and sys.argv[1:] == ["storm"]:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": mid,
                    "result": {"content": [{"type": "text", "text": "ok"}]},
                }
            )
        elif method == "tools/call" and sys.argv[1:] == ["cut"]:
            out.write(b'{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"te\n' % mid)
            out.flush()
        elif method == "tools/call":
            out.write(b'{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text",'
                      b'"text":"\xff\xfe broken"}]}}\n' % mid)  # fmt: skip
            out.flush()
        else:
            send({"jsonrpc": "2.0", "id": mid, "result": {}})


if __name__ == "__main__":
    main()
