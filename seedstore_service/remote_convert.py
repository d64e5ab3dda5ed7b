"""Proto ⇄ core conversions for `seedstore --server`: the requests it sends, the core values of the replies.

The client's half of `convert`: the core values rebuilt from a response are
the ones the local path renders, so both paths print identical JSON through
`render.py`. Besides the generated code it imports the seed's value types
(`model`); each function that builds a value of `operations`, `ranking` or
`store` imports that module when it is called, so converting a seed alone
(`remote_read`'s inspect) loads none of them, and a reply that carries a
broadening or a verify event imports its module when one arrives. `convert` re-exports every
function here, beside the service's direction. Pure: no I/O, no grpc calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType
from typing import TYPE_CHECKING

from google.protobuf import duration_pb2

from agentsidecar.common.v1 import common_pb2 as common
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service import errors
from agentsidecar.seedstore_service.model import (
    Evidence,
    ListedSeed,
    Outcome,
    Problem,
    Promotion,
    Rank,
    Risk,
    Seed,
    Verification,
    VerificationStatus,
)
from agentsidecar.sidecar_runtime import wire_names

if TYPE_CHECKING:
    from agentsidecar.seedstore_service.broadening import Broadening
    from agentsidecar.seedstore_service.operations import (
        SearchOutcome,
        SeedListing,
        SeedRemoved,
        SeedView,
        VerifyProgress,
        VerifyRequest,
    )
    from agentsidecar.seedstore_service.patch import AddSpec, UpdatePatch
    from agentsidecar.seedstore_service.ranking import RankedCandidate, SearchQuery
    from agentsidecar.seedstore_service.store import StoredSeed

# --- enums ----------------------------------------------------------------------

_STATUS_TO_PROTO = {
    VerificationStatus.VERIFIED: pb.VERIFICATION_STATUS_VERIFIED,
    VerificationStatus.FAILED: pb.VERIFICATION_STATUS_FAILED,
    VerificationStatus.UNVERIFIED: pb.VERIFICATION_STATUS_UNVERIFIED,
}
_STATUS_FROM_PROTO = {value: key for key, value in _STATUS_TO_PROTO.items()}

_MARK_TO_PROTO = {
    VerificationStatus.FAILED: pb.VERIFICATION_MARK_FAILED,
    VerificationStatus.UNVERIFIED: pb.VERIFICATION_MARK_UNVERIFIED,
}

# Risk and gate names <-> the proto enums, matched by member name (agentsidecar.sidecar_runtime.wire_names).
_RISK_TO_PROTO = {risk.value: common.RiskFlag.Value(f"RISK_FLAG_{risk.name}") for risk in wire_names.Risk}
_RISK_FROM_PROTO = {value: key for key, value in _RISK_TO_PROTO.items()}

_GATE_TO_PROTO = {gate.value: common.Gate.Value(f"GATE_{gate.name}") for gate in wire_names.Gate}
_GATE_FROM_PROTO = {value: key for key, value in _GATE_TO_PROTO.items()}


def status_from_proto(value: pb.VerificationStatus.ValueType) -> VerificationStatus:
    try:
        return _STATUS_FROM_PROTO[value]
    except KeyError:
        raise errors.InvalidArgument(f"unknown verification status {value}", "status") from None


def _risks_from_proto(values: Iterable[common.RiskFlag.ValueType]) -> tuple[str, ...]:
    # A risk from a newer server stays listed, by number.
    return tuple(_RISK_FROM_PROTO.get(value) or wire_names.UnknownRisk(int(value)).value for value in values)


def _gates_from_proto(values: Iterable[common.Gate.ValueType]) -> tuple[str, ...]:
    # A gate from a newer server stays listed, under a name no caller can approve.
    return tuple(_GATE_FROM_PROTO.get(value) or wire_names.UnknownGate(int(value)).value for value in values)


def _optional(message: object, field: str) -> str | None:
    return getattr(message, field) if message.HasField(field) else None  # type: ignore[attr-defined]


# --- seeds ----------------------------------------------------------------------


def seed_from_proto(message: pb.Seed) -> Seed:
    rank = message.rank
    verification = message.verification if message.HasField("verification") else None
    return Seed(
        id=message.id,
        domain=message.domain,
        kind=message.kind,
        command=_optional(message, "command"),
        adapter=_optional(message, "adapter"),
        script=_optional(message, "script"),
        provides=tuple(message.provides),
        aliases=tuple(message.aliases),
        rank=Rank(
            default_priority=rank.default_priority if rank.HasField("default_priority") else None,
            preferred_for=tuple(rank.preferred_for),
            avoid_for=tuple(rank.avoid_for),
            tie_breakers=MappingProxyType(dict(sorted(rank.tie_breakers.items()))),
        ),
        evidence=tuple(
            Evidence(
                source=entry.source, command=_optional(entry, "command"), detail=_optional(entry, "detail")
            )
            for entry in message.evidence
        ),
        auth_env=tuple(message.auth_env),
        risk=Risk(external_service=message.risk.external_service, may_cost_money=message.risk.may_cost_money),
        promotion=Promotion(message.promotion.suggested_skill_id) if message.HasField("promotion") else None,
        verification=verification_from_proto(verification) if verification is not None else None,
    )


def verification_from_proto(message: pb.Verification) -> Verification:
    return Verification(
        status=status_from_proto(message.status),
        verified_at_unix=message.verified_at_unix,
        outcomes=outcomes_from_proto(message.outcomes),
    )


def outcomes_from_proto(messages: Iterable[pb.Outcome]) -> tuple[Outcome, ...]:
    return tuple(Outcome(check=message.check, ok=message.ok, message=message.message) for message in messages)


def stored_from_proto(seed: pb.Seed, path: str, revision: str) -> StoredSeed:
    from agentsidecar.seedstore_service.store import StoredSeed

    return StoredSeed(seed_from_proto(seed), path, revision)


# --- problems -------------------------------------------------------------------


def problems_from_proto(messages: Iterable[common.Problem]) -> tuple[Problem, ...]:
    return tuple(Problem(path=message.path, line=message.line, reason=message.reason) for message in messages)


# --- requests -------------------------------------------------------------------


def add_request(spec: AddSpec) -> pb.AddSeedRequest:
    return pb.AddSeedRequest(
        id=spec.id,
        domain=spec.domain,
        kind=spec.kind,
        command=spec.command,
        adapter=spec.adapter,
        script=spec.script,
        provides=spec.provides,
        aliases=spec.aliases,
        preferred_for=spec.preferred_for,
        avoid_for=spec.avoid_for,
        ties=spec.ties,
        auth_env=spec.auth_env,
        priority=spec.priority,
        external_service=spec.external_service,
        may_cost_money=spec.may_cost_money,
        evidence_commands=spec.evidence_commands,
        suggested_skill_id=spec.suggested_skill_id,
    )


def update_request(
    seed_id: str, domain: str | None, patch: UpdatePatch, expected_revision: str | None
) -> pb.UpdateSeedRequest:
    return pb.UpdateSeedRequest(
        id=seed_id,
        domain=domain,
        expected_revision=expected_revision,
        kind=patch.kind,
        command=patch.command,
        clear_command=patch.clear_command,
        adapter=patch.adapter,
        clear_adapter=patch.clear_adapter,
        script=patch.script,
        clear_script=patch.clear_script,
        add_provides=patch.add_provides,
        remove_provides=patch.remove_provides,
        add_aliases=patch.add_aliases,
        remove_aliases=patch.remove_aliases,
        priority=patch.priority,
        clear_priority=patch.clear_priority,
        add_preferred_for=patch.add_preferred_for,
        remove_preferred_for=patch.remove_preferred_for,
        add_avoid_for=patch.add_avoid_for,
        remove_avoid_for=patch.remove_avoid_for,
        add_ties=patch.add_ties,
        remove_ties=patch.remove_ties,
        add_auth_env=patch.add_auth_env,
        remove_auth_env=patch.remove_auth_env,
        external_service=patch.external_service,
        may_cost_money=patch.may_cost_money,
        add_evidence_commands=patch.add_evidence_commands,
        remove_evidence_commands=patch.remove_evidence_commands,
        suggested_skill_id=patch.suggested_skill_id,
        clear_suggested_skill_id=patch.clear_suggested_skill_id,
        mark=_MARK_TO_PROTO[patch.mark] if patch.mark is not None else pb.VERIFICATION_MARK_UNSPECIFIED,
    )


def search_request(query: SearchQuery, broaden: bool) -> pb.SearchSeedsRequest:
    return pb.SearchSeedsRequest(
        capability=query.capability,
        domain=query.domain,
        local_only=query.local_only,
        preferred_seed=query.preferred_seed,
        broaden=broaden,
    )


def verify_request(
    request: VerifyRequest, *, send_timeout: bool = True, send_concurrency: bool = True
) -> pb.VerifySeedsRequest:
    """A limit not sent is left to the server's configured default."""
    message = pb.VerifySeedsRequest(
        ids=request.ids, domain=request.domain, all_in_domain=request.all_in_domain
    )
    if send_timeout:
        message.check_timeout.CopyFrom(seconds_to_duration(request.check_timeout))
    if send_concurrency:
        message.concurrency = request.concurrency
    return message


