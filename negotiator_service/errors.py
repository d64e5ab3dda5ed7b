"""The negotiator's error taxonomy. No grpc here: `status.py` maps it once.

Abstract bases group the errors by who must act; only the leaves are raised.

NegotiatorError                     abstract
├── CallerError                     abstract: the call cannot be served as sent
│   ├── InvalidRequest              malformed request; names each bad field
│   ├── ConfigError                 bad config file, or config widening a declaration
│   ├── AdapterNotFound             no adapter with that shortname
│   ├── AdapterAlreadyExists        register with a shortname already taken
│   ├── AdapterKindMismatch         `adapter` names a harness or `agent` a framework
│   ├── UnsupportedCapability       the declaration cannot honour the call (every gap)
│   ├── AdapterNotRemovable         deregister of a config-defined adapter
│   ├── AdapterNotProbeable         ProbeAdapter names an adapter with no upstream to probe
│   ├── AdapterTargetNotAllowed     RegisterAdapter names a host the operator did not allow
│   ├── McpServerNotAllowed         a caller-supplied MCP server the operator's config does not admit
│   ├── DelegationDepthExceeded     the call arrived deeper in a delegation chain than allowed
│   ├── ConversationBusy            another call of the conversation is running (caller set no_wait)
│   ├── DeclarationChanged          the adapter's declaration differs from the conversation's pinned one
│   └── ConversationAdapterMismatch the conversation is bound to another adapter
├── StoreError                      abstract: the negotiator's state directory
│   ├── ConversationStateCorrupt    the stored conversation cannot be read back
│   ├── ConversationStoreFailed     the conversation state could not be read or written
│   └── RegistrationStoreFailed     a runtime registration could not be written
├── UpstreamError                   abstract: an adapter, a remote or the seedstore
│   ├── AdapterFailure              abstract: the adapter failed while running
│   │   ├── AdapterUnavailable      cannot reach it, or it answered garbage it may not repeat
│   │   ├── AdapterTimeout          the caller's time ran out
│   │   ├── AdapterRateLimited      the provider throttled us
│   │   ├── AdapterReplyTooLarge    the reply or status broke the negotiator's own message/metadata limits
│   │   ├── AdapterRefused          the adapter itself refused at its edge
│   │   ├── AdapterMisconfigured    the adapter's own setup is wrong (credentials, binary)
│   │   ├── AdapterInternal         anything else; the cause is named
│   │   ├── McpServerUnavailable    an MCP server of the call could not be started, reached or listed
│   │   └── McpServerTimeout        an MCP server did not finish initialize / tools/list in time
│   ├── AdapterRegistrationFailed   a remote adapter's declaration is missing or invalid
│   ├── OutputSchemaViolation       the adapter's output broke the schema
│   ├── ReplyTooLarge               the reply would exceed the largest message this negotiator sends
│   ├── SeedstoreUnavailable        the seedstore did not answer
│   └── SeedstoreRefused            the seedstore answered with an error
├── SeedRefusal                     abstract: Bootstrap found no seed it may run, or its run failed
│   ├── SeedstoreNotConfigured      Bootstrap without a seedstore address
│   ├── NoSeedFound                 no seed, even after broadening (no unseeded fallback without asking)
│   ├── SeedNotACandidate           the caller's pick is not among the candidates
│   ├── AskPolicyRequiresChoice     the top candidates are too close; the caller must pick
│   ├── GatesNotApproved            the seed requires gates the request does not approve
│   ├── SeedNotVerified             the seed's verification status is not `verified`
│   ├── SeedHasNoCommand            the seed has no runnable command
│   ├── SeedCommandNotFound         the seed's program does not exist here
│   ├── SeedCommandFailed           the seed's command could not start, or overflowed its output cap
│   └── SeedCommandTimeout          the seed's command outlived the caller's time budget
└── WatchEnded                      abstract: the server ended a watch; watch again
    ├── AuditWatcherDropped         a WatchAudit stream fell too far behind and was cut
    └── ShuttingDown                the negotiator is stopping
"""

from __future__ import annotations

from collections.abc import Sequence

from agentsidecar.negotiator_service.model import Decision
from agentsidecar.sidecar_runtime.errortree import TreeError


class NegotiatorError(TreeError, abstract=True):
    """Base of every negotiator error (the rules of the tree: sidecar_runtime.errortree)."""

    reason = "NEGOTIATOR_ERROR"


