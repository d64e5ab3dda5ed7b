"""Hypothesis fuzzing of every negotiator RPC against a real `negotiator serve` over a Unix socket.

Random CallOptions (model, effort, profile, persona, settings as arbitrary JSON
including NaN and infinities, MCP servers, max depth, tool filters, stream
events, allow_unknown with out-of-range enum values), random output schemas
(text, JSON, schema-shaped JSON with $refs to nowhere and to the network),
random prompts, shortnames, register targets and delegation-depth metadata.
Every call must end OK or with a documented status: never UNKNOWN; an
ErrorInfo in the negotiator domain whose reason is in the taxonomy; INTERNAL
only for OUTPUT_SCHEMA_VIOLATION and ADAPTER_INTERNAL, which are INTERNAL by
design (the adapter broke its contract, not the caller). Afterwards the
negotiator still serves and health is SERVING.

The adapters: a scripted framework declaring most capabilities, a scripted
framework whose Produce answers "not json", a scripted harness, and the
command harness `cat`.

Sizes (environment):
    RELIABILITY_FUZZ_EXAMPLES  examples per RPC (CI 100, full 500)
    RELIABILITY_FULL=1         every default at full size
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from tests.reliability.rel_support import (
    UNDECODABLE,
    Figures,
    Sidecar,
    Sizes,
    decoded,
    health,
    make_short_dir,
    negotiator_error_problem,
    raw_call,
    start_negotiator,
)

EXAMPLES = Sizes.from_env(os.environ).fuzz_examples
# Examples sized by RELIABILITY_FUZZ_EXAMPLES (the run's depth); the rest is the suite's profile.
FUZZ = settings(max_examples=EXAMPLES)
CALL_TIMEOUT_SECONDS = 30.0
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT32_MAX = 2**32 - 1

CONFIG = """\
adapters:
  - shortname: framework
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities:
        structured_output: supported
        model_override: supported
        settings: supported
        stream_events: supported
        mcp: unsupported
        tool_filter: supported
        depth_limit: unsupported
        persona: unsupported
        effort: unsupported
      accepted_settings: [temperature, seed]
      string_formats: [email, date]
    options:
      invoke: {echo: true}
      produce: {json: {"name": "Ada", "email": "ada@example.org"}}
      events: [{type: message, text: thinking}]
  - shortname: garbage
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {structured_output: supported}
    options:
      produce: {text: "not json"}
  - shortname: harness
    implementation: scripted
    declaration:
      kind: agent-harness
      capabilities: {structured_output: unsupported}
    options:
      invoke: {text: harness reply}
  - shortname: shell-echo
    implementation: command
    options:
      argv: ["cat"]
      timeout_seconds: 10
