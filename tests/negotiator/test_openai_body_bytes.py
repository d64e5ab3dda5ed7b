"""The request body bytes the openai adapter sends are the bytes httpx's `json=` sends for the same value."""

from __future__ import annotations

import httpx
from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.negotiator_service.adapters.openai import _json_bytes

# What a chat-completions body holds: any text (non-ASCII, escapes, surrogate-free), finite numbers.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), _JSON, max_size=6))  # a body is an object
def test_body_bytes_are_httpx_json_bytes(value: dict[str, object]) -> None:
    assert _json_bytes(value) == httpx.Request("POST", "http://127.0.0.1/", json=value).content


def test_body_bytes_are_compact_utf8() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": 'café \u2028 "q"'}]}
    assert (
        _json_bytes(body)
        == '{"model":"m","messages":[{"role":"user","content":"café \u2028 \\"q\\""}]}'.encode()
    )
