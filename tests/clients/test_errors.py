"""The exception tree: every reason both servers can send maps to its own class, decoded once."""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
import pytest

from agentsidecar import clients
from agentsidecar.clients import errors
from agentsidecar.clients.errors import (
    AdapterFailureError,
    Gap,
    SidecarError,
    UnsupportedCapabilityError,
    class_for,
    from_decoded,
    from_rpc_error,
)
from agentsidecar.clients.negotiator import refusal_gaps
from agentsidecar.negotiator_service import errors as nerrors
from agentsidecar.negotiator_service import status as nstatus
from agentsidecar.negotiator_service.model import (
    Capability,
    CapabilityState,
    Decision,
    Requirement,
    TypedSet,
    Verdict,
)
from agentsidecar.seedstore_service import error_status
from agentsidecar.seedstore_service import errors as serrors
from agentsidecar.seedstore_service import status as sstatus
from agentsidecar.sidecar_runtime import auth, handlers, limits
from agentsidecar.sidecar_runtime.richstatus import DecodedError, RichError


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

# One instance of every concrete class of the negotiator's tree, and what a client must raise for it.
NEGOTIATOR_CASES: dict[type[nerrors.NegotiatorError], tuple[nerrors.NegotiatorError, type[SidecarError]]] = {
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
    nerrors.AdapterNotProbeable: (
        nerrors.AdapterNotProbeable("demo", "scripted"),
        errors.AdapterNotProbeableError,
    ),
    nerrors.ConfigError: (nerrors.ConfigError("bad"), errors.InvalidArgumentError),
    nerrors.AdapterRegistrationFailed: (
        nerrors.AdapterRegistrationFailed("unix:/x", "no declaration"),
        errors.AdapterRegistrationFailedError,
    ),
    nerrors.OutputSchemaViolation: (
        nerrors.OutputSchemaViolation("bad-output", [("/summary", "42 is not of type 'string'")]),
        errors.OutputSchemaViolationError,
    ),
    nerrors.AdapterTargetNotAllowed: (
        nerrors.AdapterTargetNotAllowed("10.0.0.1:80", "10.0.0.1"),
        errors.PermissionDeniedError,
    ),
    nerrors.ReplyTooLarge: (nerrors.ReplyTooLarge("x", 5000, 4096), errors.ResourceExhaustedError),
    nerrors.McpServerNotAllowed: (
        nerrors.McpServerNotAllowed("fs", "caller-stdio-command-allowlist", "not listed"),
        errors.PermissionDeniedError,
    ),
    nerrors.McpServerUnavailable: (
        nerrors.McpServerUnavailable("x", "exited", server="fs"),
        errors.AdapterUnavailableError,
    ),
    nerrors.McpServerTimeout: (
        nerrors.McpServerTimeout("x", "slow", server="fs"),
        errors.AdapterTimeoutError,
    ),
    nerrors.AdapterReplyTooLarge: (
        nerrors.AdapterReplyTooLarge("x", "trailers too long"),
        errors.AdapterInternalError,
    ),
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
    nerrors.RegistrationStoreFailed: (
        nerrors.RegistrationStoreFailed("a", "disk full"),
        errors.InternalError,
    ),
    nerrors.DelegationDepthExceeded: (
        nerrors.DelegationDepthExceeded(3, 2, "options.max_depth.depth"),
        errors.DelegationDepthExceededError,
    ),
    nerrors.AuditWatcherDropped: (nerrors.AuditWatcherDropped(1000), errors.AuditWatcherDroppedError),
    nerrors.ShuttingDown: (nerrors.ShuttingDown(), errors.UnavailableError),
    nerrors.SeedstoreNotConfigured: (nerrors.SeedstoreNotConfigured(), errors.FailedPreconditionError),
    nerrors.SeedstoreUnavailable: (
        nerrors.SeedstoreUnavailable("unix:/run/seedstore.sock", "UNAVAILABLE: connection refused"),
        errors.UnavailableError,
    ),
    nerrors.SeedstoreRefused: (
        nerrors.SeedstoreRefused("unix:/run/seedstore.sock", "FAILED_PRECONDITION", "SEED_MALFORMED", "bad"),
        errors.FailedPreconditionError,
    ),
    nerrors.NoSeedFound: (
        nerrors.NoSeedFound(
            "say", "voice", [("say", "voice"), ("speak", "voice"), ("say", None)], "ask first"
        ),
        errors.NoSeedFoundError,
    ),
    nerrors.SeedNotACandidate: (
        nerrors.SeedNotACandidate("voice/other", "say", ["voice/say", "voice/espeak"]),
        errors.FailedPreconditionError,
    ),
    nerrors.AskPolicyRequiresChoice: (
        nerrors.AskPolicyRequiresChoice(
            "say", "top_candidates_within_10_points", [("voice/say", 90), ("voice/espeak", 85)]
        ),
        errors.SeedChoiceRequiredError,
    ),
    nerrors.GatesNotApproved: (
        nerrors.GatesNotApproved(
            "voice/cloud-tts",
            ["provider_cost_approval", "secret_use_approval"],
            ["secret_use_approval"],
        ),
        errors.GatesNotApprovedError,
    ),
    nerrors.SeedNotVerified: (
        nerrors.SeedNotVerified("voice/say", "unverified"),
        errors.SeedNotVerifiedError,
    ),
    nerrors.SeedHasNoCommand: (
        nerrors.SeedHasNoCommand("voice/say", "the seed has no command"),
        errors.SeedCommandError,
    ),
    nerrors.SeedCommandNotFound: (
        nerrors.SeedCommandNotFound("voice/say", "say-it", "not on PATH"),
        errors.SeedCommandError,
    ),
    nerrors.SeedCommandFailed: (
        nerrors.SeedCommandFailed("voice/say", "permission denied"),
        errors.SeedCommandError,
    ),
    nerrors.SeedCommandTimeout: (
        nerrors.SeedCommandTimeout("voice/say", 2.5, "the caller's deadline"),
        errors.DeadlineExceededError,
    ),
}

