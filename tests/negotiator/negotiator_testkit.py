"""Helpers and constants the negotiator tests import; the fixtures that use them are in conftest.py.

They live here, not in conftest.py, because tests/negotiator has no `__init__.py`: `from conftest
import ...` would resolve to whichever directory's conftest pytest loaded last (running
`pytest tests/negotiator tests/clients` picks the clients one). This module's name is unique.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest
from fakes import FakeAdapter, make_declaration

from agentsidecar.negotiator_service.model import Capability, Declaration
from agentsidecar.negotiator_service.registry import RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator
from agentsidecar.sidecar_runtime.richstatus import DecodedError, decode_error

REPO = Path(__file__).resolve().parents[2]
NEGOTIATOR_BIN = Path(sys.executable).parent / "negotiator"
REMOTE_ADAPTER = REPO / "tests" / "negotiator" / "remote_double.py"
ERROR_KINDS = ("unavailable", "timeout", "rate_limited", "refused", "misconfigured", "internal")

TEST_CONFIG = """\
adapters:
  - shortname: scripted-fw
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities:
        structured_output: supported
        model_override: supported
        settings: supported
        stream_events: supported
        persona: unsupported
      accepted_settings: [temperature]
      string_formats: [email]
    options:
      invoke: {echo: true}
      produce: {json: {"name": "Ada", "email": "ada@example.org"}}
      events: [{type: message, text: thinking}]
  - shortname: scripted-harness
    implementation: scripted
    declaration:
      kind: agent-harness
      capabilities: {structured_output: unsupported}
    options:
      invoke: {text: harness reply}
  - shortname: slow
    implementation: scripted
    declaration: {kind: agent-framework}
    options:
      invoke: {text: too late}
      delay_seconds: 5
  - shortname: bad-output
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {structured_output: supported}
    options:
      produce: {json: {"name": 42, "extra": true}}
"""


def _failing_adapter(kind: str) -> str:
    retry = ", retry_after: 2" if kind == "rate_limited" else ""
    return (
        f"  - shortname: fail-{kind.replace('_', '-')}\n"
        "    implementation: scripted\n"
        "    declaration: {kind: agent-framework}\n"
        f"    options: {{invoke: {{error: {{kind: {kind}, message: scripted {kind}{retry}}}}}}}\n"
    )


TEST_CONFIG += "".join(_failing_adapter(kind) for kind in ERROR_KINDS)
# The caller-supplied MCP servers the tests' requests name (fake adapters run none of them);
# first, so tests may append adapters to the list that ends the text.
TEST_CONFIG = (
    "mcp:\n  caller_stdio_commands: [npx, x, srv]\n  caller_hosts: [localhost, 127.0.0.1, x]\n" + TEST_CONFIG
)

# A declaration supporting everything, with every typed-set member a test uses.
EVERYTHING = make_declaration(
    "fake",
    supported=list(Capability),
    mcp_transports=["stdio", "sse", "http"],
    accepted_settings=["temperature", "seed"],
    string_formats=["email", "date"],
)


def add_fake(
    negotiator: RunningNegotiator, declaration: Declaration = EVERYTHING, source: str = "config", **fake: Any
) -> FakeAdapter:
    adapter = FakeAdapter(declaration, **fake)
    negotiator.registry.add(RegisteredAdapter(adapter=adapter, source=source))
    return adapter


async def call_error(call: Awaitable[Any]) -> DecodedError:
    """Await a call that must fail; its decoded status."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return decode_error(caught.value)
