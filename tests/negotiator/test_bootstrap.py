"""Capability bootstrap over real servers: a seedstore and a negotiator on Unix sockets, seeds in a temp
SKILLSPEC_HOME whose commands are real scripts, added and verified through the seedstore's own RPCs.

Each script touches a marker file first, so "nothing ran" is checked on disk, not inferred.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest
from negotiator_testkit import NEGOTIATOR_BIN, call_error

from agentsidecar.clients.aio import AsyncSeedStoreClient
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import bootstrap_plan
from agentsidecar.negotiator_service.errors import (
    AskPolicyRequiresChoice,
    GatesNotApproved,
    NoSeedFound,
    SeedHasNoCommand,
)
from agentsidecar.negotiator_service.model import AuditOutcome, AuditRecord
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from agentsidecar.seedstore.v1 import seedstore_pb2 as spb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc
from agentsidecar.seedstore_service.server import SeedStoreServer
from agentsidecar.seedstore_service.server import Settings as SeedStoreSettings
from agentsidecar.seedstore_service.server import create_server as create_seedstore
from agentsidecar.seedstore_service.store import resolve_store_root
from agentsidecar.sidecar_runtime.wire_names import Gate
from tests.procs import process_alive, start_process, stop_process

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
PROVIDER_COST = common_pb2.GATE_PROVIDER_COST_APPROVAL
EXTERNAL_SERVICE = common_pb2.GATE_EXTERNAL_SERVICE_APPROVAL
SECRET_USE = common_pb2.GATE_SECRET_USE_APPROVAL


# --- servers and seeds ------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A Unix socket path must fit in ~107 bytes; tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="boot-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def skillspec_home(tmp_path: Path) -> Path:
    home = tmp_path / "skillspec-home"
    home.mkdir()
    return home


@pytest.fixture
async def seedstore(short_dir: Path, skillspec_home: Path) -> AsyncIterator[SeedStoreServer]:
    settings = SeedStoreSettings(
        listen=(f"unix:{short_dir / 'seedstore.sock'}",),
        store_root=resolve_store_root({"SKILLSPEC_HOME": str(skillspec_home)}),
        equivalents_file=None,
        refresh_interval=0.2,
        grace_seconds=0.5,
    )
    running = await create_seedstore(settings)
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def seeds(seedstore: SeedStoreServer) -> AsyncIterator[AsyncSeedStoreClient]:
    async with AsyncSeedStoreClient(seedstore.bound[0], timeout=10) as client:
        yield client


async def start_negotiator(
    short_dir: Path, config_file: Path, seedstore_target: str | None
) -> RunningNegotiator:
    return await create_server(
        Settings(
            listen=(f"unix:{short_dir / 'negotiator.sock'}",),
            config_path=config_file,
            grace_seconds=1.0,
            seedstore_target=seedstore_target,
        )
    )


@pytest.fixture
async def negotiator(
    short_dir: Path, config_file: Path, seedstore: SeedStoreServer
) -> AsyncIterator[RunningNegotiator]:
    running = await start_negotiator(short_dir, config_file, seedstore.bound[0])
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def stub(negotiator: RunningNegotiator) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)


@pytest.fixture
def audit(negotiator: RunningNegotiator) -> Iterator[list[AuditRecord]]:
    """Every audit record the negotiator emits during the test."""
    records: list[AuditRecord] = []
    subscription = negotiator.broker.audit.subscribe()
    original = subscription.offer

    def keep(record: AuditRecord) -> bool:
        records.append(record)
        return original(record)

    subscription.offer = keep  # type: ignore[method-assign]
    yield records
    subscription.close()


class Script:
    """An executable shell script that touches `marker` first, then runs `body`."""

    def __init__(self, directory: Path, name: str, body: str) -> None:
        self.path = directory / f"{name}.sh"
        self.marker = directory / f"{name}.ran"
        self.path.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(self.marker))}\n{body}\n")
        self.path.chmod(0o755)

    @property
    def command(self) -> str:
        return shlex.quote(str(self.path))

    @property
    def ran(self) -> bool:
        return self.marker.exists()


async def add_seed(
    seeds: AsyncSeedStoreClient,
    seed_id: str,
    domain: str,
    command: str,
    *,
    verify: bool = True,
    **fields: Any,
) -> None:
    await seeds.add_seed(id=seed_id, domain=domain, kind="script", command=command, **fields)
    if verify:
        events = [event async for event in seeds.verify(seed_id, domain=domain)]
        verdict = events[-1]
        assert isinstance(verdict, spb.SeedVerified)
        assert verdict.status == spb.VERIFICATION_STATUS_VERIFIED


def request(capability: str, **fields: Any) -> pb.BootstrapRequest:
    return pb.BootstrapRequest(capability=capability, **fields)


def gate_violations(error: Any) -> list[tuple[str, str]]:
    return [(v.type, v.subject) for v in error.precondition_violations]


# --- candidates ---------------------------------------------------------------------------


async def test_candidates_come_back_as_the_seedstore_ranked_them_with_gates_and_ask_policy(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    cloud = Script(tmp_path, "cloud", "echo cloud")
    local = Script(tmp_path, "local", "echo local")
    await add_seed(
        seeds,
        "cloud-voice",
        "voice",
        cloud.command,
        provides=["text_to_speech"],
        external_service=True,
        may_cost_money=True,
        auth_env=["VOICE_API_KEY"],
    )
    await add_seed(seeds, "local-say", "voice", local.command, provides=["text_to_speech"])

    response = await stub.Bootstrap(request("text_to_speech"), timeout=10)

    # local: +40 direct +25 verified = 65; cloud: 65 - 10 for its risks = 55: within 10 points.
    assert [(c.domain, c.id, c.score) for c in response.candidates] == [
        ("voice", "local-say", 65),
        ("voice", "cloud-voice", 55),
    ]
    assert list(response.candidates[1].required_gates) == [PROVIDER_COST, EXTERNAL_SERVICE, SECRET_USE]
    assert list(response.candidates[1].risks) == [
        common_pb2.RISK_FLAG_EXTERNAL_SERVICE,
        common_pb2.RISK_FLAG_MAY_COST_MONEY,
    ]
    assert list(response.candidates[0].required_gates) == []
    assert "external or paid risk requires gate" in response.candidates[1].reasons
    assert response.selected == ""
    assert response.ask_policy.reason == "top_candidates_within_10_points"
    assert not response.HasField("run")
    assert not cloud.ran
    assert not local.ran

    direct = await seeds.search_seeds(capability="text_to_speech", broaden=True)
    assert list(response.candidates) == list(direct.candidates)


async def test_local_only_is_passed_to_the_search_and_the_clear_winner_is_selected(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    await add_seed(
        seeds,
        "cloud-voice",
        "voice",
        Script(tmp_path, "c", "").command,
        provides=["tts"],
        external_service=True,
    )
    await add_seed(seeds, "local-say", "voice", Script(tmp_path, "l", "").command, provides=["tts"])
    response = await stub.Bootstrap(request("tts", domain="voice", local_only=True), timeout=10)
    assert [(c.id, c.score) for c in response.candidates] == [("local-say", 85)]  # +20 local-only
    assert response.selected == "voice/local-say"
    assert not response.HasField("ask_policy")


# --- gates --------------------------------------------------------------------------------


async def test_refused_without_gate_approval_and_nothing_starts_then_runs_with_it(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path, audit: list[AuditRecord]
) -> None:
    paid = Script(tmp_path, "paid", 'echo "said: $(cat)"')
    await add_seed(
        seeds,
        "paid-say",
        "voice",
        paid.command,
        provides=["speech_synthesis"],
        external_service=True,
        may_cost_money=True,
    )

    error = await call_error(stub.Bootstrap(request("speech_synthesis", run=True, prompt="hi"), timeout=10))
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "GATES_NOT_APPROVED")
    assert gate_violations(error) == [
        ("GATE_NOT_APPROVED", "provider_cost_approval"),
        ("GATE_NOT_APPROVED", "external_service_approval"),
    ]
    assert error.metadata["seed"] == "voice/paid-say"

    error = await call_error(
        stub.Bootstrap(
            request("speech_synthesis", run=True, prompt="hi", approved_gates=[PROVIDER_COST]), timeout=10
        )
    )
    assert gate_violations(error) == [("GATE_NOT_APPROVED", "external_service_approval")]
    assert not paid.ran

    response = await stub.Bootstrap(
        request(
            "speech_synthesis", run=True, prompt="hello", approved_gates=[PROVIDER_COST, EXTERNAL_SERVICE]
        ),
        timeout=10,
    )
    assert paid.ran
    run = response.run
    assert (run.seed, list(run.argv), run.exit_code, run.output) == (
        "voice/paid-say",
        [str(paid.path)],
        0,
        "said: hello\n",
    )
    evidence = list(run.evidence)
    assert [line.split(":")[0] for line in evidence] == [
        "search",
        "selection",
        "gates",
        "verification",
        "environment",
        "run",
    ]
    assert "selected by policy highest_score_after_constraints" in evidence[1]
    assert evidence[2] == (
        "gates: required provider_cost_approval, external_service_approval; "
        "approved provider_cost_approval, external_service_approval"
    )
    assert evidence[3].startswith("verification: verified at 20")
    assert f"path_lookup:{paid.path} ok" in evidence[3]
    assert evidence[5].startswith(f"run: argv [{str(paid.path)!r}] exited with 0 after ")

    bootstraps = [r for r in audit if r.operation == "bootstrap"]
    assert [(r.outcome, r.error_reason) for r in bootstraps] == [
        (AuditOutcome.REFUSED, "GATES_NOT_APPROVED"),
        (AuditOutcome.REFUSED, "GATES_NOT_APPROVED"),
        (AuditOutcome.SUCCEEDED, ""),
    ]
    assert all(r.caller for r in bootstraps)


async def test_auth_env_reaches_the_command_only_through_secret_use_approval(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOOT_TOKEN", "s3cret")
    monkeypatch.setenv("NOT_FOR_SEEDS", "leak")
    secret = Script(tmp_path, "secret", 'echo "token=$BOOT_TOKEN other=$NOT_FOR_SEEDS"')
    await add_seed(
        seeds, "tokened", "voice", secret.command, provides=["voice_clone"], auth_env=["BOOT_TOKEN"]
    )

    error = await call_error(stub.Bootstrap(request("voice_clone", run=True), timeout=10))
    assert gate_violations(error) == [("GATE_NOT_APPROVED", "secret_use_approval")]
    assert not secret.ran

    response = await stub.Bootstrap(request("voice_clone", run=True, approved_gates=[SECRET_USE]), timeout=10)
    assert response.run.output == "token=s3cret other=\n"
    assert "the seed's auth env BOOT_TOKEN (secret_use_approval approved)" in response.run.evidence[4]
    assert "s3cret" not in "".join(response.run.evidence)


# --- the ask policy -----------------------------------------------------------------------


async def test_close_scores_are_refused_without_a_pick_and_the_pick_runs(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    first = Script(tmp_path, "first", "echo first")
    second = Script(tmp_path, "second", "echo second")
    await add_seed(seeds, "first", "voice", first.command, provides=["voice_message"], priority=50)
    await add_seed(seeds, "second", "voice", second.command, provides=["voice_message"], priority=0)

    error = await call_error(stub.Bootstrap(request("voice_message", run=True), timeout=10))
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "ASK_POLICY_REQUIRES_CHOICE")
    assert gate_violations(error) == [
        ("ASK_POLICY_CANDIDATE", "voice/first"),
        ("ASK_POLICY_CANDIDATE", "voice/second"),
    ]
    assert error.metadata["askPolicy"] == "top_candidates_within_10_points"
    assert not first.ran
    assert not second.ran

    error = await call_error(
        stub.Bootstrap(request("voice_message", run=True, seed="voice/ghost"), timeout=10)
    )
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "SEED_NOT_A_CANDIDATE")
    assert error.metadata["candidates"] == "voice/first,voice/second"

    response = await stub.Bootstrap(request("voice_message", run=True, seed="voice/second"), timeout=10)
    assert response.run.output == "second\n"
    assert second.ran
    assert not first.ran
    assert response.selected == ""  # still what the seedstore said
    assert response.ask_policy.reason == "top_candidates_within_10_points"
    assert response.run.evidence[1].startswith("selection: voice/second picked by caller from [")
    assert "ask policy: top_candidates_within_10_points" in response.run.evidence[1]


# --- verification, command, broadening ----------------------------------------------------


async def test_an_unverified_seed_is_refused_and_never_started(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    fresh = Script(tmp_path, "fresh", "echo fresh")
    await add_seed(seeds, "fresh", "voice", fresh.command, provides=["narration"], verify=False)
    response = await stub.Bootstrap(request("narration"), timeout=10)
    assert response.selected == "voice/fresh"  # the only candidate is selected, and still may not run

    error = await call_error(stub.Bootstrap(request("narration", run=True), timeout=10))
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "SEED_NOT_VERIFIED")
    assert error.metadata == {"seed": "voice/fresh", "verificationStatus": "unverified"}
    assert not fresh.ran


async def test_a_seed_marked_failed_after_the_search_is_caught_when_read_again(
    stub: Stub, negotiator: RunningNegotiator, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    """The verification status is read at run time, not trusted from the search."""
    flaky = Script(tmp_path, "flaky", "echo flaky")
    await add_seed(seeds, "flaky", "voice", flaky.command, provides=["narration"])
    bootstrapper = negotiator.bootstrapper
    assert bootstrapper is not None
    assert bootstrapper.seedstore is not None
    source = bootstrapper.seedstore
    original_search = source.search

    async def search_then_mark_failed(*args: Any, **kwargs: Any) -> bootstrap_plan.SearchOutcome:
        outcome = await original_search(*args, **kwargs)
        await seeds.update_seed(id="flaky", domain="voice", mark=spb.VERIFICATION_MARK_FAILED)
        return outcome

    source.search = search_then_mark_failed  # type: ignore[method-assign]
    error = await call_error(stub.Bootstrap(request("narration", run=True), timeout=10))
    assert (error.reason, error.metadata["verificationStatus"]) == ("SEED_NOT_VERIFIED", "failed")
    assert not flaky.ran


async def test_a_broadened_search_finds_the_seed_through_an_equivalent_term(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    say = Script(tmp_path, "say", 'echo "voice: $(cat)"')
    await add_seed(seeds, "say", "voice", say.command, provides=["text_to_speech"])

    response = await stub.Bootstrap(request("voice_message", run=True, prompt="ping"), timeout=10)
    assert [(f"{c.domain}/{c.id}", c.matched_capability) for c in response.candidates] == [
        ("voice/say", "text_to_speech")
    ]
    assert response.selected == "voice/say"
    assert response.run.output == "voice: ping\n"
    search_lines = [line for line in response.run.evidence if line.startswith("search")]
    assert search_lines[0].startswith('search: "voice_message" in every domain')
    assert "found nothing; broadened through" in search_lines[0]
    assert any('"text_to_speech" in every domain: found voice/say' in line for line in search_lines[1:])
    assert 'matched via "text_to_speech"' in response.run.evidence[len(search_lines)]


async def test_nothing_found_even_after_broadening_says_a_fallback_needs_approval(stub: Stub) -> None:
    listed = await stub.Bootstrap(request("teleportation"), timeout=10)
    assert list(listed.candidates) == []
    assert listed.selected == ""

    error = await call_error(stub.Bootstrap(request("teleportation", domain="travel", run=True), timeout=10))
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "NO_SEED_FOUND")
    assert "approval" in error.message
    assert "verify it first" in error.message
    assert [v.subject for v in error.precondition_violations] == ["teleportation@travel"]
    assert error.metadata["fallbackPolicy"].startswith("no capability seed was found")


async def test_a_non_zero_exit_is_an_answer_and_a_missing_program_is_refused(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    grumpy = Script(tmp_path, "grumpy", "echo partial; echo 'no voice today' >&2; exit 3")
    await add_seed(seeds, "grumpy", "voice", f"{grumpy.command} --loud", provides=["shouting"])
    response = await stub.Bootstrap(request("shouting", run=True), timeout=10)
    assert (list(response.run.argv), response.run.exit_code, response.run.output) == (
        [str(grumpy.path), "--loud"],
        3,
        "partial\n",
    )
    assert "exited with 3" in response.run.evidence[-1]
    assert "stderr: no voice today" in response.run.evidence[-1]

    gone = Script(tmp_path, "gone", "echo gone")
    await add_seed(seeds, "gone", "voice", gone.command, provides=["vanishing"])
    gone.path.unlink()
    error = await call_error(stub.Bootstrap(request("vanishing", run=True), timeout=10))
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "SEED_COMMAND_NOT_FOUND")
    assert error.metadata["program"] == str(gone.path)


async def test_a_seed_without_a_command_is_refused(stub: Stub, seeds: AsyncSeedStoreClient) -> None:
    await seeds.add_seed(
        id="adapter-only",
        domain="voice",
        kind="adapter",
        adapter="say",
        provides=["humming"],
        evidence_commands=["true"],
    )
    events = [event async for event in seeds.verify("adapter-only", domain="voice")]
    assert isinstance(events[-1], spb.SeedVerified)
    assert events[-1].status == spb.VERIFICATION_STATUS_VERIFIED
    error = await call_error(stub.Bootstrap(request("humming", run=True), timeout=10))
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "SEED_HAS_NO_COMMAND")


@pytest.mark.slow
async def test_the_run_is_bounded_by_the_callers_deadline_and_its_group_is_killed(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path, audit: list[AuditRecord]
) -> None:
    pidfile = tmp_path / "child.pid"
    sleeper = Script(tmp_path, "sleeper", f"sleep 30 &\necho $! > {shlex.quote(str(pidfile))}\nwait")
    await add_seed(seeds, "sleeper", "voice", sleeper.command, provides=["lullaby"])
    started = time.monotonic()
    error = await call_error(stub.Bootstrap(request("lullaby", run=True), timeout=1.5))
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5
    assert sleeper.ran
    child = int(pidfile.read_text())
    assert await _gone(child)
    await asyncio.sleep(0.1)  # the handler's audit record follows its status
    (record,) = [r for r in audit if r.operation == "bootstrap"]
    assert record.outcome is AuditOutcome.FAILED
    assert record.error_reason in ("SEED_COMMAND_TIMEOUT", "CANCELLED")


async def test_a_setsid_grandchild_of_the_run_neither_holds_it_nor_outlives_it(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    pidfile = shlex.quote(str(tmp_path / "grandchild.pid"))
    escaper = Script(
        tmp_path,
        "escaper",
        f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' &\n"
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done\necho done",
    )
    await add_seed(seeds, "escaper", "voice", escaper.command, provides=["escaping"])
    started = time.monotonic()
    response = await stub.Bootstrap(request("escaping", run=True), timeout=20)
    assert time.monotonic() - started < 5  # well under the 20 s deadline
    assert (response.run.exit_code, response.run.output) == (0, "done\n")
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert await _gone(grandchild), f"setsid grandchild {grandchild} survived the run"


async def test_loader_variables_a_seed_names_are_never_passed(
    stub: Stub, seeds: AsyncSeedStoreClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOOT_TOKEN", "s3cret")
    monkeypatch.setenv("BASH_ENV", str(tmp_path / "evil.sh"))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    shower = Script(tmp_path, "shower", 'echo "bash_env=$BASH_ENV ld=$LD_LIBRARY_PATH token=$BOOT_TOKEN"')
    await add_seed(
        seeds,
        "shower",
        "voice",
        shower.command,
        provides=["showing"],
        auth_env=["BASH_ENV", "LD_LIBRARY_PATH", "BOOT_TOKEN"],
    )
    response = await stub.Bootstrap(request("showing", run=True, approved_gates=[SECRET_USE]), timeout=10)
    assert response.run.output == "bash_env= ld= token=s3cret\n"
    environment = response.run.evidence[4]
    assert "the seed's auth env BOOT_TOKEN (secret_use_approval approved)" in environment
    assert "never passed (loader or search-path variables): BASH_ENV, LD_LIBRARY_PATH" in environment


async def _gone(pid: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


# --- the audit record ---------------------------------------------------------------------


async def test_the_audit_record_names_the_seed_chosen_to_run_on_the_stream_and_in_the_log(
    short_dir: Path,
    config_file: Path,
    seedstore: SeedStoreServer,
    seeds: AsyncSeedStoreClient,
    tmp_path: Path,
) -> None:
    hello = Script(tmp_path, "hello", "echo hello")
    await add_seed(seeds, "hello", "voice", hello.command, provides=["greeting"])
    await add_seed(
        seeds, "fresh", "voice", Script(tmp_path, "f", "").command, provides=["farewell"], verify=False
    )
    audit_log = tmp_path / "audit.jsonl"
    running = await create_server(
        Settings(
            listen=(f"unix:{short_dir / 'audited.sock'}",),
            config_path=config_file,
            grace_seconds=1.0,
            seedstore_target=seedstore.bound[0],
            audit_log=audit_log,
        )
    )
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            watch = stub.WatchAudit(pb.WatchAuditRequest())
            await asyncio.wait_for(watch.initial_metadata(), 5)

            await stub.Bootstrap(request("greeting"), timeout=10)  # candidates only: nothing chosen
            await stub.Bootstrap(request("greeting", run=True), timeout=10)
            await call_error(
                stub.Bootstrap(request("farewell", run=True), timeout=10)
            )  # chosen, then refused
            await call_error(stub.Bootstrap(request("lament", run=True), timeout=10))  # nothing to choose

            streamed = []
            async with asyncio.timeout(5):
                for _ in range(4):
                    response = await watch.read()
                    assert isinstance(response, pb.WatchAuditResponse)
                    streamed.append(response.record)
            watch.cancel()
    finally:
        await running.stop()

    assert hello.ran
    expected = [
        ("accepted", "", ""),
        ("succeeded", "", "voice/hello"),
        ("refused", "SEED_NOT_VERIFIED", "voice/fresh"),
        ("refused", "NO_SEED_FOUND", ""),
    ]
    assert [(r.outcome, r.error_reason, r.seed) for r in streamed] == expected
    assert {r.operation for r in streamed} == {"bootstrap"}
    logged = [json.loads(line) for line in audit_log.read_text(encoding="utf-8").splitlines()]
    assert [(line["outcome"], line["error_reason"], line["seed"]) for line in logged] == expected


# --- requests and the seedstore itself ----------------------------------------------------


async def test_run_only_fields_without_run_are_refused_not_ignored(stub: Stub) -> None:
    error = await call_error(
        stub.Bootstrap(request("tts", seed="voice", prompt="hi", approved_gates=[PROVIDER_COST]), timeout=10)
    )
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in error.field_violations] == ["seed", "seed", "approved_gates", "prompt"]
    error = await call_error(stub.Bootstrap(request(""), timeout=10))
    assert error.field_violations == (("capability", "is required"),)
    error = await call_error(stub.Bootstrap(request("tts", approved_gates=[0], run=True), timeout=10))
    assert [field for field, _ in error.field_violations] == ["approved_gates[0]"]


async def test_a_bad_identifier_is_the_callers_field_from_the_seedstore(stub: Stub) -> None:
    error = await call_error(stub.Bootstrap(request("Text To Speech"), timeout=10))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in error.field_violations] == ["capability"]


@pytest.mark.slow
async def test_an_unreachable_seedstore_is_unavailable_never_unknown(
    short_dir: Path, config_file: Path
) -> None:
    missing = f"unix:{short_dir / 'nobody-here.sock'}"
    negotiator = await start_negotiator(short_dir, config_file, missing)
    try:
        async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            error = await call_error(stub.Bootstrap(request("tts", run=True), timeout=10))
    finally:
        await negotiator.stop()
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "SEEDSTORE_UNAVAILABLE")
    assert error.metadata["target"] == missing


async def test_without_a_seedstore_bootstrap_is_a_failed_precondition(
    short_dir: Path, config_file: Path
) -> None:
    negotiator = await start_negotiator(short_dir, config_file, None)
    try:
        async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            error = await call_error(stub.Bootstrap(request("tts"), timeout=10))
    finally:
        await negotiator.stop()
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "SEEDSTORE_NOT_CONFIGURED")


@pytest.mark.slow
async def test_serve_seedstore_flag_wires_bootstrap_to_that_seedstore(
    short_dir: Path, seeds: AsyncSeedStoreClient, seedstore: SeedStoreServer, tmp_path: Path
) -> None:
    await add_seed(seeds, "say", "voice", Script(tmp_path, "say", "cat").command, provides=["text_to_speech"])
    target = f"unix:{short_dir / 'served.sock'}"
    process, _ = start_process(
        [
            str(NEGOTIATOR_BIN),
            "serve",
            "--listen",
            target,
            "--state-dir",
            str(tmp_path / "state"),
            "--seedstore",
            seedstore.bound[0],
        ]
    )
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            response = await stub.Bootstrap(request("text_to_speech", run=True, prompt="hi"), timeout=10)
    finally:
        stop_process(process)
    assert response.selected == "voice/say"
    assert response.run.output == "hi"


@pytest.mark.slow
async def test_the_cli_bootstraps_and_runs_a_seed(
    short_dir: Path, seeds: AsyncSeedStoreClient, seedstore: SeedStoreServer, tmp_path: Path
) -> None:
    await add_seed(seeds, "say", "voice", Script(tmp_path, "say", "cat").command, provides=["text_to_speech"])
    target = f"unix:{short_dir / 'cli-bootstrap.sock'}"
    serve = [str(NEGOTIATOR_BIN), "serve", "--listen", target, "--state-dir", str(tmp_path / "state")]
    process, _ = start_process([*serve, "--seedstore", seedstore.bound[0]])
    try:
        cli = [str(NEGOTIATOR_BIN), "--server", target, "bootstrap", "text_to_speech"]
        listed = await asyncio.to_thread(subprocess.run, cli, capture_output=True, text=True, timeout=60)
        ran = await asyncio.to_thread(
            subprocess.run,
            [*cli, "--run", "--prompt", "-"],
            input="hello",
            capture_output=True,
            text=True,
            timeout=60,
        )
        bad_gate = await asyncio.to_thread(
            subprocess.run, [*cli, "--approve", "blessing"], capture_output=True, text=True, timeout=60
        )
    finally:
        stop_process(process)
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert [(c["domain"], c["id"]) for c in found["candidates"]] == [("voice", "say")]
    assert found["selected"] == "voice/say"
    assert "run" not in found
    assert ran.returncode == 0, ran.stderr
    run = json.loads(ran.stdout)["run"]
    assert (run["seed"], run["output"]) == ("voice/say", "hello")
    assert bad_gate.returncode == 2
    assert "--approve: 'blessing' is not one of:" in bad_gate.stderr


@pytest.mark.slow
def test_serve_refuses_a_malformed_seedstore_address_as_a_usage_error(short_dir: Path) -> None:
    bad = subprocess.run(
        [
            str(NEGOTIATOR_BIN),
            "serve",
            "--listen",
            f"unix:{short_dir / 'n.sock'}",
            "--seedstore",
            "not an address",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert bad.returncode == 2
    assert "--seedstore" in bad.stderr


# --- the pure rules -----------------------------------------------------------------------


def _candidate(seed_id: str, score: int) -> bootstrap_plan.Candidate:
    return bootstrap_plan.Candidate(
        id=seed_id, domain="d", path=f"/s/d/{seed_id}.yml", score=score, reasons=()
    )


def _outcome(
    *candidates: bootstrap_plan.Candidate, selected: str | None, ask: str | None, window: int = 10
) -> bootstrap_plan.SearchOutcome:
    return bootstrap_plan.SearchOutcome(
        capability="c",
        domain=None,
        local_only=False,
        candidates=candidates,
        selected=selected,
        ask_policy=ask,
        selection_policy="highest_score_after_constraints",
        first_search_empty=False,
        attempts=(),
        fallback_policy="",
        ask_window=window,
    )


def test_the_ask_policy_offers_every_candidate_within_ten_points_of_the_top() -> None:
    outcome = _outcome(
        _candidate("a", 60),
        _candidate("b", 55),
        _candidate("c", 50),
        _candidate("d", 49),
        selected=None,
        ask="top_candidates_within_10_points",
    )
    with pytest.raises(AskPolicyRequiresChoice) as caught:
        bootstrap_plan.choose(bootstrap_plan.BootstrapCall("c", run=True), outcome)
    assert caught.value.tied == (("d/a", 60), ("d/b", 55), ("d/c", 50))
    choice = bootstrap_plan.choose(bootstrap_plan.BootstrapCall("c", run=True, seed="d/d"), outcome)
    assert (choice.candidate.id, choice.picked_by_caller) == ("d", True)


def test_the_choices_offered_follow_the_window_the_seedstore_sent() -> None:
    four = (_candidate("a", 60), _candidate("b", 55), _candidate("c", 50), _candidate("d", 30))
    with pytest.raises(AskPolicyRequiresChoice) as caught:
        bootstrap_plan.choose(
            bootstrap_plan.BootstrapCall("c", run=True), _outcome(*four, selected=None, ask="x", window=5)
        )
    assert caught.value.tied == (("d/a", 60), ("d/b", 55))
    picked = _outcome(*four, selected="d/a", ask=None, window=3)
    choice = bootstrap_plan.choose(bootstrap_plan.BootstrapCall("c", run=True), picked)
    assert "more than 3 points ahead of d/b" in bootstrap_plan.selection_evidence(choice, picked)


def test_no_candidates_is_no_seed_found_naming_the_first_search_when_nothing_broadened() -> None:
    with pytest.raises(NoSeedFound) as caught:
        bootstrap_plan.choose(bootstrap_plan.BootstrapCall("c", run=True), _outcome(selected=None, ask=None))
    assert caught.value.searches == (("c", None),)


def test_gates_are_the_union_of_the_search_and_the_seed_file_now() -> None:
    choice = bootstrap_plan.Choice(_candidate("a", 60), picked_by_caller=False)
    facts = bootstrap_plan.SeedFacts(
        ref="d/a",
        command="say",
        verification_status="verified",
        verified_at_unix=1,
        checks=(),
        required_gates=(Gate.EXTERNAL_SERVICE_APPROVAL,),
        auth_env=(),
    )
    with pytest.raises(GatesNotApproved) as caught:
        bootstrap_plan.plan_run(choice, facts, frozenset())
    assert caught.value.missing == ("external_service_approval",)
    plan = bootstrap_plan.plan_run(choice, facts, frozenset({Gate.EXTERNAL_SERVICE_APPROVAL}))
    assert plan.argv == ("say",)


def test_commands_are_split_like_a_shell_would_but_never_run_by_one() -> None:
    choice = bootstrap_plan.Choice(_candidate("a", 60), picked_by_caller=False)
    facts = bootstrap_plan.SeedFacts(
        ref="d/a",
        command="say --voice 'Ada Lovelace' $HOME;rm",
        verification_status="verified",
        verified_at_unix=1,
        checks=(),
        required_gates=(),
        auth_env=(),
    )
    assert bootstrap_plan.plan_run(choice, facts, frozenset()).argv == (
        "say",
        "--voice",
        "Ada Lovelace",
        "$HOME;rm",
    )
    with pytest.raises(SeedHasNoCommand, match="cannot be split"):
        bootstrap_plan.plan_run(
            choice,
            bootstrap_plan.SeedFacts(
                ref="d/a",
                command="say 'unclosed",
                verification_status="verified",
                verified_at_unix=1,
                checks=(),
                required_gates=(),
                auth_env=(),
            ),
            frozenset(),
        )


@pytest.mark.slow
async def test_a_token_guarded_seedstore_is_searched_with_seedstore_token_file(
    short_dir: Path, tmp_path: Path
) -> None:
    """A seedstore with --token-file and no --open-reads: the negotiator's Bootstrap reaches it only
    with --seedstore-token-file, and without it the seedstore's TOKEN_MISSING is named."""
    home = tmp_path / "guarded-home"
    home.mkdir()
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    seed_sock = f"unix:{short_dir / 'guarded.sock'}"
    env = {"SKILLSPEC_HOME": str(home)}
    seedstore_process, _ = start_process(
        [
            str(NEGOTIATOR_BIN.with_name("seedstore")),
            "serve",
            "--listen",
            seed_sock,
            "--token-file",
            str(token_file),
        ],
        env=env,
    )
    processes = [seedstore_process]
    try:
        async with AsyncSeedStoreClient(seed_sock, timeout=10, token_file=token_file) as seeds:
            await add_seed(
                seeds, "say", "voice", Script(tmp_path, "say", "cat").command, provides=["text_to_speech"]
            )
        targets = {}
        for name, extra in (("with", ["--seedstore-token-file", str(token_file)]), ("without", [])):
            targets[name] = f"unix:{short_dir / f'neg-{name}.sock'}"
            process, _ = start_process(
                [
                    str(NEGOTIATOR_BIN),
                    "serve",
                    "--listen",
                    targets[name],
                    "--state-dir",
                    str(tmp_path / name),
                    "--seedstore",
                    seed_sock,
                    *extra,
                ]
            )
            processes.append(process)
        async with grpc.aio.insecure_channel(targets["with"]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            response = await stub.Bootstrap(request("text_to_speech", run=True, prompt="hi"), timeout=10)
        async with grpc.aio.insecure_channel(targets["without"]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            error = await call_error(stub.Bootstrap(request("text_to_speech"), timeout=10))
    finally:
        for process in processes:
            stop_process(process)
    assert response.selected == "voice/say"
    assert response.run.output == "hi"
    assert (error.code, error.reason) == (FAILED_PRECONDITION, "SEEDSTORE_REFUSED")
    assert "TOKEN_MISSING" in error.message


# --- gates: the seedstore's, as sent ----------------------------------------------------------

UNKNOWN_GATE = common_pb2.Gate.ValueType(99)  # a gate number no build of the negotiator names
GateNumbers: TypeAlias = list[common_pb2.Gate.ValueType]


class FakeSeedStore(seedstore_pb2_grpc.SeedStoreServiceServicer):
    """A seedstore that answers with fixed gates, whatever its seeds' risks say."""

    def __init__(self, command: str, search_gates: GateNumbers, file_gates: GateNumbers) -> None:
        self.command = command
        self.search_gates = search_gates
        self.file_gates = file_gates
        self.inspected = 0

    async def SearchSeeds(self, request: spb.SearchSeedsRequest, context: Any) -> spb.SearchSeedsResponse:
        candidate = common_pb2.Candidate(
            id="odd",
            domain="voice",
            path="/store/voice/odd.yml",
            score=65,
            reasons=["direct provides match"],
            required_gates=self.search_gates,
        )
        return spb.SearchSeedsResponse(
            seed_store="/store",
            capability=request.capability,
            selected="odd",
            selection_policy="highest_score_after_constraints",
            candidates=[candidate],
            broadening=spb.Broadening(first_search_empty=False, fallback_policy="-"),
            total_candidates=1,
            ask_window_points=10,
        )

    async def InspectSeed(self, request: spb.InspectSeedRequest, context: Any) -> spb.InspectSeedResponse:
        self.inspected += 1
        seed = spb.Seed(
            id="odd",
            domain="voice",
            kind="script",
            command=self.command,
            provides=["odd_voice"],
            # Risks and a secret that would need every gate, were the negotiator to derive them.
            risk=spb.Risk(external_service=True, may_cost_money=True),
            auth_env=["ODD_KEY"],
            verification=spb.Verification(status=spb.VERIFICATION_STATUS_VERIFIED, verified_at_unix=1),
        )
        return spb.InspectSeedResponse(
            seed_store="/store",
            path="/store/voice/odd.yml",
            revision="r",
            seed=seed,
            required_gates=self.file_gates,
        )


def fake_seedstore(command: str, search_gates: GateNumbers, file_gates: GateNumbers) -> FakeSeedStore:
    # Only SearchSeeds and InspectSeed are served; the other RPCs answer UNIMPLEMENTED.
    return FakeSeedStore(command, search_gates, file_gates)  # type: ignore[abstract]


@contextlib.asynccontextmanager
async def fake_pair(short_dir: Path, config_file: Path, fake: FakeSeedStore) -> AsyncIterator[Stub]:
    """The fake seedstore on a real Unix socket, and a real negotiator that bootstraps from it."""
    server = grpc.aio.server()
    seedstore_pb2_grpc.add_SeedStoreServiceServicer_to_server(fake, server)
    target = f"unix:{short_dir / 'fake-seedstore.sock'}"
    server.add_insecure_port(target)
    await server.start()
    negotiator = await start_negotiator(short_dir, config_file, target)
    try:
        async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
            yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)
    finally:
        await negotiator.stop()
        await server.stop(None)


async def test_a_gate_the_negotiator_does_not_know_is_shown_unapprovable_and_named(
    short_dir: Path, config_file: Path, tmp_path: Path
) -> None:
    odd = Script(tmp_path, "odd", "echo odd")
    fake = fake_seedstore(odd.command, search_gates=[PROVIDER_COST, UNKNOWN_GATE], file_gates=[UNKNOWN_GATE])
    async with fake_pair(short_dir, config_file, fake) as stub:
        listed = await stub.Bootstrap(request("odd_voice"), timeout=10)
        assert list(listed.candidates[0].required_gates) == [PROVIDER_COST, UNKNOWN_GATE]

        refused = await call_error(
            stub.Bootstrap(request("odd_voice", run=True, approved_gates=[PROVIDER_COST]), timeout=10)
        )
        assert (refused.code, refused.reason) == (FAILED_PRECONDITION, "GATES_NOT_APPROVED")
        assert gate_violations(refused) == [("GATE_NOT_APPROVED", f"unknown_gate_{UNKNOWN_GATE}")]
        assert refused.metadata["requiredGates"] == f"provider_cost_approval,unknown_gate_{UNKNOWN_GATE}"

        # Approving the number itself is no approval: the request is refused before any search.
        approving = await call_error(
            stub.Bootstrap(
                request("odd_voice", run=True, approved_gates=[PROVIDER_COST, UNKNOWN_GATE]), timeout=10
            )
        )
        assert approving.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [field for field, _ in approving.field_violations] == ["approved_gates[1]"]

        # Known only to the file as read again: still required, still unapprovable.
        fake.search_gates = []
        again = await call_error(stub.Bootstrap(request("odd_voice", run=True), timeout=10))
        assert gate_violations(again) == [("GATE_NOT_APPROVED", f"unknown_gate_{UNKNOWN_GATE}")]
    assert fake.inspected == 1  # the first refusal came from the search's gates, before any read
    assert not odd.ran


async def test_the_negotiator_gates_on_the_seedstores_gates_and_derives_none_of_its_own(
    short_dir: Path, config_file: Path, tmp_path: Path
) -> None:
    """The fake's seed declares every risk and a secret but its seedstore requires no gate: it runs."""
    odd = Script(tmp_path, "odd", "echo odd")
    async with fake_pair(short_dir, config_file, fake_seedstore(odd.command, [], [])) as stub:
        response = await stub.Bootstrap(request("odd_voice", run=True), timeout=10)
    assert odd.ran
    assert response.run.output == "odd\n"
    assert "gates: none required" in response.run.evidence


async def test_the_gates_a_run_needs_are_the_seedstores_for_the_file_as_read_at_run_time(
    stub: Stub, negotiator: RunningNegotiator, seeds: AsyncSeedStoreClient, tmp_path: Path
) -> None:
    """A risk added between the search and the run is caught, and the gates named are InspectSeed's."""
    edited = Script(tmp_path, "edited", "echo edited")
    await add_seed(seeds, "edited", "voice", edited.command, provides=["narration"])
    bootstrapper = negotiator.bootstrapper
    assert bootstrapper is not None
    assert bootstrapper.seedstore is not None
    source = bootstrapper.seedstore
    original_search = source.search

    async def search_then_edit(*args: Any, **kwargs: Any) -> bootstrap_plan.SearchOutcome:
        outcome = await original_search(*args, **kwargs)
        await seeds.update_seed(
            id="edited", domain="voice", may_cost_money=True, add_auth_env=["NARRATE_KEY"]
        )
        return outcome

    source.search = search_then_edit  # type: ignore[method-assign]
    error = await call_error(stub.Bootstrap(request("narration", run=True), timeout=10))
    inspected = await seeds.inspect_seed(id="edited", domain="voice")
    names = [common_pb2.Gate.Name(g).removeprefix("GATE_").lower() for g in inspected.required_gates]
    assert names == ["provider_cost_approval", "secret_use_approval"]
    assert error.metadata["requiredGates"] == ",".join(names)
    assert [subject for _, subject in gate_violations(error)] == names
    assert not edited.ran
