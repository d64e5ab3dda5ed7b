"""The pure core of declare-and-refuse: validate a call, derive what it needs, judge it.

No I/O and no adapter code: `Broker` calls these before anything runs, and the
Negotiate dry run calls nothing else.

Profiles. `options.profile` names a profile, and who defines profile names is
a choice the operator makes in the config:
- With a `profiles:` section, the negotiator owns the names. A call naming a
  profile gets it expanded here (`expand_profile`) before its requirements
  are derived: request fields win over profile fields, settings merge per key
  (the request's value wins), and the profile's MCP servers come first with
  the request's appended after them (docs/negotiation.md, "Profiles"). The expanded call
  needs only what its contents need, each requirement pointing at where the
  value came from ("profile(research).mcp_servers[0].transport"), so an MCP
  transport the adapter does not declare is refused before dispatch like one
  in the request. It needs no `profile_override`: the adapter never sees the
  profile's name, only its merged options. A name the section does not
  define is INVALID_ARGUMENT on `options.profile`. A profile that wants the
  adapter to apply a profile of its own says so with `adapter_profile`; that
  name is sent as the call's `profile` and needs `profile_override`
  ("profile(NAME).adapter_profile").
- Without a `profiles:` section the name is the adapter's own: it is passed
  on unchanged and needs `profile_override` ("options.profile").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import jsonschema_rs
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from agentsidecar.negotiator_service.errors import AdapterKindMismatch, InvalidRequest
from agentsidecar.negotiator_service.model import (
    MAX_JSON_DEPTH,
    MCP_TRANSPORTS,
    SET_CAPABILITY,
    AdapterKind,
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    CapabilityState,
    Decision,
    Declaration,
    McpServer,
    Profile,
    Requirement,
    TypedSet,
    Verdict,
    json_problem,
    strict_json,
)

if TYPE_CHECKING:
    # referencing exports no name for its resolver type.
    from referencing._core import Resolver

# Conversation ids are opaque (stored under their hash), but they travel in
# error metadata and state files, so they are bounded.
MAX_CONVERSATION_ID_LENGTH = 512

# "streamable-http" is another name for the HTTP transport: normalized before any
# comparison, so a request, a config and a declaration may spell it either way.
_TRANSPORT_ALIASES: Mapping[str, str] = MappingProxyType({"streamable-http": "http"})

# JSON Schema keywords whose value is one subschema, a name->subschema map, or
# a list of subschemas (draft 2020-12, plus `definitions` which older schemas
# still use for `$ref` targets). Everything else is data (enum, const,
# default, examples, ...), where a "format" key is not a keyword.
_SUBSCHEMA_KEYWORDS = frozenset(
    {
        "additionalProperties",
        "items",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_SUBSCHEMA_MAP_KEYWORDS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_SUBSCHEMA_LIST_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})


def normalize_transport(transport: str) -> str:
    """The canonical transport name ("streamable-http" is "http")."""
    return _TRANSPORT_ALIASES.get(transport, transport)


def validate_request(
    request: CallRequest, profiles: Mapping[str, Profile] | None = None
) -> Mapping[str, Any] | None:
    """Check a call's shape; return its parsed output schema (Produce) or None.

    `profiles` are the negotiator's (None: it defines none, so a profile name
    is the adapter's); an unknown name, or a request MCP server named like one
    of the profile's, is a problem of the request.

    Raises InvalidRequest listing every problem at once, so a caller fixes
    them in one round trip. A boolean schema is returned as its object
    equivalent (`true` is `{}`, `false` is `{"not": {}}`).
    """
    schema, _ = validate_call(request, profiles)
    return schema


def validate_call(
    request: CallRequest,
    profiles: Mapping[str, Profile] | None = None,
    check_schema: Callable[[str], tuple[CheckedSchema, Mapping[str, Any] | None]] | None = None,
) -> tuple[Mapping[str, Any] | None, CheckedSchema | None]:
    """`validate_request`, with the output schema's CheckedSchema (None for an Invoke).

    `check_schema` checks a schema text (default: `check_schema_text`); a
    cache of its results hands out the same CheckedSchema for the same text,
    and no parsed schema for a text it knows (the schema returned is then
    None: `CheckedSchema.for_dispatch` gives the one an adapter gets).
    """
    problems: list[tuple[str, str]] = []
    problems.extend(_target_problems(request))
    if request.prompt == "":
        problems.append(("prompt", "must not be empty"))
    schema: Mapping[str, Any] | None = None
    checked: CheckedSchema | None = None
    if request.kind is CallKind.PRODUCE:
        if not request.output_schema:
            problems.append(("output_schema", "is required for Produce"))
        else:
            checked, schema = (check_schema or check_schema_text)(request.output_schema)
            problems.extend(checked.problems)
    elif request.output_schema:
        problems.append(("output_schema", "is only for Produce; Invoke returns plain text"))
    problems.extend(_option_problems(request.options))
    problems.extend(_profile_problems(request.options, profiles))
    if problems:
        raise InvalidRequest(problems)
    return schema, checked


def _target_problems(request: CallRequest) -> list[tuple[str, str]]:
    if request.adapter is None and request.agent is None:
        return [("target", "exactly one of adapter or agent is required")]
    if request.adapter is not None and request.agent is not None:
        return [("target", "set adapter or agent, not both")]
    problems = []
    if request.adapter == "":
        problems.append(("adapter", "must not be empty"))
    if request.agent == "":
        problems.append(("agent", "must not be empty"))
    return problems


# Deeper documents are refused up front: the JSON parser, the metaschema check
# and the requirement walk all recurse, and a RecursionError would surface as
# INTERNAL instead of the caller's INVALID_ARGUMENT. It is the JSON limit, which
# strict_json applies as it parses ("is nested more than 64 levels deep").
MAX_SCHEMA_NESTING = MAX_JSON_DEPTH


def _parse_schema(text: str) -> tuple[Mapping[str, Any] | None, list[tuple[str, str]]]:
    """A schema text's checks without compiling it: the parsed schema, else its problems."""
    parsed, problems = _parsed_schema(text)
    if parsed is None:
        return None, list(problems)
    problems = _schema_problems(parsed, refers=_may_refer(text))
    if problems:
        return None, list(problems)
    return parsed, []


