"""The scripted adapter: canned replies, config-declared, labelled, still refusing."""

from __future__ import annotations

import asyncio
import json
import time
from types import MappingProxyType
from typing import Any

import pytest

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter, build_adapter_async, build_adapters
from agentsidecar.negotiator_service.adapters.scripted import ScriptedAdapter
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterSpec,
    CallOptions,
    Capability,
    CapabilityState,
    DeclarationOverride,
    StreamEvent,
)

SUPPORTED = CapabilityState.SUPPORTED
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}


def declared(**capabilities: CapabilityState) -> DeclarationOverride:
    return DeclarationOverride(
        kind=AdapterKind.FRAMEWORK,
        capabilities=MappingProxyType({Capability(name): state for name, state in capabilities.items()}),
        string_formats=frozenset({"email"}),
    )


def scripted(
    options: dict[str, Any] | None = None,
    declaration: DeclarationOverride | None = None,
    shortname: str = "demo",
) -> ScriptedAdapter:
    spec = AdapterSpec(
        shortname=shortname,
        implementation="scripted",
        declaration=declaration or declared(structured_output=SUPPORTED),
        options=MappingProxyType(options if options is not None else {"produce": {"json": {"answer": "42"}}}),
    )
    adapter = build_adapter(spec)
    assert isinstance(adapter, ScriptedAdapter)
    return adapter


def call(prompt: str = "hello", **options: Any) -> AdapterCall:
    budget = options.pop("time_budget", None)
    return AdapterCall(prompt=prompt, options=CallOptions(**options), time_budget=budget)


def produce_call(prompt: str = "hello", schema: dict[str, Any] | None = None, **options: Any) -> AdapterCall:
    budget = options.pop("time_budget", None)
    return AdapterCall(
        prompt=prompt, options=CallOptions(**options), output_schema=schema or SCHEMA, time_budget=budget
    )


async def test_invoke_text_reply() -> None:
    adapter = scripted({"invoke": {"text": "canned answer"}, "produce": {"json": {}}})
    reply = await adapter.invoke(call("anything"))
    assert reply.text == "canned answer"
    assert reply.events == ()


async def test_invoke_defaults_to_echo() -> None:
    adapter = scripted()
    assert (await adapter.invoke(call("say this back"))).text == "say this back"


async def test_invoke_echo_and_json_forms() -> None:
    echo = scripted({"invoke": {"echo": True}, "produce": {"json": {}}})
    assert (await echo.invoke(call("ping"))).text == "ping"
    as_json = scripted({"invoke": {"json": {"k": [1, 2]}}, "produce": {"json": {}}})
    assert json.loads((await as_json.invoke(call())).text) == {"k": [1, 2]}


async def test_produce_json_returns_json_text_of_the_object() -> None:
    adapter = scripted({"produce": {"json": {"answer": "42", "n": 3}}})
    reply = await adapter.produce(produce_call())
    assert json.loads(reply.text) == {"answer": "42", "n": 3}


async def test_produce_text_is_returned_as_is_for_the_broker_to_check() -> None:
    adapter = scripted({"produce": {"text": "not json at all"}})
    assert (await adapter.produce(produce_call())).text == "not json at all"


async def test_produce_echo_returns_the_prompt() -> None:
    adapter = scripted({"produce": {"echo": True}})
    assert (await adapter.produce(produce_call('{"answer": "x"}'))).text == '{"answer": "x"}'


@pytest.mark.parametrize(
    ("kind", "error_class"),
    [
        ("unavailable", errors.AdapterUnavailable),
        ("timeout", errors.AdapterTimeout),
        ("rate_limited", errors.AdapterRateLimited),
        ("refused", errors.AdapterRefused),
        ("misconfigured", errors.AdapterMisconfigured),
        ("internal", errors.AdapterInternal),
    ],
)
async def test_error_kinds_map_to_their_classes(kind: str, error_class: type[errors.AdapterFailure]) -> None:
    adapter = scripted(
        {"invoke": {"error": {"kind": kind, "message": "boom"}}, "produce": {"error": {"kind": kind}}},
        shortname="failing",
    )
    with pytest.raises(error_class) as raised:
        await adapter.invoke(call())
    assert type(raised.value) is error_class
    assert raised.value.adapter == "failing"
    assert raised.value.cause == "boom"
    assert '"failing"' in str(raised.value)
    with pytest.raises(error_class):
        await adapter.produce(produce_call())


