"""Capability bootstrap (seed 001): seeds for a capability no adapter declares, and one gated run.

The steps, none of which a request can skip:

1. Search the seedstore for the capability, broadening through equivalent
   capabilities and domains when the first search is empty. The candidates,
   the selection and the ask policy are returned exactly as the seedstore
   ranked them. Without `run`, that is the whole answer.
2. With `run`, choose the seed: the caller's pick, which must be one of the
   candidates, or else the search's selection. When the ask policy withheld
   the selection (the top two within 10 points) the caller must pick; when
   there are no candidates at all nothing runs: an unseeded local fallback
   needs the caller's explicit approval, or a seed added and verified first.
3. Every gate the seed requires must be approved: the gates the search
   reported and the gates the seed's current file implies, so a seed edited
   between the search and the run cannot slip a new risk past the caller.
4. The seed, read again from the seedstore, must be `verified` and have a command.
5. The command runs through the command adapter's harness: argv from
   `shlex.split` (no shell), the prompt on stdin, its own process group,
   killed when the caller's time runs out or the call is cancelled. It gets
   the command adapter's minimal environment plus the variables the seed
   names under `auth.env`, which only a `secret_use_approval` gets this far.
   A non-zero exit is an answer (with its exit code), not an error.

The run comes back with its evidence trail: the searches, the selection rule,
the gates, the verification, the environment and the run itself.

Everything above the "shell" line is pure. Below it: `GrpcSeedSource` (the
seedstore over gRPC) and `Bootstrapper` (the steps, the process, the audit record).
"""

from __future__ import annotations

import enum
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import grpc
from agentsidecar.common.v1 import common_pb2
from agentsidecar.seedstore.v1 import seedstore_pb2 as spb

from clients.aio import AsyncSeedStoreClient
from clients.channel import CLIENT_TIMEOUT, Timeout, metadata_interceptors, open_channel
from clients.errors import SidecarError
from negotiator_service.adapters.command import (
    DEFAULT_OUTPUT_CAP_BYTES,
    DEFAULT_TIMEOUT_SECONDS,
    OutputTooLarge,
    RunSettings,
    collect,
    is_loader_variable,
    locate_program,
    minimal_env,
    start_process,
)
from negotiator_service.audit import AuditLog
from negotiator_service.errors import (
    AskPolicyRequiresChoice,
    GatesNotApproved,
    InvalidRequest,
    NegotiatorError,
    NoSeedFound,
    SeedCommandFailed,
    SeedCommandNotFound,
    SeedCommandTimeout,
    SeedHasNoCommand,
    SeedNotACandidate,
    SeedNotVerified,
    SeedstoreNotConfigured,
    SeedstoreRefused,
    SeedstoreUnavailable,
)
from negotiator_service.model import AuditOutcome, AuditRecord
from sidecar_runtime.addresses import parse_address
from sidecar_runtime.tracing import trace_metadata

# SkillSpec: "If the top two candidates are within 10 points, selected is null".
ASK_POLICY_WINDOW = 10
VERIFIED = "verified"
AUDIT_OPERATION = "bootstrap"
STDERR_EVIDENCE_CHARS = 200


class Gate(enum.Enum):
    """Approvals a seed may require, in SkillSpec's order."""

    PROVIDER_COST_APPROVAL = "provider_cost_approval"
    EXTERNAL_SERVICE_APPROVAL = "external_service_approval"
    SECRET_USE_APPROVAL = "secret_use_approval"


class Risk(enum.Enum):
    EXTERNAL_SERVICE = "external_service"
    MAY_COST_MONEY = "may_cost_money"


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
    risks: tuple[Risk, ...] = ()
    required_gates: tuple[Gate, ...] = ()
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


