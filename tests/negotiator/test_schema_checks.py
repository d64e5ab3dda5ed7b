"""An output schema is checked once per text and compiled once, with the refusals the separate checks give.

A brokered Produce checks its schema by compiling it (the compile applies the
draft 2020-12 metaschema); a dry run checks it without compiling. Both must
refuse the same schemas with the same words, and the output check must apply
the schema the caller sent, whatever the adapter did with its copy.
"""

from __future__ import annotations

import json
from typing import Any, TypeAlias

import grpc
import jsonschema_rs
import pytest
from fakes import FakeAdapter, make_declaration
from hypothesis import given, settings
from hypothesis import strategies as st
from negotiator_testkit import add_fake, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import negotiation
from agentsidecar.negotiator_service.broker import Broker
from agentsidecar.negotiator_service.call_caches import MAX_SCHEMA_BYTES, CallCaches
from agentsidecar.negotiator_service.errors import InvalidRequest, OutputSchemaViolation
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    CallKind,
    CallRequest,
    Capability,
    Requirement,
    TypedSet,
)
from agentsidecar.negotiator_service.negotiation import CheckedSchema
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator
from agentsidecar.sidecar_runtime.richstatus import DecodedError

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "when": {"type": "string", "format": "date"}},
    "required": ["n"],
}

# Each refused by one check before dispatch (test_negotiation.py has the wording of each).
BAD_SCHEMAS = [
    "{not json",
    "[1, 2]",
    '{"type": "banana"}',
    '{"properties": {"x": {"minLength": -1}}}',
    '{"$ref": "#/$defs/missing"}',
    '{"properties": {"x": {"\\u0024ref": "#/$defs/missing"}}}',
    '{"$schema": 5}',
    '{"$schema": "http://json-schema.org/draft-07/schema#", "items": [{}]}',
    '{"$ref": "#"}',
]


def broker_with(adapter: FakeAdapter) -> Broker:
    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(adapter=adapter, source="runtime"))
    return Broker(registry, caches=CallCaches())


def fake(**kwargs: Any) -> FakeAdapter:
    declaration = make_declaration(supported=[Capability.STRUCTURED_OUTPUT], string_formats=["date"])
    return FakeAdapter(declaration, **kwargs)


def produce(schema: str) -> CallRequest:
    return CallRequest(kind=CallKind.PRODUCE, prompt="p", adapter="fake", output_schema=schema)


async def judged(broker: Broker, kind: str, request: CallRequest) -> object:
    if kind == "produce":
        return await broker.call(request, time_budget=None)
    return broker.negotiate(request)


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
async def test_a_produce_and_a_dry_run_refuse_a_bad_schema_alike_every_time(schema: str) -> None:
    expected = negotiation._parse_schema(schema)[1]
    assert expected  # the separate checks refuse it
    for first in ("produce", "negotiate"):
        adapter = fake()
        broker = broker_with(adapter)
        for kind in (first, "negotiate" if first == "produce" else "produce", first):
            with pytest.raises(InvalidRequest) as refused:
                await judged(broker, kind, produce(schema))
            assert list(refused.value.violations) == expected
        assert adapter.call_count == 0


async def test_an_adapter_cannot_loosen_the_callers_schema() -> None:
    refusals: list[str] = []

    def loosen(kind: str, call: AdapterCall) -> str:
        schema: Any = call.output_schema
        try:
            schema["properties"]["n"]["type"] = "string"
        except TypeError:
            refusals.append("retype n")
        try:
            del schema["required"]
        except TypeError:
            refusals.append("drop required")
        try:
            schema["required"].clear()
        except AttributeError:
            refusals.append("empty required")
        return json.dumps({"n": "not a number"})

    broker = broker_with(fake(default=loosen))
    for _ in range(2):  # checked afresh, then with the schema's text known
        with pytest.raises(OutputSchemaViolation) as violated:
            await broker.call(produce(json.dumps(SCHEMA)), time_budget=None)
        assert [pointer for pointer, _ in violated.value.violations] == ["/n"]
    assert refusals == ["retype n", "drop required", "empty required"] * 2


async def test_a_produce_after_a_dry_run_of_its_schema_checks_the_output() -> None:
    adapter = fake(replies=['{"n": 1, "when": "2024-02-30"}', '{"n": 2, "when": "2024-02-03"}'])
    broker = broker_with(adapter)
    text = json.dumps(SCHEMA)
    assert broker.negotiate(produce(text)).accepted
    with pytest.raises(OutputSchemaViolation) as violated:
        await broker.call(produce(text), time_budget=None)
    assert [pointer for pointer, _ in violated.value.violations] == ["/when"]  # formats are checked
    reply, _ = await broker.call(produce(text), time_budget=None)
    assert json.loads(reply.text) == {"n": 2, "when": "2024-02-03"}