def fresh_schema(text: str) -> dict[str, Any]:
    """A schema text already found valid, parsed: a boolean schema as its object equivalent."""
    parsed = json.loads(text)
    if isinstance(parsed, bool):
        return {} if parsed else {"not": {}}
    schema: dict[str, Any] = parsed
    return schema


def frozen_json(value: Any) -> Any:
    """A parsed JSON value that cannot be changed: each object a MappingProxyType, each array a
    tuple, over copies (nothing else holds them). `plain_json` (adapters/_calls.py) gives the
    plain dicts and lists back, which json.dumps needs."""
    kind = type(value)
    if kind is not dict and kind is not list:
        return value
    # Written out so that no call is made for a scalar, most of a schema's values.
    if kind is dict:
        frozen: dict[str, Any] = {}
        for key, item in value.items():
            kind = type(item)
            frozen[key] = frozen_json(item) if kind is dict or kind is list else item
        return MappingProxyType(frozen)
    items = []
    for item in value:
        kind = type(item)
        items.append(frozen_json(item) if kind is dict or kind is list else item)
    return tuple(items)


class CheckedSchema:
    """What checking one output schema text found: a pure function of the text.

    One CheckedSchema may serve every call with that text (call_caches.py):
    its problems and formats are fixed when it is built, and its validator
    is compiled at most once (by the check, or for the first call that
    dispatches) and immutable, as is the parsed schema those calls hand
    their adapters (`for_dispatch`); one made `without_validator` compiles
    a copy, and parses that schema, per call instead.

    problems: everything wrong with the text (empty when it is usable).
    formats: (request field, format) of the first `format` keyword naming
        each format, in document order (what `derive_checked_requirements` takes).
    """

    __slots__ = ("_keeps_validator", "_schema", "_validator", "formats", "problems")

    def __init__(
        self,
        problems: tuple[tuple[str, str], ...],
        formats: tuple[tuple[str, str], ...] = (),
        validator: jsonschema_rs.Validator | None = None,
        *,
        keeps_validator: bool = True,
    ) -> None:
        self.problems = problems
        self.formats = formats
        self._validator = validator
        self._keeps_validator = keeps_validator
        self._schema: Mapping[str, Any] | None = None

    def for_dispatch(
        self, text: str, parsed: Mapping[str, Any] | None
    ) -> tuple[CheckedSchema, Mapping[str, Any]]:
        """For a call dispatching with this text: the check compiled (`compiled`), and the schema
        its adapter gets; `parsed` is the text as this call's check parsed it (None: not parsed).

        The schema is `frozen_json`: no adapter can change it, so one object serves every call
        with the text (made by the first; per call for one that keeps no validator), and the
        validator is compiled before any adapter holds it.
        """
        schema = self._schema
        if schema is not None:
            return self, schema
        plain = parsed if parsed is not None else fresh_schema(text)
        checked = self.compiled(plain)
        schema = frozen_json(plain)
        if checked._keeps_validator:
            checked._schema = schema
        return checked, schema

    def compiled(self, schema: Mapping[str, Any]) -> CheckedSchema:
        """This check with its validator, compiled from `schema` (this text, parsed) unless it is already.

        Itself, compiled once; or, for one that keeps no validator
        (`without_validator`), a copy compiled for one call. Called before
        dispatch, so a schema that does not compile is refused before any
        adapter code runs: InvalidRequest, worded as `check_schema_text`
        words it (which compiles every text that might fail here, so this
        only repeats its verdict).
        """
        if self._validator is not None:
            return self
        try:
            validator = schema_validator(schema)
        except Exception as exc:  # whatever the compiler rejects, the caller's schema is at fault
            raise InvalidRequest(_compile_problems(exc)) from exc
        if not self._keeps_validator:
            return CheckedSchema(self.problems, self.formats, validator, keeps_validator=False)
        self._validator = validator
        return self

    def without_validator(self) -> CheckedSchema:
        """The same findings, holding no validator and compiling one per call (`compiled`)."""
        return CheckedSchema(self.problems, self.formats, keeps_validator=False)

    def validator(self) -> jsonschema_rs.Validator:
        """The schema compiled for draft 2020-12 with format checks (`compiled` runs first)."""
        validator = self._validator
        assert validator is not None, "compiled() runs before validator()"
        return validator


