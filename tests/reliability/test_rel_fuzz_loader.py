"""Hypothesis fuzzing of the seed YAML loader: parse_seed raises SeedMalformed or nothing.

Three kinds of input: arbitrary text; YAML-flavoured text built from the
tokens that trip loaders (anchors, aliases, tags, merge keys, directives,
block scalars, odd numbers); and valid seed files with random mutations
(spans deleted, fragments inserted, lines duplicated, swapped or re-indented).
Whatever parse_seed accepts must also survive the writer: dump_seed of the
result reads back as the same seed.

Sizes (environment):
    RELIABILITY_FUZZ_EXAMPLES  examples per property (CI 100, full 500)
    RELIABILITY_FULL=1         every default at full size
"""

from __future__ import annotations

import os
import time
from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.seedstore_service.errors import SeedMalformed
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
from agentsidecar.seedstore_service.seedfile import dump_seed, parse_seed
from tests.reliability.rel_support import Sizes

EXAMPLES = Sizes.from_env(os.environ).fuzz_examples
# Examples sized by RELIABILITY_FUZZ_EXAMPLES (the run's depth); the rest is the suite's profile.
FUZZ = settings(max_examples=EXAMPLES)

VALID_SEEDS = (
    Seed(id="say", domain="voice", kind="cli", command="say", provides=("text_to_speech",)),
    Seed(
        id="whisper-local",
        domain="voice",
        kind="adapter",
        adapter="whisper",
        script="scripts/run.sh --fast",
        provides=("speech_to_text", "transcription"),
        aliases=("Speech to text!", "dictation: live"),
        rank=Rank(
            default_priority=70,
            preferred_for=("speech_to_text",),
            avoid_for=("music",),
            tie_breakers=MappingProxyType({"cost": "low", "latency": "~"}),
        ),
        evidence=(
            Evidence(source="command", command="whisper --version"),
            Evidence(source="doc", detail="#1"),
        ),
        auth_env=("OPENAI_API_KEY",),
        risk=Risk(external_service=True, may_cost_money=True),
        promotion=Promotion(suggested_skill_id="voice.transcribe"),
        verification=Verification(
            status=VerificationStatus.FAILED,
            verified_at_unix=1_700_000_000,
            outcomes=(Outcome(check="path_lookup:whisper", ok=False, message="whisper not found on PATH"),),
        ),
    ),
)
VALID_TEXTS = tuple(dump_seed(seed) for seed in VALID_SEEDS)

YAML_FRAGMENTS = (
    "id: ",
    "domain: ",
    "kind: ",
    "provides:",
    "aliases:",
    "rank:",
    "  default_priority: ",
    "  tie_breakers:",
    "evidence:",
    "- source: ",
    "verification:",
    "  status: ",
    "  verified_at_unix: ",
    "outcomes:",
    "&anchor ",
    "*anchor",
    "<<: *anchor",
    "!!binary ",
    "!!python/object/apply:os.system ['true']",
    "!!set {a, b}",
    "!custom ",
    "? complex key",
    "---",
    "...",
    "%YAML 1.1",
    "%TAG ! tag:example.com,2000:",
    "|",
    ">-",
    "{",
    "}",
    "[",
    "]",
    ",",
    "'",
    '"',
    "\\",
    "#",
    "\t",
    "\n",
    "  ",
    "~",
    "null",
    "True",
    "yes",
    "0x1F",
    "-0o17",
    "+0b101",
    "1e999",
    ".nan",
    "-.inf",
    "18446744073709551616",
    "-9223372036854775809",
    "2001-12-14t21:59:43.10-05:00",
    "\ufeff",
    "\x00",
    "\u2028",
    "é",
    "\U0001f600",
)


def assert_loads_or_refuses(text: str) -> None:
    try:
        seed = parse_seed(text, "/fuzz/seed.yml")
    except SeedMalformed as error:
        refusal: SeedMalformed = error
    else:
        # Accepted: the writer must give back a file that reads as the same seed.
        assert parse_seed(dump_seed(seed), "/fuzz/rewritten.yml") == seed
        return
    assert refusal.path == "/fuzz/seed.yml"
    assert refusal.line >= 0


yaml_text = st.lists(st.one_of(st.sampled_from(YAML_FRAGMENTS), st.text(max_size=12)), max_size=60).map(
    "".join
)


@st.composite
def mutated_seed(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(VALID_TEXTS))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        lines = text.split("\n")
        mutation = draw(st.sampled_from(("delete", "insert", "replace", "duplicate", "swap", "indent")))
        if mutation in ("delete", "insert", "replace") or len(lines) < 2:
            start = draw(st.integers(min_value=0, max_value=len(text)))
            end = draw(st.integers(min_value=start, max_value=min(len(text), start + 40)))
            fragment = draw(st.one_of(st.sampled_from(YAML_FRAGMENTS), st.text(max_size=8)))
            if mutation == "delete":
                text = text[:start] + text[end:]
            elif mutation == "insert":
                text = text[:start] + fragment + text[start:]
            else:
                text = text[:start] + fragment + text[end:]
            continue
        first = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        second = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        if mutation == "duplicate":
            lines.insert(second, lines[first])
        elif mutation == "swap":
            lines[first], lines[second] = lines[second], lines[first]
        else:
            lines[first] = " " * draw(st.integers(min_value=0, max_value=6)) + lines[first].lstrip(" ")
        text = "\n".join(lines)
    return text


@FUZZ
@given(st.text(max_size=2000))
def test_arbitrary_text_is_a_seed_or_seed_malformed(text: str) -> None:
    assert_loads_or_refuses(text)


@FUZZ
@given(yaml_text)
def test_yaml_flavoured_text_is_a_seed_or_seed_malformed(text: str) -> None:
    assert_loads_or_refuses(text)


@FUZZ
@given(mutated_seed())
def test_mutated_valid_seeds_are_a_seed_or_seed_malformed(text: str) -> None:
    assert_loads_or_refuses(text)


def test_the_valid_seeds_the_mutations_start_from_do_load() -> None:
    for seed, text in zip(VALID_SEEDS, VALID_TEXTS, strict=True):
        assert parse_seed(text, "/fuzz/seed.yml") == seed


def test_alias_bombs_deep_nesting_and_huge_scalars_are_handled_quickly() -> None:
    laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    laughs += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 12)]
    refused = {
        "billion laughs": "\n".join(laughs) + "\nid: x\ndomain: d\nkind: cli\naliases: *a11\n",
        "laughs in a map": "\n".join(laughs) + "\nid: x\ndomain: d\nkind: cli\nrank: {tie_breakers: *a11}\n",
        "deep flow": "id: " + "[" * 100_000,
        "deep block": "aliases:\n" + "".join(" " * depth + "- \n" for depth in range(5_000)),
    }
    for name, text in refused.items():
        started = time.monotonic()
        try:
            parse_seed(text, "/fuzz/bomb.yml")
        except SeedMalformed:
            pass
        else:
            raise AssertionError(f"{name} was accepted")
        assert time.monotonic() - started < 5, name
    # A 1 MB identifier is legal; it must load (and round-trip) without trouble.
    started = time.monotonic()
    assert_loads_or_refuses("id: " + "x" * 1_000_000 + "\ndomain: d\nkind: cli\n")
    assert time.monotonic() - started < 5
