"""Hostile inputs against a real seedstore service and CLI: long identifiers, NUL bytes,
symlinks out of the store, oversized and alias-bomb files, duplicate ids, idle watchers, paging."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentsidecar.clients.errors import SidecarError
from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc
from agentsidecar.seedstore_service.persisted import INDEX_DIR_NAME
from agentsidecar.seedstore_service.seedfile import MAX_IDENTIFIER_LENGTH, MAX_SEED_FILE_BYTES
from agentsidecar.seedstore_service.status import ERROR_DOMAIN
from agentsidecar.sidecar_runtime.server import ServerOptions

from .conftest import Cli, ServerThread
from .test_watch import Watcher


@pytest.fixture
def client(server: ServerThread) -> Iterator[SeedStoreClient]:
    with SeedStoreClient(server.unix_target) as seedstore:
        yield seedstore


def failure(call: Callable[[], object]) -> SidecarError:
    with pytest.raises(SidecarError) as raised:
        call()
    error = raised.value
    assert error.code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.OK, grpc.StatusCode.INTERNAL)
    assert error.domain == ERROR_DOMAIN
    return error


def seed_request(seed_id: str, *evidence: str, domain: str = "voice") -> pb.AddSeedRequest:
    return pb.AddSeedRequest(
        id=seed_id, domain=domain, kind="cli", provides=["text_to_speech"], evidence_commands=evidence
    )


# --- identifiers have a maximum length --------------------------------------------


def test_an_identifier_over_the_limit_is_invalid_argument_and_writes_nothing(
    client: SeedStoreClient, home: Path
) -> None:
    longest = "a" * MAX_IDENTIFIER_LENGTH
    added = client.add_seed(seed_request(longest, domain="d" * MAX_IDENTIFIER_LENGTH))
    assert Path(added.path).is_file()

    for request, field in (
        (seed_request("a" * 240), "id"),
        (seed_request("ok", domain="d" * 240), "domain"),
        (pb.AddSeedRequest(id="ok", domain="voice", kind="cli", provides=["p" * 100_000]), "provides"),
    ):
        error = failure(functools.partial(client.add_seed, request))
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER")
        assert error.field_violations[0][0] == field
        assert f"longer than {MAX_IDENTIFIER_LENGTH} characters" in error.message
        assert len(error.message) < 200
        assert len(error.metadata["value"]) < 100
    error = failure(lambda: client.inspect_seed(pb.InspectSeedRequest(id="a" * 240)))
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER")
    root = home / "capabilities"
    written = sorted(
        path.name
        for path in root.rglob("*")
        if path.is_file() and INDEX_DIR_NAME not in path.relative_to(root).parts  # the persisted index
    )
    assert written == [".seedstore.lock", f"{longest}.yml"]


@pytest.mark.slow
def test_cli_add_refuses_a_long_id_with_skillspecs_exit_code(cli: Cli) -> None:
    result = cli.run("add", "a" * 240, "--domain", "voice", "--kind", "cli", "--provides", "x")
    assert result.code == 1
    first = result.stderr.partition("\n")[0]  # SkillSpec's line; the JSON error line follows it
    assert first.startswith('error: invalid identifier "aaaa')
    assert first.endswith(f"in capability id: longer than {MAX_IDENTIFIER_LENGTH} characters")


# --- NUL bytes in commands ----------------------------------------------------------


def test_a_nul_in_a_command_is_refused_at_add_and_update(client: SeedStoreClient, home: Path) -> None:
    error = failure(lambda: client.add_seed(seed_request("nul", "voice-cli\x00--help")))
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert error.field_violations[0][0] == "evidence_commands"
    request = seed_request("nul")
    request.command = "voice\x00cli"
    error = failure(lambda: client.add_seed(request))
    assert error.field_violations[0][0] == "command"
    assert not (home / "capabilities" / "voice" / "nul.yml").exists()

    client.add_seed(seed_request("nul"))
    error = failure(
        lambda: client.update_seed(pb.UpdateSeedRequest(id="nul", add_evidence_commands=["a\x00b"]))
    )
    assert (error.code, error.field_violations[0][0]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "add_evidence_commands",
    )


def test_a_file_holding_a_nul_command_fails_that_check_alone(
    client: SeedStoreClient, server: ServerThread, home: Path
) -> None:
    domain = home / "capabilities" / "voice"
    domain.mkdir(parents=True)
    (domain / "nul.yml").write_text(
        "id: nul\ndomain: voice\nkind: cli\nprovides:\n- text_to_speech\nevidence:\n"
        '- source: cli_help\n  command: "voice-cli --he\\0lp"\n'
        "- source: cli_help\n  command: voice-cli --help\n"
    )
    server.sync()
    responses = list(client.verify_seeds(pb.VerifySeedsRequest(ids=["nul"])))
    verdict = responses[-1].seed_verified
    assert verdict.status == pb.VERIFICATION_STATUS_VERIFIED
    assert [(outcome.ok, outcome.message) for outcome in verdict.outcomes] == [
        (False, "evidence command contains a NUL byte"),
        (True, "evidence command exited successfully"),
    ]


# --- symlinks: reads may follow them, writes never leave the store ---------------------


def test_a_seed_linked_to_another_file_is_never_quoted(
    client: SeedStoreClient, server: ServerThread, home: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("".join(f"user{n}:x:{n}:{n}:SECRET-{n}:/home/u:/bin/sh\n" for n in range(200)))
    domain = home / "capabilities" / "voice"
    domain.mkdir(parents=True)
    (domain / "passwd.yml").symlink_to(secret)
    (domain / "long.yml").write_text("id: long\ndomain: voice\nkind: cli\nrank: " + "SECRET-" * 20_000 + "\n")
    (domain / "escape.yml").write_text('id: escape\ndomain: voice\nkind: cli\n"\\e[31mSECRET\\n": 1\n')
    server.sync()

    problems = {Path(problem.path).name: problem for problem in client.list_seeds().problems}
    assert sorted(problems) == ["escape.yml", "long.yml", "passwd.yml"]
    assert problems["passwd.yml"].reason.endswith(
        "expected a mapping at the top level, found a scalar (line 1, column 1)"
    )
    assert "SECRET" not in problems["passwd.yml"].reason
    assert problems["long.yml"].reason.count("SECRET") < 15
    assert "expected a mapping at rank, found the scalar" in problems["long.yml"].reason
    assert "(line 4, column 7)" in problems["long.yml"].reason
    assert "\x1b" not in problems["escape.yml"].reason
    assert "\\x1b[31mSECRET\\n" in problems["escape.yml"].reason
    for problem in problems.values():
        assert len(problem.reason) < 400

    error = failure(lambda: client.inspect_seed(pb.InspectSeedRequest(id="passwd")))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "SEED_MALFORMED")
    assert "SECRET" not in error.message
    assert "SECRET" not in str(error.metadata)
    assert all("SECRET" not in violation.description for violation in error.precondition_violations)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    return path


def test_add_into_a_domain_linked_out_of_the_store_is_refused(
    client: SeedStoreClient, home: Path, outside: Path
) -> None:
    store = home / "capabilities"
    store.mkdir()
    (store / "voice").symlink_to(outside)
    (store / "gone").symlink_to(outside / "missing")
    for domain in ("voice", "gone"):
        error = failure(functools.partial(client.add_seed, seed_request("escapee", domain=domain)))
        assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OUTSIDE_STORE")
        (violation,) = error.precondition_violations
        assert violation.subject == str(store / domain)
    assert list(outside.iterdir()) == []


def test_edits_of_a_seed_read_through_an_outside_link_are_refused(
    client: SeedStoreClient, server: ServerThread, home: Path, outside: Path
) -> None:
    store = home / "capabilities"
    store.mkdir()
    text = "id: far\ndomain: voice\nkind: cli\nprovides:\n- text_to_speech\n"
    (outside / "far.yml").write_text(text)
    (store / "voice").symlink_to(outside)
    server.sync()
    assert client.inspect_seed(pb.InspectSeedRequest(id="far")).seed.kind == "cli"  # reads follow links

    calls: list[Callable[[], object]] = [
        lambda: client.update_seed(pb.UpdateSeedRequest(id="far", kind="tool")),
        lambda: client.prefer_seed(pb.PreferSeedRequest(id="far", for_capability="speech")),
        lambda: client.remove_seed(pb.RemoveSeedRequest(id="far")),
        lambda: list(client.verify_seeds(pb.VerifySeedsRequest(ids=["far"]))),
    ]
    for call in calls:
        error = failure(call)
        assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OUTSIDE_STORE")
    assert [path.name for path in outside.iterdir()] == ["far.yml"]
    assert (outside / "far.yml").read_text() == text


def test_a_linked_seed_file_is_replaced_never_written_through(
    client: SeedStoreClient, server: ServerThread, home: Path, outside: Path
) -> None:
    store = home / "capabilities"
    (store / "voice").mkdir(parents=True)
    text = "id: linked\ndomain: voice\nkind: cli\nprovides:\n- text_to_speech\n"
    (outside / "linked.yml").write_text(text)
    link = store / "voice" / "linked.yml"
    link.symlink_to(outside / "linked.yml")
    server.sync()
    updated = client.update_seed(pb.UpdateSeedRequest(id="linked", kind="tool"))
    assert updated.path == str(link)
    assert not link.is_symlink()
    assert "kind: tool" in link.read_text()
    assert (outside / "linked.yml").read_text() == text


def test_a_lock_file_linked_out_of_the_store_is_never_written(
    client: SeedStoreClient, home: Path, outside: Path
) -> None:
    store = home / "capabilities"
    store.mkdir()
    (outside / "victim").write_text("keep")
    (store / ".seedstore.lock").symlink_to(outside / "victim")
    error = failure(lambda: client.add_seed(seed_request("x")))
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")
    assert (outside / "victim").read_text() == "keep"
    assert not (store / "voice").exists()


# --- size limits at the door -------------------------------------------------------------


def big_valid_seed(seed_id: str, size: int) -> str:
    head = f"id: {seed_id}\ndomain: voice\nkind: cli\nprovides:\n"
    entry = "- text_to_speech_" + "x" * 100 + "\n"
    return head + entry * (size // len(entry))


def test_a_seed_file_over_the_limit_is_a_problem_and_breaks_no_listing_or_watch(
    client: SeedStoreClient, server: ServerThread, home: Path
) -> None:
    client.add_seed(seed_request("small"))
    watcher = Watcher(server.unix_target)
    try:
        big = home / "capabilities" / "voice" / "big.yml"
        big.write_text(big_valid_seed("big", 5 * 1024 * 1024))
        server.sync()
        listed = client.list_seeds()
        assert [entry.id for entry in listed.seeds] == ["small"]
        (problem,) = listed.problems
        assert problem.path == str(big)
        assert f"more than the {MAX_SEED_FILE_BYTES} a seed file may hold" in problem.reason
        error = failure(lambda: client.inspect_seed(pb.InspectSeedRequest(id="big")))
        assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "SEED_MALFORMED")

        event = watcher.next()
        assert (event.kind, event.path) == (pb.CHANGE_KIND_MALFORMED, str(big))
        client.add_seed(seed_request("later"))
        assert watcher.next().id == "later"  # the stream lives on
    finally:
        watcher.close()


@pytest.mark.slow
def test_yaml_whose_aliases_expand_past_the_limit_is_refused(
    client: SeedStoreClient, server: ServerThread, home: Path
) -> None:
    domain = home / "capabilities" / "voice"
    domain.mkdir(parents=True)
    # ~600 KB on disk, ~200 MB once every alias is expanded.
    bomb = "id: bomb\ndomain: voice\nkind: cli\nprovides: [text_to_speech]\n"
    bomb += "aliases:\n- &s '" + "voice " * 340 + "'\n" + "- *s\n" * 100_000
    assert len(bomb) < MAX_SEED_FILE_BYTES
    (domain / "bomb.yml").write_text(bomb)
    (domain / "loop.yml").write_text("id: loop\ndomain: voice\nkind: cli\nrank: &r\n  avoid_for: *r\n")
    server.sync()
    problems = {Path(problem.path).name: problem.reason for problem in client.list_seeds().problems}
    assert "expands to more than" in problems["bomb.yml"]
    assert "(line 1, column 1)" in problems["bomb.yml"]
    assert "an alias refers to a node that contains it (line 4, column 7)" in problems["loop.yml"]


def test_a_fifo_named_like_a_seed_is_a_problem_not_a_hang(
    client: SeedStoreClient, server: ServerThread, home: Path
) -> None:
    client.add_seed(seed_request("small"))
    fifo = home / "capabilities" / "voice" / "fifo.yml"
    os.mkfifo(fifo)
    refresh = threading.Thread(target=server.sync, daemon=True)
    refresh.start()
    refresh.join(10)
    assert not refresh.is_alive(), "reading the FIFO blocked the index refresh"
    (problem,) = client.list_seeds().problems
    assert (problem.path, problem.reason) == (str(fifo), f"failed to read {fifo}: not a regular file")


# --- ambiguity is decided by the files at write time ------------------------------------


def test_update_sees_a_duplicate_written_just_before_it(
    start_server: Callable[..., ServerThread], home: Path
) -> None:
    server = start_server(refresh_interval=3600.0)  # no background refresh during the test
    store = home / "capabilities"
    with SeedStoreClient(server.unix_target) as client:
        client.add_seed(seed_request("dup"))
        client.add_seed(seed_request("other"))
        client.add_seed(seed_request("third", domain="audio"))
        original = (store / "voice" / "dup.yml").read_bytes()
        duplicate = original.decode()
        cases = [
            (store / "voice" / "nested" / "deeper" / "copy.yml", "voice"),  # nested, another name
            (store / "voice" / "other.yml", None),  # an indexed file edited to hold the id
            (store / "audio" / "third.yml", None),  # another domain, whole-store lookup
        ]
        for path, domain in cases:
            path.parent.mkdir(parents=True, exist_ok=True)
            before = path.read_bytes() if path.exists() else None
            path.write_text(duplicate)
            request = pb.UpdateSeedRequest(id="dup", domain=domain, kind="tool")
            error = failure(functools.partial(client.update_seed, request))
            assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "SEED_AMBIGUOUS")
            subjects = sorted(violation.subject for violation in error.precondition_violations)
            assert str(path) in subjects
            assert (store / "voice" / "dup.yml").read_bytes() == original
            failure(lambda: client.prefer_seed(pb.PreferSeedRequest(id="dup", for_capability="x")))
            failure(lambda: client.remove_seed(pb.RemoveSeedRequest(id="dup")))
            if before is None:
                path.unlink()
            else:
                path.write_bytes(before)
        # With the duplicates gone, the same update goes through.
        assert client.update_seed(pb.UpdateSeedRequest(id="dup", kind="tool")).seed.kind == "tool"


# --- watchers that never read pin a bounded number of bytes ------------------------------


@pytest.mark.slow
def test_a_watcher_that_never_reads_is_ended_once_its_byte_budget_is_spent(
    start_server: Callable[..., ServerThread],
) -> None:
    budget = 256 * 1024
    server = start_server(watch_backlog_bytes=budget)
    channel = grpc.insecure_channel(server.unix_target)
    stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
    idle = [stub.WatchSeeds(pb.WatchSeedsRequest(), timeout=20) for _ in range(3)]
    for call in idle:
        call.initial_metadata()  # subscribed; never read from here on
    reader = Watcher(server.unix_target)
    try:
        provides = [f"capability_{number:04d}_" + "x" * 80 for number in range(1000)]  # ~100 KB a seed
        with SeedStoreClient(server.unix_target) as client:
            for number in range(60):
                request = pb.AddSeedRequest(id=f"big-{number}", domain="voice", kind="cli", provides=provides)
                client.add_seed(request)
                assert reader.next().id == f"big-{number}"  # a watcher that keeps up misses nothing
        for call in idle:
            with pytest.raises(grpc.RpcError) as ended:
                for _ in call:
                    pass
            assert ended.value.code() == grpc.StatusCode.ABORTED
            status = rpc_status.from_call(cast(grpc.Call, ended.value))
            assert status is not None
            (detail,) = status.details
            info = error_details_pb2.ErrorInfo()
            assert detail.Unpack(info)
            assert (info.reason, info.domain) == ("WATCH_BACKLOG_EXCEEDED", ERROR_DOMAIN)
            assert info.metadata["limitBytes"] == str(budget)
        assert reader.nothing_more(0.2)  # the reader's stream lives on
    finally:
        reader.close()
        for call in idle:
            call.cancel()  # type: ignore[no-untyped-call]
        channel.close()


# --- paging: every reply fits the message limit ----------------------------------------

SMALL_LIMIT = 256 * 1024


def write_many_seeds(store: Path, count: int) -> None:
    for number in range(count):
        domain = ("audio", "voice")[number % 2]
        directory = store / domain
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"seed-{number:05d}.yml").write_text(
            f"id: seed-{number:05d}\ndomain: {domain}\nkind: cli\nprovides:\n- text_to_speech\n"
            f"- speech_{number:05d}_{'x' * 40}\n"
        )
    for number in range(30):
        (store / "voice" / f"broken-{number:02d}.yml").write_text("id: [\n")


@pytest.fixture
def crowded_server(start_server: Callable[..., ServerThread], home: Path) -> ServerThread:
    write_many_seeds(home / "capabilities", 3000)
    return start_server(server_options=ServerOptions(listen=(), max_message_bytes=SMALL_LIMIT))


@pytest.mark.slow
def test_list_seeds_pages_through_a_store_too_big_for_one_reply(crowded_server: ServerThread) -> None:
    with SeedStoreClient(crowded_server.unix_target) as client:
        pages = list(client.list_pages(page_size=10_000))
        assert len(pages) > 1
        for page in pages:
            assert page.ByteSize() <= SMALL_LIMIT
        merged = client.list_all_seeds()
        ids = [entry.id for entry in merged.seeds]
        assert len(ids) == len(set(ids)) == 3000
        assert [(entry.domain, entry.id) for entry in merged.seeds] == sorted(
            (entry.domain, entry.id) for entry in merged.seeds
        )
        assert len(merged.problems) == 30

        small = client.list_seeds(page_size=7, domain="voice")
        assert len(small.seeds) == 7
        after = client.list_seeds(page_size=7, domain="voice", page_token=small.next_page_token)
        assert after.seeds[0].id > small.seeds[-1].id

        token = small.next_page_token  # issued for the domain voice
        for request, field in (
            (pb.ListSeedsRequest(page_token="not-a-token"), "page_token"),
            (pb.ListSeedsRequest(page_token=token), "page_token"),
            (pb.ListSeedsRequest(page_token=token, domain="audio"), "page_token"),
            (pb.ListSeedsRequest(page_token=token[:-4], domain="voice"), "page_token"),
            (pb.ListSeedsRequest(page_size=-1), "page_size"),
        ):
            error = failure(functools.partial(client.list_seeds, request))
            assert (error.code, error.field_violations[0][0]) == (grpc.StatusCode.INVALID_ARGUMENT, field)

        found = client.search_seeds(capability="text_to_speech")
        assert found.total_candidates == 3000
        assert 0 < len(found.candidates) <= 1000
        assert found.ByteSize() <= SMALL_LIMIT
        assert len(client.search_seeds(capability="text_to_speech", max_candidates=5).candidates) == 5


@pytest.mark.slow
def test_cli_list_through_the_server_walks_every_page(
    crowded_server: ServerThread, make_cli: Callable[[ServerThread | None], Cli]
) -> None:
    local, remote = make_cli(None).run("list"), make_cli(crowded_server).run("list")
    assert (local.code, remote.code) == (0, 0), remote.stderr
    assert remote.stdout == local.stdout
    assert len(remote.json["seeds"]) == 3000


@pytest.mark.slow
def test_a_seed_too_big_for_a_file_is_refused_and_replies_bound_their_problems(
    client: SeedStoreClient, server: ServerThread, home: Path
) -> None:
    big = pb.AddSeedRequest(
        id="huge", domain="voice", kind="cli", provides=["text_to_speech"], aliases=["voice " * 200_000]
    )
    error = failure(lambda: client.add_seed(big))
    assert (error.code, error.field_violations[0][0]) == (grpc.StatusCode.INVALID_ARGUMENT, "request")
    assert f"more than the {MAX_SEED_FILE_BYTES} a seed file may hold" in error.message
    client.add_seed(seed_request("grows"))
    error = failure(
        lambda: client.update_seed(pb.UpdateSeedRequest(id="grows", add_aliases=["voice " * 200_000]))
    )
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert not (home / "capabilities" / "voice" / "huge.yml").exists()

    for number in range(150):
        (home / "capabilities" / "voice" / f"broken-{number:03d}.yml").write_text("id: [\n")
    server.sync()
    assert len(client.inspect_seed(pb.InspectSeedRequest(id="grows")).problems) == 100
    assert len(client.list_all_seeds().problems) == 150
