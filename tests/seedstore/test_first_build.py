"""A first start's build (`SeedIndex.build`) answers, reports and saves exactly what a whole refresh does,
and keeps no Seed: it holds each section as a start from the persisted index would."""

from __future__ import annotations

import gc
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentsidecar.seedstore_service import index as index_module
from agentsidecar.seedstore_service import indexfile, persisted
from agentsidecar.seedstore_service.index import SeedIndex
from agentsidecar.seedstore_service.model import Seed
from agentsidecar.seedstore_service.operations import SeedOperations
from agentsidecar.seedstore_service.ranking import SearchQuery
from agentsidecar.seedstore_service.store import SeedStore

from .test_persisted_index import SEARCHES, seed_text

DOMAINS = ["audio", "empty", "voice"]
IDS = ["say", "piper", "espeak", "broken", "binary", "ghost", "stray", "inert", "loose", "deep"]


def write_store(root: Path) -> None:
    for domain in DOMAINS:
        (root / domain).mkdir(parents=True, exist_ok=True)
    (root / "voice" / "say.yml").write_text(seed_text("say", "voice"))
    (root / "voice" / "piper.yaml").write_text(seed_text("piper", "voice", "speech_synthesis", "tts"))
    (root / "voice" / "nested").mkdir()
    (root / "voice" / "nested" / "deep.yml").write_text(seed_text("deep", "voice", "deep_voice"))
    (root / "audio" / "espeak.yml").write_text(seed_text("espeak", "audio"))
    (root / "audio" / "stray.yml").write_text(seed_text("stray", "voice"))  # declares another domain
    (root / "audio" / "inert.yml").write_text(seed_text("inert", "audio", alias="!!"))  # an inert alias
    (root / "audio" / "broken.yml").write_text("id: [unclosed\n")
    (root / "audio" / "binary.yml").write_bytes(b"id: \xff\xfe\n")
    os.symlink(root / "nowhere.yml", root / "audio" / "ghost.yml")  # cannot be opened or stat'ed
    (root / "loose.yml").write_text(seed_text("loose", "voice"))  # in the root: a section of its own
    (root / "zz.yml").write_text(seed_text("zz", "audio"))


def answers(index: SeedIndex) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for domain in [None, *DOMAINS]:
        result[f"scope {domain}"] = index.scope(domain)
        result[f"problems {domain}"] = index.problems(domain)
        for capability in [*SEARCHES, "deep", "tts", "synthesis"]:
            result[f"search {capability} {domain}"] = index.search(SearchQuery(capability, domain))
        for seed_id in IDS:
            result[f"lookup {seed_id} {domain}"] = index.lookup(seed_id, domain)
            result[f"candidates {seed_id} {domain}"] = index.candidate_paths(seed_id, domain)
    return result


def from_the_files(root: Path) -> dict[str, Any]:
    """What the linear reference (a store without the persisted index) answers."""
    reference = SeedStore(root, persisted_index=False)
    result: dict[str, Any] = {}
    for domain in [None, *DOMAINS]:
        result[f"scope {domain}"] = reference.load(domain)
        for capability in [*SEARCHES, "deep", "tts", "synthesis"]:
            outcome = SeedOperations(reference).search(SearchQuery(capability, domain))
            result[f"search {capability} {domain}"] = (outcome.result, outcome.problems)
    return result


def saved_sections(root: Path) -> dict[str, Any]:
    """Each section file's entries (the instant of the read replaced by whether it makes the entry
    racy) and directory record (without the instant of the listing)."""
    sections: dict[str, Any] = {}
    for path in sorted((root / persisted.INDEX_DIR_NAME).iterdir()):
        named, section = indexfile.section_of_file(path.read_bytes())
        assert named
        decoded = indexfile.decode_section(path.read_bytes(), str(root), section)
        assert decoded is not None, path
        entries, (_checked_ns, signatures, domains) = decoded
        for entry in entries.values():
            entry[indexfile.CHECKED] = indexfile.racy(entry)
        sections[path.name] = (entries, signatures, domains)
    return sections


