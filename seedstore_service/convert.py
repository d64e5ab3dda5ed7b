"""Proto ⇄ core conversions for the seedstore.

Both directions exist for every value the CLI renders: the service turns core
results into responses, and `seedstore --server` turns responses back into
the same core values, so both paths print identical JSON through `render.py`.
Pure: no I/O, no grpc calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

from google.protobuf import duration_pb2

from agentsidecar.common.v1 import common_pb2 as common
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service import errors, paging
from agentsidecar.seedstore_service.broadening import Broadening, BroadeningAttempt
from agentsidecar.seedstore_service.index import ChangeEvent
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
from agentsidecar.seedstore_service.operations import (
    SearchOutcome,
    SeedListing,
    SeedRemoved,
    SeedVerified,
    SeedView,
    VerifyProgress,
    VerifyRequest,
)
from agentsidecar.seedstore_service.patch import AddSpec, UpdatePatch
from agentsidecar.seedstore_service.ranking import (
    ASK_WITHIN_POINTS,
    SELECTION_POLICY,
    RankedCandidate,
    SearchQuery,
    SearchResult,
    seed_gates,
)
from agentsidecar.seedstore_service.render import SCAN_MESSAGE
from agentsidecar.seedstore_service.runner import CheckFinished, CheckStarted
from agentsidecar.seedstore_service.seedfile import validate_identifier
from agentsidecar.seedstore_service.store import StoredSeed
from agentsidecar.sidecar_runtime import wire_names

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
_MARK_FROM_PROTO = {value: key for key, value in _MARK_TO_PROTO.items()}

# Risk and gate names <-> the proto enums, matched by member name (agentsidecar.sidecar_runtime.wire_names).
_RISK_TO_PROTO = {risk.value: common.RiskFlag.Value(f"RISK_FLAG_{risk.name}") for risk in wire_names.Risk}
_RISK_FROM_PROTO = {value: key for key, value in _RISK_TO_PROTO.items()}

_GATE_TO_PROTO = {gate.value: common.Gate.Value(f"GATE_{gate.name}") for gate in wire_names.Gate}
_GATE_FROM_PROTO = {value: key for key, value in _GATE_TO_PROTO.items()}

_CHANGE_TO_PROTO = {
    "added": pb.CHANGE_KIND_ADDED,
    "updated": pb.CHANGE_KIND_UPDATED,
    "removed": pb.CHANGE_KIND_REMOVED,
    "verified": pb.CHANGE_KIND_VERIFIED,
    "malformed": pb.CHANGE_KIND_MALFORMED,
}
_CHANGE_FROM_PROTO = {value: key for key, value in _CHANGE_TO_PROTO.items()}


def status_to_proto(status: VerificationStatus) -> pb.VerificationStatus.ValueType:
    return _STATUS_TO_PROTO[status]


def status_from_proto(value: pb.VerificationStatus.ValueType) -> VerificationStatus:
    try:
        return _STATUS_FROM_PROTO[value]
    except KeyError:
        raise errors.InvalidArgument(f"unknown verification status {value}", "status") from None


def _risks_to_proto(risks: Iterable[str]) -> list[common.RiskFlag.ValueType]:
    return [_RISK_TO_PROTO[risk] for risk in risks]


def _risks_from_proto(values: Iterable[common.RiskFlag.ValueType]) -> tuple[str, ...]:
    # A risk from a newer server stays listed, by number.
    return tuple(_RISK_FROM_PROTO.get(value) or wire_names.UnknownRisk(int(value)).value for value in values)


def _gates_to_proto(gates: Iterable[str]) -> list[common.Gate.ValueType]:
    return [_GATE_TO_PROTO[gate] for gate in gates]


def _gates_from_proto(values: Iterable[common.Gate.ValueType]) -> tuple[str, ...]:
    # A gate from a newer server stays listed, under a name no caller can approve.
    return tuple(_GATE_FROM_PROTO.get(value) or wire_names.UnknownGate(int(value)).value for value in values)


def _optional(message: object, field: str) -> str | None:
    return getattr(message, field) if message.HasField(field) else None  # type: ignore[attr-defined]


# --- seeds ----------------------------------------------------------------------


def seed_to_proto(seed: Seed) -> pb.Seed:
    message = pb.Seed(
        id=seed.id,
        domain=seed.domain,
        kind=seed.kind,
        provides=seed.provides,
        aliases=seed.aliases,
        evidence=[
            pb.Evidence(source=entry.source, command=entry.command, detail=entry.detail)
            for entry in seed.evidence
        ],
        auth_env=seed.auth_env,
        risk=pb.Risk(external_service=seed.risk.external_service, may_cost_money=seed.risk.may_cost_money),
    )
    for name, value in (("command", seed.command), ("adapter", seed.adapter), ("script", seed.script)):
        if value is not None:
            setattr(message, name, value)
    rank = message.rank
    if seed.rank.default_priority is not None:
        rank.default_priority = seed.rank.default_priority
    rank.preferred_for.extend(seed.rank.preferred_for)
    rank.avoid_for.extend(seed.rank.avoid_for)
    rank.tie_breakers.update(seed.rank.tie_breakers)
    if seed.promotion is not None:
        message.promotion.suggested_skill_id = seed.promotion.suggested_skill_id
    if seed.verification is not None:
        message.verification.CopyFrom(verification_to_proto(seed.verification))
    return message


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


def verification_to_proto(verification: Verification) -> pb.Verification:
    return pb.Verification(
        status=status_to_proto(verification.status),
        verified_at_unix=verification.verified_at_unix,
        outcomes=outcomes_to_proto(verification.outcomes),
    )


def verification_from_proto(message: pb.Verification) -> Verification:
    return Verification(
        status=status_from_proto(message.status),
        verified_at_unix=message.verified_at_unix,
        outcomes=outcomes_from_proto(message.outcomes),
    )


def outcomes_to_proto(outcomes: Iterable[Outcome]) -> list[pb.Outcome]:
    return [pb.Outcome(check=outcome.check, ok=outcome.ok, message=outcome.message) for outcome in outcomes]


def outcomes_from_proto(messages: Iterable[pb.Outcome]) -> tuple[Outcome, ...]:
    return tuple(Outcome(check=message.check, ok=message.ok, message=message.message) for message in messages)


def stored_from_proto(seed: pb.Seed, path: str, revision: str) -> StoredSeed:
    return StoredSeed(seed_from_proto(seed), path, revision)


# --- problems -------------------------------------------------------------------


def problems_to_proto(problems: Iterable[Problem]) -> list[common.Problem]:
    return [
        common.Problem(path=problem.path, line=problem.line, reason=problem.reason) for problem in problems
    ]


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


def add_spec_from_request(request: pb.AddSeedRequest) -> AddSpec:
    return AddSpec(
        id=request.id,
        domain=request.domain,
        kind=request.kind,
        command=_optional(request, "command"),
        adapter=_optional(request, "adapter"),
        script=_optional(request, "script"),
        provides=tuple(request.provides),
        aliases=tuple(request.aliases),
        preferred_for=tuple(request.preferred_for),
        avoid_for=tuple(request.avoid_for),
        ties=tuple(request.ties),
        auth_env=tuple(request.auth_env),
        priority=request.priority if request.HasField("priority") else None,
        external_service=request.external_service,
        may_cost_money=request.may_cost_money,
        evidence_commands=tuple(request.evidence_commands),
        suggested_skill_id=_optional(request, "suggested_skill_id"),
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


def update_patch_from_request(request: pb.UpdateSeedRequest) -> UpdatePatch:
    """The patch an update request describes; an unknown mark is refused."""
    mark: VerificationStatus | None = None
    if request.mark != pb.VERIFICATION_MARK_UNSPECIFIED:
        try:
            mark = _MARK_FROM_PROTO[request.mark]
        except KeyError:
            raise errors.InvalidArgument(f"unknown verification mark {request.mark}", "mark") from None
    return UpdatePatch(
        kind=_optional(request, "kind"),
        command=_optional(request, "command"),
        clear_command=request.clear_command,
        adapter=_optional(request, "adapter"),
        clear_adapter=request.clear_adapter,
        script=_optional(request, "script"),
        clear_script=request.clear_script,
        add_provides=tuple(request.add_provides),
        remove_provides=tuple(request.remove_provides),
        add_aliases=tuple(request.add_aliases),
        remove_aliases=tuple(request.remove_aliases),
        priority=request.priority if request.HasField("priority") else None,
        clear_priority=request.clear_priority,
        add_preferred_for=tuple(request.add_preferred_for),
        remove_preferred_for=tuple(request.remove_preferred_for),
        add_avoid_for=tuple(request.add_avoid_for),
        remove_avoid_for=tuple(request.remove_avoid_for),
        add_ties=tuple(request.add_ties),
        remove_ties=tuple(request.remove_ties),
        add_auth_env=tuple(request.add_auth_env),
        remove_auth_env=tuple(request.remove_auth_env),
        external_service=request.external_service if request.HasField("external_service") else None,
        may_cost_money=request.may_cost_money if request.HasField("may_cost_money") else None,
        add_evidence_commands=tuple(request.add_evidence_commands),
        remove_evidence_commands=tuple(request.remove_evidence_commands),
        suggested_skill_id=_optional(request, "suggested_skill_id"),
        clear_suggested_skill_id=request.clear_suggested_skill_id,
        mark=mark,
    )


def search_request(query: SearchQuery, broaden: bool) -> pb.SearchSeedsRequest:
    return pb.SearchSeedsRequest(
        capability=query.capability,
        domain=query.domain,
        local_only=query.local_only,
        preferred_seed=query.preferred_seed,
        broaden=broaden,
    )


def search_query_from_request(request: pb.SearchSeedsRequest) -> SearchQuery:
    return SearchQuery(
        capability=request.capability,
        domain=_optional(request, "domain"),
        local_only=request.local_only,
        preferred_seed=_optional(request, "preferred_seed"),
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


def verify_request_from_proto(
    request: pb.VerifySeedsRequest, default_timeout: float, default_concurrency: int
) -> VerifyRequest:
    check_timeout = default_timeout
    if request.HasField("check_timeout"):
        check_timeout = duration_to_seconds(request.check_timeout)
    return VerifyRequest(
        ids=tuple(request.ids),
        domain=_optional(request, "domain"),
        all_in_domain=request.all_in_domain,
        check_timeout=check_timeout,
        concurrency=request.concurrency or default_concurrency,
    )


def seconds_to_duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def duration_to_seconds(duration: duration_pb2.Duration) -> float:
    return float(duration.ToNanoseconds()) / 1e9


# --- responses ------------------------------------------------------------------


def add_response(view: SeedView) -> pb.AddSeedResponse:
    return pb.AddSeedResponse(
        seed_store=view.seed_store,
        path=view.stored.path,
        revision=view.stored.revision,
        seed=seed_to_proto(view.stored.seed),
    )


def update_response(view: SeedView) -> pb.UpdateSeedResponse:
    return pb.UpdateSeedResponse(
        seed_store=view.seed_store,
        path=view.stored.path,
        revision=view.stored.revision,
        seed=seed_to_proto(view.stored.seed),
        problems=problems_to_proto(paging.reply_problems(view.problems)),
    )


def prefer_response(view: SeedView) -> pb.PreferSeedResponse:
    return pb.PreferSeedResponse(
        seed_store=view.seed_store,
        path=view.stored.path,
        revision=view.stored.revision,
        seed=seed_to_proto(view.stored.seed),
        problems=problems_to_proto(paging.reply_problems(view.problems)),
    )


def inspect_response(view: SeedView) -> pb.InspectSeedResponse:
    return pb.InspectSeedResponse(
        seed_store=view.seed_store,
        path=view.stored.path,
        revision=view.stored.revision,
        seed=seed_to_proto(view.stored.seed),
        problems=problems_to_proto(paging.reply_problems(view.problems)),
        required_gates=_gates_to_proto(seed_gates(view.stored.seed)),
    )


def seed_view_from_proto(
    response: pb.AddSeedResponse | pb.UpdateSeedResponse | pb.PreferSeedResponse | pb.InspectSeedResponse,
) -> SeedView:
    problems = () if isinstance(response, pb.AddSeedResponse) else problems_from_proto(response.problems)
    return SeedView(
        response.seed_store, stored_from_proto(response.seed, response.path, response.revision), problems
    )


def listed_seed_to_proto(entry: ListedSeed) -> pb.SeedEntry:
    return pb.SeedEntry(
        id=entry.id,
        domain=entry.domain,
        kind=entry.kind,
        path=entry.path,
        provides=entry.provides,
        verification_status=status_to_proto(entry.verification_status),
        risks=_risks_to_proto(entry.risks),
        revision=entry.revision,
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


def list_response(listing: SeedListing) -> pb.ListSeedsResponse:
    return pb.ListSeedsResponse(
        seed_store=listing.seed_store,
        domain=listing.domain,
        seeds=[listed_seed_to_proto(entry) for entry in listing.entries],
        problems=problems_to_proto(listing.problems),
    )


def list_page_response(
    listing: SeedListing, request: pb.ListSeedsRequest, max_bytes: int
) -> pb.ListSeedsResponse:
    """The page of `listing` the request asks for, its repeated items within `max_bytes` (see `paging`)."""
    page = paging.page_of(
        listing.entries,
        listing.problems,
        domain=listing.domain,
        page_size=request.page_size,
        page_token=request.page_token,
        max_bytes=max_bytes,
        entry_bytes=lambda entry: listed_seed_to_proto(entry).ByteSize(),
        problem_bytes=_problem_bytes,
    )
    return pb.ListSeedsResponse(
        seed_store=listing.seed_store,
        domain=listing.domain,
        seeds=[listed_seed_to_proto(entry) for entry in page.entries],
        problems=problems_to_proto(page.problems),
        next_page_token=page.next_page_token,
    )


def _problem_bytes(problem: Problem) -> int:
    return common.Problem(path=problem.path, line=problem.line, reason=problem.reason).ByteSize()


def listing_from_proto(response: pb.ListSeedsResponse) -> SeedListing:
    return SeedListing(
        seed_store=response.seed_store,
        domain=_optional(response, "domain"),
        entries=tuple(listed_seed_from_proto(entry) for entry in response.seeds),
        problems=problems_from_proto(response.problems),
    )


def candidate_to_proto(candidate: RankedCandidate) -> common.Candidate:
    return common.Candidate(
        id=candidate.id,
        domain=candidate.domain,
        path=candidate.path,
        score=candidate.score,
        reasons=candidate.reasons,
        risks=_risks_to_proto(candidate.risks),
        required_gates=_gates_to_proto(candidate.required_gates),
        matched_capability=candidate.matched_capability,
        matched_domain=candidate.matched_domain,
    )


def candidate_from_proto(message: common.Candidate) -> RankedCandidate:
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


def broadening_to_proto(broadening: Broadening) -> pb.Broadening:
    return pb.Broadening(
        first_search_empty=broadening.first_search_empty,
        attempts=[
            pb.BroadeningAttempt(
                capability=attempt.capability, domain=attempt.domain or "", found=attempt.found
            )
            for attempt in broadening.attempts
        ],
        fallback_policy=broadening.fallback_policy,
        table_sources=broadening.table_sources,
    )


def broadening_from_proto(message: pb.Broadening) -> Broadening:
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


def search_response(
    outcome: SearchOutcome, *, max_candidates: int = 0, max_bytes: int | None = None
) -> pb.SearchSeedsResponse:
    """The reply; with `max_bytes`, its candidates and problems are cut (best candidates kept) to fit.

    Problems take at most a quarter of `max_bytes` (ListSeeds lists them all);
    candidates, at most `max_candidates` (0: the maximum), take what is left.
    """
    result = outcome.result
    if max_candidates < 0:
        raise errors.InvalidArgument("max_candidates must not be negative", "max_candidates")
    most = min(max_candidates or paging.MAX_SEARCH_CANDIDATES, paging.MAX_SEARCH_CANDIDATES)
    problems = outcome.problems
    if max_bytes is not None:
        problems = problems[: paging.bounded_prefix(problems, len(problems), max_bytes // 4, _problem_bytes)]
    response = pb.SearchSeedsResponse(
        seed_store=outcome.seed_store,
        domain=result.domain,
        capability=result.capability,
        selected=result.selected,
        selection_policy=SELECTION_POLICY,
        problems=problems_to_proto(problems),
        total_candidates=len(result.candidates),
        ask_window_points=ASK_WITHIN_POINTS,
    )
    if result.ask_policy is not None:
        response.ask_policy.reason = result.ask_policy
    if outcome.broadening is not None:
        response.broadening.CopyFrom(broadening_to_proto(outcome.broadening))
    candidates = [candidate_to_proto(candidate) for candidate in result.candidates[:most]]
    if max_bytes is not None:
        room = max_bytes - response.ByteSize()
        candidates = candidates[: paging.bounded_prefix(candidates, most, room, lambda c: c.ByteSize())]
    response.candidates.extend(candidates)
    return response


def search_outcome_from_proto(response: pb.SearchSeedsResponse) -> SearchOutcome:
    result = SearchResult(
        capability=response.capability,
        domain=_optional(response, "domain"),
        selected=_optional(response, "selected"),
        ask_policy=response.ask_policy.reason if response.HasField("ask_policy") else None,
        candidates=tuple(candidate_from_proto(candidate) for candidate in response.candidates),
    )
    broadening = broadening_from_proto(response.broadening) if response.HasField("broadening") else None
    return SearchOutcome(response.seed_store, result, broadening, problems_from_proto(response.problems))


def remove_response(removed: SeedRemoved) -> pb.RemoveSeedResponse:
    return pb.RemoveSeedResponse(
        seed_store=removed.seed_store,
        id=removed.id,
        path=removed.path,
        removed=True,
        problems=problems_to_proto(paging.reply_problems(removed.problems)),
    )


def removed_from_proto(response: pb.RemoveSeedResponse) -> SeedRemoved:
    return SeedRemoved(
        response.seed_store, response.id, response.path, problems_from_proto(response.problems)
    )


def scan_response(seed_store: str) -> pb.ScanSeedsResponse:
    return pb.ScanSeedsResponse(seed_store=seed_store, proposals=[], message=SCAN_MESSAGE)


# --- verify events --------------------------------------------------------------


def verify_event_to_proto(seed_store: str, event: VerifyProgress) -> pb.VerifySeedsResponse:
    if isinstance(event, CheckStarted):
        return pb.VerifySeedsResponse(
            seed_store=seed_store,
            check_started=pb.CheckStarted(
                id=event.seed_id, domain=event.domain, check=event.check, index=event.index
            ),
        )
    if isinstance(event, CheckFinished):
        finished = pb.CheckFinished(
            id=event.seed_id,
            domain=event.domain,
            check=event.check,
            index=event.index,
            ok=event.ok,
            exit_code=event.exit_code,
            duration=seconds_to_duration(event.duration_s),
            message=event.message,
            output_truncated=event.output_truncated,
            timed_out=event.timed_out,
        )
        return pb.VerifySeedsResponse(seed_store=seed_store, check_finished=finished)
    verified = pb.SeedVerified(
        id=event.id,
        domain=event.domain,
        path=event.path,
        status=status_to_proto(event.status),
        outcomes=outcomes_to_proto(event.outcomes),
        revision=event.revision,
    )
    return pb.VerifySeedsResponse(seed_store=seed_store, seed_verified=verified)


def verify_event_from_proto(response: pb.VerifySeedsResponse) -> VerifyProgress:
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


# --- watch events ---------------------------------------------------------------


def watch_domain_from_request(request: pb.WatchSeedsRequest) -> str | None:
    if not request.HasField("domain"):
        return None
    return validate_identifier(request.domain, "domain")


def change_to_proto(event: ChangeEvent) -> pb.WatchSeedsResponse:
    message = pb.WatchSeedsResponse(
        kind=_CHANGE_TO_PROTO[event.kind],
        path=event.path,
        id=event.id,
        domain=event.domain,
        revision=event.revision,
    )
    if event.seed is not None:
        message.seed.CopyFrom(seed_to_proto(event.seed))
    if event.problem is not None:
        message.problem.CopyFrom(
            common.Problem(path=event.problem.path, line=event.problem.line, reason=event.problem.reason)
        )
    return message


def change_from_proto(message: pb.WatchSeedsResponse) -> ChangeEvent:
    problem = message.problem if message.HasField("problem") else None
    return ChangeEvent(
        kind=_CHANGE_FROM_PROTO[message.kind],
        path=message.path,
        id=message.id,
        domain=message.domain,
        revision=message.revision,
        seed=seed_from_proto(message.seed) if message.HasField("seed") else None,
        problem=Problem(problem.path, problem.line, problem.reason) if problem is not None else None,
    )