class CallerError(NegotiatorError, abstract=True):
    """The call cannot be served as sent: the caller changes the request (or waits, when busy)."""


class StoreError(NegotiatorError, abstract=True):
    """The negotiator's own state directory failed or holds something unreadable."""


class UpstreamError(NegotiatorError, abstract=True):
    """Something the negotiator called (an adapter, a remote, the seedstore) failed or answered wrongly."""


class SeedRefusal(NegotiatorError, abstract=True):
    """Bootstrap found no seed it may run for the call, or the seed's command did not complete."""


class WatchEnded(NegotiatorError, abstract=True):
    """The server ended a watch stream; the caller watches again."""


class InvalidRequest(CallerError):
    reason = "INVALID_REQUEST"

    def __init__(self, violations: Sequence[tuple[str, str]]) -> None:
        """`violations` are (field path, description) pairs."""
        self.violations = tuple(violations)
        super().__init__("; ".join(f"{f}: {d}" for f, d in self.violations))


class AdapterNotFound(CallerError):
    reason = "ADAPTER_NOT_FOUND"

    def __init__(self, shortname: str) -> None:
        super().__init__(f'no adapter named "{shortname}"')
        self.shortname = shortname


class AdapterKindMismatch(CallerError):
    reason = "ADAPTER_KIND_MISMATCH"

    def __init__(self, shortname: str, kind: str, selected_by: str) -> None:
        expected = "agent-framework" if selected_by == "adapter" else "agent-harness"
        super().__init__(f'"{shortname}" is an {kind}; `{selected_by}` selects {expected} adapters only')
        self.shortname = shortname
        self.kind = kind
        self.selected_by = selected_by


class UnsupportedCapability(CallerError):
    reason = "UNSUPPORTED_CAPABILITY"

    def __init__(self, decision: Decision) -> None:
        gaps = ", ".join(f"{g.requirement.describe()} ({g.state.value})" for g in decision.gaps)
        super().__init__(f'adapter "{decision.adapter}" cannot honour this call: {gaps}')
        self.decision = decision


class AdapterAlreadyExists(CallerError):
    reason = "ADAPTER_ALREADY_EXISTS"

    def __init__(self, shortname: str) -> None:
        super().__init__(f'an adapter named "{shortname}" is already registered')
        self.shortname = shortname


class AdapterNotRemovable(CallerError):
    reason = "ADAPTER_NOT_REMOVABLE"

    def __init__(self, shortname: str) -> None:
        super().__init__(f'adapter "{shortname}" comes from the config file; edit the config instead')
        self.shortname = shortname


class AdapterNotProbeable(CallerError):
    """ProbeAdapter named an adapter whose implementation has no upstream to probe."""

    reason = "ADAPTER_NOT_PROBEABLE"

    def __init__(self, shortname: str, implementation: str) -> None:
        super().__init__(
            f'adapter "{shortname}" is a {implementation} adapter; only openai adapters can be probed'
        )
        self.shortname = shortname
        self.implementation = implementation


class ConfigError(CallerError):
    reason = "CONFIG_INVALID"


class AdapterRegistrationFailed(UpstreamError):
    """A remote adapter answered, but with a declaration that cannot be registered."""

    reason = "ADAPTER_REGISTRATION_FAILED"

    def __init__(self, target: str, cause: str, shortname: str = "") -> None:
        named = f'adapter "{shortname}" at {target}' if shortname else f"the adapter at {target}"
        super().__init__(f"cannot register {named}: {cause}")
        self.target = target
        self.cause = cause
        self.shortname = shortname


class AdapterTargetNotAllowed(CallerError):
    """RegisterAdapter named a TCP host other than loopback that the operator did not allow.

    Refused before any connection is tried, so RegisterAdapter cannot probe
    which hosts and ports answer.
    """

    reason = "ADAPTER_TARGET_NOT_ALLOWED"

    def __init__(self, target: str, host: str) -> None:
        super().__init__(
            f"cannot register an adapter at {target}: runtime registration reaches Unix sockets and "
            f'loopback addresses only, and "{host}" is not among the hosts the operator allowed '
            "(negotiator serve --allow-adapter-hosts)"
        )
        self.target = target
        self.host = host


