"""A finished ToolSession ends OK on the server too: the clients wait for its status, never cancel it.

The session's result is its last message, and the status follows it on the
wire. A client that cancels as soon as it has the result races that status,
and the negotiator then logs and counts the session as CANCELLED.
Here a real `negotiator serve` process writes its call log to a file and
serves metrics, and both clients run sessions with an approval round and
read-only ones.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentsidecar.clients.aio import AsyncNegotiatorClient
from agentsidecar.clients.negotiator import NegotiatorClient, tool_spec
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from tests.procs import start_process, stop_process

SESSIONS = 8  # per client and kind: a client cancelling on the result loses the race in most of them
CONFIG = """\
adapters:
  - shortname: tooled
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {tool_registration: supported}
    options:
      tool_calls:
        - {name: write, arguments: {path: /tmp/x}}
      reply_with_tool_results: true
"""
WRITE = tool_spec("write", arguments_schema={"type": "object"}, risk="mutating")
READ = tool_spec("write", arguments_schema={"type": "object"}, risk="read_only")
CALL = pb.InvokeRequest(adapter="tooled", prompt="write it")


class Negotiator:
    def __init__(self, target: str, log_file: Path, metrics: str) -> None:
        self.target = target
        self.log_file = log_file
        self.metrics = metrics


@pytest.fixture
def negotiator(socket_dir: Path, tmp_path: Path) -> Iterator[Negotiator]:
    config = tmp_path / "negotiator.yaml"
    config.write_text(CONFIG)
    log_file = tmp_path / "calls.jsonl"
    target = f"unix:{socket_dir / 'negotiator.sock'}"
    process, _ = start_process(
        [
            *(sys.executable, "-m", "agentsidecar.negotiator_service.cli", "serve"),
            *("--config", str(config), "--state-dir", str(tmp_path / "state")),
            *("--listen", target, "--log-file", str(log_file), "--metrics-listen", "127.0.0.1:0"),
        ]
    )
    try:
        assert process.stderr is not None
        address = None
        while address is None:
            line = process.stderr.readline()
            assert line, "the negotiator exited before announcing its metrics"
            if '"event":"sidecar.metrics"' in line:
                address = json.loads(line)["url"].removeprefix("http://").removesuffix("/metrics")
        yield Negotiator(target, log_file, address)
    finally:
        stop_process(process)


def run_tool(call: pb.ToolCall) -> object:
    return "written"


def approve(request: pb.ApprovalRequest) -> bool:
    return True


@pytest.mark.slow
async def test_sessions_with_and_without_approvals_are_logged_and_counted_ok(negotiator: Negotiator) -> None:
    def sync_sessions() -> None:
        with NegotiatorClient(negotiator.target) as client:
            for tools in [WRITE] * SESSIONS + [READ] * SESSIONS:
                reply = client.tool_session(CALL, tools=[tools], run_tool=run_tool, approve=approve)
                assert "written" in reply.text

    await asyncio.to_thread(sync_sessions)
    async with AsyncNegotiatorClient(negotiator.target) as aio_client:
        for tools in [WRITE] * SESSIONS + [READ] * SESSIONS:
            reply = await aio_client.tool_session(CALL, tools=[tools], run_tool=run_tool, approve=approve)
            assert "written" in reply.text

    expected = 4 * SESSIONS
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while True:  # the log is written in batches by a background thread
        records: list[dict[str, Any]] = [
            json.loads(line) for line in negotiator.log_file.read_text().splitlines()
        ]
        statuses = [r["status"] for r in records if r["method"] == "ToolSession"]
        if len(statuses) >= expected or loop.time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert statuses == ["OK"] * expected

    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://{negotiator.metrics}/metrics", timeout=5)
    handled = {
        sample.labels["grpc_code"]: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "grpc_server_handled_total" and sample.labels["grpc_method"] == "ToolSession"
    }
    assert handled == {"OK": expected}
