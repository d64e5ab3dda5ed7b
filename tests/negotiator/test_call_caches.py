"""The per-call caches on the hot path give the answers the uncached code gives, call after call."""

from __future__ import annotations

from typing import Any

import pytest
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2
from fakes import make_declaration
from google.protobuf import struct_pb2

from negotiator_service import convert, negotiation
from negotiator_service.adapters._calls import ALL_CAPABILITIES, check_call
from negotiator_service.errors import AdapterRefused, InvalidRequest
from negotiator_service.identity_cache import IdentityCache
from negotiator_service.model import AdapterCall, CallKind, CallRequest, Capability


def options_message(**settings: Any) -> negotiator_pb2.CallOptions:
    struct = struct_pb2.Struct()
    struct.update(settings)
    return negotiator_pb2.CallOptions(model="m", settings=struct)


def test_the_same_options_encoding_is_converted_once_and_shared() -> None:
    first = convert.call_options(options_message(temperature=0.2, seed=7))
    again = convert.call_options(
        negotiator_pb2.CallOptions.FromString(options_message(temperature=0.2, seed=7).SerializeToString())
    )
    assert again is first
    assert dict(first.settings) == {"temperature": 0.2, "seed": 7}
    other = convert.call_options(options_message(temperature=0.3, seed=7))
    assert other is not first
    assert other.settings["temperature"] == 0.3


def test_settings_holding_lists_or_objects_are_never_shared() -> None:
    first = convert.call_options(options_message(stop=["a", "b"]))
    stop = first.settings["stop"]
    assert isinstance(stop, list)
    stop.append("changed by an adapter")
    again = convert.call_options(options_message(stop=["a", "b"]))
    assert again is not first
    assert again.settings["stop"] == ["a", "b"]


def test_options_that_cannot_be_converted_are_refused_every_time() -> None:
    bad = negotiator_pb2.CallOptions(allow_unknown=[common_pb2.Capability.Value("CAPABILITY_UNSPECIFIED")])
    for _ in range(2):
        with pytest.raises(InvalidRequest) as refused:
            convert.call_options(bad)
        assert refused.value.violations[0][0] == "options.allow_unknown[0]"


def test_an_adapter_check_is_answered_per_declaration_even_for_shared_options() -> None:
    options = convert.call_options(options_message(temperature=0.2))
    supported = make_declaration(
        supported=(Capability.MODEL_OVERRIDE, Capability.SETTINGS),
        accepted_settings=["temperature"],
    )
    narrower = make_declaration(
        supported=(Capability.MODEL_OVERRIDE, Capability.SETTINGS),
        accepted_settings=["seed"],
    )
    call = AdapterCall(prompt="hi", options=options)
    for _ in range(2):  # the second round is answered from the cache
        check_call(supported, call, CallKind.INVOKE, implemented=ALL_CAPABILITIES)
        with pytest.raises(AdapterRefused) as refused:
            check_call(narrower, call, CallKind.INVOKE, implemented=ALL_CAPABILITIES)
        assert "options.settings.temperature" in refused.value.message
        with pytest.raises(AdapterRefused) as not_implemented:
            check_call(supported, call, CallKind.INVOKE, implemented=ALL_CAPABILITIES - {Capability.SETTINGS})
        assert "options.settings" in not_implemented.value.message


def test_option_problems_are_reported_for_every_call_with_those_options() -> None:
    options = convert.call_options(negotiator_pb2.CallOptions(model=" ", persona="p"))
    request = CallRequest(kind=CallKind.INVOKE, prompt="hi", adapter="a", options=options)
    for _ in range(2):
        with pytest.raises(InvalidRequest) as refused:
            negotiation.validate_request(request)
        assert list(refused.value.violations) == [("options.model", "must not be empty when set")]
    fine = CallRequest(
        kind=CallKind.INVOKE,
        prompt="hi",
        adapter="a",
        options=convert.call_options(negotiator_pb2.CallOptions(model="m")),
    )
    assert negotiation.validate_request(fine) is None


def test_an_identity_cache_tells_equal_objects_apart_and_starts_over_when_full() -> None:
    cache: IdentityCache[str] = IdentityCache(max_entries=2)
    first, twin = [1, 2], [1, 2]  # equal, but not the same object
    cache.put((first,), "extra", "kept")
    assert cache.get((first,), "extra", None) == "kept"
    assert cache.get((twin,), "extra", None) is None
    assert cache.get((first,), "other extra", None) is None
    cache.put((twin,), "extra", "twin's")
    assert (len(cache), cache.get((first,), "extra", None)) == (2, "kept")
    cache.put(([3],), None, "third")  # full: starts over
    assert (len(cache), cache.get((first,), "extra", None)) == (1, None)
