"""An example agent worker using the asyncio clients against the sidecar pair.

Start the pair (`bash scripts/run-pair.sh`), then from the repository root:

    python -m examples.agent
    python -m examples.agent --seedstore unix:///sockets/seedstore.sock \\
        --negotiator unix:///sockets/negotiator.sock          # as in docker-compose.yml

What it does, step by step:

1. makes sure the store holds a demo seed (`voice/say-hello`, providing
   `text_to_speech`, local, evidence command `true`), adding it if missing;
2. searches seeds for `voice_message` with broadening and prints the ranked
   candidates with their reasons;
3. verifies the chosen seed, printing each check live as it starts and ends;
4. negotiates a Produce against the `demo` adapter and prints the verdicts;
5. runs that Produce and prints the structured output;
6. sends the same Produce to the `shell-echo` agent harness, which declares
   structured output (and the model override, and the `temperature` setting)
   unsupported: the negotiator refuses it before dispatch, and the agent
   prints every gap of the UnsupportedCapabilityError.

Exit status: 0 when every step behaved as described, 1 otherwise (including
a sidecar that cannot be reached). `--json` prints one JSON object per line
instead of prose; `--token-file` sends a bearer token to sidecars that
require one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from agentsidecar.clients import (
    AsyncNegotiatorClient,
    AsyncSeedStoreClient,
    SeedNotFoundError,
    SidecarError,
    UnavailableError,
    UnsupportedCapabilityError,
    call_options,
)
from agentsidecar.clients.seedstore import AddSeedFields
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as npb
from agentsidecar.seedstore.v1 import seedstore_pb2 as spb

DEFAULT_SEEDSTORE = "unix:run/seedstore.sock"
DEFAULT_NEGOTIATOR = "unix:run/negotiator.sock"
DEMO_ID = "say-hello"
DEMO_DOMAIN = "voice"
DEMO_SEED: AddSeedFields = {
    "id": DEMO_ID,
    "domain": DEMO_DOMAIN,
    "kind": "cli",
    "command": "true",
    "provides": ["text_to_speech"],
    "aliases": ["say hello"],
    "evidence_commands": ["true"],
}
WANTED_CAPABILITY = "voice_message"
FRAMEWORK = "demo"
HARNESS = "shell-echo"
PROMPT = "Summarise today's voice messages in one sentence."
SUMMARY_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"summary": {"type": "string"}, "ok": {"type": "boolean"}},
    "required": ["summary", "ok"],
}


class Report:
    """Prose for people, or one JSON object per line with `--json`."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def step(self, number: int, title: str) -> None:
        if self.as_json:
            self.emit({"step": number, "title": title})
        else:
            print(f"\n{number}. {title}", flush=True)

    def line(self, text: str, *, indent: str = "   ", **record: Any) -> None:
        """`text` in prose mode; `record` (when given) in JSON mode."""
        if self.as_json:
            if record:
                self.emit(record)
        else:
            print(f"{indent}{text}", flush=True)

    def finish(self, ok: bool) -> None:
        if self.as_json:
            self.emit({"done": True, "ok": ok})
        else:
            print("\ndone." if ok else "\ndone, but a step did not go as described above.", flush=True)

    def emit(self, record: Mapping[str, Any]) -> None:
        print(json.dumps(record, ensure_ascii=False), flush=True)


