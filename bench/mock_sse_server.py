"""A minimal OpenAI-compatible chat-completions server that streams, for the first-delta benchmark.

`python bench/mock_sse_server.py [--port N] [--gap-ms MS]` listens on 127.0.0.1 and prints
`READY mock-sse 127.0.0.1:<port>`. Every request gets a `text/event-stream` answer (chunked,
keep-alive) as the real API streams: a role chunk and the first content chunk at once, a
second content chunk `--gap-ms` later, then the finish chunk, a usage chunk and `[DONE]`. The
first delta's latency is thus the server's reaction time alone; the gap keeps the rest of the
stream apart from it. Its own process, so the bench never shares an event loop with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable

_BASE = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "m"}


def _event(choices: list[object], **extra: object) -> bytes:
    data = b"data: " + json.dumps({**_BASE, "choices": choices, **extra}).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _delta(delta: dict[str, object], finish: str | None = None) -> bytes:
    return _event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])


HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"connection: keep-alive\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
FIRST = HEAD + _delta({"role": "assistant", "content": ""}) + _delta({"content": "po"})
REST = (
    _delta({"content": "ng"})
    + _delta({}, "stop")
    + _event([], usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
    + b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")
    + b"0\r\n\r\n"
)
_MAX_HEAD = 64 * 1024


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _serve(gap_s: float) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = _content_length(head)
                    if length:
                        await reader.readexactly(length)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                writer.write(FIRST)
                await writer.drain()
                await asyncio.sleep(gap_s)
                writer.write(REST)
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()

    return serve_connection


async def _main(port: int, gap_s: float) -> None:
    server = await asyncio.start_server(_serve(gap_s), "127.0.0.1", port, limit=_MAX_HEAD)
    bound_port = server.sockets[0].getsockname()[1]
    print(f"READY mock-sse 127.0.0.1:{bound_port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="A streaming fixed-reply chat-completions server.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    args = parser.parse_args()
    asyncio.run(_main(args.port, args.gap_ms / 1000))


if __name__ == "__main__":
    main()
