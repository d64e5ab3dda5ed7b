"""An output schema is checked once per text and compiled once, with the refusals the separate checks give.

A brokered Produce checks its schema by compiling it (the compile applies the
draft 2020-12 metaschema); a dry run checks it without compiling. Both must
refuse the same schemas with the same words, and the output check must apply
the schema the caller sent, whatever the adapter did with its copy.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import FakeAdapter, make_declaration
from hypothesis import given
from hypothesis import strategies as st

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
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter

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


async def test_the_output_check_applies_the_callers_schema_whatever_the_adapter_did_with_its_copy() -> None:
    def loosen(kind: str, call: AdapterCall) -> str:
        schema: Any = call.output_schema
        schema["properties"]["n"]["type"] = "string"
        del schema["required"]
        return json.dumps({"n": "not a number"})

    broker = broker_with(fake(default=loosen))
    for _ in range(2):  # checked afresh, then with the schema's text known
        with pytest.raises(OutputSchemaViolation) as violated:
            await broker.call(produce(json.dumps(SCHEMA)), time_budget=None)
        assert [pointer for pointer, _ in violated.value.violations] == ["/n"]


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


async def test_a_schema_the_checks_pass_but_that_cannot_compile_fails_at_the_output_check() -> None:
    # The metaschema does not check `pattern` as a regex; compiling it does.
    text = json.dumps({"properties": {"a": {"type": "string", "pattern": "(unclosed"}}})
    adapter = fake(default='{"a": "x"}')
    broker = broker_with(adapter)
    assert broker.negotiate(produce(text)).accepted
    for _ in range(2):
        with pytest.raises(InvalidRequest) as refused:
            await broker.call(produce(text), time_budget=None)
        [(field, description)] = refused.value.violations
        assert field == "output_schema"
        assert description.startswith("cannot be applied: ")
    assert adapter.call_count == 2


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


@given(_SCHEMAS)
def test_compiling_to_check_refuses_exactly_what_the_separate_checks_refuse(schema: dict[str, Any]) -> None:
    text = json.dumps(schema)
    compiled, compiled_schema = negotiation.check_schema_text(text, compile=True)
    checked, checked_schema = negotiation.check_schema_text(text, compile=False)
    assert compiled.problems == checked.problems == tuple(negotiation._parse_schema(text)[1])
    assert compiled.formats == checked.formats
    assert compiled_schema == checked_schema


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
