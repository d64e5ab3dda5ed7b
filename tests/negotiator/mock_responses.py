"""A local HTTP/1.1 server speaking the OpenAI Responses API as a stream of server-sent events.

Codex (and so codex-acp) talks to its provider this way: `POST {base_url}/responses` with
`"stream": true`, answered by `text/event-stream` events. This mock answers every request with
the next entry of `turns` (or, once they are used up, `structured` as JSON text when the request
asks for a JSON schema output, else `reply_text`):

    {"text": "..."}                       an assistant message, streamed as two deltas
    {"shell": ["cmd", "arg", ...]}        a call of whichever shell tool the request offers
                                          (`shell`, `shell_command`, `exec_command`, ...);
                                          with "escalate": True it asks to leave the sandbox
    {"hang": True}                        the response starts, then nothing until the server stops

Every request is recorded (path, lower-cased headers, parsed JSON body) in `requests`; any other
path gets a 404, which Codex treats as "no model list here".
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def offered_tools(body: Any) -> list[str]:
    """The names of the function tools a Responses request offers the model."""
    tools = body.get("tools") if isinstance(body, dict) else None
    names = []
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            names.append(tool["name"])
    return names


def tool_outputs(body: Any) -> list[dict[str, Any]]:
    """The function_call_output items a request carries back to the model."""
    items = body.get("input") if isinstance(body, dict) else None
    return [
        item
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output")
    ]


class MockResponses:
    """Start with `with MockResponses() as server:`; `server.base_url` ends in /v1."""

    def __init__(self) -> None:
        self.reply_text = "Hello from the Responses mock."
        self.structured: Any = {"answer": "42"}
        self.turns: list[dict[str, Any]] = []
        self.requests: list[RecordedRequest] = []
        self.started = threading.Event()  # set when a response stream has begun
        self._ids = itertools.count(1)
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="mock-responses",
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def model_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/responses")]

    def responses_requests(self) -> list[RecordedRequest]:
        return self.model_requests

    def __enter__(self) -> MockResponses:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def next_turn(self, body: Any = None) -> dict[str, Any]:
        with self._lock:
            if self.turns:
                return self.turns.pop(0)
        text_format = ((body.get("text") or {}).get("format") or {}) if isinstance(body, dict) else {}
        if text_format.get("type") == "json_schema":
            return {"text": json.dumps(self.structured)}
        return {"text": self.reply_text}

    def next_id(self, prefix: str) -> str:
        return f"{prefix}_mock{next(self._ids)}"

    def wait_released(self) -> None:
        self._release.wait()


def _events(mock: MockResponses, turn: dict[str, Any], body: Any) -> list[dict[str, Any]]:
    response_id = mock.next_id("resp")
    model = body.get("model", "mock-model") if isinstance(body, dict) else "mock-model"
    created: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "status": "in_progress",
        "model": model,
        "output": [],
    }
    events: list[dict[str, Any]] = [{"type": "response.created", "response": created}]
    if "shell" in turn:
        item = _shell_call(mock, turn["shell"], offered_tools(body), escalate=bool(turn.get("escalate")))
    else:
        text = str(turn.get("text", mock.reply_text))
        item_id = mock.next_id("msg")
        half = len(text) // 2
        added = {
            "type": "message",
            "id": item_id,
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        events.append({"type": "response.output_item.added", "output_index": 0, "item": added})
        for delta in (text[:half], text[half:]):
            events.append({"type": "response.output_text.delta", "item_id": item_id, "delta": delta})
        item = {
            "type": "message",
            "id": item_id,
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 19,
    }
    events.append(
        {"type": "response.completed", "response": {**created, "status": "completed", "usage": usage}}
    )
    return events


def _shell_call(
    mock: MockResponses, command: list[str], offered: list[str], *, escalate: bool
) -> dict[str, Any]:
    """A function call of the shell tool this request offers, with that tool's argument shape.

    `escalate` asks to run outside the sandbox, which Codex puts to the user for approval.
    """
    name = next(
        (n for n in ("shell_command", "exec_command", "shell", "local_shell") if n in offered), "shell"
    )
    if name == "shell":
        arguments: dict[str, Any] = {"command": command}
    else:
        arguments = {"command": " ".join(command)} if name == "shell_command" else {"cmd": " ".join(command)}
    if escalate:
        arguments |= {"sandbox_permissions": "require_escalated", "justification": "the test asks for it"}
    return {
        "type": "function_call",
        "id": mock.next_id("fc"),
        "call_id": mock.next_id("call"),
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


def _handler_for(mock: MockResponses) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _record(self, body: Any) -> None:
            mock.record(
                RecordedRequest(
                    method=self.command,
                    path=self.path,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=body,
                )
            )

        def do_GET(self) -> None:
            self._record(None)
            self._send_json(
                404, {"error": {"message": f"no {self.path} here", "type": "invalid_request_error"}}
            )

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw.decode("utf-8", errors="replace")
            self._record(body)
            if not self.path.endswith("/responses"):
                self._send_json(
                    404, {"error": {"message": f"no {self.path} here", "type": "invalid_request_error"}}
                )
                return
            turn = mock.next_turn(body)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                if turn.get("hang"):
                    created: dict[str, Any] = {
                        "id": mock.next_id("resp"),
                        "object": "response",
                        "status": "in_progress",
                    }
                    self._event({"type": "response.created", "response": created})
                    mock.started.set()
                    mock.wait_released()
                    return
                mock.started.set()
                for event in _events(mock, turn, body):
                    self._event(event)
            except OSError:  # the client went away
                pass

        def _event(self, event: dict[str, Any]) -> None:
            self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()

        def _send_json(self, status: int, body: Any) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler
