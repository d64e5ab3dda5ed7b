"""What a sidecar call raises when it fails: one exception tree, mapped once.

Every error either sidecar sends is a `google.rpc.Status` with one ErrorInfo,
so a failed call is mapped from its (status code, ErrorInfo.reason) pair to
the most specific class below, and from its code alone when the reason is
absent or unknown (transport errors such as "no server at this address"
carry no ErrorInfo). Classes register themselves with their code and
reasons when they are defined, so the mapping cannot drift from the tree:

    SidecarError                          any failed call: .code .reason .metadata .original ...
    ├── InvalidArgumentError              INVALID_ARGUMENT; .field_violations name request fields
    ├── NotFoundError                     NOT_FOUND
    │   ├── SeedNotFoundError             SEED_NOT_FOUND; .seed_id
    │   └── AdapterNotFoundError          ADAPTER_NOT_FOUND; .adapter
    ├── AlreadyExistsError                ALREADY_EXISTS (ADAPTER_ALREADY_EXISTS); .adapter
    ├── FailedPreconditionError           FAILED_PRECONDITION: do not retry until something changes
    │                                     (SEEDSTORE_NOT_CONFIGURED, SEEDSTORE_REFUSED, SEED_NOT_A_CANDIDATE,
    │                                     OUTSIDE_STORE)
    │   ├── UnsupportedCapabilityError    UNSUPPORTED_CAPABILITY; .gaps .adapter .declaration_version
    │   ├── AdapterKindMismatchError      ADAPTER_KIND_MISMATCH; .adapter .kind .selected_by
    │   ├── AdapterNotRemovableError      ADAPTER_NOT_REMOVABLE; .adapter
    │   ├── AdapterNotProbeableError      ADAPTER_NOT_PROBEABLE; .adapter .implementation
    │   ├── AdapterRegistrationFailedError  ADAPTER_REGISTRATION_FAILED; .target .cause
    │   ├── AdapterRefusedError  *        ADAPTER_REFUSED
    │   ├── AdapterMisconfiguredError  *  ADAPTER_MISCONFIGURED
    │   ├── DeclarationChangedError       DECLARATION_CHANGED; .conversation_id .pinned_version ...
    │   ├── ConversationAdapterMismatchError  CONVERSATION_ADAPTER_MISMATCH; .conversation_id .adapter
    │   ├── DelegationDepthExceededError  DELEGATION_DEPTH_EXCEEDED; .attempted_depth .max_depth .limit
    │   ├── NoSeedFoundError              NO_SEED_FOUND: ask before any unseeded fallback; .searches ...
    │   ├── SeedChoiceRequiredError       ASK_POLICY_REQUIRES_CHOICE: ask the user; .candidates
    │   ├── GatesNotApprovedError         GATES_NOT_APPROVED: ask the user; .missing_gates .required_gates
    │   ├── SeedNotVerifiedError          SEED_NOT_VERIFIED: verify it, retry; .seed .verification_status
    │   ├── SeedCommandError              SEED_HAS_NO_COMMAND, SEED_COMMAND_NOT_FOUND, SEED_COMMAND_FAILED
    │   ├── SeedMalformedError            SEED_MALFORMED; .path .line .detail
    │   └── AmbiguousSeedError            SEED_AMBIGUOUS; .seed_id .paths
    ├── AbortedError                      ABORTED (WATCH_BACKLOG_EXCEEDED: list, then watch again)
    │   ├── RevisionConflictError         REVISION_MISMATCH; .seed_id .expected .actual
    │   └── ConversationBusyError         CONVERSATION_BUSY (no_wait): .conversation_id
    ├── UnavailableError                  UNAVAILABLE: retry with backoff
    │                                     (SHUTTING_DOWN, SEEDSTORE_UNAVAILABLE, transport)
    │   ├── StoreUnavailableError         STORE_UNAVAILABLE
    │   └── AdapterUnavailableError  *    ADAPTER_UNAVAILABLE, MCP_SERVER_UNAVAILABLE
    ├── DeadlineExceededError             DEADLINE_EXCEEDED (DEFAULT_TIMEOUT_EXCEEDED, SEED_COMMAND_TIMEOUT)
    │   └── AdapterTimeoutError  *        ADAPTER_TIMEOUT, MCP_SERVER_TIMEOUT
    ├── ResourceExhaustedError            RESOURCE_EXHAUSTED (TOO_MANY_CALLS, REPLY_TOO_LARGE); .retry_after
    │   ├── AdapterRateLimitedError  *    ADAPTER_RATE_LIMITED
    │   └── AuditWatcherDroppedError      AUDIT_WATCHER_DROPPED: watch again
    ├── UnauthenticatedError              UNAUTHENTICATED (TOKEN_MISSING): send a bearer token
    ├── PermissionDeniedError             PERMISSION_DENIED (TOKEN_INVALID, ADAPTER_TARGET_NOT_ALLOWED,
    │                                     MCP_SERVER_NOT_ALLOWED)
    ├── UnimplementedError                UNIMPLEMENTED (no such RPC here): feature-detect on it
    ├── DataLossError                     DATA_LOSS (CONVERSATION_STATE_CORRUPT): start afresh
    └── InternalError                     INTERNAL (INTERNAL, CONVERSATION_STORE_FAILED, ...): report it
        ├── OutputSchemaViolationError    OUTPUT_SCHEMA_VIOLATION; .violations .adapter
        └── AdapterInternalError  *       ADAPTER_INTERNAL, ADAPTER_FAILED, ADAPTER_REPLY_TOO_LARGE

    * also an AdapterFailureError (.adapter .cause): the adapter failed while running.

The bootstrap's refusals get a class where the caller has a distinct next
step (ask the user, verify the seed, pick another seed); the rest keep the
code's class and are told apart by `.reason`. Every bootstrap error names
its seed in `metadata["seed"]` when there is one.

OutputSchemaViolationError sits under InternalError, not FailedPreconditionError,
because the negotiator sends it as INTERNAL: the adapter broke its contract,
not the caller. Codes with no class of their own (CANCELLED, UNKNOWN, ...)
raise a plain SidecarError.

Every error keeps `.original` (the grpc.RpcError, sync or aio) and `.decoded`
(the unpacked status). `from_rpc_error(err)` is the one entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Generic, Never, Self, TypeVar, overload

import grpc

from agentsidecar.sidecar_runtime.statusdecode import (
    TRUNCATED,
    VIOLATIONS_OMITTED,
    DecodedError,
    PreconditionViolation,
    decode_error,
)
from agentsidecar.sidecar_runtime.wire_names import SET_CAPABILITY_NAMES

UNSUPPORTED_CAPABILITY = "UNSUPPORTED_CAPABILITY"
# PreconditionFailure violation type of a refusal's gap -> the declaration's state.
GAP_STATES: Mapping[str, str] = {"UNSUPPORTED_CAPABILITY": "unsupported", "UNKNOWN_CAPABILITY": "unknown"}

_CLASS_OF_CODE: dict[grpc.StatusCode, type[SidecarError]] = {}
_CLASS_OF_REASON: dict[tuple[grpc.StatusCode, str], type[SidecarError]] = {}


class SidecarError(Exception):
    """A failed call, details unpacked; `str()` is the server's message.

    Subclasses set `grpc_code` (the status code they stand for) and
    `reasons` (the ErrorInfo reasons they stand for, under that code); both
    are registered when the class is defined.
    """

    grpc_code: ClassVar[grpc.StatusCode | None] = None
    reasons: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        own = cls.__dict__
        code = cls.grpc_code
        if own.get("grpc_code") is not None and code is not None:
            if code in _CLASS_OF_CODE:
                raise TypeError(f"{cls.__name__}: {_CLASS_OF_CODE[code].__name__} already stands for {code}")
            _CLASS_OF_CODE[code] = cls
        for reason in own.get("reasons", ()):
            if code is None:
                raise TypeError(f"{cls.__name__} lists reasons but has no grpc_code")
            if (code, reason) in _CLASS_OF_REASON:
                raise TypeError(f"{cls.__name__}: {reason} under {code} is already mapped")
            _CLASS_OF_REASON[(code, reason)] = cls

    def __init__(self, decoded: DecodedError, original: grpc.RpcError | None = None) -> None:
        super().__init__(decoded.message)
        self.decoded = decoded
        self.original = original

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> SidecarError:
        """The most specific error for `error`, whichever class this is called on."""
        return from_rpc_error(error)

    @property
    def code(self) -> grpc.StatusCode:
        return self.decoded.code

    @property
    def message(self) -> str:
        return self.decoded.message

    @property
    def reason(self) -> str:
        """ErrorInfo.reason; empty for transport errors, which carry no ErrorInfo."""
        return self.decoded.reason

    @property
    def domain(self) -> str:
        return self.decoded.domain

    @property
    def metadata(self) -> Mapping[str, str]:
        return self.decoded.metadata

    @property
    def field_violations(self) -> tuple[tuple[str, str], ...]:
        """BadRequest (request field, description) pairs."""
        return self.decoded.field_violations

    @property
    def precondition_violations(self) -> tuple[PreconditionViolation, ...]:
        return self.decoded.precondition_violations

    @property
    def violations_omitted(self) -> int:
        """Violations the server left out to keep the error within gRPC's metadata limits; 0 for none."""
        return _whole_number(self.metadata.get(VIOLATIONS_OMITTED, ""))

    @property
    def truncated(self) -> tuple[str, ...]:
        """What the server shortened for the same reason: "message", metadata keys, "violations"."""
        return _listed(self.metadata.get(TRUNCATED, ""))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, message={self.message!r})"
        )


