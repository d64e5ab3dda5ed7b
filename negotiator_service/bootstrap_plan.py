"""Capability bootstrap, the pure plan: what a Bootstrap request may run, decided from what the
seedstore sent. No I/O, no grpc, no generated code; `agentsidecar.negotiator_service.bootstrap` is the shell
that asks the seedstore and runs the command. The rules are written out in
docs/ranking-and-gates.md.

The steps, none of which a request can skip:

1. The seedstore's broadened search gives the candidates, the selection and
   the ask policy, returned exactly as it ranked them. Without `run`, that is
   the whole answer.
2. With `run`, the seed is the caller's pick, which must be one of the
   candidates, or else the search's selection. When the ask policy withheld
   the selection (the top two within the window the seedstore sent) the
   caller must pick; with no candidates at all nothing runs: an unseeded
   local fallback needs the caller's explicit approval, or a seed added and
   verified first.
3. Every gate the seed requires must be approved: the gates its candidate
   carried and the gates the seedstore derives from the seed's file when it
   is read again, so a seed edited between the search and the run cannot slip
   a new risk past the caller. The seedstore alone derives gates; a gate this
   build has no name for stays listed (`UnknownGate`) and cannot be approved.
4. The seed, as read again, must be `verified` and have a command, which is
   split into argv like a shell would split it, and never run by one.

Each step leaves a line of evidence, returned with the run.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from agentsidecar.negotiator_service.errors import (
    AskPolicyRequiresChoice,
    GatesNotApproved,
    InvalidRequest,
    NoSeedFound,
    SeedHasNoCommand,
    SeedNotACandidate,
    SeedNotVerified,
)
from agentsidecar.sidecar_runtime.wire_names import Gate, GateValue, RiskValue, UnknownGate

__all__ = [
    "BootstrapCall",
    "BootstrapResult",
    "BootstrapRun",
    "Candidate",
    "Choice",
    "RunPlan",
    "SearchAttempt",
    "SearchOutcome",
    "SeedFacts",
    "check_gates",
    "choose",
    "environment_evidence",
    "gates_evidence",
    "merged_gates",
    "plan_run",
    "run_evidence",
    "search_evidence",
    "searches_tried",
    "selection_evidence",
    "validate_call",
    "verification_evidence",
]

VERIFIED = "verified"
STDERR_EVIDENCE_CHARS = 200


@dataclass(frozen=True, slots=True)
class BootstrapCall:
    """A Bootstrap request. `seed`, `approved_gates` and `prompt` only mean something with `run`."""

    capability: str
    domain: str | None = None
    local_only: bool = False
    seed: str | None = None  # "<domain>/<id>"
    approved_gates: frozenset[Gate] = frozenset()
    run: bool = False
    prompt: str = ""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One ranked seed, as the seedstore returned it."""

    id: str
    domain: str
    path: str
    score: int
    reasons: tuple[str, ...]
    risks: tuple[RiskValue, ...] = ()
    required_gates: tuple[GateValue, ...] = ()  # as the seedstore derived them, unknown ones kept
    matched_capability: str = ""  # set when a broadened search found it
    matched_domain: str = ""

    @property
    def ref(self) -> str:
        return f"{self.domain}/{self.id}"


@dataclass(frozen=True, slots=True)
class SearchAttempt:
    capability: str
    domain: str | None  # None: the whole store
    found: tuple[str, ...]  # "<domain>/<id>"


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    """A broadened search, as the seedstore answered it."""

    capability: str
    domain: str | None
    local_only: bool
    candidates: tuple[Candidate, ...]
    selected: str | None  # "<domain>/<id>"; None when there is nothing, or the caller must choose
    ask_policy: str | None
    selection_policy: str
    first_search_empty: bool
    attempts: tuple[SearchAttempt, ...]  # when the first search was empty: every search, first included
    fallback_policy: str
    # The seedstore's ask window: with the top two this close, it selected nothing.
    ask_window: int


