"""Seed files: strict YAML in, serde_yaml-identical YAML out, JSON objects, identifiers.

Pure: text in, values out. Reading follows serde_yaml 0.9.34 as SkillSpec uses it
(`#[serde(deny_unknown_fields)]` at every level), so a file either tool writes is
read by the other; every refusal names the field path and the line.

Scalar rules copied from serde_yaml 0.9.34 (`de.rs`):
* a string field takes any scalar's text: `id: 123` is the string "123";
* an optional field is None for a plain empty scalar, `~`, `null`, `Null`, `NULL`;
* a bool is a plain `true`/`True`/`TRUE`/`false`/`False`/`FALSE`, nothing else;
* an integer is a plain decimal, `0x`/`0o`/`0b` with an optional `+`; quoted digits are refused;
* a list, map or struct may be written as a plain empty scalar (`provides:`), meaning empty.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

import yaml

from agentsidecar.seedstore_service.errors import InvalidIdentifier, SeedMalformed, excerpt
from agentsidecar.seedstore_service.model import (
    Evidence,
    Outcome,
    Promotion,
    Rank,
    Risk,
    Seed,
    Verification,
    VerificationStatus,
)

# Re-exported: the pure text rules live in seedtext, which imports no YAML.
from agentsidecar.seedstore_service.names import MAX_IDENTIFIER_LENGTH as MAX_IDENTIFIER_LENGTH
from agentsidecar.seedstore_service.names import canonical as canonical
from agentsidecar.seedstore_service.seedtext import MAX_PRIORITY as MAX_PRIORITY
from agentsidecar.seedstore_service.seedtext import MAX_SEED_FILE_BYTES as MAX_SEED_FILE_BYTES
from agentsidecar.seedstore_service.seedtext import empty_alias_message as empty_alias_message
from agentsidecar.seedstore_service.seedtext import inert_alias_message as inert_alias_message
from agentsidecar.seedstore_service.seedtext import revision_of as revision_of
from agentsidecar.seedstore_service.seedtext import seed_from_json as seed_from_json
from agentsidecar.seedstore_service.seedtext import seed_to_json as seed_to_json
from agentsidecar.seedstore_service.seedtext import text_matches as text_matches
from agentsidecar.seedstore_service.seedtext import validate_identifier as validate_identifier

_U8_MAX = 255
_U64_MAX = 2**64 - 1

__all__ = [
    "canonical",
    "dump_seed",
    "dump_seed_via_emitter",
    "inert_alias_message",
    "parse_seed",
    "parse_seed_with_notes",
    "revision_of",
    "seed_to_json",
    "text_matches",
    "validate_identifier",
]

# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

_NULL_WORDS = frozenset({"~", "null", "Null", "NULL"})
_BOOL_WORDS = MappingProxyType(
    {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
)
_RADIX_DIGITS = MappingProxyType(
    {16: re.compile(r"[0-9a-fA-F]+"), 8: re.compile(r"[0-7]+"), 2: re.compile(r"[01]+")}
)
_DECIMAL_DIGITS = re.compile(r"[0-9]+")
_RUST_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class _Fields:
    """One serde struct: which keys it accepts and which of them must be present."""

    required: tuple[str, ...]
    optional: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return self.required + self.optional


_SEED_FIELDS = _Fields(
    required=("id", "domain", "kind"),
    optional=(
        "command",
        "adapter",
        "script",
        "provides",
        "aliases",
        "rank",
        "evidence",
        "auth",
        "risk",
        "promotion",
        "verification",
    ),
)
_RANK_FIELDS = _Fields((), ("default_priority", "preferred_for", "avoid_for", "tie_breakers"))
_EVIDENCE_FIELDS = _Fields(("source",), ("command", "detail"))
_AUTH_FIELDS = _Fields((), ("env",))
_RISK_FIELDS = _Fields((), ("external_service", "may_cost_money"))
_PROMOTION_FIELDS = _Fields(("suggested_skill_id",), ())
_VERIFICATION_FIELDS = _Fields(("status", "verified_at_unix"), ("outcomes",))
_OUTCOME_FIELDS = _Fields(("check", "ok", "message"), ())


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# (1-based line, 1-based column) where a node starts.
_Position = tuple[int, int]


def _at(node: yaml.Node) -> _Position:
    return int(node.start_mark.line) + 1, int(node.start_mark.column) + 1


def _name(text: str) -> str:
    """A key or value from the file, as a message quotes it: a short escaped excerpt."""
    return excerpt(text)


def _is_plain(node: yaml.Node) -> bool:
    # PyYAML gives plain scalars no style; quoted and block scalars carry their indicator.
    return isinstance(node, yaml.ScalarNode) and not node.style


def _is_plain_empty(node: yaml.Node) -> bool:
    return _is_plain(node) and node.value == ""


def _is_plain_null(node: yaml.Node) -> bool:
    return _is_plain(node) and (node.value == "" or node.value in _NULL_WORDS)


def _describe(node: yaml.Node, *, quote: bool = True) -> str:
    """What was found instead, for "expected X, found Y"; scalars quoted as excerpts unless `quote` is off."""
    if isinstance(node, yaml.SequenceNode):
        return "a sequence"
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if _is_plain_null(node):
        return "null"
    quoted = isinstance(node, yaml.ScalarNode) and node.style in ("'", '"')
    if not quote:
        return "a quoted string" if quoted else "a scalar"
    if quoted:
        return f'the quoted string "{_name(node.value)}"'
    return f'the scalar "{_name(node.value)}"'


class _SeedReader:
    """Walks composed YAML nodes against the seed schema; every failure is a SeedMalformed."""

    def __init__(self, file_path: str) -> None:
        self.file_path = file_path
        # (1-based line, reason) for what was read but cannot take part in matching.
        self.notes: list[tuple[int, str]] = []

    def fail(self, detail: str, at: _Position) -> NoReturn:
        line, column = at
        raise SeedMalformed(self.file_path, line, f"{detail} (line {line}, column {column})")

    def expected(self, what: str, node: yaml.Node, path: str) -> NoReturn:
        # At the top level the file is not a seed mapping at all (a link to some other
        # file, say): nothing of it is quoted.
        found = _describe(node, quote=bool(path))
        self.fail(f"expected {what} at {path or 'the top level'}, found {found}", _at(node))

    # -- structure ---------------------------------------------------------

    def fields(self, node: yaml.Node, path: str, table: _Fields) -> dict[str, yaml.Node]:
        """The struct's entries by name, after refusing unknown, duplicate and missing keys."""
        if _is_plain_empty(node):
            entries: dict[str, yaml.Node] = {}
        elif isinstance(node, yaml.MappingNode):
            entries = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    self.fail(f"expected a field name at {path or 'the top level'}", _at(key_node))
                name = str(key_node.value)
                if name not in table.names:
                    shown = _name(name)
                    self.fail(f'unknown field "{shown}" at {_join(path, shown)}', _at(key_node))
                if name in entries:
                    self.fail(f'duplicate field "{name}" at {_join(path, name)}', _at(key_node))
                entries[name] = value_node
        else:
            self.expected("a mapping", node, path)
        for name in table.required:
            if name not in entries:
                self.fail(f'missing field "{name}" at {_join(path, name)}', _at(node))
        return entries

    def items(self, node: yaml.Node, path: str) -> list[tuple[str, yaml.Node]]:
        if _is_plain_empty(node):
            return []
        if not isinstance(node, yaml.SequenceNode):
            self.expected("a sequence", node, path)
        return [(f"{path}[{index}]", item) for index, item in enumerate(node.value)]

    # -- scalars -----------------------------------------------------------

    def string(self, node: yaml.Node, path: str) -> str:
        if not isinstance(node, yaml.ScalarNode):
            self.expected("a string", node, path)
        return str(node.value)

    def optional_string(self, node: yaml.Node | None, path: str) -> str | None:
        if node is None or _is_plain_null(node):
            return None
        return self.string(node, path)

    def string_items(self, node: yaml.Node | None, path: str) -> list[tuple[str, yaml.Node, str]]:
        """(path, node, text) for each item of a list of strings, for checks that name the item."""
        if node is None:
            return []
        return [(item_path, item, self.string(item, item_path)) for item_path, item in self.items(node, path)]

    def strings(self, node: yaml.Node | None, path: str) -> tuple[str, ...]:
        return tuple(value for _, _, value in self.string_items(node, path))

    def boolean(self, node: yaml.Node | None, path: str) -> bool:
        if node is None:
            return False
        if not _is_plain(node) or node.value not in _BOOL_WORDS:
            self.expected("a boolean (true or false)", node, path)
        return _BOOL_WORDS[node.value]

    def unsigned(self, node: yaml.Node, path: str, maximum: int, what: str) -> int:
        number = _parse_unsigned(node.value, maximum) if _is_plain(node) else None
        if number is None:
            self.expected(what, node, path)
        return number

    def string_map(self, node: yaml.Node | None, path: str) -> dict[str, str]:
        if node is None or _is_plain_empty(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            self.expected("a mapping of strings", node, path)
        result: dict[str, str] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(f"expected a string key at {path}", _at(key_node))
            key = str(key_node.value)
            key_path = _join(path, _name(key))
            if key in result:
                self.fail(f'duplicate key "{_name(key)}" at {key_path}', _at(key_node))
            self.identifier(key, "tie key", key_path, _at(key_node))
            result[key] = self.string(value_node, key_path)
        return result

    def identifier(self, value: str, label: str, path: str, at: _Position) -> str:
        try:
            return validate_identifier(value, label)
        except InvalidIdentifier as error:
            self.fail(f"{error.message} at {path}", at)

    # -- the seed ----------------------------------------------------------

    def seed(self, node: yaml.Node) -> Seed:
        entries = self.fields(node, "", _SEED_FIELDS)
        seed_id = self.string(entries["id"], "id")
        self.identifier(seed_id, "capability id", "id", _at(entries["id"]))
        domain = self.string(entries["domain"], "domain")
        self.identifier(domain, "domain", "domain", _at(entries["domain"]))
        provides = self.string_items(entries.get("provides"), "provides")
        for item_path, item, value in provides:
            self.identifier(value, "provides", item_path, _at(item))
        aliases = self.string_items(entries.get("aliases"), "aliases")
        for item_path, item, value in aliases:
            if not canonical(value):
                line, column = _at(item)
                reason = f"{inert_alias_message(value)} at {item_path} (line {line}, column {column})"
                self.notes.append((line, reason))
        return Seed(
            id=seed_id,
            domain=domain,
            kind=self.string(entries["kind"], "kind"),
            command=self.optional_string(entries.get("command"), "command"),
            adapter=self.optional_string(entries.get("adapter"), "adapter"),
            script=self.optional_string(entries.get("script"), "script"),
            provides=tuple(value for _, _, value in provides),
            aliases=tuple(value for _, _, value in aliases),
            rank=self.rank(entries.get("rank")),
            evidence=self.evidence(entries.get("evidence")),
            auth_env=self.auth(entries.get("auth")),
            risk=self.risk(entries.get("risk")),
            promotion=self.promotion(entries.get("promotion")),
            verification=self.verification(entries.get("verification")),
        )

    def rank(self, node: yaml.Node | None) -> Rank:
        if node is None:
            return Rank()
        entries = self.fields(node, "rank", _RANK_FIELDS)
        priority: int | None = None
        priority_node = entries.get("default_priority")
        if priority_node is not None and not _is_plain_null(priority_node):
            path = "rank.default_priority"
            priority = self.unsigned(priority_node, path, _U8_MAX, "an integer from 0 to 255")
            if priority > MAX_PRIORITY:
                self.fail(f"priority must be between 0 and 100 at {path}", _at(priority_node))
        ties = self.string_map(entries.get("tie_breakers"), "rank.tie_breakers")
        return Rank(
            default_priority=priority,
            preferred_for=self.strings(entries.get("preferred_for"), "rank.preferred_for"),
            avoid_for=self.strings(entries.get("avoid_for"), "rank.avoid_for"),
            tie_breakers=MappingProxyType(dict(sorted(ties.items()))),
        )

    def evidence(self, node: yaml.Node | None) -> tuple[Evidence, ...]:
        if node is None:
            return ()
        result = []
        for path, item in self.items(node, "evidence"):
            entries = self.fields(item, path, _EVIDENCE_FIELDS)
            result.append(
                Evidence(
                    source=self.string(entries["source"], _join(path, "source")),
                    command=self.optional_string(entries.get("command"), _join(path, "command")),
                    detail=self.optional_string(entries.get("detail"), _join(path, "detail")),
                )
            )
        return tuple(result)

    def auth(self, node: yaml.Node | None) -> tuple[str, ...]:
        if node is None:
            return ()
        entries = self.fields(node, "auth", _AUTH_FIELDS)
        return self.strings(entries.get("env"), "auth.env")

    def risk(self, node: yaml.Node | None) -> Risk:
        if node is None:
            return Risk()
        entries = self.fields(node, "risk", _RISK_FIELDS)
        return Risk(
            external_service=self.boolean(entries.get("external_service"), "risk.external_service"),
            may_cost_money=self.boolean(entries.get("may_cost_money"), "risk.may_cost_money"),
        )

    def promotion(self, node: yaml.Node | None) -> Promotion | None:
        if node is None or _is_plain_null(node):
            return None
        entries = self.fields(node, "promotion", _PROMOTION_FIELDS)
        path = "promotion.suggested_skill_id"
        return Promotion(suggested_skill_id=self.string(entries["suggested_skill_id"], path))

    def verification(self, node: yaml.Node | None) -> Verification | None:
        if node is None or _is_plain_null(node):
            return None
        entries = self.fields(node, "verification", _VERIFICATION_FIELDS)
        status_node = entries["status"]
        status_text = self.string(status_node, "verification.status")
        try:
            status = VerificationStatus(status_text)
        except ValueError:
            self.fail(
                f'unknown verification status "{_name(status_text)}" at verification.status, '
                "expected verified, failed or unverified",
                _at(status_node),
            )
        verified_at = self.unsigned(
            entries["verified_at_unix"], "verification.verified_at_unix", _U64_MAX, "a non-negative integer"
        )
        outcomes = []
        outcomes_node = entries.get("outcomes")
        if outcomes_node is not None:
            for path, item in self.items(outcomes_node, "verification.outcomes"):
                fields = self.fields(item, path, _OUTCOME_FIELDS)
                outcomes.append(
                    Outcome(
                        check=self.string(fields["check"], _join(path, "check")),
                        ok=self.boolean(fields["ok"], _join(path, "ok")),
                        message=self.string(fields["message"], _join(path, "message")),
                    )
                )
        return Verification(status=status, verified_at_unix=verified_at, outcomes=tuple(outcomes))


_KIND_TAGS = MappingProxyType(
    {
        yaml.ScalarNode: "tag:yaml.org,2002:str",
        yaml.SequenceNode: "tag:yaml.org,2002:seq",
        yaml.MappingNode: "tag:yaml.org,2002:map",
    }
)


def untyped_loader(base: type[yaml.SafeLoader] | type[yaml.CSafeLoader]) -> type[yaml.SafeLoader]:
    """`base`, composing nodes without guessing scalar types.

    The seed parser reads each scalar's text and style, never the tag that
    PyYAML's implicit resolvers guess (`5` an int, `yes` a bool: YAML 1.1
    rules, which SkillSpec's YAML 1.2 reader does not share anyway), so
    running them would be work whose result is thrown away: here every node
    gets the plain tag of its kind.
    """

    class UntypedLoader(base):  # type: ignore[valid-type,misc]
        def resolve(self, kind: type[yaml.Node], value: object, implicit: object) -> str:
            return _KIND_TAGS[kind]

        def descend_resolver(self, current_node: object, current_index: object) -> None:
            return None

        def ascend_resolver(self) -> None:
            return None

    return UntypedLoader


# libyaml is the parser serde_yaml itself wraps, and it is several times faster; the
# pure-Python port composes the same nodes when the extension is missing.
_LOADER = untyped_loader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


def compose_single_document(text: str) -> yaml.Node | None:
    """Compose one YAML document into nodes (with lines). Raises `yaml.YAMLError` as PyYAML does."""
    return yaml.compose(text, Loader=_LOADER)


# PyYAML's problem texts are its own, but may quote a token of the file (a tag, an alias name).
_YAML_DETAIL_CHARS = 200


def yaml_error_position(error: yaml.YAMLError) -> _Position:
    """A PyYAML error's (1-based line, 1-based column); (0, 0) when it has no mark."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if mark is None:
        return 0, 0
    return int(mark.line) + 1, int(mark.column) + 1


def yaml_error_line_and_detail(error: yaml.YAMLError) -> tuple[int, str]:
    """A PyYAML error as (1-based line, short text), for messages that name the line themselves."""
    line = yaml_error_position(error)[0]
    if isinstance(error, yaml.MarkedYAMLError):
        parts = [part for part in (error.context, error.problem) if part]
        detail = ", ".join(str(part) for part in parts) or "invalid YAML"
    else:
        detail = str(error).splitlines()[0] if str(error) else "invalid YAML"
    return line, excerpt(detail, _YAML_DETAIL_CHARS)


def parse_seed(text: str, path: str) -> Seed:
    """`parse_seed_with_notes` without the notes."""
    return parse_seed_with_notes(text, path)[0]


def parse_seed_with_notes(text: str, path: str) -> tuple[Seed, tuple[tuple[int, str], ...]]:
    """Parse one seed file strictly, as SkillSpec's serde_yaml would, plus load validation.

    Load validation (SkillSpec `validate_seed`): id, domain and each provides follow the
    identifier rule; default_priority is at most 100. The notes, (1-based line, reason),
    name each alias whose canonical form is empty: the seed is read with it (SkillSpec
    writes such aliases), and ranking never matches it (SkillSpec would match every search).

    Raises:
        SeedMalformed: with the file path, the 1-based line, and a detail naming field and line.
    """
    reader = _SeedReader(path)
    try:
        root = compose_single_document(text)
    except yaml.YAMLError as error:
        _, detail = yaml_error_line_and_detail(error)
        if isinstance(error, yaml.composer.ComposerError) and "single document" in detail:
            detail = "expected a single YAML document, found more than one"
        reader.fail(detail, yaml_error_position(error))
    if root is None:
        # An empty file is an empty mapping to serde, so the first complaint is the missing id.
        reader.fail('missing field "id" at id', (1, 1))
    if "*" in text:
        _refuse_alias_expansion(root, reader)
    else:
        _refuse_tree_expansion(root, reader)
    seed = reader.seed(root)
    return seed, tuple(reader.notes)


def _refuse_tree_expansion(root: yaml.Node, reader: _SeedReader) -> None:
    """`_refuse_alias_expansion` for a document without an alias (its text holds no `*`).

    Every node is then composed once, so the graph is a tree that contains no node twice and
    no node within itself: its expanded size is the plain sum `_refuse_alias_expansion` arrives
    at, and it exceeds the limit exactly when that one does.
    """
    total = 0
    pending: list[yaml.Node] = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, yaml.ScalarNode):
            total += len(node.value) + 1
        else:
            total += 1
            if isinstance(node, yaml.MappingNode):
                for pair in node.value:
                    pending.extend(pair)
            else:
                pending.extend(node.value)
        if total > MAX_SEED_FILE_BYTES:
            reader.fail(
                f"the document expands to more than {MAX_SEED_FILE_BYTES} bytes once aliases are followed",
                _at(root),
            )


def _refuse_alias_expansion(root: yaml.Node, reader: _SeedReader) -> None:
    """Fail when the document, aliases followed, exceeds MAX_SEED_FILE_BYTES or refers to itself.

    PyYAML composes an alias as a second reference to the anchored node, so the
    composed graph is as small as the file; everything that walks it as a tree
    (the reader, the JSON and proto conversions) would pay for the expansion.
    Each node's expanded size is computed once, so this is linear in the file.
    """
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in in_progress:
            reader.fail("an alias refers to a node that contains it", _at(node))
        if isinstance(node, yaml.ScalarNode):
            total = len(node.value) + 1
        else:
            in_progress.add(key)
            children: list[yaml.Node] = (
                [child for pair in node.value for child in pair]
                if isinstance(node, yaml.MappingNode)
                else list(node.value)
            )
            total = 1
            for child in children:
                total += size(child)
                if total > MAX_SEED_FILE_BYTES:
                    break
            in_progress.discard(key)
        sizes[key] = total
        return total

    if size(root) > MAX_SEED_FILE_BYTES:
        reader.fail(
            f"the document expands to more than {MAX_SEED_FILE_BYTES} bytes once aliases are followed",
            _at(root),
        )


# ---------------------------------------------------------------------------
# serde_yaml's view of plain scalars, used to decide when a string needs quotes
# ---------------------------------------------------------------------------


def _digits_but_not_number(value: str) -> bool:
    digits = value[1:] if value[:1] in ("+", "-") else value
    return len(digits) > 1 and digits.startswith("0") and digits[1:].isascii() and digits[1:].isdigit()


def _radix_value(digits: str, radix: int) -> int | None:
    pattern = _DECIMAL_DIGITS if radix == 10 else _RADIX_DIGITS[radix]
    return int(digits, radix) if pattern.fullmatch(digits) else None


def _parse_unsigned(value: str, maximum: int) -> int | None:
    """serde_yaml's `parse_unsigned_int`, bounded by the target type's maximum."""
    unsigned = value[1:] if value.startswith("+") else value
    for prefix, radix in (("0x", 16), ("0o", 8), ("0b", 2)):
        if unsigned.startswith(prefix):
            number = _radix_value(unsigned[2:], radix)
            return number if number is not None and number <= maximum else None
    if _digits_but_not_number(value):
        return None
    number = _radix_value(unsigned, 10)
    return number if number is not None and number <= maximum else None


def _parse_negative(value: str, minimum: int) -> int | None:
    if not value.startswith("-"):
        return None
    for prefix, radix in (("-0x", 16), ("-0o", 8), ("-0b", 2)):
        if value.startswith(prefix):
            number = _radix_value(value[3:], radix)
            return -number if number is not None and -number >= minimum else None
    if _digits_but_not_number(value):
        return None
    number = _radix_value(value[1:], 10)
    return -number if number is not None and -number >= minimum else None


def _parse_float(value: str) -> bool:
    unsigned = value[1:] if value.startswith("+") else value
    if unsigned.startswith(("+", "-")) and value.startswith("+"):
        return False
    if unsigned in (".inf", ".Inf", ".INF") or value in ("-.inf", "-.Inf", "-.INF", ".nan", ".NaN", ".NAN"):
        return True
    return bool(_RUST_FLOAT.fullmatch(unsigned)) and math.isfinite(float(unsigned))


def _reads_as_non_string(value: str) -> bool:
    """True when serde_yaml would read this plain text as null, bool or a number."""
    if value == "" or value in _NULL_WORDS or value in _BOOL_WORDS:
        return True
    if _parse_unsigned(value, 2**128 - 1) is not None or _parse_negative(value, -(2**127)) is not None:
        return True
    # serde_yaml quotes `0123` too: a YAML 1.1 reader would take it as octal.
    return _digits_but_not_number(value) or _parse_float(value)


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

_LITERAL = "|"
_SINGLE_QUOTED = "'"
_DOUBLE_QUOTED = '"'
_NEXT_LINE = "\x85"


def _serde_style(value: str) -> str | None:
    """serde_yaml 0.9's requested style; libyaml (here PyYAML's port of it) falls back when not allowed."""
    if _NEXT_LINE in value:
        # libyaml's IS_PRINTABLE leaves out U+0085, so its analysis marks the value special and
        # writes it double-quoted; PyYAML's port counts U+0085 printable and would not.
        # (U+2028 and U+2029 are printable line breaks to both: single-quoted, as serde writes them.)
        return _DOUBLE_QUOTED
    if "\n" in value:
        return _LITERAL
    if _reads_as_non_string(value):
        return _SINGLE_QUOTED
    return None


def _string_event(value: str) -> yaml.ScalarEvent:
    # implicit=(True, True) as serde emits no tags; PyYAML's YAML 1.1 resolver must not add quotes.
    return yaml.ScalarEvent(
        anchor=None, tag=None, implicit=(True, True), value=value, style=_serde_style(value)
    )


def _plain_event(value: str) -> yaml.ScalarEvent:
    return yaml.ScalarEvent(anchor=None, tag=None, implicit=(True, True), value=value, style=None)


class _EventWriter:
    def __init__(self) -> None:
        self.events: list[yaml.Event] = []

    def start_mapping(self) -> None:
        self.events.append(yaml.MappingStartEvent(anchor=None, tag=None, implicit=True, flow_style=False))

    def end_mapping(self) -> None:
        self.events.append(yaml.MappingEndEvent())

    def key(self, name: str) -> None:
        self.events.append(_string_event(name))

    def string(self, name: str, value: str) -> None:
        self.key(name)
        self.events.append(_string_event(value))

    def plain(self, name: str, value: str) -> None:
        self.key(name)
        self.events.append(_plain_event(value))

    def strings(self, name: str, values: Sequence[str]) -> None:
        self.key(name)
        self.events.append(yaml.SequenceStartEvent(anchor=None, tag=None, implicit=True, flow_style=False))
        self.events.extend(_string_event(value) for value in values)
        self.events.append(yaml.SequenceEndEvent())

    def start_sequence(self, name: str) -> None:
        self.key(name)
        self.events.append(yaml.SequenceStartEvent(anchor=None, tag=None, implicit=True, flow_style=False))

    def end_sequence(self) -> None:
        self.events.append(yaml.SequenceEndEvent())


def dump_seed_via_emitter(seed: Seed) -> str:
    """The seed as serde_yaml 0.9 writes SkillSpec's struct: same key order, omissions, quoting and indent.

    The reference writer: every seed goes through PyYAML's emitter. `dump_seed`
    gives the same text, faster, and falls back to this for the rare seed it cannot write itself.
    """
    out = _EventWriter()
    out.start_mapping()
    out.string("id", seed.id)
    out.string("domain", seed.domain)
    out.string("kind", seed.kind)
    for name, optional in (("command", seed.command), ("adapter", seed.adapter), ("script", seed.script)):
        if optional is not None:
            out.string(name, optional)
    if seed.provides:
        out.strings("provides", seed.provides)
    if seed.aliases:
        out.strings("aliases", seed.aliases)
    if not seed.rank.is_empty():
        out.key("rank")
        out.start_mapping()
        if seed.rank.default_priority is not None:
            out.plain("default_priority", str(seed.rank.default_priority))
        if seed.rank.preferred_for:
            out.strings("preferred_for", seed.rank.preferred_for)
        if seed.rank.avoid_for:
            out.strings("avoid_for", seed.rank.avoid_for)
        if seed.rank.tie_breakers:
            out.key("tie_breakers")
            out.start_mapping()
            for tie_key, tie_value in sorted(seed.rank.tie_breakers.items()):
                out.string(tie_key, tie_value)
            out.end_mapping()
        out.end_mapping()
    if seed.evidence:
        out.start_sequence("evidence")
        for entry in seed.evidence:
            out.start_mapping()
            out.string("source", entry.source)
            if entry.command is not None:
                out.string("command", entry.command)
            if entry.detail is not None:
                out.string("detail", entry.detail)
            out.end_mapping()
        out.end_sequence()
    if seed.auth_env:
        out.key("auth")
        out.start_mapping()
        out.strings("env", seed.auth_env)
        out.end_mapping()
    if seed.risk.external_service or seed.risk.may_cost_money:
        out.key("risk")
        out.start_mapping()
        if seed.risk.external_service:
            out.plain("external_service", "true")
        if seed.risk.may_cost_money:
            out.plain("may_cost_money", "true")
        out.end_mapping()
    if seed.promotion is not None:
        out.key("promotion")
        out.start_mapping()
        out.string("suggested_skill_id", seed.promotion.suggested_skill_id)
        out.end_mapping()
    if seed.verification is not None:
        out.key("verification")
        out.start_mapping()
        out.string("status", seed.verification.status.value)
        out.plain("verified_at_unix", str(seed.verification.verified_at_unix))
        if seed.verification.outcomes:
            out.start_sequence("outcomes")
            for outcome in seed.verification.outcomes:
                out.start_mapping()
                out.string("check", outcome.check)
                out.plain("ok", "true" if outcome.ok else "false")
                out.string("message", outcome.message)
                out.end_mapping()
            out.end_sequence()
        out.end_mapping()
    out.end_mapping()
    events: list[yaml.Event] = [
        yaml.StreamStartEvent(),
        yaml.DocumentStartEvent(explicit=False),
        *out.events,
        yaml.DocumentEndEvent(explicit=False),
        yaml.StreamEndEvent(),
    ]
    # serde_yaml sets libyaml's width to -1 (never fold) and unicode on.
    text = str(yaml.emit(events, Dumper=_SerdeDumper, indent=2, width=sys.maxsize, allow_unicode=True))
    # serde_yaml's to_string never emits the stream end, where libyaml would write the `...`
    # that PyYAML writes after a last value kept with `|+`. No content line is `...` at column 0:
    # every value is indented under its key, and a scalar `...` is quoted.
    return text.removesuffix("\n...\n") + "\n" if text.endswith("\n...\n") else text


_ASTRAL_ESCAPE = re.compile(r"\\U([0-9A-F]{8})")


class _RawAstralStream:
    """Passes writes on, except an escape of a character above U+FFFF, which becomes the character.

    Only used inside a double-quoted scalar, where PyYAML writes each escape as a write of its own
    and every other chunk is text free of backslashes (a backslash itself is written as an escape).
    """

    def __init__(self, emitter: _SerdeDumper, stream: Any) -> None:
        self._emitter = emitter
        self._stream = stream

    def write(self, data: str) -> None:
        if self._emitter.in_double_quoted:
            match = _ASTRAL_ESCAPE.fullmatch(data)
            if match is not None:
                data = chr(int(match.group(1), 16))
        self._stream.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _SerdeDumper(yaml.SafeDumper):
    """PyYAML's emitter, writing characters above U+FFFF raw inside double quotes as libyaml does.

    PyYAML's double-quoted writer escapes everything past U+FFFF; libyaml's IS_PRINTABLE
    counts U+10000..U+10FFFF printable, so serde_yaml writes them as they are.
    """

    in_double_quoted = False

    def __init__(self, stream: Any, **kwargs: Any) -> None:
        super().__init__(stream, **kwargs)
        self.stream = _RawAstralStream(self, self.stream)

    def write_double_quoted(self, text: str, split: bool = True) -> None:
        self.in_double_quoted = True
        try:
            super().write_double_quoted(text, split)
        finally:
            self.in_double_quoted = False


# The direct writer. Seeds have one fixed block shape, so when every string fits
# on one line the text can be written without PyYAML's emitter, whose per-scalar
# analysis dominates writing a large seed. The rules below are
# PyYAML's `analyze_scalar` / `choose_scalar_style` restricted to one-line values;
# anything else (line breaks, tabs, control characters, a key too long to be a
# simple key) goes to `dump_seed_via_emitter`. A property test holds the two
# writers byte-identical.

# Characters PyYAML writes as they are (allow_unicode on): printable ASCII and the
# printable non-ASCII ranges, minus U+2028/U+2029 (line breaks) and U+FEFF (a BOM).
_ONE_LINE_TEXT = re.compile(
    "[\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010fffe]*"
)
_LEADING_INDICATORS = frozenset("#,[]{}&*!|>'\"%@`")
# First characters of every plain text serde_yaml would read as a number, null or bool
# besides the words themselves (see `_reads_as_non_string`).
_NON_STRING_STARTS = frozenset("+-.0123456789~")
# PyYAML writes an empty or a longer mapping key as a complex `? key` entry.
_SIMPLE_KEY_LIMIT = 128


class _NeedsEmitter(Exception):
    """A value the direct writer does not handle."""


def _allows_block_plain(value: str) -> bool:
    """PyYAML's `allow_block_plain` for a non-empty one-line value whose only whitespace is spaces."""
    first = value[0]
    if first == " " or value[-1] == " " or first in _LEADING_INDICATORS or value.startswith(("---", "...")):
        return False
    if first in "?:-" and (len(value) == 1 or value[1] == " "):
        return False
    return ": " not in value and not value.endswith(":") and " #" not in value


