"""`cli_common.pretty` prints exactly what `json.dumps(indent=2, ensure_ascii=False)` prints."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.sidecar_runtime.cli_common import pretty

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text()
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(values)
def test_pretty_is_json_dumps_with_an_indent(value: Any) -> None:
    assert pretty(value) == json.dumps(value, indent=2, ensure_ascii=False)