def class_for(code: grpc.StatusCode, reason: str) -> type[SidecarError]:
    """The class a status with this code and ErrorInfo reason is raised as."""
    return _CLASS_OF_REASON.get((code, reason)) or _CLASS_OF_CODE.get(code, SidecarError)


def from_decoded(decoded: DecodedError, original: grpc.RpcError | None = None) -> SidecarError:
    return class_for(decoded.code, decoded.reason)(decoded, original)


def from_rpc_error(error: grpc.RpcError) -> SidecarError:
    """Map a failed call (sync `grpc.RpcError` or `grpc.aio.AioRpcError`) into the tree."""
    return from_decoded(decode_error(error), error)


_Response = TypeVar("_Response")


def mapped_stream(call: grpc.CallIterator[_Response]) -> Generator[_Response, None, None]:
    """The responses of a synchronous server stream, errors mapped (also mid-stream).

    Closing the generator, or dropping it after leaving a loop early, cancels the call.
    """
    try:
        yield from call
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None
    finally:
        call.cancel()  # type: ignore[no-untyped-call]  # a no-op once the stream has ended


def _whole_number(text: str) -> int:
    """A metadata value that should be a count; 0 when it is absent or not one."""
    return int(text) if text.isascii() and text.isdigit() else 0


def _listed(text: str) -> tuple[str, ...]:
    """A comma-separated metadata value as a tuple; () when empty."""
    return tuple(text.split(",")) if text else ()


