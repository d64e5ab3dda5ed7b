"""The negotiator's error taxonomy. No grpc here: `status.py` maps it once.

NegotiatorError
├── InvalidRequest              malformed request; names each bad field
├── AdapterNotFound             no adapter with that shortname
├── AdapterKindMismatch         `adapter` names a harness or `agent` a framework
├── UnsupportedCapability       the declaration cannot honour the call (every gap)
├── AdapterAlreadyExists        register with a shortname already taken
├── AdapterNotRemovable         deregister of a config-defined adapter
├── ConfigError                 bad config file, or config widening a declaration
├── AdapterRegistrationFailed   a remote adapter's declaration is missing or invalid
├── OutputSchemaViolation       the adapter's output broke the schema
└── AdapterFailure              the adapter failed while running
    ├── AdapterUnavailable      cannot reach it, or it answered garbage it may not repeat
    ├── AdapterTimeout          the caller's time ran out
    ├── AdapterRateLimited      the provider throttled us
    ├── AdapterRefused          the adapter itself refused at its edge
    ├── AdapterMisconfigured    the adapter's own setup is wrong (credentials, binary)
    └── AdapterInternal         anything else; the cause is named
"""

from __future__ import annotations

from collections.abc import Sequence

from negotiator_service.model import Decision


class NegotiatorError(Exception):
    """Base of every negotiator error. `reason` is the ErrorInfo reason."""

    reason = "NEGOTIATOR_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(NegotiatorError):
    reason = "INVALID_REQUEST"

    def __init__(self, violations: Sequence[tuple[str, str]]) -> None:
        """`violations` are (field path, description) pairs."""
        self.violations = tuple(violations)
        super().__init__("; ".join(f"{f}: {d}" for f, d in self.violations))


class AdapterNotFound(NegotiatorError):
    reason = "ADAPTER_NOT_FOUND"

    def __init__(self, shortname: str) -> None:
        super().__init__(f'no adapter named "{shortname}"')
        self.shortname = shortname


class AdapterKindMismatch(NegotiatorError):
    reason = "ADAPTER_KIND_MISMATCH"

    def __init__(self, shortname: str, kind: str, selected_by: str) -> None:
        expected = "agent-framework" if selected_by == "adapter" else "agent-harness"
        super().__init__(f'"{shortname}" is an {kind}; `{selected_by}` selects {expected} adapters only')
        self.shortname = shortname
        self.kind = kind
        self.selected_by = selected_by


class UnsupportedCapability(NegotiatorError):
    reason = "UNSUPPORTED_CAPABILITY"

    def __init__(self, decision: Decision) -> None:
        gaps = ", ".join(f"{g.requirement.describe()} ({g.state.value})" for g in decision.gaps)
        super().__init__(f'adapter "{decision.adapter}" cannot honour this call: {gaps}')
        self.decision = decision


class AdapterAlreadyExists(NegotiatorError):
    reason = "ADAPTER_ALREADY_EXISTS"

    def __init__(self, shortname: str) -> None:
        super().__init__(f'an adapter named "{shortname}" is already registered')
        self.shortname = shortname


class AdapterNotRemovable(NegotiatorError):
    reason = "ADAPTER_NOT_REMOVABLE"

    def __init__(self, shortname: str) -> None:
        super().__init__(f'adapter "{shortname}" comes from the config file; edit the config instead')
        self.shortname = shortname


class ConfigError(NegotiatorError):
    reason = "CONFIG_INVALID"


class AdapterRegistrationFailed(NegotiatorError):
    """A remote adapter answered, but with a declaration that cannot be registered."""

    reason = "ADAPTER_REGISTRATION_FAILED"

    def __init__(self, target: str, cause: str, shortname: str = "") -> None:
        named = f'adapter "{shortname}" at {target}' if shortname else f"the adapter at {target}"
        super().__init__(f"cannot register {named}: {cause}")
        self.target = target
        self.cause = cause
        self.shortname = shortname


class NotImplementedYet(NegotiatorError):
    """A field or RPC of the contract this version does not implement: refused, never ignored."""

    reason = "NOT_IMPLEMENTED"

    def __init__(self, feature: str) -> None:
        super().__init__(f"{feature} is not implemented by this negotiator version")
        self.feature = feature


class OutputSchemaViolation(NegotiatorError):
    reason = "OUTPUT_SCHEMA_VIOLATION"

    def __init__(self, adapter: str, violations: Sequence[tuple[str, str]]) -> None:
        """`violations` are (JSON pointer into the output, message) pairs."""
        self.adapter = adapter
        self.violations = tuple(violations)
        listed = "; ".join(f"{p or '/'}: {m}" for p, m in self.violations)
        super().__init__(f'adapter "{adapter}" returned output that violates the schema: {listed}')


class AdapterFailure(NegotiatorError):
    reason = "ADAPTER_FAILED"

    def __init__(self, adapter: str, cause: str) -> None:
        super().__init__(f'adapter "{adapter}" failed: {cause}')
        self.adapter = adapter
        self.cause = cause


class AdapterUnavailable(AdapterFailure):
    reason = "ADAPTER_UNAVAILABLE"


class AdapterTimeout(AdapterFailure):
    reason = "ADAPTER_TIMEOUT"


class AdapterRateLimited(AdapterFailure):
    reason = "ADAPTER_RATE_LIMITED"

    def __init__(self, adapter: str, cause: str, retry_after: float | None = None) -> None:
        """`retry_after` is the provider's hint in seconds, when it gave one."""
        super().__init__(adapter, cause)
        self.retry_after = retry_after


class AdapterRefused(AdapterFailure):
    reason = "ADAPTER_REFUSED"


class AdapterMisconfigured(AdapterFailure):
    reason = "ADAPTER_MISCONFIGURED"


class AdapterInternal(AdapterFailure):
    reason = "ADAPTER_INTERNAL"
