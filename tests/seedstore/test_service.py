"""The seedstore gRPC service on real sockets: responses, rich error statuses, streamed verification."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from agentsidecar.clients.errors import SidecarError
from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service.seedfile import revision_of
from agentsidecar.seedstore_service.status import ERROR_DOMAIN
from tests.procs import process_alive

from .conftest import ServerThread

VOICE = pb.AddSeedRequest(
    id="remote-voice-cli",
    domain="voice",
    kind="cli",
    command="voice-cli",
    provides=["text_to_speech"],
    priority=80,
    ties=["quality=high"],
    evidence_commands=["voice-cli --help"],
)


@pytest.fixture
def client(server: ServerThread) -> Iterator[SeedStoreClient]:
    with SeedStoreClient(server.unix_target) as seedstore:
        yield seedstore


def seed_request(
    seed_id: str, *evidence: str, domain: str = "voice", command: str | None = None
) -> pb.AddSeedRequest:
    return pb.AddSeedRequest(
        id=seed_id,
        domain=domain,
        kind="cli",
        command=command,
        provides=["text_to_speech"],
        evidence_commands=evidence,
    )


def failure(call: Callable[[], object]) -> SidecarError:
    with pytest.raises(SidecarError) as raised:
        call()
    error = raised.value
    assert error.code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.OK)
    assert error.domain == ERROR_DOMAIN
    return error


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_add_update_inspect_over_both_listeners(server: ServerThread, home: Path, transport: str) -> None:
    target = server.unix_target if transport == "unix" else server.tcp_target
    with SeedStoreClient(target) as client:
        added = client.add_seed(VOICE)
        path = home / "capabilities" / "voice" / "remote-voice-cli.yml"
        assert added.path == str(path)
        assert added.seed_store == str(home / "capabilities")
        assert added.revision == revision_of(path.read_bytes())
        assert added.seed.rank.tie_breakers == {"quality": "high"}
        assert added.seed.rank.default_priority == 80

        updated = client.update_seed(
            pb.UpdateSeedRequest(id="remote-voice-cli", expected_revision=added.revision, add_aliases=["tts"])
        )
        assert updated.revision != added.revision
        assert updated.revision == revision_of(path.read_bytes())
        assert list(updated.seed.aliases) == ["tts"]

        inspected = client.inspect_seed(pb.InspectSeedRequest(id="remote-voice-cli"))
        assert inspected.revision == updated.revision
        assert inspected.seed == updated.seed

        listed = client.list_seeds(pb.ListSeedsRequest(domain="voice"))
        assert [(entry.id, entry.revision) for entry in listed.seeds] == [
            ("remote-voice-cli", updated.revision)
        ]
        assert listed.seeds[0].verification_status == pb.VERIFICATION_STATUS_UNVERIFIED


def test_invalid_input_is_invalid_argument_naming_the_request_field(client: SeedStoreClient) -> None:
    client.add_seed(VOICE)
    cases: list[tuple[Callable[[], object], str, str, str]] = [
        (
            lambda: client.add_seed(seed_request("Bad")),
            "INVALID_IDENTIFIER",
            "id",
            'invalid identifier "Bad" in capability id',
        ),
        (
            lambda: client.add_seed(pb.AddSeedRequest(id="x", domain="../etc", kind="cli", provides=["a"])),
            "INVALID_IDENTIFIER",
            "domain",
            'invalid identifier "../etc" in domain',
        ),
        (
            lambda: client.search_seeds(pb.SearchSeedsRequest(capability="Text")),
            "INVALID_IDENTIFIER",
            "capability",
            'invalid identifier "Text" in capability',
        ),
        (
            lambda: client.search_seeds(pb.SearchSeedsRequest(capability="tts", preferred_seed="A")),
            "INVALID_IDENTIFIER",
            "preferred_seed",
            'invalid identifier "A" in preferred seed',
        ),
        (
            lambda: client.update_seed(pb.UpdateSeedRequest(id="remote-voice-cli", add_provides=["No"])),
            "INVALID_IDENTIFIER",
            "add_provides",
            'invalid identifier "No" in add-provides',
        ),
        (
            lambda: client.update_seed(pb.UpdateSeedRequest(id="remote-voice-cli", remove_ties=["K"])),
            "INVALID_IDENTIFIER",
            "remove_ties",
            'invalid identifier "K" in remove-tie',
        ),
        (
            lambda: client.prefer_seed(pb.PreferSeedRequest(id="remote-voice-cli", for_capability="../x")),
            "INVALID_IDENTIFIER",
            "for_capability",
            'invalid identifier "../x" in for',
        ),
        (
            lambda: client.list_seeds(pb.ListSeedsRequest(domain="Voice")),
            "INVALID_IDENTIFIER",
            "domain",
            'invalid identifier "Voice" in domain',
        ),
        (
            lambda: list(client.verify_seeds(pb.VerifySeedsRequest(ids=["Bad"]))),
            "INVALID_IDENTIFIER",
            "ids",
            'invalid identifier "Bad" in capability id',
        ),
        (
            lambda: client.add_seed(
                pb.AddSeedRequest(id="x", domain="voice", kind="cli", provides=["a"], priority=101)
            ),
            "INVALID_ARGUMENT",
            "priority",
            "priority must be between 0 and 100",
        ),
        (
            lambda: client.add_seed(
                pb.AddSeedRequest(id="x", domain="voice", kind="cli", provides=["a"], ties=["q"])
            ),
            "INVALID_ARGUMENT",
            "ties",
            'tie breaker "q" must use key=value',
        ),
        (
            lambda: client.update_seed(pb.UpdateSeedRequest(id="remote-voice-cli", add_ties=["q"])),
            "INVALID_ARGUMENT",
            "add_ties",
            'tie breaker "q" must use key=value',
        ),
        (
            lambda: client.add_seed(pb.AddSeedRequest(id="x", domain="voice", kind="cli")),
            "INVALID_ARGUMENT",
            "provides",
            "spec is missing required field provides",
        ),
        (
            lambda: client.update_seed(pb.UpdateSeedRequest(id="remote-voice-cli", mark=7)),  # type: ignore[arg-type]
            "INVALID_ARGUMENT",
            "mark",
            "unknown verification mark 7",
        ),
    ]
    for call, reason, field, message in cases:
        error = failure(call)
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT, message
        assert error.reason == reason, message
        assert error.message == message
        assert [violation[0] for violation in error.field_violations] == [field], message
        assert error.metadata["field"] == field


def test_verify_limits_are_checked(client: SeedStoreClient) -> None:
    client.add_seed(VOICE)
    too_long = pb.VerifySeedsRequest(ids=["remote-voice-cli"])
    too_long.check_timeout.FromSeconds(601)
    error = failure(lambda: list(client.verify_seeds(too_long)))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.field_violations[0][0] == "check_timeout"
    error = failure(
        lambda: list(client.verify_seeds(pb.VerifySeedsRequest(ids=["remote-voice-cli"], concurrency=33)))
    )
    assert error.field_violations[0][0] == "concurrency"
    error = failure(lambda: list(client.verify_seeds(pb.VerifySeedsRequest(all_in_domain=True))))
    assert error.field_violations[0][0] == "domain"


@pytest.mark.slow
def test_unknown_ambiguous_malformed_and_stale_seeds(
    client: SeedStoreClient, server: ServerThread, home: Path
) -> None:
    added = client.add_seed(VOICE)

    error = failure(lambda: client.inspect_seed(pb.InspectSeedRequest(id="nope")))
    assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, "SEED_NOT_FOUND")
    assert error.message == 'unknown capability seed "nope"'
    assert error.metadata["seedId"] == "nope"
    error = failure(lambda: client.remove_seed(pb.RemoveSeedRequest(id="nope")))
    assert error.code == grpc.StatusCode.NOT_FOUND

    client.add_seed(seed_request("twin"))
    client.add_seed(seed_request("twin", domain="audio"))
    error = failure(lambda: client.prefer_seed(pb.PreferSeedRequest(id="twin", for_capability="tts")))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "SEED_AMBIGUOUS")
    assert error.message == 'capability seed "twin" exists in multiple domains; pass --domain'
    store = home / "capabilities"
    assert sorted(violation.subject for violation in error.precondition_violations) == [
        str(store / "audio" / "twin.yml"),
        str(store / "voice" / "twin.yml"),
    ]

    broken = store / "voice" / "broken.yml"
    broken.write_text(
        "id: broken\ndomain: voice\nkind: cli\nverification:\n  status: great\n  verified_at_unix: 1\n"
    )
    server.sync()
    error = failure(lambda: client.inspect_seed(pb.InspectSeedRequest(id="broken")))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "SEED_MALFORMED")
    assert error.message.startswith(f"failed to parse YAML from {broken}: ")
    (violation,) = error.precondition_violations
    assert violation.subject == str(broken)
    assert violation.description.startswith("line 5: ")
    assert error.metadata["path"] == str(broken)
    assert error.metadata["line"] == "5"

    error = failure(
        lambda: client.update_seed(
            pb.UpdateSeedRequest(id="remote-voice-cli", expected_revision="0" * 16, kind="x")
        )
    )
    assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, "REVISION_MISMATCH")
    assert error.metadata["expected"] == "0" * 16
    assert error.metadata["actual"] == added.revision
    assert client.inspect_seed(pb.InspectSeedRequest(id="remote-voice-cli")).seed.kind == "cli"


def test_store_that_cannot_be_written_is_unavailable(
    start_server: Callable[..., ServerThread], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    server = start_server(store_root=blocker / "capabilities")
    with SeedStoreClient(server.unix_target) as client:
        error = failure(lambda: client.add_seed(VOICE))
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")
    assert error.message.startswith("failed to write ")


def test_search_list_and_problems_come_back_as_protos(
    client: SeedStoreClient, server: ServerThread, home: Path
) -> None:
    client.add_seed(VOICE)
    (home / "capabilities" / "voice" / "junk.yml").write_text("id: [\n")
    server.sync()
    response = client.search_seeds(pb.SearchSeedsRequest(capability="text_to_speech", local_only=True))
    assert response.selected == "remote-voice-cli"
    assert response.selection_policy == "highest_score_after_constraints"
    (candidate,) = response.candidates
    assert candidate.score == 40 - 20 + 8 + 20
    assert list(candidate.reasons)[-1] == "local-only constraint satisfied"
    assert [problem.path for problem in response.problems] == [
        str(home / "capabilities" / "voice" / "junk.yml")
    ]
    assert not response.HasField("broadening")

    broadened = client.search_seeds(
        pb.SearchSeedsRequest(capability="speech_synthesis", domain="audio", broaden=True)
    )
    assert broadened.broadening.first_search_empty
    assert broadened.broadening.attempts[0].capability == "speech_synthesis"
    assert broadened.broadening.attempts[0].domain == "audio"
    assert broadened.candidates[0].matched_capability == "text_to_speech"
    assert broadened.candidates[0].matched_domain == "voice"
    assert list(broadened.broadening.table_sources) == ["builtin"]

    assert client.scan_seeds().proposals == []
    assert client.get_store().seed_store == str(home / "capabilities")


def events_of(responses: Iterator[pb.VerifySeedsResponse]) -> list[tuple[str, object]]:
    events: list[tuple[str, object]] = []
    for response in responses:
        kind = response.WhichOneof("event")
        assert kind is not None
        events.append((kind, getattr(response, kind)))
    return events


@pytest.mark.slow
def test_verify_streams_each_check_then_the_written_verdict(client: SeedStoreClient, home: Path) -> None:
    client.add_seed(VOICE)
    events = events_of(client.verify_seeds(pb.VerifySeedsRequest(ids=["remote-voice-cli"], domain="voice")))
    kinds = [(kind, getattr(event, "check", ""), getattr(event, "index", -1)) for kind, event in events]
    assert kinds == [
        ("check_started", "path_lookup:voice-cli", 0),
        ("check_finished", "path_lookup:voice-cli", 0),
        ("check_started", "evidence_command:voice-cli --help", 1),
        ("check_finished", "evidence_command:voice-cli --help", 1),
        ("seed_verified", "", -1),
    ]
    lookup, command = events[1][1], events[3][1]
    assert isinstance(lookup, pb.CheckFinished)
    assert isinstance(command, pb.CheckFinished)
    assert lookup.ok
    assert not lookup.HasField("exit_code")
    assert command.ok
    assert command.exit_code == 0
    assert command.message == "evidence command exited successfully"
    assert command.duration.ToNanoseconds() > 0
    verdict = events[4][1]
    assert isinstance(verdict, pb.SeedVerified)
    assert verdict.status == pb.VERIFICATION_STATUS_VERIFIED
    assert [outcome.check for outcome in verdict.outcomes] == [
        "path_lookup:voice-cli",
        "evidence_command:voice-cli --help",
    ]

    path = home / "capabilities" / "voice" / "remote-voice-cli.yml"
    assert verdict.path == str(path)
    assert verdict.revision == revision_of(path.read_bytes())
    text = path.read_text()
    assert "verification:\n  status: verified\n  verified_at_unix: " in text
    assert "  - check: evidence_command:voice-cli --help\n    ok: true\n" in text
    inspected = client.inspect_seed(pb.InspectSeedRequest(id="remote-voice-cli"))
    assert inspected.seed.verification.status == pb.VERIFICATION_STATUS_VERIFIED
    assert abs(inspected.seed.verification.verified_at_unix - time.time()) < 60


def test_verify_failing_seed_is_recorded_as_failed(client: SeedStoreClient) -> None:
    client.add_seed(seed_request("broken", "broken-cli --version", command="not-installed-anywhere"))
    events = events_of(client.verify_seeds(pb.VerifySeedsRequest(ids=["broken"])))
    finished = [event for kind, event in events if kind == "check_finished"]
    assert [(e.ok, e.message) for e in finished if isinstance(e, pb.CheckFinished)] == [
        (False, "not-installed-anywhere not found on PATH"),
        (False, "evidence command exited with 3"),
    ]
    assert isinstance(finished[1], pb.CheckFinished)
    assert finished[1].exit_code == 3
    verdict = events[-1][1]
    assert isinstance(verdict, pb.SeedVerified)
    assert verdict.status == pb.VERIFICATION_STATUS_FAILED
    assert (
        client.list_seeds(pb.ListSeedsRequest()).seeds[0].verification_status == pb.VERIFICATION_STATUS_FAILED
    )


@pytest.mark.slow
def test_several_seeds_verify_with_bounded_concurrency(client: SeedStoreClient) -> None:
    names = [f"slow-{n}" for n in range(5)]
    for name in names:
        client.add_seed(seed_request(name, "sleep 0.3"))
    request = pb.VerifySeedsRequest(domain="voice", all_in_domain=True, concurrency=2)
    running: set[str] = set()
    most = 0
    verdicts: list[str] = []
    per_seed: dict[str, list[str]] = {}
    for kind, event in events_of(client.verify_seeds(request)):
        seed_id = getattr(event, "id")  # noqa: B009 - every event kind has an id
        per_seed.setdefault(seed_id, []).append(kind)
        if kind == "check_started":
            running.add(seed_id)
            most = max(most, len(running))
        elif kind == "check_finished":
            running.discard(seed_id)
        else:
            verdicts.append(seed_id)
    assert most == 2
    assert sorted(verdicts) == names
    assert all(kinds == ["check_started", "check_finished", "seed_verified"] for kinds in per_seed.values())
    statuses = {
        entry.id: entry.verification_status for entry in client.list_seeds(pb.ListSeedsRequest()).seeds
    }
    assert statuses == dict.fromkeys(names, pb.VERIFICATION_STATUS_VERIFIED)


def test_cancelling_verify_stops_the_running_check(
    client: SeedStoreClient, tmp_path: Path, home: Path
) -> None:
    pid_file = tmp_path / "check.pid"
    client.add_seed(seed_request("hang", f"sh -c 'echo $$ > {pid_file}; exec sleep 30'"))
    events = client.verify_seeds(pb.VerifySeedsRequest(ids=["hang"]))
    first = next(events)
    assert first.WhichOneof("event") == "check_started"
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the evidence command never started"
        time.sleep(0.02)
    pid = int(pid_file.read_text())
    os.kill(pid, 0)  # running

    events.close()  # the client cancels the call when its iterator is closed
    deadline = time.monotonic() + 5
    while process_alive(pid):
        assert time.monotonic() < deadline, "the check outlived its cancelled call"
        time.sleep(0.02)
    assert "verification" not in (home / "capabilities" / "voice" / "hang.yml").read_text()


def test_verify_of_an_unknown_seed_fails_before_any_event(client: SeedStoreClient) -> None:
    client.add_seed(VOICE)
    received: queue.Queue[pb.VerifySeedsResponse] = queue.Queue()

    def consume() -> None:
        for response in client.verify_seeds(pb.VerifySeedsRequest(ids=["remote-voice-cli", "nope"])):
            received.put(response)

    error = failure(consume)
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert received.empty()


@pytest.mark.slow
def test_reads_are_served_from_memory_and_see_writes_at_once(client: SeedStoreClient) -> None:
    # Every write refreshes the index before answering, so a read right after sees it.
    for n in range(20):
        client.add_seed(seed_request(f"seed-{n:02d}"))
        assert len(client.list_seeds(pb.ListSeedsRequest()).seeds) == n + 1
    threads = [
        threading.Thread(target=lambda n=n: client.remove_seed(pb.RemoveSeedRequest(id=f"seed-{n:02d}")))
        for n in range(10)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [entry.id for entry in client.list_seeds(pb.ListSeedsRequest()).seeds] == [
        f"seed-{n:02d}" for n in range(10, 20)
    ]


def test_a_seed_written_by_another_program_is_found_before_the_next_refresh(
    start_server: Callable[..., ServerThread], home: Path
) -> None:
    server = start_server(refresh_interval=600.0)
    with SeedStoreClient(server.unix_target) as client:
        assert list(client.list_seeds(pb.ListSeedsRequest()).seeds) == []
        (home / "capabilities" / "dev").mkdir(parents=True)
        (home / "capabilities" / "dev" / "jq.yml").write_text(
            "id: jq\ndomain: dev\nkind: cli\nprovides: [json]\n"
        )
        # A lookup by id that misses rescans once instead of answering from a stale index.
        assert client.inspect_seed(pb.InspectSeedRequest(id="jq")).seed.provides == ["json"]
        assert [entry.id for entry in client.list_seeds(pb.ListSeedsRequest()).seeds] == ["jq"]
        error = failure(lambda: client.inspect_seed(pb.InspectSeedRequest(id="nope")))
        assert error.code == grpc.StatusCode.NOT_FOUND