_Value = TypeVar("_Value")


class _MetadataField(Generic[_Value]):
    """A read-only error attribute holding one ErrorInfo metadata value, e.g. `adapter = _text("adapter")`.

    `parse` turns the text into the attribute's type; it gets "" when the
    error does not carry the key.
    """

    def __init__(self, key: str, parse: Callable[[str], _Value], doc: str | None = None) -> None:
        self.key = key
        self.parse = parse
        self.__doc__ = doc
        self._name = key

    def __set_name__(self, owner: type[SidecarError], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type[SidecarError]) -> Self: ...

    @overload
    def __get__(self, instance: SidecarError, owner: type[SidecarError] | None = None) -> _Value: ...

    def __get__(
        self, instance: SidecarError | None, owner: type[SidecarError] | None = None
    ) -> Self | _Value:
        if instance is None:
            return self
        return self.parse(instance.metadata.get(self.key, ""))

    def __set__(self, instance: SidecarError, value: Never) -> None:
        # Read-only like a property without a setter: the value is what the server sent.
        raise AttributeError(f"{type(instance).__name__}.{self._name} is read-only")


def _text(key: str, doc: str | None = None) -> _MetadataField[str]:
    return _MetadataField(key, str, doc)


def _count(key: str, doc: str | None = None) -> _MetadataField[int]:
    return _MetadataField(key, _whole_number, doc)


