"""The one table from the negotiator's error taxonomy to gRPC status codes and details.

Every status carries exactly one ErrorInfo in the domain `negotiator.agentsidecar`
whose `reason` is the error's `reason` (AIP-193), so a caller in any language
branches on (code, reason) and never parses the message. On top of ErrorInfo:

- InvalidRequest: BadRequest, one field violation per problem.
- UnsupportedCapability: PreconditionFailure with one violation per gap:
  type "UNSUPPORTED_CAPABILITY" (declared unsupported) or "UNKNOWN_CAPABILITY"
  (the declaration is silent and the caller did not allow it), subject the
  capability name or "<set>:<member>", description
  `<request field> needs <subject>; the declaration of "<adapter>" says <state>`
  (the request field is everything before the first " needs ").
  ErrorInfo metadata: adapter, declarationVersion, gaps (comma-separated
  subjects, in request order) and, when the caller allowed any unknowns,
  allowedUnknown (comma-separated subjects).
- OutputSchemaViolation: INTERNAL (the adapter broke its contract, not the
  caller) with a PreconditionFailure-style list, one violation per schema
  error (type "OUTPUT_SCHEMA", subject the JSON pointer into the output, "/"
  for the root, description the validator's message). PreconditionFailure
  rather than DebugInfo because it is structured per violation and every
  client decodes it the same way as a refusal's gaps; metadata adapter and
  violations (the count).
- AdapterFailure subclasses: metadata adapter and cause; AdapterRateLimited
  adds RetryInfo (and metadata retryAfterSeconds) when the provider gave a hint.

- Conversation errors carry metadata conversationId. ConversationBusy is
  ABORTED (retry the whole call later, as CSI does for concurrent
  operations). DeclarationChanged and ConversationAdapterMismatch are
  FAILED_PRECONDITION with one PreconditionViolation (type the reason,
  subject the adapter) and metadata adapter (the conversation's) plus
  pinnedVersion/declarationVersion or requestedAdapter; the fix is
  options.new_conversation. ConversationStateCorrupt is DATA_LOSS;
  ConversationStoreFailed is INTERNAL (metadata cause).
- RegistrationStoreFailed: INTERNAL with metadata adapter and cause; the
  registration or removal did not happen.
- DelegationDepthExceeded: FAILED_PRECONDITION (do not retry at this depth)
  with metadata attemptedDepth, maxDepth and limit (which limit applied:
  "options.max_depth.depth" or "limits.max_depth") and one
  PreconditionViolation (type DELEGATION_DEPTH_EXCEEDED, subject the limit).
- AuditWatcherDropped: RESOURCE_EXHAUSTED (the per-watch buffer), metadata
  queueSize; the caller watches again.
- Bootstrap: SeedstoreUnavailable is UNAVAILABLE (metadata target, cause;
  retry with backoff); SeedCommandTimeout is DEADLINE_EXCEEDED (metadata
  seed, timeoutSeconds, limit). Every other bootstrap error is
  FAILED_PRECONDITION with metadata naming the seed and PreconditionFailure
  violations: one per search tried (NoSeedFound, type SEARCH_FOUND_NOTHING,
  subject "<capability>@<domain>" or the capability alone for the whole
  store), one per tied candidate (AskPolicyRequiresChoice, type
  ASK_POLICY_CANDIDATE, subject "<domain>/<id>"), one per missing gate
  (GatesNotApproved, type GATE_NOT_APPROVED, subject the gate), otherwise one
  violation whose type is the reason.

- MCP: McpServerNotAllowed is PERMISSION_DENIED with metadata server and
  rule (caller-stdio-command-allowlist or caller-host-allowlist), before
  dispatch. McpServerUnavailable is UNAVAILABLE, McpServerTimeout is
  DEADLINE_EXCEEDED; both carry metadata adapter, server and cause.

Unexpected exceptions become INTERNAL with reason INTERNAL, never UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import grpc

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.model import CapabilityState, Verdict
from agentsidecar.sidecar_runtime.richstatus import PreconditionViolation, RichError
from agentsidecar.sidecar_runtime.rpcerrors import ErrorTable

DOMAIN = "negotiator.agentsidecar"
# ErrorInfo metadata `rule` of ADAPTER_TARGET_NOT_ALLOWED.
ADAPTER_TARGET_RULE = "unix-or-loopback-unless-allowed"

GAP_TYPES: Mapping[CapabilityState, str] = MappingProxyType(
    {
        CapabilityState.UNSUPPORTED: "UNSUPPORTED_CAPABILITY",
        CapabilityState.UNKNOWN: "UNKNOWN_CAPABILITY",
    }
)


def _rich(
    error: errors.NegotiatorError,
    code: grpc.StatusCode,
    metadata: Mapping[str, str] | None = None,
    **details: Any,
) -> RichError:
    return RichError(
        code=code,
        message=error.message,
        reason=error.reason,
        domain=DOMAIN,
        metadata=dict(metadata or {}),
        **details,
    )


def gap_violation(verdict: Verdict, adapter: str) -> PreconditionViolation:
    requirement = verdict.requirement
    subject = requirement.describe()
    return PreconditionViolation(
        type=GAP_TYPES.get(verdict.state, "UNSUPPORTED_CAPABILITY"),
        subject=subject,
        description=(
            f'{requirement.request_field} needs {subject}; the declaration of "{adapter}" '
            f"says {verdict.state.value}"
        ),
    )


def _invalid_request(error: errors.InvalidRequest) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.INVALID_ARGUMENT,
        {"fields": ",".join(dict.fromkeys(f for f, _ in error.violations))},
        field_violations=error.violations,
    )


def _not_found(error: errors.AdapterNotFound) -> RichError:
    return _rich(error, grpc.StatusCode.NOT_FOUND, {"adapter": error.shortname})


def _kind_mismatch(error: errors.AdapterKindMismatch) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {"adapter": error.shortname, "kind": error.kind, "selectedBy": error.selected_by},
        precondition_violations=(
            PreconditionViolation("ADAPTER_KIND_MISMATCH", error.shortname, error.message),
        ),
    )


def _unsupported(error: errors.UnsupportedCapability) -> RichError:
    decision = error.decision
    metadata = {
        "adapter": decision.adapter,
        "declarationVersion": decision.declaration_version,
        "gaps": ",".join(v.requirement.describe() for v in decision.gaps),
    }
    if decision.allowed_unknowns:
        metadata["allowedUnknown"] = ",".join(v.requirement.describe() for v in decision.allowed_unknowns)
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        metadata,
        precondition_violations=tuple(gap_violation(v, decision.adapter) for v in decision.gaps),
    )


def _already_exists(error: errors.AdapterAlreadyExists) -> RichError:
    return _rich(error, grpc.StatusCode.ALREADY_EXISTS, {"adapter": error.shortname})


def _not_removable(error: errors.AdapterNotRemovable) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {"adapter": error.shortname, "source": "config"},
        precondition_violations=(
            PreconditionViolation("ADAPTER_FROM_CONFIG", error.shortname, error.message),
        ),
    )


def _not_probeable(error: errors.AdapterNotProbeable) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {"adapter": error.shortname, "implementation": error.implementation},
        precondition_violations=(
            PreconditionViolation("ADAPTER_NOT_PROBEABLE", error.shortname, error.message),
        ),
    )


def _config(error: errors.ConfigError) -> RichError:
    return _rich(error, grpc.StatusCode.INVALID_ARGUMENT, field_violations=(("config", error.message),))


def _registration_failed(error: errors.AdapterRegistrationFailed) -> RichError:
    # The remote answered, so retrying changes nothing until it is fixed.
    metadata = {"target": error.target, "cause": error.cause}
    if error.shortname:
        metadata["adapter"] = error.shortname
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        metadata,
        precondition_violations=(PreconditionViolation("ADAPTER_DECLARATION", error.target, error.cause),),
    )


def _target_not_allowed(error: errors.AdapterTargetNotAllowed) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.PERMISSION_DENIED,
        {"target": error.target, "host": error.host, "rule": ADAPTER_TARGET_RULE},
    )


def _output_violation(error: errors.OutputSchemaViolation) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.INTERNAL,
        {"adapter": error.adapter, "violations": str(len(error.violations))},
        precondition_violations=tuple(
            PreconditionViolation("OUTPUT_SCHEMA", pointer or "/", message)
            for pointer, message in error.violations
        ),
    )


def _reply_too_large(error: errors.ReplyTooLarge) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        {"adapter": error.adapter, "replyBytes": str(error.size), "maxMessageBytes": str(error.limit)},
    )


def _adapter_failure(code: grpc.StatusCode) -> Callable[[errors.AdapterFailure], RichError]:
    def build(error: errors.AdapterFailure) -> RichError:
        return _rich(error, code, {"adapter": error.adapter, "cause": error.cause})

    return build


def _rate_limited(error: errors.AdapterRateLimited) -> RichError:
    metadata = {"adapter": error.adapter, "cause": error.cause}
    if error.retry_after is not None:
        metadata["retryAfterSeconds"] = f"{error.retry_after:g}"
    return _rich(error, grpc.StatusCode.RESOURCE_EXHAUSTED, metadata, retry_after_seconds=error.retry_after)


def _conversation_busy(error: errors.ConversationBusy) -> RichError:
    return _rich(error, grpc.StatusCode.ABORTED, {"conversationId": error.conversation_id})


def _declaration_changed(error: errors.DeclarationChanged) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {
            "conversationId": error.conversation_id,
            "adapter": error.adapter,
            "pinnedVersion": error.pinned_version,
            "declarationVersion": error.current_version,
        },
        precondition_violations=(PreconditionViolation("DECLARATION_CHANGED", error.adapter, error.message),),
    )


def _conversation_adapter_mismatch(error: errors.ConversationAdapterMismatch) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {
            "conversationId": error.conversation_id,
            "adapter": error.bound_adapter,
            "requestedAdapter": error.requested_adapter,
        },
        precondition_violations=(
            PreconditionViolation("CONVERSATION_ADAPTER_MISMATCH", error.bound_adapter, error.message),
        ),
    )


def _registration_store_failed(error: errors.RegistrationStoreFailed) -> RichError:
    return _rich(error, grpc.StatusCode.INTERNAL, {"adapter": error.adapter, "cause": error.cause})


def _conversation_failure(code: grpc.StatusCode) -> Callable[[Any], RichError]:
    def build(error: errors.ConversationStateCorrupt | errors.ConversationStoreFailed) -> RichError:
        return _rich(error, code, {"conversationId": error.conversation_id, "cause": error.cause})

    return build


def _depth_exceeded(error: errors.DelegationDepthExceeded) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {"attemptedDepth": str(error.attempted), "maxDepth": str(error.max_depth), "limit": error.limit},
        precondition_violations=(PreconditionViolation(error.reason, error.limit, error.message),),
    )


def _shutting_down(error: errors.ShuttingDown) -> RichError:
    return _rich(error, grpc.StatusCode.UNAVAILABLE)


def _audit_watcher_dropped(error: errors.AuditWatcherDropped) -> RichError:
    return _rich(error, grpc.StatusCode.RESOURCE_EXHAUSTED, {"queueSize": str(error.queue_size)})


def _seedstore_not_configured(error: errors.SeedstoreNotConfigured) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        precondition_violations=(PreconditionViolation(error.reason, "seedstore", error.message),),
    )


def _seedstore_unavailable(error: errors.SeedstoreUnavailable) -> RichError:
    return _rich(error, grpc.StatusCode.UNAVAILABLE, {"target": error.target, "cause": error.cause})


def _seedstore_refused(error: errors.SeedstoreRefused) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {
            "target": error.target,
            "seedstoreCode": error.code,
            "seedstoreReason": error.seedstore_reason,
            "cause": error.cause,
        },
        precondition_violations=(PreconditionViolation(error.reason, error.target, error.cause),),
    )


def _no_seed_found(error: errors.NoSeedFound) -> RichError:
    # One violation per search tried: the evidence that broadening happened before asking.
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {
            "capability": error.capability,
            "domain": error.domain or "",
            "searches": str(len(error.searches)),
            "fallbackPolicy": error.fallback_policy,
        },
        precondition_violations=tuple(
            PreconditionViolation(
                "SEARCH_FOUND_NOTHING",
                f"{capability}@{domain}" if domain else capability,
                f'no seed for "{capability}" in ' + (f'domain "{domain}"' if domain else "any domain"),
            )
            for capability, domain in error.searches
        ),
    )


def _seed_not_a_candidate(error: errors.SeedNotACandidate) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {"seed": error.seed, "capability": error.capability, "candidates": ",".join(error.candidates)},
        precondition_violations=(PreconditionViolation(error.reason, error.seed, error.message),),
    )


def _ask_policy_requires_choice(error: errors.AskPolicyRequiresChoice) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {
            "capability": error.capability,
            "askPolicy": error.ask_policy,
            "candidates": ",".join(seed for seed, _ in error.tied),
        },
        precondition_violations=tuple(
            PreconditionViolation(
                "ASK_POLICY_CANDIDATE", seed, f'score {score}; set seed to "{seed}" to run this one'
            )
            for seed, score in error.tied
        ),
    )


def _gates_not_approved(error: errors.GatesNotApproved) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {
            "seed": error.seed,
            "requiredGates": ",".join(error.required),
            "missingGates": ",".join(error.missing),
        },
        precondition_violations=tuple(
            PreconditionViolation(
                "GATE_NOT_APPROVED", gate, f'seed "{error.seed}" requires {gate}; add it to approved_gates'
            )
            for gate in error.missing
        ),
    )


def _seed_not_verified(error: errors.SeedNotVerified) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {"seed": error.seed, "verificationStatus": error.status},
        precondition_violations=(PreconditionViolation(error.reason, error.seed, error.message),),
    )


def _seed_refusal(error: errors.SeedHasNoCommand | errors.SeedCommandFailed) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {"seed": error.seed, "cause": error.cause},
        precondition_violations=(PreconditionViolation(error.reason, error.seed, error.cause),),
    )


def _seed_command_not_found(error: errors.SeedCommandNotFound) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.FAILED_PRECONDITION,
        {"seed": error.seed, "program": error.program, "cause": error.cause},
        precondition_violations=(PreconditionViolation(error.reason, error.program, error.message),),
    )


def _seed_command_timeout(error: errors.SeedCommandTimeout) -> RichError:
    return _rich(
        error,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        {"seed": error.seed, "timeoutSeconds": f"{error.seconds:g}", "limit": error.limit},
    )


def _mcp_not_allowed(error: errors.McpServerNotAllowed) -> RichError:
    return _rich(error, grpc.StatusCode.PERMISSION_DENIED, {"server": error.server, "rule": error.rule})


def _mcp_failure(code: grpc.StatusCode) -> Callable[[Any], RichError]:
    def build(error: errors.McpServerUnavailable | errors.McpServerTimeout) -> RichError:
        return _rich(error, code, {"adapter": error.adapter, "server": error.server, "cause": error.cause})

    return build


# Keyed by class: an error takes the row of the nearest class of its MRO, so a row for a
# base serves every subclass without one (AdapterFailure: AdapterReplyTooLarge and
# AdapterInternal). The bases themselves are abstract; tests/negotiator/test_status.py
# checks that every concrete class reaches a row.
STATUS_TABLE: Mapping[type[errors.NegotiatorError], Callable[[Any], RichError]] = MappingProxyType(
    {
        # caller errors
        errors.InvalidRequest: _invalid_request,
        errors.ConfigError: _config,
        errors.AdapterNotFound: _not_found,
        errors.AdapterAlreadyExists: _already_exists,
        errors.AdapterKindMismatch: _kind_mismatch,
        errors.UnsupportedCapability: _unsupported,
        errors.AdapterNotRemovable: _not_removable,
        errors.AdapterNotProbeable: _not_probeable,
        errors.AdapterTargetNotAllowed: _target_not_allowed,
        errors.McpServerNotAllowed: _mcp_not_allowed,
        errors.DelegationDepthExceeded: _depth_exceeded,
        errors.ConversationBusy: _conversation_busy,
        errors.DeclarationChanged: _declaration_changed,
        errors.ConversationAdapterMismatch: _conversation_adapter_mismatch,
        # store errors
        errors.ConversationStateCorrupt: _conversation_failure(grpc.StatusCode.DATA_LOSS),
        errors.ConversationStoreFailed: _conversation_failure(grpc.StatusCode.INTERNAL),
        errors.RegistrationStoreFailed: _registration_store_failed,
        # upstream errors
        errors.AdapterFailure: _adapter_failure(grpc.StatusCode.INTERNAL),
        errors.AdapterUnavailable: _adapter_failure(grpc.StatusCode.UNAVAILABLE),
        errors.AdapterTimeout: _adapter_failure(grpc.StatusCode.DEADLINE_EXCEEDED),
        errors.AdapterRateLimited: _rate_limited,
        errors.AdapterRefused: _adapter_failure(grpc.StatusCode.FAILED_PRECONDITION),
        errors.AdapterMisconfigured: _adapter_failure(grpc.StatusCode.FAILED_PRECONDITION),
        errors.McpServerUnavailable: _mcp_failure(grpc.StatusCode.UNAVAILABLE),
        errors.McpServerTimeout: _mcp_failure(grpc.StatusCode.DEADLINE_EXCEEDED),
        errors.AdapterRegistrationFailed: _registration_failed,
        errors.OutputSchemaViolation: _output_violation,
        errors.ReplyTooLarge: _reply_too_large,
        errors.SeedstoreUnavailable: _seedstore_unavailable,
        errors.SeedstoreRefused: _seedstore_refused,
        # seed refusals (Bootstrap)
        errors.SeedstoreNotConfigured: _seedstore_not_configured,
        errors.NoSeedFound: _no_seed_found,
        errors.SeedNotACandidate: _seed_not_a_candidate,
        errors.AskPolicyRequiresChoice: _ask_policy_requires_choice,
        errors.GatesNotApproved: _gates_not_approved,
        errors.SeedNotVerified: _seed_not_verified,
        errors.SeedHasNoCommand: _seed_refusal,
        errors.SeedCommandNotFound: _seed_command_not_found,
        errors.SeedCommandFailed: _seed_refusal,
        errors.SeedCommandTimeout: _seed_command_timeout,
        # watches the server ended
        errors.AuditWatcherDropped: _audit_watcher_dropped,
        errors.ShuttingDown: _shutting_down,
    }
)


def to_rich_error(error: errors.NegotiatorError) -> RichError:
    """The status a NegotiatorError is sent as."""
    for cls in type(error).__mro__:
        build = STATUS_TABLE.get(cls)
        if build is not None:
            return build(error)
    raise AssertionError(f"{type(error).__name__} reaches no row of STATUS_TABLE")  # pragma: no cover


def unexpected_error(exc: BaseException, operation: str) -> RichError:
    """An exception outside the taxonomy: INTERNAL, so it is never sent as UNKNOWN."""
    return RichError(
        code=grpc.StatusCode.INTERNAL,
        message=f"internal error in {operation}: {type(exc).__name__}: {exc}",
        reason="INTERNAL",
        domain=DOMAIN,
        metadata={"operation": operation, "exception": type(exc).__name__},
    )


# What the servicer's error decorators send (agentsidecar.sidecar_runtime.rpcerrors).
ERRORS: ErrorTable[errors.NegotiatorError] = ErrorTable(
    errors.NegotiatorError, to_rich_error, unexpected_error
)