def check_schema_text(text: str, *, compile: bool = False) -> tuple[CheckedSchema, dict[str, Any] | None]:
    """Check an output schema's text: its CheckedSchema, and (when usable) the schema parsed for this call.

    A usable schema is one the negotiator can apply: it passes the draft
    2020-12 metaschema (whatever its `$schema` says), its references resolve
    within it without a cycle or too many in-place applications, and it
    compiles. Compiling is the only check of what the metaschema leaves
    open, such as whether a `pattern` or `patternProperties` name is a
    regular expression the validator's engine takes, or an `$id` a URI; so
    a schema that does not compile is refused here, before dispatch, never
    found out after the adapter ran.

    The text is parsed once. A document that cannot refer (`_may_refer`) is
    compiled straight away when the call will be dispatched (`compile`) or
    when its text may hold what only compiling checks (`_compile_may_refuse`):
    compiling applies the metaschema, so one that compiles has passed it, and
    only one that does not goes through the separate checks, which word the
    refusal (the compiler's own error when they find nothing). A document
    that may refer is checked first and compiled only once those checks
    pass, so compiling never meets what they refuse. Any other text is
    checked against the metaschema alone and compiled for the first call
    that dispatches (`CheckedSchema.compiled`).
    """
    parsed, problems = _parsed_schema(text)
    if parsed is None:
        return CheckedSchema(problems), None
    refers = _may_refer(text)
    if not refers and (compile or _compile_may_refuse(text)):
        try:
            validator = schema_validator(parsed)
        except Exception as exc:  # worded by the checks, else by the compiler
            return CheckedSchema(_schema_problems(parsed, refers=False) or _compile_problems(exc)), None
        return CheckedSchema((), _text_formats(parsed, text), validator), parsed
    problems = _schema_problems(parsed, refers=refers)
    if problems:
        return CheckedSchema(problems), None
    if refers:
        try:
            validator = schema_validator(parsed)
        except Exception as exc:  # e.g. a `$dynamicRef` naming no anchor, which the checks leave to it
            return CheckedSchema(_compile_problems(exc)), None
        return CheckedSchema((), _text_formats(parsed, text), validator), parsed
    return CheckedSchema((), _text_formats(parsed, text)), parsed


def _compile_may_refuse(text: str) -> bool:
    """Whether compiling a schema that cannot refer may refuse what the metaschema passes.

    Beyond the metaschema, the compiler checks a `pattern` or
    `patternProperties` name (a regular expression), an `$id` (a URI) and
    the references (which `_may_refer` texts are checked for first); a text
    without those words, spelt out, holds none of them
    (tests/negotiator/test_schema_checks.py compares the two on generated
    schemas).
    """
    return "pattern" in text or "$id" in text


def _compile_problems(error: Exception) -> tuple[tuple[str, str], ...]:
    """A compile error of a schema the separate checks pass, worded as they word theirs."""
    if isinstance(error, jsonschema_rs.ValidationError):
        where = json_pointer(error.instance_path) or "/"
        return (("output_schema", f"is not a valid draft 2020-12 JSON Schema at {where}: {error.message}"),)
    return (("output_schema", f"cannot be applied: {error}"),)


def _parsed_schema(text: str) -> tuple[dict[str, Any] | None, tuple[tuple[str, str], ...]]:
    """The text parsed as a schema object (a boolean as its object equivalent), else what is wrong with it."""
    try:
        parsed = strict_json(text)
    except ValueError as exc:  # malformed, NaN / Infinity, or over a JSON limit (nesting, integer digits)
        return None, (("output_schema", json_problem(exc)),)
    if isinstance(parsed, bool):
        parsed = {} if parsed else {"not": {}}
    if not isinstance(parsed, dict):
        return None, (("output_schema", f"must be a JSON object or boolean, not {_json_type_name(parsed)}"),)
    if "\\u" in text:  # only an escape can write a lone surrogate, which no validator can read
        surrogate = _lone_surrogate(parsed)
        if surrogate:
            problem = f"is not valid JSON: {surrogate} is a lone surrogate, not a character"
            return None, (("output_schema", problem),)
    return parsed, ()