@dataclass(frozen=True, slots=True)
class SeedFacts:
    """What the seed's file says now (InspectSeed), as far as running it is concerned."""

    ref: str
    command: str | None
    verification_status: str  # "verified" | "failed" | "unverified"
    verified_at_unix: int | None
    checks: tuple[tuple[str, bool], ...]  # (check name, passed), from the last verification
    risks: tuple[Risk, ...]
    auth_env: tuple[str, ...]

    @property
    def required_gates(self) -> tuple[Gate, ...]:
        return gates_for(self.risks, self.auth_env)


@dataclass(frozen=True, slots=True)
class Choice:
    candidate: Candidate
    picked_by_caller: bool


@dataclass(frozen=True, slots=True)
class RunPlan:
    """A seed cleared to run."""

    seed: str
    argv: tuple[str, ...]
    required_gates: tuple[Gate, ...]
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


# --- pure ------------------------------------------------------------------------------


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


def gates_for(risks: Sequence[Risk], auth_env: Sequence[str]) -> tuple[Gate, ...]:
    """SkillSpec's required gates: cost, then external service, then secrets."""
    gates: list[Gate] = []
    if Risk.MAY_COST_MONEY in risks:
        gates.append(Gate.PROVIDER_COST_APPROVAL)
    if Risk.EXTERNAL_SERVICE in risks:
        gates.append(Gate.EXTERNAL_SERVICE_APPROVAL)
    if auth_env:
        gates.append(Gate.SECRET_USE_APPROVAL)
    return tuple(gates)


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
    tied = [c for c in candidates if top - c.score <= ASK_POLICY_WINDOW]
    if len(tied) < 2:  # no selection without the usual tie: still the caller's choice, among the top two
        tied = list(candidates[:2])
    raise AskPolicyRequiresChoice(
        call.capability, outcome.ask_policy or "no_selection", [(c.ref, c.score) for c in tied]
    )


def merged_gates(*gate_lists: Sequence[Gate]) -> tuple[Gate, ...]:
    present = {gate for gates in gate_lists for gate in gates}
    return tuple(gate for gate in Gate if gate in present)


def check_gates(seed: str, required: Sequence[Gate], approved: frozenset[Gate]) -> None:
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
    why = f"more than {ASK_POLICY_WINDOW} points ahead of {others[0].ref}" if others else "the only candidate"
    return (
        f"selection: {candidate.ref} selected by policy {outcome.selection_policy} "
        f"({why}) from [{scores}]{matched}"
    )


def gates_evidence(required: Sequence[Gate], approved: frozenset[Gate]) -> str:
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


# --- shell -------------------------------------------------------------------------------


class SeedSource(Protocol):
    """The seedstore, as bootstrap uses it. `time_left` (the gRPC deadline) None: the source's own default."""

    target: str

    async def search(
        self, capability: str, domain: str | None, local_only: bool, *, time_left: float | None
    ) -> SearchOutcome: ...

    async def inspect(self, seed_id: str, domain: str, *, time_left: float | None) -> SeedFacts: ...

    async def close(self) -> None: ...


_GATE_FROM_PROTO: Mapping[int, Gate] = MappingProxyType(
    {int(common_pb2.Gate.Value(f"GATE_{gate.name}")): gate for gate in Gate}
)
_RISK_FROM_PROTO: Mapping[int, Risk] = MappingProxyType(
    {int(common_pb2.RiskFlag.Value(f"RISK_FLAG_{risk.name}")): risk for risk in Risk}
)
_STATUS_FROM_PROTO: Mapping[int, str] = MappingProxyType(
    {
        int(spb.VERIFICATION_STATUS_VERIFIED): "verified",
        int(spb.VERIFICATION_STATUS_FAILED): "failed",
        int(spb.VERIFICATION_STATUS_UNVERIFIED): "unverified",
    }
)


def _candidate(message: common_pb2.Candidate) -> Candidate:
    return Candidate(
        id=message.id,
        domain=message.domain,
        path=message.path,
        score=message.score,
        reasons=tuple(message.reasons),
        risks=tuple(_RISK_FROM_PROTO[int(r)] for r in message.risks if int(r) in _RISK_FROM_PROTO),
        # A gate this build does not know cannot be approved either: keep it visible, unapprovable.
        required_gates=tuple(
            _GATE_FROM_PROTO[int(g)] for g in message.required_gates if int(g) in _GATE_FROM_PROTO
        ),
        matched_capability=message.matched_capability,
        matched_domain=message.matched_domain,
    )


