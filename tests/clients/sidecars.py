"""Servers and processes the client tests run against (the fixtures are in conftest.py).

* `ServerLoop`: an asyncio loop in a background thread that hosts every test
  server, so blocking clients and asyncio clients (on the test's own loop)
  both reach them.
* `ServerHandle`: the dialable targets of a started real server.
* `FakeSeedStore`: a generic handler under the seedstore's service name that
  counts attempts per method (failing the first N with UNAVAILABLE), records
  request metadata, and serves streams that send one event and then wait,
  recording when the client cancels.
* `FakeNegotiator`: one scripted ToolSession and an echoing Bootstrap.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf import json_format

from agentsidecar.clients.channel import NEGOTIATOR_SERVICE, SEEDSTORE_SERVICE
from agentsidecar.negotiator.v1 import negotiator_pb2 as npb
from agentsidecar.seedstore.v1 import seedstore_pb2 as spb
from agentsidecar.sidecar_runtime.richstatus import PreconditionViolation, RichError, abort_with

REPO = Path(__file__).resolve().parents[2]
_T = TypeVar("_T")

NEGOTIATOR_CONFIG = """\
adapters:
  - shortname: demo
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities:
        structured_output: supported
        model_override: supported
        settings: supported
        persona: unsupported
      accepted_settings: [temperature]
      string_formats: [email]
    options:
      invoke: {echo: true}
      produce: {json: {"summary": "scripted reply", "ok": true}}
  - shortname: shell-echo
    implementation: command
    options:
      argv: ["cat"]
      timeout_seconds: 10
  - shortname: bad-output
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {structured_output: supported}
    options:
      produce: {json: {"summary": 42}}
  - shortname: throttled
    implementation: scripted
    declaration: {kind: agent-framework}
    options:
      invoke: {error: {kind: rate_limited, message: slow down, retry_after: 2}}
"""


class ServerLoop:
    """An asyncio loop in a daemon thread; `run(coro)` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="client-test-servers", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout: float = 20) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@dataclass
class ServerHandle:
    """Dialable targets of a started server."""

    bound: tuple[str, ...]
    home: Path | None = None

    @property
    def unix(self) -> str:
        return next(target for target in self.bound if target.startswith("unix:"))

    @property
    def tcp(self) -> str:
        return next(target for target in self.bound if not target.startswith("unix:"))


MID_STREAM_FAILURE = "fails-mid-stream"


