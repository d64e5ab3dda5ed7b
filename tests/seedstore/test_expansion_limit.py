"""A document without an alias is held to the expansion limit by a plain sum over its tree, with the
same verdict and words as the walk that follows aliases (its text holding a `*` takes that walk)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentsidecar.seedstore_service.errors import SeedMalformed
from agentsidecar.seedstore_service.seedfile import MAX_SEED_FILE_BYTES, parse_seed_with_notes

LIMIT = MAX_SEED_FILE_BYTES


def outcome(text: str) -> str:
    try:
        parse_seed_with_notes(text, "/store/d/x.yml")
    except SeedMalformed as error:
        return error.message
    return "parsed"


def scalar_document(expanded: int) -> str:
    """One plain scalar: it counts its characters and one for the node."""
    return "a" * (expanded - 1)


def sequence_document(expanded: int) -> str:
    """A sequence of scalars under a mapping key: one for each collection, characters plus one a scalar."""
    items, width = [], 1023
    left = expanded - 1 - 3 - 1  # the mapping, the key "id" and the sequence
    while left > 0:
        size = min(width + 1, left)
        items.append("- " + "b" * (size - 1))
        left -= size
    return "id:\n" + "\n".join(items) + "\n"


@pytest.mark.parametrize("document", [scalar_document, sequence_document])
def test_a_document_without_an_alias_is_refused_just_past_the_limit(document: Callable[[int], str]) -> None:
    at_the_limit = outcome(document(LIMIT))
    past_it = outcome(document(LIMIT + 1))
    assert "expands to more than" not in at_the_limit
    assert f"the document expands to more than {LIMIT} bytes once aliases are followed" in past_it
    # The same text with a `*` in a comment takes the walk that follows aliases: same verdicts.
    assert outcome(document(LIMIT) + "\n# *\n") == at_the_limit
    assert outcome(document(LIMIT + 1) + "\n# *\n") == past_it


def test_a_document_with_an_alias_is_still_measured_with_the_alias_followed() -> None:
    item = "x" * 1000
    text = f"id: &big [{', '.join([item] * 600)}]\nprovides: [*big, *big]\n"
    assert len(text) < LIMIT  # the file is small; followed twice, the alias makes it large
    assert "expands to more than" in outcome(text)
