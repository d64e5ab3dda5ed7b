"""A minimal OpenAI-compatible chat-completions server for the openai-path benchmark.

`python bench/mock_chat_server.py [--port N]` listens on 127.0.0.1 and prints
`READY mock-chat 127.0.0.1:<port>`. Every request, whatever its path, gets
the same valid `chat.completion` object; connections are kept alive, as a
real provider's would be. It runs in its own process so that the bench's
load generator never shares an event loop with the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json

COMPLETION = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "bench-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "pong", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
_BODY = json.dumps(COMPLETION).encode()
RESPONSE = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: application/json\r\n"
    b"connection: keep-alive\r\n"
    b"content-length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)
_MAX_HEAD = 64 * 1024


def _content_length_and_close(head: bytes) -> tuple[int, bool]:
    length = 0
    close = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        lowered = name.strip().lower()
        if lowered == b"content-length":
            length = int(value.strip())
        elif lowered == b"connection" and value.strip().lower() == b"close":
            close = True
    return length, close


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            length, close = _content_length_and_close(head)
            if length:
                await reader.readexactly(length)
            writer.write(RESPONSE)
            await writer.drain()
            if close:
                return
    finally:
        writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_serve_connection, "127.0.0.1", port, limit=_MAX_HEAD)
    bound_port = server.sockets[0].getsockname()[1]
    print(f"READY mock-chat 127.0.0.1:{bound_port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="A fixed-reply chat-completions server.")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    # SIGTERM's default action ends the process; there is nothing to drain.
    asyncio.run(_main(args.port))


if __name__ == "__main__":
    main()