def seconds_to_duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def duration_to_seconds(duration: duration_pb2.Duration) -> float:
    return float(duration.ToNanoseconds()) / 1e9


# --- responses ------------------------------------------------------------------


def seed_view_from_proto(
    response: pb.AddSeedResponse | pb.UpdateSeedResponse | pb.PreferSeedResponse | pb.InspectSeedResponse,
) -> SeedView:
    from agentsidecar.seedstore_service.operations import SeedView

    problems = () if isinstance(response, pb.AddSeedResponse) else problems_from_proto(response.problems)
    return SeedView(
        response.seed_store, stored_from_proto(response.seed, response.path, response.revision), problems
    )


def listed_seed_from_proto(message: pb.SeedEntry) -> ListedSeed:
    return ListedSeed(
        id=message.id,
        domain=message.domain,
        kind=message.kind,
        path=message.path,
        provides=tuple(message.provides),
        verification_status=status_from_proto(message.verification_status),
        risks=_risks_from_proto(message.risks),
        revision=message.revision,
    )


def listing_from_proto(response: pb.ListSeedsResponse) -> SeedListing:
    from agentsidecar.seedstore_service.operations import SeedListing

    return SeedListing(
        seed_store=response.seed_store,
        domain=_optional(response, "domain"),
        entries=tuple(listed_seed_from_proto(entry) for entry in response.seeds),
        problems=problems_from_proto(response.problems),
    )