def search_outcome(
    response: spb.SearchSeedsResponse, capability: str, domain: str | None, local_only: bool
) -> SearchOutcome:
    candidates = tuple(_candidate(c) for c in response.candidates)
    selected: str | None = None
    if response.HasField("selected"):
        selected = next((c.ref for c in candidates if c.id == response.selected), None)
    broadening = response.broadening
    return SearchOutcome(
        capability=capability,
        domain=domain,
        local_only=local_only,
        candidates=candidates,
        selected=selected,
        ask_policy=response.ask_policy.reason if response.HasField("ask_policy") else None,
        selection_policy=response.selection_policy,
        first_search_empty=broadening.first_search_empty,
        attempts=tuple(
            SearchAttempt(capability=a.capability, domain=a.domain or None, found=tuple(a.found))
            for a in broadening.attempts
        ),
        fallback_policy=broadening.fallback_policy,
    )


def seed_facts(response: spb.InspectSeedResponse) -> SeedFacts:
    seed = response.seed
    verification = seed.verification if seed.HasField("verification") else None
    risks: list[Risk] = []
    if seed.risk.external_service:
        risks.append(Risk.EXTERNAL_SERVICE)
    if seed.risk.may_cost_money:
        risks.append(Risk.MAY_COST_MONEY)
    return SeedFacts(
        ref=f"{seed.domain}/{seed.id}",
        command=seed.command if seed.HasField("command") else None,
        verification_status=(
            _STATUS_FROM_PROTO.get(int(verification.status), "unverified")
            if verification is not None
            else "unverified"
        ),
        verified_at_unix=verification.verified_at_unix if verification is not None else None,
        checks=tuple((o.check, o.ok) for o in verification.outcomes) if verification is not None else (),
        risks=tuple(risks),
        auth_env=tuple(seed.auth_env),
    )


class GrpcSeedSource:
    """The seedstore at `target`, over gRPC; its failures mapped into the negotiator's taxonomy."""

    def __init__(
        self, target: str, *, channel: grpc.aio.Channel | None = None, token_file: Path | None = None
    ) -> None:
        """Build inside the event loop that uses it. Raises ValueError for a malformed address.

        Without a `channel`, it opens its own, which carries the caller's trace
        context with --otel (`trace_metadata`) and, with `token_file`, the bearer
        token a seedstore with --token-file asks for (the file holds that one
        token and is re-read when it changes), and closes it on `close`.
        """
        self._own_channel: grpc.aio.Channel | None = None
        self.target = target
        if channel is None:
            self.target = parse_address(target).target
            channel = self._own_channel = open_channel(
                target,
                aio=True,
                token_file=token_file,
                interceptors=metadata_interceptors(trace_metadata),
            )
        self._client = AsyncSeedStoreClient(channel=channel)

    async def search(
        self, capability: str, domain: str | None, local_only: bool, *, time_left: float | None
    ) -> SearchOutcome:
        request = spb.SearchSeedsRequest(
            capability=capability, domain=domain, local_only=local_only, broaden=True
        )
        try:
            response = await self._client.search_seeds(request, timeout=_timeout(time_left))
        except SidecarError as error:
            raise self._mapped(error, {"capability": "capability", "domain": "domain"}) from error
        return search_outcome(response, capability, domain, local_only)

    async def inspect(self, seed_id: str, domain: str, *, time_left: float | None) -> SeedFacts:
        request = spb.InspectSeedRequest(id=seed_id, domain=domain)
        try:
            response = await self._client.inspect_seed(request, timeout=_timeout(time_left))
        except SidecarError as error:
            raise self._mapped(error, {"id": "seed", "domain": "seed"}) from error
        return seed_facts(response)

    async def close(self) -> None:
        await self._client.close()
        if self._own_channel is not None:
            await self._own_channel.close(None)

    def _mapped(self, error: SidecarError, fields: Mapping[str, str]) -> NegotiatorError:
        code = error.code
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return SeedstoreUnavailable(self.target, f"{code.name}: {error.message}")
        if code is grpc.StatusCode.INVALID_ARGUMENT and error.field_violations:
            return InvalidRequest(
                [(fields.get(field, field), text) for field, text in error.field_violations]
            )
        return SeedstoreRefused(self.target, code.name, error.reason, error.message)