def _list(key: str, doc: str | None = None) -> _MetadataField[tuple[str, ...]]:
    return _MetadataField(key, _listed, doc)


# --- by status code ---------------------------------------------------------------


class InvalidArgumentError(SidecarError):
    """The request is malformed; `field_violations` name every bad field. Fix it, do not retry."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    reasons: ClassVar[tuple[str, ...]] = (
        "INVALID_ARGUMENT",
        "INVALID_IDENTIFIER",
        "INVALID_REQUEST",
        "CONFIG_INVALID",
        # Either sidecar: the request bytes did not decode as the method's message (a client bug
        # or a mismatched proto); field_violations name "request".
        "MALFORMED_REQUEST",
    )

    @property
    def fields(self) -> tuple[str, ...]:
        """The request fields named, in order, without repeats."""
        return tuple(dict.fromkeys(field for field, _ in self.field_violations))


class NotFoundError(SidecarError):
    grpc_code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(SidecarError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_ALREADY_EXISTS",)

    adapter = _text("adapter")


class FailedPreconditionError(SidecarError):
    """The system is not in a state the call needs; retrying unchanged will fail again."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    # Bootstrap refusals whose next step is in the message and metadata: an operator's fix
    # (SEEDSTORE_*) or a client bug (SEED_NOT_A_CANDIDATE: metadata "candidates").
    reasons: ClassVar[tuple[str, ...]] = (
        "SEEDSTORE_NOT_CONFIGURED",
        "SEEDSTORE_REFUSED",
        "SEED_NOT_A_CANDIDATE",
        "OUTSIDE_STORE",
    )


class AbortedError(SidecarError):
    """A concurrency conflict: retry the whole read-modify-write, not just this call."""

    grpc_code = grpc.StatusCode.ABORTED
    # A WatchSeeds reader fell too far behind: list again, then watch again.
    reasons: ClassVar[tuple[str, ...]] = ("WATCH_BACKLOG_EXCEEDED",)


class UnavailableError(SidecarError):
    """Retry with backoff (the channel's retry policy already did, for idempotent calls)."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    reasons: ClassVar[tuple[str, ...]] = ("SHUTTING_DOWN", "SEEDSTORE_UNAVAILABLE")


class DeadlineExceededError(SidecarError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    # SEED_COMMAND_TIMEOUT: a bootstrapped seed's command outlived the deadline; raise it.
    reasons: ClassVar[tuple[str, ...]] = ("DEFAULT_TIMEOUT_EXCEEDED", "SEED_COMMAND_TIMEOUT")


class ResourceExhaustedError(SidecarError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reasons: ClassVar[tuple[str, ...]] = ("TOO_MANY_CALLS", "REPLY_TOO_LARGE")

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before retrying (RetryInfo), when the server gave a hint."""
        if self.decoded.retry_after_seconds is not None:
            return self.decoded.retry_after_seconds
        hint = self.metadata.get("retryAfterSeconds")
        try:
            return float(hint) if hint else None
        except ValueError:
            return None