@dataclass
class FakeSeedStore:
    """Serves every SeedStoreService method name; see the module docstring."""

    fail_first: Mapping[str, int] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)
    metadata: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    stream_started: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def authorization(self) -> list[str]:
        return [seen.get("authorization", "") for _, seen in self.metadata]

    def _record(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.attempts[method] += 1
        self.metadata.append((method, {k: str(v) for k, v in context.invocation_metadata() or ()}))

    def _unary(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]]:
        async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            self._record(method, context)
            if self.attempts[method] <= self.fail_first.get(method, 0):
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"flaky {method}, attempt {self.attempts[method]}"
                )
            return b""  # an empty message is a valid answer of every response type

        return handle

    async def _wait_for_cancel(self) -> None:
        self.stream_started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def _watch(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        self._record("WatchSeeds", context)
        yield spb.WatchSeedsResponse(kind=spb.CHANGE_KIND_ADDED, id="say", domain="voice").SerializeToString()
        await self._wait_for_cancel()

    async def _verify(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        self._record("VerifySeeds", context)
        ids = list(spb.VerifySeedsRequest.FromString(request).ids)
        started = spb.CheckStarted(id=ids[0] if ids else "", domain="voice", check="path_lookup:x")
        yield spb.VerifySeedsResponse(seed_store="/store", check_started=started).SerializeToString()
        if ids == [MID_STREAM_FAILURE]:
            await abort_with(
                context,
                RichError(
                    code=grpc.StatusCode.FAILED_PRECONDITION,
                    message="the seed file became malformed",
                    reason="SEED_MALFORMED",
                    domain="seedstore.agentsidecar",
                    metadata={"path": "/store/voice/x.yml", "line": "3", "detail": "bad indent"},
                ),
            )
        await self._wait_for_cancel()

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        methods = spb.DESCRIPTOR.services_by_name["SeedStoreService"].methods
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            m.name: grpc.unary_unary_rpc_method_handler(self._unary(m.name))
            for m in methods
            if m.name not in ("WatchSeeds", "VerifySeeds")
        }
        handlers["WatchSeeds"] = grpc.unary_stream_rpc_method_handler(self._watch)
        handlers["VerifySeeds"] = grpc.unary_stream_rpc_method_handler(self._verify)
        return grpc.method_handlers_generic_handler(SEEDSTORE_SERVICE, handlers)


@dataclass
class FakeServer:
    fake: FakeSeedStore
    unix: str
    tcp: str
    tls_tcp: str | None


# --- a fake negotiator: one scripted ToolSession, and Bootstrap echoing its request ---------------

REFUSE_PROMPT = "refuse me"


@dataclass
class FakeNegotiator:
    """ToolSession: read-only `lookup` (c1), `explode` (c2), then an approval for `send` (c3) and,
    when allowed, its call; the result's text is the JSON of every answer received. A start whose
    prompt is REFUSE_PROMPT is refused as Produce would be. Bootstrap answers its request back."""

    received: list[npb.ToolSessionRequest] = field(default_factory=list)

    async def _next(self, requests: AsyncIterator[npb.ToolSessionRequest]) -> npb.ToolSessionRequest:
        # StopAsyncIteration here means the client half-closed before the result.
        message = await anext(requests)
        self.received.append(message)
        return message

    async def tool_session(
        self, requests: AsyncIterator[npb.ToolSessionRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[npb.ToolSessionResponse]:
        start = await self._next(requests)
        if start.start.invoke.prompt == REFUSE_PROMPT:
            await abort_with(
                context,
                RichError(
                    code=grpc.StatusCode.FAILED_PRECONDITION,
                    message="refused",
                    reason="UNSUPPORTED_CAPABILITY",
                    domain="negotiator.agentsidecar",
                    metadata={"adapter": "fake", "declarationVersion": "sha256:f"},
                    precondition_violations=(
                        PreconditionViolation(
                            "UNSUPPORTED_CAPABILITY",
                            "tool_registration",
                            'tools needs tool_registration; the declaration of "fake" says unsupported',
                        ),
                    ),
                ),
            )
        read_only, mutating = npb.TOOL_RISK_READ_ONLY, npb.TOOL_RISK_MUTATING
        yield npb.ToolSessionResponse(
            tool_call=npb.ToolCall(call_id="c1", name="lookup", arguments_json="{}", risk=read_only)
        )
        await self._next(requests)
        yield npb.ToolSessionResponse(
            tool_call=npb.ToolCall(call_id="c2", name="explode", arguments_json="{}", risk=read_only)
        )
        await self._next(requests)
        yield npb.ToolSessionResponse(
            approval_request=npb.ApprovalRequest(
                call_id="c3", tool_name="send", arguments_json='{"to": "bob"}', risk=mutating, adapter="fake"
            )
        )
        approval = await self._next(requests)
        if approval.approval.decision != npb.APPROVAL_DECISION_DENY:
            arguments = approval.approval.edited_arguments_json or '{"to": "bob"}'
            yield npb.ToolSessionResponse(
                tool_call=npb.ToolCall(call_id="c3", name="send", arguments_json=arguments, risk=mutating)
            )
            await self._next(requests)
        answers = [json_format.MessageToDict(m) for m in self.received[1:]]
        yield npb.ToolSessionResponse(invoke_result=npb.InvokeResponse(text=json.dumps(answers)))

    async def bootstrap(
        self, request: npb.BootstrapRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> npb.BootstrapResponse:
        return npb.BootstrapResponse(selected=json_format.MessageToJson(request))

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "ToolSession": grpc.stream_stream_rpc_method_handler(
                self.tool_session,
                request_deserializer=npb.ToolSessionRequest.FromString,
                response_serializer=npb.ToolSessionResponse.SerializeToString,
            ),
            "Bootstrap": grpc.unary_unary_rpc_method_handler(
                self.bootstrap,
                request_deserializer=npb.BootstrapRequest.FromString,
                response_serializer=npb.BootstrapResponse.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler(NEGOTIATOR_SERVICE, handlers)