# The metaschema does not check `pattern` as a regex, nor `$id` as a URI; compiling does.
# Each: the schema, and its refusal's description.
UNCOMPILABLE = {
    "pattern": (
        {"properties": {"a": {"type": "string", "pattern": "(unclosed"}}},
        'is not a valid draft 2020-12 JSON Schema at /properties/a/pattern: "(unclosed" is not a "regex"',
    ),
    "patternProperties": (
        {"patternProperties": {"x(": {}}},
        'is not a valid draft 2020-12 JSON Schema at /patternProperties/x(: "x(" is not a "regex"',
    ),
    "referenced pattern": (
        {"$defs": {"p": {"pattern": "a**"}}, "properties": {"a": {"$ref": "#/$defs/p"}}},
        'is not a valid draft 2020-12 JSON Schema at /$defs/p/pattern: "a**" is not a "regex"',
    ),
    "$id": (
        {"properties": {"a": {"$id": "a b"}}},
        "is not a valid draft 2020-12 JSON Schema at /: "
        "Invalid URI reference 'a b': unexpected character at index 1",
    ),
}


@pytest.mark.parametrize("name", list(UNCOMPILABLE))
async def test_a_schema_that_cannot_compile_is_refused_before_dispatch_every_time(name: str) -> None:
    schema, expected = UNCOMPILABLE[name]
    text = json.dumps(schema)
    for first in ("produce", "negotiate"):
        adapter = fake(default='{"a": "x"}')
        broker = broker_with(adapter)
        for kind in (first, "negotiate" if first == "produce" else "produce", first):
            with pytest.raises(InvalidRequest) as refused:
                await judged(broker, kind, produce(text))
            assert refused.value.violations == (("output_schema", expected),)
        assert adapter.call_count == 0


def test_a_check_kept_without_its_validator_refuses_a_schema_that_does_not_compile() -> None:
    # The backstop of a call that dispatches: compiling it raises the caller's error, not the compiler's.
    checked = CheckedSchema((), ()).without_validator()
    with pytest.raises(InvalidRequest) as refused:
        checked.compiled({"pattern": "("})
    assert refused.value.violations == (
        ("output_schema", 'is not a valid draft 2020-12 JSON Schema at /pattern: "(" is not a "regex"'),
    )
    valid = checked.compiled({"pattern": "^a"})
    assert valid is not checked  # compiled for one call: the kept check still holds none
    assert not valid.validator().is_valid("b")
    assert valid.validator().is_valid("a")


def test_one_text_is_checked_and_compiled_once_per_server() -> None:
    caches = CallCaches()
    text = json.dumps(SCHEMA)
    checked, schema = caches.dispatch_schema(text)
    assert schema == SCHEMA
    again, none = caches.dispatch_schema(text)
    assert again is checked
    assert none is None  # the parsed schema is never kept: each call parses its own
    assert again.validator() is checked.validator()
    assert caches.checked_schema(text)[0] is checked
    assert CallCaches().dispatch_schema(text)[0] is not checked


def test_formats_are_found_in_document_order_with_escaped_pointers() -> None:
    schema: dict[str, Any] = {
        "properties": {
            "a/b": {"format": "date", "items": [{"format": "uuid"}, {"format": "date"}]},
            "c~d": {"anyOf": [{"format": "email"}], "not": {"format": "ipv4"}},
        },
        "format": "uuid",
        "$defs": {"e": {"prefixItems": [True, {"format": "hostname"}]}},
        "enum": [{"format": "not-a-keyword"}],
    }
    request = CallRequest(kind=CallKind.PRODUCE, prompt="p", adapter="fake", output_schema=json.dumps(schema))
    formats = [
        (r.request_field, r.member)
        for r in negotiation.derive_requirements(request, schema)
        if r.typed_set is TypedSet.STRING_FORMATS
    ]
    assert formats == [
        ("output_schema/properties/a~1b/format", "date"),
        ("output_schema/properties/a~1b/items/0/format", "uuid"),
        ("output_schema/properties/c~0d/anyOf/0/format", "email"),
        ("output_schema/properties/c~0d/not/format", "ipv4"),
        ("output_schema/$defs/e/prefixItems/1/format", "hostname"),
    ]
    valid = {**schema, "properties": {**schema["properties"], "a/b": {"format": "date"}}}
    assert not negotiation._parse_schema(json.dumps(valid))[1]
    for compile in (True, False):
        checked, _ = negotiation.check_schema_text(json.dumps(valid), compile=compile)
        assert list(checked.formats) == [
            ("output_schema/properties/a~1b/format", "date"),
            ("output_schema/properties/c~0d/anyOf/0/format", "email"),
            ("output_schema/properties/c~0d/not/format", "ipv4"),
            ("output_schema/format", "uuid"),
            ("output_schema/$defs/e/prefixItems/1/format", "hostname"),
        ]
    assert negotiation.derive_checked_requirements(request, checked.formats)[0] == Requirement(
        Capability.STRUCTURED_OUTPUT, "output_schema"
    )


