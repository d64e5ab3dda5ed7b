"""The status table: every error in the taxonomy has a row, and the rows carry the right details."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.model import (
    Capability,
    CapabilityState,
    Decision,
    Requirement,
    TypedSet,
    Verdict,
)
from agentsidecar.negotiator_service.status import DOMAIN, STATUS_TABLE, to_rich_error, unexpected_error


def all_subclasses(cls: type[errors.NegotiatorError]) -> list[type[errors.NegotiatorError]]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(all_subclasses(sub))
    return found


def error_tree() -> list[type[errors.NegotiatorError]]:
    """The whole tree, its root included."""
    return [errors.NegotiatorError, *all_subclasses(errors.NegotiatorError)]


def concrete_errors() -> list[type[errors.NegotiatorError]]:
    """The classes that are raised: every class of the tree but its abstract bases."""
    return [cls for cls in all_subclasses(errors.NegotiatorError) if not cls.abstract]


def sample(cls: type[errors.NegotiatorError]) -> errors.NegotiatorError:
    """One instance of each error class."""
    samples: dict[type[errors.NegotiatorError], errors.NegotiatorError] = {
        errors.InvalidRequest: errors.InvalidRequest([("prompt", "must not be empty")]),
        errors.AdapterNotFound: errors.AdapterNotFound("ghost"),
        errors.AdapterKindMismatch: errors.AdapterKindMismatch("h", "agent-harness", "adapter"),
        errors.UnsupportedCapability: errors.UnsupportedCapability(
            Decision(
                "a", "sha256:1", (Verdict(Requirement(Capability.PERSONA, "options.persona"), UNSUPPORTED),)
            )
        ),
        errors.AdapterAlreadyExists: errors.AdapterAlreadyExists("a"),
        errors.AdapterNotRemovable: errors.AdapterNotRemovable("a"),
        errors.AdapterNotProbeable: errors.AdapterNotProbeable("a", "scripted"),
        errors.ConfigError: errors.ConfigError("bad config"),
        errors.AdapterRegistrationFailed: errors.AdapterRegistrationFailed("unix:/x", "no declaration", "a"),
        errors.AdapterTargetNotAllowed: errors.AdapterTargetNotAllowed("10.0.0.1:80", "10.0.0.1"),
        errors.McpServerNotAllowed: errors.McpServerNotAllowed("fs", "caller-host-allowlist", "not allowed"),
        errors.OutputSchemaViolation: errors.OutputSchemaViolation("a", [("/name", "42 is not a string")]),
        errors.ReplyTooLarge: errors.ReplyTooLarge("a", 5_000_000, 4_194_304),
        errors.AdapterRateLimited: errors.AdapterRateLimited("a", "slow down", retry_after=1.5),
        errors.DelegationDepthExceeded: errors.DelegationDepthExceeded(2, 1, "options.max_depth.depth"),
        errors.AuditWatcherDropped: errors.AuditWatcherDropped(1000),
        errors.ShuttingDown: errors.ShuttingDown(),
        errors.ConversationBusy: errors.ConversationBusy("c1"),
        errors.DeclarationChanged: errors.DeclarationChanged("c1", "a", "sha256:1", "sha256:2"),
        errors.ConversationAdapterMismatch: errors.ConversationAdapterMismatch("c1", "a", "b"),
        errors.ConversationStateCorrupt: errors.ConversationStateCorrupt("c1", "not JSON"),
        errors.ConversationStoreFailed: errors.ConversationStoreFailed("c1", "disk full"),
        errors.RegistrationStoreFailed: errors.RegistrationStoreFailed("a", "disk full"),
        errors.SeedstoreNotConfigured: errors.SeedstoreNotConfigured(),
        errors.SeedstoreUnavailable: errors.SeedstoreUnavailable("unix:/s.sock", "connection refused"),
        errors.SeedstoreRefused: errors.SeedstoreRefused(
            "unix:/s.sock", "NOT_FOUND", "SEED_NOT_FOUND", "gone"
        ),
        errors.NoSeedFound: errors.NoSeedFound(
            "voice", "voice", [("voice", "voice"), ("voice", "audio")], "ask first"
        ),
        errors.SeedNotACandidate: errors.SeedNotACandidate("voice/x", "voice", ["voice/say"]),
        errors.AskPolicyRequiresChoice: errors.AskPolicyRequiresChoice(
            "voice", "top_candidates_within_10_points", [("voice/a", 60), ("voice/b", 55)]
        ),
        errors.GatesNotApproved: errors.GatesNotApproved(
            "voice/say",
            ["provider_cost_approval", "external_service_approval"],
            ["external_service_approval"],
        ),
        errors.SeedNotVerified: errors.SeedNotVerified("voice/say", "unverified"),
        errors.SeedHasNoCommand: errors.SeedHasNoCommand("voice/say", "it declares no command"),
        errors.SeedCommandNotFound: errors.SeedCommandNotFound("voice/say", "say-cli", "No such file"),
        errors.SeedCommandFailed: errors.SeedCommandFailed("voice/say", "Permission denied"),
        errors.SeedCommandTimeout: errors.SeedCommandTimeout("voice/say", 2.5, "the caller's time budget"),
    }
    if cls in samples:
        return samples[cls]
    if issubclass(cls, errors.AdapterFailure):
        return cls("a", "it broke")
    raise AssertionError(f"add a sample for {cls.__name__}")


UNSUPPORTED = CapabilityState.UNSUPPORTED
UNKNOWN = CapabilityState.UNKNOWN

EXPECTED_CODES = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.AdapterNotFound: grpc.StatusCode.NOT_FOUND,
    errors.AdapterKindMismatch: grpc.StatusCode.FAILED_PRECONDITION,
    errors.UnsupportedCapability: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AdapterAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.AdapterNotRemovable: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AdapterNotProbeable: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.AdapterRegistrationFailed: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AdapterTargetNotAllowed: grpc.StatusCode.PERMISSION_DENIED,
    errors.McpServerNotAllowed: grpc.StatusCode.PERMISSION_DENIED,
    errors.McpServerUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.McpServerTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.OutputSchemaViolation: grpc.StatusCode.INTERNAL,
    errors.ReplyTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.DelegationDepthExceeded: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AuditWatcherDropped: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ShuttingDown: grpc.StatusCode.UNAVAILABLE,
    errors.ConversationBusy: grpc.StatusCode.ABORTED,
    errors.DeclarationChanged: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ConversationAdapterMismatch: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ConversationStateCorrupt: grpc.StatusCode.DATA_LOSS,
    errors.ConversationStoreFailed: grpc.StatusCode.INTERNAL,
    errors.RegistrationStoreFailed: grpc.StatusCode.INTERNAL,
    errors.AdapterUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.AdapterTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.AdapterRateLimited: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.AdapterReplyTooLarge: grpc.StatusCode.INTERNAL,
    errors.AdapterRefused: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AdapterMisconfigured: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AdapterInternal: grpc.StatusCode.INTERNAL,
    errors.SeedstoreNotConfigured: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SeedstoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.SeedstoreRefused: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NoSeedFound: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SeedNotACandidate: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AskPolicyRequiresChoice: grpc.StatusCode.FAILED_PRECONDITION,
    errors.GatesNotApproved: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SeedNotVerified: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SeedHasNoCommand: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SeedCommandNotFound: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SeedCommandFailed: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SeedCommandTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def test_the_table_is_complete() -> None:
    """Every concrete class reaches a row, every base is abstract, every row is a class of the tree."""
    tree = error_tree()
    assert len(concrete_errors()) >= 15
    unmapped = [c.__name__ for c in concrete_errors() if not any(k in STATUS_TABLE for k in c.__mro__)]
    assert unmapped == []
    concrete_bases = [c.__name__ for c in tree if c.__subclasses__() and not c.abstract]
    assert concrete_bases == []
    assert set(STATUS_TABLE) <= set(tree)
    assert {c.__name__ for c in tree if c.abstract} == {
        "NegotiatorError",
        "CallerError",
        "StoreError",
        "UpstreamError",
        "AdapterFailure",
        "SeedRefusal",
        "WatchEnded",
    }


@pytest.mark.parametrize("base", [c for c in error_tree() if c.abstract], ids=lambda c: c.__name__)
def test_a_base_cannot_be_raised(base: type[errors.NegotiatorError]) -> None:
    arguments = ("a", "it broke") if issubclass(base, errors.AdapterFailure) else ("boom",)
    with pytest.raises(TypeError, match=f"{base.__name__} is abstract"):
        raise base(*arguments)


@pytest.mark.parametrize("cls", concrete_errors(), ids=lambda c: c.__name__)
def test_each_error_maps_to_its_code_with_error_info(cls: type[errors.NegotiatorError]) -> None:
    error = sample(cls)
    rich = to_rich_error(error)
    assert rich.code is EXPECTED_CODES[cls]
    assert rich.code is not grpc.StatusCode.UNKNOWN
    assert rich.reason == cls.reason
    assert rich.domain == DOMAIN
    assert rich.message == error.message


@pytest.mark.parametrize(
    "cls", [c for c in all_subclasses(errors.AdapterFailure) if not c.abstract], ids=lambda c: c.__name__
)
def test_adapter_failures_name_adapter_and_cause(cls: type[errors.AdapterFailure]) -> None:
    rich = to_rich_error(sample(cls))
    assert rich.metadata["adapter"] == "a"
    assert rich.metadata["cause"] in ("it broke", "slow down")


def test_rate_limited_carries_retry_info_only_when_known() -> None:
    with_hint = to_rich_error(errors.AdapterRateLimited("a", "slow", retry_after=1.5))
    assert with_hint.retry_after_seconds == 1.5
    assert with_hint.metadata["retryAfterSeconds"] == "1.5"
    status = rpc_status_of(with_hint.to_status())
    retry = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(retry) == 1
    without = to_rich_error(errors.AdapterRateLimited("a", "slow"))
    assert without.retry_after_seconds is None
    assert "retryAfterSeconds" not in without.metadata


def rpc_status_of(status: grpc.Status) -> status_pb2.Status:
    trailer = dict(status.trailing_metadata)[rpc_status.GRPC_DETAILS_METADATA_KEY]  # type: ignore[attr-defined]
    return status_pb2.Status.FromString(trailer)


def test_unsupported_capability_lists_every_gap_once() -> None:
    decision = Decision(
        "fw",
        "sha256:abc",
        (
            Verdict(Requirement(Capability.MODEL_OVERRIDE, "options.model"), CapabilityState.SUPPORTED),
            Verdict(Requirement(Capability.PERSONA, "options.persona"), UNSUPPORTED),
            Verdict(
                Requirement(Capability.SETTINGS, "options.settings.seed", TypedSet.ACCEPTED_SETTINGS, "seed"),
                UNSUPPORTED,
            ),
            Verdict(Requirement(Capability.EFFORT, "options.effort"), UNKNOWN),
            Verdict(
                Requirement(Capability.PROFILE_OVERRIDE, "options.profile"), UNKNOWN, allowed_unknown=True
            ),
        ),
    )
    rich = to_rich_error(errors.UnsupportedCapability(decision))
    assert rich.code is grpc.StatusCode.FAILED_PRECONDITION
    assert rich.reason == "UNSUPPORTED_CAPABILITY"
    assert dict(rich.metadata) == {
        "adapter": "fw",
        "declarationVersion": "sha256:abc",
        "gaps": "persona,accepted_settings:seed,effort",
        "allowedUnknown": "profile_override",
    }
    violations = [(v.type, v.subject) for v in rich.precondition_violations]
    assert violations == [
        ("UNSUPPORTED_CAPABILITY", "persona"),
        ("UNSUPPORTED_CAPABILITY", "accepted_settings:seed"),
        ("UNKNOWN_CAPABILITY", "effort"),
    ]
    seed = rich.precondition_violations[1].description
    assert seed.startswith("options.settings.seed needs accepted_settings:seed")
    assert "unsupported" in seed
    assert "unknown" in rich.precondition_violations[2].description


def test_invalid_request_has_one_field_violation_per_problem() -> None:
    rich = to_rich_error(
        errors.InvalidRequest([("prompt", "must not be empty"), ("output_schema", "not JSON")])
    )
    assert list(rich.field_violations) == [("prompt", "must not be empty"), ("output_schema", "not JSON")]
    assert rich.metadata["fields"] == "prompt,output_schema"


def test_output_schema_violation_lists_violations() -> None:
    rich = to_rich_error(
        errors.OutputSchemaViolation("a", [("", "output is not valid JSON"), ("/name", "42 is not a string")])
    )
    assert rich.code is grpc.StatusCode.INTERNAL
    assert rich.reason == "OUTPUT_SCHEMA_VIOLATION"
    assert rich.metadata == {"adapter": "a", "violations": "2"}
    assert [(v.type, v.subject, v.description) for v in rich.precondition_violations] == [
        ("OUTPUT_SCHEMA", "/", "output is not valid JSON"),
        ("OUTPUT_SCHEMA", "/name", "42 is not a string"),
    ]


def test_unexpected_exceptions_are_internal_never_unknown() -> None:
    rich = unexpected_error(KeyError("boom"), "Invoke")
    assert rich.code is grpc.StatusCode.INTERNAL
    assert rich.reason == "INTERNAL"
    assert rich.domain == DOMAIN
    assert rich.metadata == {"operation": "Invoke", "exception": "KeyError"}
    assert "boom" in rich.message


def test_bootstrap_refusals_list_one_violation_per_missing_gate_tie_and_search() -> None:
    gates = to_rich_error(
        errors.GatesNotApproved(
            "voice/say",
            ["provider_cost_approval", "external_service_approval"],
            ["external_service_approval"],
        )
    )
    assert [(v.type, v.subject) for v in gates.precondition_violations] == [
        ("GATE_NOT_APPROVED", "external_service_approval")
    ]
    assert gates.metadata["missingGates"] == "external_service_approval"
    tie = to_rich_error(
        errors.AskPolicyRequiresChoice("voice", "top_candidates_within_10_points", [("v/a", 60), ("v/b", 52)])
    )
    assert [(v.type, v.subject) for v in tie.precondition_violations] == [
        ("ASK_POLICY_CANDIDATE", "v/a"),
        ("ASK_POLICY_CANDIDATE", "v/b"),
    ]
    assert tie.metadata["askPolicy"] == "top_candidates_within_10_points"
    nothing = to_rich_error(errors.NoSeedFound("tts", None, [("tts", None), ("voice", None)], "ask"))
    assert [v.subject for v in nothing.precondition_violations] == ["tts", "voice"]
    assert nothing.metadata["searches"] == "2"
    assert "approval" in nothing.message
