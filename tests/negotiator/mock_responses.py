"""A local HTTP/1.1 server speaking the OpenAI Responses API's streaming wire format (SSE).

What the Codex CLI talks to: `POST {base_url}/responses` with `"stream": true`,
answered with `text/event-stream` events (`response.created`, text deltas,
`response.output_item.done` carrying the assistant message, `response.completed`).
Codex is pointed at it through a `model_providers` entry (`base_url`, `env_key`,
`wire_api = "responses"`) given with `-c`, so no login and no network are involved.

The reply text is `reply_text`, or, when the request carries a JSON Schema
(`text.format.type == "json_schema"`, which is how `codex exec --output-schema`
sends it), the JSON text of `structured`. Every request is recorded
(method, path, lower-cased headers, parsed JSON body) in `requests`; any other
path gets a 404 with an OpenAI-shaped error body.
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


class MockResponses:
    """Start with `with MockResponses() as server:`; `server.base_url` ends in /v1."""

    def __init__(self) -> None:
        self.reply_text = "Hello from the responses mock."
        self.structured: Any = {"answer": "42"}
        self.requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
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

    def __enter__(self) -> MockResponses:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def responses_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/responses")]

    def events(self, body: Any) -> list[dict[str, Any]]:
        """The SSE events answering one request, as the real API orders them."""
        number = next(self._ids)
        response_id, item_id = f"resp_mock{number}", f"msg_mock{number}"
        text_format = ((body.get("text") or {}).get("format") or {}) if isinstance(body, dict) else {}
        text = json.dumps(self.structured) if text_format.get("type") == "json_schema" else self.reply_text
        model = body.get("model", "unknown") if isinstance(body, dict) else "unknown"
        message = {
            "type": "message",
            "id": item_id,
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        return [
            {"type": "response.created", "response": {"id": response_id, "model": model}},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**message, "status": "in_progress", "content": []},
            },
            {
                "type": "response.output_text.delta",
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "delta": text,
            },
            {"type": "response.output_item.done", "output_index": 0, "item": message},
            {
                "type": "response.completed",
                "response": {
                    "id": response_id,
                    "model": model,
                    "usage": {
                        "input_tokens": 12,
                        "input_tokens_details": None,
                        "output_tokens": 7,
                        "output_tokens_details": None,
                        "total_tokens": 19,
                    },
                },
            },
        ]


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
            self._not_found()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw.decode("utf-8", errors="replace")
            self._record(body)
            if self.path != "/v1/responses":
                self._not_found()
                return
            payload = b"".join(
                f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                for event in mock.events(body)
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _not_found(self) -> None:
            error = {"error": {"message": f"Unknown request URL: {self.command} {self.path}."}}
            payload = json.dumps(error).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler
