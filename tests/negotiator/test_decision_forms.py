"""A decision's log line and proto: the record as `json.dumps` writes it, the message verdict by verdict."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.negotiator_service import convert
from agentsidecar.negotiator_service.broker import decision_line, decision_record
from agentsidecar.negotiator_service.call_caches import CallCaches
from agentsidecar.negotiator_service.model import (
    Capability,
    CapabilityState,
    Decision,
    Requirement,
    TypedSet,
    Verdict,
)

# Characters a proto string can hold (no lone surrogates); the line takes any text.
PROTO_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)

requirements = st.builds(
    Requirement,
    capability=st.sampled_from(Capability),
    request_field=st.text(max_size=12),
    typed_set=st.none() | st.sampled_from(TypedSet),
    member=st.text(max_size=8),
)
verdicts = st.builds(
    Verdict, requirement=requirements, state=st.sampled_from(CapabilityState), allowed_unknown=st.booleans()
)
decisions = st.builds(
    Decision,
    adapter=st.text(max_size=12),
    declaration_version=st.text(max_size=12),
    verdicts=st.lists(verdicts, max_size=6).map(tuple),
    model=st.text(max_size=8),
)


# Escapes, empty lists and allowed unknowns in every mix: more examples than the default.
@settings(max_examples=300)
@given(
    operation=st.text(max_size=10),
    decision=decisions,
    allow_unknown=st.frozensets(st.sampled_from(Capability)),
)
def test_the_decision_line_is_the_record_as_json_dumps_writes_it(
    operation: str, decision: Decision, allow_unknown: frozenset[Capability]
) -> None:
    assert decision_line(operation, decision, allow_unknown) == json.dumps(
        decision_record(operation, decision, allow_unknown)
    )


def test_the_decision_line_escapes_what_json_escapes() -> None:
    requirement = Requirement(
        Capability.SETTINGS, 'options.settings."q"\\\n', TypedSet.ACCEPTED_SETTINGS, "é\u2028"
    )
    decision = Decision('a"b', "sha256:0", (Verdict(requirement, CapabilityState.UNKNOWN, True),), "m\x00")
    line = decision_line("invoke", decision, frozenset({Capability.SETTINGS, Capability.MCP}))
    assert line == json.dumps(
        decision_record("invoke", decision, frozenset({Capability.SETTINGS, Capability.MCP}))
    )
    assert json.loads(line)["requirements"][0]["request_field"] == requirement.request_field
    assert line.isascii()


proto_decisions = st.builds(
    Decision,
    adapter=PROTO_TEXT,
    declaration_version=PROTO_TEXT,
    verdicts=st.lists(
        st.builds(
            Verdict,
            requirement=st.builds(
                Requirement,
                capability=st.sampled_from(Capability),
                request_field=PROTO_TEXT,
                typed_set=st.none() | st.sampled_from(TypedSet),
                member=PROTO_TEXT,
            ),
            state=st.sampled_from(CapabilityState),
            allowed_unknown=st.booleans(),
        ),
        max_size=6,
    ).map(tuple),
    model=PROTO_TEXT,
)


# Verdicts with and without typed sets and gaps in every mix: more examples than the default.
@settings(max_examples=300)
@given(decision=proto_decisions)
def test_the_decision_proto_is_the_message_built_from_each_verdicts_proto(decision: Decision) -> None:
    expected = negotiator_pb2.Decision(
        adapter=decision.adapter,
        declaration_version=decision.declaration_version,
        accepted=decision.accepted,
        verdicts=[convert.verdict_to_proto(v) for v in decision.verdicts],
        gaps=[convert.verdict_to_proto(v) for v in decision.gaps],
        model=decision.model,
    )
    converted = convert.decision_to_proto(decision)
    assert converted == expected
    assert converted.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


# Pairs drawn from few values, so that equal and unequal decisions both come up often.
@settings(max_examples=300)
@given(
    st.lists(
        st.builds(
            Decision,
            adapter=st.sampled_from(["a", "b"]),
            declaration_version=st.sampled_from(["v1", "v2"]),
            verdicts=st.lists(
                st.builds(
                    Verdict,
                    requirement=st.builds(
                        Requirement,
                        capability=st.sampled_from([Capability.SETTINGS, Capability.MCP]),
                        request_field=st.sampled_from(["options.settings", "x"]),
                        typed_set=st.sampled_from([None, TypedSet.ACCEPTED_SETTINGS]),
                        member=st.sampled_from(["", "seed"]),
                    ),
                    state=st.sampled_from(CapabilityState),
                    allowed_unknown=st.booleans(),
                ),
                max_size=2,
            ).map(tuple),
            model=st.sampled_from(["", "m"]),
        ),
        min_size=2,
        max_size=6,
    )
)
def test_equal_decisions_share_one_object_and_unequal_ones_never(decisions: list[Decision]) -> None:
    caches = CallCaches()
    shared = [caches.shared_decision(decision) for decision in decisions]
    for decision, kept in zip(decisions, shared, strict=True):
        assert kept == decision
        for other, other_kept in zip(decisions, shared, strict=True):
            assert (kept is other_kept) == (decision == other)
