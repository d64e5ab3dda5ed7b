"""The `list` output's template rows are byte for byte what json.dumps(indent=2) writes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.seedstore_service import cli_output

TEXT = st.text(max_size=12)
ROW = st.fixed_dictionaries(
    {
        "id": TEXT,
        "domain": TEXT,
        "kind": TEXT,
        "path": TEXT,
        "provides": st.lists(TEXT, max_size=3),
        "verification_status": TEXT,
        "risk": st.lists(TEXT, max_size=2),
        "revision": TEXT,
    }
)
PROBLEM = st.fixed_dictionaries({"path": TEXT, "line": st.integers(0, 99), "reason": TEXT})


# Byte identity with json.dumps over a wide space of strings and row shapes.
@settings(max_examples=300)
@given(
    seed_store=TEXT,
    domain=st.none() | TEXT,
    seeds=st.lists(ROW, max_size=4),
    problems=st.lists(PROBLEM, max_size=2),
)
def test_list_output_is_json_dumps_indent_2(
    seed_store: str, domain: str | None, seeds: list[dict[str, Any]], problems: list[dict[str, Any]]
) -> None:
    output: dict[str, Any] = {"seed_store": seed_store, "domain": domain, "seeds": seeds}
    if problems:
        output["problems"] = problems
    assert cli_output.dumps(output, "pretty") == json.dumps(output, indent=2, ensure_ascii=False)
    assert cli_output.dumps(output, "compact") == json.dumps(
        output, ensure_ascii=False, separators=(",", ":")
    )


def test_rows_of_another_shape_are_written_by_the_generic_printer() -> None:
    odd = {"seed_store": "s", "seeds": [{"id": "x", "extra": [1, None, True]}], "seeds_note": '"seeds": []'}
    assert cli_output.dumps(odd, "pretty") == json.dumps(odd, indent=2, ensure_ascii=False)
    row: dict[str, Any] = dict.fromkeys(cli_output._ROW_KEYS, "v")
    row["provides"] = [1]
    other = {"seeds": [row]}
    assert cli_output.dumps(other, "pretty") == json.dumps(other, indent=2, ensure_ascii=False)
