"""Proto ⇄ core conversions for the seedstore.

Both directions exist for every value the CLI renders: the service turns core
results into responses, and `seedstore --server` turns responses back into
the same core values, so both paths print identical JSON through `render.py`.
The client's direction (requests from core values, core values from replies)
is `remote_convert`, which the CLI imports without the service's modules; its
functions are re-exported here, so `convert` has both. Pure: no I/O, no grpc calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentsidecar.common.v1 import common_pb2 as common
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service import errors, paging
from agentsidecar.seedstore_service.broadening import Broadening
from agentsidecar.seedstore_service.index import ChangeEvent
from agentsidecar.seedstore_service.model import (
    ListedSeed,
    Outcome,
    Problem,
    Seed,
    Verification,
    VerificationStatus,
)
from agentsidecar.seedstore_service.operations import (
    SearchOutcome,
    SeedListing,
    SeedRemoved,
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
    seed_gates,
)
from agentsidecar.seedstore_service.remote_convert import (
    _GATE_TO_PROTO,
    _MARK_TO_PROTO,
    _RISK_TO_PROTO,
    _STATUS_TO_PROTO,
    _optional,
)
from agentsidecar.seedstore_service.remote_convert import add_request as add_request
from agentsidecar.seedstore_service.remote_convert import broadening_from_proto as broadening_from_proto
from agentsidecar.seedstore_service.remote_convert import candidate_from_proto as candidate_from_proto
from agentsidecar.seedstore_service.remote_convert import duration_to_seconds as duration_to_seconds
from agentsidecar.seedstore_service.remote_convert import listed_seed_from_proto as listed_seed_from_proto
from agentsidecar.seedstore_service.remote_convert import listing_from_proto as listing_from_proto
from agentsidecar.seedstore_service.remote_convert import outcomes_from_proto as outcomes_from_proto
from agentsidecar.seedstore_service.remote_convert import problems_from_proto as problems_from_proto
from agentsidecar.seedstore_service.remote_convert import removed_from_proto as removed_from_proto
from agentsidecar.seedstore_service.remote_convert import (
    search_outcome_from_proto as search_outcome_from_proto,
)
from agentsidecar.seedstore_service.remote_convert import search_request as search_request
from agentsidecar.seedstore_service.remote_convert import seconds_to_duration as seconds_to_duration
from agentsidecar.seedstore_service.remote_convert import seed_from_proto as seed_from_proto
from agentsidecar.seedstore_service.remote_convert import seed_view_from_proto as seed_view_from_proto
from agentsidecar.seedstore_service.remote_convert import status_from_proto as status_from_proto
from agentsidecar.seedstore_service.remote_convert import stored_from_proto as stored_from_proto
from agentsidecar.seedstore_service.remote_convert import update_request as update_request
from agentsidecar.seedstore_service.remote_convert import verification_from_proto as verification_from_proto
from agentsidecar.seedstore_service.remote_convert import verify_event_from_proto as verify_event_from_proto
from agentsidecar.seedstore_service.remote_convert import verify_request as verify_request
from agentsidecar.seedstore_service.render import SCAN_MESSAGE
from agentsidecar.seedstore_service.runner import CheckFinished, CheckStarted
from agentsidecar.seedstore_service.seedfile import validate_identifier

if TYPE_CHECKING:
    from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

# --- enums ----------------------------------------------------------------------

_MARK_FROM_PROTO = {value: key for key, value in _MARK_TO_PROTO.items()}

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


def _risks_to_proto(risks: Iterable[str]) -> list[common.RiskFlag.ValueType]:
    return [_RISK_TO_PROTO[risk] for risk in risks]


def _gates_to_proto(gates: Iterable[str]) -> list[common.Gate.ValueType]:
    return [_GATE_TO_PROTO[gate] for gate in gates]


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


def verification_to_proto(verification: Verification) -> pb.Verification:
    return pb.Verification(
        status=status_to_proto(verification.status),
        verified_at_unix=verification.verified_at_unix,
        outcomes=outcomes_to_proto(verification.outcomes),
    )


def outcomes_to_proto(outcomes: Iterable[Outcome]) -> list[pb.Outcome]:
    return [pb.Outcome(check=outcome.check, ok=outcome.ok, message=outcome.message) for outcome in outcomes]


# --- problems -------------------------------------------------------------------


def problems_to_proto(problems: Iterable[Problem]) -> list[common.Problem]:
    return [
        common.Problem(path=problem.path, line=problem.line, reason=problem.reason) for problem in problems
    ]


# --- requests -------------------------------------------------------------------


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


def search_query_from_request(request: pb.SearchSeedsRequest) -> SearchQuery:
    return SearchQuery(
        capability=request.capability,
        domain=_optional(request, "domain"),
        local_only=request.local_only,
        preferred_seed=_optional(request, "preferred_seed"),
    )


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


def _add_listed_seed(seeds: RepeatedCompositeFieldContainer[pb.SeedEntry], entry: ListedSeed) -> pb.SeedEntry:
    """`entry` as a SeedEntry appended to the repeated field `seeds` (made in place, not copied)."""
    return seeds.add(
        id=entry.id,
        domain=entry.domain,
        kind=entry.kind,
        path=entry.path,
        provides=entry.provides,
        verification_status=status_to_proto(entry.verification_status),
        risks=_risks_to_proto(entry.risks),
        revision=entry.revision,
    )


def list_response(listing: SeedListing) -> pb.ListSeedsResponse:
    response = pb.ListSeedsResponse(
        seed_store=listing.seed_store,
        domain=listing.domain,
        problems=problems_to_proto(listing.problems),
    )
    for entry in listing.entries:
        _add_listed_seed(response.seeds, entry)
    return response


def list_page_response(
    listing: SeedListing, request: pb.ListSeedsRequest, max_bytes: int
) -> pb.ListSeedsResponse:
    """The page of `listing` (sorted as `SeedOperations.list_seeds` sorts it) the request asks
    for, its repeated items within `max_bytes` (see `paging`)."""
    response = pb.ListSeedsResponse(seed_store=listing.seed_store, domain=listing.domain)
    seeds = response.seeds

    # Pages size their seeds in order from the first: the page's seeds are the first sized,
    # each sized where it is made, in the reply; the one sized past the budget is dropped.
    def entry_bytes(entry: ListedSeed) -> int:
        return _add_listed_seed(seeds, entry).ByteSize()

    page = paging.page_of(
        listing.entries,
        listing.problems,
        domain=listing.domain,
        page_size=request.page_size,
        page_token=request.page_token,
        max_bytes=max_bytes,
        entry_bytes=entry_bytes,
        problem_bytes=_problem_bytes,
    )
    del seeds[len(page.entries) :]
    response.problems.extend(problems_to_proto(page.problems))
    response.next_page_token = page.next_page_token
    return response


def _problem_bytes(problem: Problem) -> int:
    return common.Problem(path=problem.path, line=problem.line, reason=problem.reason).ByteSize()


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


def remove_response(removed: SeedRemoved) -> pb.RemoveSeedResponse:
    return pb.RemoveSeedResponse(
        seed_store=removed.seed_store,
        id=removed.id,
        path=removed.path,
        removed=True,
        problems=problems_to_proto(paging.reply_problems(removed.problems)),
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