def candidate_from_proto(message: common.Candidate) -> RankedCandidate:
    from agentsidecar.seedstore_service.ranking import RankedCandidate

    return RankedCandidate(
        id=message.id,
        domain=message.domain,
        path=message.path,
        score=message.score,
        reasons=tuple(message.reasons),
        risks=_risks_from_proto(message.risks),
        required_gates=_gates_from_proto(message.required_gates),
        matched_capability=message.matched_capability,
        matched_domain=message.matched_domain,
    )


def broadening_from_proto(message: pb.Broadening) -> Broadening:
    # Only a `--broaden` search's reply has one; broadening.py brings the YAML parser.
    from agentsidecar.seedstore_service.broadening import Broadening, BroadeningAttempt

    return Broadening(
        first_search_empty=message.first_search_empty,
        attempts=tuple(
            # "" is the whole store: identifiers are never empty.
            BroadeningAttempt(
                capability=attempt.capability, domain=attempt.domain or None, found=tuple(attempt.found)
            )
            for attempt in message.attempts
        ),
        fallback_policy=message.fallback_policy,
        table_sources=tuple(message.table_sources),
    )


def search_outcome_from_proto(response: pb.SearchSeedsResponse) -> SearchOutcome:
    from agentsidecar.seedstore_service.operations import SearchOutcome
    from agentsidecar.seedstore_service.ranking import SearchResult

    result = SearchResult(
        capability=response.capability,
        domain=_optional(response, "domain"),
        selected=_optional(response, "selected"),
        ask_policy=response.ask_policy.reason if response.HasField("ask_policy") else None,
        candidates=tuple(candidate_from_proto(candidate) for candidate in response.candidates),
    )
    broadening = broadening_from_proto(response.broadening) if response.HasField("broadening") else None
    return SearchOutcome(response.seed_store, result, broadening, problems_from_proto(response.problems))


def removed_from_proto(response: pb.RemoveSeedResponse) -> SeedRemoved:
    from agentsidecar.seedstore_service.operations import SeedRemoved

    return SeedRemoved(
        response.seed_store, response.id, response.path, problems_from_proto(response.problems)
    )


# --- verify events --------------------------------------------------------------


def verify_event_from_proto(response: pb.VerifySeedsResponse) -> VerifyProgress:
    # The runner defines the check events; only `verify` receives them.
    from agentsidecar.seedstore_service.operations import SeedVerified
    from agentsidecar.seedstore_service.runner import CheckFinished, CheckStarted

    which = response.WhichOneof("event")
    if which == "check_started":
        started = response.check_started
        return CheckStarted(
            seed_id=started.id, domain=started.domain, check=started.check, index=started.index
        )
    if which == "check_finished":
        finished = response.check_finished
        return CheckFinished(
            seed_id=finished.id,
            domain=finished.domain,
            check=finished.check,
            index=finished.index,
            ok=finished.ok,
            exit_code=finished.exit_code if finished.HasField("exit_code") else None,
            duration_s=duration_to_seconds(finished.duration),
            message=finished.message,
            output_truncated=finished.output_truncated,
            timed_out=finished.timed_out,
        )
    if which == "seed_verified":
        verified = response.seed_verified
        return SeedVerified(
            id=verified.id,
            domain=verified.domain,
            path=verified.path,
            status=status_from_proto(verified.status),
            outcomes=outcomes_from_proto(verified.outcomes),
            revision=verified.revision,
        )
    raise errors.InvalidArgument("a verify event without an event", "event")
