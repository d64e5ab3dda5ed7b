"""A server's call caches (call_caches.py) give the answers the uncached code gives, call after call."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from fakes import FakeAdapter, make_declaration
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.negotiator_service import convert, negotiation
from agentsidecar.negotiator_service.adapters._calls import ALL_CAPABILITIES, check_call, plain_json
from agentsidecar.negotiator_service.broker import Broker
from agentsidecar.negotiator_service.call_caches import CallCaches
from agentsidecar.negotiator_service.errors import (
    AdapterKindMismatch,
    AdapterNotFound,
    AdapterRefused,
    InvalidRequest,
)
from agentsidecar.negotiator_service.identity_cache import IdentityCache
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterReply,
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    Profile,
    StreamEvent,
    Usage,
)
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter


def options_message(**settings: Any) -> negotiator_pb2.CallOptions:
    struct = struct_pb2.Struct()
    struct.update(settings)
    return negotiator_pb2.CallOptions(model="m", settings=struct)


def test_the_same_options_encoding_is_converted_once_and_shared() -> None:
    caches = CallCaches()
    first = caches.call_options(options_message(temperature=0.2, seed=7))
    again = caches.call_options(
        negotiator_pb2.CallOptions.FromString(options_message(temperature=0.2, seed=7).SerializeToString())
    )
    assert again is first
    assert dict(first.settings) == {"temperature": 0.2, "seed": 7}
    other = caches.call_options(options_message(temperature=0.3, seed=7))
    assert other is not first
    assert convert.call_options(options_message(temperature=0.2, seed=7)) is not first  # keeps none
    assert other.settings["temperature"] == 0.3


def test_settings_holding_lists_or_objects_are_never_shared() -> None:
    caches = CallCaches()
    first = caches.call_options(options_message(stop=["a", "b"]))
    stop = first.settings["stop"]
    assert isinstance(stop, list)
    stop.append("changed by an adapter")
    again = caches.call_options(options_message(stop=["a", "b"]))
    assert again is not first
    assert again.settings["stop"] == ["a", "b"]


def test_options_that_cannot_be_converted_are_refused_every_time() -> None:
    bad = negotiator_pb2.CallOptions(allow_unknown=[common_pb2.Capability.Value("CAPABILITY_UNSPECIFIED")])
    caches = CallCaches()
    for _ in range(2):
        with pytest.raises(InvalidRequest) as refused:
            caches.call_options(bad)
        assert refused.value.violations[0][0] == "options.allow_unknown[0]"


def test_an_adapter_check_is_answered_per_declaration_even_for_shared_options() -> None:
    options = CallCaches().call_options(options_message(temperature=0.2))
    supported = make_declaration(
        supported=(Capability.MODEL_OVERRIDE, Capability.SETTINGS),
        accepted_settings=["temperature"],
    )
    narrower = make_declaration(
        supported=(Capability.MODEL_OVERRIDE, Capability.SETTINGS),
        accepted_settings=["seed"],
    )
    call = AdapterCall(prompt="hi", options=options)
    for _ in range(2):
        check_call(supported, call, CallKind.INVOKE, implemented=ALL_CAPABILITIES)
        with pytest.raises(AdapterRefused) as refused:
            check_call(narrower, call, CallKind.INVOKE, implemented=ALL_CAPABILITIES)
        assert "options.settings.temperature" in refused.value.message
        with pytest.raises(AdapterRefused) as not_implemented:
            check_call(supported, call, CallKind.INVOKE, implemented=ALL_CAPABILITIES - {Capability.SETTINGS})
        assert "options.settings" in not_implemented.value.message


def test_option_problems_are_reported_for_every_call_with_those_options() -> None:
    options = CallCaches().call_options(negotiator_pb2.CallOptions(model=" ", persona="p"))
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


def test_an_identity_cache_tells_equal_objects_apart_and_drops_its_oldest_entry_when_full() -> None:
    cache: IdentityCache[str] = IdentityCache(max_entries=2)
    first, twin = [1, 2], [1, 2]  # equal, but not the same object
    cache.put((first,), "extra", "kept")
    assert cache.get((first,), "extra", None) == "kept"
    assert cache.get((twin,), "extra", None) is None
    assert cache.get((first,), "other extra", None) is None
    cache.put((twin,), "extra", "twin's")
    assert (len(cache), cache.get((first,), "extra", None)) == (2, "kept")
    third = [3]
    cache.put((third,), None, "third")  # full: the oldest entry goes, the others stay
    assert len(cache) == 2
    assert cache.get((first,), "extra", None) is None
    assert (cache.get((twin,), "extra", None), cache.get((third,), None, None)) == ("twin's", "third")
    cache.put((first,), "extra", "back")
    assert [
        cache.get((key,), extra, None) for key, extra in ((twin, "extra"), (third, None), (first, "extra"))
    ] == [
        None,
        "third",
        "back",
    ]


@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_an_identity_cache_keys_on_every_object_in_order_and_the_extra(count: int) -> None:
    cache: IdentityCache[str] = IdentityCache(max_entries=100)
    objects = tuple([index] for index in range(count))
    cache.put(objects, "extra", "kept")
    assert cache.get(objects, "extra", None) == "kept"
    assert cache.get(tuple(list(o) for o in objects), "extra", None) == (None if count else "kept")
    assert cache.get(objects, "other", None) is None
    if count >= 2:
        assert cache.get(objects[::-1], "extra", None) is None
    if count:
        assert cache.get(objects[:-1], "extra", None) is None
        assert cache.get((*objects, [9]), "extra", None) is None


# --- the broker's judgement per (options, declaration) ------------------------------------------

DRAFT_PROFILE = Profile(name="draft", model="profile-model")


# One server's caches, as server.py hands them to its Broker and servicer.
CACHES = CallCaches()


def judged_broker(*adapters: FakeAdapter) -> Broker:
    registry = AdapterRegistry()
    for adapter in adapters:
        registry.add(RegisteredAdapter(adapter=adapter, source="runtime"))
    return Broker(registry, profiles={"draft": DRAFT_PROFILE}, caches=CACHES)


def shared_call(prompt: str = "hi", *, adapter: str = "fake", **options: Any) -> CallRequest:
    """A call whose options object is the one the caches share for this encoding, as on the wire."""
    return CallRequest(
        kind=CallKind.INVOKE,
        prompt=prompt,
        adapter=adapter,
        options=CACHES.call_options(negotiator_pb2.CallOptions(**options)),
    )


def test_a_call_like_an_earlier_one_gets_the_same_decision_and_its_own_prompt() -> None:
    broker = judged_broker(FakeAdapter(make_declaration(supported=[Capability.MODEL_OVERRIDE])))
    first = broker.negotiate(shared_call("one", model="m"))
    second = broker.negotiate(shared_call("two", model="m"))
    assert second is first
    assert first.accepted
    _, _, expanded = broker._judge(shared_call("three", model="m"))
    assert (expanded.prompt, expanded.options.model) == ("three", "m")


def test_calls_with_new_options_but_equal_verdicts_share_one_decision_and_its_line() -> None:
    lines: list[str] = []
    registry = AdapterRegistry()
    registry.add(
        RegisteredAdapter(
            adapter=FakeAdapter(make_declaration(supported=[Capability.MODEL_OVERRIDE, Capability.SETTINGS])),
            source="runtime",
        )
    )
    broker = Broker(registry, caches=CallCaches(), decision_sink=lines.append)

    def call(seed: float, model: str = "m") -> CallRequest:
        message = options_message(seed=seed)
        message.model = model
        options = broker.caches.call_options(message)
        return CallRequest(kind=CallKind.INVOKE, prompt="hi", adapter="fake", options=options)

    first_call, second_call = call(1), call(2)
    assert second_call.options is not first_call.options  # converted apart: nothing else is shared
    first = broker.negotiate(first_call)
    second = broker.negotiate(second_call)
    assert second is first
    assert lines[0] == lines[1]
    assert broker.caches.negotiate_response(second) is broker.caches.negotiate_response(first)
    _, _, expanded = broker._judge(second_call)
    assert expanded.options.settings["seed"] == 2  # the call's own options go to the adapter
    # Another model that no per-model entry judges: the same verdicts, so the same decision.
    assert broker.negotiate(call(3, model="n")) is first
    without_settings = dataclasses.replace(
        first_call, options=broker.caches.call_options(negotiator_pb2.CallOptions(model="m"))
    )
    other = broker.negotiate(without_settings)
    assert other is not first
    assert [v.requirement.capability for v in other.verdicts] == [Capability.MODEL_OVERRIDE]
    assert lines[-1] != lines[0]
    assert broker.caches.shared_decision(dataclasses.replace(first)) is first


def test_decisions_that_differ_in_any_compared_field_are_kept_apart() -> None:
    caches = CallCaches(max_entries=4)
    broker = judged_broker(FakeAdapter(make_declaration(supported=[Capability.MODEL_OVERRIDE])))
    base = broker.negotiate(shared_call(model="m"))
    variants = [
        dataclasses.replace(base, adapter="other"),
        dataclasses.replace(base, declaration_version="sha256:0"),
        dataclasses.replace(base, model="m2"),
        dataclasses.replace(base, verdicts=()),
    ]
    kept = [caches.shared_decision(decision) for decision in (base, *variants)]
    assert [a is b for a, b in zip(kept, (base, *variants), strict=True)] == [True] * 5
    # Bounded: the fifth dropped the oldest (base), and the others are still kept.
    assert caches.shared_decision(dataclasses.replace(variants[3])) is variants[3]
    assert caches.shared_decision(dataclasses.replace(variants[0])) is variants[0]
    assert caches.shared_decision(dataclasses.replace(base)) is not base


def test_a_replaced_declaration_is_judged_afresh_for_the_same_options() -> None:
    broker = judged_broker(FakeAdapter(make_declaration(supported=[Capability.MODEL_OVERRIDE])))
    assert broker.negotiate(shared_call(model="m")).accepted
    broker.registry.remove("fake")
    broker.registry.add(
        RegisteredAdapter(
            adapter=FakeAdapter(make_declaration(unsupported=[Capability.MODEL_OVERRIDE])), source="runtime"
        )
    )
    refused = broker.negotiate(shared_call(model="m"))
    assert [gap.requirement.capability for gap in refused.gaps] == [Capability.MODEL_OVERRIDE]
    broker.registry.remove("fake")
    with pytest.raises(AdapterNotFound):
        broker.negotiate(shared_call(model="m"))


def test_what_validation_refuses_is_refused_after_a_like_call_was_accepted() -> None:
    broker = judged_broker(FakeAdapter(make_declaration(supported=[Capability.MODEL_OVERRIDE])))
    assert broker.negotiate(shared_call("hi", model="m")).accepted
    with pytest.raises(InvalidRequest) as empty_prompt:
        broker.negotiate(shared_call("", model="m"))
    assert list(empty_prompt.value.violations) == [("prompt", "must not be empty")]
    harness_named_as_adapter = dataclasses.replace(shared_call(model="m"), adapter=None, agent="fake")
    with pytest.raises(AdapterKindMismatch):
        broker.negotiate(harness_named_as_adapter)
    with_schema = dataclasses.replace(shared_call(model="m"), output_schema='{"type": "object"}')
    with pytest.raises(InvalidRequest) as schema_on_invoke:
        broker.negotiate(with_schema)
    assert [field for field, _ in schema_on_invoke.value.violations] == ["output_schema"]


def test_produces_with_one_schema_text_share_one_schema_no_adapter_can_change() -> None:
    broker = judged_broker(FakeAdapter(make_declaration(supported=[Capability.STRUCTURED_OUTPUT])))
    text = '{"type": "object", "required": ["a"], "properties": {"a": {"enum": [1, [2]]}}}'
    produce = dataclasses.replace(shared_call(), kind=CallKind.PRODUCE, output_schema=text)
    _, first_schema, _ = broker._judge(produce)  # judged afresh: the check's own parse, frozen
    _, second_schema, _ = broker._judge(produce)  # judged before: the kept one
    assert first_schema is not None
    assert first_schema is second_schema
    assert plain_json(first_schema) == json.loads(text)
    with pytest.raises(TypeError):
        first_schema["type"] = "array"  # type: ignore[index]
    with pytest.raises(TypeError):
        first_schema["properties"]["a"]["enum"][1][0] = 3
    with pytest.raises(AttributeError):
        first_schema["required"].append("b")
    assert plain_json(second_schema) == json.loads(text)


def test_a_profile_expanded_once_is_expanded_for_every_like_call() -> None:
    broker = judged_broker(FakeAdapter(make_declaration(supported=[Capability.MODEL_OVERRIDE])))
    for prompt in ("one", "two"):
        decision, _, expanded = broker._judge(shared_call(prompt, profile="draft"))
        assert (expanded.prompt, expanded.options.model, expanded.options.profile) == (
            prompt,
            "profile-model",
            None,
        )
        assert [v.requirement.request_field for v in decision.verdicts] == ["profile(draft).model"]


def test_responses_carry_the_decision_as_built_field_by_field_every_time() -> None:
    broker = judged_broker(FakeAdapter(make_declaration(supported=[Capability.MODEL_OVERRIDE])))
    decision = broker.negotiate(shared_call(model="m"))
    expected = convert.decision_to_proto(decision)
    reply = AdapterReply(text="out", events=(StreamEvent("progress", "half"),))
    for _ in range(2):
        assert CACHES.negotiate_response(decision) == negotiator_pb2.NegotiateResponse(decision=expected)
        assert CACHES.negotiate_response(decision) is CACHES.negotiate_response(decision)  # shared
        assert convert.negotiate_response(decision) is not convert.negotiate_response(decision)
        invoked = CACHES.invoke_response(reply, decision)
        assert invoked == negotiator_pb2.InvokeResponse(
            text="out", decision=expected, events=[negotiator_pb2.StreamEvent(type="progress", text="half")]
        )
        produced = CACHES.produce_response(AdapterReply(text="{}"), decision)
        assert produced == negotiator_pb2.ProduceResponse(output_json="{}", decision=expected)


def test_each_server_keeps_its_own_caches_and_convert_keeps_none() -> None:
    message = options_message(temperature=0.2)
    first, second = CallCaches(), CallCaches()
    assert first.call_options(message) is first.call_options(message)
    assert second.call_options(message) is not first.call_options(message)
    assert convert.call_options(message) is not convert.call_options(message)
    one = judged_broker(FakeAdapter(make_declaration(supported=[Capability.MODEL_OVERRIDE])))
    other = Broker(one.registry)
    call = shared_call(model="m")
    assert one.negotiate(call) is one.negotiate(call)
    assert other.negotiate(call) is not one.negotiate(call)
    assert other.caches is not one.caches


# --- the reply size bound ------------------------------------------------------------------------

_BOUND_TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=300)
_BOUND_INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(
    text=_BOUND_TEXT,
    events=st.lists(st.tuples(_BOUND_TEXT, _BOUND_TEXT), max_size=4),
    usage=st.none() | st.tuples(_BOUND_INT, _BOUND_INT, _BOUND_INT, _BOUND_INT),
    conversation_id=st.none() | _BOUND_TEXT,
    gaps=st.booleans(),
)
def test_the_reply_size_bound_is_never_below_the_encoded_size(
    text: str,
    events: list[tuple[str, str]],
    usage: tuple[int, int, int, int] | None,
    conversation_id: str | None,
    gaps: bool,
) -> None:
    caches = CallCaches()
    declaration = make_declaration("bound", supported=[] if gaps else list(Capability))
    requirements = negotiation.derive_requirements(
        CallRequest(kind=CallKind.INVOKE, prompt="p", options=CallOptions(model="m", effort="high")), None
    )
    decision = negotiation.judge(declaration, requirements, frozenset())
    reply = AdapterReply(
        text=text,
        events=tuple(StreamEvent(type=t, text=x) for t, x in events),
        usage=Usage(*usage) if usage is not None else None,
    )
    bound = caches.reply_size_bound(reply, decision, conversation_id)
    for response in (caches.invoke_response(reply, decision), caches.produce_response(reply, decision)):
        if conversation_id is not None:
            response.conversation_id = conversation_id
        assert response.ByteSize() <= bound


def test_the_reply_size_bound_holds_for_the_widest_characters_and_integers() -> None:
    caches = CallCaches()
    decision = negotiation.judge(make_declaration("bound"), (), frozenset())
    widest = "\U0001f600" * 2000  # four UTF-8 bytes each
    reply = AdapterReply(
        text=widest,
        events=(StreamEvent(type=widest, text=widest),),
        usage=Usage(-1, -(2**63), -1, -1),  # ten-byte varints
    )
    bound = caches.reply_size_bound(reply, decision, widest)
    response = caches.invoke_response(reply, decision)
    response.conversation_id = widest
    assert len(widest.encode()) * 4 < response.ByteSize() <= bound