@pytest.fixture
def root(tmp_path: Path) -> Path:
    store_root = tmp_path / "capabilities"
    write_store(store_root)
    return store_root


def built(root: Path, **store_options: Any) -> SeedIndex:
    index = SeedIndex(SeedStore(root, **store_options))
    index.build()
    return index


def refreshed(root: Path, **store_options: Any) -> SeedIndex:
    index = SeedIndex(SeedStore(root, **store_options))
    index.refresh()
    return index


def test_a_built_index_answers_as_a_refreshed_one_and_as_the_files(root: Path) -> None:
    index = built(root)
    stats = index.last_refresh
    assert stats is not None
    assert (stats.files, stats.from_persisted, stats.read) == (11, 0, 11)
    expected = answers(refreshed(root, persisted_index=False))
    got = answers(index)
    assert got == expected
    for key, value in from_the_files(root).items():
        assert got[key] == value, key
    # Every kind of problem is reported, with its file, line and text.
    problems = {Path(problem.path).name: problem for problem in index.problems(None)}
    assert set(problems) == {"broken.yml", "binary.yml", "ghost.yml", "inert.yml"}
    assert "stream did not contain valid UTF-8" in problems["binary.yml"].reason
    assert "has no letters or digits" in problems["inert.yml"].reason
    assert problems["broken.yml"].line == 2
    mismatch = index.problems("audio")
    assert any("stray.yml" in problem.path and "declares domain" in problem.reason for problem in mismatch)


def test_the_build_saves_the_persisted_index_a_whole_refresh_saves(root: Path) -> None:
    # A save first makes the lock file and the index directory: after that, saving changes no
    # directory the walks list, and both walks list the same.
    refreshed(root)
    for path in (root / persisted.INDEX_DIR_NAME).iterdir():
        path.unlink()
    built(root)
    by_build = saved_sections(root)
    # Every section the walk listed, the empty domain and the root's own included.
    assert set(by_build) == {"root.json", "d-audio.json", "d-empty.json", "d-voice.json"}
    for path in (root / persisted.INDEX_DIR_NAME).iterdir():
        path.unlink()
    refreshed(root)
    assert saved_sections(root) == by_build


@pytest.mark.slow
def test_the_service_starts_next_time_from_what_the_build_saved(root: Path) -> None:
    time.sleep(persisted.RACY_WINDOW_NS / 1e9 + 0.1)  # past the racy window: entries are trusted
    built(root)
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    assert index.last_refresh is not None
    # Only the broken files are read again (problems are in every answer). The link that cannot
    # be stat'ed has no entry (as after a refresh): the sweep finds it.
    assert (index.last_refresh.files, index.last_refresh.read) == (10, 2)
    index.refresh()
    assert answers(index) == answers(refreshed(root, persisted_index=False))


def test_the_build_keeps_no_seed(root: Path) -> None:
    gc.collect()
    before = sum(isinstance(thing, Seed) for thing in gc.get_objects())
    index = built(root)
    gc.collect()
    assert sum(isinstance(thing, Seed) for thing in gc.get_objects()) == before
    # The seeds are decoded when an answer shows them, and answer as the files.
    assert [stored.seed.id for stored in index.scope("voice").seeds] == ["deep", "piper", "say"]


def test_a_store_without_a_persisted_index_is_built_in_memory_alone(root: Path) -> None:
    index = built(root, persisted_index=False)
    assert not (root / persisted.INDEX_DIR_NAME).exists()
    assert answers(index) == answers(refreshed(root, persisted_index=False))


def test_after_the_build_a_refresh_tells_only_what_changed(root: Path) -> None:
    index = built(root)
    assert index.refresh() == []
    (root / "voice" / "say.yml").write_text(seed_text("say", "voice", "text_to_sound"))
    (root / "audio" / "espeak.yml").unlink()
    (root / "audio" / "festival.yml").write_text(seed_text("festival", "audio"))
    events = index.refresh()
    assert [(event.kind, event.id) for event in events] == [
        ("removed", "espeak"),
        ("added", "festival"),
        ("updated", "say"),
    ]
    assert answers(index) == answers(refreshed(root, persisted_index=False))


