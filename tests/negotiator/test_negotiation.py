"""The pure core: request validation, requirement derivation, judgement and selection."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import make_declaration

from agentsidecar.negotiator_service.errors import AdapterKindMismatch, AdapterNotFound, InvalidRequest
from agentsidecar.negotiator_service.model import (
    AdapterKind,
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    CapabilityState,
    Declaration,
    MaxDepth,
    McpServer,
    Requirement,
    ToolFilter,
    TypedSet,
)
from agentsidecar.negotiator_service.negotiation import (
    check_schema_text,
    derive_requirements,
    judge,
    normalize_transport,
    select,
    validate_request,
)

SUPPORTED = CapabilityState.SUPPORTED
UNKNOWN = CapabilityState.UNKNOWN
UNSUPPORTED = CapabilityState.UNSUPPORTED

OBJECT_SCHEMA = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}})


def produce(schema: str | None = OBJECT_SCHEMA, **options: Any) -> CallRequest:
    return CallRequest(
        CallKind.PRODUCE, "prompt", adapter="a", output_schema=schema, options=CallOptions(**options)
    )


def invoke(**options: Any) -> CallRequest:
    return CallRequest(CallKind.INVOKE, "prompt", adapter="a", options=CallOptions(**options))


def violations(request: CallRequest) -> list[tuple[str, str]]:
    with pytest.raises(InvalidRequest) as caught:
        validate_request(request)
    return list(caught.value.violations)


def fields(request: CallRequest) -> list[str]:
    return [field for field, _ in violations(request)]


# --- validate_request -------------------------------------------------------------------------


def test_a_valid_produce_returns_the_parsed_schema() -> None:
    assert validate_request(produce()) == json.loads(OBJECT_SCHEMA)


def test_a_valid_invoke_returns_none() -> None:
    assert validate_request(invoke(model="m", settings={"temperature": 0.2})) is None


@pytest.mark.parametrize(("text", "expected"), [("true", {}), ("false", {"not": {}})])
def test_boolean_schemas_become_their_object_equivalents(text: str, expected: dict[str, Any]) -> None:
    assert validate_request(produce(text)) == expected


def test_neither_adapter_nor_agent_is_refused() -> None:
    assert fields(CallRequest(CallKind.INVOKE, "p")) == ["target"]


def test_both_adapter_and_agent_are_refused() -> None:
    assert fields(CallRequest(CallKind.INVOKE, "p", adapter="a", agent="b")) == ["target"]


def test_an_empty_shortname_is_refused() -> None:
    assert fields(CallRequest(CallKind.INVOKE, "p", agent="")) == ["agent"]


def test_empty_prompt_is_refused() -> None:
    assert fields(CallRequest(CallKind.INVOKE, "", adapter="a")) == ["prompt"]


@pytest.mark.parametrize("schema", [None, ""])
def test_produce_needs_a_schema(schema: str | None) -> None:
    assert violations(produce(schema)) == [("output_schema", "is required for Produce")]


def test_invoke_takes_no_schema() -> None:
    request = CallRequest(CallKind.INVOKE, "p", adapter="a", output_schema="{}")
    assert fields(request) == ["output_schema"]


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object or boolean, not an array"),
        ('"string"', "not a string"),
        ("3", "not a number"),
        ("null", "not null"),
        ('{"type": "banana"}', "is not a valid draft 2020-12 JSON Schema at /type"),
        ('{"properties": {"x": {"minLength": -1}}}', "at /properties/x/minLength"),
        ('{"$ref": "#/$defs/missing"}', '$ref "#/$defs/missing" at / does not resolve'),
        ('{"properties": {"x": {"$ref": "https://elsewhere.invalid/s.json"}}}', "at /properties/x"),
        # A key spelt with escapes is still a reference: the text holds no "$ref".
        ('{"properties": {"x": {"\\u0024ref": "#/$defs/missing"}}}', "at /properties/x does not resolve"),
        (
            '{"$defs": {"a": {"$dyn\\u0061micRef": "#/$defs/a"}}, "$ref": "#/$defs/a"}',
            "refers back to itself",
        ),
        ('{"$schema": 5}', "is not a valid draft 2020-12 JSON Schema at /$schema"),
        # Draft 2020-12 applies whatever `$schema` names: draft-07's array `items` is refused.
        (
            '{"$schema": "http://json-schema.org/draft-07/schema#", "items": [{}]}',
            "is not a valid draft 2020-12 JSON Schema at /items",
        ),
    ],
)
def test_bad_schemas_are_refused(schema: str, fragment: str) -> None:
    [(field, description)] = violations(produce(schema))
    assert field == "output_schema"
    assert fragment in description


# What only compiling the schema finds: each refused before dispatch, naming where it is.
_UNCOMPILABLE = [
    (
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}},
        'is not a valid draft 2020-12 JSON Schema at /properties/a/pattern: "(unclosed" is not a "regex"',
    ),
    (
        {"patternProperties": {"^ok$": {}, "a/(b": {"type": "integer"}}},
        'is not a valid draft 2020-12 JSON Schema at /patternProperties/a~1(b: "a/(b" is not a "regex"',
    ),
    # Applied through a reference: compiled once the reference checks pass.
    (
        {"$defs": {"p": {"pattern": "a{2,1}"}}, "properties": {"a": {"$ref": "#/$defs/p"}}},
        'is not a valid draft 2020-12 JSON Schema at /$defs/p/pattern: "a{2,1}" is not a "regex"',
    ),
    (
        {"items": {"pattern": "[z-a]"}},
        'is not a valid draft 2020-12 JSON Schema at /items/pattern: "[z-a]" is not a "regex"',
    ),
    (
        {"properties": {"a": {"$id": "not a uri"}}},
        "is not a valid draft 2020-12 JSON Schema at /: Invalid URI reference 'not a uri': "
        "unexpected character at index 3",
    ),
    (
        {"properties": {"a": {"$dynamicRef": "#nowhere"}}},
        "is not a valid draft 2020-12 JSON Schema at /: Anchor 'nowhere' does not exist",
    ),
]


@pytest.mark.parametrize(("schema", "description"), _UNCOMPILABLE)
def test_a_schema_that_does_not_compile_is_refused_naming_where(
    schema: dict[str, Any], description: str
) -> None:
    assert violations(produce(json.dumps(schema))) == [("output_schema", description)]
    for compile in (True, False):  # a call to dispatch, a dry run
        checked, parsed = check_schema_text(json.dumps(schema), compile=compile)
        assert checked.problems == (("output_schema", description),)
        assert parsed is None


def test_a_metaschema_problem_is_named_before_a_bad_pattern() -> None:
    schema = {"properties": {"a": {"pattern": "("}, "b": {"type": "banana"}}}
    [(field, description)] = violations(produce(json.dumps(schema)))
    assert field == "output_schema"
    assert description.startswith("is not a valid draft 2020-12 JSON Schema at /properties/b/type: ")


@pytest.mark.parametrize("pattern", ["^[a-z]+$", "\\p{L}+", "(?<year>[0-9]{4})-[0-9]{2}", "^\\d{3}(?=x)"])
def test_patterns_the_validator_compiles_are_accepted(pattern: str) -> None:
    schema = {"properties": {"a": {"pattern": pattern}}, "patternProperties": {pattern: {}}}
    assert validate_request(produce(json.dumps(schema))) == schema


@pytest.mark.parametrize(
    ("text", "escape"),
    [('{"properties": {"\\ud800": {}}}', "\\ud800"), ('{"enum": ["ok", "x\\udc00"]}', "\\udc00")],
)
def test_a_lone_surrogate_escape_is_an_invalid_request_not_a_crash(text: str, escape: str) -> None:
    assert violations(produce(text)) == [
        ("output_schema", f"is not valid JSON: {escape} is a lone surrogate, not a character")
    ]


def test_a_surrogate_pair_escape_is_one_character() -> None:
    assert validate_request(produce('{"const": "\\ud83d\\ude00"}')) == {"const": "\U0001f600"}


def test_local_refs_including_nested_ids_resolve() -> None:
    schema = {
        "$id": "https://example.test/root.json",
        "$defs": {"name": {"$id": "name.json", "type": "string"}, "n": {"type": "integer"}},
        "properties": {"a": {"$ref": "name.json"}, "b": {"$ref": "#/$defs/n"}},
    }
    assert validate_request(produce(json.dumps(schema))) == schema


@pytest.mark.parametrize("name", ["model", "effort", "profile", "persona"])
def test_set_but_empty_strings_are_refused(name: str) -> None:
    assert violations(invoke(**{name: ""})) == [(f"options.{name}", "must not be empty when set")]


def test_settings_with_an_empty_key_are_refused() -> None:
    assert fields(invoke(settings={"": 1, "ok": 2})) == ["options.settings"]


@pytest.mark.parametrize(
    ("server", "field"),
    [
        (McpServer(name="", transport="stdio", command="x"), "options.mcp_servers[0].name"),
        (McpServer(name="s", transport="carrier-pigeon"), "options.mcp_servers[0].transport"),
        (McpServer(name="s", transport="stdio"), "options.mcp_servers[0].command"),
        (McpServer(name="s", transport="sse"), "options.mcp_servers[0].url"),
        (McpServer(name="s", transport="http"), "options.mcp_servers[0].url"),
        (McpServer(name="s", transport="streamable-http"), "options.mcp_servers[0].url"),
    ],
)
def test_bad_mcp_servers_are_refused(server: McpServer, field: str) -> None:
    assert fields(invoke(mcp_servers=(server,))) == [field]


def test_duplicate_mcp_server_names_are_refused() -> None:
    servers = (
        McpServer(name="s", transport="stdio", command="x"),
        McpServer(name="s", transport="http", url="http://127.0.0.1:1/"),
    )
    assert violations(invoke(mcp_servers=servers)) == [
        ("options.mcp_servers[1].name", 'duplicate MCP server name "s"')
    ]


def test_valid_mcp_servers_pass() -> None:
    servers = (
        McpServer(name="a", transport="stdio", command="x"),
        McpServer(name="b", transport="streamable-http", url="http://127.0.0.1:1/"),
        McpServer(name="c", transport="sse", url="http://127.0.0.1:2/"),
    )
    assert validate_request(invoke(mcp_servers=servers)) is None


@pytest.mark.parametrize(
    ("tool_filter", "field"),
    [
        (ToolFilter(), "options.tool_filter"),
        (ToolFilter(allow=("read", "")), "options.tool_filter.allow[1]"),
        (ToolFilter(deny=("rm", "rm")), "options.tool_filter.deny[1]"),
    ],
)
def test_bad_tool_filters_are_refused(tool_filter: ToolFilter, field: str) -> None:
    assert fields(invoke(tool_filter=tool_filter)) == [field]


@pytest.mark.parametrize(
    ("max_depth", "field"),
    [
        (MaxDepth(), "options.max_depth"),
        (MaxDepth(depth=2, provider_managed=True), "options.max_depth"),
        (MaxDepth(depth=-1), "options.max_depth.depth"),
    ],
)
def test_bad_max_depth_is_refused(max_depth: MaxDepth, field: str) -> None:
    assert fields(invoke(max_depth=max_depth)) == [field]


def test_every_problem_is_reported_at_once() -> None:
    request = CallRequest(
        CallKind.PRODUCE,
        "",
        output_schema="{nope",
        options=CallOptions(
            model="",
            settings={"": 1},
            mcp_servers=(McpServer(name="x", transport="stdio"),),
            tool_filter=ToolFilter(),
            persona="",
        ),
    )
    assert fields(request) == [
        "target",
        "prompt",
        "output_schema",
        "options.model",
        "options.persona",
        "options.settings",
        "options.mcp_servers[0].command",
        "options.tool_filter",
    ]


def test_normalize_transport() -> None:
    assert normalize_transport("streamable-http") == "http"
    assert normalize_transport("stdio") == "stdio"


# --- derive_requirements ----------------------------------------------------------------------


def derive(request: CallRequest) -> list[Requirement]:
    return list(derive_requirements(request, validate_request(request)))


def test_a_bare_invoke_requires_nothing() -> None:
    assert derive(invoke()) == []


def test_every_option_derives_its_requirement_in_request_order() -> None:
    request = produce(
        json.dumps({"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}),
        model="m",
        effort="high",
        settings={"temperature": 0.1, "seed": 7},
        profile="p",
        mcp_servers=(
            McpServer(name="a", transport="stdio", command="x"),
            McpServer(name="b", transport="streamable-http", url="http://127.0.0.1:1/"),
            McpServer(name="c", transport="http", url="http://127.0.0.1:2/"),
        ),
        max_depth=MaxDepth(depth=2),
        tool_filter=ToolFilter(allow=("read",)),
        persona="reviewer",
        stream_events=True,
    )
    assert derive(request) == [
        Requirement(Capability.STRUCTURED_OUTPUT, "output_schema"),
        Requirement(
            Capability.STRUCTURED_OUTPUT,
            "output_schema/properties/when/format",
            TypedSet.STRING_FORMATS,
            "date",
        ),
        Requirement(Capability.MODEL_OVERRIDE, "options.model"),
        Requirement(Capability.EFFORT, "options.effort"),
        Requirement(Capability.EFFORT, "options.effort", TypedSet.EFFORT_LEVELS, "high"),
        Requirement(Capability.SETTINGS, "options.settings"),
        Requirement(Capability.SETTINGS, "options.settings.seed", TypedSet.ACCEPTED_SETTINGS, "seed"),
        Requirement(
            Capability.SETTINGS, "options.settings.temperature", TypedSet.ACCEPTED_SETTINGS, "temperature"
        ),
        Requirement(Capability.PROFILE_OVERRIDE, "options.profile"),
        Requirement(Capability.MCP, "options.mcp_servers"),
        Requirement(Capability.MCP, "options.mcp_servers[0].transport", TypedSet.MCP_TRANSPORTS, "stdio"),
        Requirement(Capability.MCP, "options.mcp_servers[1].transport", TypedSet.MCP_TRANSPORTS, "http"),
        Requirement(Capability.DEPTH_LIMIT, "options.max_depth"),
        Requirement(Capability.TOOL_FILTER, "options.tool_filter"),
        Requirement(Capability.PERSONA, "options.persona"),
        Requirement(Capability.STREAM_EVENTS, "options.stream_events"),
    ]


def test_depth_zero_is_still_a_depth_limit() -> None:
    assert derive(invoke(max_depth=MaxDepth(depth=0))) == [
        Requirement(Capability.DEPTH_LIMIT, "options.max_depth")
    ]


def test_provider_managed_depth_needs_depth_limit_and_subagents() -> None:
    assert derive(invoke(max_depth=MaxDepth(provider_managed=True))) == [
        Requirement(Capability.DEPTH_LIMIT, "options.max_depth"),
        Requirement(Capability.SUBAGENTS, "options.max_depth.provider_managed"),
    ]


def formats_of(schema: Any) -> list[tuple[str, str]]:
    return [
        (r.request_field, r.member)
        for r in derive(produce(json.dumps(schema)))
        if r.typed_set is TypedSet.STRING_FORMATS
    ]


def test_formats_are_found_in_every_subschema_keyword() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"format": "email"}},
        "patternProperties": {"^x/y$": {"format": "uuid"}},
        "additionalProperties": {"format": "hostname"},
        "propertyNames": {"format": "idn-hostname"},
        "dependentSchemas": {"a": {"format": "ipv4"}},
        "unevaluatedProperties": {"format": "ipv6"},
        "$defs": {"d": {"format": "uri"}},
        "definitions": {"d": {"format": "uri-reference"}},
        "allOf": [{"format": "date"}],
        "anyOf": [{"format": "time"}],
        "oneOf": [{"format": "date-time"}],
        "not": {"format": "duration"},
        "if": {"format": "regex"},
        "then": {"format": "json-pointer"},
        "else": {"format": "relative-json-pointer"},
        "items": {"format": "iri"},
        "prefixItems": [{"format": "iri-reference"}],
        "contains": {"format": "uri-template"},
        "unevaluatedItems": {"format": "idn-email"},
    }
    assert formats_of(schema) == [
        ("output_schema/properties/a/format", "email"),
        ("output_schema/patternProperties/^x~1y$/format", "uuid"),
        ("output_schema/additionalProperties/format", "hostname"),
        ("output_schema/propertyNames/format", "idn-hostname"),
        ("output_schema/dependentSchemas/a/format", "ipv4"),
        ("output_schema/unevaluatedProperties/format", "ipv6"),
        ("output_schema/$defs/d/format", "uri"),
        ("output_schema/definitions/d/format", "uri-reference"),
        ("output_schema/allOf/0/format", "date"),
        ("output_schema/anyOf/0/format", "time"),
        ("output_schema/oneOf/0/format", "date-time"),
        ("output_schema/not/format", "duration"),
        ("output_schema/if/format", "regex"),
        ("output_schema/then/format", "json-pointer"),
        ("output_schema/else/format", "relative-json-pointer"),
        ("output_schema/items/format", "iri"),
        ("output_schema/prefixItems/0/format", "iri-reference"),
        ("output_schema/contains/format", "uri-template"),
        ("output_schema/unevaluatedItems/format", "idn-email"),
    ]


def test_format_as_data_is_not_a_keyword() -> None:
    schema = {
        "type": "object",
        "properties": {
            # A property *named* format is a subschema, not the keyword.
            "format": {"type": "string", "enum": [{"format": "email"}]},
            "b": {
                "const": {"format": "uuid"},
                "default": {"format": "ipv4"},
                "examples": [{"format": "uri"}],
            },
        },
        "required": ["format"],
    }
    assert formats_of(schema) == []


def test_each_format_is_required_once_at_its_first_use() -> None:
    schema = {
        "properties": {
            "a": {"format": "email"},
            "b": {"items": {"format": "email"}},
            "c": {"format": "date"},
        }
    }
    assert formats_of(schema) == [
        ("output_schema/properties/a/format", "email"),
        ("output_schema/properties/c/format", "date"),
    ]


# --- judge ------------------------------------------------------------------------------------


def one(
    requirement: Requirement, declaration: Declaration, allow: frozenset[Capability] = frozenset()
) -> Any:
    [verdict] = judge(declaration, [requirement], allow).verdicts
    return verdict


MODEL = Requirement(Capability.MODEL_OVERRIDE, "options.model")
SEED = Requirement(Capability.SETTINGS, "options.settings.seed", TypedSet.ACCEPTED_SETTINGS, "seed")


def test_capability_requirements_take_the_declared_state() -> None:
    assert one(MODEL, make_declaration(supported=[Capability.MODEL_OVERRIDE])).state is SUPPORTED
    assert one(MODEL, make_declaration(unsupported=[Capability.MODEL_OVERRIDE])).state is UNSUPPORTED
    assert one(MODEL, make_declaration()).state is UNKNOWN


@pytest.mark.parametrize(
    ("capability_state", "members", "expected"),
    [
        (SUPPORTED, ["seed"], SUPPORTED),
        (None, ["seed"], SUPPORTED),  # the member is declared even if the capability is not
        (UNKNOWN, ["seed"], SUPPORTED),  # the set holds it; the capability's own verdict says UNKNOWN
        (SUPPORTED, ["temperature"], UNSUPPORTED),  # a declared capability makes its set authoritative
        (UNKNOWN, ["temperature"], UNSUPPORTED),  # declared UNKNOWN too: the set is all the code carries
        (UNSUPPORTED, [], UNSUPPORTED),
        (None, ["temperature"], UNKNOWN),  # undeclared capability: the set says nothing
    ],
)
def test_set_member_requirements(
    capability_state: CapabilityState | None, members: list[str], expected: CapabilityState
) -> None:
    declaration = Declaration(
        "a",
        AdapterKind.FRAMEWORK,
        {} if capability_state is None else {Capability.SETTINGS: capability_state},
        accepted_settings=frozenset(members),
    )
    assert one(SEED, declaration).state is expected


def test_unknown_is_allowed_only_for_listed_capabilities() -> None:
    declaration = make_declaration()
    assert one(MODEL, declaration, frozenset({Capability.MODEL_OVERRIDE})).allowed_unknown is True
    assert one(MODEL, declaration, frozenset({Capability.EFFORT})).allowed_unknown is False
    assert one(SEED, declaration, frozenset({Capability.SETTINGS})).allowed_unknown is True


def test_unsupported_is_never_overridable() -> None:
    declaration = make_declaration(unsupported=[Capability.MODEL_OVERRIDE, Capability.SETTINGS])
    every = frozenset(Capability)
    assert one(MODEL, declaration, every).accepted is False
    assert one(SEED, declaration, every).accepted is False


def test_decision_names_the_adapter_and_declaration_version() -> None:
    declaration = make_declaration("named", supported=[Capability.MODEL_OVERRIDE])
    decision = judge(declaration, [MODEL, SEED], frozenset())
    assert decision.adapter == "named"
    assert decision.declaration_version == declaration.version
    assert [v.requirement for v in decision.verdicts] == [MODEL, SEED]
    assert [v.requirement for v in decision.gaps] == [SEED]
    assert not decision.accepted


# --- select -----------------------------------------------------------------------------------


FRAMEWORK = make_declaration("fw", AdapterKind.FRAMEWORK)
HARNESS = make_declaration("hn", AdapterKind.HARNESS)


def lookup(name: str) -> Declaration:
    table = {"fw": FRAMEWORK, "hn": HARNESS}
    if name not in table:
        raise AdapterNotFound(name)
    return table[name]


def test_adapter_selects_frameworks_and_agent_selects_harnesses() -> None:
    assert select(CallRequest(CallKind.INVOKE, "p", adapter="fw"), lookup) is FRAMEWORK
    assert select(CallRequest(CallKind.INVOKE, "p", agent="hn"), lookup) is HARNESS


@pytest.mark.parametrize(
    ("request_", "selected_by", "kind"),
    [
        (CallRequest(CallKind.INVOKE, "p", adapter="hn"), "adapter", "agent-harness"),
        (CallRequest(CallKind.INVOKE, "p", agent="fw"), "agent", "agent-framework"),
    ],
)
def test_kind_mismatch_both_ways(request_: CallRequest, selected_by: str, kind: str) -> None:
    with pytest.raises(AdapterKindMismatch) as caught:
        select(request_, lookup)
    assert caught.value.selected_by == selected_by
    assert caught.value.kind == kind


def test_unknown_adapter_is_not_found() -> None:
    with pytest.raises(AdapterNotFound, match='"ghost"'):
        select(CallRequest(CallKind.INVOKE, "p", adapter="ghost"), lookup)


def test_a_schema_nested_too_deeply_is_an_invalid_request_not_a_crash() -> None:
    deep = '{"not": ' * 100 + "{}" + "}" * 100
    request = CallRequest(kind=CallKind.PRODUCE, prompt="p", adapter="a", output_schema=deep)
    with pytest.raises(InvalidRequest) as raised:
        validate_request(request)
    assert raised.value.violations == (("output_schema", "is nested more than 64 levels deep"),)