class RegistrationStoreFailed(StoreError):
    """Writing the runtime registrations to the state directory failed (disk full, permissions).

    The registration or removal it was for did not happen: the file and the
    adapters stay as they were.
    """

    reason = "REGISTRATION_STORE_FAILED"

    def __init__(self, adapter: str, cause: str) -> None:
        super().__init__(f'cannot store the registration of adapter "{adapter}": {cause}')
        self.adapter = adapter
        self.cause = cause


class ConversationBusy(CallerError):
    """Another call of the conversation holds it, and the caller asked not to wait."""

    reason = "CONVERSATION_BUSY"

    def __init__(self, conversation_id: str) -> None:
        super().__init__(
            f'conversation "{conversation_id}" is running another call; retry later, or omit no_wait to queue'
        )
        self.conversation_id = conversation_id


class DeclarationChanged(CallerError):
    """The adapter's declaration is not the one the conversation was pinned to at its first call."""

    reason = "DECLARATION_CHANGED"

    def __init__(self, conversation_id: str, adapter: str, pinned_version: str, current_version: str) -> None:
        super().__init__(
            f'conversation "{conversation_id}" is pinned to declaration {pinned_version} of adapter '
            f'"{adapter}", which now declares {current_version}; set options.new_conversation to start afresh'
        )
        self.conversation_id = conversation_id
        self.adapter = adapter
        self.pinned_version = pinned_version
        self.current_version = current_version


class ConversationAdapterMismatch(CallerError):
    """A conversation belongs to the adapter of its first call; its state means nothing to another."""

    reason = "CONVERSATION_ADAPTER_MISMATCH"

    def __init__(self, conversation_id: str, bound_adapter: str, requested_adapter: str) -> None:
        super().__init__(
            f'conversation "{conversation_id}" belongs to adapter "{bound_adapter}", not '
            f'"{requested_adapter}"; set options.new_conversation to start afresh with "{requested_adapter}"'
        )
        self.conversation_id = conversation_id
        self.bound_adapter = bound_adapter
        self.requested_adapter = requested_adapter


class ConversationStateCorrupt(StoreError):
    """The stored record of a conversation is unreadable; options.new_conversation replaces it."""

    reason = "CONVERSATION_STATE_CORRUPT"

    def __init__(self, conversation_id: str, cause: str) -> None:
        super().__init__(
            f'the stored state of conversation "{conversation_id}" is unreadable ({cause}); '
            "set options.new_conversation to start afresh"
        )
        self.conversation_id = conversation_id
        self.cause = cause


class ConversationStoreFailed(StoreError):
    """Reading or writing the conversation store failed (disk full, permissions)."""

    reason = "CONVERSATION_STORE_FAILED"

    def __init__(self, conversation_id: str, cause: str) -> None:
        super().__init__(f'cannot store conversation "{conversation_id}": {cause}')
        self.conversation_id = conversation_id
        self.cause = cause


class DelegationDepthExceeded(CallerError):
    """A call arrived at a delegation depth above the limit that applies to it (0 is top level)."""

    reason = "DELEGATION_DEPTH_EXCEEDED"

    def __init__(self, attempted: int, max_depth: int, limit: str) -> None:
        """`limit` names where `max_depth` comes from: "options.max_depth.depth" or "limits.max_depth"."""
        forbids = "; 0 forbids delegation" if max_depth == 0 else ""
        super().__init__(
            f"a call at delegation depth {attempted} exceeds the maximum depth {max_depth} "
            f"({limit}{forbids}); depth 0 is a top-level call"
        )
        self.attempted = attempted
        self.max_depth = max_depth
        self.limit = limit


class AuditWatcherDropped(WatchEnded):
    """A WatchAudit stream did not keep up; it is cut rather than let it slow any call down."""

    reason = "AUDIT_WATCHER_DROPPED"

    def __init__(self, queue_size: int) -> None:
        super().__init__(
            f"this audit watch fell more than {queue_size} records behind and was dropped; "
            "watch again (the audit log file, when configured, has every record)"
        )
        self.queue_size = queue_size


class ShuttingDown(WatchEnded):
    """The negotiator is stopping: an open watch ends so that shutdown need not wait for it."""

    reason = "SHUTTING_DOWN"

    def __init__(self) -> None:
        super().__init__("the negotiator is shutting down; watch again (another instance, or after restart)")


