"""The subset of JSON Schema that OpenAI's strict structured outputs accept, and the way into it.

With `strict: true` a provider compiles the schema into a decoding grammar
and refuses (HTTP 400) any schema outside its subset: every object lists
all of its properties in `required` and sets `additionalProperties: false`;
the root is an object; only these keywords appear: `type` (string, number,
integer, boolean, object, array, null, or a list of them), `properties`,
`required`, `additionalProperties`, `items`, `enum`, `anyOf` (not at the
root), `$ref` to a local `$defs` entry, `description`, string `pattern` and
`format` (the formats in STRICT_FORMATS), number `minimum`, `maximum`,
`exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`, array `minItems` and
`maxItems`; at most MAX_STRICT_NESTING levels, MAX_STRICT_PROPERTIES
properties in all, MAX_STRICT_ENUM_VALUES values per enum.

`strict_form` rewrites a caller's schema into that subset only where the
rewrite is sound: every document the strict schema admits is one the
caller's schema admits too, so the provider never constrains the model to
output the negotiator would then refuse, and the caller's schema keeps
judging the output. The sound rewrites:
- `additionalProperties` absent, true or a schema becomes false (fewer
  documents, never more);
- an optional property whose schema admits null becomes required (null is
  already how the caller lets it be absent-like, and stays valid);
- `const: v` becomes `enum: [v]`; annotations (`title`, `$comment`,
  `examples`, `default`, `deprecated`, `readOnly`, `writeOnly`, `$schema`)
  are dropped: they validate nothing.
Anything else, an optional property that does not admit null above all
(requiring it would force the model to invent a value the caller let it
omit), a free-form object, an unsupported keyword or format, a limit
exceeded, leaves no strict form: `strict_form` returns None and the
adapter sends the caller's schema with `strict: false`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STRICT_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
MAX_STRICT_NESTING = 10
MAX_STRICT_PROPERTIES = 5000
MAX_STRICT_ENUM_VALUES = 1000

_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_ANNOTATIONS = frozenset({"title", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly"})
_KEYWORDS_BY_TYPE: Mapping[str, frozenset[str]] = {
    "string": frozenset({"pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "boolean": frozenset(),
    "null": frozenset(),
}
_ANY_TYPE_KEYWORDS = frozenset({"type", "enum", "description", "anyOf", "$ref"})


class _NotStrict(Exception):
    """The schema has no sound strict form."""


class _Walk:
    def __init__(self) -> None:
        self.properties = 0

    def node(self, schema: object, depth: int) -> dict[str, Any]:
        if depth > MAX_STRICT_NESTING:
            raise _NotStrict
        if not isinstance(schema, Mapping):
            raise _NotStrict  # a boolean subschema has no strict form
        node = {key: value for key, value in schema.items() if key not in _ANNOTATIONS}
        if "const" in node:
            if "enum" in node:
                raise _NotStrict
            node["enum"] = [node.pop("const")]
        types = _types(node)
        allowed = set(_ANY_TYPE_KEYWORDS)
        for name in types:
            allowed |= _KEYWORDS_BY_TYPE[name]
        if set(node) - allowed:
            raise _NotStrict
        if not types and not any(key in node for key in ("enum", "anyOf", "$ref")):
            raise _NotStrict  # no type at all: any value, which the strict grammar cannot express
        if "$ref" in node and (len(node) > 1 + ("description" in node) or not _local_ref(node["$ref"])):
            raise _NotStrict
        if "enum" in node and (
            not isinstance(node["enum"], list) or len(node["enum"]) > MAX_STRICT_ENUM_VALUES
        ):
            raise _NotStrict
        if "format" in node and node["format"] not in STRICT_FORMATS:
            raise _NotStrict
        if "anyOf" in node:
            branches = node["anyOf"]
            if not isinstance(branches, list) or not branches:
                raise _NotStrict
            node["anyOf"] = [self.node(branch, depth) for branch in branches]
        if "items" in node:
            node["items"] = self.node(node["items"], depth + 1)
        elif "array" in types:
            raise _NotStrict  # an array of anything
        if "object" in types:
            self.object(node, depth)
        return node

    def object(self, node: dict[str, Any], depth: int) -> None:
        properties = node.get("properties")
        if not isinstance(properties, Mapping) or not properties:
            raise _NotStrict  # a free-form object: strict mode would allow only {}
        self.properties += len(properties)
        if self.properties > MAX_STRICT_PROPERTIES:
            raise _NotStrict
        required = node.get("required", [])
        if not isinstance(required, list) or set(required) - set(properties):
            raise _NotStrict  # a required name without a property schema: strict output would lack it
        converted = {}
        for name, subschema in properties.items():
            converted[name] = self.node(subschema, depth + 1)
            if name not in required and not _admits_null(subschema):
                raise _NotStrict
        node["properties"] = converted
        node["required"] = list(properties)
        node["additionalProperties"] = False


def _types(node: Mapping[str, Any]) -> tuple[str, ...]:
    declared = node.get("type")
    if declared is None:
        return ()
    names = declared if isinstance(declared, list) else [declared]
    if not names or not all(isinstance(name, str) and name in _TYPES for name in names):
        raise _NotStrict
    return tuple(names)


def _local_ref(ref: object) -> bool:
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/$defs/"))


def _admits_null(schema: object) -> bool:
    """Whether null is visibly valid under `schema` (conservative: references are not followed)."""
    if not isinstance(schema, Mapping) or "$ref" in schema:
        return False
    declared = schema.get("type")
    if declared is not None and "null" not in (declared if isinstance(declared, list) else [declared]):
        return False
    if "enum" in schema and None not in schema["enum"]:
        return False
    if "const" in schema and schema["const"] is not None:
        return False
    if "anyOf" in schema:
        return any(_admits_null(branch) for branch in schema["anyOf"])
    return declared is not None or "enum" in schema or "const" in schema


def strict_form(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The schema rewritten into the strict subset, or None when no sound rewrite exists. Pure."""
    root = {key: value for key, value in schema.items() if key != "$schema"}
    if root.get("type") != "object" or "anyOf" in root:
        return None
    walk = _Walk()
    definitions = root.pop("$defs", None)
    try:
        converted = walk.node(root, 1)
        if definitions is not None:
            if not isinstance(definitions, Mapping):
                return None
            converted["$defs"] = {name: walk.node(sub, 2) for name, sub in definitions.items()}
    except _NotStrict:
        return None
    return converted