def _lone_surrogate(value: object) -> str:
    """The first lone UTF-16 surrogate a parsed JSON value holds, as its escape ("" when none)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"\\u{ord(exc.object[exc.start]):04x}"
    return ""


def _schema_problems(parsed: dict[str, Any], *, refers: bool) -> tuple[tuple[str, str], ...]:
    """What is wrong with a parsed schema object: the metaschema, then its references (when it may refer)."""
    try:
        _check_against_metaschema(parsed)
    except jsonschema_rs.ValidationError as exc:
        where = json_pointer(exc.instance_path) or "/"
        return (("output_schema", f"is not a valid draft 2020-12 JSON Schema at {where}: {exc.message}"),)
    if not refers:
        return ()
    base_uri = parsed["$id"] if isinstance(parsed.get("$id"), str) else ""
    registry: Registry[Any] = Registry().with_resource(base_uri, DRAFT202012.create_resource(parsed))
    resolver = registry.crawl().resolver(base_uri=base_uri)
    unresolved = tuple(_ref_problems(parsed, resolver, ""))
    if unresolved:
        return unresolved
    return _in_place_problems(parsed, resolver)


def _may_refer(text: str) -> bool:
    """Whether a schema's text may hold a reference or more in-place subschemas than allowed.

    Without `$ref` or `$dynamicRef` (spelt out: an escaped key holds a
    backslash) the document is a tree, so no reference can fail to resolve
    or close a cycle, and one value meets at most as many subschemas as the
    document has objects, which is at most its count of "{".
    """
    return (
        "$ref" in text
        or "$dynamicRef" in text
        or "\\u" in text
        or text.count("{") > MAX_IN_PLACE_APPLICATIONS
    )


DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


def _check_against_metaschema(schema: Mapping[str, Any]) -> None:
    """Raise jsonschema_rs.ValidationError where `schema` breaks the draft 2020-12 metaschema.

    Whatever its `$schema` says: the negotiator applies draft 2020-12 to
    every schema. References are not resolved here (`_ref_problems` names an
    unresolvable one by where it is).
    """
    declared = schema.get("$schema", DRAFT_2020_12)
    if isinstance(declared, str):
        as_2020_12 = {**schema, "$schema": DRAFT_2020_12}
        # The yes-or-no check does less work than finding the error, which only a refusal needs.
        if not jsonschema_rs.meta.is_valid(as_2020_12):
            jsonschema_rs.meta.validate(as_2020_12)
    else:  # not a URI: the metaschema's own error says so
        schema_validator(schema)


def schema_validator(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    """A checked schema compiled for draft 2020-12 with format checks (unknown formats pass).

    Offline: a reference is resolved within the schema or not at all, so
    compiling never reaches the network. Raises jsonschema_rs.ValidationError
    for a schema `validate_request` would refuse.
    """
    plain = schema if isinstance(schema, dict) else dict(schema)
    return jsonschema_rs.Draft202012Validator(plain, validate_formats=True, offline=True)


def schema_violations(validator: jsonschema_rs.Validator, instance: object) -> list[tuple[str, str]]:
    """(RFC 6901 pointer into the instance, reason) of every violation, sorted."""
    return sorted(
        (json_pointer(error.instance_path), error.message) for error in validator.iter_errors(instance)
    )


def _json_type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "a number"


def _option_problems(options: CallOptions) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for name, value in (
        ("model", options.model),
        ("effort", options.effort),
        ("profile", options.profile),
        ("persona", options.persona),
    ):
        if value is not None and not value.strip():
            problems.append((f"options.{name}", "must not be empty when set"))
    if any(not key for key in options.settings):
        problems.append(("options.settings", "contains an empty key"))
    problems.extend(_mcp_problems(options.mcp_servers))
    if options.max_depth is not None:
        depth = options.max_depth
        if depth.provider_managed and depth.depth is not None:
            problems.append(("options.max_depth", "set either depth or provider_managed, not both"))
        elif not depth.provider_managed and depth.depth is None:
            problems.append(("options.max_depth", "set depth or provider_managed"))
        elif depth.depth is not None and depth.depth < 0:
            problems.append(("options.max_depth.depth", "must not be negative"))
    problems.extend(_conversation_problems(options))
    problems.extend(_requires_problems(options.requires))
    if options.tool_filter is not None:
        tool_filter = options.tool_filter
        if not tool_filter.allow and not tool_filter.deny:
            problems.append(("options.tool_filter", "allow and deny are both empty; omit the filter instead"))
        for list_name, names in (("allow", tool_filter.allow), ("deny", tool_filter.deny)):
            problems.extend(_name_list_problems(f"options.tool_filter.{list_name}", names, "tool name"))
    return problems


# `options.requires` names a capability by its declaration name, or a typed-set
# member as "<set>:<member>". Each entry becomes a verdict, so the list is bounded.
MAX_REQUIRED_ENTRIES = 64
CAPABILITY_NAMES: Mapping[str, Capability] = MappingProxyType({c.value: c for c in Capability})
TYPED_SET_NAMES: Mapping[str, TypedSet] = MappingProxyType({s.value: s for s in TypedSet})


def parse_required(entry: str) -> tuple[Capability, TypedSet | None, str]:
    """An `options.requires` entry as (capability, typed set or None, member).

    A set member comes with the capability its set belongs to; an MCP
    transport member is normalized ("streamable-http" is "http"). Raises
    ValueError describing what is wrong with the entry.
    """
    capability = CAPABILITY_NAMES.get(entry)
    if capability is not None:
        return capability, None, ""
    set_name, colon, member = entry.partition(":")
    typed_set = TYPED_SET_NAMES.get(set_name)
    if not colon or typed_set is None:
        raise ValueError(
            f'"{entry}" is not a capability or <typed set>:<member>; capabilities: '
            f"{', '.join(CAPABILITY_NAMES)}; typed sets: {', '.join(TYPED_SET_NAMES)}"
        )
    if not member.strip():
        raise ValueError(f'"{entry}" names no member of {set_name}')
    if typed_set is TypedSet.MCP_TRANSPORTS:
        member = normalize_transport(member)
        if member not in MCP_TRANSPORTS:
            raise ValueError(f'"{entry}": unknown transport; expected stdio, sse, http or streamable-http')
    return SET_CAPABILITY[typed_set], typed_set, member


def _requires_problems(entries: Sequence[str]) -> list[tuple[str, str]]:
    if len(entries) > MAX_REQUIRED_ENTRIES:
        return [("options.requires", f"lists {len(entries)} entries; at most {MAX_REQUIRED_ENTRIES}")]
    problems = []
    first_index: dict[tuple[Capability, TypedSet | None, str], int] = {}
    for index, entry in enumerate(entries):
        path = f"options.requires[{index}]"
        try:
            parsed = parse_required(entry)
        except ValueError as exc:
            problems.append((path, str(exc)))
            continue
        if parsed in first_index:
            problems.append((path, f'"{entry}" repeats options.requires[{first_index[parsed]}]'))
        else:
            first_index[parsed] = index
    return problems


def _conversation_problems(options: CallOptions) -> list[tuple[str, str]]:
    conversation_id = options.conversation_id
    if conversation_id is None:
        # Without a conversation these would be accepted and do nothing.
        return [
            (f"options.{name}", "needs options.conversation_id")
            for name, value in (("no_wait", options.no_wait), ("new_conversation", options.new_conversation))
            if value
        ]
    if not conversation_id.strip():
        return [("options.conversation_id", "must not be blank when set")]
    if len(conversation_id) > MAX_CONVERSATION_ID_LENGTH:
        return [("options.conversation_id", f"must be at most {MAX_CONVERSATION_ID_LENGTH} characters")]
    return []


def _name_list_problems(path: str, names: Sequence[str], what: str) -> list[tuple[str, str]]:
    problems = []
    seen: set[str] = set()
    for index, name in enumerate(names):
        if not name:
            problems.append((f"{path}[{index}]", f"empty {what}"))
        elif name in seen:
            problems.append((f"{path}[{index}]", f'duplicate {what} "{name}"'))
        seen.add(name)
    return problems


def _mcp_problems(servers: Sequence[McpServer]) -> list[tuple[str, str]]:
    problems = _name_list_problems("options.mcp_servers", [s.name for s in servers], "MCP server name")
    # _name_list_problems points at the list element; the field is its name.
    problems = [(f"{path}.name", text) for path, text in problems]
    for index, server in enumerate(servers):
        path = f"options.mcp_servers[{index}]"
        transport = normalize_transport(server.transport)
        if transport not in MCP_TRANSPORTS:
            problems.append(
                (
                    f"{path}.transport",
                    f'unknown transport "{server.transport}"; expected stdio, sse, http or streamable-http',
                )
            )
        elif transport == "stdio" and not server.command:
            problems.append((f"{path}.command", "is required for the stdio transport"))
        elif transport != "stdio" and not server.url:
            problems.append((f"{path}.url", f"is required for the {transport} transport"))
    return problems


def _profile_problems(options: CallOptions, profiles: Mapping[str, Profile] | None) -> list[tuple[str, str]]:
    if profiles is None or options.profile is None or not options.profile.strip():
        return []  # no negotiator profiles, no profile, or already reported as empty
    profile = profiles.get(options.profile)
    if profile is None:
        defined = ", ".join(f'"{name}"' for name in sorted(profiles)) or "none"
        return [("options.profile", f'unknown profile "{options.profile}"; the negotiator defines {defined}')]
    attached = {server.name for server in profile.mcp_servers}
    return [
        (
            f"options.mcp_servers[{index}].name",
            f'MCP server "{server.name}" is already attached by profile "{profile.name}"; '
            "give it another name or drop it",
        )
        for index, server in enumerate(options.mcp_servers)
        if server.name in attached
    ]


def expand_profile(
    request: CallRequest, profiles: Mapping[str, Profile] | None
) -> tuple[CallRequest, Mapping[str, str]]:
    """The call with its negotiator profile merged in, and where each merged field came from.

    The mapping takes a request field of the expanded call, as
    `derive_requirements` names it, to the field to report instead (see
    `relabel`); it is empty when nothing was expanded. Raises InvalidRequest
    for a profile this negotiator does not define.
    """
    options = request.options
    if profiles is None or options.profile is None:
        return request, MappingProxyType({})
    profile = profiles.get(options.profile)
    if profile is None:
        raise InvalidRequest(_profile_problems(options, profiles))
    origin = f"profile({profile.name})"
    fields: dict[str, str] = {}
    model, effort = options.model, options.effort
    if model is None and profile.model is not None:
        model = profile.model
        fields["options.model"] = f"{origin}.model"
    if effort is None and profile.effort is not None:
        effort = profile.effort
        fields["options.effort"] = f"{origin}.effort"
    if profile.settings and not options.settings:
        fields["options.settings"] = f"{origin}.settings"
    for key in profile.settings:
        if key not in options.settings:
            fields[f"options.settings.{key}"] = f"{origin}.settings.{key}"
    if profile.mcp_servers and not options.mcp_servers:
        fields["options.mcp_servers"] = f"{origin}.mcp_servers"
    inherited = len(profile.mcp_servers)
    for index in range(inherited):
        fields[f"options.mcp_servers[{index}].transport"] = f"{origin}.mcp_servers[{index}].transport"
    for index in range(len(options.mcp_servers)):
        own = f"options.mcp_servers[{index}].transport"
        fields[f"options.mcp_servers[{inherited + index}].transport"] = own
    if profile.adapter_profile is not None:
        fields["options.profile"] = f"{origin}.adapter_profile"
    expanded = replace(
        options,
        model=model,
        effort=effort,
        settings=MappingProxyType({**profile.settings, **options.settings}),
        mcp_servers=profile.mcp_servers + options.mcp_servers,
        profile=profile.adapter_profile,
    )
    return replace(request, options=expanded), MappingProxyType(fields)


def relabel(requirements: Sequence[Requirement], fields: Mapping[str, str]) -> tuple[Requirement, ...]:
    """Requirements pointing at the fields the caller wrote (profile fields by their profile)."""
    if not fields:
        return tuple(requirements)
    return tuple(
        replace(r, request_field=fields[r.request_field]) if r.request_field in fields else r
        for r in requirements
    )


def derive_requirements(request: CallRequest, schema: Mapping[str, Any] | None) -> tuple[Requirement, ...]:
    """Everything the call needs from the adapter, in request order."""
    return derive_checked_requirements(request, None if schema is None else _first_formats(schema))


def derive_checked_requirements(
    request: CallRequest, formats: Sequence[tuple[str, str]] | None
) -> tuple[Requirement, ...]:
    """`derive_requirements` for a call whose schema was checked: `formats` is its CheckedSchema's
    (None: the call has no schema)."""
    needs = options_requirements(request.options)
    if formats is None and not request.tools:
        return needs
    requirements: list[Requirement] = []
    if formats is not None:
        requirements.append(Requirement(Capability.STRUCTURED_OUTPUT, "output_schema"))
        for pointer, string_format in formats:
            requirements.append(
                Requirement(Capability.STRUCTURED_OUTPUT, pointer, TypedSet.STRING_FORMATS, string_format)
            )
    requirements.extend(needs)
    if request.tools:
        # Caller tools of a ToolSession (ToolSessionStart.tools, after the call itself).
        requirements.append(Requirement(Capability.TOOL_REGISTRATION, "tools"))
    return tuple(requirements)


def options_requirements(options: CallOptions) -> tuple[Requirement, ...]:
    """What a call's options need from the adapter, in field order.

    Derived once per options object and kept on it (`derived_requirements`):
    options never change, and like calls share one options object
    (call_caches.py), so each judge of such a call reads the same tuple.
    """
    known = options.derived_requirements
    if known is None:
        known = _options_requirements(options)
        object.__setattr__(options, "derived_requirements", known)  # frozen: set once, then only read
    return known


def _options_requirements(options: CallOptions) -> tuple[Requirement, ...]:
    requirements: list[Requirement] = []
    if options.model is not None:
        requirements.append(Requirement(Capability.MODEL_OVERRIDE, "options.model"))
    if options.effort is not None:
        requirements.append(Requirement(Capability.EFFORT, "options.effort"))
        requirements.append(
            Requirement(Capability.EFFORT, "options.effort", TypedSet.EFFORT_LEVELS, options.effort)
        )
    if options.settings:
        requirements.append(Requirement(Capability.SETTINGS, "options.settings"))
        # Sorted: settings arrive as a protobuf Struct, whose key order is not kept.
        for key in sorted(options.settings):
            requirements.append(
                Requirement(Capability.SETTINGS, f"options.settings.{key}", TypedSet.ACCEPTED_SETTINGS, key)
            )
    if options.profile is not None:
        requirements.append(Requirement(Capability.PROFILE_OVERRIDE, "options.profile"))
    if options.mcp_servers:
        requirements.append(Requirement(Capability.MCP, "options.mcp_servers"))
        seen_transports: set[str] = set()
        for index, server in enumerate(options.mcp_servers):
            transport = normalize_transport(server.transport)
            if transport not in seen_transports:
                seen_transports.add(transport)
                requirements.append(
                    Requirement(
                        Capability.MCP,
                        f"options.mcp_servers[{index}].transport",
                        TypedSet.MCP_TRANSPORTS,
                        transport,
                    )
                )
    if options.max_depth is not None:
        requirements.append(Requirement(Capability.DEPTH_LIMIT, "options.max_depth"))
        if options.max_depth.provider_managed:
            # The proto contract: handing the budget to the provider needs an
            # adapter that delegates at all.
            requirements.append(Requirement(Capability.SUBAGENTS, "options.max_depth.provider_managed"))
    if options.tool_filter is not None:
        requirements.append(Requirement(Capability.TOOL_FILTER, "options.tool_filter"))
    if options.persona is not None:
        requirements.append(Requirement(Capability.PERSONA, "options.persona"))
    if options.stream_events:
        requirements.append(Requirement(Capability.STREAM_EVENTS, "options.stream_events"))
    if options.conversation_id is not None:
        requirements.append(Requirement(Capability.STATEFUL_HISTORY, "options.conversation_id"))
    for index, entry in enumerate(options.requires):
        # Each entry has its own verdict, also when a field above needs the same
        # capability: the caller sees the judgement of every entry it wrote.
        capability, typed_set, member = parse_required(entry)
        request_field = f"options.requires[{index}]"
        requirements.append(Requirement(capability, request_field))
        if typed_set is not None:
            requirements.append(Requirement(capability, request_field, typed_set, member))
    return tuple(requirements)


def _first_formats(schema: Mapping[str, Any], named: int = -1) -> tuple[tuple[str, str], ...]:
    """(request field, format) of the first `format` keyword naming each format, in document order.

    `named`, when not -1, is how many formats the document can name at
    most: the walk ends once it has found that many.
    """
    first: dict[str, str] = {}
    if named != 0 and _may_hold_format(schema):  # a boolean subschema has no keywords
        _collect_first_formats(schema, ["output_schema"], first, named)
    return tuple((pointer, string_format) for string_format, pointer in first.items())


def _text_formats(schema: Mapping[str, Any], text: str) -> tuple[tuple[str, str], ...]:
    """`_first_formats` of a schema parsed from `text`.

    A `format` key is written `"format"` in the text, or with a `\\u`
    escape (no other JSON escape writes a letter): a text holding neither
    has no format to walk for. Without an escape, the strings written after
    the `"format"` keys (`_format_names`) are all the formats the document
    can name, so the walk ends once it has found each of them.
    """
    if "\\u" in text:
        return _first_formats(schema)
    if '"format"' in text:
        return _first_formats(schema, _format_names(text))
    return ()


# A `"format"` key given a string: the string up to its first quote or
# backslash, and which of the two ends it (a backslash: an escape).
_FORMAT_NAME = re.compile(r'"format"[ \t\n\r]*:[ \t\n\r]*"([^"\\]*)(["\\])')


def _format_names(text: str) -> int:
    """How many different strings `text` gives a `"format"` key, or -1 when one holds an escape.

    Every `format` keyword naming a format is such a key with such a string
    (in a text without `\\u`, no other spelling writes the key), and a
    string without a backslash is the value it parses to; other
    `"format"` keys (data, a property named so) can only add to the count.
    """
    names: set[str] = set()
    for name, end in _FORMAT_NAME.findall(text):
        if end != '"':
            return -1
        names.add(name)
    return len(names)


# Each subschema keyword by how its value holds subschemas (see _SUBSCHEMA_KEYWORDS).
_ONE, _MAP, _LIST = 1, 2, 3
_SUBSCHEMA_SHAPES: Mapping[str, int] = MappingProxyType(
    {keyword: _ONE for keyword in _SUBSCHEMA_KEYWORDS}
    | {keyword: _MAP for keyword in _SUBSCHEMA_MAP_KEYWORDS}
    | {keyword: _LIST for keyword in _SUBSCHEMA_LIST_KEYWORDS}
)


def _collect_first_formats(
    schema: Mapping[str, Any], path: list[str], first: dict[str, str], named: int
) -> bool:
    """Record in `first` each format's first `format` keyword under `schema`, in document order.

    `path` holds the pointer's tokens as written; they are escaped and
    joined only for a format not met before, so a walk builds no pointer it
    does not report. The same subschemas as `_children` yields, in the same
    order, entering only those that hold a keyword the walk reads
    (`_may_hold_format`, written out in the loops). True once `first`
    holds `named` formats: every format there is, so the walk ends.
    """
    shapes = _SUBSCHEMA_SHAPES
    walked = _WALKED
    for keyword, value in schema.items():
        shape = shapes.get(keyword)
        if shape is None:
            if keyword == "format" and isinstance(value, str) and value not in first:
                first[value] = _pointer(path) + "/format"
                if len(first) == named:
                    return True
            continue
        if shape == _MAP:
            if type(value) is dict or isinstance(value, Mapping):
                path.append(keyword)
                for name, sub in value.items():
                    if (type(sub) is dict or isinstance(sub, Mapping)) and not walked.isdisjoint(sub):
                        path.append(name)
                        if _collect_first_formats(sub, path, first, named):
                            return True
                        path.pop()
                path.pop()
        elif shape == _ONE and not isinstance(value, list | tuple):
            if (type(value) is dict or isinstance(value, Mapping)) and not walked.isdisjoint(value):
                path.append(keyword)
                if _collect_first_formats(value, path, first, named):
                    return True
                path.pop()
        elif isinstance(value, list | tuple):  # a list keyword, or the pre-2020 tuple `items`
            path.append(keyword)
            for index, sub in enumerate(value):
                if (type(sub) is dict or isinstance(sub, Mapping)) and not walked.isdisjoint(sub):
                    path.append(str(index))
                    if _collect_first_formats(sub, path, first, named):
                        return True
                    path.pop()
            path.pop()
    return False


# The keys a schema object needs for a walk to find anything in it.
_WALKED = frozenset(_SUBSCHEMA_SHAPES) | {"format"}


def _may_hold_format(value: object) -> bool:
    """Whether `value` is a schema object holding `format` or a subschema keyword (else nothing to walk)."""
    return (type(value) is dict or isinstance(value, Mapping)) and not _WALKED.isdisjoint(value)


def _pointer(path: list[str]) -> str:
    """The request field of a walk's path: its first token as it is, the rest escaped (RFC 6901)."""
    return "/".join([path[0], *map(_escape, path[1:])])


