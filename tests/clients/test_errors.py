"""The exception tree: every reason both servers can send maps to its own class, decoded once."""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
import pytest

import clients
from clients import errors
from clients.errors import (
    AdapterFailureError,
    Gap,
    SidecarError,
    UnsupportedCapabilityError,
    class_for,
    from_decoded,
    from_rpc_error,
)
from clients.negotiator import refusal_gaps
from negotiator_service import errors as nerrors
from negotiator_service import status as nstatus
from negotiator_service.model import (
    Capability,
    CapabilityState,
    Decision,
    Requirement,
    TypedSet,
    Verdict,
)
from seedstore_service import errors as serrors
from seedstore_service import status as sstatus
from sidecar_runtime import auth, limits
from sidecar_runtime.richstatus import DecodedError, RichError


class RpcErrorImpl(grpc.RpcError, grpc.Call):
    """A failed call carrying a real grpc.Status built by the servers' own tables."""

    def __init__(self, status: grpc.Status) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return self._status.details

    def trailing_metadata(self) -> Any:
        return self._status.trailing_metadata

    def initial_metadata(self) -> Any:
        return ()


def sent(rich: RichError) -> SidecarError:
    """What a client raises for a status the server built from `rich`."""
    return from_rpc_error(RpcErrorImpl(rich.to_status()))


REFUSAL = Decision(
    adapter="shell-echo",
    declaration_version="sha256:abc",
    verdicts=(
        Verdict(Requirement(Capability.STRUCTURED_OUTPUT, "output_schema"), CapabilityState.UNSUPPORTED),
        Verdict(Requirement(Capability.PERSONA, "options.persona"), CapabilityState.UNKNOWN),
        Verdict(
            Requirement(Capability.SETTINGS, "options.settings.seed", TypedSet.ACCEPTED_SETTINGS, "seed"),
            CapabilityState.UNSUPPORTED,
        ),
        Verdict(
            Requirement(Capability.MODEL_OVERRIDE, "options.model"),
            CapabilityState.UNKNOWN,
            allowed_unknown=True,
        ),
    ),
)

