"""A local HTTP/1.1 server speaking the OpenAI chat-completions wire format.

Real sockets and real HTTP (keep-alive included), so the adapter's client is
exercised exactly as against a provider. Set `mode` per test:

    ok          a chat.completion; for response_format json_schema the content
                is the JSON text of `structured`, otherwise `reply_text`
    400 401 403 an OpenAI-shaped error body
    429         an error body with a Retry-After header (`retry_after`)
    500         a server_error body
    malformed   200 with a body that is not JSON
    no_choices  200 with an empty choices list
    refusal     200 with message.refusal set and content null
    length      200 with finish_reason "length" and cut-off content
    hang        never answers until the server stops
    huge        200 with a `huge_bytes` body (Content-Length set), written in
                64 KiB chunks until the client stops reading; `sent_bytes`
                counts what was written
    huge_chunked  the same body with chunked transfer encoding (no length)

Function calling: `tool_rounds` is a queue of rounds, each a list of
`{"name": ..., "arguments": <value or JSON text>}`. While it is not empty (in
mode ok), each request takes the next round and is answered as the real API
asks for tools: content null, `message.tool_calls = [{id, type: "function",
function: {name, arguments: "<json string>"}}]`, finish_reason "tool_calls".
Every `role: tool` message a request carries that no earlier request carried
is appended to `tool_messages`.

Probes: `GET /v1/models` lists `listed_models`. A request with `reasoning_effort`
for a model in `reasoning_models` reports `usage.completion_tokens_details.
reasoning_tokens` > 0; any other reports 0, as a server that ignores the effort
does. With `call_required_tools`, a request with `tool_choice: "required"` is
answered with a call of its first tool with `required_tool_arguments`.
`usage` is the `usage` object of every completion (None: the field is left out).

Streaming: a request with `stream: true` (mode ok) is answered with
server-sent events, as the real API streams: a role chunk, one content chunk
per entry of `stream_chunks` (default: the reply's text in three pieces),
`chunk_interval` seconds apart, a finish chunk, a usage chunk when
`stream_options.include_usage` is set, then `data: [DONE]`. A tool round is
streamed as tool_calls pieces (id and name first, the arguments in two
parts), after one content chunk per entry of `tool_round_chunks` (default
none), paced and timed as the content chunks are. `chunk_times` holds the
`time.monotonic()` at which each content chunk was written; between chunks
the handler watches its socket, and when the client hangs up it stops and
sets `stream_closed` (`closed_at` holds when).

Every request is recorded (method, path, lower-cased headers, parsed JSON body,
client port) in `requests`.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

MODES = frozenset(
    {"ok", "400", "401", "403", "429", "500", "malformed", "no_choices", "refusal", "length", "hang"}
)

_ERRORS: dict[str, tuple[int, str, str, str | None]] = {
    "400": (400, "Invalid schema for response_format 'output'.", "invalid_request_error", None),
    "401": (
        401,
        "Incorrect API key provided. You can find your API key in your account settings.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    "403": (403, "You are not allowed to sample from this model", "invalid_request_error", None),
    "429": (
        429,
        "Rate limit reached for requests per min (RPM): Limit 3, Used 3, Requested 1.",
        "requests",
        "rate_limit_exceeded",
    ),
    "500": (
        500,
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    client_port: int


class MockOpenAI:
    """Start with `with MockOpenAI() as server:`; `server.base_url` ends in /v1."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.reply_text = "Hello from the mock."
        self.structured: Any = {"answer": "42"}
        self.refusal = "I'm sorry, but I can't help with that."
        self.retry_after = "7"
        self.requests: list[RecordedRequest] = []
        self.tool_rounds: list[list[dict[str, Any]]] = []
        self.tool_messages: list[dict[str, Any]] = []
        # `usage` replaces the computed one (reasoning tokens for `reasoning_models` asked for effort);
        # `report_usage = False` leaves usage out of the reply, as some servers do.
        self.usage: dict[str, Any] | None = None
        self.report_usage = True
        self.stream_chunks: list[str] | None = None
        self.tool_round_chunks: list[str] = []
        self.chunk_interval = 0.0
        self.chunk_times: list[float] = []
        self.stream_closed = threading.Event()
        self.closed_at: float | None = None
        self.huge_bytes = 200 * 1024 * 1024
        self.listed_models: list[str] = ["gpt-4o-mini"]
        self.reasoning_models: set[str] = set()
        self.call_required_tools = False
        self.required_tool_arguments: Any = {"word": "probe"}
        self.sent_bytes = 0
        self._call_ids = itertools.count(1)
        self._ids = itertools.count(1)
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="mock-openai", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> MockOpenAI:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release.set()  # let hanging handlers go
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)
            messages = request.body.get("messages") if isinstance(request.body, dict) else None
            seen = {m.get("tool_call_id") for m in self.tool_messages}
            for message in messages if isinstance(messages, list) else []:
                is_tool = isinstance(message, dict) and message.get("role") == "tool"
                if is_tool and message.get("tool_call_id") not in seen:
                    self.tool_messages.append(message)

    def next_tool_round(self) -> list[dict[str, Any]] | None:
        with self._lock:
            return self.tool_rounds.pop(0) if self.tool_rounds else None

    def completion(self, request_body: Any) -> dict[str, Any]:
        """A chat.completion body as the real API shapes it."""
        model = request_body.get("model", "unknown") if isinstance(request_body, dict) else "unknown"
        wants_json = isinstance(request_body, dict) and (
            (request_body.get("response_format") or {}).get("type") == "json_schema"
        )
        content: str | None = json.dumps(self.structured) if wants_json else self.reply_text
        refusal = None
        finish_reason = "stop"
        tool_calls = None
        tool_round = self.next_tool_round() if self.mode == "ok" else None
        tools = request_body.get("tools") if isinstance(request_body, dict) else None
        if (
            tool_round is None
            and self.call_required_tools
            and request_body.get("tool_choice") == "required"
            and isinstance(tools, list)
            and tools
        ):
            tool_round = [{"name": tools[0]["function"]["name"], "arguments": self.required_tool_arguments}]
        if tool_round is not None:
            content, finish_reason = None, "tool_calls"
            tool_calls = [self._tool_call(call) for call in tool_round]
        elif self.mode == "refusal":
            content, refusal = None, self.refusal
        elif self.mode == "length":
            content = (content or "")[: max(1, len(content or "") // 2)]
            finish_reason = "length"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "refusal": refusal,
            "annotations": [],
        }
        if tool_calls is not None:
            message["tool_calls"] = tool_calls
        completion: dict[str, Any] = {
            "id": f"chatcmpl-mock{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_mock",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 7,
                "total_tokens": 19,
                "completion_tokens_details": {
                    "reasoning_tokens": 5
                    if "reasoning_effort" in request_body and model in self.reasoning_models
                    else 0
                },
            },
        }
        if self.usage is not None:
            completion["usage"] = self.usage
        if not self.report_usage:
            del completion["usage"]
        return completion

    def _tool_call(self, call: dict[str, Any]) -> dict[str, Any]:
        arguments = call.get("arguments", {})
        return {
            "id": call.get("id") or f"call_mock{next(self._call_ids)}",
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            },
        }

    def wait_released(self) -> None:
        self._release.wait()


