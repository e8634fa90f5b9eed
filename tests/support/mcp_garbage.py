"""Not an MCP server (issue 29's tests): started as one, it writes junk to its stdout, reads
its stdin and never answers, until its stdin closes. The hub must call it down, not hang."""

from __future__ import annotations

import sys


def main() -> None:
    sys.stdout.write('hello, I am not JSON-RPC\n{"jsonrpc": "2.0", "nonsense": true}\n')
    sys.stdout.flush()
    for _ in sys.stdin:
        sys.stdout.write("still not JSON-RPC\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