# One instance of every class in the negotiator's table, and what a client must raise for it.
NEGOTIATOR_CASES: dict[type[nerrors.NegotiatorError], tuple[nerrors.NegotiatorError, type[SidecarError]]] = {
    nerrors.NegotiatorError: (nerrors.NegotiatorError("boom"), errors.InternalError),
    nerrors.InvalidRequest: (nerrors.InvalidRequest([("prompt", "empty")]), errors.InvalidArgumentError),
    nerrors.AdapterNotFound: (nerrors.AdapterNotFound("x"), errors.AdapterNotFoundError),
    nerrors.AdapterKindMismatch: (
        nerrors.AdapterKindMismatch("shell-echo", "agent-harness", "adapter"),
        errors.AdapterKindMismatchError,
    ),
    nerrors.UnsupportedCapability: (
        nerrors.UnsupportedCapability(REFUSAL),
        errors.UnsupportedCapabilityError,
    ),
    nerrors.AdapterAlreadyExists: (nerrors.AdapterAlreadyExists("x"), errors.AlreadyExistsError),
    nerrors.AdapterNotRemovable: (nerrors.AdapterNotRemovable("demo"), errors.AdapterNotRemovableError),
    nerrors.ConfigError: (nerrors.ConfigError("bad"), errors.InvalidArgumentError),
    nerrors.AdapterRegistrationFailed: (
        nerrors.AdapterRegistrationFailed("unix:/x", "no declaration"),
        errors.AdapterRegistrationFailedError,
    ),
    nerrors.OutputSchemaViolation: (
        nerrors.OutputSchemaViolation("bad-output", [("/summary", "42 is not of type 'string'")]),
        errors.OutputSchemaViolationError,
    ),
    nerrors.AdapterFailure: (nerrors.AdapterFailure("x", "crashed"), errors.AdapterInternalError),
    nerrors.AdapterUnavailable: (nerrors.AdapterUnavailable("x", "gone"), errors.AdapterUnavailableError),
    nerrors.AdapterTimeout: (nerrors.AdapterTimeout("x", "late"), errors.AdapterTimeoutError),
    nerrors.AdapterRateLimited: (
        nerrors.AdapterRateLimited("x", "slow down", retry_after=2.5),
        errors.AdapterRateLimitedError,
    ),
    nerrors.AdapterRefused: (nerrors.AdapterRefused("x", "no"), errors.AdapterRefusedError),
    nerrors.AdapterMisconfigured: (
        nerrors.AdapterMisconfigured("x", "no key"),
        errors.AdapterMisconfiguredError,
    ),
    nerrors.AdapterInternal: (nerrors.AdapterInternal("x", "bug"), errors.AdapterInternalError),
    nerrors.NotImplementedYet: (nerrors.NotImplementedYet("options.hooks"), errors.UnimplementedError),
    nerrors.ConversationBusy: (nerrors.ConversationBusy("c1"), errors.ConversationBusyError),
    nerrors.DeclarationChanged: (
        nerrors.DeclarationChanged("c1", "demo", "sha256:old", "sha256:new"),
        errors.DeclarationChangedError,
    ),
    nerrors.ConversationAdapterMismatch: (
        nerrors.ConversationAdapterMismatch("c1", "demo", "other"),
        errors.ConversationAdapterMismatchError,
    ),
    nerrors.ConversationStateCorrupt: (
        nerrors.ConversationStateCorrupt("c1", "bad json"),
        errors.DataLossError,
    ),
    nerrors.ConversationStoreFailed: (
        nerrors.ConversationStoreFailed("c1", "disk full"),
        errors.InternalError,
    ),
    nerrors.DelegationDepthExceeded: (
        nerrors.DelegationDepthExceeded(3, 2, "options.max_depth.depth"),
        errors.DelegationDepthExceededError,
    ),
    nerrors.AuditWatcherDropped: (nerrors.AuditWatcherDropped(1000), errors.AuditWatcherDroppedError),
}

SEEDSTORE_CASES: dict[type[serrors.SeedStoreError], tuple[serrors.SeedStoreError, type[SidecarError]]] = {
    serrors.SeedStoreError: (serrors.SeedStoreError("boom"), errors.InternalError),
    serrors.InvalidArgument: (
        serrors.InvalidArgument("priority too high", "priority"),
        errors.InvalidArgumentError,
    ),
    serrors.InvalidIdentifier: (
        serrors.InvalidIdentifier("Bad", "capability id"),
        errors.InvalidArgumentError,
    ),
    serrors.SeedNotFound: (serrors.SeedNotFound("nope"), errors.SeedNotFoundError),
    serrors.AmbiguousSeed: (
        serrors.AmbiguousSeed("twin", ["/a/twin.yml", "/b/twin.yml"]),
        errors.AmbiguousSeedError,
    ),
    serrors.SeedMalformed: (
        serrors.SeedMalformed("/s/voice/x.yml", 3, "bad indent"),
        errors.SeedMalformedError,
    ),
    serrors.RevisionMismatch: (serrors.RevisionMismatch("say", "r1", "r2"), errors.RevisionConflictError),
    serrors.StoreUnavailable: (serrors.StoreUnavailable("read-only"), errors.StoreUnavailableError),
}


def test_the_cases_cover_every_row_of_both_status_tables() -> None:
    assert set(NEGOTIATOR_CASES) == set(nstatus.STATUS_TABLE)
    assert set(SEEDSTORE_CASES) == set(sstatus.STATUS_TABLE)


@pytest.mark.parametrize(
    ("error", "expected"), list(NEGOTIATOR_CASES.values()), ids=lambda v: type(v).__name__
)
def test_every_negotiator_reason_maps_to_its_own_class(
    error: nerrors.NegotiatorError, expected: type[SidecarError]
) -> None:
    rich = nstatus.to_rich_error(error)
    raised = sent(rich)
    assert type(raised) is expected
    assert (raised.code, raised.reason) == (rich.code, rich.reason)
    # Chosen by its reason, not by falling back on the status code alone.
    assert class_for(rich.code, rich.reason) is expected
    assert rich.reason in expected.reasons
    assert expected.grpc_code == rich.code


