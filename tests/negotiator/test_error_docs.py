"""protos/README.md against the code, for the negotiator: every (code, reason) the status table
returns for an error class has a row in the negotiator's section, and every reason a row of that
section or of the adapter contract names is one the negotiator or the runtime returns."""

from __future__ import annotations

import re
from pathlib import Path

from test_status import concrete_errors, error_tree, sample

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.status import to_rich_error
from tests.error_docs import RUNTIME, documented, rows, section

# Bases only their subclasses are raised as (test_bases_are_never_raised checks the sources).
BASES = tuple(cls for cls in error_tree() if cls.abstract)
SOURCES = Path(errors.__file__).parent


def negotiator_pairs() -> set[tuple[str, str]]:
    pairs = set()
    for cls in concrete_errors():
        rich = to_rich_error(sample(cls))
        pairs.add((rich.code.name, rich.reason))
    return pairs


def test_every_negotiator_error_has_a_row() -> None:
    assert sorted(negotiator_pairs() - documented("negotiator")) == []


def test_the_negotiator_sections_name_only_reasons_the_code_returns() -> None:
    known = {reason for _, reason in negotiator_pairs() | RUNTIME} | {"INTERNAL"}
    for name in ("negotiator", "adapter"):
        stray = {reason for _, reasons in rows(section(name)) for reason in reasons} - known
        assert stray == set(), f"the {name} section names {sorted(stray)}"


def test_bases_are_never_raised() -> None:
    for base in BASES:
        raised = re.compile(rf"\braise\s+(errors\.)?{base.__name__}\(")
        offenders = [p for p in SOURCES.rglob("*.py") if raised.search(p.read_text(encoding="utf-8"))]
        assert offenders == []
