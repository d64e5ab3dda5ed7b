"""Token usage: from the provider's `usage` into the response, the audit and `/metrics`.

A real `negotiator serve` process with metrics and an audit log on, in front of the local mock.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from mock_openai import MockOpenAI
from negotiator_testkit import NEGOTIATOR_BIN
from test_tools import Caller, Stub, tool

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters.openai import read_usage
from agentsidecar.negotiator_service.model import Usage
from tests.procs import start_process

KEY_ENV = "NEGOTIATOR_TEST_OPENAI_USAGE_KEY"
USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 70,
    "total_tokens": 190,
    "completion_tokens_details": {"reasoning_tokens": 40, "audio_tokens": 0},
    "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0},
}


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        server.usage = USAGE
        yield server


@pytest.fixture
def served(
    mock: MockOpenAI, tmp_path: Path, socket_dir: Path
) -> Iterator[tuple[str, str, Path, subprocess.Popen[str]]]:
    """The negotiator's socket target, its metrics address, its audit log, and the process."""
    config = tmp_path / "negotiator.yaml"
    adapter = {
        "shortname": "llm",
        "implementation": "openai",
        "options": {"base_url": mock.base_url, "api_key_env": KEY_ENV, "model": "mock-chat"},
        "declaration": {"capabilities": {"model_override": "supported"}},
    }
    config.write_text(json.dumps({"adapters": [adapter]}))
    socket_path = socket_dir / "n.sock"
    audit_log = tmp_path / "audit.jsonl"
    process, _ = start_process(
        [
            *(str(NEGOTIATOR_BIN), "serve", "--config", str(config), "--listen", f"unix:{socket_path}"),
            *("--metrics-listen", "127.0.0.1:0", "--audit-log", str(audit_log), "--no-call-log"),
        ],
        env={"XDG_STATE_HOME": str(tmp_path / "state"), KEY_ENV: "sk-test-usage"},
    )
    try:
        assert process.stderr is not None
        address = None
        while address is None:
            line = process.stderr.readline()
            assert line, "the negotiator exited before announcing its metrics"
            if '"event":"sidecar.metrics"' in line:
                address = json.loads(line)["url"].removeprefix("http://").removesuffix("/metrics")
        yield f"unix:{socket_path}", address, audit_log, process
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=15)


@pytest.fixture
async def stub(served: tuple[str, str, Path, subprocess.Popen[str]]) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(served[0]) as channel:
        yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)


async def tokens(address: str) -> dict[tuple[str, str, str], float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://{address}/metrics", timeout=5)).text
    found = {}
    pattern = r'negotiator_tokens_total\{adapter="([^"]*)",kind="([^"]*)",model="([^"]*)"\} (\S+)'
    for adapter, kind, model, value in re.findall(pattern, text):
        found[(adapter, model, kind)] = float(value)
    return found


def audited(audit_log: Path, operation: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in audit_log.read_text().splitlines()]
    return [line for line in lines if line["operation"] == operation]


EXPECTED = pb.Usage(prompt_tokens=120, completion_tokens=70, reasoning_tokens=40, cached_tokens=64)


@pytest.mark.slow
async def test_usage_is_in_the_response_the_audit_and_the_metrics(
    stub: Stub, served: tuple[str, str, Path, subprocess.Popen[str]]
) -> None:
    _, metrics, audit_log, _ = served
    response = await stub.Invoke(pb.InvokeRequest(adapter="llm", prompt="hi"), timeout=10)
    assert response.usage == EXPECTED
    produced = await stub.Produce(
        pb.ProduceRequest(adapter="llm", prompt="hi", output_schema='{"type": "object"}'), timeout=10
    )
    assert produced.usage == EXPECTED
    # A model the declaration does not name is counted as "other": callers cannot grow the labels.
    await stub.Invoke(
        pb.InvokeRequest(adapter="llm", prompt="hi", options=pb.CallOptions(model="made-up-1")), timeout=10
    )
    counted = await tokens(metrics)
    assert {key: value for key, value in counted.items() if key[1] == "mock-chat"} == {
        ("llm", "mock-chat", "prompt"): 240,
        ("llm", "mock-chat", "completion"): 140,
        ("llm", "mock-chat", "reasoning"): 80,
        ("llm", "mock-chat", "cached"): 128,
    }
    assert counted[("llm", "other", "prompt")] == 120
    assert not any(key[1] == "made-up-1" for key in counted)
    usage = {"prompt_tokens": 120, "completion_tokens": 70, "reasoning_tokens": 40, "cached_tokens": 64}
    assert [line["usage"] for line in audited(audit_log, "invoke")] == [usage, usage]
    assert [line["usage"] for line in audited(audit_log, "produce")] == [usage]


@pytest.mark.slow
async def test_usage_is_summed_over_the_tool_rounds(
    stub: Stub, mock: MockOpenAI, served: tuple[str, str, Path, subprocess.Popen[str]]
) -> None:
    mock.tool_rounds = [[{"name": "lookup", "arguments": {"key": "a"}}]]
    caller = Caller(stub)
    await caller.start(pb.InvokeRequest(adapter="llm", prompt="look it up"), [tool("lookup")])
    called = await caller.receive("tool_call")
    await caller.result(called.call_id, {"value": 1})
    final = await caller.receive("invoke_result")
    assert len(mock.requests) == 2
    assert final.usage == pb.Usage(
        prompt_tokens=240, completion_tokens=140, reasoning_tokens=80, cached_tokens=128
    )


@pytest.mark.slow
async def test_no_usage_from_the_provider_is_no_usage_in_the_response(
    stub: Stub, mock: MockOpenAI, served: tuple[str, str, Path, subprocess.Popen[str]]
) -> None:
    mock.report_usage = False
    response = await stub.Invoke(pb.InvokeRequest(adapter="llm", prompt="hi"), timeout=10)
    assert not response.HasField("usage")
    (line,) = audited(served[2], "invoke")
    assert "usage" not in line


def test_read_usage_takes_only_counts() -> None:
    assert read_usage(None) is None
    assert read_usage({"prompt_tokens": 3}) == Usage(prompt_tokens=3)
    malformed = {"prompt_tokens": -1, "completion_tokens": "7", "completion_tokens_details": None}
    assert read_usage(malformed) == Usage()
