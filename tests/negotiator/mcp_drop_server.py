"""A FastMCP server (the `mcp` SDK's) over streamable HTTP that a test can kill at a known moment.

    python mcp_drop_server.py --marks DIR [--json-response] [--stall-delete]

Binds 127.0.0.1:0 and prints `READY <port>` once listening; the MCP endpoint
is http://127.0.0.1:<port>/mcp. Each moment a test waits for is a file in
DIR, created when it happens:

    hang()      read_only; creates `hang`, then never answers
    echo(text)  read_only; returns the text
    DELETE      (the client closing its session) creates `delete`; with
                --stall-delete it is then never answered

A test kills the process (SIGKILL) once the file it waits for exists, so the
negotiator's client sees the connection drop mid-call or mid-close. With
--json-response, POSTs are answered with JSON bodies instead of SSE streams.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations


def build(marks: Path, json_response: bool) -> FastMCP:
    server = FastMCP("negotiator-drop-test", json_response=json_response)

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Never answers.")
    async def hang() -> str:
        (marks / "hang").touch()
        await anyio.sleep_forever()
        return "unreachable"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Echo the text.")
    def echo(text: str) -> str:
        return text

    return server


def mark_delete(app: Any, marks: Path, stall: bool) -> Any:
    """The app, marking every DELETE (a session's close), and holding it open for ever if `stall`."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "DELETE":
            (marks / "delete").touch()
            if stall:
                await anyio.sleep_forever()
        await app(scope, receive, send)

    return wrapped


async def serve(server: FastMCP, marks: Path, stall_delete: bool) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before READY: a client that connects at once waits in the backlog, never refused.
    sock.listen(128)
    app = server.streamable_http_app()
    # Lifespan events pass through the wrapper: the SDK's lifespan starts its session manager.
    config = uvicorn.Config(mark_delete(app, marks, stall_delete), log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    print(f"READY {sock.getsockname()[1]}", flush=True)
    await http.serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marks", type=Path, required=True)
    parser.add_argument("--json-response", action="store_true")
    parser.add_argument("--stall-delete", action="store_true")
    args = parser.parse_args()
    anyio.run(serve, build(args.marks, args.json_response), args.marks, args.stall_delete)


if __name__ == "__main__":
    main()
