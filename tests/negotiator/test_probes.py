"""Probes with evidence: a real negotiator probing the local OpenAI mock over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from mock_openai import MockOpenAI

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import probes
from agentsidecar.negotiator_service.adapters.openai import code_declaration
from agentsidecar.negotiator_service.cli import main
from agentsidecar.negotiator_service.config import load_negotiator_config
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.model import Capability, CapabilityState
from agentsidecar.negotiator_service.probes import ProbeKind, ProbeVerdict
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from agentsidecar.sidecar_runtime.richstatus import decode_error

KEY_ENV = "NEGOTIATOR_TEST_PROBES_KEY"
SUPPORTED = common_pb2.CAPABILITY_STATE_SUPPORTED
UNKNOWN = common_pb2.CAPABILITY_STATE_UNKNOWN
UNSUPPORTED = common_pb2.CAPABILITY_STATE_UNSUPPORTED
EFFORT = common_pb2.CAPABILITY_EFFORT
PASSED = pb.PROBE_VERDICT_PASSED
FAILED = pb.PROBE_VERDICT_FAILED
INCONCLUSIVE = pb.PROBE_VERDICT_INCONCLUSIVE


def config_text(base_url: str, extra: str = "") -> str:
    return f"""\
adapters:
  - shortname: llm
    implementation: openai
    options: {{base_url: "{base_url}", api_key_env: {KEY_ENV}, model: mock-chat}}
    declaration:
      models:
        mock-vouched:
          capabilities: {{effort: supported}}
        mock-refused:
          capabilities: {{effort: unsupported}}
  - shortname: canned
    implementation: scripted
    declaration: {{kind: agent-framework}}
    options: {{invoke: {{text: hi}}}}
{extra}"""


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        server.listed_models = ["mock-chat", "mock-reasoning", "mock-vouched", "mock-refused"]
        server.reasoning_models = {"mock-reasoning"}
        server.structured = {"ok": True}
        server.call_required_tools = True
        yield server


def write_config(mock: MockOpenAI, directory: Path, extra: str) -> Path:
    directory.mkdir(exist_ok=True)
    config = directory / "negotiator.yaml"
    config.write_text(config_text(mock.base_url, extra))
    return config


async def start(mock: MockOpenAI, directory: Path, socket_dir: Path, extra: str = "") -> RunningNegotiator:
    config = write_config(mock, directory, extra)
    settings = Settings(
        listen=(f"unix:{socket_dir / 'negotiator.sock'}",), config_path=config, grace_seconds=1.0
    )
    return await create_server(settings, conversation_store=ConversationStore(directory / "conversations"))


@pytest.fixture
async def negotiator(
    mock: MockOpenAI, tmp_path: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[RunningNegotiator]:
    monkeypatch.setenv(KEY_ENV, "sk-test-probes")
    running = await start(mock, tmp_path, socket_dir)
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def stub(
    negotiator: RunningNegotiator,
) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)


def model_states(adapter: pb.Adapter, model: str) -> dict[int, int]:
    for entry in adapter.declaration.models:
        if entry.model == model:
            return {c.capability: c.state for c in entry.capabilities}
    return {c.capability: c.state for c in adapter.declaration.capabilities}


def verdicts(evidence: Any) -> list[tuple[str, int]]:
    return [(e.probe, e.verdict) for e in evidence]


async def effort_call(stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, model: str) -> pb.Decision:
    call = pb.InvokeRequest(adapter="llm", prompt="p", options=pb.CallOptions(model=model, effort="low"))
    return (await stub.Negotiate(pb.NegotiateRequest(invoke=call), timeout=5)).decision


async def test_a_probe_that_shows_reasoning_settles_effort_supported_for_that_model(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, mock: MockOpenAI
) -> None:
    assert not (await effort_call(stub, "mock-reasoning")).accepted
    before = (await stub.GetAdapter(pb.GetAdapterRequest(shortname="llm"))).adapter.declaration.version
    watch = stub.WatchAdapters(pb.WatchAdaptersRequest())
    async for change in watch:  # the existing adapters first
        if change.adapter.declaration.shortname == "llm":
            break

    response = await stub.ProbeAdapter(
        pb.ProbeAdapterRequest(shortname="llm", model="mock-reasoning"), timeout=10
    )

    assert verdicts(response.evidence) == [
        ("models", PASSED),
        ("structured_output", PASSED),
        ("tool_call", PASSED),
        ("effort", PASSED),
    ]
    effort = response.evidence[3]
    assert effort.capability == EFFORT
    assert effort.model == "mock-reasoning"
    assert '"reasoning_effort": "low"' in effort.request
    assert "reasoning_tokens" in effort.reply
    assert "5 reasoning tokens" in effort.detail
    assert abs(effort.time.ToDatetime(UTC) - datetime.now(UTC)).total_seconds() < 30
    adapter = response.adapter
    assert model_states(adapter, "mock-reasoning")[EFFORT] == SUPPORTED
    assert adapter.declaration.version != before
    assert list(adapter.probe_evidence) == list(response.evidence)
    # An UPDATED event carries the new declaration and the evidence.
    change = await asyncio.wait_for(anext(aiter(watch)), 5)
    watch.cancel()
    assert change.change == pb.ADAPTER_CHANGE_UPDATED
    assert change.adapter.declaration.version == adapter.declaration.version
    assert len(change.adapter.probe_evidence) == 4
    # Calls to that model are now judged with effort supported; other models keep UNKNOWN.
    assert (await effort_call(stub, "mock-reasoning")).accepted
    assert not (await effort_call(stub, "mock-chat")).accepted
    # What the upstream received: the model listing, then three chat requests.
    assert [(r.method, r.path) for r in mock.requests] == [("GET", "/v1/models")] + [
        ("POST", "/v1/chat/completions")
    ] * 3
    assert mock.requests[3].body["reasoning_effort"] == "low"


async def test_a_reply_without_reasoning_marks_effort_unsupported_for_that_model_only(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, mock: MockOpenAI
) -> None:
    response = await stub.ProbeAdapter(pb.ProbeAdapterRequest(shortname="llm", model="mock-chat"), timeout=10)
    assert verdicts(response.evidence)[-1] == ("effort", FAILED)
    assert "no reasoning" in response.evidence[-1].detail
    assert model_states(response.adapter, "mock-chat")[EFFORT] == UNSUPPORTED
    gaps = (await effort_call(stub, "mock-chat")).gaps
    assert [(g.requirement.request_field, g.state) for g in gaps] == [("options.effort", UNSUPPORTED)]
    # The adapter-level declaration, which judges other models, still says UNKNOWN.
    states = {c.capability: c.state for c in response.adapter.declaration.capabilities}
    assert states[EFFORT] == UNKNOWN


@pytest.mark.slow
async def test_a_probe_never_overrides_what_config_stated(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, mock: MockOpenAI
) -> None:
    vouched = await stub.ProbeAdapter(
        pb.ProbeAdapterRequest(shortname="llm", model="mock-vouched"), timeout=10
    )
    assert verdicts(vouched.evidence)[-1] == ("effort", FAILED)  # the mock shows no reasoning for it
    assert model_states(vouched.adapter, "mock-vouched")[EFFORT] == SUPPORTED  # the operator's word stands
    mock.requests.clear()
    refused = await stub.ProbeAdapter(
        pb.ProbeAdapterRequest(shortname="llm", model="mock-refused"), timeout=10
    )
    # Effort is not probed where config declares it UNSUPPORTED: no verdict could change it.
    assert [e.probe for e in refused.evidence] == ["models", "structured_output", "tool_call"]
    assert all("reasoning_effort" not in (r.body or {}) for r in mock.requests)
    assert model_states(refused.adapter, "mock-refused")[EFFORT] == UNSUPPORTED


async def test_an_inconclusive_probe_leaves_the_declaration_and_its_version_alone(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, mock: MockOpenAI
) -> None:
    before = (await stub.GetAdapter(pb.GetAdapterRequest(shortname="llm"))).adapter.declaration.version
    mock.mode = "500"
    response = await stub.ProbeAdapter(
        pb.ProbeAdapterRequest(shortname="llm", model="mock-reasoning"), timeout=10
    )
    assert verdicts(response.evidence)[1:] == [
        ("structured_output", INCONCLUSIVE),
        ("tool_call", INCONCLUSIVE),
        ("effort", INCONCLUSIVE),
    ]
    assert response.adapter.declaration.version == before
    assert "HTTP 500" in response.evidence[-1].reply
    # A model the upstream does not list gets no chat request at all.
    mock.mode = "ok"
    mock.requests.clear()
    missing = await stub.ProbeAdapter(pb.ProbeAdapterRequest(shortname="llm", model="mock-gone"), timeout=10)
    assert verdicts(missing.evidence) == [
        ("models", FAILED),
        ("structured_output", INCONCLUSIVE),
        ("tool_call", INCONCLUSIVE),
        ("effort", INCONCLUSIVE),
    ]
    assert [r.path for r in mock.requests] == ["/v1/models"]
    assert missing.adapter.declaration.version == before


async def test_a_changed_declaration_after_a_probe_ends_a_conversation_pinned_to_the_old_one(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
) -> None:
    options = pb.CallOptions(model="mock-reasoning", conversation_id="probe-conv")
    await stub.Invoke(pb.InvokeRequest(adapter="llm", prompt="hi", options=options), timeout=10)
    await stub.ProbeAdapter(pb.ProbeAdapterRequest(shortname="llm", model="mock-reasoning"), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Invoke(pb.InvokeRequest(adapter="llm", prompt="again", options=options), timeout=10)
    error = decode_error(caught.value)
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "DECLARATION_CHANGED")


async def test_only_an_adapter_with_an_upstream_can_be_probed(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, mock: MockOpenAI
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ProbeAdapter(pb.ProbeAdapterRequest(shortname="canned"), timeout=5)
    error = decode_error(caught.value)
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ADAPTER_NOT_PROBEABLE")
    assert [v.type for v in error.precondition_violations] == ["ADAPTER_NOT_PROBEABLE"]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ProbeAdapter(pb.ProbeAdapterRequest(shortname="nope"), timeout=5)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert mock.requests == []


@pytest.mark.slow
async def test_no_probe_runs_unless_asked_or_configured(
    mock: MockOpenAI, tmp_path: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-probes")
    running = await start(mock, tmp_path / "plain", socket_dir)
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=5)
            adapter = (await stub.GetAdapter(pb.GetAdapterRequest(shortname="llm"), timeout=5)).adapter
            await effort_call(stub, "mock-reasoning")
            await asyncio.sleep(0.3)
    finally:
        await running.stop()
    assert list(adapter.probe_evidence) == []
    assert mock.requests == []  # not one request reached the upstream


@pytest.mark.slow
async def test_configured_probes_run_at_start_up_and_on_their_schedule(
    mock: MockOpenAI, tmp_path: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-probes")
    extra = "probe:\n  every_seconds: 0.2\n  adapters:\n    llm: [mock-reasoning]\n"
    running = await start(mock, tmp_path / "probed", socket_dir, extra)
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            for _ in range(100):
                adapter = (await stub.GetAdapter(pb.GetAdapterRequest(shortname="llm"), timeout=5)).adapter
                if adapter.probe_evidence:
                    break
                await asyncio.sleep(0.05)
            assert model_states(adapter, "mock-reasoning")[EFFORT] == SUPPORTED
            assert (await effort_call(stub, "mock-reasoning")).accepted
            for _ in range(100):  # the schedule probes again
                if sum(r.path == "/v1/models" for r in mock.requests) >= 2:
                    break
                await asyncio.sleep(0.05)
    finally:
        await running.stop()
    assert sum(r.path == "/v1/models" for r in mock.requests) >= 2


async def test_negotiator_probe_cli_prints_the_evidence(
    negotiator: RunningNegotiator, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["--server", negotiator.bound[0], "probe", "llm", "--model", "mock-reasoning"]
    assert await asyncio.to_thread(main, argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [(e["probe"], e["verdict"]) for e in printed["evidence"]][-1] == ("effort", "passed")
    assert printed["evidence"][-1]["capability"] == "effort"
    assert printed["adapter"]["models"]["mock-reasoning"]["capabilities"]["effort"] == "supported"
    assert await asyncio.to_thread(main, ["--server", negotiator.bound[0], "adapters", "llm"]) == 0
    shown = json.loads(capsys.readouterr().out)["adapter"]
    assert [e["probe"] for e in shown["probe_evidence"]] == [
        "models",
        "structured_output",
        "tool_call",
        "effort",
    ]


# --- the pure core ---------------------------------------------------------------


def test_evidence_is_short_and_escaped() -> None:
    request = probes.plan(code_declaration("llm", "m"), "m", strict=True)[-1]
    body = ('{"usage": {}, "note": "\x1b[31mred\n' + "x" * 1000 + '"}').encode()
    evidence = probes.judge(request, 200, body, datetime.now(UTC))
    assert len(evidence.reply) <= probes.EXCERPT_LIMIT
    assert evidence.reply.endswith("...")
    assert "\x1b" not in evidence.reply
    assert "\\x1b[31mred\\n" in evidence.reply
    assert "\n" not in evidence.reply


def test_the_latest_evidence_decides_and_never_sticks() -> None:
    base = code_declaration("llm", "m")
    now = datetime.now(UTC)
    effort = probes.plan(base, "m", strict=True)[-1]
    assert effort.kind is ProbeKind.EFFORT
    passed = probes.judge(
        effort,
        200,
        b'{"choices": [{"message": {}}], "usage": {"completion_tokens_details": {"reasoning_tokens": 9}}}',
        now,
    )
    failed = probes.judge(effort, 400, b'{"error": {"message": "reasoning_effort unsupported"}}', now)
    assert (passed.verdict, failed.verdict) == (ProbeVerdict.PASSED, ProbeVerdict.FAILED)
    assert (
        probes.settle(base, {"m": (passed,)}).models["m"].state(Capability.EFFORT)
        is CapabilityState.SUPPORTED
    )
    assert (
        probes.settle(base, {"m": (failed,)}).models["m"].state(Capability.EFFORT)
        is CapabilityState.UNSUPPORTED
    )
    inconclusive = probes.judge(effort, 503, b"busy", now)
    assert probes.settle(base, {"m": (inconclusive,)}) == base  # nothing moved: no entry, same version


@pytest.mark.parametrize(
    ("probe", "problem"),
    [
        ("probe:\n  adapters:\n    canned: []\n", "a scripted adapter"),
        ("probe:\n  adapters:\n    ghost: []\n", "not an adapter of this config"),
        ("probe:\n  every_seconds: 0\n  adapters: {llm: []}\n", "positive number"),
        ("probe:\n  often: true\n", "unknown key 'often'"),
    ],
)
def test_the_probe_section_is_read_strictly(probe: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_negotiator_config(config_text("http://127.0.0.1:9/v1", probe), "negotiator.yaml")
    assert load_negotiator_config(config_text("http://127.0.0.1:9/v1"), "n.yaml").probe is None