async def test_rate_limited_error_carries_retry_after() -> None:
    adapter = scripted(
        {"invoke": {"error": {"kind": "rate_limited", "retry_after": 2.5}}, "produce": {"json": {}}}
    )
    with pytest.raises(errors.AdapterRateLimited) as raised:
        await adapter.invoke(call())
    assert raised.value.retry_after == 2.5


async def test_delay_longer_than_the_time_budget_times_out_quickly() -> None:
    adapter = scripted({"delay_seconds": 5, "produce": {"json": {}}}, shortname="slow")
    started = time.monotonic()
    with pytest.raises(errors.AdapterTimeout) as raised:
        await adapter.invoke(call(time_budget=0.1))
    assert time.monotonic() - started < 1.0
    assert raised.value.adapter == "slow"
    assert "time budget" in raised.value.cause


async def test_delay_within_the_budget_replies_after_the_delay() -> None:
    adapter = scripted({"delay_seconds": 0.1, "invoke": {"text": "late"}, "produce": {"json": {}}})
    started = time.monotonic()
    reply = await adapter.invoke(call(time_budget=5))
    assert time.monotonic() - started >= 0.09
    assert reply.text == "late"


async def test_spent_budget_fails_before_any_delay() -> None:
    adapter = scripted({"delay_seconds": 5, "produce": {"json": {}}})
    with pytest.raises(errors.AdapterTimeout):
        await adapter.invoke(call(time_budget=0))


async def test_cancellation_stops_the_delay_and_propagates() -> None:
    adapter = scripted({"delay_seconds": 5, "produce": {"json": {}}})
    task = asyncio.create_task(adapter.invoke(call()))
    await asyncio.sleep(0.05)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 0.5


async def test_declaration_comes_from_config_and_is_labelled_scripted() -> None:
    adapter = scripted(
        {"produce": {"json": {}}},
        declaration=DeclarationOverride(
            kind=AdapterKind.HARNESS,
            capabilities=MappingProxyType(
                {
                    Capability.STRUCTURED_OUTPUT: SUPPORTED,
                    Capability.PERSONA: CapabilityState.UNSUPPORTED,
                }
            ),
            accepted_settings=frozenset({"temperature"}),
        ),
        shortname="fake-agent",
    )
    declaration = adapter.declaration
    assert declaration.scripted is True
    assert declaration.shortname == "fake-agent"
    assert declaration.kind is AdapterKind.HARNESS
    assert declaration.state(Capability.STRUCTURED_OUTPUT) is SUPPORTED
    assert declaration.state(Capability.PERSONA) is CapabilityState.UNSUPPORTED
    # Left out: unknown where the double records the value, unsupported where it has no behaviour.
    assert declaration.state(Capability.EFFORT) is CapabilityState.UNKNOWN
    assert declaration.state(Capability.MCP) is CapabilityState.UNSUPPORTED
    assert declaration.accepted_settings == {"temperature"}
    assert adapter.implementation == "scripted"


async def test_events_only_when_the_call_asks_for_them() -> None:
    adapter = scripted(
        {
            "invoke": {"text": "done"},
            "produce": {"json": {}},
            "events": [{"type": "thinking", "text": "hmm"}, {"type": "done"}],
        },
        declaration=declared(structured_output=SUPPORTED, stream_events=SUPPORTED),
    )
    streamed = await adapter.invoke(call(stream_events=True))
    assert streamed.events == (StreamEvent("thinking", "hmm"), StreamEvent("done", ""))
    assert (await adapter.invoke(call())).events == ()


async def test_refuses_what_its_declaration_does_not_accept() -> None:
    adapter = scripted(declaration=declared(structured_output=SUPPORTED, persona=CapabilityState.UNSUPPORTED))
    with pytest.raises(errors.AdapterRefused) as raised:
        await adapter.invoke(call(model="gpt-x", persona="pirate"))
    assert "options.model" in raised.value.cause
    assert "options.persona" in raised.value.cause
    # A persona declared unsupported stays refused even if the caller allows unknowns.
    with pytest.raises(errors.AdapterRefused):
        await adapter.invoke(call(persona="pirate", allow_unknown=frozenset({Capability.PERSONA})))


async def test_unknown_capability_passes_when_the_caller_allows_it() -> None:
    adapter = scripted()
    reply = await adapter.invoke(
        call("hi", model="gpt-x", allow_unknown=frozenset({Capability.MODEL_OVERRIDE}))
    )
    assert reply.text == "hi"


