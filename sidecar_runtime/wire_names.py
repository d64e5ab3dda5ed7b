"""Names that travel on the wire and that servers and clients both read.

Pure and client-safe: no grpc, no generated code, no I/O, nothing mutable.
The proto enums (`agentsidecar.common.v1.Gate`, `RiskFlag`, `TypedSet`,
`Capability`) are the vocabulary; the Python enums here carry the same
members, each member's name being the proto value's name without its prefix
(`GATE_PROVIDER_COST_APPROVAL` -> `Gate.PROVIDER_COST_APPROVAL`) and its value
the lower-case wire name used in messages, ErrorInfo metadata and evidence.
Converters map by that name, so a Python member without a proto value fails
at import, and tests/runtime/test_wire_names.py checks the other direction.

Which gates a seed requires is decided by the seedstore alone
(`agentsidecar.seedstore_service.ranking.seed_gates`, see docs/ranking-and-gates.md);
everything else reads the `required_gates` it sends.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["SET_CAPABILITY_NAMES", "Gate", "GateValue", "Risk", "RiskValue", "UnknownGate", "UnknownRisk"]


class Gate(enum.Enum):
    """An approval a caller gives before a seed may be used, in the order gates are listed."""

    PROVIDER_COST_APPROVAL = "provider_cost_approval"
    EXTERNAL_SERVICE_APPROVAL = "external_service_approval"
    SECRET_USE_APPROVAL = "secret_use_approval"


class Risk(enum.Enum):
    """A risk a seed declares, in the order risks are listed."""

    EXTERNAL_SERVICE = "external_service"
    MAY_COST_MONEY = "may_cost_money"


@dataclass(frozen=True, slots=True)
class UnknownGate:
    """A gate enum number this build has no member for.

    It is kept wherever gates are listed, shown under `value`, and never
    approvable: a caller can only approve gates it can name, so a run that
    requires one is refused with this gate among the missing ones.
    """

    number: int

    @property
    def value(self) -> str:
        return f"unknown_gate_{self.number}"


@dataclass(frozen=True, slots=True)
class UnknownRisk:
    """A risk enum number this build has no member for: kept and shown under `value`."""

    number: int

    @property
    def value(self) -> str:
        return f"unknown_risk_{self.number}"


GateValue = Gate | UnknownGate
RiskValue = Risk | UnknownRisk


# The capability each typed set belongs to: a set member needs both. Keys are
# `TypedSet` wire names, values `Capability` wire names.
SET_CAPABILITY_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "mcp_transports": "mcp",
        "accepted_settings": "settings",
        "string_formats": "structured_output",
        "hook_events": "hooks",
        "effort_levels": "effort",
    }
)