@dataclass(frozen=True, slots=True)
class SeedFacts:
    """What the seed's file says now (InspectSeed), as far as running it is concerned."""

    ref: str
    command: str | None
    verification_status: str  # "verified" | "failed" | "unverified"
    verified_at_unix: int | None
    checks: tuple[tuple[str, bool], ...]  # (check name, passed), from the last verification
    required_gates: tuple[GateValue, ...]  # the seedstore's, for the file as read now
    auth_env: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Choice:
    candidate: Candidate
    picked_by_caller: bool


@dataclass(frozen=True, slots=True)
class RunPlan:
    """A seed cleared to run."""

    seed: str
    argv: tuple[str, ...]
    required_gates: tuple[GateValue, ...]
    auth_env: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BootstrapRun:
    seed: str
    argv: tuple[str, ...]
    exit_code: int  # negative: killed by that signal
    output: str
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    candidates: tuple[Candidate, ...]
    selected: str | None
    ask_policy: str | None
    run: BootstrapRun | None = None


def validate_call(call: BootstrapCall) -> None:
    """Raise InvalidRequest naming every unusable field; fields that only steer a run need `run`."""
    problems: list[tuple[str, str]] = []
    if not call.capability:
        problems.append(("capability", "is required"))
    if call.seed is not None:
        domain, slash, seed_id = call.seed.partition("/")
        if not slash or not domain or not seed_id or "/" in seed_id:
            problems.append(("seed", f'must be "<domain>/<id>", not {call.seed!r}'))
    if not call.run:
        # Refused rather than ignored: a caller who sends them expects them to count.
        for name, given in (
            ("seed", call.seed is not None),
            ("approved_gates", bool(call.approved_gates)),
            ("prompt", bool(call.prompt)),
        ):
            if given:
                problems.append((name, "only applies to a run; set run, or leave it out to list candidates"))
    if problems:
        raise InvalidRequest(problems)


def searches_tried(outcome: SearchOutcome) -> tuple[tuple[str, str | None], ...]:
    if outcome.attempts:
        return tuple((attempt.capability, attempt.domain) for attempt in outcome.attempts)
    return ((outcome.capability, outcome.domain),)


def choose(call: BootstrapCall, outcome: SearchOutcome) -> Choice:
    """The seed to run: the caller's pick, else the search's selection; never around the ask policy."""
    candidates = outcome.candidates
    if not candidates:
        raise NoSeedFound(call.capability, call.domain, searches_tried(outcome), outcome.fallback_policy)
    if call.seed is not None:
        for candidate in candidates:
            if candidate.ref == call.seed:
                return Choice(candidate, picked_by_caller=True)
        raise SeedNotACandidate(call.seed, call.capability, [c.ref for c in candidates])
    if outcome.selected is not None:
        for candidate in candidates:
            if candidate.ref == outcome.selected:
                return Choice(candidate, picked_by_caller=False)
    # The ask policy applies: offer every candidate as close to the top as the runner-up may be.
    top = candidates[0].score
    tied = [c for c in candidates if top - c.score <= outcome.ask_window]
    if len(tied) < 2:  # no selection without the usual tie: still the caller's choice, among the top two
        tied = list(candidates[:2])
    raise AskPolicyRequiresChoice(
        call.capability, outcome.ask_policy or "no_selection", [(c.ref, c.score) for c in tied]
    )


def merged_gates(*gate_lists: Sequence[GateValue]) -> tuple[GateValue, ...]:
    """Every gate of the lists once: known gates in `Gate` order, then unknown ones by number."""
    present = {gate for gates in gate_lists for gate in gates}
    unknown = sorted((gate for gate in present if isinstance(gate, UnknownGate)), key=lambda g: g.number)
    return (*(gate for gate in Gate if gate in present), *unknown)


def check_gates(seed: str, required: Sequence[GateValue], approved: frozenset[Gate]) -> None:
    """Refuse unless every required gate is approved; an `UnknownGate` never is, so it is always missing."""
    missing = [gate for gate in required if gate not in approved]
    if missing:
        raise GatesNotApproved(seed, [g.value for g in required], [g.value for g in missing])