def _children(keyword: str, value: object, pointer: str) -> Iterator[tuple[str, object]]:
    """The subschemas under one keyword of a schema object, with their pointers."""
    here = f"{pointer}/{_escape(keyword)}"
    if keyword in _SUBSCHEMA_KEYWORDS:
        if isinstance(value, list):  # pre-2020 tuple `items`
            yield from ((f"{here}/{index}", item) for index, item in enumerate(value))
        else:
            yield here, value
    elif keyword in _SUBSCHEMA_MAP_KEYWORDS and isinstance(value, Mapping):
        yield from ((f"{here}/{_escape(name)}", sub) for name, sub in value.items())
    elif keyword in _SUBSCHEMA_LIST_KEYWORDS and isinstance(value, list):
        yield from ((f"{here}/{index}", sub) for index, sub in enumerate(value))


def _ref_problems(schema: object, resolver: Resolver[Any], pointer: str) -> Iterator[tuple[str, str]]:
    """Every `$ref` that does not resolve inside the schema: nothing is fetched, so it never will."""
    if not isinstance(schema, Mapping):
        return
    if isinstance(schema.get("$id"), str):
        resolver = resolver.in_subresource(DRAFT202012.create_resource(schema))
    ref = schema.get("$ref")
    if isinstance(ref, str):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            yield ("output_schema", f'$ref "{ref}" at {pointer or "/"} does not resolve within the schema')
    for keyword, value in schema.items():
        for child_pointer, child in _children(keyword, value, pointer):
            yield from _ref_problems(child, resolver, child_pointer)