def _enum(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


def capability_name(value: common_pb2.Capability.ValueType) -> str:
    return _enum(common_pb2.Capability.Name(value), "CAPABILITY_")


def requirement_text(requirement: npb.Requirement) -> str:
    if requirement.set != common_pb2.TYPED_SET_UNSPECIFIED:
        return f"{_enum(common_pb2.TypedSet.Name(requirement.set), 'TYPED_SET_')}:{requirement.member}"
    return capability_name(requirement.capability)


def state_name(value: common_pb2.CapabilityState.ValueType) -> str:
    return _enum(common_pb2.CapabilityState.Name(value), "CAPABILITY_STATE_")


# --- the steps -----------------------------------------------------------------------


async def ensure_demo_seed(seeds: AsyncSeedStoreClient, report: Report) -> None:
    report.step(1, f"Make sure the store has the demo seed {DEMO_DOMAIN}/{DEMO_ID}")
    try:
        found = await seeds.inspect_seed(id=DEMO_ID, domain=DEMO_DOMAIN)
    except SeedNotFoundError:
        added = await seeds.add_seed(**DEMO_SEED)
        report.line(f"added it: {added.path}", seed=added.seed.id, added=True, path=added.path)
    else:
        report.line(f"already there: {found.path}", seed=found.seed.id, added=False, path=found.path)


async def search(seeds: AsyncSeedStoreClient, report: Report) -> spb.SearchSeedsResponse:
    report.step(2, f"Search seeds for {WANTED_CAPABILITY!r}, broadening if nothing matches")
    result = await seeds.search_seeds(capability=WANTED_CAPABILITY, broaden=True)
    if result.HasField("broadening") and result.broadening.first_search_empty:
        tried = ", ".join(
            attempt.capability + (f" in {attempt.domain}" if attempt.domain else "")
            for attempt in result.broadening.attempts
        )
        report.line(f"nothing provides {WANTED_CAPABILITY} directly; the broadened search tried: {tried}")
    for rank, candidate in enumerate(result.candidates, start=1):
        selected = "  <- selected" if result.HasField("selected") and candidate.id == result.selected else ""
        report.line(
            f"#{rank} {candidate.domain}/{candidate.id}  score {candidate.score}{selected}",
            candidate=f"{candidate.domain}/{candidate.id}",
            rank=rank,
            score=candidate.score,
            reasons=list(candidate.reasons),
            matched_capability=candidate.matched_capability,
            selected=bool(selected),
        )
        for reason in candidate.reasons:
            report.line(f"     - {reason}")
        if candidate.matched_capability:
            report.line(f"     (found through {candidate.matched_capability})")
    if result.HasField("ask_policy"):
        report.line(
            f"the caller must choose: {result.ask_policy.reason}", ask_policy=result.ask_policy.reason
        )
    if not result.candidates:
        report.line("no candidates", candidates=0)
    return result


async def verify(seeds: AsyncSeedStoreClient, seed_id: str, domain: str, report: Report) -> bool:
    report.step(3, f"Verify {domain}/{seed_id} by running its evidence")
    verified = False
    async for event in seeds.verify(seed_id, domain=domain, check_timeout=10):
        if isinstance(event, spb.CheckStarted):
            report.line(f"... {event.check}", event="check_started", check=event.check)
        elif isinstance(event, spb.CheckFinished):
            millis = event.duration.ToMilliseconds()
            mark = "ok  " if event.ok else "FAIL"
            report.line(
                f"{mark} {event.check} ({millis} ms): {event.message}",
                event="check_finished",
                check=event.check,
                ok=event.ok,
                message=event.message,
            )
        else:
            status = _enum(spb.VerificationStatus.Name(event.status), "VERIFICATION_STATUS_")
            verified = event.status == spb.VERIFICATION_STATUS_VERIFIED
            report.line(f"verdict: {status} (written to {event.path})", event="seed_verified", status=status)
    return verified


async def negotiate(negotiator: AsyncNegotiatorClient, options: npb.CallOptions, report: Report) -> bool:
    report.step(4, f"Negotiate a Produce against the {FRAMEWORK!r} adapter (a dry run)")
    decision = await negotiator.negotiate(
        adapter=FRAMEWORK, prompt=PROMPT, output_schema=SUMMARY_SCHEMA, options=options
    )
    verdict = "accepted" if decision.accepted else "NOT accepted"
    report.line(
        f"{verdict} by {decision.adapter} (declaration {decision.declaration_version})",
        adapter=decision.adapter,
        accepted=decision.accepted,
        declaration_version=decision.declaration_version,
    )
    for item in decision.verdicts:
        need = requirement_text(item.requirement)
        state = state_name(item.state)
        report.line(
            f"{state:<12} {need:<30} needed by {item.requirement.request_field}",
            requirement=need,
            state=state,
            request_field=item.requirement.request_field,
        )
    return decision.accepted


async def produce(negotiator: AsyncNegotiatorClient, options: npb.CallOptions, report: Report) -> None:
    report.step(5, f"Produce structured output with the {FRAMEWORK!r} adapter")
    reply = await negotiator.produce(
        adapter=FRAMEWORK, prompt=PROMPT, output_schema=SUMMARY_SCHEMA, options=options
    )
    output = json.loads(reply.output_json)
    report.line(f"output: {json.dumps(output, ensure_ascii=False)}", output=output)


async def refused(negotiator: AsyncNegotiatorClient, options: npb.CallOptions, report: Report) -> bool:
    report.step(6, f"Send the same Produce to the {HARNESS!r} agent harness (it should be refused)")
    try:
        reply = await negotiator.produce(
            agent=HARNESS, prompt=PROMPT, output_schema=SUMMARY_SCHEMA, options=options
        )
    except UnsupportedCapabilityError as refusal:
        report.line(
            f"refused before dispatch by {refusal.adapter} (declaration {refusal.declaration_version}):",
            refused=True,
            adapter=refusal.adapter,
            declaration_version=refusal.declaration_version,
            gaps=[
                {
                    "capability": gap.capability,
                    "set": gap.set,
                    "member": gap.member,
                    "request_field": gap.request_field,
                    "state": gap.state,
                }
                for gap in refusal.gaps
            ],
        )
        for gap in refusal.gaps:
            need = f"{gap.set}:{gap.member}" if gap.set else gap.capability
            report.line(f"gap: {need} is {gap.state} (needed by {gap.request_field})")
        report.line("handled: drop those fields, or use an adapter that declares them (as in step 4)")
        return True
    report.line(f"unexpectedly accepted: {reply.output_json}", refused=False)
    return False


async def run(args: argparse.Namespace, report: Report) -> int:
    options = call_options(model="demo-small", settings={"temperature": 0.2})
    async with (
        AsyncSeedStoreClient(args.seedstore, token_file=args.token_file) as seeds,
        AsyncNegotiatorClient(args.negotiator, token_file=args.token_file) as negotiator,
    ):
        store = await seeds.get_store()
        report.line(
            f"seedstore {args.seedstore} (store {store.seed_store}), negotiator {args.negotiator}",
            indent="",
            seedstore=args.seedstore,
            seed_store=store.seed_store,
            negotiator=args.negotiator,
        )
        await ensure_demo_seed(seeds, report)
        result = await search(seeds, report)
        chosen = next(
            (c for c in result.candidates if result.HasField("selected") and c.id == result.selected),
            result.candidates[0] if result.candidates else None,
        )
        if chosen is None:
            return 1
        verified = await verify(seeds, chosen.id, chosen.domain, report)
        accepted = await negotiate(negotiator, options, report)
        await produce(negotiator, options, report)
        was_refused = await refused(negotiator, options, report)
    ok = verified and accepted and was_refused
    report.finish(ok)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.agent",
        description="An example agent worker: search, verify, negotiate, produce, handle a refusal.",
    )
    parser.add_argument("--seedstore", default=DEFAULT_SEEDSTORE, metavar="ADDR", help="seedstore address")
    parser.add_argument("--negotiator", default=DEFAULT_NEGOTIATOR, metavar="ADDR", help="negotiator address")
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="bearer token for sidecars that require one (re-read when it changes)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = Report(args.json)
    try:
        return asyncio.run(run(args, report))
    except UnavailableError as error:
        print(
            f"error: a sidecar is unavailable: {error.message}\n"
            "start the pair first (`bash scripts/run-pair.sh`) or pass --seedstore/--negotiator",
            file=sys.stderr,
        )
    except SidecarError as error:
        print(f"error: {error!r}", file=sys.stderr)
    except (ValueError, OSError) as error:  # a malformed address, an unreadable token file
        print(f"error: {error}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