def _handler_for(mock: MockOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as providers do
        timeout = 10  # an idle keep-alive connection does not pin a thread forever

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            mock.record(
                RecordedRequest(
                    method="GET",
                    path=self.path,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=None,
                    client_port=int(self.client_address[1]),
                )
            )
            if self.path != "/v1/models":
                self._send_json(
                    404, _error_body(f"Unknown request URL: GET {self.path}.", "invalid_request_error")
                )
                return
            data = [
                {"id": name, "object": "model", "created": 0, "owned_by": "mock"}
                for name in mock.listed_models
            ]
            self._send_json(200, {"object": "list", "data": data})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw.decode("utf-8", errors="replace")
            mock.record(
                RecordedRequest(
                    method="POST",
                    path=self.path,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=body,
                    client_port=int(self.client_address[1]),
                )
            )
            if self.path != "/v1/chat/completions":
                self._send_json(
                    404, _error_body(f"Unknown request URL: POST {self.path}.", "invalid_request_error")
                )
                return
            mode = mock.mode
            if mode == "hang":
                mock.wait_released()
                self.close_connection = True
                return
            if mode in _ERRORS:
                status, message, kind, code = _ERRORS[mode]
                headers = {"Retry-After": mock.retry_after} if mode == "429" else {}
                self._send_json(status, _error_body(message, kind, code), headers)
            elif mode in ("huge", "huge_chunked"):
                self._send_huge(chunked=mode == "huge_chunked")
            elif mode == "malformed":
                self._send(200, b"<html>502 Bad Gateway</html>", "application/json")
            elif mode == "no_choices":
                completion = mock.completion(body)
                completion["choices"] = []
                self._send_json(200, completion)
            elif isinstance(body, dict) and body.get("stream") is True:
                self._send_stream(body)
            else:
                self._send_json(200, mock.completion(body))

        def _send_stream(self, body: dict[str, Any]) -> None:
            completion = mock.completion(body)
            choice = completion["choices"][0]
            message = choice["message"]
            base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
            base["object"] = "chat.completion.chunk"

            def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
                return {
                    **base,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                }

            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            try:
                self._event(chunk({"role": "assistant", "content": ""}))
                if message.get("tool_calls"):
                    for number, piece in enumerate(mock.tool_round_chunks):
                        if number and not self._wait(mock.chunk_interval):
                            self.close_connection = True
                            return
                        self._event(chunk({"content": piece}))
                        mock.chunk_times.append(time.monotonic())
                    for index, call in enumerate(message["tool_calls"]):
                        arguments = call["function"]["arguments"]
                        half = len(arguments) // 2
                        first = {"index": index, "id": call["id"], "type": "function"}
                        first["function"] = {"name": call["function"]["name"], "arguments": ""}
                        self._event(chunk({"tool_calls": [first]}))
                        for part in (arguments[:half], arguments[half:]):
                            self._event(
                                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
                            )
                else:
                    content = message.get("content") or ""
                    pieces = mock.stream_chunks
                    if pieces is None:
                        third = max(1, len(content) // 3)
                        pieces = [content[:third], content[third : 2 * third], content[2 * third :]]
                    for number, piece in enumerate(pieces):
                        if number and not self._wait(mock.chunk_interval):
                            self.close_connection = True
                            return
                        self._event(chunk({"content": piece}))
                        mock.chunk_times.append(time.monotonic())
                self._event(chunk({}, choice["finish_reason"]))
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event({**base, "choices": [], "usage": completion["usage"]})
                self._write_chunk(b"data: [DONE]\n\n")
                self._write_chunk(b"")
            except OSError:
                mock.closed_at = time.monotonic()
                mock.stream_closed.set()
            finally:
                # Kept alive only after a stream written to its end.
                self.close_connection = mock.stream_closed.is_set() or self.close_connection

        def _event(self, payload: dict[str, Any]) -> None:
            self._write_chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

        def _write_chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _wait(self, seconds: float) -> bool:
            """Sleep `seconds` unless the client hangs up first (then False, `stream_closed` set)."""
            end = time.monotonic() + seconds
            sock = self.connection
            while (left := end - time.monotonic()) > 0:
                readable, _, _ = select.select([sock], [], [], left)
                if readable:
                    try:
                        peeked = sock.recv(1, socket.MSG_PEEK)
                    except OSError:
                        peeked = b""
                    if not peeked:
                        mock.closed_at = time.monotonic()
                        mock.stream_closed.set()
                        return False
                    time.sleep(min(left, 0.005))
            return True

        def _send_huge(self, *, chunked: bool) -> None:
            """A JSON string `huge_bytes` long, sent until the client hangs up."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(mock.huge_bytes))
            self.end_headers()
            block = b" " * 65536
            self.close_connection = True
            try:
                for _ in range(mock.huge_bytes // len(block)):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
                    mock.sent_bytes += len(block)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client stopped reading and closed the connection
                pass

        def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(body).encode(), "application/json", headers)

        def _send(
            self, status: int, payload: bytes, content_type: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("x-request-id", f"req_mock{next(mock._ids)}")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

    return Handler


def _error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