# Keywords whose subschemas apply to the same instance as the schema holding
# them (no step into a property or an item): a cycle through these and
# $ref/$dynamicRef never reaches a smaller instance, so validation never ends.
_IN_PLACE_SINGLE = frozenset({"not", "if", "then", "else"})
_IN_PLACE_LIST = frozenset({"allOf", "anyOf", "oneOf"})
_IN_PLACE_MAP = frozenset({"dependentSchemas"})
_REF_KEYWORDS = ("$ref", "$dynamicRef")
# Subschemas one instance location may be checked against, counting every
# path through in-place keywords and references: past it, validating a
# single value could take exponential time.
MAX_IN_PLACE_APPLICATIONS = 10_000


def _in_place_problems(schema: Mapping[str, Any], resolver: Resolver[Any]) -> tuple[tuple[str, str], ...]:
    """A reference cycle validation cannot leave, or too many in-place applications: both refused.

    Builds the graph "subschema A is applied to the same instance as
    subschema B" over every subschema of the document (references resolved
    within it, as `_ref_problems` checked), then looks for a cycle and counts
    the paths from each subschema. Iterative, so no schema can exhaust the
    recursion here.
    """
    pointers: dict[int, str] = {}
    edges: dict[int, list[int]] = {}
    nodes: dict[int, Any] = {}
    pending: list[tuple[Any, str, Resolver[Any]]] = [(schema, "", resolver)]
    while pending:
        node, pointer, scope = pending.pop()
        if not isinstance(node, Mapping) or id(node) in pointers:
            continue
        if isinstance(node.get("$id"), str):
            scope = scope.in_subresource(DRAFT202012.create_resource(node))
        pointers[id(node)] = pointer or "/"
        nodes[id(node)] = node
        successors = edges.setdefault(id(node), [])
        for keyword, value in node.items():
            if keyword in _IN_PLACE_SINGLE and isinstance(value, Mapping):
                successors.append(id(value))
            elif keyword in _IN_PLACE_LIST and isinstance(value, list):
                successors.extend(id(sub) for sub in value if isinstance(sub, Mapping))
            elif keyword in _IN_PLACE_MAP and isinstance(value, Mapping):
                successors.extend(id(sub) for sub in value.values() if isinstance(sub, Mapping))
            elif keyword in _REF_KEYWORDS and isinstance(value, str):
                try:
                    resolved = scope.lookup(value)
                except Unresolvable:
                    continue  # `_ref_problems` has refused the schema already
                if isinstance(resolved.contents, Mapping):
                    successors.append(id(resolved.contents))
                    # Walked last, so a target inside the document is named by its own place.
                    pending.insert(0, (resolved.contents, value, resolved.resolver))
            for child_pointer, child in _children(keyword, value, pointer):
                pending.append((child, child_pointer, scope))
    # Depth-first, iteratively: a node met again while still open closes a cycle;
    # on leaving a node, its count of in-place applications is known.
    applications: dict[int, int] = {}
    for start in nodes:
        if start in applications:
            continue
        stack: list[tuple[int, int]] = [(start, 0)]
        open_nodes = {start}
        while stack:
            current, index = stack.pop()
            successors = edges.get(current, [])
            if index < len(successors):
                stack.append((current, index + 1))
                following = successors[index]
                if following in open_nodes:
                    return (
                        (
                            "output_schema",
                            f"refers back to itself at {pointers.get(following, '/')} without descending "
                            "into a property or item, so validation would never end",
                        ),
                    )
                if following not in applications and following in edges:
                    open_nodes.add(following)
                    stack.append((following, 0))
                continue
            open_nodes.discard(current)
            total = 1 + sum(applications.get(following, 1) for following in successors)
            if total > MAX_IN_PLACE_APPLICATIONS:
                return (
                    (
                        "output_schema",
                        f"applies more than {MAX_IN_PLACE_APPLICATIONS} subschemas to one value "
                        f"(through allOf/anyOf/oneOf/not/if/$ref at {pointers[current]}); simplify it",
                    ),
                )
            applications[current] = total
    return ()


