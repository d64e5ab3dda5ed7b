"""The audit trail over a real negotiator: WatchAudit and the JSON-lines log record every decision.

Calls of every outcome are made against a negotiator writing an audit log;
the stream must carry one record per call, in order, with the right fields,
and the file must hold exactly what the stream carried.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest
from fakes import Hang, make_declaration
from google.protobuf import timestamp_pb2
from negotiator_testkit import NEGOTIATOR_BIN, add_fake, call_error

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import cli
from agentsidecar.negotiator_service.audit import AuditLog, record_json
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.convert import audit_record_to_proto
from agentsidecar.negotiator_service.errors import AuditWatcherDropped
from agentsidecar.negotiator_service.model import (
    AuditOutcome,
    AuditRecord,
    Capability,
    ToolApproval,
    ToolCallDecision,
    ToolCallRecord,
    ToolRisk,
)
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from agentsidecar.negotiator_service.servicer import caller_identity
from agentsidecar.sidecar_runtime.auth import TlsFiles
from agentsidecar.sidecar_runtime.richstatus import decode_error
from agentsidecar.sidecar_runtime.server import ServerOptions
from tests.procs import start_process, stop_process
from tests.runtime.runtime_support import make_pki, tls_channel

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
Watch: TypeAlias = "grpc.aio.UnaryStreamCall[pb.WatchAuditRequest, pb.WatchAuditResponse]"
WATCH_QUEUE = 5


@pytest.fixture
def audit_path(tmp_path: Path) -> Path:
    return tmp_path / "audit.jsonl"


@pytest.fixture
async def negotiator(
    socket_dir: Path, config_file: Path, audit_path: Path, tmp_path: Path
) -> AsyncIterator[RunningNegotiator]:
    """The conftest negotiator, writing an audit log, with small watch buffers and its own state dir."""
    settings = Settings(
        listen=(f"unix:{socket_dir / 'negotiator.sock'}", "127.0.0.1:0"),
        config_path=config_file,
        grace_seconds=1.0,
        audit_log=audit_path,
        audit_watch_queue=WATCH_QUEUE,
    )
    running = await create_server(settings, conversation_store=ConversationStore(tmp_path / "conversations"))
    try:
        yield running
    finally:
        await running.stop()


async def start_watch(stub: Stub) -> Watch:
    """A WatchAudit stream that is registered: every later decision reaches it."""
    watch: Watch = stub.WatchAudit(pb.WatchAuditRequest())
    await asyncio.wait_for(watch.initial_metadata(), 5)
    return watch


async def take(watch: Watch, count: int) -> list[pb.AuditRecord]:
    records = []
    async with asyncio.timeout(5):
        for _ in range(count):
            response = await watch.read()
            assert isinstance(response, pb.WatchAuditResponse), "the stream ended"
            records.append(response.record)
    return records


def invoke(adapter: str, prompt: str = "hi", **options: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(adapter=adapter, prompt=prompt, options=pb.CallOptions(**options))


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def line_of(record: pb.AuditRecord) -> dict[str, Any]:
    """What the JSON-lines file must hold for a streamed record (time compared separately)."""
    return {
        "caller": record.caller,
        "operation": record.operation,
        "adapter": record.adapter,
        "declaration_version": record.declaration_version,
        "verdicts": [cli.verdict_json(v) for v in record.verdicts],
        "outcome": record.outcome,
        "error_reason": record.error_reason,
        "allowed_unknown": [
            common_pb2.Capability.Name(c).removeprefix("CAPABILITY_").lower() for c in record.allowed_unknown
        ],
        "conversation_id": record.conversation_id,
        "delegation_depth": record.delegation_depth,
        "seed": record.seed,
    }


async def test_the_audit_stream_and_file_match_the_calls_made(
    stub: Stub, negotiator: RunningNegotiator, audit_path: Path
) -> None:
    fake = add_fake(
        negotiator,
        make_declaration("fake", supported=[Capability.STATEFUL_HISTORY], unknown=[Capability.PERSONA]),
    )
    watch = await start_watch(stub)
    allow_persona = [common_pb2.CAPABILITY_PERSONA]

    await stub.Invoke(invoke("scripted-fw"), timeout=5)
    await call_error(stub.Invoke(invoke("scripted-fw", persona="critic"), timeout=5))
    await stub.Invoke(
        invoke("fake", persona="critic", allow_unknown=allow_persona), metadata=(("x-delegation-depth", "2"),)
    )
    await call_error(
        stub.Produce(
            pb.ProduceRequest(
                adapter="bad-output",
                prompt="p",
                output_schema='{"type": "object", "properties": {"name": {"type": "string"}}}',
            ),
            timeout=5,
        )
    )
    await stub.Negotiate(pb.NegotiateRequest(invoke=invoke("scripted-fw", model="m")), timeout=5)
    await stub.Negotiate(pb.NegotiateRequest(invoke=invoke("scripted-fw", persona="critic")), timeout=5)
    await call_error(stub.Invoke(invoke("ghost"), timeout=5))
    await call_error(stub.Invoke(invoke("scripted-fw", prompt=""), timeout=5))
    await call_error(stub.Invoke(invoke("fail-timeout"), timeout=5))
    await call_error(stub.Invoke(invoke("fake"), metadata=(("x-delegation-depth", "5"),), timeout=5))
    await stub.Invoke(invoke("fake", conversation_id="c-1"), timeout=5)

    records = await take(watch, 11)
    assert [(r.operation, r.adapter, r.outcome, r.error_reason) for r in records] == [
        ("invoke", "scripted-fw", "succeeded", ""),
        ("invoke", "scripted-fw", "refused", "UNSUPPORTED_CAPABILITY"),
        ("invoke", "fake", "succeeded", ""),
        ("produce", "bad-output", "failed", "OUTPUT_SCHEMA_VIOLATION"),
        ("negotiate", "scripted-fw", "accepted", ""),
        ("negotiate", "scripted-fw", "refused", "UNSUPPORTED_CAPABILITY"),
        ("invoke", "ghost", "refused", "ADAPTER_NOT_FOUND"),
        ("invoke", "scripted-fw", "refused", "INVALID_REQUEST"),
        ("invoke", "fail-timeout", "failed", "ADAPTER_TIMEOUT"),
        ("invoke", "fake", "refused", "DELEGATION_DEPTH_EXCEEDED"),
        ("invoke", "fake", "succeeded", ""),
    ]
    versions = {e.shortname: e.adapter.declaration.version for e in negotiator.registry.list()}
    judged = [r for r in records if r.adapter != "ghost" and r.error_reason != "INVALID_REQUEST"]
    assert all(r.declaration_version == versions[r.adapter] for r in judged)
    assert [r.declaration_version for r in records if r not in judged] == ["", ""]
    assert all(r.caller.startswith("unix:") for r in records)

    refused = records[1]
    assert [
        (cli.verdict_json(v)["request_field"], cli.verdict_json(v)["state"]) for v in refused.verdicts
    ] == [("options.persona", "unsupported")]
    allowed = records[2]
    assert list(allowed.allowed_unknown) == allow_persona
    assert [v.allowed_unknown for v in allowed.verdicts] == [True]
    assert allowed.delegation_depth == 2
    assert records[9].delegation_depth == 5
    assert records[10].conversation_id == "c-1"
    assert fake.call_count == 2  # the depth refusal ran nothing

    lines = json_lines(audit_path)
    assert len(lines) == len(records)
    for line, record in zip(lines, records, strict=True):
        time = timestamp_pb2.Timestamp()
        time.FromJsonString(line.pop("time"))
        assert time == record.time
        assert line == line_of(record)
    assert records[0].time.ToDatetime(tzinfo=UTC) <= datetime.now(UTC)


async def test_the_caller_is_the_peer_address_over_tcp(negotiator: RunningNegotiator) -> None:
    async with grpc.aio.insecure_channel(negotiator.bound[1]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        watch = await start_watch(stub)
        await stub.Invoke(invoke("scripted-fw"), timeout=5)
        [record] = await take(watch, 1)
    assert record.caller.startswith("ipv4:127.0.0.1:")


@pytest.mark.slow
@pytest.mark.parametrize("mutual", [True, False], ids=["mutual-tls", "server-only-tls"])
async def test_over_tls_the_caller_is_the_client_certificate_name_when_one_is_required(
    mutual: bool, socket_dir: Path, config_file: Path, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)
    tls = TlsFiles(pki.server_cert, pki.server_key, client_ca=pki.ca if mutual else None)
    settings = Settings(
        listen=(f"unix:{socket_dir / 'negotiator.sock'}", "127.0.0.1:0"),
        config_path=config_file,
        grace_seconds=1.0,
        server_options=ServerOptions(listen=(), tls=tls),
    )
    running = await create_server(settings, conversation_store=ConversationStore(tmp_path / "conversations"))
    try:
        # The client presents its certificate either way; only mutual TLS asks for it.
        async with tls_channel(running.bound[1], pki, cert=pki.client_cert, key=pki.client_key) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            watch = await start_watch(stub)
            await stub.Invoke(invoke("scripted-fw"), timeout=5)
            await stub.Negotiate(pb.NegotiateRequest(invoke=invoke("scripted-fw")), timeout=5)
            records = await take(watch, 2)
    finally:
        await running.stop()
    callers = {record.caller for record in records}
    if mutual:
        assert callers == {"x509:worker"}
    else:
        [caller] = callers
        assert caller.startswith("ipv4:127.0.0.1:")


def test_the_caller_is_the_client_certificate_name_when_there_is_one() -> None:
    class Context:
        def __init__(self, auth: dict[str, list[bytes]]) -> None:
            self.auth = auth

        def auth_context(self) -> dict[str, list[bytes]]:
            return self.auth

        def peer(self) -> str:
            return "ipv4:10.0.0.7:5555"

    assert caller_identity(Context({"x509_common_name": [b"agent-7"]})) == "x509:agent-7"  # type: ignore[arg-type]
    assert caller_identity(Context({"transport_security_type": [b"ssl"]})) == "ipv4:10.0.0.7:5555"  # type: ignore[arg-type]


async def test_a_cancelled_call_is_audited_as_failed(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, default=Hang())
    watch = await start_watch(stub)
    call = stub.Invoke(invoke("fake"), timeout=5)
    await asyncio.wait_for(fake.started.wait(), 5)
    call.cancel()
    [record] = await take(watch, 1)
    assert (record.outcome, record.error_reason, record.adapter) == ("failed", "CANCELLED", "fake")


@pytest.mark.slow
async def test_a_slow_watcher_is_dropped_and_never_holds_a_call(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    slow = await start_watch(stub)
    # Emitted in one go, before the stream can drain anything: more than its buffer holds.
    for index in range(WATCH_QUEUE + 1):
        negotiator.broker.audit.emit(synthetic(index))
    await asyncio.wait_for(stub.Invoke(invoke("scripted-fw"), timeout=5), 5)  # not held up by the slow one
    prompt = await start_watch(stub)
    await stub.Invoke(invoke("scripted-fw", prompt="after"), timeout=5)

    buffered = await take(slow, WATCH_QUEUE)
    assert [r.caller for r in buffered] == [f"synthetic-{i}" for i in range(WATCH_QUEUE)]
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await asyncio.wait_for(slow.read(), 5)
    error = decode_error(ended.value)
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "AUDIT_WATCHER_DROPPED")
    assert error.metadata == {"queueSize": str(WATCH_QUEUE)}
    [record] = await take(prompt, 1)
    assert (record.operation, record.outcome) == ("invoke", "succeeded")


async def test_stopping_the_server_ends_audit_watches(negotiator: RunningNegotiator, stub: Stub) -> None:
    watch = await start_watch(stub)
    stopping = asyncio.ensure_future(negotiator.stop())
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await asyncio.wait_for(watch.read(), 5)
    assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
    await asyncio.wait_for(stopping, 5)


# --- the AuditLog itself ---------------------------------------------------------------


def synthetic(index: int) -> AuditRecord:
    return AuditRecord(
        time=datetime(2030, 1, 2, 3, 4, 5, index, tzinfo=UTC),
        caller=f"synthetic-{index}",
        operation="invoke",
        outcome=AuditOutcome.SUCCEEDED,
    )


def test_tool_calls_are_in_the_json_line_and_the_proto_alike() -> None:
    call = ToolCallRecord(
        function="t__write_note",
        decision=ToolCallDecision.DENIED,
        approval=ToolApproval.NO_CHANNEL,
        server="t",
        tool="write_note",
        risk=ToolRisk.MUTATING,
        duration_seconds=0.0015,
        error="no ToolSession",
    )
    unmatched = ToolCallRecord(function="nothing", decision=ToolCallDecision.FILTERED)
    record = replace(synthetic(1), tool_calls=(call, unmatched))
    assert record_json(record)["tool_calls"] == [
        {
            "function": "t__write_note",
            "server": "t",
            "tool": "write_note",
            "risk": "mutating",
            "decision": "denied",
            "approval": "no_channel",
            "duration": 0.0015,
            "error": "no ToolSession",
        },
        {
            "function": "nothing",
            "server": "",
            "tool": "",
            "risk": "",
            "decision": "filtered",
            "approval": "",
            "duration": 0.0,
            "error": "",
        },
    ]
    proto = audit_record_to_proto(record).tool_calls
    assert [(c.function, c.risk, c.decision, c.approval, c.duration.ToNanoseconds()) for c in proto] == [
        ("t__write_note", pb.TOOL_RISK_MUTATING, "denied", "no_channel", 1_500_000),
        ("nothing", pb.TOOL_RISK_UNSPECIFIED, "filtered", "", 0),
    ]
    # A record without tool calls keeps its line as it was.
    assert "tool_calls" not in record_json(synthetic(2))


def test_the_log_appends_one_flushed_line_per_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"earlier": true}\n')
    log = AuditLog(path)
    log.emit(synthetic(1))
    # Flushed at once: readable while the log is still open.
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"earlier": True},
        record_json(synthetic(1)),
    ]
    assert record_json(synthetic(1))["time"] == "2030-01-02T03:04:05.000001Z"
    log.close()
    log.close()
    log.emit(synthetic(2))  # after close: nowhere to go, and no error
    assert len(path.read_text().splitlines()) == 2


def test_an_unopenable_log_path_is_a_value_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot open the audit log") as raised:
        AuditLog(tmp_path)  # a directory
    assert str(tmp_path) in str(raised.value)


async def test_a_subscription_delivers_what_it_buffered_then_reports_the_drop() -> None:
    log = AuditLog(queue_size=2)
    subscription = log.subscribe()
    other = log.subscribe()
    kept_up = []
    for index in range(3):
        log.emit(synthetic(index))
        kept_up.append((await other.next()).caller)
    assert log.watcher_count == 1  # the full one was dropped; `other` kept up by reading
    assert kept_up == ["synthetic-0", "synthetic-1", "synthetic-2"]
    assert [(await subscription.next()).caller for _ in range(2)] == ["synthetic-0", "synthetic-1"]
    with pytest.raises(AuditWatcherDropped):
        await subscription.next()


async def test_a_subscription_ends_when_the_log_closes() -> None:
    log = AuditLog()
    subscription = log.subscribe()
    waiting = asyncio.ensure_future(subscription.next())
    await asyncio.sleep(0)
    log.emit(synthetic(0))
    assert (await asyncio.wait_for(waiting, 1)).caller == "synthetic-0"
    log.close()
    assert [record async for record in subscription] == []


# --- the CLI flag ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_serve_audit_log_writes_the_trail(tmp_path: Path, socket_dir: Path) -> None:
    audit = tmp_path / "trail.jsonl"
    socket = socket_dir / "cli.sock"
    process, _ = start_process(
        [str(NEGOTIATOR_BIN), "serve", "--listen", f"unix:{socket}", "--audit-log", str(audit)]
    )
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            await stub.Invoke(pb.InvokeRequest(adapter="demo", prompt="hello"), timeout=5)
    finally:
        stop_process(process)
    [line] = json_lines(audit)
    assert (line["operation"], line["adapter"], line["outcome"]) == ("invoke", "demo", "succeeded")