@pytest.mark.parametrize(
    ("error", "expected"), list(SEEDSTORE_CASES.values()), ids=lambda v: type(v).__name__
)
def test_every_seedstore_reason_maps_to_its_own_class(
    error: serrors.SeedStoreError, expected: type[SidecarError]
) -> None:
    rich = sstatus.to_rich_error(error)
    raised = sent(rich)
    assert type(raised) is expected
    assert rich.reason in expected.reasons
    assert class_for(rich.code, rich.reason) is expected


@pytest.mark.parametrize(
    ("rich", "expected"),
    [
        (auth.missing_token("AddSeed"), errors.UnauthenticatedError),
        (auth.invalid_token("AddSeed"), errors.PermissionDeniedError),
        (limits.too_many_calls(64), errors.ResourceExhaustedError),
        (limits.default_timeout_exceeded(30), errors.DeadlineExceededError),
    ],
    ids=lambda v: getattr(v, "reason", ""),
)
def test_the_runtime_reasons_shared_by_both_sidecars_map_too(
    rich: RichError, expected: type[SidecarError]
) -> None:
    raised = sent(rich)
    assert type(raised) is expected
    assert class_for(rich.code, rich.reason) is expected
    assert rich.reason in expected.reasons


def test_a_refusal_carries_typed_gaps_adapter_and_version() -> None:
    raised = sent(nstatus.to_rich_error(nerrors.UnsupportedCapability(REFUSAL)))
    assert isinstance(raised, UnsupportedCapabilityError)
    assert raised.gaps == (
        Gap("structured_output", None, None, "output_schema", "unsupported"),
        Gap("persona", None, None, "options.persona", "unknown"),
        Gap("settings", "accepted_settings", "seed", "options.settings.seed", "unsupported"),
    )
    assert (raised.adapter, raised.declaration_version) == ("shell-echo", "sha256:abc")
    assert raised.allowed_unknown == ("model_override",)
    # The CLI's helper and JSON shape keep working on the new class.
    assert refusal_gaps(raised) == list(raised.gaps)
    assert dataclasses.asdict(raised.gaps[2]) == {
        "capability": "settings",
        "set": "accepted_settings",
        "member": "seed",
        "request_field": "options.settings.seed",
        "state": "unsupported",
    }