def _escape(token: object) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def json_pointer(path: Iterable[object]) -> str:
    """RFC 6901 pointer of a path such as a validation error's `instance_path`."""
    return "".join(f"/{_escape(part)}" for part in path)


def judge(
    declaration: Declaration,
    requirements: Sequence[Requirement],
    allow_unknown: frozenset[Capability],
    model: str | None = None,
) -> Decision:
    """The verdict on each requirement. UNKNOWN passes only where the caller allows it.

    `model` is the call's `options.model`: it, or else the declaration's
    default model, selects the per-model entry that judges (`Declaration.for_model`);
    the decision names that entry's model, and carries the version of the
    whole declaration.
    """
    return _judge(declaration, declaration.version, tuple(requirements), frozenset(allow_unknown), model)


def _judge(
    declaration: Declaration,
    version: str,
    requirements: tuple[Requirement, ...],
    allow_unknown: frozenset[Capability],
    model: str | None,
) -> Decision:
    judged_model, judging = declaration.for_model(model)
    capabilities = judging.capabilities
    verdicts = []
    for requirement in requirements:
        if requirement.typed_set is None:  # `_state`'s first case, without its call
            state = capabilities.get(requirement.capability, _UNKNOWN)
        else:
            state = _state(judging, requirement)
        allowed = state is _UNKNOWN and requirement.capability in allow_unknown
        verdicts.append(Verdict(requirement, state, allowed))
    return Decision(declaration.shortname, version, tuple(verdicts), judged_model)