def test_a_file_edited_right_after_the_build_is_read_again(root: Path) -> None:
    path = root / "voice" / "say.yml"
    index = built(root)  # say.yml was written just now: its entry is racy
    before = os.stat(path)
    path.write_text(path.read_text().replace("text_to_speech", "text_to_sound_"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size, same mtime
    assert [event.kind for event in index.refresh()] == ["updated"]
    found = index.search(SearchQuery("text_to_sound_", None))[0]
    assert [candidate.id for candidate in found.candidates] == ["say"]


def test_the_build_fills_only_an_empty_index(root: Path) -> None:
    index = built(root)
    with pytest.raises(ValueError, match="empty index"):
        index.build()


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1000, 2])
def test_a_build_by_worker_processes_answers_and_saves_as_one_built_here(
    root: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    refreshed(root)  # the lock file and the index directory exist before either build
    for path in (root / persisted.INDEX_DIR_NAME).iterdir():
        path.unlink()
    here = SeedIndex(SeedStore(root))
    here.build(workers=0)
    saved_here = saved_sections(root)
    for path in (root / persisted.INDEX_DIR_NAME).iterdir():
        path.unlink()
    # Jobs of two files at most split the sections over jobs; the result is the same.
    monkeypatch.setattr(index_module, "_CHUNK_FILES", chunk)
    by_workers = SeedIndex(SeedStore(root))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    by_workers.build(workers=2)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime > before.ru_utime + before.ru_stime  # workers ran, and ended
    assert saved_sections(root) == saved_here
    assert answers(by_workers) == answers(here)


_UNGUARDED_BUILD = """
import sys
from pathlib import Path
from agentsidecar.seedstore_service.index import SeedIndex
from agentsidecar.seedstore_service.store import SeedStore

# No `if __name__ == "__main__"`: a spawned worker that imports this script fails to start.
index = SeedIndex(SeedStore(Path(sys.argv[1]), persisted_index=False))
index.build(workers=2)
print(len(index.scope(None).seeds), len(index.problems(None)))
"""


@pytest.mark.slow
def test_a_build_whose_workers_cannot_start_reads_the_sections_itself(root: Path, tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED_BUILD)
    done = subprocess.run(
        [sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=120, check=True
    )
    assert "bootstrapping phase" in done.stderr  # the workers did not start
    index = refreshed(root, persisted_index=False)
    assert done.stdout.split() == [str(len(index.scope(None).seeds)), str(len(index.problems(None)))]


@pytest.mark.parametrize("change", ["edited", "touched"])
def test_files_a_refresh_reads_again_are_held_as_the_build_holds_them(
    root: Path, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No decoded seed is kept for answers: what stays alive is only what the index holds.
    monkeypatch.setattr(index_module, "_DECODED_CACHE_SIZE", 0)
    index = built(root)
    # Every file changes, or is only touched (as a store restored or checked out just before
    # the start, whose files the build found racy): the refresh reads them all again.
    for path in sorted(root.rglob("*.y*ml")):
        if path.is_file() and not path.is_symlink() and "broken" not in path.name:
            if change == "edited":
                path.write_bytes(path.read_bytes() + b"\n")
            else:
                os.utime(path)
    gc.collect()
    before = sum(isinstance(thing, Seed) for thing in gc.get_objects())
    assert [event.kind for event in index.refresh()] == []  # same seeds, other bytes
    stats = index.last_refresh
    assert stats is not None
    assert stats.read == stats.files
    gc.collect()
    assert sum(isinstance(thing, Seed) for thing in gc.get_objects()) == before
    assert answers(index) == answers(refreshed(root, persisted_index=False))
    # Held so, they are compared and told as any entry is.
    (root / "voice" / "piper.yaml").write_text(seed_text("piper", "voice", "speech_synthesis", "speech"))
    (root / "audio" / "espeak.yml").unlink()
    events = index.refresh()
    assert [(event.kind, event.id) for event in events] == [("removed", "espeak"), ("updated", "piper")]
    assert answers(index) == answers(refreshed(root, persisted_index=False))