def plan_run(choice: Choice, facts: SeedFacts, approved: frozenset[Gate]) -> RunPlan:
    """Clear the chosen seed to run, as its file reads now: gates, verification, command."""
    seed = choice.candidate.ref
    required = merged_gates(choice.candidate.required_gates, facts.required_gates)
    check_gates(seed, required, approved)
    if facts.verification_status != VERIFIED:
        raise SeedNotVerified(seed, facts.verification_status)
    command = facts.command
    if command is None or not command.strip():
        raise SeedHasNoCommand(seed, "it declares no command")
    try:
        argv = tuple(shlex.split(command))
    except ValueError as exc:
        raise SeedHasNoCommand(
            seed, f"its command {command!r} cannot be split into arguments: {exc}"
        ) from exc
    if any("\0" in arg for arg in argv):
        raise SeedHasNoCommand(seed, "its command contains a NUL byte")
    return RunPlan(seed=seed, argv=argv, required_gates=required, auth_env=facts.auth_env)


def _where(domain: str | None) -> str:
    return f'domain "{domain}"' if domain else "every domain"


def search_evidence(outcome: SearchOutcome) -> tuple[str, ...]:
    constraint = ", local only" if outcome.local_only else ""
    first = (
        f'search: "{outcome.capability}" in {_where(outcome.domain)}{constraint} '
        f"({outcome.selection_policy}): "
    )
    if not outcome.first_search_empty:
        refs = ", ".join(c.ref for c in outcome.candidates) or "nothing"
        return (first + f"found {refs}; no broadening needed",)
    lines = [first + f"found nothing; broadened through {max(len(outcome.attempts) - 1, 0)} related searches"]
    for index, attempt in enumerate(outcome.attempts[1:], start=1):
        found = ", ".join(attempt.found) or "nothing"
        lines.append(f'search {index}: "{attempt.capability}" in {_where(attempt.domain)}: found {found}')
    return tuple(lines)


def selection_evidence(choice: Choice, outcome: SearchOutcome) -> str:
    candidate = choice.candidate
    matched = (
        f'; matched via "{candidate.matched_capability}" in {_where(candidate.matched_domain or None)}'
        if candidate.matched_capability
        else ""
    )
    scores = ", ".join(f"{c.ref}={c.score}" for c in outcome.candidates)
    if choice.picked_by_caller:
        policy = f"; ask policy: {outcome.ask_policy}" if outcome.ask_policy else ""
        return f"selection: {candidate.ref} picked by caller from [{scores}]{policy}{matched}"
    others = [c for c in outcome.candidates if c.ref != candidate.ref]
    why = (
        f"more than {outcome.ask_window} points ahead of {others[0].ref}" if others else "the only candidate"
    )
    return (
        f"selection: {candidate.ref} selected by policy {outcome.selection_policy} "
        f"({why}) from [{scores}]{matched}"
    )


def gates_evidence(required: Sequence[GateValue], approved: frozenset[Gate]) -> str:
    if not required:
        return "gates: none required"
    approved_listed = ", ".join(g.value for g in Gate if g in approved)
    return f"gates: required {', '.join(g.value for g in required)}; approved {approved_listed}"


def verification_evidence(facts: SeedFacts) -> str:
    when = (
        datetime.fromtimestamp(facts.verified_at_unix, UTC).isoformat().replace("+00:00", "Z")
        if facts.verified_at_unix is not None
        else "an unknown time"
    )
    checks = ", ".join(f"{name} {'ok' if ok else 'failed'}" for name, ok in facts.checks) or "none recorded"
    return f"verification: {facts.verification_status} at {when}; checks: {checks}"


def environment_evidence(base: Sequence[str], passed: Sequence[str], unset: Sequence[str]) -> str:
    line = f"environment: {', '.join(base) or 'empty'}"
    if passed:
        line += f"; the seed's auth env {', '.join(passed)} (secret_use_approval approved)"
    if unset:
        line += f"; auth env not set here: {', '.join(unset)}"
    return line


def run_evidence(argv: Sequence[str], exit_code: int, seconds: float, output_bytes: int, stderr: str) -> str:
    how = f"was killed by signal {-exit_code}" if exit_code < 0 else f"exited with {exit_code}"
    line = f"run: argv {list(argv)!r} {how} after {seconds:.3f} s; {output_bytes} bytes of output"
    tail = stderr.strip()
    if exit_code != 0 and tail:
        line += f"; stderr: {tail[-STDERR_EVIDENCE_CHARS:]}"
    return line
