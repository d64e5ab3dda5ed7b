"""The short way to a verify stream's first event, and the verdict write that ends the stream.

The service plans a verify (request checked, seeds located) from memory, sends
the first CheckStarted itself, and only then starts the checks. The verdict
write and the index refresh after it reuse a parse of the file when the file
still holds the bytes that parse came from, and parse it again otherwise, so an
edit by another program is never lost.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.seedstore_service import errors
from agentsidecar.seedstore_service.index import SeedIndex
from agentsidecar.seedstore_service.model import Evidence, Seed, VerificationStatus
from agentsidecar.seedstore_service.operations import (
    SeedOperations,
    SeedVerified,
    VerifyProgress,
    VerifyRequest,
)
from agentsidecar.seedstore_service.runner import CheckFinished, CheckStarted
from agentsidecar.seedstore_service.seedfile import dump_seed, parse_seed, parse_seed_with_notes, revision_of
from agentsidecar.seedstore_service.store import SeedStore, read_seed_file
from agentsidecar.seedstore_service.verification import FileState, first_check, lookup_on_path, plan_checks

from .test_seedfile import seeds

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def tool_seed(seed_id: str, *evidence: str, command: str | None = "true") -> Seed:
    return Seed(
        id=seed_id,
        domain="dev",
        kind="cli",
        command=command,
        provides=("format_code",),
        aliases=(f"{seed_id} helper",),
        evidence=tuple(Evidence(source="cli_help", command=raw) for raw in evidence),
    )


def write_seed(root: Path, value: Seed) -> Path:
    path = root / value.domain / f"{value.id}.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_seed(value))
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "capabilities"
    write_seed(root, tool_seed("ruff", "true"))
    return root


@pytest.fixture
def operations(root: Path) -> SeedOperations:
    seed_store = SeedStore(root)
    operations = SeedOperations(seed_store, SeedIndex(seed_store), runner_path=SYSTEM_PATH)
    operations.refresh_index()
    return operations


async def collect(events: AsyncIterator[VerifyProgress]) -> list[VerifyProgress]:
    return [event async for event in events]


# --- the first check, named without planning the rest ------------------------------


@pytest.mark.slow
@given(seeds)
def test_first_check_is_the_plans_first_check(seed: Seed) -> None:
    assert first_check(seed) == plan_checks(seed)[0]


def test_first_check_does_not_split_the_evidence_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_split(*args: object, **kwargs: object) -> list[str]:
        raise AssertionError("shell-split an evidence command the first event does not name")

    monkeypatch.setattr("agentsidecar.seedstore_service.verification.shlex.split", no_split)
    assert first_check(tool_seed("ruff", "ruff --version", "ruff help")).name == "path_lookup:true"


# --- PATH candidates, spelled as Path would spell them ------------------------------

path_entries = st.lists(
    st.sampled_from(["/usr/bin", "/usr/bin/", "//opt//bin", "/", "//", "bin", "./bin", "../x/./y", ""]),
    max_size=5,
)
one_component_programs = st.sampled_from(["tool", "tool/", ".", "..", "", "a b", "x.y", "tool//"])


@pytest.mark.slow
@given(path_entries, one_component_programs)
def test_path_candidates_are_spelled_as_path_joins_them(entries: list[str], program: str) -> None:
    cwd = Path("/srv/work")
    probed: list[str] = []

    def probe(candidate: str) -> FileState:
        probed.append(candidate)
        return FileState.MISSING

    assert lookup_on_path(program, ":".join(entries), cwd, probe).state is FileState.MISSING
    assert probed == [str(cwd / entry / program) for entry in entries if entry]


def test_the_lookup_stops_at_the_first_executable_and_reports_it_as_a_path() -> None:
    probed: list[str] = []

    def probe(candidate: str) -> FileState:
        probed.append(candidate)
        return FileState.EXECUTABLE if candidate.startswith("/b/") else FileState.MISSING

    result = lookup_on_path("tool", "/a:/b:/c", Path("/"), probe)
    assert (result.state, result.path) == (FileState.EXECUTABLE, Path("/b/tool"))
    assert probed == ["/a/tool", "/b/tool"]


# --- reusing a parse only for the bytes it came from ------------------------------


def test_a_file_still_holding_the_known_bytes_is_not_parsed_again(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(root / "dev" / "ruff.yml")
    known = read_seed_file(path).stored
    assert known is not None

    def no_parse(text: str, where: str) -> tuple[Seed, tuple[tuple[int, str], ...]]:
        raise AssertionError("parsed bytes that were already parsed")

    monkeypatch.setattr("agentsidecar.seedstore_service.seedfile.parse_seed_with_notes", no_parse)
    again = read_seed_file(path, "dev", known)
    assert again.stored is known
    assert again.problem is None
    assert again.stat_result is not None


def test_an_edit_by_another_program_is_parsed_even_with_a_known_parse(root: Path) -> None:
    path = root / "dev" / "ruff.yml"
    known = read_seed_file(str(path)).stored
    assert known is not None
    # Same size, new bytes: only the content can tell.
    path.write_text(dump_seed(tool_seed("ruff", "truexy")))
    assert path.stat().st_size == len(dump_seed(known.seed).encode())
    again = read_seed_file(str(path), known=known)
    assert again.stored is not None
    assert again.stored.seed.evidence[0].command == "truexy"
    # Nor is a known parse of another file ever taken for this one.
    other = write_seed(root, tool_seed("black", "true"))
    assert read_seed_file(str(other), known=known).stored == read_seed_file(str(other)).stored


def test_a_racy_file_reread_by_the_index_keeps_its_parse_until_its_bytes_change(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()
    parses: list[str] = []
    real_parse = parse_seed_with_notes

    def counting_parse(text: str, where: str) -> tuple[Seed, tuple[tuple[int, str], ...]]:
        parses.append(where)
        return real_parse(text, where)

    monkeypatch.setattr("agentsidecar.seedstore_service.seedfile.parse_seed_with_notes", counting_parse)
    # Written just now, so the index reads it again on every refresh (racy mtime).
    assert seed_index.refresh() == []
    assert parses == []
    write_seed(root, tool_seed("ruff", "ruff --version"))
    (event,) = seed_index.refresh()
    assert (event.kind, len(parses)) == ("updated", 1)


# --- planning, the first event, then the rest ------------------------------------


async def test_the_plan_names_the_first_event_and_run_verify_streams_the_rest(
    operations: SeedOperations,
) -> None:
    request = VerifyRequest(ids=("ruff",), domain="dev")
    plan = operations.plan_verify_from_memory(request)
    assert plan is not None
    assert plan.first_event == CheckStarted(seed_id="ruff", domain="dev", check="path_lookup:true", index=0)
    rest = await collect(operations.run_verify(plan, first_event_sent=True))
    assert [type(event) for event in rest] == [CheckFinished, CheckStarted, CheckFinished, SeedVerified]
    whole = await collect(operations.verify(request))
    assert [(type(event), getattr(event, "check", None)) for event in whole] == [
        (type(event), getattr(event, "check", None)) for event in [plan.first_event, *rest]
    ]


async def test_an_unknown_seed_fails_the_plan_so_no_event_is_made(operations: SeedOperations) -> None:
    request = VerifyRequest(ids=("ruff", "nope"))
    assert operations.plan_verify_from_memory(request) is None  # only a refresh can tell
    with pytest.raises(errors.SeedNotFound):
        await asyncio.to_thread(operations.plan_verify, request)
    with pytest.raises(errors.InvalidArgument):
        operations.plan_verify_from_memory(VerifyRequest(ids=("ruff",), check_timeout=0))


async def test_a_seed_written_by_another_program_is_planned_after_a_refresh(
    operations: SeedOperations, root: Path
) -> None:
    write_seed(root, tool_seed("taplo", "true"))
    request = VerifyRequest(ids=("taplo",))
    assert operations.plan_verify_from_memory(request) is None
    plan = await asyncio.to_thread(operations.plan_verify, request)
    assert [stored.seed.id for stored in plan.targets] == ["taplo"]
    assert plan.first_event is not None


async def test_an_edit_made_while_the_checks_ran_is_kept_and_indexed(
    operations: SeedOperations, root: Path
) -> None:
    plan = operations.plan_verify_from_memory(VerifyRequest(ids=("ruff",)))
    assert plan is not None
    # Another program edits the seed after the plan read it, before the verdict is written.
    edited = tool_seed("ruff", "true", "true --version")
    path = write_seed(root, edited)
    events = await collect(operations.run_verify(plan))
    verdict = events[-1]
    assert isinstance(verdict, SeedVerified)
    assert verdict.status is VerificationStatus.VERIFIED

    on_disk = parse_seed(path.read_text(), str(path))
    assert on_disk.evidence == edited.evidence  # the edit is kept ...
    assert on_disk.verification is not None  # ... with the verdict written over it
    assert verdict.revision == revision_of(path.read_bytes())
    # The index holds exactly what a fresh read of the store gives.
    from_memory = operations.inspect_from_memory("ruff", None)
    assert from_memory is not None
    assert from_memory.stored == SeedOperations(SeedStore(root)).inspect("ruff", None).stored


async def test_a_file_that_vanishes_before_its_verdict_ends_the_stream_after_the_checks(
    operations: SeedOperations, root: Path
) -> None:
    write_seed(root, tool_seed("slow", "sleep 0.3", command=None))
    operations.refresh_index()
    plan = operations.plan_verify_from_memory(VerifyRequest(ids=("slow",)))
    assert plan is not None
    received: list[VerifyProgress] = []
    events = operations.run_verify(plan)
    received.append(await anext(events))
    os.remove(root / "dev" / "slow.yml")

    async def the_rest() -> None:
        async for event in events:
            received.append(event)

    with pytest.raises(errors.SeedNotFound):
        await the_rest()
    assert [type(event) for event in received] == [CheckStarted, CheckFinished]


@pytest.mark.slow
async def test_closing_the_stream_before_a_verdict_is_taken_leaves_no_task_behind(
    operations: SeedOperations, root: Path
) -> None:
    for name in ("a", "b"):
        write_seed(root, tool_seed(name, "true"))
    operations.refresh_index()
    plan = operations.plan_verify_from_memory(VerifyRequest(ids=("a", "b"), concurrency=2))
    assert plan is not None
    events = operations.run_verify(plan)
    assert isinstance(await anext(events), CheckStarted)
    await asyncio.sleep(0.5)  # both seeds' checks finish, their verdicts are being written
    await events.aclose()
    assert asyncio.all_tasks() == {asyncio.current_task()}
    # Verdicts whose writing had started may land; a seed's file is never left half written.
    for name in ("a", "b"):
        path = root / "dev" / f"{name}.yml"
        assert parse_seed(path.read_text(), str(path)).id == name