_UNKNOWN = CapabilityState.UNKNOWN


def _state(declaration: Declaration, requirement: Requirement) -> CapabilityState:
    """A requirement's state; a set member's says whether the set holds it.

    A member the set lists is SUPPORTED (its capability's own requirement
    carries the capability's state). A member the set does not list is
    UNSUPPORTED once the capability is declared, in any state: the set then
    names everything the code carries. Beside an undeclared capability an
    unlisted member is UNKNOWN: the set says nothing there. Effort levels
    differ in one way: a declaration that lists none takes any level.
    """
    if requirement.typed_set is None:
        return declaration.state(requirement.capability)
    members = declaration.members(requirement.typed_set)
    if requirement.member in members:
        return CapabilityState.SUPPORTED
    if requirement.typed_set is TypedSet.EFFORT_LEVELS and not members:
        return CapabilityState.SUPPORTED
    if SET_CAPABILITY[requirement.typed_set] in declaration.capabilities:
        return CapabilityState.UNSUPPORTED
    return CapabilityState.UNKNOWN


def select(request: CallRequest, lookup: Callable[[str], Declaration]) -> Declaration:
    """The declaration of the adapter the call names, checked for kind.

    `lookup` raises AdapterNotFound for an unknown shortname.
    """
    if request.adapter is not None:
        shortname, selected_by, expected = request.adapter, "adapter", AdapterKind.FRAMEWORK
    elif request.agent is not None:
        shortname, selected_by, expected = request.agent, "agent", AdapterKind.HARNESS
    else:
        raise InvalidRequest([("target", "exactly one of adapter or agent is required")])
    declaration = lookup(shortname)
    if declaration.kind is not expected:
        raise AdapterKindMismatch(shortname, declaration.kind.value, selected_by)
    return declaration
