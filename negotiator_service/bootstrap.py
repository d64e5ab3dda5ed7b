"""Capability bootstrap, the gRPC shell around `agentsidecar.negotiator_service.bootstrap_plan`.

`GrpcSeedSource` asks the seedstore (its client side, with the seedstore's
failures mapped into the negotiator's taxonomy); `Bootstrapper` takes one
Bootstrap request through the plan's steps and, when the plan clears a seed,
runs its command through the command adapter's harness: argv from the plan
(no shell), the prompt on stdin, its own process group, killed when the
caller's time runs out or the call is cancelled. It gets the command
adapter's minimal environment plus the variables the seed names under
`auth.env`, which only a `secret_use_approval` gets this far. A non-zero exit
is an answer (with its exit code), not an error.

The run comes back with its evidence trail: the searches, the selection rule,
the gates, the verification, the environment and the run itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import grpc

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator_service.adapters.command import (
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
from agentsidecar.negotiator_service.audit import AuditLog
from agentsidecar.negotiator_service.bootstrap_plan import (
    BootstrapCall,
    BootstrapResult,
    BootstrapRun,
    Candidate,
    RunPlan,
    SearchAttempt,
    SearchOutcome,
    SeedFacts,
    check_gates,
    choose,
    environment_evidence,
    gates_evidence,
    plan_run,
    run_evidence,
    search_evidence,
    selection_evidence,
    validate_call,
    verification_evidence,
)
from agentsidecar.negotiator_service.convert import gates_from_proto, risks_from_proto
from agentsidecar.negotiator_service.errors import (
    InvalidRequest,
    NegotiatorError,
    SeedCommandFailed,
    SeedCommandNotFound,
    SeedCommandTimeout,
    SeedstoreNotConfigured,
    SeedstoreRefused,
    SeedstoreUnavailable,
)
from agentsidecar.negotiator_service.model import AuditOutcome, AuditRecord
from agentsidecar.seedstore.v1 import seedstore_pb2 as spb
from agentsidecar.sidecar_runtime.addresses import parse_address
from agentsidecar.sidecar_runtime.tracing import trace_metadata

# The seedstore client is imported by GrpcSeedSource: a negotiator without --seedstore never loads
# the clients package.
if TYPE_CHECKING:
    from agentsidecar.clients.channel import Timeout
    from agentsidecar.clients.errors import SidecarError

AUDIT_OPERATION = "bootstrap"


class SeedSource(Protocol):
    """The seedstore, as bootstrap uses it. `time_left` (the gRPC deadline) None: the source's own default."""

    target: str

    async def search(
        self, capability: str, domain: str | None, local_only: bool, *, time_left: float | None
    ) -> SearchOutcome: ...

    async def inspect(self, seed_id: str, domain: str, *, time_left: float | None) -> SeedFacts: ...

    async def close(self) -> None: ...


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
        risks=risks_from_proto(message.risks),
        # The seedstore's gates, as sent: one it names and this build does not stays listed, unapprovable.
        required_gates=gates_from_proto(message.required_gates),
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
        ask_window=response.ask_window_points,
    )


def seed_facts(response: spb.InspectSeedResponse) -> SeedFacts:
    seed = response.seed
    verification = seed.verification if seed.HasField("verification") else None
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
        required_gates=gates_from_proto(response.required_gates),
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
        from agentsidecar.clients.aio import AsyncSeedStoreClient
        from agentsidecar.clients.channel import metadata_interceptors, open_channel

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
        from agentsidecar.clients.errors import SidecarError

        request = spb.SearchSeedsRequest(
            capability=capability, domain=domain, local_only=local_only, broaden=True
        )
        try:
            response = await self._client.search_seeds(request, timeout=_timeout(time_left))
        except SidecarError as error:
            raise self._mapped(error, {"capability": "capability", "domain": "domain"}) from error
        return search_outcome(response, capability, domain, local_only)

    async def inspect(self, seed_id: str, domain: str, *, time_left: float | None) -> SeedFacts:
        from agentsidecar.clients.errors import SidecarError

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
    from agentsidecar.clients.channel import CLIENT_TIMEOUT

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