class UnauthenticatedError(SidecarError):
    """The call needs a bearer token (`token=` / `token_file=` on the client)."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    reasons: ClassVar[tuple[str, ...]] = ("TOKEN_MISSING",)


class PermissionDeniedError(SidecarError):
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    reasons: ClassVar[tuple[str, ...]] = (
        "TOKEN_INVALID",
        "ADAPTER_TARGET_NOT_ALLOWED",
        "MCP_SERVER_NOT_ALLOWED",
    )


class UnimplementedError(SidecarError):
    """The server lacks the RPC (an older version, or another service at this address)."""

    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    reasons: ClassVar[tuple[str, ...]] = ()


class InternalError(SidecarError):
    """A bug in the server (or, for the subclasses, in an adapter): report it."""

    grpc_code = grpc.StatusCode.INTERNAL
    reasons: ClassVar[tuple[str, ...]] = (
        "INTERNAL",
        "NEGOTIATOR_ERROR",
        "SEEDSTORE_ERROR",
        "CONVERSATION_STORE_FAILED",
        "REGISTRATION_STORE_FAILED",
    )


class DataLossError(SidecarError):
    """Stored state is unreadable (a conversation's: set `new_conversation` to start afresh)."""

    grpc_code = grpc.StatusCode.DATA_LOSS
    reasons: ClassVar[tuple[str, ...]] = ("CONVERSATION_STATE_CORRUPT",)


# --- seedstore ------------------------------------------------------------------------


class SeedNotFoundError(NotFoundError):
    reasons: ClassVar[tuple[str, ...]] = ("SEED_NOT_FOUND",)

    seed_id = _text("seedId")


class SeedMalformedError(FailedPreconditionError):
    """The seed's file cannot be parsed; fix or delete it (the service never overwrites it)."""

    reasons: ClassVar[tuple[str, ...]] = ("SEED_MALFORMED",)

    path = _text("path")
    line = _count("line", "1-based line of the problem; 0 when unknown.")
    detail = _text("detail")


class AmbiguousSeedError(FailedPreconditionError):
    """Several files hold the id; pass a domain."""

    reasons: ClassVar[tuple[str, ...]] = ("SEED_AMBIGUOUS",)

    seed_id = _text("seedId")

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(v.subject for v in self.precondition_violations)


class RevisionConflictError(AbortedError):
    """`expected_revision` no longer matches: re-read the seed, re-apply the change, retry."""

    reasons: ClassVar[tuple[str, ...]] = ("REVISION_MISMATCH",)

    seed_id = _text("seedId")
    expected = _text("expected")
    actual = _text("actual")


class StoreUnavailableError(UnavailableError):
    reasons: ClassVar[tuple[str, ...]] = ("STORE_UNAVAILABLE",)


# --- negotiator -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Gap:
    """One unmet requirement of a refused call."""

    capability: str  # e.g. "settings"
    set: str | None  # e.g. "accepted_settings", for typed-set members
    member: str | None  # e.g. "seed", for typed-set members
    request_field: str  # e.g. "options.settings.seed"
    state: str  # "unsupported" | "unknown"


@dataclass(frozen=True, slots=True)
class SchemaViolation:
    """One way an adapter's output broke the caller's JSON Schema."""

    pointer: str  # JSON pointer into the output; "/" for the root
    message: str


def decode_gaps(violations: tuple[PreconditionViolation, ...]) -> tuple[Gap, ...]:
    """A refusal's PreconditionFailure violations as gaps, in request order."""
    gaps = []
    for violation in violations:
        state = GAP_STATES.get(violation.type)
        if state is None:
            continue
        set_name, sep, member = violation.subject.partition(":")
        if sep:
            capability = SET_CAPABILITY_NAMES.get(set_name, set_name)
            typed_set: str | None = set_name
            member_name: str | None = member
        else:
            capability, typed_set, member_name = violation.subject, None, None
        request_field = violation.description.partition(" needs ")[0]
        gaps.append(Gap(capability, typed_set, member_name, request_field, state))
    return tuple(gaps)


class AdapterFailureError(SidecarError):
    """Mixed into the errors of an adapter that failed while running."""

    adapter = _text("adapter")
    cause = _text("cause")


class AdapterNotFoundError(NotFoundError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_NOT_FOUND",)

    adapter = _text("adapter")


class UnsupportedCapabilityError(FailedPreconditionError):
    """Refused before dispatch: the adapter's declaration does not meet the call.

    `gaps` lists every unmet requirement. Drop those fields, pick an adapter
    that declares them (negotiate first), or, for "unknown" gaps only, allow
    the capability per call (`allow_unknown`).
    """

    reasons: ClassVar[tuple[str, ...]] = (UNSUPPORTED_CAPABILITY,)

    def __init__(self, decoded: DecodedError, original: grpc.RpcError | None = None) -> None:
        super().__init__(decoded, original)
        self.gaps: tuple[Gap, ...] = decode_gaps(decoded.precondition_violations)

    adapter = _text("adapter")
    declaration_version = _text("declarationVersion")
    allowed_unknown = _list(
        "allowedUnknown", "Subjects the caller allowed while UNKNOWN (they were not gaps)."
    )


class AdapterKindMismatchError(FailedPreconditionError):
    """`adapter` named a harness or `agent` named a framework: use the other selector."""

    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_KIND_MISMATCH",)

    adapter = _text("adapter")
    kind = _text("kind")
    selected_by = _text("selectedBy")


class AdapterNotRemovableError(FailedPreconditionError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_NOT_REMOVABLE",)

    adapter = _text("adapter")


class AdapterNotProbeableError(FailedPreconditionError):
    """ProbeAdapter named an adapter with no upstream to probe (only openai adapters have one)."""

    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_NOT_PROBEABLE",)

    adapter = _text("adapter")
    implementation = _text("implementation")


class AdapterRegistrationFailedError(FailedPreconditionError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_REGISTRATION_FAILED",)

    target = _text("target")
    cause = _text("cause")


class AdapterRefusedError(FailedPreconditionError, AdapterFailureError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_REFUSED",)


class AdapterMisconfiguredError(FailedPreconditionError, AdapterFailureError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_MISCONFIGURED",)


class AdapterUnavailableError(UnavailableError, AdapterFailureError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_UNAVAILABLE", "MCP_SERVER_UNAVAILABLE")


class AdapterTimeoutError(DeadlineExceededError, AdapterFailureError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_TIMEOUT", "MCP_SERVER_TIMEOUT")


class AdapterRateLimitedError(ResourceExhaustedError, AdapterFailureError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_RATE_LIMITED",)


class AdapterInternalError(InternalError, AdapterFailureError):
    reasons: ClassVar[tuple[str, ...]] = ("ADAPTER_INTERNAL", "ADAPTER_FAILED", "ADAPTER_REPLY_TOO_LARGE")


class DelegationDepthExceededError(FailedPreconditionError):
    """The call arrived deeper in a delegation chain than its limit allows (0 is top level)."""

    reasons: ClassVar[tuple[str, ...]] = ("DELEGATION_DEPTH_EXCEEDED",)

    attempted_depth = _count("attemptedDepth")
    max_depth = _count("maxDepth")
    limit = _text("limit", 'Where the limit comes from: "options.max_depth.depth" or "limits.max_depth".')


class ConversationBusyError(AbortedError):
    """Another call of the conversation is running and this one asked not to wait (`no_wait`)."""

    reasons: ClassVar[tuple[str, ...]] = ("CONVERSATION_BUSY",)

    conversation_id = _text("conversationId")


class DeclarationChangedError(FailedPreconditionError):
    """The adapter's declaration changed since the conversation pinned it: start the conversation afresh."""

    reasons: ClassVar[tuple[str, ...]] = ("DECLARATION_CHANGED",)

    conversation_id = _text("conversationId")
    adapter = _text("adapter")
    pinned_version = _text("pinnedVersion")
    declaration_version = _text("declarationVersion", "The declaration the adapter has now.")


class ConversationAdapterMismatchError(FailedPreconditionError):
    """The conversation belongs to another adapter (`.adapter`) than the one this call named."""

    reasons: ClassVar[tuple[str, ...]] = ("CONVERSATION_ADAPTER_MISMATCH",)

    conversation_id = _text("conversationId")
    adapter = _text("adapter")
    requested_adapter = _text("requestedAdapter")


class AuditWatcherDroppedError(ResourceExhaustedError):
    """A WatchAudit stream fell too far behind and was cut: watch again."""

    reasons: ClassVar[tuple[str, ...]] = ("AUDIT_WATCHER_DROPPED",)


# --- negotiator: bootstrap ----------------------------------------------------------


class NoSeedFoundError(FailedPreconditionError):
    """No seed provides the capability, not even after broadening.

    Do not fall back on an unseeded local tool without the user's explicit
    approval; or add a local seed, verify it, and bootstrap again.
    """

    reasons: ClassVar[tuple[str, ...]] = ("NO_SEED_FOUND",)

    capability = _text("capability")
    domain = _text("domain", "The domain searched first; empty for a store-wide search.")

    @property
    def searches(self) -> tuple[str, ...]:
        """Every search tried, first included: "<capability>@<domain>", or "<capability>" store-wide."""
        return tuple(v.subject for v in self.precondition_violations if v.type == "SEARCH_FOUND_NOTHING")

    fallback_policy = _text("fallbackPolicy")


class SeedChoiceRequiredError(FailedPreconditionError):
    """The top candidates scored too close for the ask policy: ask the user, retry with `seed` set."""

    reasons: ClassVar[tuple[str, ...]] = ("ASK_POLICY_REQUIRES_CHOICE",)

    capability = _text("capability")
    ask_policy = _text("askPolicy")
    candidates = _list(
        "candidates", 'The tied candidates ("<domain>/<id>", best first): the choices to offer.'
    )


class GatesNotApprovedError(FailedPreconditionError):
    """The seed needs gates the call did not approve: get the user's approval, retry with them."""

    reasons: ClassVar[tuple[str, ...]] = ("GATES_NOT_APPROVED",)

    seed = _text("seed")
    required_gates = _list("requiredGates", 'Gate names, e.g. "provider_cost_approval".')
    missing_gates = _list("missingGates")


class SeedNotVerifiedError(FailedPreconditionError):
    """The seed is not verified: verify it (seedstore VerifySeeds), then bootstrap again."""

    reasons: ClassVar[tuple[str, ...]] = ("SEED_NOT_VERIFIED",)

    seed = _text("seed")
    verification_status = _text("verificationStatus", '"unverified" or "failed".')


class SeedCommandError(FailedPreconditionError):
    """The seed's command cannot run here: fix the seed (or install its program), or pick another seed.

    `.reason` tells which: SEED_HAS_NO_COMMAND, SEED_COMMAND_NOT_FOUND (`.program`
    is missing) or SEED_COMMAND_FAILED (could not start, or overflowed its output cap).
    """

    reasons: ClassVar[tuple[str, ...]] = (
        "SEED_HAS_NO_COMMAND",
        "SEED_COMMAND_NOT_FOUND",
        "SEED_COMMAND_FAILED",
    )

    seed = _text("seed")
    program = _text("program", "The program not found; empty for the other reasons.")
    cause = _text("cause")


class OutputSchemaViolationError(InternalError):
    """The adapter's output is not JSON or breaks the schema: report it, or pick another adapter."""

    reasons: ClassVar[tuple[str, ...]] = ("OUTPUT_SCHEMA_VIOLATION",)

    adapter = _text("adapter")

    @property
    def violations(self) -> tuple[SchemaViolation, ...]:
        return tuple(SchemaViolation(v.subject, v.description) for v in self.precondition_violations)


__all__ = [
    "GAP_STATES",
    "UNSUPPORTED_CAPABILITY",
    "AbortedError",
    "AdapterFailureError",
    "AdapterInternalError",
    "AdapterKindMismatchError",
    "AdapterMisconfiguredError",
    "AdapterNotFoundError",
    "AdapterNotProbeableError",
    "AdapterNotRemovableError",
    "AdapterRateLimitedError",
    "AdapterRefusedError",
    "AdapterRegistrationFailedError",
    "AdapterTimeoutError",
    "AdapterUnavailableError",
    "AlreadyExistsError",
    "AmbiguousSeedError",
    "AuditWatcherDroppedError",
    "ConversationAdapterMismatchError",
    "ConversationBusyError",
    "DataLossError",
    "DeadlineExceededError",
    "DeclarationChangedError",
    "DelegationDepthExceededError",
    "FailedPreconditionError",
    "Gap",
    "GatesNotApprovedError",
    "InternalError",
    "InvalidArgumentError",
    "NoSeedFoundError",
    "NotFoundError",
    "OutputSchemaViolationError",
    "PermissionDeniedError",
    "PreconditionViolation",
    "ResourceExhaustedError",
    "RevisionConflictError",
    "SchemaViolation",
    "SeedChoiceRequiredError",
    "SeedCommandError",
    "SeedMalformedError",
    "SeedNotFoundError",
    "SeedNotVerifiedError",
    "SidecarError",
    "StoreUnavailableError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnsupportedCapabilityError",
    "class_for",
    "decode_gaps",
    "from_decoded",
    "from_rpc_error",
    "mapped_stream",
]
