"""Hostile inputs against a real seedstore service and CLI: long identifiers, NUL bytes,
symlinks out of the store, oversized and alias-bomb files, duplicate ids, idle watchers, paging."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb

from clients.errors import SidecarError
from clients.seedstore import SeedStoreClient
from seedstore_service.seedfile import MAX_IDENTIFIER_LENGTH
from seedstore_service.status import ERROR_DOMAIN

from .conftest import Cli, ServerThread


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
        error = failure(lambda request=request: client.add_seed(request))
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER")
        assert error.field_violations[0][0] == field
        assert f"longer than {MAX_IDENTIFIER_LENGTH} characters" in error.message
        assert len(error.message) < 200
        assert len(error.metadata["value"]) < 100
    error = failure(lambda: client.inspect_seed(pb.InspectSeedRequest(id="a" * 240)))
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER")
    written = sorted(path.name for path in (home / "capabilities").rglob("*") if path.is_file())
    assert written == [".seedstore.lock", f"{longest}.yml"]


def test_cli_add_refuses_a_long_id_with_skillspecs_exit_code(cli: Cli) -> None:
    result = cli.run("add", "a" * 240, "--domain", "voice", "--kind", "cli", "--provides", "x")
    assert result.code == 1
    assert result.stderr.startswith('error: invalid identifier "aaaa')
    assert result.stderr.rstrip().endswith(f"in capability id: longer than {MAX_IDENTIFIER_LENGTH} characters")


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