"""
KNOWN = ("framework", "garbage", "harness", "shell-echo")
NASTY = (
    "",
    " ",
    ".",
    "..",
    "../x",
    "/etc/passwd",
    ".hidden",
    "UPPER",
    "a" * 200,
    "é",
    "\U0001f600",
    "-x",
    "x/y",
)

texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
shortnames = st.one_of(st.sampled_from(KNOWN), st.sampled_from(NASTY), texts)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(2**60), 2**60).map(float),
        texts,
    ),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(texts, children, max_size=3)),
    max_leaves=12,
)
finite_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False), texts),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(texts, children, max_size=3)),
    max_leaves=6,
)
setting_names = st.one_of(st.sampled_from(("temperature", "seed", "cwd", "env", "timeout", "top_p")), texts)
enum_values = st.one_of(st.integers(0, 21), st.integers(INT32_MIN, INT32_MAX))
SAMPLE_SCHEMAS = (
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"}},
    },
    {"type": "object", "required": ["missing"]},
    {"type": "string", "format": "hostname"},
    {"$ref": "#/$defs/nowhere"},
    {"$ref": "http://127.0.0.1:1/schema.json"},
    {"$ref": "file:///etc/passwd"},
    {"$id": "urn:x", "$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"a": {"$dynamicRef": "#meta"}}},
    {"pattern": "(a+)+$"},
    {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {}}}},
    True,
    False,
)
schema_texts = st.one_of(
    texts,
    st.sampled_from(SAMPLE_SCHEMAS).map(json.dumps),
    json_values.map(lambda value: json.dumps(value, allow_nan=True)),
    st.dictionaries(
        st.sampled_from(
            ("type", "properties", "required", "items", "format", "$ref", "enum", "const", "allOf", "not")
        ),
        json_values,
        max_size=4,
    ).map(lambda value: json.dumps(value, allow_nan=True)),
)


def struct_of(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


words = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
VALID_SCHEMAS = (
    *(schema for schema in SAMPLE_SCHEMAS if "$ref" not in json.dumps(schema)),
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
)


def sometimes(draw: st.DrawFn, mostly_valid: bool) -> bool:
    """Whether to set an optional field: rarely in mostly-valid calls, so they stay acceptable."""
    return draw(st.integers(0, 3)) == 0 if mostly_valid else draw(st.booleans())


@st.composite
def call_options(draw: st.DrawFn, mostly_valid: bool) -> pb.CallOptions:
    """Random options; when `mostly_valid`, each field is well-formed, so calls get past validation."""
    free_text = words if mostly_valid else st.one_of(texts, words)
    options = pb.CallOptions(
        stream_events=draw(st.booleans()),
        allow_unknown=[
            common_pb2.Capability.ValueType(value)
            for value in draw(st.lists(st.integers(1, 20) if mostly_valid else enum_values, max_size=3))
        ],
    )
    for name in ("model", "effort", "profile", "persona"):
        if sometimes(draw, mostly_valid):
            setattr(options, name, draw(free_text))
    if sometimes(draw, mostly_valid):
        keys = (
            st.sampled_from(("temperature", "seed", "cwd", "env", "timeout"))
            if mostly_valid
            else setting_names
        )
        values = finite_json_values if mostly_valid else json_values
        options.settings.CopyFrom(struct_of(draw(st.dictionaries(keys, values, max_size=3))))
    if sometimes(draw, mostly_valid):
        for index in range(draw(st.integers(1, 2))):
            transport = draw(st.sampled_from(("stdio", "http")) if mostly_valid else st.one_of(texts, words))
            options.mcp_servers.append(
                pb.McpServer(
                    name=f"server-{index}" if mostly_valid else draw(texts),
                    transport=transport,
                    command=draw(words if transport == "stdio" else texts),
                    args=draw(st.lists(texts, max_size=2)),
                    env=draw(st.dictionaries(texts, texts, max_size=2)),
                    url=draw(st.sampled_from(("http://127.0.0.1:1/mcp", "file:///etc/passwd")) | texts),
                    headers=draw(st.dictionaries(texts, texts, max_size=2)),
                )
            )
    if sometimes(draw, mostly_valid):
        if draw(st.booleans()):
            options.max_depth.depth = draw(st.sampled_from((0, 1, UINT32_MAX)) | st.integers(0, UINT32_MAX))
        else:
            options.max_depth.provider_managed = True if mostly_valid else draw(st.booleans())
    if sometimes(draw, mostly_valid):
        names = (
            st.lists(words, min_size=1, max_size=2, unique=True)
            if mostly_valid
            else st.lists(texts, max_size=2)
        )
        options.tool_filter.CopyFrom(pb.ToolFilter(allow=draw(names), deny=draw(names)))
    return options


FRAMEWORKS = ("framework", "garbage")
HARNESSES = ("harness", "shell-echo")


def set_target(draw: st.DrawFn, request: pb.ProduceRequest | pb.InvokeRequest, mostly_valid: bool) -> None:
    if mostly_valid:
        # `adapter` selects frameworks and `agent` harnesses; a well-formed call names the right kind.
        shortname = draw(st.sampled_from(KNOWN))
        setattr(request, "adapter" if shortname in FRAMEWORKS else "agent", shortname)
        return
    target = draw(st.sampled_from(("adapter", "agent", "none")))
    if target != "none":
        setattr(request, target, draw(shortnames))


@st.composite
def produce_requests(draw: st.DrawFn) -> pb.ProduceRequest:
    mostly_valid = draw(st.booleans())
    request = pb.ProduceRequest(
        prompt=draw(words if mostly_valid else texts),
        output_schema=draw(st.sampled_from(VALID_SCHEMAS).map(json.dumps) if mostly_valid else schema_texts),
        options=draw(call_options(mostly_valid)),
    )
    set_target(draw, request, mostly_valid)
    return request


@st.composite
def invoke_requests(draw: st.DrawFn) -> pb.InvokeRequest:
    mostly_valid = draw(st.booleans())
    request = pb.InvokeRequest(
        prompt=draw(words if mostly_valid else texts), options=draw(call_options(mostly_valid))
    )
    set_target(draw, request, mostly_valid)
    return request


# Printable ASCII (all gRPC metadata values may hold); digits are the valid case.
depth_metadata = st.one_of(
    st.none(),
    st.none(),
    st.integers(0, 2**70).map(str),
    st.from_regex(r"[ -~]{0,12}", fullmatch=True),
)


@dataclass
class FuzzedNegotiator:
    server: Sidecar
    channel: grpc.Channel
    stub: negotiator_pb2_grpc.NegotiatorServiceStub
    socket_path: Path
    calls: dict[str, int]
    oks: dict[str, int]
    errors: dict[str, int]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, figures: Figures) -> Iterator[FuzzedNegotiator]:
    directory = tmp_path_factory.mktemp("negotiator-fuzz")
    config = directory / "negotiator.yaml"
    config.write_text(CONFIG)
    socket_dir = make_short_dir("rel-fz-")
    server = start_negotiator(config, socket_dir / "ng.sock", directory / "negotiator.log")
    channel = grpc.insecure_channel(server.target)
    state = FuzzedNegotiator(
        server,
        channel,
        negotiator_pb2_grpc.NegotiatorServiceStub(channel),
        socket_dir / "ng.sock",
        {},
        {},
        {},
    )
    try:
        yield state
        assert server.alive(), server.log_tail()
        assert health(server.target) == "SERVING"
        names = {
            adapter.declaration.shortname
            for adapter in state.stub.ListAdapters(pb.ListAdaptersRequest()).adapters
        }
        assert set(KNOWN) <= names
        figures.record(
            "fuzz_negotiator_rpcs",
            {
                "examples_per_rpc": EXAMPLES,
                "calls": dict(sorted(state.calls.items())),
                "ok": dict(sorted(state.oks.items())),
                "documented_errors": dict(sorted(state.errors.items())),
                "unknown_or_undocumented": 0,
                "health_after": "SERVING",
            },
        )
    finally:
        channel.close()
        server.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def check_call(fuzzed: FuzzedNegotiator, name: str, call: Callable[[], Any]) -> Any:
    result: Any = None
    try:
        result = call()
        fuzzed.oks[name] = fuzzed.oks.get(name, 0) + 1
    except grpc.RpcError as error:
        status = decoded(error)
        problem = negotiator_error_problem(status)
        assert problem is None, f"{name}: {problem}"
        key = f"{status.code.name}/{status.reason}"
        fuzzed.errors[key] = fuzzed.errors.get(key, 0) + 1
    fuzzed.calls[name] = fuzzed.calls.get(name, 0) + 1
    return result


def metadata_of(depth: str | None) -> tuple[tuple[str, str], ...]:
    return () if depth is None else (("x-delegation-depth", depth),)


@FUZZ
@given(
    kind=st.sampled_from(("produce", "invoke", "none")), produce=produce_requests(), invoke=invoke_requests()
)
def test_fuzz_negotiate(
    fuzzed: FuzzedNegotiator, kind: str, produce: pb.ProduceRequest, invoke: pb.InvokeRequest
) -> None:
    request = pb.NegotiateRequest()
    if kind == "produce":
        request.produce.CopyFrom(produce)
    elif kind == "invoke":
        request.invoke.CopyFrom(invoke)
    response = check_call(
        fuzzed, "Negotiate", lambda: fuzzed.stub.Negotiate(request, timeout=CALL_TIMEOUT_SECONDS)
    )
    if response is not None:
        decision = response.decision
        assert decision.accepted == (len(decision.gaps) == 0)


@FUZZ
@given(request=produce_requests(), depth=depth_metadata)
def test_fuzz_produce(fuzzed: FuzzedNegotiator, request: pb.ProduceRequest, depth: str | None) -> None:
    response = check_call(
        fuzzed,
        "Produce",
        lambda: fuzzed.stub.Produce(request, timeout=CALL_TIMEOUT_SECONDS, metadata=metadata_of(depth)),
    )
    if response is not None:
        json.loads(response.output_json)  # only schema-valid JSON is ever returned
        assert response.decision.accepted


@FUZZ
@given(request=invoke_requests(), depth=depth_metadata)
def test_fuzz_invoke(fuzzed: FuzzedNegotiator, request: pb.InvokeRequest, depth: str | None) -> None:
    response = check_call(
        fuzzed,
        "Invoke",
        lambda: fuzzed.stub.Invoke(request, timeout=CALL_TIMEOUT_SECONDS, metadata=metadata_of(depth)),
    )
    if response is not None:
        assert response.decision.accepted
        if not request.options.stream_events:
            assert list(response.events) == []


@FUZZ
@given(shortname=shortnames)
def test_fuzz_get_adapter(fuzzed: FuzzedNegotiator, shortname: str) -> None:
    request = pb.GetAdapterRequest(shortname=shortname)
    response = check_call(
        fuzzed, "GetAdapter", lambda: fuzzed.stub.GetAdapter(request, timeout=CALL_TIMEOUT_SECONDS)
    )
    if response is not None:
        assert response.adapter.declaration.shortname == shortname


# A host name would be resolved (and might hang on DNS): targets are local or unparsable.
_HOST_PORT = re.compile(r":\d+$")


@st.composite
def register_targets(draw: st.DrawFn, own_socket: str) -> str:
    return draw(
        st.one_of(
            texts.filter(lambda text: not _HOST_PORT.search(text)),
            st.sampled_from(
                (
                    "",
                    "unix:",
                    "unix:/nonexistent/dir/adapter.sock",
                    "unix://host/adapter.sock",
                    "unix:///",
                    "unix:/etc/passwd",
                    f"unix:{own_socket}",
                    "127.0.0.1:1",
                    "127.0.0.1:0",
                    "127.0.0.1:99999",
                    "[::1]:1",
                    ":80",
                    "host:",
                )
            ),
            texts.map(lambda text: "unix:" + text.replace("\x00", "")),
        )
    )


@FUZZ
@given(data=st.data(), shortname=st.one_of(st.just(""), shortnames))
def test_fuzz_register_adapter(fuzzed: FuzzedNegotiator, data: st.DataObject, shortname: str) -> None:
    target = data.draw(register_targets(str(fuzzed.socket_path)))
    request = pb.RegisterAdapterRequest(target=target, shortname=shortname)
    response = check_call(
        fuzzed, "RegisterAdapter", lambda: fuzzed.stub.RegisterAdapter(request, timeout=CALL_TIMEOUT_SECONDS)
    )
    assert response is None, f"registered something at {target!r}: {response}"


@FUZZ
@given(shortname=shortnames)
def test_fuzz_deregister_adapter(fuzzed: FuzzedNegotiator, shortname: str) -> None:
    request = pb.DeregisterAdapterRequest(shortname=shortname)
    response = check_call(
        fuzzed,
        "DeregisterAdapter",
        lambda: fuzzed.stub.DeregisterAdapter(request, timeout=CALL_TIMEOUT_SECONDS),
    )
    # Only runtime-registered adapters can go, and the fuzzing registers none.
    assert response is None


def test_fuzz_calls_without_input(fuzzed: FuzzedNegotiator) -> None:
    listed = check_call(fuzzed, "ListAdapters", lambda: fuzzed.stub.ListAdapters(pb.ListAdaptersRequest()))
    assert {adapter.declaration.shortname for adapter in listed.adapters} == set(KNOWN)

    def watch_existing() -> list[str]:
        # The call object is also a grpc.Future (cancel), which the stubs do not say.
        call: Any = fuzzed.stub.WatchAdapters(pb.WatchAdaptersRequest(), timeout=CALL_TIMEOUT_SECONDS)
        try:
            return [next(call).adapter.declaration.shortname for _ in KNOWN]
        finally:
            call.cancel()

    assert set(check_call(fuzzed, "WatchAdapters", watch_existing)) == set(KNOWN)


@pytest.mark.parametrize(
    "schema",
    ['{"not": ' * 500 + "{}" + "}" * 500, "[" * 1000 + "]" * 1000, '{"a": ' * 100_000],
    ids=["not-chain-500", "array-1000", "object-100000-unclosed"],
)
def test_a_deeply_nested_output_schema_is_invalid_request(fuzzed: FuzzedNegotiator, schema: str) -> None:
    request = pb.ProduceRequest(adapter="framework", prompt="p", output_schema=schema)
    with pytest.raises(grpc.RpcError) as caught:
        fuzzed.stub.Produce(request, timeout=CALL_TIMEOUT_SECONDS)
    status = decoded(caught.value)
    assert (status.code, status.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"), status


NEGOTIATOR_METHODS = tuple(
    (method.name, method.server_streaming)
    for method in pb.DESCRIPTOR.services_by_name["NegotiatorService"].methods
    if not method.client_streaming
)


@pytest.mark.parametrize(
    ("method", "streaming"), NEGOTIATOR_METHODS, ids=[name for name, _ in NEGOTIATOR_METHODS]
)
def test_undecodable_request_bytes_are_not_unknown(
    fuzzed: FuzzedNegotiator, method: str, streaming: bool
) -> None:
    call = raw_call(
        fuzzed.channel,
        f"/{pb.DESCRIPTOR.services_by_name['NegotiatorService'].full_name}/{method}",
        streaming,
    )
    with pytest.raises(grpc.RpcError) as caught:
        call(UNDECODABLE)
    assert caught.value.code() is not grpc.StatusCode.UNKNOWN, caught.value.details()