class OutputSchemaViolation(UpstreamError):
    reason = "OUTPUT_SCHEMA_VIOLATION"

    def __init__(self, adapter: str, violations: Sequence[tuple[str, str]]) -> None:
        """`violations` are (JSON pointer into the output, message) pairs."""
        self.adapter = adapter
        self.violations = tuple(violations)
        listed = "; ".join(f"{p or '/'}: {m}" for p, m in self.violations)
        super().__init__(f'adapter "{adapter}" returned output that violates the schema: {listed}')


class ReplyTooLarge(UpstreamError):
    """The adapter answered, but the reply is larger than the negotiator may send.

    Checked before anything is committed: the call fails whole, its
    conversation keeps the state before it.
    """

    reason = "REPLY_TOO_LARGE"

    def __init__(self, adapter: str, size: int, limit: int) -> None:
        super().__init__(
            f'the reply of adapter "{adapter}" is {size} bytes, over the largest message this '
            f"negotiator sends ({limit} bytes, --max-message-bytes); nothing was committed"
        )
        self.adapter = adapter
        self.size = size
        self.limit = limit


class AdapterFailure(UpstreamError, abstract=True):
    """The adapter failed while running a call; each subclass names how."""

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


class AdapterReplyTooLarge(AdapterFailure):
    """The adapter's reply (or its error status) broke the negotiator's own message or metadata limits."""

    reason = "ADAPTER_REPLY_TOO_LARGE"


class AdapterRefused(AdapterFailure):
    reason = "ADAPTER_REFUSED"


class AdapterMisconfigured(AdapterFailure):
    reason = "ADAPTER_MISCONFIGURED"


class AdapterInternal(AdapterFailure):
    reason = "ADAPTER_INTERNAL"


# --- MCP servers (mcp_policy.py, mcp_tools.py) -------------------------------------


class McpServerNotAllowed(CallerError):
    """A caller-supplied MCP server that the operator's `mcp:` config does not admit (before dispatch)."""

    reason = "MCP_SERVER_NOT_ALLOWED"

    def __init__(self, server: str, rule: str, detail: str) -> None:
        super().__init__(f'MCP server "{server}" is not allowed: {detail}')
        self.server = server
        self.rule = rule


class McpServerUnavailable(AdapterFailure):
    """An MCP server of the call could not be started or reached, or failed initialize / tools/list."""

    reason = "MCP_SERVER_UNAVAILABLE"

    def __init__(self, adapter: str, cause: str, *, server: str = "") -> None:
        super().__init__(adapter, f'MCP server "{server}": {cause}' if server else cause)
        self.server = server


class McpServerTimeout(AdapterFailure):
    """An MCP server did not finish initialize or tools/list within the start timeout."""

    reason = "MCP_SERVER_TIMEOUT"

    def __init__(self, adapter: str, cause: str, *, server: str = "") -> None:
        super().__init__(adapter, f'MCP server "{server}": {cause}' if server else cause)
        self.server = server


# --- capability bootstrap (bootstrap.py) -------------------------------------------


class SeedstoreNotConfigured(SeedRefusal):
    """Bootstrap needs a seedstore, and this negotiator was started without one."""

    reason = "SEEDSTORE_NOT_CONFIGURED"

    def __init__(self) -> None:
        super().__init__(
            "this negotiator has no seedstore configured, so it cannot bootstrap capabilities; "
            "start it with the seedstore's address (negotiator serve --seedstore ADDR)"
        )


class SeedstoreUnavailable(UpstreamError):
    """The seedstore did not answer (not running, unreachable, shutting down, too slow)."""

    reason = "SEEDSTORE_UNAVAILABLE"

    def __init__(self, target: str, cause: str) -> None:
        super().__init__(f"cannot reach the seedstore at {target}: {cause}")
        self.target = target
        self.cause = cause


class SeedstoreRefused(UpstreamError):
    """The seedstore answered with an error other than unavailability or a bad request field."""

    reason = "SEEDSTORE_REFUSED"

    def __init__(self, target: str, code: str, seedstore_reason: str, cause: str) -> None:
        """`code` is the seedstore's status code name, `seedstore_reason` its ErrorInfo reason."""
        super().__init__(f"the seedstore at {target} refused: {cause} ({code} {seedstore_reason})".strip())
        self.target = target
        self.code = code
        self.seedstore_reason = seedstore_reason
        self.cause = cause