# Keywords of draft 2020-12 and of older drafts, each with values valid or not for it.
_KEYWORDS = (
    "type", "properties", "items", "prefixItems", "required", "minimum", "exclusiveMinimum",
    "maxLength", "pattern", "format", "enum", "const", "anyOf", "not", "$schema", "$id",
    "additionalProperties", "dependencies", "dependentRequired", "$defs", "definitions", "minItems",
)  # fmt: skip
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(
        ["string", "object", "banana", "email", "a+", "(", "http://json-schema.org/draft-07/schema#"]
    ),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from([*_KEYWORDS, "a", "b"]), inner, max_size=3),
    ),
    max_leaves=8,
)
_SCHEMAS = st.dictionaries(st.sampled_from(_KEYWORDS), _VALUES, max_size=4)


def _compile_error(schema: dict[str, Any]) -> jsonschema_rs.ValidationError | None:
    try:
        jsonschema_rs.Draft202012Validator(schema, validate_formats=True, offline=True)
    except jsonschema_rs.ValidationError as error:
        return error
    return None


# Every keyword of draft 2020-12's vocabularies (and some of older drafts), with values that
# exercise what compiling checks beyond the metaschema: references, URIs, regular expressions.
_ALL_KEYWORDS = (
    *_KEYWORDS, "$anchor", "$dynamicAnchor", "$comment", "$vocabulary", "allOf", "oneOf", "if", "then",
    "else", "dependentSchemas", "propertyNames", "contains", "minContains", "maxContains", "uniqueItems",
    "unevaluatedItems", "unevaluatedProperties", "contentSchema", "contentEncoding", "contentMediaType",
    "maxItems", "minProperties", "maxProperties", "multipleOf", "maximum", "additionalItems",
    "$recursiveRef", "$recursiveAnchor", "title", "default", "deprecated", "patternProperties",
)  # fmt: skip
_ANY_SCALAR = st.one_of(
    _SCALARS,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
    st.sampled_from(["#", "#a", "a b", "http://x/y", "urn:x", "http://[x", "a{2,1}", "[z-a]", "base64"]),
)
_ANY_VALUE = st.recursive(
    _ANY_SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from([*_ALL_KEYWORDS, "a", "b"]), inner, max_size=3),
    ),
    max_leaves=10,
)


def _metaschema_problems(text: str) -> tuple[tuple[str, str], ...]:
    """The separate checks, the metaschema found by its own error (meta.validate), as the reference."""
    parsed, problems = negotiation._parsed_schema(text)
    if parsed is None:
        return problems
    try:
        if isinstance(parsed.get("$schema", negotiation.DRAFT_2020_12), str):
            jsonschema_rs.meta.validate({**parsed, "$schema": negotiation.DRAFT_2020_12})
        else:
            negotiation.schema_validator(parsed)
    except jsonschema_rs.ValidationError as error:
        where = negotiation.json_pointer(error.instance_path) or "/"
        return (("output_schema", f"is not a valid draft 2020-12 JSON Schema at {where}: {error.message}"),)
    return negotiation._schema_problems(parsed, refers=True) if negotiation._may_refer(text) else ()


def _assert_checked_as_the_separate_checks_and_the_compiler_refuse(schema: dict[str, Any]) -> None:
    text = json.dumps(schema)
    compiled, compiled_schema = negotiation.check_schema_text(text, compile=True)
    checked, checked_schema = negotiation.check_schema_text(text, compile=False)
    # The separate checks' words where they refuse; else the compiler's error, at its place.
    expected = _metaschema_problems(text)
    assert tuple(negotiation._parse_schema(text)[1]) == expected
    error = None if expected else _compile_error(schema)
    if error is not None:
        where = negotiation.json_pointer(error.instance_path) or "/"
        expected = (
            ("output_schema", f"is not a valid draft 2020-12 JSON Schema at {where}: {error.message}"),
        )
    assert compiled.problems == checked.problems == expected
    assert compiled.formats == checked.formats
    assert compiled_schema == checked_schema == (None if expected else json.loads(text))