SEEDSTORE_CASES: dict[type[serrors.SeedStoreError], tuple[serrors.SeedStoreError, type[SidecarError]]] = {
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
    serrors.OutsideStore: (
        serrors.OutsideStore("/s/voice/x.yml", "/s"),
        errors.FailedPreconditionError,
    ),
    serrors.WatchBacklogExceeded: (serrors.WatchBacklogExceeded(9_000_000, 8_388_608), errors.AbortedError),
}


# What the runtime layers (auth, limits, request decoding) send on behalf of either sidecar.
RUNTIME_CASES: list[tuple[RichError, type[SidecarError]]] = [
    (auth.missing_token("AddSeed"), errors.UnauthenticatedError),
    (auth.invalid_token("AddSeed"), errors.PermissionDeniedError),
    (limits.too_many_calls(64), errors.ResourceExhaustedError),
    (limits.default_timeout_exceeded(30), errors.DeadlineExceededError),
    (
        handlers.malformed_request(
            "/agentsidecar.negotiator.v1.NegotiatorService/Invoke",
            "agentsidecar.negotiator.v1.InvokeRequest",
            ValueError("Error parsing message"),
        ),
        errors.InvalidArgumentError,
    ),
]


def concrete(base: type[Any]) -> set[type[Any]]:
    found, todo = set(), [base]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not cls.abstract:
            found.add(cls)
    return found


def test_the_cases_cover_every_row_of_both_status_tables() -> None:
    assert set(NEGOTIATOR_CASES) == concrete(nerrors.NegotiatorError)
    assert set(SEEDSTORE_CASES) == concrete(serrors.SeedStoreError)
    # ...and every row of both tables serves one of them (the abstract bases are never raised).
    assert all(any(issubclass(case, row) for case in NEGOTIATOR_CASES) for row in nstatus.STATUS_TABLE)
    assert all(any(issubclass(case, row) for case in SEEDSTORE_CASES) for row in error_status.STATUS_TABLE)
    assert {(rich.domain, rich.reason) for rich, _ in RUNTIME_CASES} == {
        (auth.DOMAIN, auth.TOKEN_MISSING),
        (auth.DOMAIN, auth.TOKEN_INVALID),
        (limits.DOMAIN, limits.TOO_MANY_CALLS),
        (limits.DOMAIN, limits.DEFAULT_TIMEOUT_EXCEEDED),
        (handlers.DOMAIN, handlers.MALFORMED_REQUEST),
    }


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


@pytest.mark.parametrize(("rich", "expected"), RUNTIME_CASES, ids=lambda v: getattr(v, "reason", ""))
def test_the_runtime_reasons_shared_by_both_sidecars_map_too(
    rich: RichError, expected: type[SidecarError]
) -> None:
    raised = sent(rich)
    assert type(raised) is expected
    assert (raised.domain, raised.reason) == (rich.domain, rich.reason)
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

    malformed_request = sent(RUNTIME_CASES[-1][0])
    assert isinstance(malformed_request, errors.InvalidArgumentError)
    assert malformed_request.fields == ("request",)
    assert malformed_request.metadata["messageType"] == "agentsidecar.negotiator.v1.InvokeRequest"

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

    busy = sent(nstatus.to_rich_error(NEGOTIATOR_CASES[nerrors.ConversationBusy][0]))
    assert isinstance(busy, errors.ConversationBusyError)
    assert isinstance(busy, errors.AbortedError)  # retried like any other conflict
    assert busy.conversation_id == "c1"

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