class NoSeedFound(SeedRefusal):
    """No seed matched, not even after broadening; an unseeded fallback needs the caller's approval."""

    reason = "NO_SEED_FOUND"

    def __init__(
        self,
        capability: str,
        domain: str | None,
        searches: Sequence[tuple[str, str | None]],
        fallback_policy: str,
    ) -> None:
        """`searches` are the (capability, domain or None for the whole store) pairs tried, first included."""
        where = f'in domain "{domain}"' if domain else "in any domain"
        super().__init__(
            f'no capability seed provides "{capability}" {where}, not even after '
            f"{len(searches)} searches of it and its related terms; using an unseeded local fallback "
            "needs the caller's explicit approval, or add a local seed and verify it first"
        )
        self.capability = capability
        self.domain = domain
        self.searches = tuple(searches)
        self.fallback_policy = fallback_policy


class SeedNotACandidate(SeedRefusal):
    """The caller picked a seed the search did not return."""

    reason = "SEED_NOT_A_CANDIDATE"

    def __init__(self, seed: str, capability: str, candidates: Sequence[str]) -> None:
        listed = ", ".join(candidates) or "none"
        super().__init__(
            f'seed "{seed}" is not among the candidates for "{capability}" (candidates: {listed})'
        )
        self.seed = seed
        self.capability = capability
        self.candidates = tuple(candidates)


class AskPolicyRequiresChoice(SeedRefusal):
    """The top candidates score too close to choose, and the caller picked none."""

    reason = "ASK_POLICY_REQUIRES_CHOICE"

    def __init__(self, capability: str, ask_policy: str, tied: Sequence[tuple[str, int]]) -> None:
        """`tied` are the ("domain/id", score) pairs the caller should choose from, best first."""
        listed = ", ".join(f"{seed} (score {score})" for seed, score in tied)
        super().__init__(
            f'the top candidates for "{capability}" are too close to choose ({ask_policy}); '
            f"pick one with `seed`: {listed}"
        )
        self.capability = capability
        self.ask_policy = ask_policy
        self.tied = tuple(tied)


class GatesNotApproved(SeedRefusal):
    """The seed requires gates the request does not approve."""

    reason = "GATES_NOT_APPROVED"

    def __init__(self, seed: str, required: Sequence[str], missing: Sequence[str]) -> None:
        super().__init__(
            f'seed "{seed}" requires approval of {", ".join(required)}; not approved: {", ".join(missing)}'
        )
        self.seed = seed
        self.required = tuple(required)
        self.missing = tuple(missing)


class SeedNotVerified(SeedRefusal):
    """An unverified (or failed) seed is not run until it is verified."""

    reason = "SEED_NOT_VERIFIED"

    def __init__(self, seed: str, status: str) -> None:
        super().__init__(
            f'seed "{seed}" is {status}, not verified; verify it (seedstore VerifySeeds) before running it'
        )
        self.seed = seed
        self.status = status


class SeedHasNoCommand(SeedRefusal):
    """The chosen seed has no command line that can be run."""

    reason = "SEED_HAS_NO_COMMAND"

    def __init__(self, seed: str, cause: str) -> None:
        super().__init__(f'seed "{seed}" cannot be run: {cause}')
        self.seed = seed
        self.cause = cause


class SeedCommandNotFound(SeedRefusal):
    """The seed's program does not exist here (on this negotiator's PATH, or at its path)."""

    reason = "SEED_COMMAND_NOT_FOUND"

    def __init__(self, seed: str, program: str, cause: str) -> None:
        super().__init__(f'seed "{seed}": cannot run "{program}": not found ({cause})')
        self.seed = seed
        self.program = program
        self.cause = cause


class SeedCommandFailed(SeedRefusal):
    """The seed's command could not be started (permissions, not executable) or overflowed its output cap."""

    reason = "SEED_COMMAND_FAILED"

    def __init__(self, seed: str, cause: str) -> None:
        super().__init__(f'seed "{seed}": its command failed: {cause}')
        self.seed = seed
        self.cause = cause


class SeedCommandTimeout(SeedRefusal):
    """The seed's command outlived the caller's time budget; its process group was killed."""

    reason = "SEED_COMMAND_TIMEOUT"

    def __init__(self, seed: str, seconds: float, limit: str) -> None:
        super().__init__(f'seed "{seed}": its command did not finish within {seconds:g} s ({limit})')
        self.seed = seed
        self.seconds = seconds
        self.limit = limit