@given(_SCHEMAS)
def test_compiling_to_check_refuses_exactly_what_the_separate_checks_and_the_compiler_refuse(
    schema: dict[str, Any],
) -> None:
    _assert_checked_as_the_separate_checks_and_the_compiler_refuse(schema)


# More examples than the profile's: the property is a claim about the compiler's checks, and
# cheap examples (no server) are what tests it.
@pytest.mark.slow
@settings(max_examples=2000)
@given(st.dictionaries(st.sampled_from(_ALL_KEYWORDS), _ANY_VALUE, max_size=5))
def test_a_text_the_metaschema_passes_compiles_unless_it_names_what_only_compiling_checks(
    schema: dict[str, Any],
) -> None:
    _assert_checked_as_the_separate_checks_and_the_compiler_refuse(schema)
    text = json.dumps(schema)
    if negotiation._may_refer(text) or negotiation._compile_may_refuse(text):
        return
    if negotiation._parse_schema(text)[1]:
        return
    assert _compile_error(schema) is None


def _every_format(schema: object) -> tuple[tuple[str, str], ...]:
    """The reference walk: every subschema `_children` names, the first `format` of each value."""
    found: list[tuple[str, str]] = []

    def walk(node: object, pointer: str) -> None:
        if not isinstance(node, dict):
            return
        for keyword, value in node.items():
            if keyword == "format" and isinstance(value, str):
                found.append((f"{pointer}/format", value))
            for child_pointer, child in negotiation._children(keyword, value, pointer):
                walk(child, child_pointer)

    walk(schema, "output_schema")
    first: dict[str, str] = {}
    for pointer, string_format in found:
        first.setdefault(string_format, pointer)
    return tuple((pointer, string_format) for string_format, pointer in first.items())


# Schemas thick with `format` keys naming few formats (so most are repeats), under every shape
# of subschema keyword, in data (`enum`, `const`, not walked) and under names needing escapes.
_FORMAT_NAMES = st.sampled_from(["email", "date", "uuid"])
_FORMAT_SCHEMAS = st.recursive(
    st.one_of(
        st.booleans(), st.fixed_dictionaries({"format": _FORMAT_NAMES}, optional={"type": st.just("string")})
    ),
    lambda sub: st.fixed_dictionaries(
        {},
        optional={
            "format": _FORMAT_NAMES,
            "properties": st.dictionaries(st.sampled_from(["a", "a/b", "c~d", "format"]), sub, max_size=3),
            "items": st.one_of(sub, st.lists(sub, max_size=2)),
            "prefixItems": st.lists(sub, max_size=2),
            "anyOf": st.lists(sub, max_size=2),
            "not": sub,
            "$defs": st.dictionaries(st.sampled_from(["x", "y"]), sub, max_size=2),
            "dependentSchemas": st.dictionaries(st.sampled_from(["x"]), sub, max_size=1),
            "enum": st.lists(sub, max_size=2),
            "const": sub,
        },
    ),
    max_leaves=12,
)


def test_the_formats_walk_reads_every_format_however_its_text_spells_the_names() -> None:
    schema = {
        "properties": {
            "format": {"type": "string"},  # a property named "format": no format
            "a": {"format": 'da"te'},  # a name with an escape in the text
            "b": {"format": "email", "const": {"format": "uuid"}},  # data: not a format
            "c": {"items": {"format": "email"}},
            "d": {"format": "uri"},
        }
    }
    expected = (
        ("output_schema/properties/a/format", 'da"te'),
        ("output_schema/properties/b/format", "email"),
        ("output_schema/properties/d/format", "uri"),
    )
    for text in (json.dumps(schema), json.dumps(schema, separators=(",", ":")), json.dumps(schema, indent=2)):
        assert negotiation._text_formats(schema, text) == expected
    unescaped = {
        "properties": {"b": {"format": "email", "const": {"format": "uuid"}}, "d": {"format": "uri"}}
    }
    assert negotiation._text_formats(unescaped, json.dumps(unescaped)) == (
        ("output_schema/properties/b/format", "email"),
        ("output_schema/properties/d/format", "uri"),
    )
    no_names = {"properties": {"format": {"type": "string"}}, "const": {"format": 1}}
    assert negotiation._text_formats(no_names, json.dumps(no_names)) == ()


