"""InvokeStream / ProduceStream in front of a real LiteLLM proxy streaming its `mock_response` as SSE.

The adapter talks to LiteLLM directly (no recording proxy in between, which would buffer the
stream), so what the caller receives is LiteLLM's own chunking; a second adapter goes through
the recording proxy to show what was asked for.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from tests.peers.negotiator_kit import KEY_ENV, negotiator_stub
from tests.peers.peer_support import Peer, RecordingProxy
from tests.peers.test_litellm import MASTER_KEY, STRICT_READY, litellm, proxy

pytestmark = pytest.mark.peers
__all__ = ["litellm", "proxy"]  # the module-scoped fixtures, shared with this module


def config(direct_url: str, recorded_url: str) -> str:
    return f"""\
adapters:
  - shortname: litellm
    implementation: openai
    options: {{base_url: "{direct_url}", api_key_env: {KEY_ENV}, model: mock-drop}}
  - shortname: litellm-recorded
    implementation: openai
    options: {{base_url: "{recorded_url}", api_key_env: {KEY_ENV}, model: mock-strict}}
"""


@pytest.fixture
async def stub(
    litellm: Peer,
    proxy: RecordingProxy,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
    monkeypatch.setenv(KEY_ENV, MASTER_KEY)
    proxy.clear()
    async with negotiator_stub(config(litellm.base_url, proxy.base_url), tmp_path_factory.mktemp("n")) as n:
        yield n


async def test_invoke_stream_reads_litellms_sse_deltas(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
) -> None:
    messages = [
        m
        async for m in stub.InvokeStream(
            pb.InvokeStreamRequest(invoke=pb.InvokeRequest(adapter="litellm", prompt="Hi.")), timeout=30
        )
    ]
    kinds = [m.WhichOneof("kind") for m in messages]
    assert kinds[0] == "decision"
    assert kinds[-1] == "final"
    assert set(kinds[1:-1]) == {"delta"}
    assert len(kinds) > 3  # LiteLLM streams the text in several chunks
    assert messages[-1].final.text == "answered without effort"
    assert "".join(m.delta for m in messages[1:-1]) == "answered without effort"


async def test_produce_stream_asks_for_sse_with_usage_and_validates_the_whole_output(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    request = pb.ProduceRequest(
        adapter="litellm-recorded", prompt="Answer.", output_schema=json.dumps(STRICT_READY)
    )
    messages = [m async for m in stub.ProduceStream(pb.ProduceStreamRequest(produce=request), timeout=30)]
    assert messages[0].WhichOneof("kind") == "decision"
    final = messages[-1].final
    assert json.loads(final.output_json) == {"answer": "from litellm", "tags": []}
    assert "".join(m.delta for m in messages[1:-1]) == final.output_json
    [sent] = proxy.chat_requests()
    assert (sent["stream"], sent["stream_options"]) == (True, {"include_usage": True})