def bootstrap_error(cls: type[nerrors.NegotiatorError]) -> SidecarError:
    return sent(nstatus.to_rich_error(NEGOTIATOR_CASES[cls][0]))


def test_bootstrap_refusals_carry_what_the_caller_asks_the_user_about() -> None:
    nothing = bootstrap_error(nerrors.NoSeedFound)
    assert isinstance(nothing, errors.NoSeedFoundError)
    assert (nothing.capability, nothing.domain, nothing.fallback_policy) == ("say", "voice", "ask first")
    assert nothing.searches == ("say@voice", "speak@voice", "say")

    tied = bootstrap_error(nerrors.AskPolicyRequiresChoice)
    assert isinstance(tied, errors.SeedChoiceRequiredError)
    assert tied.candidates == ("voice/say", "voice/espeak")
    assert (tied.capability, tied.ask_policy) == ("say", "top_candidates_within_10_points")

    gated = bootstrap_error(nerrors.GatesNotApproved)
    assert isinstance(gated, errors.GatesNotApprovedError)
    assert gated.seed == "voice/cloud-tts"
    assert gated.required_gates == ("provider_cost_approval", "secret_use_approval")
    assert gated.missing_gates == ("secret_use_approval",)

    unverified = bootstrap_error(nerrors.SeedNotVerified)
    assert isinstance(unverified, errors.SeedNotVerifiedError)
    assert (unverified.seed, unverified.verification_status) == ("voice/say", "unverified")


def test_the_seed_command_errors_share_a_class_and_differ_by_reason() -> None:
    raised = {
        cls: bootstrap_error(cls)
        for cls in (nerrors.SeedHasNoCommand, nerrors.SeedCommandNotFound, nerrors.SeedCommandFailed)
    }
    assert {error.reason for error in raised.values()} == set(errors.SeedCommandError.reasons)
    missing = raised[nerrors.SeedCommandNotFound]
    assert isinstance(missing, errors.SeedCommandError)
    assert (missing.seed, missing.program, missing.cause) == ("voice/say", "say-it", "not on PATH")
    failed = raised[nerrors.SeedCommandFailed]
    assert isinstance(failed, errors.SeedCommandError)
    assert (failed.program, failed.cause) == ("", "permission denied")

    timeout = bootstrap_error(nerrors.SeedCommandTimeout)
    assert (timeout.reason, timeout.metadata["seed"], timeout.metadata["timeoutSeconds"]) == (
        "SEED_COMMAND_TIMEOUT",
        "voice/say",
        "2.5",
    )
    # The seedstore's own unavailability is retried like any other.
    assert isinstance(bootstrap_error(nerrors.SeedstoreUnavailable), errors.UnavailableError)
    refused = bootstrap_error(nerrors.SeedstoreRefused)
    assert (refused.metadata["seedstoreCode"], refused.metadata["seedstoreReason"]) == (
        "FAILED_PRECONDITION",
        "SEED_MALFORMED",
    )


def test_metadata_attributes_fall_back_to_empty_values_and_are_read_only() -> None:
    # An older server may leave a key out, or send a count that is not one: the attribute is
    # then the type's empty value, never an exception while handling the error.
    bare = from_decoded(DecodedError(grpc.StatusCode.FAILED_PRECONDITION, "?", reason="SEED_MALFORMED"))
    assert isinstance(bare, errors.SeedMalformedError)
    assert (bare.path, bare.line, bare.detail) == ("", 0, "")
    odd = from_decoded(
        DecodedError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "?",
            reason="GATES_NOT_APPROVED",
            metadata={"seed": "voice/say", "requiredGates": "", "missingGates": "secret_use_approval"},
        )
    )
    assert isinstance(odd, errors.GatesNotApprovedError)
    assert (odd.seed, odd.required_gates, odd.missing_gates) == ("voice/say", (), ("secret_use_approval",))
    deep = from_decoded(
        DecodedError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "?",
            reason="DELEGATION_DEPTH_EXCEEDED",
            metadata={"attemptedDepth": "three", "maxDepth": "-1"},
        )
    )
    assert isinstance(deep, errors.DelegationDepthExceededError)
    assert (deep.attempted_depth, deep.max_depth, deep.limit) == (0, 0, "")

    with pytest.raises(AttributeError):
        setattr(odd, "seed", "voice/other")  # noqa: B010 - the static checker already forbids the plain form
    assert odd.seed == "voice/say"
    # An attribute read on a subclass comes from the same metadata as on its mixin.
    refused = from_decoded(
        DecodedError(
            grpc.StatusCode.FAILED_PRECONDITION, "?", reason="ADAPTER_REFUSED", metadata={"adapter": "a"}
        )
    )
    assert isinstance(refused, errors.AdapterRefusedError)
    assert (refused.adapter, refused.cause) == ("a", "")