@pytest.mark.slow
@given(_FORMAT_SCHEMAS.filter(lambda schema: isinstance(schema, dict)))
def test_the_formats_walk_finds_what_walking_every_subschema_finds(schema: dict[str, Any]) -> None:
    expected = _every_format(schema)
    assert negotiation._first_formats(schema) == expected
    text = json.dumps(schema)
    assert negotiation._text_formats(schema, text) == expected
    # Without spaces around the colons, and with line breaks and indents.
    for spaced in (json.dumps(schema, separators=(",", ":")), json.dumps(schema, indent="\t")):
        assert negotiation._text_formats(schema, spaced) == expected
    # The same document with its "format" keys written with an escape.
    escaped = text.replace('"format"', '"form\\u0061t"')
    assert json.loads(escaped) == schema
    assert negotiation._text_formats(schema, escaped) == expected


async def test_a_schema_too_large_to_keep_is_applied_to_every_call_all_the_same() -> None:
    properties = {f"p{index:05}": {"type": "integer"} for index in range(1500)}
    text = json.dumps({"type": "object", "properties": properties, "required": ["p00000"]})
    assert len(text) > MAX_SCHEMA_BYTES
    broker = broker_with(fake(replies=['{"p00000": 1}', '{"p00000": "x"}', '{"p00001": 2}', '{"p00000": 3}']))
    reply, _ = await broker.call(produce(text), time_budget=None)
    assert json.loads(reply.text) == {"p00000": 1}
    for pointer in ("/p00000", ""):  # a wrong type, then the required property missing
        with pytest.raises(OutputSchemaViolation) as violated:
            await broker.call(produce(text), time_budget=None)
        assert [where for where, _ in violated.value.violations] == [pointer]
    reply, _ = await broker.call(produce(text), time_budget=None)
    assert json.loads(reply.text) == {"p00000": 3}
    assert broker.caches.dispatch_schema(text)[1] is not None  # checked afresh: never kept


Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"


async def _stream_error(stub: Stub, request: pb.ProduceRequest) -> DecodedError:
    received: list[pb.ProduceStreamResponse] = []

    async def read() -> None:
        async for message in stub.ProduceStream(pb.ProduceStreamRequest(produce=request), timeout=5):
            received.append(message)

    error = await call_error(read())
    assert received == []  # refused before the decision, so before any message
    return error


@pytest.mark.parametrize("name", ["pattern", "patternProperties", "referenced pattern"])
async def test_over_grpc_a_bad_pattern_is_refused_by_negotiate_and_produce_before_dispatch(
    name: str, negotiator: RunningNegotiator, stub: Stub
) -> None:
    schema, description = UNCOMPILABLE[name]
    adapter = add_fake(negotiator, default='{"a": "x"}')
    request = pb.ProduceRequest(adapter="fake", prompt="p", output_schema=json.dumps(schema))
    for _ in range(2):  # the text checked afresh, then known to the server
        refusals = [
            (await call_error(stub.Negotiate(pb.NegotiateRequest(produce=request), timeout=5)), "produce."),
            (await call_error(stub.Produce(request, timeout=5)), ""),
            (await _stream_error(stub, request), "produce."),  # ProduceStreamRequest.produce
        ]
        for error, prefix in refusals:
            assert error.code is grpc.StatusCode.INVALID_ARGUMENT
            assert error.reason == "INVALID_REQUEST"
            assert error.field_violations == ((f"{prefix}output_schema", description),)
    assert adapter.calls == []


async def test_over_grpc_a_lone_surrogate_escape_is_an_invalid_argument(
    negotiator: RunningNegotiator, stub: Stub
) -> None:
    adapter = add_fake(negotiator)
    request = pb.ProduceRequest(adapter="fake", prompt="p", output_schema='{"properties": {"\\ud800": {}}}')
    for call, field in (
        (stub.Negotiate(pb.NegotiateRequest(produce=request), timeout=5), "produce.output_schema"),
        (stub.Produce(request, timeout=5), "output_schema"),
    ):
        error = await call_error(call)
        assert error.code is grpc.StatusCode.INVALID_ARGUMENT
        assert error.field_violations == (
            (field, "is not valid JSON: \\ud800 is a lone surrogate, not a character"),
        )
    assert adapter.calls == []