async def test_produce_refuses_an_undeclared_string_format() -> None:
    adapter = scripted()
    schema = {"type": "object", "properties": {"site": {"type": "string", "format": "uri"}}}
    with pytest.raises(errors.AdapterRefused) as raised:
        await adapter.produce(produce_call(schema=schema))
    assert "string_formats:uri" in raised.value.cause
    email = {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}}
    assert json.loads((await adapter.produce(produce_call(schema=email))).text) == {"answer": "42"}


async def test_produce_without_structured_output_is_refused() -> None:
    adapter = scripted({}, declaration=declared(structured_output=CapabilityState.UNSUPPORTED))
    with pytest.raises(errors.AdapterRefused) as raised:
        await adapter.produce(produce_call())
    assert "structured_output" in raised.value.cause


async def test_produce_without_a_schema_and_invoke_with_one_are_refused() -> None:
    adapter = scripted()
    with pytest.raises(errors.AdapterRefused):
        await adapter.produce(call())
    with pytest.raises(errors.AdapterRefused):
        await adapter.invoke(produce_call())


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"produce": {"json": {}}, "invokee": {"text": "x"}}, "invokee"),
        ({"produce": {"json": {}, "text": "x"}}, "produce"),
        ({"produce": {}}, "produce"),
        ({"produce": {"error": {"kind": "exploded"}}}, "produce.error.kind"),
        ({"produce": {"error": {"kind": "refused", "retry_after": 1}}}, "produce.error.retry_after"),
        ({"produce": {"error": {"kind": "internal", "extra": 1}}}, "produce.error.extra"),
        ({"produce": {"echo": False}}, "produce.echo"),
        ({"produce": {"text": 3}}, "produce.text"),
        ({"produce": {"json": {}}, "delay_seconds": -1}, "delay_seconds"),
        ({"produce": {"json": {}}, "delay_seconds": True}, "delay_seconds"),
        ({"produce": {"json": {}}, "events": [{"text": "no type"}]}, "events[0].type"),
        ({"produce": {"json": {}}, "events": "nope"}, "events"),
        ({}, "produce"),  # structured_output is declared supported, so a produce reply is required
    ],
)
def test_bad_options_are_config_errors_naming_the_option(options: dict[str, Any], named: str) -> None:
    with pytest.raises(errors.ConfigError) as raised:
        scripted(options, shortname="broken")
    assert '"broken"' in raised.value.message
    assert f"`{named}`" in raised.value.message


def test_a_scripted_adapter_needs_a_declaration() -> None:
    spec = AdapterSpec(shortname="bare", implementation="scripted")
    with pytest.raises(errors.ConfigError, match='"bare"'):
        build_adapter(spec)


def test_unknown_implementation_is_a_config_error() -> None:
    spec = AdapterSpec(shortname="what", implementation="telepathy", source_path="/etc/negotiator.yaml")
    with pytest.raises(errors.ConfigError) as raised:
        build_adapter(spec)
    assert "telepathy" in raised.value.message
    assert '"what"' in raised.value.message
    assert "/etc/negotiator.yaml" in raised.value.message


def test_invalid_shortname_is_a_config_error() -> None:
    with pytest.raises(errors.ConfigError, match="Bad Name"):
        build_adapter(AdapterSpec(shortname="Bad Name", implementation="scripted", declaration=declared()))


def test_remote_needs_the_async_builder() -> None:
    spec = AdapterSpec(shortname="far", implementation="remote", options=MappingProxyType({"target": "x:1"}))
    with pytest.raises(errors.ConfigError, match="build_adapter_async"):
        build_adapter(spec)


async def test_build_adapter_async_builds_sync_implementations_too() -> None:
    spec = AdapterSpec(shortname="demo", implementation="scripted", declaration=declared())
    adapter = await build_adapter_async(spec)
    assert adapter.declaration.scripted


async def test_build_adapters_refuses_duplicate_shortnames() -> None:
    spec = AdapterSpec(shortname="twin", implementation="scripted", declaration=declared())
    with pytest.raises(errors.ConfigError, match="twin"):
        await build_adapters([spec, spec])


async def test_build_adapters_is_all_or_nothing() -> None:
    good = AdapterSpec(shortname="good", implementation="scripted", declaration=declared())
    bad = AdapterSpec(shortname="bad", implementation="command", options=MappingProxyType({"argv": []}))
    with pytest.raises(errors.ConfigError, match="argv"):
        await build_adapters([good, bad])
    built = await build_adapters([good])
    assert [a.declaration.shortname for a in built] == ["good"]
