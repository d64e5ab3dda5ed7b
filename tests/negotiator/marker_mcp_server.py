"""A minimal MCP server over stdio that proves it was launched: it writes its argv[1] file at start.

It answers `initialize`, `tools/list` (no tools) and `ping`, and ignores notifications, which is
all an MCP client needs to count it as started. Stdlib only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    Path(sys.argv[1]).write_text("started\n")
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if "id" not in message:
            continue  # a notification
        method = message.get("method")
        if method == "initialize":
            result: object = {
                "protocolVersion": message.get("params", {}).get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "marker", "version": "1.0.0"},
            }
        elif method == "tools/list":
            result = {"tools": []}
        elif method == "ping":
            result = {}
        else:
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "not here"}}
            print(json.dumps(reply), flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)


if __name__ == "__main__":
    main()