def _timeout(seconds: float | None) -> Timeout:
    # A spent budget still sends the call, with a deadline gRPC fails at once.
    return CLIENT_TIMEOUT if seconds is None else max(seconds, 0.001)


class _Clock:
    """The caller's remaining time, read at each step."""

    def __init__(self, budget: float | None) -> None:
        self._deadline = None if budget is None else time.monotonic() + budget

    def remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()


class Bootstrapper:
    """Runs Bootstrap requests against one seedstore (None: every request is SEEDSTORE_NOT_CONFIGURED)."""

    def __init__(
        self,
        seedstore: SeedSource | None,
        *,
        audit: AuditLog | None = None,
        default_run_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """`default_run_seconds` bounds a run when the caller set no deadline; `environ` is where
        the seed's auth env values come from (default: this process's environment)."""
        self.seedstore = seedstore
        self._audit = audit
        self._default_run_seconds = default_run_seconds
        self._output_cap_bytes = output_cap_bytes
        self._environ = environ if environ is not None else os.environ

    async def close(self) -> None:
        if self.seedstore is not None:
            await self.seedstore.close()

    async def bootstrap(
        self, call: BootstrapCall, *, time_budget: float | None, caller: str = "", delegation_depth: int = 0
    ) -> BootstrapResult:
        """Search, and with `call.run` choose, clear and run a seed; see the module docstring.

        `time_budget` is the caller's remaining seconds (None: no deadline);
        it bounds the seedstore calls and the run together. Leaves one audit
        record: "accepted" (candidates only), "succeeded" (the command ran,
        whatever its exit code), "refused" (nothing was started) or "failed"
        (the command started, then timed out, overflowed or was cancelled).
        The record names the seed once one was chosen to run.
        """
        progress = _Progress()
        try:
            result = await self._bootstrap(call, _Clock(time_budget), progress)
        except BaseException as error:
            self._emit(
                caller, delegation_depth, progress.seed, *_failure_outcome(error, started=progress.started)
            )
            raise
        self._emit(
            caller,
            delegation_depth,
            progress.seed,
            AuditOutcome.SUCCEEDED if call.run else AuditOutcome.ACCEPTED,
            "",
        )
        return result

    async def _bootstrap(self, call: BootstrapCall, clock: _Clock, progress: _Progress) -> BootstrapResult:
        validate_call(call)
        if self.seedstore is None:
            raise SeedstoreNotConfigured()
        outcome = await self.seedstore.search(
            call.capability, call.domain, call.local_only, time_left=clock.remaining()
        )
        result = BootstrapResult(
            candidates=outcome.candidates, selected=outcome.selected, ask_policy=outcome.ask_policy
        )
        if not call.run:
            return result
        choice = choose(call, outcome)
        progress.seed = choice.candidate.ref
        # The gates the search reported are checked before anything else is read or run.
        check_gates(choice.candidate.ref, choice.candidate.required_gates, call.approved_gates)
        candidate = choice.candidate
        facts = await self.seedstore.inspect(candidate.id, candidate.domain, time_left=clock.remaining())
        plan = plan_run(choice, facts, call.approved_gates)
        evidence = [
            *search_evidence(outcome),
            selection_evidence(choice, outcome),
            gates_evidence(plan.required_gates, call.approved_gates),
            verification_evidence(facts),
        ]
        run = await self._run(plan, call.prompt, clock, evidence, progress)
        return replace(result, run=run)

    async def _run(
        self, plan: RunPlan, prompt: str, clock: _Clock, evidence: list[str], progress: _Progress
    ) -> BootstrapRun:
        remaining = clock.remaining()
        if remaining is None:
            seconds, limit = (
                self._default_run_seconds,
                "the negotiator's default for calls without a deadline",
            )
        else:
            seconds, limit = remaining, "the caller's time budget"
        if seconds <= 0:
            raise SeedCommandTimeout(plan.seed, 0, "the caller's time budget was spent before the run")
        env = minimal_env()
        base = sorted(env)
        # The seed names variables to pass, never how its program is loaded.
        never = [name for name in plan.auth_env if is_loader_variable(name)]
        wanted = [name for name in plan.auth_env if not is_loader_variable(name)]
        passed = [name for name in wanted if name in self._environ]
        unset = [name for name in wanted if name not in self._environ]
        env.update({name: self._environ[name] for name in passed})
        line = environment_evidence(base, passed, unset)
        if never:
            line += f"; never passed (loader or search-path variables): {', '.join(never)}"
        evidence.append(line)
        settings = RunSettings(
            cwd=None, env=MappingProxyType(env), timeout_seconds=seconds, timeout_source=limit
        )
        name = plan.argv[0]
        # A bare name is looked up on the negotiator's own PATH, here, once; the run executes
        # the absolute path. What is wrong with an explicit path, exec reports.
        program = locate_program(name)
        if program is None:
            raise SeedCommandNotFound(
                plan.seed, name, "no executable file by that name on the negotiator's PATH"
            )
        try:
            run = await start_process(program, plan.argv, True, settings)
        except FileNotFoundError as exc:
            raise SeedCommandNotFound(plan.seed, name, exc.strerror or str(exc)) from exc
        except OSError as exc:
            raise SeedCommandFailed(plan.seed, f'cannot run "{name}": {exc.strerror or exc}') from exc
        progress.started = True
        started = time.monotonic()
        try:
            outcome = await collect(
                run, prompt.encode(), timeout_seconds=seconds, output_cap_bytes=self._output_cap_bytes
            )
        except TimeoutError as exc:
            raise SeedCommandTimeout(plan.seed, seconds, limit) from exc
        except OutputTooLarge as exc:
            raise SeedCommandFailed(plan.seed, f"its output exceeded {self._output_cap_bytes} bytes") from exc
        elapsed = time.monotonic() - started
        stderr = outcome.stderr_tail.decode("utf-8", errors="replace")
        evidence.append(run_evidence(plan.argv, outcome.returncode, elapsed, len(outcome.stdout), stderr))
        return BootstrapRun(
            seed=plan.seed,
            argv=plan.argv,
            exit_code=outcome.returncode,
            output=outcome.stdout.decode("utf-8", errors="replace"),
            evidence=tuple(evidence),
        )

    def _emit(
        self, caller: str, delegation_depth: int, seed: str, outcome: AuditOutcome, error_reason: str
    ) -> None:
        if self._audit is None:
            return
        self._audit.emit(
            AuditRecord(
                time=datetime.now(UTC),
                caller=caller,
                operation=AUDIT_OPERATION,
                outcome=outcome,
                error_reason=error_reason,
                delegation_depth=delegation_depth,
                seed=seed,
            )
        )


@dataclass(slots=True)
class _Progress:
    """How far a bootstrap got, for its audit record."""

    seed: str = ""  # the chosen seed's "<domain>/<id>", once chosen
    started: bool = False  # the seed's process was started: a failure is "failed", not "refused"


def _failure_outcome(error: BaseException, *, started: bool) -> tuple[AuditOutcome, str]:
    if isinstance(error, NegotiatorError):
        return (AuditOutcome.FAILED if started else AuditOutcome.REFUSED), error.reason
    if isinstance(error, Exception):
        return AuditOutcome.FAILED, "INTERNAL"
    return AuditOutcome.FAILED, "CANCELLED"
