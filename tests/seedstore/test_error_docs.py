"""protos/README.md against the code, for the seedstore and the runtime: every (code, reason) the
status table returns for an error class has a row in its section, and every reason a row of those
sections names is one the code returns."""

from __future__ import annotations

from agentsidecar.seedstore_service.status import to_rich_error
from tests.error_docs import RUNTIME, documented, rows, section
from tests.seedstore.test_status import EXAMPLES


def seedstore_pairs() -> set[tuple[str, str]]:
    return {(to_rich_error(error).code.name, to_rich_error(error).reason) for error, _ in EXAMPLES}


def test_every_seedstore_error_has_a_row() -> None:
    assert sorted(seedstore_pairs() - documented("seedstore")) == []


def test_every_runtime_error_has_a_row() -> None:
    assert sorted(RUNTIME - documented("runtime")) == []


def test_the_seedstore_and_runtime_sections_name_only_reasons_the_code_returns() -> None:
    known = {reason for _, reason in seedstore_pairs() | RUNTIME} | {"INTERNAL"}
    for name in ("seedstore", "runtime"):
        stray = {reason for _, reasons in rows(section(name)) for reason in reasons} - known
        assert stray == set(), f"the {name} section names {sorted(stray)}"