def _one_line_scalar(value: str) -> str:
    """`value` as PyYAML's emitter writes it after `key: ` or `- ` in block context; one line."""
    if _ONE_LINE_TEXT.fullmatch(value) is None:
        raise _NeedsEmitter(value)
    if (
        not value or value[0] in _NON_STRING_STARTS or value in _BOOL_WORDS or value in _NULL_WORDS
    ) and _reads_as_non_string(value):
        return "'" + value.replace("'", "''") + "'"  # serde asks for single quotes
    if not _allows_block_plain(value):
        return "'" + value.replace("'", "''") + "'"  # PyYAML falls back from plain to single quotes
    return value


def _one_line_key(value: str) -> str:
    if not value or len(value) >= _SIMPLE_KEY_LIMIT:  # PyYAML's `check_simple_key`
        raise _NeedsEmitter(value)
    return _one_line_scalar(value)


def _write_seed_lines(seed: Seed) -> list[str]:
    scalar = _one_line_scalar
    lines = [f"id: {scalar(seed.id)}", f"domain: {scalar(seed.domain)}", f"kind: {scalar(seed.kind)}"]

    def strings(indent: str, name: str, values: Sequence[str]) -> None:
        lines.append(f"{indent}{name}:")
        lines.extend(f"{indent}- {scalar(value)}" for value in values)

    for name, optional in (("command", seed.command), ("adapter", seed.adapter), ("script", seed.script)):
        if optional is not None:
            lines.append(f"{name}: {scalar(optional)}")
    if seed.provides:
        strings("", "provides", seed.provides)
    if seed.aliases:
        strings("", "aliases", seed.aliases)
    rank = seed.rank
    if not rank.is_empty():
        lines.append("rank:")
        if rank.default_priority is not None:
            lines.append(f"  default_priority: {rank.default_priority}")
        if rank.preferred_for:
            strings("  ", "preferred_for", rank.preferred_for)
        if rank.avoid_for:
            strings("  ", "avoid_for", rank.avoid_for)
        if rank.tie_breakers:
            lines.append("  tie_breakers:")
            lines.extend(
                f"    {_one_line_key(tie_key)}: {scalar(tie_value)}"
                for tie_key, tie_value in sorted(rank.tie_breakers.items())
            )
    if seed.evidence:
        lines.append("evidence:")
        for entry in seed.evidence:
            lines.append(f"- source: {scalar(entry.source)}")
            if entry.command is not None:
                lines.append(f"  command: {scalar(entry.command)}")
            if entry.detail is not None:
                lines.append(f"  detail: {scalar(entry.detail)}")
    if seed.auth_env:
        lines.append("auth:")
        strings("  ", "env", seed.auth_env)
    if seed.risk.external_service or seed.risk.may_cost_money:
        lines.append("risk:")
        if seed.risk.external_service:
            lines.append("  external_service: true")
        if seed.risk.may_cost_money:
            lines.append("  may_cost_money: true")
    if seed.promotion is not None:
        lines.append("promotion:")
        lines.append(f"  suggested_skill_id: {scalar(seed.promotion.suggested_skill_id)}")
    verification = seed.verification
    if verification is not None:
        lines.append("verification:")
        lines.append(f"  status: {verification.status.value}")
        lines.append(f"  verified_at_unix: {verification.verified_at_unix}")
        if verification.outcomes:
            lines.append("  outcomes:")
            for outcome in verification.outcomes:
                lines.append(f"  - check: {scalar(outcome.check)}")
                lines.append(f"    ok: {'true' if outcome.ok else 'false'}")
                lines.append(f"    message: {scalar(outcome.message)}")
    return lines


def dump_seed(seed: Seed) -> str:
    """The seed as serde_yaml 0.9 writes SkillSpec's struct: same key order, omissions, quoting and indent.

    Byte-identical to `dump_seed_via_emitter`, which it falls back to for a seed
    holding a string that does not fit on one line.
    """
    try:
        lines = _write_seed_lines(seed)
    except _NeedsEmitter:
        return dump_seed_via_emitter(seed)
    lines.append("")
    return "\n".join(lines)