def test_typed_details_of_the_other_errors() -> None:
    ambiguous = sent(sstatus.to_rich_error(SEEDSTORE_CASES[serrors.AmbiguousSeed][0]))
    assert isinstance(ambiguous, errors.AmbiguousSeedError)
    assert (ambiguous.seed_id, ambiguous.paths) == ("twin", ("/a/twin.yml", "/b/twin.yml"))

    malformed = sent(sstatus.to_rich_error(SEEDSTORE_CASES[serrors.SeedMalformed][0]))
    assert isinstance(malformed, errors.SeedMalformedError)
    assert (malformed.path, malformed.line, malformed.detail) == ("/s/voice/x.yml", 3, "bad indent")

    conflict = sent(sstatus.to_rich_error(SEEDSTORE_CASES[serrors.RevisionMismatch][0]))
    assert isinstance(conflict, errors.RevisionConflictError)
    assert (conflict.seed_id, conflict.expected, conflict.actual) == ("say", "r1", "r2")

    invalid = sent(sstatus.to_rich_error(SEEDSTORE_CASES[serrors.InvalidIdentifier][0]))
    assert isinstance(invalid, errors.InvalidArgumentError)
    assert invalid.fields == ("id",)

    limited = sent(nstatus.to_rich_error(NEGOTIATOR_CASES[nerrors.AdapterRateLimited][0]))
    assert isinstance(limited, errors.ResourceExhaustedError)
    assert isinstance(limited, AdapterFailureError)
    assert (limited.retry_after, limited.adapter, limited.cause) == (2.5, "x", "slow down")

    output = sent(nstatus.to_rich_error(NEGOTIATOR_CASES[nerrors.OutputSchemaViolation][0]))
    assert isinstance(output, errors.OutputSchemaViolationError)
    assert output.violations == (errors.SchemaViolation("/summary", "42 is not of type 'string'"),)

    depth = sent(nstatus.to_rich_error(NEGOTIATOR_CASES[nerrors.DelegationDepthExceeded][0]))
    assert isinstance(depth, errors.DelegationDepthExceededError)
    assert (depth.attempted_depth, depth.max_depth, depth.limit) == (3, 2, "options.max_depth.depth")

    changed = sent(nstatus.to_rich_error(NEGOTIATOR_CASES[nerrors.DeclarationChanged][0]))
    assert isinstance(changed, errors.DeclarationChangedError)
    assert (changed.conversation_id, changed.pinned_version, changed.declaration_version) == (
        "c1",
        "sha256:old",
        "sha256:new",
    )

    other = sent(nstatus.to_rich_error(NEGOTIATOR_CASES[nerrors.ConversationAdapterMismatch][0]))
    assert isinstance(other, errors.ConversationAdapterMismatchError)
    assert (other.adapter, other.requested_adapter) == ("demo", "other")

    mismatch = sent(nstatus.to_rich_error(NEGOTIATOR_CASES[nerrors.AdapterKindMismatch][0]))
    assert isinstance(mismatch, errors.AdapterKindMismatchError)
    assert (mismatch.adapter, mismatch.kind, mismatch.selected_by) == (
        "shell-echo",
        "agent-harness",
        "adapter",
    )


def test_an_error_keeps_the_original_and_the_attributes_the_clis_read() -> None:
    original = RpcErrorImpl(nstatus.to_rich_error(nerrors.InvalidRequest([("prompt", "empty")])).to_status())
    raised = from_rpc_error(original)
    assert raised.original is original
    assert raised.code is grpc.StatusCode.INVALID_ARGUMENT
    assert raised.reason == "INVALID_REQUEST"
    assert raised.domain == "negotiator.agentsidecar"
    assert raised.metadata == {"fields": "prompt"}
    assert raised.field_violations == (("prompt", "empty"),)
    assert raised.precondition_violations == ()
    assert str(raised) == raised.message == "prompt: empty"
    assert SidecarError.from_rpc_error(original).__class__ is errors.InvalidArgumentError


def test_a_status_without_error_info_maps_by_code_alone() -> None:
    # What grpc itself reports when nothing listens: no ErrorInfo, no reason.
    unavailable = from_decoded(DecodedError(grpc.StatusCode.UNAVAILABLE, "failed to connect"))
    assert type(unavailable) is errors.UnavailableError
    assert unavailable.reason == ""
    unknown_reason = from_decoded(DecodedError(grpc.StatusCode.NOT_FOUND, "?", reason="SOMETHING_NEW"))
    assert type(unknown_reason) is errors.NotFoundError
    # A known reason under an unexpected code is trusted less than the code.
    assert type(from_decoded(DecodedError(grpc.StatusCode.INTERNAL, "?", reason="SEED_NOT_FOUND"))) is (
        errors.InternalError
    )
    assert type(from_decoded(DecodedError(grpc.StatusCode.CANCELLED, "cancelled"))) is SidecarError


def test_the_docstring_tree_names_every_class_and_the_package_exports_them() -> None:
    classes = {
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type) and issubclass(getattr(errors, name), SidecarError)
    }
    assert errors.__doc__ is not None
    assert {name for name in classes if name not in errors.__doc__} == set()
    assert classes <= set(clients.__all__)
    assert set(clients.__all__) == {name for name in dir(clients) if not name.startswith("_")} - {
        "aio",
        "channel",
        "errors",
        "negotiator",
        "seedstore",
    }
