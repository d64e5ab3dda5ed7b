"""Reads answered from the in-memory index alone, and the first verify event sent ahead of the work.

The service runs `*_from_memory` reads on its event loop, so they must give the
same answers as the blocking reads, and say None (instead of waiting or reading
disk) whenever the blocking read would have to.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsidecar.seedstore_service import errors
from agentsidecar.seedstore_service.index import SeedIndex
from agentsidecar.seedstore_service.model import Evidence, Seed
from agentsidecar.seedstore_service.operations import SeedOperations, VerifyRequest
from agentsidecar.seedstore_service.ranking import SearchQuery
from agentsidecar.seedstore_service.runner import (
    CheckFinished,
    CheckStarted,
    RunnerSettings,
    SeedChecked,
    VerifyEvent,
    check_seeds,
)
from agentsidecar.seedstore_service.seedfile import dump_seed
from agentsidecar.seedstore_service.store import SeedStore

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def seed(seed_id: str, domain: str = "dev", provides: tuple[str, ...] = ("format_code",)) -> Seed:
    return Seed(
        id=seed_id,
        domain=domain,
        kind="cli",
        command=f"{seed_id} --run",
        provides=provides,
        aliases=(f"{seed_id} helper",),
        evidence=(Evidence(source="cli_help", command=f"{seed_id} --help"),),
    )


def write_seed(root: Path, value: Seed) -> None:
    path = root / value.domain / f"{value.id}.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_seed(value))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "capabilities"
    for value in (seed("black"), seed("ruff"), seed("prettier", "web"), seed("jq", "data", ("query_json",))):
        write_seed(root, value)
    return root


@pytest.fixture
def operations(root: Path) -> SeedOperations:
    store = SeedStore(root)
    operations = SeedOperations(store, SeedIndex(store))
    operations.refresh_index()
    return operations


@pytest.fixture
def index_held_elsewhere(operations: SeedOperations) -> Iterator[None]:
    """Another thread holds the index still, as a refresh does while it applies its changes."""
    assert operations.index is not None
    index = operations.index
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with index.held_if_free() as held:
            assert held
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join()


# --- reads from memory agree with the blocking reads -----------------------------


@pytest.mark.parametrize(
    ("query", "broaden"),
    [
        (SearchQuery(capability="format_code"), False),
        (SearchQuery(capability="format-code", domain="dev"), False),
        (SearchQuery(capability="helper"), False),
        (SearchQuery(capability="nothing_provides_this"), True),
        (SearchQuery(capability="query_json", preferred_seed="jq"), True),
    ],
)
def test_search_from_memory_agrees_with_search(
    operations: SeedOperations, query: SearchQuery, broaden: bool
) -> None:
    from_memory = operations.search_from_memory(query, broaden_empty=broaden)
    assert from_memory is not None
    assert from_memory == operations.search(query, broaden_empty=broaden)


def test_inspect_from_memory_agrees_with_inspect(operations: SeedOperations) -> None:
    view = operations.inspect_from_memory("ruff", None)
    assert view is not None
    assert view == operations.inspect("ruff", None)
    assert view.stored.seed.id == "ruff"


def test_reads_from_memory_raise_what_the_blocking_reads_raise(operations: SeedOperations) -> None:
    with pytest.raises(errors.InvalidIdentifier):
        operations.inspect_from_memory("not an id", None)
    with pytest.raises(errors.InvalidArgument):
        operations.search_from_memory(SearchQuery(capability="x", domain="Bad Domain"))
    with pytest.raises(errors.InvalidArgument, match="at least one seed id"):
        operations.verify_targets_from_memory(VerifyRequest(ids=()))


def test_verify_targets_from_memory_agree_with_verify_targets(operations: SeedOperations) -> None:
    by_ids = VerifyRequest(ids=("ruff", "black", "ruff"))
    assert operations.verify_targets_from_memory(by_ids) == operations.verify_targets(by_ids)
    whole_domain = VerifyRequest(ids=(), domain="dev", all_in_domain=True)
    targets = operations.verify_targets_from_memory(whole_domain)
    assert targets is not None
    assert [stored.seed.id for stored in targets] == ["black", "ruff"]


# --- and step aside whenever the blocking read would need disk or a wait ------------------


def test_a_seed_the_index_has_not_seen_yet_is_left_to_the_blocking_read(
    operations: SeedOperations, root: Path
) -> None:
    write_seed(root, seed("taplo"))  # another program, after the last refresh
    assert operations.inspect_from_memory("taplo", None) is None
    assert operations.verify_targets_from_memory(VerifyRequest(ids=("ruff", "taplo"))) is None
    # The blocking read refreshes the index and finds it; then memory knows it too.
    assert operations.inspect("taplo", None).stored.seed.id == "taplo"
    assert operations.inspect_from_memory("taplo", None) is not None


@pytest.mark.usefixtures("index_held_elsewhere")
def test_reads_from_memory_never_wait_for_an_index_held_elsewhere(operations: SeedOperations) -> None:
    assert operations.search_from_memory(SearchQuery(capability="format_code")) is None
    assert operations.inspect_from_memory("ruff", None) is None
    assert operations.verify_targets_from_memory(VerifyRequest(ids=("ruff",))) is None


def test_without_an_index_every_read_is_left_to_the_blocking_path(root: Path) -> None:
    operations = SeedOperations(SeedStore(root))
    assert operations.search_from_memory(SearchQuery(capability="format_code")) is None
    assert operations.inspect_from_memory("ruff", None) is None
    assert operations.verify_targets_from_memory(VerifyRequest(ids=("ruff",))) is None


# --- the first verify event goes out before any work starts ------------------------


def directory_listing(directory: Path) -> list[str]:
    # Synchronous on purpose: awaiting anything would let the checks start.
    return sorted(path.name for path in directory.iterdir())


def running_with_argv(argv: list[str]) -> int:
    wanted = "\0".join(argv).encode() + b"\0"
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                count += (entry / "cmdline").read_bytes() == wanted
            except OSError:
                continue
    return count


@pytest.mark.slow
async def test_first_check_started_is_yielded_before_any_check_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the checks' scratch directories go
    # A duration no other process on the machine will be sleeping for.
    duration = f"0.2{uuid.uuid4().int % 10**6:06d}"
    items = [
        (Seed(id=f"seed-{n}", domain="dev", kind="cli", evidence=(Evidence("t", f"sleep {duration}"),)), "p")
        for n in range(3)
    ]
    settings = RunnerSettings(check_timeout=5.0, path=SYSTEM_PATH)
    events = check_seeds(items, settings, concurrency=2)
    first = await anext(events)
    # Nothing has had a chance to run yet: the event needed no task, directory or process.
    assert running_with_argv(["sleep", duration]) == 0
    assert directory_listing(tmp_path) == []
    assert first == CheckStarted(
        seed_id="seed-0", domain="dev", check=f"evidence_command:sleep {duration}", index=0
    )
    received: list[VerifyEvent] = [first, *[event async for event in events]]
    for n in range(3):
        own = [event for event in received if event.seed_id == f"seed-{n}"]
        # Sent ahead, the first seed's CheckStarted is not sent again by its checks.
        assert [type(event) for event in own] == [CheckStarted, CheckFinished, SeedChecked]
        finished = own[1]
        assert isinstance(finished, CheckFinished)
        assert finished.ok
