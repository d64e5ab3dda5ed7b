"""Broadening an empty search through capability and domain equivalents (docs/ranking-and-gates.md).

SkillSpec has no equivalence table; its docs tell the *agent* to search related
terms such as voice, text_to_speech, voice_generation, speech_synthesis,
audio_generation and voice_message across domains such as voice and audio before
using an unseeded local fallback. This module does that loop for the caller, on
request, and reports every search it ran.

Pure: the searches themselves run through the `run_search` callable the shell passes in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

import yaml

from agentsidecar.seedstore_service.errors import InvalidArgument, InvalidIdentifier
from agentsidecar.seedstore_service.ranking import RankedCandidate, SearchQuery, SearchResult, finish_search
from agentsidecar.seedstore_service.seedfile import (
    canonical,
    compose_single_document,
    validate_identifier,
    yaml_error_line_and_detail,
)

__all__ = [
    "BUILTIN_SOURCE",
    "Broadening",
    "BroadeningAttempt",
    "EquivalenceGroup",
    "EquivalenceTable",
    "broaden",
    "builtin_table",
    "merge_tables",
    "parse_user_table",
    "plan_attempts",
]

BUILTIN_SOURCE = "builtin"

FIRST_SEARCH_FOUND_POLICY = (
    "the first search found candidates, so no related terms were searched; "
    "the ask policy and required gates apply"
)
RELATED_FOUND_POLICY = (
    "no seed matched the requested capability; these candidates came from related capability terms "
    "or domains (see matched_capability and matched_domain), and the ask policy and required gates "
    "still apply"
)
NOTHING_FOUND_POLICY = (
    "no capability seed was found, not even after searching the related terms and domains listed in "
    "attempts; an unseeded local fallback needs the caller's explicit approval, or a local seed added "
    "and verified first"
)


@dataclass(frozen=True, slots=True)
class EquivalenceGroup:
    """Capability terms that name one need, and the domains where seeds for it are usually filed."""

    name: str
    capabilities: tuple[str, ...]
    domains: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EquivalenceTable:
    groups: tuple[EquivalenceGroup, ...]
    sources: tuple[str, ...]  # "builtin", then each user file's path


@dataclass(frozen=True, slots=True)
class BroadeningAttempt:
    capability: str
    domain: str | None  # None: the whole store
    found: tuple[str, ...]  # "domain/id", in that search's rank order


@dataclass(frozen=True, slots=True)
class Broadening:
    first_search_empty: bool
    attempts: tuple[BroadeningAttempt, ...]
    fallback_policy: str
    table_sources: tuple[str, ...]


_BUILTIN_GROUPS = (
    # The voice/audio terms SkillSpec's documentation tells an agent to try after an empty search.
    EquivalenceGroup(
        name="voice",
        capabilities=(
            "voice",
            "text_to_speech",
            "voice_generation",
            "speech_synthesis",
            "audio_generation",
            "voice_message",
        ),
        domains=("voice", "audio"),
    ),
    EquivalenceGroup(
        name="transcription",
        capabilities=("speech_to_text", "transcription", "speech_recognition", "audio_transcription"),
        domains=("voice", "audio"),
    ),
    EquivalenceGroup(
        name="image_generation",
        capabilities=("image_generation", "text_to_image", "image_synthesis"),
        domains=("image",),
    ),
    EquivalenceGroup(
        name="web_search",
        capabilities=("web_search", "internet_search"),
        domains=("web", "search"),
    ),
    EquivalenceGroup(
        name="document_text_extraction",
        capabilities=("pdf_text_extraction", "pdf_to_text", "document_text_extraction"),
        domains=("pdf", "document"),
    ),
)


def builtin_table() -> EquivalenceTable:
    return EquivalenceTable(groups=_BUILTIN_GROUPS, sources=(BUILTIN_SOURCE,))


# ---------------------------------------------------------------------------
# The user's table file
# ---------------------------------------------------------------------------

_TABLE_KEYS = ("groups",)
_GROUP_KEYS = ("name", "capabilities", "domains")


class _TableReader:
    def __init__(self, file_path: str) -> None:
        self.file_path = file_path

    def fail(self, detail: str, line: int) -> NoReturn:
        raise InvalidArgument(f"invalid equivalence table {self.file_path}: {detail} (line {line})")

    def mapping(self, node: yaml.Node, path: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            self.fail(f"expected a mapping at {path or 'the top level'}", _line(node))
        entries: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else ""
            field_path = f"{path}.{name}" if path else name
            if name not in allowed:
                self.fail(f'unknown field "{name}" at {field_path}', _line(key_node))
            if name in entries:
                self.fail(f'duplicate field "{name}" at {field_path}', _line(key_node))
            entries[name] = value_node
        return entries

    def identifier(self, node: yaml.Node, path: str, label: str) -> str:
        if not isinstance(node, yaml.ScalarNode):
            self.fail(f"expected a string at {path}", _line(node))
        try:
            return validate_identifier(str(node.value), label)
        except InvalidIdentifier as error:
            self.fail(f"{error.message} at {path}", _line(node))

    def identifiers(self, node: yaml.Node, path: str, label: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(f"expected a list at {path}", _line(node))
        return tuple(
            self.identifier(item, f"{path}[{index}]", label) for index, item in enumerate(node.value)
        )

    def group(self, node: yaml.Node, path: str) -> EquivalenceGroup:
        entries = self.mapping(node, path, _GROUP_KEYS)
        for required in ("name", "capabilities"):
            if required not in entries:
                self.fail(f'missing field "{required}" at {path}.{required}', _line(node))
        capabilities = self.identifiers(
            entries["capabilities"], f"{path}.capabilities", "equivalent capability"
        )
        if not capabilities:
            self.fail(f"a group needs at least one capability at {path}.capabilities", _line(node))
        for index, capability in enumerate(capabilities):
            if not canonical(capability):
                self.fail(
                    f'capability "{capability}" has no letters or digits at {path}.capabilities[{index}]',
                    _line(entries["capabilities"]),
                )
        domains_node = entries.get("domains")
        return EquivalenceGroup(
            name=self.identifier(entries["name"], f"{path}.name", "equivalence group name"),
            capabilities=capabilities,
            domains=()
            if domains_node is None
            else self.identifiers(domains_node, f"{path}.domains", "domain"),
        )


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def parse_user_table(text: str, path: str) -> EquivalenceTable:
    """Read a user equivalence file: `groups: [{name, capabilities: [...], domains: [...]}]`.

    Strict like seed files: unknown or duplicate keys are refused, names, capabilities
    and domains follow the identifier rule. An empty file is an empty table.

    Raises:
        InvalidArgument: naming the file, the field path and the line.
    """
    reader = _TableReader(path)
    try:
        root = compose_single_document(text)
    except yaml.YAMLError as error:
        line, detail = yaml_error_line_and_detail(error)
        reader.fail(detail, line)
    if root is None:
        return EquivalenceTable(groups=(), sources=(path,))
    entries = reader.mapping(root, "", _TABLE_KEYS)
    groups_node = entries.get("groups")
    if groups_node is None:
        return EquivalenceTable(groups=(), sources=(path,))
    if not isinstance(groups_node, yaml.SequenceNode):
        reader.fail("expected a list at groups", _line(groups_node))
    groups = tuple(reader.group(item, f"groups[{index}]") for index, item in enumerate(groups_node.value))
    return EquivalenceTable(groups=groups, sources=(path,))


# ---------------------------------------------------------------------------
# Combining tables and planning searches
# ---------------------------------------------------------------------------


def _dedupe(values: Iterable[str], key: Callable[[str], str] = lambda value: value) -> tuple[str, ...]:
    seen: set[str] = set()
    result = []
    for value in values:
        if key(value) not in seen:
            seen.add(key(value))
            result.append(value)
    return tuple(result)


def _capability_keys(group: EquivalenceGroup) -> set[str]:
    return {canonical(capability) for capability in group.capabilities}


def _union(groups: list[EquivalenceGroup]) -> EquivalenceGroup:
    return EquivalenceGroup(
        name=groups[0].name,
        capabilities=_dedupe((c for group in groups for c in group.capabilities), canonical),
        domains=_dedupe(d for group in groups for d in group.domains),
    )


def merge_tables(*tables: EquivalenceTable) -> EquivalenceTable:
    """One table: groups that share any capability term (canonically) become one group.

    Merged groups stay pairwise disjoint, so a group that bridges two earlier ones
    joins all three. The first group's name and order are kept.
    """
    merged: list[EquivalenceGroup] = []
    for group in (group for table in tables for group in table.groups):
        keys = _capability_keys(group)
        overlapping = [index for index, existing in enumerate(merged) if keys & _capability_keys(existing)]
        if not overlapping:
            merged.append(group)
            continue
        combined = _union([*(merged[index] for index in overlapping), group])
        merged[overlapping[0]] = combined
        for index in reversed(overlapping[1:]):
            del merged[index]
    return EquivalenceTable(
        groups=tuple(merged), sources=tuple(source for table in tables for source in table.sources)
    )


def plan_attempts(
    table: EquivalenceTable, capability: str, domain: str | None
) -> tuple[tuple[str, str | None], ...]:
    """The related searches to run after an empty first search, in a fixed order.

    Terms: the canonical capability, then every capability of the groups holding it.
    With a domain: each term in that domain and then in every domain of those groups
    (plus the domains of groups that list the requested domain itself, so a search
    in "voice" also looks in "audio"). Without a domain: each term store-wide only,
    because a store-wide search already covers every domain; per-domain searches
    would only find subsets of it again.

    The first search itself is never repeated, and neither is its canonical form:
    every SkillSpec match compares canonical forms, so `text-to-speech` and
    `text_to_speech` find exactly the same seeds with the same scores.
    """
    requested = canonical(capability)
    if not requested:
        return ()
    capability_groups = [group for group in table.groups if requested in _capability_keys(group)]
    terms = _dedupe([requested, *(canonical(c) for group in capability_groups for c in group.capabilities)])
    attempts: list[tuple[str, str | None]]
    if domain is None:
        attempts = [(term, None) for term in terms]
    else:
        domain_groups = capability_groups + [
            group for group in table.groups if domain in group.domains and group not in capability_groups
        ]
        domains = _dedupe([domain, *(d for group in domain_groups for d in group.domains)])
        attempts = [(term, each) for term in terms for each in domains]
    return tuple(attempt for attempt in attempts if attempt != (requested, domain))


def broaden(
    first: SearchResult,
    query: SearchQuery,
    table: EquivalenceTable,
    run_search: Callable[[SearchQuery], SearchResult],
) -> tuple[SearchResult, Broadening]:
    """Search related terms when the first search found nothing; merge and re-rank what they find.

    The first (empty) search is kept as the first attempt, so the answer lists every
    search tried. A seed found by several attempts keeps its highest score and records
    the term and domain that gave it (`matched_domain` is "" for a store-wide attempt).
    The merged result echoes the caller's own capability and domain.
    """
    if first.candidates:
        return first, Broadening(
            first_search_empty=False,
            attempts=(),
            fallback_policy=FIRST_SEARCH_FOUND_POLICY,
            table_sources=table.sources,
        )
    attempts = [BroadeningAttempt(capability=query.capability, domain=query.domain, found=())]
    best: dict[tuple[str, str], RankedCandidate] = {}
    for capability, domain in plan_attempts(table, query.capability, query.domain):
        related = dataclasses.replace(query, capability=capability, domain=domain)
        result = run_search(related)
        attempts.append(
            BroadeningAttempt(
                capability=capability,
                domain=domain,
                found=tuple(f"{candidate.domain}/{candidate.id}" for candidate in result.candidates),
            )
        )
        for candidate in result.candidates:
            key = (candidate.domain, candidate.id)
            if key not in best or candidate.score > best[key].score:
                best[key] = dataclasses.replace(
                    candidate, matched_capability=capability, matched_domain=domain or ""
                )
    merged = finish_search(best.values(), query)
    return merged, Broadening(
        first_search_empty=True,
        attempts=tuple(attempts),
        fallback_policy=RELATED_FOUND_POLICY if merged.candidates else NOTHING_FOUND_POLICY,
        table_sources=table.sources,
    )
