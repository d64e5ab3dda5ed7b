"""The Python gate, risk and typed-set vocabularies match the proto enums member for member."""

from __future__ import annotations

import enum

import pytest
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator_service.model import Capability, TypedSet
from agentsidecar.sidecar_runtime.wire_names import SET_CAPABILITY_NAMES, Gate, Risk, UnknownGate


@pytest.mark.parametrize(
    ("python", "proto", "prefix"),
    [
        (Gate, common_pb2.Gate, "GATE_"),
        (Risk, common_pb2.RiskFlag, "RISK_FLAG_"),
        (TypedSet, common_pb2.TypedSet, "TYPED_SET_"),
        (Capability, common_pb2.Capability, "CAPABILITY_"),
    ],
)
def test_every_proto_value_has_its_python_member_and_back(
    python: type[enum.Enum], proto: EnumTypeWrapper, prefix: str
) -> None:
    names = (value.name for value in proto.DESCRIPTOR.values)
    named = {name.removeprefix(prefix) for name in names if name != f"{prefix}UNSPECIFIED"}
    assert {member.name for member in python} == named
    assert all(member.value == member.name.lower() for member in python)


def test_every_typed_set_belongs_to_a_capability_by_wire_name() -> None:
    assert sorted(SET_CAPABILITY_NAMES) == sorted(s.value for s in TypedSet)
    assert {Capability(c) for c in SET_CAPABILITY_NAMES.values()} <= set(Capability)


def test_an_unknown_gate_is_named_by_its_number_and_is_no_gate() -> None:
    assert UnknownGate(99).value == "unknown_gate_99"
    assert UnknownGate(99).value not in {gate.value for gate in Gate}
