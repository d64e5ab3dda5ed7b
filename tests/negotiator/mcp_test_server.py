"""A FastMCP server (the `mcp` SDK's) for the negotiator's MCP tests, over stdio or streamable HTTP.

    python mcp_test_server.py --journal FILE [--http] [--page-size N]

Every tool that runs appends one JSON line `{"tool": ..., "arguments": ...}`
to the journal, so a test sees what really reached the server. Tools:

    lookup(key)         readOnlyHint: read_only; returns {"key", "value"}
    write_note(text)    no hints: mutating; returns "noted: <text>"
    drop_table(name)    destructiveHint: sensitive
    explode()           raises: an isError result
    grow()              read_only; adds the tool `extra` and sends tools/list_changed

With --regex-tools, two more, read_only, whose inputSchema patterns are
ECMA-262 (as JSON Schema's are) or Python's only:

    letters(word)       word: pattern ^\\p{L}+$ (ECMA-262 with Unicode property escapes)
    python_only(key)    key: pattern ^a\\Z (Python's end-of-string escape; no ECMA-262 regex)

With --http it binds 127.0.0.1:0 and prints `READY <port>` once listening;
the MCP endpoint is http://127.0.0.1:<port>/mcp. With --page-size, tools/list
answers in pages of that many tools (nextCursor is the next offset).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp import types
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations


def build(journal: Path, page_size: int | None, regex_tools: bool = False) -> FastMCP:
    server = FastMCP("negotiator-test")

    def record(tool: str, arguments: dict[str, Any]) -> None:
        with journal.open("a") as out:
            out.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Look a key up.")
    def lookup(key: str) -> dict[str, str]:
        record("lookup", {"key": key})
        return {"key": key, "value": key.upper()}

    @server.tool(description="Write a note.")
    def write_note(text: str) -> str:
        record("write_note", {"text": text})
        return f"noted: {text}"

    @server.tool(annotations=ToolAnnotations(destructiveHint=True), description="Drop a table.")
    def drop_table(name: str) -> str:
        record("drop_table", {"name": name})
        return f"dropped {name}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def explode() -> str:
        record("explode", {})
        raise RuntimeError("the tool blew up")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def grow(ctx: Context[Any, Any, Any]) -> str:
        record("grow", {})

        def extra() -> str:
            record("extra", {})
            return "extra ran"

        server.add_tool(extra, annotations=ToolAnnotations(readOnlyHint=True))
        await ctx.session.send_tool_list_changed()
        return "grown"

    if regex_tools:

        @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
        def letters(word: str) -> str:
            record("letters", {"word": word})
            return word

        @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
        def python_only(key: str) -> str:
            record("python_only", {"key": key})
            return key

        # FastMCP derives an inputSchema from the signature; these tools publish their own.
        for name, field, pattern in (("letters", "word", r"^\p{L}+$"), ("python_only", "key", r"^a\Z")):
            schema = {"type": "object", "properties": {field: {"type": "string", "pattern": pattern}}}
            server._tool_manager._tools[name].parameters = schema

    if page_size is not None:
        low = server._mcp_server

        async def paged(request: types.ListToolsRequest | None) -> types.ServerResult:
            tools = await server.list_tools()
            # The SDK's tools/call looks tools up in a cache this handler fills (request None: all).
            low._tool_cache.update((tool.name, tool) for tool in tools)
            params = request.params if request is not None else None
            cursor = params.cursor if params is not None else None
            start = int(cursor) if cursor else 0
            end = start + page_size
            next_cursor = str(end) if end < len(tools) else None
            return types.ServerResult(types.ListToolsResult(tools=tools[start:end], nextCursor=next_cursor))

        low.request_handlers[types.ListToolsRequest] = paged
    return server


async def serve_http(server: FastMCP) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before READY: a client that connects at once waits in the backlog, never refused.
    sock.listen(128)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    print(f"READY {sock.getsockname()[1]}", flush=True)
    await http.serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--page-size", type=int)
    parser.add_argument("--regex-tools", action="store_true")
    args = parser.parse_args()
    # Beside the journal: which processes served, so a test can see them gone.
    with (args.journal.parent / "pids.jsonl").open("a") as out:
        out.write(json.dumps({"pid": os.getpid()}) + "\n")
    server = build(args.journal, args.page_size, args.regex_tools)
    if args.http:
        anyio.run(serve_http, server)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
